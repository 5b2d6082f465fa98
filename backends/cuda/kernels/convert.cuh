// CONVERT on the GPU (backends/backend.h, kvq_job_convert): one strided rank-3 tensor copied to
// another of the same shape, converting dtype, with checks into a 32-bit flag word. The same
// decisions as the Vulkan shader (shaders/tensor_convert.comp) and the same conversions as every
// backend (core/halfconv.h: fp32 to fp16 / bf16 rounding half to even, fp16 and bf16 widened
// exactly, equal dtypes copying the bits, NaN payloads included), so the results are bit-identical.
//
// Element e = (i0 * shape1 + i1) * shape2 + i2 (i2 fastest) is read at src_offset + i0 src_strides[0]
// + i1 src_strides[1] + i2 src_strides[2] and written at the same expression of dst, in elements of
// the tensor's dtype, computed in 32-bit unsigned arithmetic (offsets and strides passed as uint32:
// a negative int64 stride as its two's complement), which is the true index when every element
// of both tensors lies below 2^32 and shape0 * shape1 * shape2 < 2^32 (the host refuses the rest,
// KVQ_ERROR_UNSUPPORTED, as backend.h says). Dtypes are KVQ_LAYOUT_F32 / F16 / BF16 (core/layout.h,
// the same numbers as kvq_dtype). Per element, with x the source value as fp32:
//   out = the source bits (equal dtypes), else x converted to the destination dtype;
//   FINITE (checks & 1): x non-finite: flag |= 1 (atomicOr), out = 0 (+0 of the dtype);
//   FITS (checks & 2):   x non-finite, or out an fp16 / bf16 infinity or NaN (the dtype rounded x to
//                        infinity): flag |= 2 (atomicOr), except for x = -infinity with MASKED
//                        (checks & 16: the masked logits of kvq_scores pass);
//   NO_WRITE (checks & 4): nothing is written; else out is stored (a 16-bit store for fp16 / bf16:
//                        the other half of a 32-bit word, a gap or a neighbour, is not touched).
//   IF_CLEAR (checks & 8): thread 0 of each block reads the flag word (atomically) before the block
//                        does anything; when it is not 0 the block writes nothing (and checks
//                        nothing). kvq's core uses IF_CLEAR without other checks, after a job that
//                        checked (core/attention.c); combined with checks in the same job, which
//                        blocks see the bits of that same job is unspecified (as in the Vulkan shader).
// Destination elements the shape does not reach are never touched. `flag` points at the flag word
// (the flags buffer plus flag_offset bytes); it may be null only when checks is 0.
//
// Launch: grid (ceil(shape0 * shape1 * shape2 / KVQ_CUDA_CONVERT_THREADS)), block
// (KVQ_CUDA_CONVERT_THREADS), no dynamic shared memory (4 bytes static). Thread e = blockIdx.x *
// blockDim.x + threadIdx.x takes element e; threads past the count do nothing. Writes the destination
// elements and the flag word's bits 1 and 2 (atomicOr), nothing else.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_CONVERT_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_CONVERT_CUH

#include "backends/cuda/kernel_lang.cuh"

#include "core/halfconv.h"
#include "core/layout.h"

#define KVQ_CUDA_CONVERT_THREADS 256u
#define KVQ_CUDA_CONVERT_FINITE 1u
#define KVQ_CUDA_CONVERT_FITS 2u
#define KVQ_CUDA_CONVERT_NO_WRITE 4u
#define KVQ_CUDA_CONVERT_IF_CLEAR 8u
#define KVQ_CUDA_CONVERT_MASKED 16u

// One strided rank-3 tensor place: the buffer's first element, its dtype, offset and strides in elements.
struct kvq_cuda_place {
  void *base;
  unsigned dtype;
  unsigned offset;
  unsigned strides[3];
};

static inline __host__ __device__ unsigned kvq_cuda_place_index(const kvq_cuda_place &p, unsigned i0, unsigned i1, unsigned i2) {
  return p.offset + i0 * p.strides[0] + i1 * p.strides[1] + i2 * p.strides[2]; // modulo 2^32 (see above)
}

__global__ void __launch_bounds__(KVQ_CUDA_CONVERT_THREADS)
    kvq_cuda_convert(unsigned shape0, unsigned shape1, unsigned shape2, kvq_cuda_place src, kvq_cuda_place dst, unsigned checks,
                     unsigned *flag) {
  KVQ_SHARED(unsigned, clear, 1);
  if ((checks & KVQ_CUDA_CONVERT_IF_CLEAR) != 0u) {
    if (threadIdx.x == 0) clear[0] = atomicOr(flag, 0u) == 0u ? 1u : 0u; // read as a dispatch recorded earlier left it
    __syncthreads();
    if (!clear[0]) return;
  }
  const unsigned long long e = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= static_cast<unsigned long long>(shape0) * shape1 * shape2) return;
  const unsigned i2 = static_cast<unsigned>(e % shape2), i1 = static_cast<unsigned>(e / shape2 % shape1),
                 i0 = static_cast<unsigned>(e / shape2 / shape1);
  const unsigned se = kvq_cuda_place_index(src, i0, i1, i2), de = kvq_cuda_place_index(dst, i0, i1, i2);
  const unsigned bits = src.dtype == KVQ_LAYOUT_F32 ? static_cast<const unsigned *>(src.base)[se]
                                                    : static_cast<const unsigned short *>(src.base)[se];
  const float x = src.dtype == KVQ_LAYOUT_F32   ? kvq_bits_to_f32(bits)
                  : src.dtype == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32(bits)
                                                : kvq_bf16_bits_to_f32(bits);
  const bool finite = (kvq_f32_to_bits(x) & 0x7f800000u) != 0x7f800000u;
  unsigned out = bits;
  if (dst.dtype != src.dtype)
    out = dst.dtype == KVQ_LAYOUT_F32   ? kvq_f32_to_bits(x)
          : dst.dtype == KVQ_LAYOUT_F16 ? kvq_f32_to_f16_bits(x)
                                        : kvq_f32_to_bf16_bits(x);
  if ((checks & KVQ_CUDA_CONVERT_FINITE) != 0u && !finite) {
    atomicOr(flag, KVQ_CUDA_CONVERT_FINITE);
    out = 0u;
  }
  if ((checks & KVQ_CUDA_CONVERT_FITS) != 0u) {
    const bool overflows = dst.dtype == KVQ_LAYOUT_F16    ? (out & 0x7c00u) == 0x7c00u
                           : dst.dtype == KVQ_LAYOUT_BF16 ? (out & 0x7f80u) == 0x7f80u
                                                          : false;
    const bool masked = (checks & KVQ_CUDA_CONVERT_MASKED) != 0u && x == -INFINITY; // a masked logit (kvq_scores)
    if ((!finite || overflows) && !masked) atomicOr(flag, KVQ_CUDA_CONVERT_FITS);
  }
  if ((checks & KVQ_CUDA_CONVERT_NO_WRITE) != 0u) return;
  if (dst.dtype == KVQ_LAYOUT_F32) static_cast<unsigned *>(dst.base)[de] = out;
  else static_cast<unsigned short *>(dst.base)[de] = static_cast<unsigned short>(out);
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_CONVERT_CUH
