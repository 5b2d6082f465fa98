/*
 * Undoing a failed call's writes into caller device tensors.
 *
 * kvq_attention, kvq_scores and kvq_dequantize write device outputs in place (CONVERT jobs behind the
 * call's device checks) or through host memory, and every output is unchanged after a failed call
 * (kvq.h). A backend that records a call (KVQ_BACKEND_RECORDS, Vulkan) runs none of a failed call's
 * work. The CUDA backend runs each job as it is issued, and after an output is written the call can
 * still fail: the read back of the check word, a host allocation, another output's job, the timing
 * event at the call's end. No order of the writes avoids it (a call with two outputs writes one
 * first, and launching the second can fail), so the bytes each output spans are copied into scratch
 * before the first write, and copied back if the call fails, ordered after all it issued (as an
 * append's overwritten window is, core/append.c).
 */
#include <stdlib.h>

#include "checked.h"
#include "output_undo.h"
#include "tensor.h"

struct kvq_saved_output {
  kvq_buffer *caller;  /* the caller's memory, imported */
  uint64_t first, bytes; /* the span in it */
  uint64_t at;         /* its copy in undo->saved */
};

/* A span's room in the saved copies: each copy starts on 16 bytes. */
static uint64_t slot_bytes(uint64_t bytes) { return kvq_size_mul((bytes + 15) / 16, 16); }

static void release(kvq_output_undo *undo) {
  kvq_backend *be = undo->ctx ? undo->ctx->backend : NULL;
  for (size_t i = 0; be && i < undo->count; i++) be->ops->buffer_destroy(be, undo->spans[i].caller);
  free(undo->spans);
  *undo = (kvq_output_undo){0};
}

int kvq_output_undo_needed(const kvq_context *ctx, const kvq_tensor *t) {
  return t && t->memory != KVQ_MEMORY_HOST && !(ctx->backend->features & KVQ_BACKEND_RECORDS);
}

kvq_status kvq_output_undo_save(kvq_cache *cache, const kvq_tensor *const *outputs, size_t count, kvq_output_undo *undo) {
  kvq_context *ctx = cache->ctx;
  kvq_backend *be = ctx->backend;
  *undo = (kvq_output_undo){0};
  size_t devices = 0;
  uint64_t total = 0;
  for (size_t i = 0; i < count; i++) {
    if (!kvq_output_undo_needed(ctx, outputs[i])) continue;
    uint64_t first, bytes;
    kvq_tensor_span(outputs[i], &first, &bytes);
    total = kvq_size_add(total, slot_bytes(bytes));
    devices++;
  }
  if (!devices) return KVQ_OK;
  undo->ctx = ctx;
  undo->spans = calloc(devices, sizeof *undo->spans);
  kvq_status st = undo->spans ? kvq_scratch(cache, KVQ_SCRATCH_SAVED_OUTPUTS, total, &undo->saved)
                              : kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory saving device outputs");
  uint64_t at = 0;
  for (size_t i = 0; i < count && st == KVQ_OK; i++) {
    if (!kvq_output_undo_needed(ctx, outputs[i])) continue;
    kvq_saved_output *s = &undo->spans[undo->count];
    kvq_tensor_span(outputs[i], &s->first, &s->bytes);
    s->at = at;
    at += slot_bytes(s->bytes);
    const kvq_device_memory memory = kvq_tensor_memory(outputs[i]);
    st = be->ops->buffer_import(be, &memory, s->first + s->bytes, &s->caller);
    if (st == KVQ_OK) {
      undo->count++;
      st = be->ops->buffer_copy(be, undo->saved, s->at, s->caller, s->first, s->bytes);
    }
    if (st != KVQ_OK) st = kvq_fail_backend(ctx, st, "saving a device output before the call writes it");
  }
  if (st != KVQ_OK) release(undo); /* nothing was written: the copies only read the outputs */
  return st;
}

kvq_status kvq_output_undo_end(kvq_output_undo *undo, kvq_status status) {
  if (!undo->ctx) return status;
  kvq_backend *be = undo->ctx->backend;
  if (status != KVQ_OK && status != KVQ_ERROR_DEVICE_LOST) { /* a lost device's context: only for destroying */
    /* every span was saved before any output was written: overlapping outputs too, in any order */
    kvq_status back = KVQ_OK;
    for (size_t i = 0; i < undo->count && back == KVQ_OK; i++) {
      const kvq_saved_output *s = &undo->spans[i];
      back = be->ops->buffer_copy(be, s->caller, s->first, undo->saved, s->at, s->bytes);
    }
    /* back in place when the call returns, as its writes would have been */
    if (back == KVQ_OK) back = be->ops->finish(be);
    if (back != KVQ_OK) status = kvq_undo_failed(undo->ctx, "its device outputs");
  }
  release(undo);
  return status;
}
