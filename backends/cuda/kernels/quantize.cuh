// QUANTIZE on the GPU: encode whole pages from full-precision tokens, every item of a job in one
// launch. The math is core/methods/*.h (the CPU reference's), so the pages are the CPU's byte for byte.
//
// Launch: grid (kv_heads, count), one block per kv head of one item (its head block), any block size
// (KVQ_CUDA_QUANTIZE_THREADS is the backend's), dynamic shared memory kvq_cuda_decode_shared_bytes (PolarQuant's token being encoded, then the decoded
// token for the errors).
// The block's threads, with a barrier between the steps (the Vulkan backend needs a dispatch each):
//   1. zero the head block (padding and tokens past the valid count stay zero; codes are ORed in);
//   2. QJL with outliers: the channels' squared norms over the valid tokens (a thread per channel),
//      then thread 0 chooses the page's outlier channels (a bit mask in shared memory, which every
//      unit reads) and stores their list;
//   3. encode every work unit of the head block (shaders/work_units.h), the threads striding over them;
//      PolarQuant a token at a time, the whole block on each (kvq_cuda_polar_encode: its rotated
//      token in the dynamic shared memory, not in per-thread arrays);
//   4. optionally the per-token quantization error ||x - x^||_2, x^ as DEQUANTIZE returns it, summed
//      in double in channel order as the CPU sums it.
// Item k (3 words at items + 3k): element index in src of its token 0, channel 0 (tokens are
// [token][kv head][head_dim] elements of input_dtype), byte offset of its page in the pool, valid tokens.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_QUANTIZE_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_QUANTIZE_CUH

#include "methods.cuh"

#define KVQ_CUDA_QUANTIZE_THREADS 128u
#define KVQ_CUDA_ITEM_WORDS 3u

__global__ void __launch_bounds__(KVQ_CUDA_QUANTIZE_THREADS)
    kvq_cuda_quantize(const kvq_cuda_side s, const unsigned *__restrict__ items, const void *__restrict__ src,
                      unsigned input_dtype, unsigned *__restrict__ pages, const float *__restrict__ fixed0,
                      const float *__restrict__ fixed1, float *__restrict__ errors) {
  KVQ_SHARED(float, norm2, KVQ_MAX_HEAD_DIM);
  KVQ_SHARED(unsigned, mask, KVQ_MAX_HEAD_DIM / 32u); // QJL: the page's outlier channels
  KVQ_DYNAMIC_SHARED(float, decoded); // [2][head_dim]: PolarQuant's token (step 3), rotated and final decode (step 4)
  const unsigned h = blockIdx.x, i = blockIdx.y, d = s.head_dim;
  const unsigned x = items[KVQ_CUDA_ITEM_WORDS * i] + h * d, n = items[KVQ_CUDA_ITEM_WORDS * i + 2u];
  const unsigned block = items[KVQ_CUDA_ITEM_WORDS * i + 1u] + h * s.head_bytes;
  const kvq_io io_value = {pages, src, input_dtype, fixed0, fixed1, nullptr};
  const kvq_io *io = &io_value;

  for (unsigned w = threadIdx.x; w < s.head_bytes / 4u; w += blockDim.x) pages[block / 4u + w] = 0u;
  for (unsigned w = threadIdx.x; w < KVQ_MAX_HEAD_DIM / 32u; w += blockDim.x) mask[w] = 0u;
  __syncthreads();
  if (s.method == KVQ_LAYOUT_POLAR) {
    kvq_cuda_polar_encode(io, s, block, h, n, x, decoded, decoded + d);
  } else {
    if (s.method == KVQ_LAYOUT_QJL && s.outliers > 0u) {
      for (unsigned c = threadIdx.x; c < d; c += blockDim.x) norm2[c] = kvq_qjl_channel_norm2(io, x, s.kv_heads * d, n, c);
      __syncthreads();
      if (threadIdx.x == 0) {
        kvq_qjl_choose_outliers(norm2, d, s.outliers, mask);
        kvq_qjl_put_outliers(io, block, mask, d, s.page_size, s.sketch_dim, s.outlier_sketch_dim, s.outliers);
      }
      __syncthreads();
    }
    const unsigned units = kvq_cuda_encode_units(s, n);
    for (unsigned u = threadIdx.x; u < units; u += blockDim.x) kvq_cuda_encode_unit(io, s, block, h, u, n, x, mask);
  }
  if (errors == nullptr) return; // the same for every thread of the block: no barrier is skipped by some
  __syncthreads();
  for (unsigned t = 0; t < n; t++) {
    kvq_cuda_decode_token(io, s, block, h, t, decoded, decoded + d);
    if (threadIdx.x == 0) {
      double sum = 0.0;
      for (unsigned c = 0; c < d; c++) {
        const double diff = static_cast<double>(kvq_cuda_in(io, x + t * s.kv_heads * d + c)) - decoded[d + c];
        sum += diff * diff;
      }
      errors[(i * s.page_size + t) * s.kv_heads + h] = static_cast<float>(sqrt(sum));
    }
    __syncthreads(); // decoded is rewritten by the next token
  }
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_QUANTIZE_CUH
