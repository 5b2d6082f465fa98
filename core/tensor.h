/* Checking caller tensors and moving their elements to and from packed row-major arrays. */
#ifndef KVQ_CORE_TENSOR_H
#define KVQ_CORE_TENSOR_H

#include "internal.h"

/* Checks `t` (named `name` in messages) against rank 3 and an expected shape, where -1 accepts any
 * size >= 1. Host memory, or device memory the context's backend can import (buffer_import). */
kvq_status kvq_tensor_check(kvq_context *ctx, const kvq_tensor *t, const char *name, const int64_t expect[3]);

/* The memory a tensor names, as a backend imports it: data for pointer kinds, handle for handle kinds. */
kvq_device_memory kvq_tensor_memory(const kvq_tensor *t);

/* Number of elements. */
uint64_t kvq_tensor_count(const kvq_tensor *t);

/* Copies the elements in row-major order into dst as dst_dtype: raw bits when the dtypes match,
 * else converted (to fp32 exactly; fp32 to fp16/bf16 rounding half to even). */
void kvq_tensor_gather(const kvq_tensor *t, void *dst, kvq_dtype dst_dtype);

/* kvq_tensor_gather and kvq_tensor_scatter for tensors in any memory the check accepted: device
 * tensors are imported and the bytes they span read into host memory (and written back after a
 * scatter, gaps between strided elements included, unchanged). Fail with a message in ctx. */
kvq_status kvq_tensor_read(kvq_context *ctx, const kvq_tensor *t, void *dst, kvq_dtype dst_dtype);
kvq_status kvq_tensor_write(kvq_context *ctx, const kvq_tensor *t, const float *src);

/* Converts n packed little-endian values of `dtype` to fp32 (exact). */
void kvq_convert_to_f32(kvq_dtype dtype, const void *src, float *dst, uint64_t n);

/* x rounded to a dtype (round half to even) and back: what a tensor of that dtype would hold. */
float kvq_round_to(kvq_dtype dtype, float x);

/* Writes row-major fp32 values into the tensor, converting to its dtype. */
void kvq_tensor_scatter(const kvq_tensor *t, const float *src);

#endif
