#include "tensor.h"

#include <string.h>

#include "halfconv.h"

/* A contiguous row-major tensor of any memory kind. */
static kvq_tensor contiguous(kvq_memory memory, void *data, uint64_t handle, uint64_t offset, kvq_dtype dtype, uint32_t rank,
                             const int64_t *shape) {
  kvq_tensor t;
  memset(&t, 0, sizeof t);
  t.memory = memory;
  t.data = data;
  t.handle = handle;
  t.offset = offset;
  t.dtype = dtype;
  t.rank = rank > KVQ_MAX_RANK ? KVQ_MAX_RANK : rank;
  int64_t stride = 1;
  for (uint32_t i = t.rank; i-- > 0;) {
    t.shape[i] = shape ? shape[i] : 0;
    t.strides[i] = stride;
    const int64_t dim = t.shape[i] > 0 ? t.shape[i] : 1;
    stride = stride > INT64_MAX / dim ? INT64_MAX : stride * dim; /* absurd shapes saturate; checks reject them */
  }
  return t;
}

kvq_tensor kvq_tensor_host(void *data, kvq_dtype dtype, uint32_t rank, const int64_t *shape) {
  return contiguous(KVQ_MEMORY_HOST, data, 0, 0, dtype, rank, shape);
}

kvq_tensor kvq_tensor_vulkan(uint64_t vk_buffer, uint64_t offset, kvq_dtype dtype, uint32_t rank, const int64_t *shape) {
  return contiguous(KVQ_MEMORY_VULKAN_BUFFER, NULL, vk_buffer, offset, dtype, rank, shape);
}

kvq_tensor kvq_tensor_cuda(void *device_pointer, kvq_dtype dtype, uint32_t rank, const int64_t *shape) {
  return contiguous(KVQ_MEMORY_CUDA_DEVICE, device_pointer, 0, 0, dtype, rank, shape);
}

/* Pointer kinds are named by data, handle kinds by handle. */
static int named_by_handle(kvq_memory memory) { return memory == KVQ_MEMORY_VULKAN_BUFFER; }

kvq_device_memory kvq_tensor_memory(const kvq_tensor *t) {
  return (kvq_device_memory){t->memory, named_by_handle(t->memory) ? NULL : t->data, named_by_handle(t->memory) ? t->handle : 0};
}

uint64_t kvq_tensor_count(const kvq_tensor *t) {
  uint64_t n = 1;
  for (uint32_t i = 0; i < t->rank; i++) n *= (uint64_t)t->shape[i];
  return n;
}

kvq_status kvq_tensor_check(kvq_context *ctx, const kvq_tensor *t, const char *name, const int64_t expect[3]) {
  if (!t) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: tensor is NULL", name);
  if (t->memory != KVQ_MEMORY_HOST) {
    if (t->memory != KVQ_MEMORY_VULKAN_BUFFER && t->memory != KVQ_MEMORY_CUDA_DEVICE)
      return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: unknown memory kind %d", name, (int)t->memory);
    const kvq_backend_kind owner = t->memory == KVQ_MEMORY_VULKAN_BUFFER ? KVQ_BACKEND_VULKAN : KVQ_BACKEND_CUDA;
    if (!ctx || !ctx->backend || ctx->backend->kind != owner || !ctx->backend->ops->buffer_import)
      return kvq_fail(ctx, KVQ_ERROR_UNSUPPORTED, "%s: device-memory tensors (%s) need the %s backend; this context runs on %s",
                      name, owner == KVQ_BACKEND_VULKAN ? "a VkBuffer" : "CUDA", owner == KVQ_BACKEND_VULKAN ? "vulkan" : "cuda",
                      ctx && ctx->backend ? ctx->backend->ops->name : "?");
    if (named_by_handle(t->memory) && !t->handle)
      return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: handle is VK_NULL_HANDLE", name);
  }
  if (t->dtype != KVQ_DTYPE_F32 && t->dtype != KVQ_DTYPE_F16 && t->dtype != KVQ_DTYPE_BF16)
    return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: unknown dtype %d", name, (int)t->dtype);
  if (t->rank != 3)
    return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: rank %u, expected 3", name, t->rank);
  if (!t->data && !named_by_handle(t->memory)) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: data is NULL", name);
  for (uint32_t i = 0; i < 3; i++) {
    if (t->shape[i] < 1 || t->shape[i] > (int64_t)1 << 31)
      return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE, "%s: shape[%u] = %lld must be from 1 to 2^31", name, i,
                      (long long)t->shape[i]);
    if (expect[i] >= 0 && t->shape[i] != expect[i])
      return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: shape[%u] = %lld, expected %lld", name, i,
                      (long long)t->shape[i], (long long)expect[i]);
    if (t->strides[i] < 1 || t->strides[i] > (int64_t)1 << 40)
      return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: strides[%u] = %lld must be from 1 to 2^40", name, i,
                      (long long)t->strides[i]);
  }
  /* The farthest element's index, sum of (shape - 1) * stride, can exceed 2^64 (2^31 * 2^40 per
   * term): accumulate with overflow tests, saturating at UINT64_MAX. */
  uint64_t total = 0;
  for (uint32_t i = 0; i < 3; i++) {
    uint64_t a = (uint64_t)(t->shape[i] - 1), b = (uint64_t)t->strides[i];
    if (a != 0 && b > (UINT64_MAX / 8) / a) total = UINT64_MAX;
    else if (total != UINT64_MAX) total = total + a * b > UINT64_MAX / 8 ? UINT64_MAX : total + a * b;
  }
  uint64_t size = t->dtype == KVQ_DTYPE_F32 ? 4 : 2;
  /* (a buffer named by a handle is addressed from 0) */
  const uintptr_t base = named_by_handle(t->memory) ? 0 : (uintptr_t)t->data;
  if (total == UINT64_MAX || (total + 1) * size > UINT64_MAX - t->offset ||
      (total + 1) * size + t->offset > (uint64_t)(UINTPTR_MAX - base))
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE, "%s: shape, strides and offset reach past the address space", name);
  return KVQ_OK;
}

