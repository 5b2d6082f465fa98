/* Contexts: one backend each, chosen explicitly or automatically. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_meta.h"
#include "internal.h"
#include "memory_limits.h"
#include "tensor.h"

static const kvq_backend_kind all_kinds[] = {KVQ_BACKEND_CPU, KVQ_BACKEND_VULKAN, KVQ_BACKEND_CUDA};
#define KIND_COUNT (sizeof all_kinds / sizeof all_kinds[0])

kvq_status kvq_backends_list(kvq_backend_info *infos, size_t capacity, size_t *count) {
  if (!count || (capacity > 0 && !infos)) return KVQ_ERROR_INVALID_ARGUMENT;
  for (size_t i = 0; i < KIND_COUNT && i < capacity; i++) kvq_backend_probe(all_kinds[i], &infos[i]);
  *count = KIND_COUNT;
  return KVQ_OK;
}

kvq_context_options kvq_context_options_default(void) {
  return (kvq_context_options){.struct_size = sizeof(kvq_context_options), .backend = KVQ_BACKEND_AUTO, .device_index = -1};
}

/* The caller's options as this version knows them: struct_size bytes of them (0: this header's size),
 * the members a newer header added only when they are all zero. */
static kvq_status read_options(const kvq_context_options *options, kvq_context_options *opt) {
  *opt = kvq_context_options_default();
  if (!options) return KVQ_OK;
  const size_t given = options->struct_size ? options->struct_size : sizeof *options;
  if (given < sizeof *options) return KVQ_ERROR_INVALID_ARGUMENT; /* no older layout had struct_size */
  const unsigned char *tail = (const unsigned char *)options + sizeof *options;
  for (size_t i = 0; i < given - sizeof *options; i++)
    if (tail[i]) return KVQ_ERROR_UNSUPPORTED;
  *opt = *options;
  return KVQ_OK;
}

kvq_status kvq_context_create(const kvq_context_options *options, kvq_context **out) {
  if (!out) return KVQ_ERROR_INVALID_ARGUMENT;
  *out = NULL;
  kvq_context_options opt;
  kvq_status read = read_options(options, &opt);
  if (read != KVQ_OK) return read;
  if (opt.backend < KVQ_BACKEND_AUTO || opt.backend > KVQ_BACKEND_CUDA) return KVQ_ERROR_INVALID_ARGUMENT;
  if (opt.device_index < -1) return KVQ_ERROR_OUT_OF_RANGE;
  /* a runtime's device belongs to one backend */
  if (opt.vulkan && opt.cuda) return KVQ_ERROR_INVALID_ARGUMENT;
  if (opt.vulkan && opt.backend != KVQ_BACKEND_AUTO && opt.backend != KVQ_BACKEND_VULKAN) return KVQ_ERROR_INVALID_ARGUMENT;
  if (opt.cuda && opt.backend != KVQ_BACKEND_AUTO && opt.backend != KVQ_BACKEND_CUDA) return KVQ_ERROR_INVALID_ARGUMENT;
  if (opt.vulkan) opt.backend = KVQ_BACKEND_VULKAN;
  if (opt.cuda) opt.backend = KVQ_BACKEND_CUDA;
  kvq_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return KVQ_ERROR_OUT_OF_MEMORY;
  /* AUTO: the fastest backend that starts (CUDA, then Vulkan), else the CPU reference. */
  const kvq_backend_kind auto_order[] = {KVQ_BACKEND_CUDA, KVQ_BACKEND_VULKAN, KVQ_BACKEND_CPU};
  kvq_status st = KVQ_ERROR_BACKEND_UNAVAILABLE;
  char why[256];
  kvq_availability availability;
  if (opt.backend == KVQ_BACKEND_AUTO) {
    for (size_t i = 0; i < 3 && !ctx->backend; i++)
      st = kvq_backend_create(auto_order[i], &opt, &ctx->backend, &availability, why, sizeof why);
  } else {
    st = kvq_backend_create(opt.backend, &opt, &ctx->backend, &availability, why, sizeof why);
  }
  if (st != KVQ_OK || !ctx->backend) {
    free(ctx);
    return st == KVQ_OK ? KVQ_ERROR_BACKEND_UNAVAILABLE : st;
  }
  if (ctx->backend->ops->abi_version != KVQ_BACKEND_ABI_VERSION) {
    ctx->backend->ops->destroy(ctx->backend);
    free(ctx);
    return KVQ_ERROR_INTERNAL;
  }
  ctx->host_memory_bytes = kvq_host_memory_bytes(); /* once: calls check their working memory against it */
  *out = ctx;
  return KVQ_OK;
}

void kvq_context_destroy(kvq_context *ctx) {
  if (!ctx) return;
  /* Caches still using the context keep it alive; the last one to go frees it. */
  ctx->destroy_requested = 1;
  kvq_context_release(ctx);
}

void kvq_context_release(kvq_context *ctx) {
  if (!ctx->destroy_requested || ctx->live_caches > 0) return;
  if (ctx->backend && ctx->checks) ctx->backend->ops->buffer_destroy(ctx->backend, ctx->checks);
  kvq_gpu_meta_free(ctx->gpu_meta);
  if (ctx->backend) ctx->backend->ops->destroy(ctx->backend);
  free(ctx);
}

kvq_backend_kind kvq_context_backend(const kvq_context *ctx) {
  return ctx && ctx->backend ? ctx->backend->kind : KVQ_BACKEND_AUTO;
}

const char *kvq_context_last_error(const kvq_context *ctx) { return ctx ? ctx->error : ""; }

