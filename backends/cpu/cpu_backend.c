/* The CPU backend's table: host-memory buffers, synchronous jobs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/layout.h"
#include "core/memory_limits.h"
#include "cpu.h"

const cpu_method *kvq_cpu_method(uint32_t layout_method) {
  switch (layout_method) {
  case KVQ_LAYOUT_EXACT: return &kvq_cpu_exact;
  case KVQ_LAYOUT_QJL: return &kvq_cpu_qjl;
  case KVQ_LAYOUT_UNIFORM: return &kvq_cpu_uniform;
  case KVQ_LAYOUT_KIVI: return &kvq_cpu_kivi;
  case KVQ_LAYOUT_POLAR: return &kvq_cpu_polar;
  case KVQ_LAYOUT_CQ: return &kvq_cpu_cq;
  }
  return NULL;
}

cpu_head kvq_cpu_head(const kvq_side_desc *side) {
  cpu_head h = {.side = side};
  for (int i = 0; i < KVQ_SIDE_FIXED; i++) h.fixed[i] = side->fixed[i] ? (const float *)side->fixed[i]->data : NULL;
  return h;
}

static void cpu_destroy(kvq_backend *b) {
  free(((cpu_backend *)b)->page_workspace);
  free(b);
}

static int cpu_supports(const kvq_backend *b, kvq_job_kind kind, const kvq_side_layout *keys,
                        const kvq_side_layout *values) {
  (void)b;
  (void)kind;
  return (!keys || kvq_cpu_method(keys->method)) && (!values || kvq_cpu_method(values->method));
}

kvq_status kvq_cpu_foreign(kvq_backend *b) {
  snprintf(b->message, sizeof b->message, "cpu: a buffer of another backend was handed to the CPU backend");
  return KVQ_ERROR_INVALID_ARGUMENT;
}

static kvq_status range_check(kvq_backend *b, const kvq_buffer *buf, uint64_t offset, uint64_t bytes) {
  if (!kvq_buffer_owned(b, buf)) return kvq_cpu_foreign(b);
  if (!buf || offset > buf->size || bytes > buf->size - offset) {
    snprintf(b->message, sizeof b->message, "cpu: buffer access [%llu, +%llu) outside a buffer of %llu bytes",
             (unsigned long long)offset, (unsigned long long)bytes, (unsigned long long)(buf ? buf->size : 0));
    return KVQ_ERROR_INTERNAL;
  }
  return KVQ_OK;
}

static kvq_status cpu_buffer_create(kvq_backend *b, uint64_t bytes, kvq_buffer **out) {
  kvq_buffer *buf = calloc(1, sizeof *buf);
  /* calloc: buffers start zeroed, as the interface requires, and untouched pages cost no RSS. */
  uint8_t *data = bytes <= SIZE_MAX ? calloc(1, bytes ? (size_t)bytes : 1) : NULL;
  if (!buf || !data) {
    free(buf);
    free(data);
    snprintf(b->message, sizeof b->message, "cpu: cannot allocate %llu bytes", (unsigned long long)bytes);
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  buf->base.owner = b;
  buf->data = data;
  buf->size = bytes;
  *out = buf;
  return KVQ_OK;
}

static void cpu_buffer_destroy(kvq_backend *b, kvq_buffer *buf) {
  if (!buf) return;
  if (!kvq_buffer_owned(b, buf)) { /* not ours to free: leave it to its owner */
    kvq_cpu_foreign(b);
    return;
  }
  free(buf->data);
  free(buf);
}

static kvq_status cpu_buffer_write(kvq_backend *b, kvq_buffer *buf, uint64_t offset, const void *src, uint64_t bytes) {
  kvq_status st = range_check(b, buf, offset, bytes);
  if (st == KVQ_OK && bytes) memcpy(buf->data + offset, src, (size_t)bytes);
  return st;
}

static kvq_status cpu_buffer_read(kvq_backend *b, kvq_buffer *buf, uint64_t offset, void *dst, uint64_t bytes) {
  kvq_status st = range_check(b, buf, offset, bytes);
  if (st == KVQ_OK && bytes) memcpy(dst, buf->data + offset, (size_t)bytes);
  return st;
}

static kvq_status cpu_buffer_copy(kvq_backend *b, kvq_buffer *dst, uint64_t dst_offset, kvq_buffer *src,
                                  uint64_t src_offset, uint64_t bytes) {
  kvq_status st = range_check(b, dst, dst_offset, bytes);
  if (st == KVQ_OK) st = range_check(b, src, src_offset, bytes);
  if (st == KVQ_OK && bytes) memmove(dst->data + dst_offset, src->data + src_offset, (size_t)bytes);
  return st;
}

static kvq_status cpu_buffer_zero(kvq_backend *b, kvq_buffer *buf, uint64_t offset, uint64_t bytes) {
  kvq_status st = range_check(b, buf, offset, bytes);
  if (st == KVQ_OK && bytes) memset(buf->data + offset, 0, (size_t)bytes);
  return st;
}

static kvq_status cpu_finish(kvq_backend *b) {
  (void)b;
  return KVQ_OK;
}

static const kvq_backend_ops cpu_ops = {
    .abi_version = KVQ_BACKEND_ABI_VERSION,
    .name = "cpu",
    .destroy = cpu_destroy,
    .supports = cpu_supports,
    .buffer_create = cpu_buffer_create,
    .buffer_destroy = cpu_buffer_destroy,
    .buffer_write = cpu_buffer_write,
    .buffer_read = cpu_buffer_read,
    .buffer_copy = cpu_buffer_copy,
    .buffer_zero = cpu_buffer_zero,
    .quantize = kvq_cpu_quantize,
    .dequantize = kvq_cpu_dequantize,
    .prepare_queries = kvq_cpu_prepare,
    .score = kvq_cpu_score,
    .softmax = kvq_cpu_softmax,
    .weighted_sum = kvq_cpu_weighted_sum,
    .attention = NULL, /* the reference runs the unfused jobs, one step at a time */
    .kmeans_assign = kvq_cpu_kmeans_assign,
    .kmeans_update = kvq_cpu_kmeans_update,
    .finish = cpu_finish,
};

kvq_status kvq_cpu_backend_create(kvq_backend **out, char *why, size_t why_size) {
  cpu_backend *b = calloc(1, sizeof *b);
  if (b) b->page_workspace = malloc(sizeof(float) * KVQ_MAX_PAGE_SIZE * KVQ_MAX_HEAD_DIM);
  if (!b || !b->page_workspace) {
    if (b) free(b);
    snprintf(why, why_size, "cpu: out of host memory");
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  b->base.ops = &cpu_ops;
  b->base.kind = KVQ_BACKEND_CPU;
  snprintf(b->base.device, sizeof b->base.device, "scalar C reference (host)");
  /* its buffers are host memory: a cache beyond the machine's memory is refused up front */
  b->base.memory_bytes = b->base.max_buffer_bytes = kvq_host_memory_bytes();
  b->base.features = KVQ_BACKEND_WRITE_COPIES; /* buffer_write is a memcpy, done when it returns */
  *out = &b->base;
  return KVQ_OK;
}
