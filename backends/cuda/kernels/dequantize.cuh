// DEQUANTIZE on the GPU: decode whole pages to fp32, every page of a job in one launch:
// page slots[i] of the pool -> out[((i * page_size + t) * kv_heads + h) * head_dim + c], every token of
// the page (those past its valid count decode from the zero padding, as on the CPU).
//
// Launch: grid (kv_heads, count), one block per kv head of one page, any block size, dynamic shared
// memory kvq_cuda_decode_shared_bytes. The block decodes the page's tokens one after another,
// its threads sharing the channels (kvq_cuda_decode_token, methods.cuh). The math is core/methods/*.h.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_DEQUANTIZE_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_DEQUANTIZE_CUH

#include "methods.cuh"

#define KVQ_CUDA_DEQUANTIZE_THREADS 128u

__global__ void __launch_bounds__(KVQ_CUDA_DEQUANTIZE_THREADS)
    kvq_cuda_dequantize(const kvq_cuda_side s, const unsigned *__restrict__ slots, const unsigned *__restrict__ pages,
                        const float *__restrict__ fixed0, const float *__restrict__ fixed1, float *__restrict__ out) {
  KVQ_DYNAMIC_SHARED(float, decoded); // [2][head_dim]: rotated and final decode
  const unsigned h = blockIdx.x, i = blockIdx.y, d = s.head_dim, P = s.page_size;
  const unsigned block = (slots[i] * s.kv_heads + h) * s.head_bytes;
  // decoding only reads the pool: the cast lets the one kvq_io serve (as the CPU's cpu_io.h does)
  const kvq_io io_value = {const_cast<unsigned *>(pages), nullptr, KVQ_LAYOUT_F32, fixed0, fixed1, nullptr};
  const kvq_io *io = &io_value;
  for (unsigned t = 0; t < P; t++) {
    kvq_cuda_decode_token(io, s, block, h, t, decoded, decoded + d);
    for (unsigned c = threadIdx.x; c < d; c += blockDim.x) out[((i * P + t) * s.kv_heads + h) * d + c] = decoded[d + c];
    __syncthreads(); // decoded is rewritten by the next token
  }
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_DEQUANTIZE_CUH
