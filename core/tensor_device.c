/*
 * Caller tensors in device memory (a runtime's VkBuffer or CUDA device pointer). Where the backend
 * has the CONVERT job (Vulkan, CUDA), the per-step calls read and write them in place on the device (kvq_tensor_gather_rows,
 * kvq_tensor_scatter_rows), with the finite-value checks done there too, into a flag word read back
 * once per call (docs/VULKAN.md). Otherwise, and for the other calls, kvq imports the buffer through
 * its backend and moves the bytes the tensor spans through host memory, where the same checks and
 * conversions as for host tensors apply.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

void kvq_tensor_span(const kvq_tensor *t, uint64_t *first, uint64_t *bytes) {
  uint64_t last = 0;
  for (uint32_t i = 0; i < 3; i++) last += (uint64_t)(t->shape[i] - 1) * (uint64_t)t->strides[i];
  *first = t->offset;
  *bytes = (last + 1) * (t->dtype == KVQ_DTYPE_F32 ? 4 : 2);
}

/* Imports t's memory and reads its span into a host copy; *host views the copy as a host tensor. */
static kvq_status stage(kvq_context *ctx, const kvq_tensor *t, kvq_buffer **buffer, uint8_t **copy, kvq_tensor *host) {
  kvq_backend *be = ctx->backend;
  uint64_t first, bytes;
  kvq_tensor_span(t, &first, &bytes);
  *copy = bytes <= SIZE_MAX ? malloc((size_t)bytes) : NULL;
  if (!*copy) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for a %llu-byte device tensor", (unsigned long long)bytes);
  const kvq_device_memory memory = kvq_tensor_memory(t);
  kvq_status st = be->ops->buffer_import(be, &memory, first + bytes, buffer);
  if (st == KVQ_OK) st = be->ops->buffer_read(be, *buffer, first, *copy, bytes);
  if (st != KVQ_OK) {
    if (*buffer) be->ops->buffer_destroy(be, *buffer);
    free(*copy);
    *buffer = NULL, *copy = NULL;
    return kvq_fail_backend(ctx, st, "reading a device tensor");
  }
  *host = *t;
  host->memory = KVQ_MEMORY_HOST;
  host->data = *copy;
  host->offset = 0;
  return KVQ_OK;
}

kvq_status kvq_tensor_read(kvq_context *ctx, const kvq_tensor *t, void *dst, kvq_dtype dst_dtype) {
  if (t->memory == KVQ_MEMORY_HOST) {
    kvq_tensor_gather(t, dst, dst_dtype);
    return KVQ_OK;
  }
  kvq_buffer *buffer = NULL;
  uint8_t *copy = NULL;
  kvq_tensor host;
  kvq_status st = stage(ctx, t, &buffer, &copy, &host);
  if (st != KVQ_OK) return st;
  kvq_tensor_gather(&host, dst, dst_dtype);
  ctx->backend->ops->buffer_destroy(ctx->backend, buffer);
  free(copy);
  return KVQ_OK;
}

kvq_status kvq_tensor_write(kvq_context *ctx, const kvq_tensor *t, const float *src) {
  return kvq_tensors_write(ctx, 1, &t, &src);
}

/* One device tensor of kvq_tensors_write: its memory imported, the bytes it spans on the host. */
typedef struct staged_tensor {
  kvq_buffer *buffer;
  uint8_t *copy;
  kvq_tensor host;
} staged_tensor;

kvq_status kvq_tensors_write(kvq_context *ctx, size_t count, const kvq_tensor *const *t, const float *const *src) {
  kvq_backend *be = ctx->backend;
  size_t devices = 0;
  for (size_t i = 0; i < count; i++) devices += t[i]->memory != KVQ_MEMORY_HOST;
  staged_tensor *staged = devices ? calloc(count, sizeof *staged) : NULL;
  kvq_status st = KVQ_OK;
  if (devices && !staged) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory writing device tensors");
  /* Every device tensor read (strided gaps keep their bytes) before any is written: a read waits for
   * the work issued so far, which on a backend that records the call (Vulkan) submits it, so a read
   * after a write would run that write even if the call then fails. The writes are then recorded
   * together and run with the call's end (unless they outgrow the backend's staging memory, which
   * submits part way: docs/RELIABILITY.md); a failed call drops them (kvq_call_discard). */
  for (size_t i = 0; i < count && st == KVQ_OK; i++)
    if (t[i]->memory != KVQ_MEMORY_HOST) st = stage(ctx, t[i], &staged[i].buffer, &staged[i].copy, &staged[i].host);
  for (size_t i = 0; i < count && st == KVQ_OK; i++) {
    if (t[i]->memory == KVQ_MEMORY_HOST) continue;
    kvq_tensor_scatter(&staged[i].host, src[i]);
    uint64_t first, bytes;
    kvq_tensor_span(t[i], &first, &bytes);
    if ((st = be->ops->buffer_write(be, staged[i].buffer, first, staged[i].copy, bytes)) != KVQ_OK)
      st = kvq_fail_backend(ctx, st, "writing a device tensor");
  }
  /* On a backend that runs each operation as issued (CUDA), the writes, and the timing event the
   * call's end records after them, are waited for here, so that nothing can fail after the host
   * tensors below are written but the call's end wait, which fails only with a lost device (a failed
   * call leaves its outputs as they were: core/output_undo.c puts the device ones back, and the host
   * ones are not written yet). A backend that records the call runs them with its end instead. */
  if (st == KVQ_OK && devices && !(be->features & KVQ_BACKEND_RECORDS) && (st = be->ops->finish(be)) != KVQ_OK)
    st = kvq_fail_backend(ctx, st, "waiting for the writes of device tensors");
  /* host tensors last */
  for (size_t i = 0; i < count && st == KVQ_OK; i++)
    if (t[i]->memory == KVQ_MEMORY_HOST) kvq_tensor_scatter(t[i], src[i]);
  for (size_t i = 0; staged && i < count; i++) {
    if (staged[i].buffer) be->ops->buffer_destroy(be, staged[i].buffer);
    free(staged[i].copy);
  }
  free(staged);
  return st;
}