static size_t esize(kvq_dtype d) { return d == KVQ_DTYPE_F32 ? 4 : 2; }

static const uint8_t *element(const kvq_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
  return (const uint8_t *)t->data + t->offset +
         esize(t->dtype) * (size_t)(i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2]);
}

static float load_f32(kvq_dtype dtype, const uint8_t *p) {
  if (dtype == KVQ_DTYPE_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  return dtype == KVQ_DTYPE_F16 ? kvq_f16_bits_to_f32(h) : kvq_bf16_bits_to_f32(h);
}

static void store_f32(kvq_dtype dtype, uint8_t *p, float v) {
  if (dtype == KVQ_DTYPE_F32) {
    memcpy(p, &v, 4);
    return;
  }
  uint16_t h = (uint16_t)(dtype == KVQ_DTYPE_F16 ? kvq_f32_to_f16_bits(v) : kvq_f32_to_bf16_bits(v));
  memcpy(p, &h, 2);
}

float kvq_round_to(kvq_dtype dtype, float x) {
  if (dtype == KVQ_DTYPE_F16) return kvq_round_f16(x);
  if (dtype == KVQ_DTYPE_BF16) return kvq_bf16_bits_to_f32(kvq_f32_to_bf16_bits(x));
  return x;
}

void kvq_convert_to_f32(kvq_dtype dtype, const void *src, float *dst, uint64_t n) {
  const uint8_t *p = src;
  const size_t size = esize(dtype);
  for (uint64_t i = 0; i < n; i++) dst[i] = load_f32(dtype, p + i * size);
}

kvq_status kvq_convert(const void *src, kvq_dtype src_dtype, void *dst, kvq_dtype dst_dtype, size_t count) {
  const int known = (src_dtype == KVQ_DTYPE_F32 || src_dtype == KVQ_DTYPE_F16 || src_dtype == KVQ_DTYPE_BF16) &&
                    (dst_dtype == KVQ_DTYPE_F32 || dst_dtype == KVQ_DTYPE_F16 || dst_dtype == KVQ_DTYPE_BF16);
  if (!known || (count > 0 && (!src || !dst))) return KVQ_ERROR_INVALID_ARGUMENT;
  const uint8_t *from = src;
  uint8_t *to = dst;
  for (size_t i = 0; i < count; i++) store_f32(dst_dtype, to + i * esize(dst_dtype), load_f32(src_dtype, from + i * esize(src_dtype)));
  return KVQ_OK;
}

const uint8_t *kvq_tensor_packed_host(const kvq_tensor *t, kvq_dtype dtype) {
  if (t->memory != KVQ_MEMORY_HOST || !t->data || t->dtype != dtype || t->rank != 3) return NULL;
  if (t->strides[2] != 1 || t->strides[1] != t->shape[2] || t->strides[0] != t->shape[1] * t->shape[2]) return NULL;
  return (const uint8_t *)t->data + t->offset;
}

void kvq_tensor_gather(const kvq_tensor *t, void *dst, kvq_dtype dst_dtype) {
  uint8_t *out = dst;
  const size_t out_size = esize(dst_dtype);
  /* rows of contiguous elements in the same dtype (a slice of a wider tensor, say): a copy per row,
   * not per element */
  if (t->dtype == dst_dtype && t->strides[2] == 1) {
    const size_t row = out_size * (size_t)t->shape[2];
    for (int64_t i0 = 0; i0 < t->shape[0]; i0++)
      for (int64_t i1 = 0; i1 < t->shape[1]; i1++) {
        if (row) memcpy(out, element(t, i0, i1, 0), row);
        out += row;
      }
    return;
  }
  for (int64_t i0 = 0; i0 < t->shape[0]; i0++)
    for (int64_t i1 = 0; i1 < t->shape[1]; i1++)
      for (int64_t i2 = 0; i2 < t->shape[2]; i2++) {
        const uint8_t *p = element(t, i0, i1, i2);
        if (dst_dtype == t->dtype) memcpy(out, p, out_size);
        else store_f32(dst_dtype, out, load_f32(t->dtype, p));
        out += out_size;
      }
}

void kvq_tensor_scatter(const kvq_tensor *t, const float *src) {
  for (int64_t i0 = 0; i0 < t->shape[0]; i0++)
    for (int64_t i1 = 0; i1 < t->shape[1]; i1++)
      for (int64_t i2 = 0; i2 < t->shape[2]; i2++) store_f32(t->dtype, (uint8_t *)element(t, i0, i1, i2), *src++);
}
