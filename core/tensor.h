/* Checking caller tensors and moving their elements to and from packed row-major arrays. */
#ifndef KVQ_CORE_TENSOR_H
#define KVQ_CORE_TENSOR_H

#include "internal.h"

/* Checks `t` (named `name` in messages) against rank 3 and an expected shape, where -1 accepts any
 * size >= 1. Host memory, or device memory the context's backend can import (buffer_import). */
kvq_status kvq_tensor_check(kvq_context *ctx, const kvq_tensor *t, const char *name, const int64_t expect[3]);

/* The memory a tensor names, as a backend imports it: data for pointer kinds, handle for handle kinds. */
kvq_device_memory kvq_tensor_memory(const kvq_tensor *t);

/* The bytes [*first, *first + *bytes) of the memory the tensor's elements lie in (its offset to the
 * end of its last element). */
void kvq_tensor_span(const kvq_tensor *t, uint64_t *first, uint64_t *bytes);

/* Number of elements. */
uint64_t kvq_tensor_count(const kvq_tensor *t);

/* Copies the elements in row-major order into dst as dst_dtype: raw bits when the dtypes match,
 * else converted (to fp32 exactly; fp32 to fp16/bf16 rounding half to even). */
void kvq_tensor_gather(const kvq_tensor *t, void *dst, kvq_dtype dst_dtype);

/* The elements of a rank-3 host tensor whose bytes already are what kvq_tensor_gather would write in
 * `dtype` (the same dtype, row-major without gaps): a caller reads them in place rather than gathering
 * a copy (kvq_append: a prefill's input is not copied on the host). NULL for any other tensor. */
const uint8_t *kvq_tensor_packed_host(const kvq_tensor *t, kvq_dtype dtype);

/* kvq_tensor_gather and kvq_tensor_scatter for tensors in any memory the check accepted: device
 * tensors are imported and the bytes they span read into host memory (and written back after a
 * scatter, gaps between strided elements included, unchanged). Fail with a message in ctx. */
kvq_status kvq_tensor_read(kvq_context *ctx, const kvq_tensor *t, void *dst, kvq_dtype dst_dtype);
kvq_status kvq_tensor_write(kvq_context *ctx, const kvq_tensor *t, const float *src);
/* kvq_tensor_write of count tensors, t[i] from src[i]: every device tensor is read before any is
 * written and host tensors are written last, so that a failure writes none of them on a backend that
 * records the call (a failed call's recording is dropped); on one that runs its work as issued
 * (CUDA), the caller undoes the device writes (core/output_undo.c). */
kvq_status kvq_tensors_write(kvq_context *ctx, size_t count, const kvq_tensor *const *t, const float *const *src);

/* Converts n packed little-endian values of `dtype` to fp32 (exact). */
void kvq_convert_to_f32(kvq_dtype dtype, const void *src, float *dst, uint64_t n);

/* x rounded to a dtype (round half to even) and back: what a tensor of that dtype would hold. */
float kvq_round_to(kvq_dtype dtype, float x);

/* Writes row-major fp32 values into the tensor, converting to its dtype. */
void kvq_tensor_scatter(const kvq_tensor *t, const float *src);

/* In place on the device (core/tensor_device.c): whether kvq reads or writes `t` there with the
 * backend's CONVERT job (a VkBuffer tensor on a backend that has it, its offset a whole number of
 * elements) instead of staging it through host memory. */
int kvq_tensor_on_device(const kvq_context *ctx, const kvq_tensor *t);
/* Records: rows [row0, row0 + rows) of t (dimension 0) into dst at dst_offset bytes, packed
 * [rows][shape1][shape2] of dst_dtype, non-finite elements flagged in the call's check word (and
 * written as 0). */
kvq_status kvq_tensor_gather_rows(kvq_context *ctx, const kvq_tensor *t, uint32_t row0, uint32_t rows, kvq_buffer *dst,
                                  uint64_t dst_offset, kvq_dtype dst_dtype);
/* Records: packed fp32 [rows][shape1][shape2] from src at src_offset bytes into rows [row0, +rows)
 * of t. KVQ_JOB_CONVERT_* checks: FITS|NO_WRITE checks first, IF_CLEAR writes only if every check
 * recorded so far in the call passed. */
kvq_status kvq_tensor_scatter_rows(kvq_context *ctx, kvq_buffer *src, uint64_t src_offset, const kvq_tensor *t, uint32_t row0,
                                   uint32_t rows, uint32_t checks);
/* Records: a block of `t`, elements start + [0, shape) of its three dimensions, from src at byte
 * src_offset with element strides src_strides, of src_dtype (converted to t's dtype), with the
 * KVQ_JOB_CONVERT_* checks of kvq_tensor_scatter_rows (kvq_scores and kvq_dequantize write their
 * outputs this way, one block per run of kept tokens). */
kvq_status kvq_tensor_scatter_block(kvq_context *ctx, kvq_buffer *src, uint64_t src_offset, kvq_dtype src_dtype,
                                    const int64_t src_strides[3], const kvq_tensor *t, const uint32_t start[3],
                                    const uint32_t shape[3], uint32_t checks);
/* Records the per-method range checks of `count` appended tokens of one side gathered on the device
 * (in `dtype` at byte `offset` of `tokens`), into the call's check word (KVQ_JOB_CHECK_RANGE). The
 * backend has check_tokens. */
kvq_status kvq_device_tokens_check(kvq_context *ctx, const kvq_side_desc *side, kvq_dtype dtype, kvq_buffer *tokens,
                                   uint64_t offset, uint32_t count);
/* Records a copy of `bytes` (a multiple of 4, offsets too) from src/src_offset to dst/dst_offset,
 * as a CONVERT of fp32 words with KVQ_JOB_CONVERT_IF_CLEAR: on the device, it writes nothing when
 * a check recorded earlier in the call failed (the context's check word is not zero). */
kvq_status kvq_device_copy_if_clear(kvq_context *ctx, kvq_buffer *dst, uint64_t dst_offset, kvq_buffer *src, uint64_t src_offset,
                                    uint64_t bytes);
/* The call's check word: read back (a wait) and turned into a status, KVQ_ERROR_NON_FINITE with a
 * message when a check failed; KVQ_OK when the call recorded none. */
kvq_status kvq_device_checks_read(kvq_context *ctx);

#endif