int kvq_tensor_on_device(const kvq_context *ctx, const kvq_tensor *t) {
  uint64_t first, bytes;
  kvq_tensor_span(t, &first, &bytes);
  const int vulkan = t->memory == KVQ_MEMORY_VULKAN_BUFFER, cuda = t->memory == KVQ_MEMORY_CUDA_DEVICE;
  /* Shaders address 32-bit words: the word holding the last element must lie in the caller's buffer,
   * whose size Vulkan cannot tell, so a 16-bit tensor must end on a word boundary (else it is staged).
   * CUDA's kernel stores 16-bit elements as 16 bits: any end will do. */
  return (vulkan || cuda) && ctx->backend->ops->convert && ctx->backend->ops->buffer_import &&
         t->offset % kvq_dtype_size(t->dtype) == 0 && (cuda || (first + bytes) % 4 == 0) &&
         /* and the kernels index elements in 32 bits (beyond, the staged path still works) */
         (first + bytes) / kvq_dtype_size(t->dtype) < UINT32_MAX && kvq_tensor_count(t) < UINT32_MAX;
}

/* The check word. It is zeroed (a recorded fill) before the first check after a read of it; an
 * asynchronous call's checks are read only when the context is waited for, so the word keeps the
 * bits of every call since, and outputs written only IF_CLEAR stay unwritten after a failure until
 * kvq_context_wait reports it. */
static kvq_status checks_start(kvq_context *ctx) {
  kvq_backend *be = ctx->backend;
  kvq_status st = KVQ_OK;
  if (!ctx->checks && (st = be->ops->buffer_create(be, 16, &ctx->checks)) != KVQ_OK)
    return kvq_fail_backend(ctx, st, "creating the check word");
  if (ctx->checks_dirty && (st = be->ops->buffer_zero(be, ctx->checks, 0, 4)) != KVQ_OK)
    return kvq_fail_backend(ctx, st, "zeroing the check word");
  ctx->checks_dirty = 0;
  ctx->checks_recorded = 1;
  return KVQ_OK;
}

/* One CONVERT job between a block of `t` (elements start + [0, shape) of its three dimensions) and
 * kvq's buffer `ours` at byte ours_offset with element strides ours_strides, in either direction. */
static kvq_status convert(kvq_context *ctx, const kvq_tensor *t, const uint32_t start[3], const uint32_t shape[3], kvq_buffer *ours,
                          uint64_t ours_offset, kvq_dtype ours_dtype, const int64_t ours_strides[3], int to_tensor, uint32_t checks) {
  kvq_backend *be = ctx->backend;
  kvq_status st = checks ? checks_start(ctx) : KVQ_OK;
  if (st != KVQ_OK) return st;
  uint64_t first, bytes;
  kvq_tensor_span(t, &first, &bytes);
  kvq_buffer *buffer = NULL;
  const kvq_device_memory memory = kvq_tensor_memory(t);
  if ((st = be->ops->buffer_import(be, &memory, first + bytes, &buffer)) != KVQ_OK)
    return kvq_fail_backend(ctx, st, "importing a device tensor");
  uint64_t at = t->offset / kvq_dtype_size(t->dtype);
  for (int i = 0; i < 3; i++) at += (uint64_t)start[i] * (uint64_t)t->strides[i];
  const kvq_tensor_place caller = {buffer, t->dtype, at, {t->strides[0], t->strides[1], t->strides[2]}};
  const kvq_tensor_place place = {ours, ours_dtype, ours_offset / kvq_dtype_size(ours_dtype),
                                  {ours_strides[0], ours_strides[1], ours_strides[2]}};
  const kvq_job_convert job = {.shape = {shape[0], shape[1], shape[2]},
                               .src = to_tensor ? place : caller,
                               .dst = to_tensor ? caller : place,
                               .checks = checks,
                               .flags = checks ? ctx->checks : NULL};
  st = be->ops->convert(be, &job);
  be->ops->buffer_destroy(be, buffer); /* the wrapper; freed once the recorded work is done */
  return st == KVQ_OK ? KVQ_OK : kvq_fail_backend(ctx, st, to_tensor ? "writing a device tensor" : "reading a device tensor");
}

