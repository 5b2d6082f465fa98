// TOKEN_CHECK on the GPU (backends/backend.h, kvq_job_token_check): the per-method range checks of
// appended keys or values that an append gathered on the device (CONVERT checked them finite), with
// the decisions of core/methods/range.h, which the host checks (core/token_check.c) and the Vulkan
// shader (shaders/token_check.comp) make too, each fp32 operation rounded on its own and the norms'
// square root correctly rounded (kvq_sqrt: __fsqrt_rn), so the GPU decides as the CPU does.
//
// Parameters: the side (`s`: method, head_dim, dtype, group, bits are read), the tokens (`in`: the
// first element of the vectors, `in_dtype` KVQ_LAYOUT_F32 / F16 / BF16), `count` vectors of
// s.head_dim elements each, packed ([token][kv head][channel]: vector v at element v * head_dim,
// computed in 32 bits: the host checks count * head_dim < 2^32), and `flag`, the flag word: a vector
// the method cannot store sets KVQ_CUDA_CHECK_RANGE (= KVQ_JOB_CHECK_RANGE) in it with atomicOr.
// Nothing else is written.
//
// Launch: grid (ceil(count / threads)), block (threads: KVQ_CUDA_TOKEN_CHECK_THREADS on the GPU, any
// number up to it), no shared memory; thread v = blockIdx.x * blockDim.x + threadIdx.x checks vector v, threads past the
// count do nothing.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_TOKEN_CHECK_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_TOKEN_CHECK_CUH

#include "backends/cuda/kernels/methods.cuh"

#include "core/methods/range.h"

#define KVQ_CUDA_TOKEN_CHECK_THREADS 128u
#define KVQ_CUDA_CHECK_RANGE 32u

__global__ void __launch_bounds__(KVQ_CUDA_TOKEN_CHECK_THREADS)
    kvq_cuda_token_check(kvq_cuda_side s, const void *in, unsigned in_dtype, unsigned count, unsigned *flag) {
  const unsigned long long v = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= count) return;
  const kvq_io io_value = {nullptr, in, in_dtype, nullptr, nullptr, nullptr};
  const kvq_io *io = &io_value;
  if (kvq_range_vector_fails(io, static_cast<unsigned>(v) * s.head_dim, s.method, s.head_dim, s.dtype, s.group, s.bits) != 0u)
    atomicOr(flag, KVQ_CUDA_CHECK_RANGE);
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_TOKEN_CHECK_CUH
