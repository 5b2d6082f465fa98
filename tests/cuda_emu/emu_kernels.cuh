// Kernels that exercise kvq's CUDA thread-model emulation (test_cuda_emu.cpp runs them on the CPU);
// the build also compiles them with nvcc for sm_80 (kernels_check.cu), so they are real CUDA.
#ifndef KVQ_TESTS_CUDA_EMU_KERNELS_CUH
#define KVQ_TESTS_CUDA_EMU_KERNELS_CUH

#include "backends/cuda/kernel_lang.cuh"

__device__ __forceinline__ float emu_warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(KVQ_FULL_MASK, v, offset);
  return v;
}

// out[b] = sum of in[b*n .. b*n+n) (static shared memory, warp shuffles, __syncthreads); *total gets
// every block's sum (atomicAdd on float), *absmax_bits the largest |x| (atomicMax on its bits).
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    emu_block_sum(const float *__restrict__ in, float *__restrict__ out, float *total, int *absmax_bits, int n) {
  KVQ_SHARED(float, partial, THREADS / 32);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const float *row = in + static_cast<size_t>(blockIdx.x) * n;
  float acc = 0.0f, amax = 0.0f;
  for (int i = tid; i < n; i += THREADS) {
    acc += row[i];
    amax = fmaxf(amax, fabsf(row[i]));
  }
  acc = emu_warp_sum(acc);
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    float v = lane < THREADS / 32 ? partial[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(KVQ_FULL_MASK, v, offset);
    if (lane == 0) {
      out[blockIdx.x] = v;
      atomicAdd(total, v);
    }
  }
  atomicMax(absmax_bits, __float_as_int(amax)); // non-negative floats order like their bits
}

// Each block reverses its blockDim.x*blockDim.y floats through dynamic shared memory (2-D blocks), and
// scales them with float4 loads from `scale` (one float4 per block).
__global__ void emu_reverse(const float *in, float *out, const float4 *scale) {
  KVQ_DYNAMIC_SHARED(float, buf);
  const unsigned n = blockDim.x * blockDim.y;
  const unsigned t = threadIdx.y * blockDim.x + threadIdx.x;
  const float4 s = scale[blockIdx.x];
  buf[t] = in[blockIdx.x * n + t] * (s.x + s.y + s.z + s.w);
  __syncthreads();
  out[blockIdx.x * n + t] = buf[n - 1 - t];
}

// Every thread adds to the counters with each kind of atomic.
struct emu_counters {
  float f;
  double d;
  int i;
  unsigned u;
  unsigned long long ull;
  int imax, imin;
  unsigned umax, umin;
  unsigned bits_or, bits_and;
  int cas_count;
  int exch;
};
__global__ void emu_atomics(emu_counters *c) {
  const unsigned g = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&c->f, 0.5f);
  atomicAdd(&c->d, 0.25);
  atomicAdd(&c->i, 2);
  atomicAdd(&c->u, 3u);
  atomicAdd(&c->ull, 1ull << 33);
  atomicMax(&c->imax, static_cast<int>(g) - 100);
  atomicMin(&c->imin, static_cast<int>(g) - 100);
  atomicMax(&c->umax, g * 7u);
  atomicMin(&c->umin, g + 5u);
  atomicOr(&c->bits_or, 1u << (g % 32));
  atomicAnd(&c->bits_and, ~(1u << (g % 16)));
  int old = atomicAdd(&c->cas_count, 0), seen; // an atomic read: a plain one would race
  while ((seen = atomicCAS(&c->cas_count, old, old + 1)) != old) old = seen;
  atomicExch(&c->exch, 42);
}

// Votes and shuffles: full-warp votes, two half warps voting with disjoint masks at the same time, a
// prefix sum with __shfl_up_sync, a broadcast inside groups of 8 lanes, __syncwarp, shuffles of half2 and
// bf16. One warp per block, 9 rows of 32 results each.
__global__ void emu_warp_ops(unsigned *out) {
  const unsigned lane = threadIdx.x & 31;
  unsigned *o = out + blockIdx.x * 9 * 32;
  o[lane] = __ballot_sync(KVQ_FULL_MASK, lane % 3 == 0);
  o[32 + lane] = static_cast<unsigned>(__any_sync(KVQ_FULL_MASK, lane == 5)) | static_cast<unsigned>(__any_sync(KVQ_FULL_MASK, lane > 40)) << 1 |
                 static_cast<unsigned>(__all_sync(KVQ_FULL_MASK, lane < 32)) << 2 |
                 static_cast<unsigned>(__all_sync(KVQ_FULL_MASK, lane < 31)) << 3;
  const unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  o[64 + lane] = __ballot_sync(half, lane & 1);
  unsigned v = lane + 1;
  for (unsigned d = 1; d < 32; d <<= 1) {
    const unsigned up = __shfl_up_sync(KVQ_FULL_MASK, v, d);
    if (lane >= d) v += up;
  }
  o[96 + lane] = v; // (lane + 1)(lane + 2) / 2
  o[128 + lane] = __shfl_sync(KVQ_FULL_MASK, lane * 10, 3, 8); // lane 3 of each group of 8
  o[160 + lane] = __shfl_xor_sync(KVQ_FULL_MASK, lane, 4, 4);  // an earlier group: read; a later one: own value
  KVQ_SHARED(unsigned, slot, 32);
  slot[lane] = lane * lane;
  __syncwarp();
  o[192 + lane] = slot[31 - lane];
  o[224 + lane] = static_cast<unsigned>(__shfl_down_sync(KVQ_FULL_MASK, static_cast<double>(lane) * 0.5, 1) * 4.0);
  const __half2 got = __shfl_xor_sync(KVQ_FULL_MASK, __floats2half2_rn(static_cast<float>(lane), 0.5f), 1);
  const __nv_bfloat16 bf = __shfl_sync(KVQ_FULL_MASK, __float2bfloat16_rn(static_cast<float>(lane) + 0.5f), 7);
  o[256 + lane] = static_cast<unsigned>(__low2float(got) + __high2float(got) * 2.0f) * 1000u + static_cast<unsigned>(__bfloat162float(bf) * 2.0f);
}

// Half and bf16 through NVIDIA's own conversions (on the host: cuda_fp16.hpp / cuda_bf16.hpp).
__global__ void emu_half(const float *in, unsigned short *h, unsigned short *bf, float *back, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const __half x = __float2half_rn(in[i]);
  const __nv_bfloat16 y = __float2bfloat16_rn(in[i]);
  h[i] = __half_as_ushort(x);
  bf[i] = __bfloat16_as_ushort(y);
  back[i] = __half2float(__hadd(x, x)) + __bfloat162float(y);
}

#endif // KVQ_TESTS_CUDA_EMU_KERNELS_CUH