kvq_status kvq_tensor_gather_rows(kvq_context *ctx, const kvq_tensor *t, uint32_t row0, uint32_t rows, kvq_buffer *dst,
                                  uint64_t dst_offset, kvq_dtype dst_dtype) {
  const uint32_t start[3] = {row0, 0, 0}, shape[3] = {rows, (uint32_t)t->shape[1], (uint32_t)t->shape[2]};
  const int64_t packed[3] = {t->shape[1] * t->shape[2], t->shape[2], 1};
  return convert(ctx, t, start, shape, dst, dst_offset, dst_dtype, packed, 0, KVQ_JOB_CONVERT_FINITE);
}

kvq_status kvq_tensor_scatter_rows(kvq_context *ctx, kvq_buffer *src, uint64_t src_offset, const kvq_tensor *t, uint32_t row0,
                                   uint32_t rows, uint32_t checks) {
  const uint32_t start[3] = {row0, 0, 0}, shape[3] = {rows, (uint32_t)t->shape[1], (uint32_t)t->shape[2]};
  const int64_t packed[3] = {t->shape[1] * t->shape[2], t->shape[2], 1};
  return convert(ctx, t, start, shape, src, src_offset, KVQ_DTYPE_F32, packed, 1, checks);
}

kvq_status kvq_tensor_scatter_block(kvq_context *ctx, kvq_buffer *src, uint64_t src_offset, kvq_dtype src_dtype,
                                    const int64_t src_strides[3], const kvq_tensor *t, const uint32_t start[3],
                                    const uint32_t shape[3], uint32_t checks) {
  return convert(ctx, t, start, shape, src, src_offset, src_dtype, src_strides, 1, checks);
}

kvq_status kvq_device_tokens_check(kvq_context *ctx, const kvq_side_desc *side, kvq_dtype dtype, kvq_buffer *tokens,
                                   uint64_t offset, uint32_t count) {
  kvq_backend *be = ctx->backend;
  kvq_status st = checks_start(ctx);
  if (st != KVQ_OK) return st;
  const kvq_job_token_check job = {.side = side, .dtype = dtype, .src = tokens, .src_offset = offset, .count = count,
                                   .flags = ctx->checks};
  st = be->ops->check_tokens(be, &job);
  return st == KVQ_OK ? KVQ_OK : kvq_fail_backend(ctx, st, "checking device tokens");
}

kvq_status kvq_device_copy_if_clear(kvq_context *ctx, kvq_buffer *dst, uint64_t dst_offset, kvq_buffer *src, uint64_t src_offset,
                                    uint64_t bytes) {
  kvq_backend *be = ctx->backend;
  const uint64_t words = bytes / 4;
  if (bytes % 4 || dst_offset % 4 || src_offset % 4 || words > UINT32_MAX || !ctx->checks)
    return kvq_fail(ctx, KVQ_ERROR_INTERNAL, "a checked copy of %llu bytes that is not whole words, or without checks",
                    (unsigned long long)bytes);
  const kvq_job_convert job = {.shape = {1, 1, (uint32_t)words},
                               .src = {src, KVQ_DTYPE_F32, src_offset / 4, {(int64_t)words, (int64_t)words, 1}},
                               .dst = {dst, KVQ_DTYPE_F32, dst_offset / 4, {(int64_t)words, (int64_t)words, 1}},
                               .checks = KVQ_JOB_CONVERT_IF_CLEAR,
                               .flags = ctx->checks};
  const kvq_status st = be->ops->convert(be, &job);
  return st == KVQ_OK ? KVQ_OK : kvq_fail_backend(ctx, st, "recording a copy behind the device checks");
}

kvq_status kvq_device_checks_read(kvq_context *ctx) {
  if (!ctx->checks_recorded && !ctx->checks_pending) return KVQ_OK;
  ctx->checks_recorded = ctx->checks_pending = 0;
  kvq_backend *be = ctx->backend;
  uint32_t word = 0;
  kvq_status st = be->ops->buffer_read(be, ctx->checks, 0, &word, 4);
  ctx->checks_dirty = word != 0;
  if (st != KVQ_OK) return kvq_fail_backend(ctx, st, "reading the device checks");
  const char *what = ctx->checks_what ? ctx->checks_what : "kvq";
  if (word & KVQ_JOB_CONVERT_FINITE)
    return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                    "%s: a device tensor holds a non-finite element (checked on the device; see docs/VULKAN.md)", what);
  if (word & KVQ_JOB_CHECK_RANGE)
    return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                    "%s: a device key or value is beyond what its layer's method stores (an fp16 norm, scale, minimum or "
                    "value would overflow; checked on the device, see docs/VULKAN.md)",
                    what);
  if (word & KVQ_JOB_CONVERT_FITS)
    return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                    "%s: the result overflowed fp32 or does not fit the output's dtype (checked on the device): the output was not written",
                    what);
  return KVQ_OK;
}
