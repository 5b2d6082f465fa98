/*
 * Caller tensors in device memory (a runtime's VkBuffer): kvq imports the buffer through its backend
 * and moves the bytes the tensor spans through host memory, where the same checks and conversions
 * as for host tensors apply. Simple and exact; a later version can keep such tensors on the device.
 */
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

/* The bytes [first, first + bytes) of the device memory the tensor's elements lie in. */
static void span(const kvq_tensor *t, uint64_t *first, uint64_t *bytes) {
  uint64_t last = 0;
  for (uint32_t i = 0; i < 3; i++) last += (uint64_t)(t->shape[i] - 1) * (uint64_t)t->strides[i];
  *first = t->offset;
  *bytes = (last + 1) * (t->dtype == KVQ_DTYPE_F32 ? 4 : 2);
}

/* Imports t's memory and reads its span into a host copy; *host views the copy as a host tensor. */
static kvq_status stage(kvq_context *ctx, const kvq_tensor *t, kvq_buffer **buffer, uint8_t **copy, kvq_tensor *host) {
  kvq_backend *be = ctx->backend;
  uint64_t first, bytes;
  span(t, &first, &bytes);
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
  if (t->memory == KVQ_MEMORY_HOST) {
    kvq_tensor_scatter(t, src);
    return KVQ_OK;
  }
  kvq_buffer *buffer = NULL;
  uint8_t *copy = NULL;
  kvq_tensor host;
  kvq_status st = stage(ctx, t, &buffer, &copy, &host); /* read first: strided gaps keep their bytes */
  if (st != KVQ_OK) return st;
  kvq_tensor_scatter(&host, src);
  uint64_t first, bytes;
  span(t, &first, &bytes);
  st = ctx->backend->ops->buffer_write(ctx->backend, buffer, first, copy, bytes);
  ctx->backend->ops->buffer_destroy(ctx->backend, buffer);
  free(copy);
  return st == KVQ_OK ? KVQ_OK : kvq_fail_backend(ctx, st, "writing a device tensor");
}