kvq_status kvq_context_device_time(kvq_context *ctx, uint64_t *ns) {
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!ns) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_context_device_time: ns is NULL");
  kvq_backend *be = ctx->backend;
  if (!be->ops->device_time)
    return kvq_fail(ctx, KVQ_ERROR_UNSUPPORTED, "kvq_context_device_time: the %s backend has no device clock", be->ops->name);
  uint64_t t = 0;
  const kvq_status st = be->ops->device_time(be, &t);
  if (st != KVQ_OK) return kvq_fail_backend(ctx, st, "reading the device clock");
  *ns = t;
  return KVQ_OK;
}

kvq_status kvq_context_backend_stats(kvq_context *ctx, kvq_backend_stats *out, int reset) {
  if (!ctx || !ctx->backend) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!ctx->backend->ops->stats) return KVQ_ERROR_UNSUPPORTED;
  ctx->backend->ops->stats(ctx->backend, out, reset);
  return KVQ_OK;
}

kvq_status kvq_read_later(kvq_context *ctx, kvq_buffer *buffer, uint64_t offset, void *dst, uint64_t bytes, int *later) {
  kvq_backend *be = ctx->backend;
  if (!be->ops->buffer_read_later) return be->ops->buffer_read(be, buffer, offset, dst, bytes);
  *later = 1;
  return be->ops->buffer_read_later(be, buffer, offset, dst, bytes);
}

kvq_status kvq_reads_wait(kvq_context *ctx, int *later) {
  if (!*later) return KVQ_OK;
  *later = 0;
  return ctx->backend->ops->finish(ctx->backend);
}

void kvq_call_begin(kvq_context *ctx) {
  if (ctx->backend->ops->defer) ctx->backend->ops->defer(ctx->backend);
}

void kvq_call_begin_parts(kvq_context *ctx) {
  kvq_backend *be = ctx->backend;
  if (be->ops->defer_parts) be->ops->defer_parts(be);
  else if (be->ops->defer) be->ops->defer(be);
}

void kvq_reads_drop(kvq_context *ctx, int *later) {
  if (!*later) return;
  *later = 0;
  kvq_call_discard(ctx);
  /* a backend without discard delivered or runs the reads in order: wait before dst goes */
  if (!ctx->backend->ops->discard) (void)ctx->backend->ops->finish(ctx->backend);
}

void kvq_call_discard(kvq_context *ctx) {
  kvq_backend *be = ctx->backend;
  if (!be->ops->discard) return;
  be->ops->discard(be);
  /* The call's checks never ran (or ran in an earlier submission of the call, their bits then still
   * in the word): not read, and the word zeroed before its next use. With checks pending from
   * asynchronous calls the word holds their bits, which kvq_context_wait must still report, and this
   * call recorded no fill (the word was clean when the first of them started). */
  if (ctx->checks_recorded && !ctx->checks_pending) ctx->checks_dirty = 1;
  ctx->checks_recorded = 0;
}

/* Ends a call: submits what it recorded, waiting for it unless `wait` is 0; a failed call's recording
 * is dropped instead (kvq_call_discard). */
static kvq_status call_end(kvq_context *ctx, kvq_status status, int wait) {
  kvq_backend *be = ctx->backend;
  if (status != KVQ_OK) kvq_call_discard(ctx);
  /* checks of device tensors: read now (the call's one submission and wait), or when waited for */
  if (ctx->checks_recorded && wait) {
    const kvq_status checked = kvq_device_checks_read(ctx);
    if (status == KVQ_OK) status = checked;
  } else if (ctx->checks_recorded) {
    ctx->checks_recorded = 0;
    ctx->checks_pending = 1;
  }
  if (!be->ops->end_deferred) return status;
  const kvq_status ended = be->ops->end_deferred(be, wait);
  if (status != KVQ_OK) return status;
  return ended == KVQ_OK ? KVQ_OK : kvq_fail_backend(ctx, ended, "submitting the call's work");
}

kvq_status kvq_call_end(kvq_context *ctx, kvq_status status) { return call_end(ctx, status, !ctx->async); }

kvq_status kvq_call_end_waiting(kvq_context *ctx, kvq_status status) { return call_end(ctx, status, 1); }

kvq_status kvq_call_settle(kvq_context *ctx, int always, const char *what) {
  kvq_backend *be = ctx->backend;
  kvq_status st = KVQ_OK;
  if (ctx->async && !always) {
    /* submitted, not waited for; what the call records after this is deferred again */
    if (be->ops->end_deferred) st = be->ops->end_deferred(be, 0);
    if (be->ops->defer) be->ops->defer(be);
  } else {
    /* checks of device tensors recorded so far: read now, their read being the call's one submission
     * and wait (a read after the finish would be a second) */
    if (ctx->checks_recorded && (st = kvq_device_checks_read(ctx)) != KVQ_OK) return st;
    st = be->ops->finish(be);
  }
  return st == KVQ_OK ? KVQ_OK : kvq_fail_backend(ctx, st, what);
}

kvq_status kvq_context_wait(kvq_context *ctx) {
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_status st = ctx->backend->ops->finish(ctx->backend);
  if (st != KVQ_OK) return kvq_fail_backend(ctx, st, "kvq_context_wait: the work in flight failed");
  return kvq_device_checks_read(ctx); /* asynchronous calls' checks */
}

kvq_status kvq_context_set_load_limit(kvq_context *ctx, uint64_t max_bytes) {
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  ctx->load_limit = max_bytes;
  return KVQ_OK;
}

kvq_status kvq_context_set_async(kvq_context *ctx, int enabled) {
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_status st = KVQ_OK;
  if (ctx->async && !enabled) st = kvq_context_wait(ctx);
  ctx->async = enabled != 0;
  return st;
}
