// What the CUDA kernels of the unfused attention jobs share (score.cuh, softmax.cuh,
// weighted_sum.cuh): their parameters, the job's metadata (core/gpu_plan.h, read with
// core/gpu_attention.h's functions, the Vulkan shaders' too) and block reductions.
//
// The host side of every kernel here (the backend's, as backends/vulkan does it):
//   kvq_gpu_plan_attention(job, 0, &plan, ...)   the unfused plan (the fused one: flash.cuh)
//   kvq_gpu_pack_attention(job, &plan, words)    plan.meta_words 32-bit words, uploaded as they are;
//                                                `meta` below is their device address
//   kernel k is launched with plan.units[KVQ_PLAN_k] blocks (grid (units), or any grid (x, y) with
//   x * y >= units: a block's index is blockIdx.y * gridDim.x + blockIdx.x, those past the last unit
//   return), KVQ_CUDA_ATTENTION_THREADS (= KVQ_GPU_GROUP_SIZE, 64) threads per block (the unit
//   tables count 64 invocations per unit where a unit is a block of invocations), no dynamic shared
//   memory. No launch is needed where units is 0.
// Every kernel takes the job's constants by value (kvq_cuda_attention), then `meta`, then its buffers.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_ATTENTION_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_ATTENTION_CUH

#include "methods.cuh"

#define KVQ_META_PARAM const unsigned *meta,
#define KVQ_META_ARG meta,
#define KVQ_META(w) meta[(w)]
#include "core/gpu_attention.h"

#define KVQ_CUDA_ATTENTION_THREADS KVQ_GPU_GROUP_SIZE

// The constants of one attention job (backends/backend.h, kvq_job_attention).
struct kvq_cuda_attention {
  kvq_cuda_side side;    // SCORE: the keys' layout; WEIGHTED_SUM, ROTATE: the values'; SOFTMAX, ACCUMULATE: unused
  unsigned query_heads;  // job->query_heads (a multiple of side.kv_heads)
  unsigned alive_words;  // job->alive_words: kept-token mask words per page
  unsigned window_dtype; // job->window_dtype: KVQ_LAYOUT_F32, F16 or BF16 (the ring's elements)
  float scale;           // job->scale (SCORE)
};

// The block's index among the kernel's units (any 1-D or 2-D grid).
static inline __device__ unsigned kvq_cuda_workgroup() { return blockIdx.y * gridDim.x + blockIdx.x; }

// The kv head of query head h.
static inline __host__ __device__ unsigned kvq_cuda_kv_head(const kvq_cuda_attention &a, unsigned h) {
  return h / (a.query_heads / a.side.kv_heads);
}

// Sum and maximum over the block (KVQ_CUDA_ATTENTION_THREADS threads, every one calls; the result in
// every thread): the warps' butterflies, then the warps' partials in warp order through `part`
// (static shared memory of the caller's function, one float per warp). Barriers before and after,
// so that calls may follow one another with the same `part`.
#define KVQ_CUDA_BLOCK_WARPS (KVQ_CUDA_ATTENTION_THREADS / KVQ_WARP_SIZE)
static inline __device__ float kvq_cuda_block_sum(float v, float *part) {
  for (int o = KVQ_WARP_SIZE / 2; o > 0; o /= 2) v += __shfl_xor_sync(KVQ_FULL_MASK, v, o);
  __syncthreads(); // an earlier call's readers are done with part
  if (threadIdx.x % KVQ_WARP_SIZE == 0) part[threadIdx.x / KVQ_WARP_SIZE] = v;
  __syncthreads();
  float sum = part[0];
  for (unsigned w = 1; w < KVQ_CUDA_BLOCK_WARPS; w++) sum += part[w];
  return sum;
}
static inline __device__ float kvq_cuda_block_max(float v, float *part) {
  for (int o = KVQ_WARP_SIZE / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(KVQ_FULL_MASK, v, o));
  __syncthreads();
  if (threadIdx.x % KVQ_WARP_SIZE == 0) part[threadIdx.x / KVQ_WARP_SIZE] = v;
  __syncthreads();
  float m = part[0];
  for (unsigned w = 1; w < KVQ_CUDA_BLOCK_WARPS; w++) m = fmaxf(m, part[w]);
  return m;
}

// Channel c of kv head h of window slot t (t >= quantized) of sequence seq, from the ring in the
// window dtype (converted exactly, as the CPU converts it).
static inline __device__ float kvq_cuda_window_value(const kvq_cuda_attention &a, const unsigned *meta, const void *ring,
                                                     unsigned seq, unsigned t, unsigned h, unsigned c) {
  const kvq_io io_value = {nullptr, ring, a.window_dtype, nullptr, nullptr, nullptr};
  return kvq_cuda_in(&io_value, kvq_gpu_ring_element(meta, seq, t, a.side.kv_heads, a.side.head_dim, h, c));
}

// The byte offset in the pool of kv head h's block of the page holding quantized slot t of seq.
static inline __device__ unsigned kvq_cuda_slot_block(const kvq_cuda_attention &a, const unsigned *meta, unsigned seq,
                                                      unsigned t, unsigned h) {
  return (kvq_gpu_page_slot(meta, seq, t, a.side.page_size) * a.side.kv_heads + h) * a.side.head_bytes;
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_ATTENTION_CUH
