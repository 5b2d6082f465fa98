// Kernels with planted bugs; each must be caught on the CPU: by the emulator itself (divergent
// barriers and warp operations, bad masks, a timeout), by ThreadSanitizer (a missing barrier) or by
// AddressSanitizer (an index past shared memory or a per-thread array). The build compiles them with nvcc too.
#ifndef KVQ_TESTS_CUDA_EMU_BUGS_CUH
#define KVQ_TESTS_CUDA_EMU_BUGS_CUH

#include "backends/cuda/kernel_lang.cuh"

// Bug: no __syncthreads between the write and the read of another thread's slot.
__global__ void bug_missing_sync(const float *in, float *out) {
  KVQ_SHARED(float, s, 128);
  s[threadIdx.x] = in[threadIdx.x];
  out[threadIdx.x] = s[127 - threadIdx.x];
}
// Bug: as bug_missing_sync, in the last block of the grid only (the blocks before it are correct), so
// that the race is reported after the block's fibers have run many blocks before it.
__global__ void bug_missing_sync_last_block(const float *in, float *out) {
  KVQ_SHARED(float, s, 128);
  s[threadIdx.x] = in[threadIdx.x];
  if (blockIdx.x + 1 != gridDim.x) __syncthreads(); // the same in every thread of a block
  out[threadIdx.x] = s[127 - threadIdx.x];
}
// Bug: a shuffle instead of __syncwarp between the write and the read: shuffles exchange registers but
// do not order memory (on Volta and later the lanes of a warp need not run in step).
__global__ void bug_shuffle_as_barrier(float *out) {
  KVQ_SHARED(float, s, 32);
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  const float v = __shfl_xor_sync(KVQ_FULL_MASK, 1.0f, 1);
  out[threadIdx.x] = s[31 - threadIdx.x] + v;
}
// Bug: an index one past the end of shared memory.
__global__ void bug_shared_overflow(const float *in, float *out) {
  KVQ_SHARED(float, s, 128);
  s[threadIdx.x + 1] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}
// Bug: the same, in dynamic shared memory.
__global__ void bug_dynamic_overflow(float *out) {
  KVQ_DYNAMIC_SHARED(float, s);
  s[threadIdx.x + 1] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}
// Bug: an index one past a per-thread array, after a barrier (so that, with fibers, the thread has
// been switched away and back: AddressSanitizer must still know its stack).
__global__ void bug_local_overflow(const float *in, float *out, int n) {
  float local[8];
  for (int i = 0; i < 8; ++i) local[i] = in[i];
  __syncthreads();
  float sum = 0.0f;
  for (int i = 0; i <= n; ++i) sum += local[i];
  out[threadIdx.x] = sum;
}
// Bug: a full-mask shuffle called by half of the warp.
__global__ void bug_half_warp_shuffle(float *out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(KVQ_FULL_MASK, v, 1);
  out[threadIdx.x] = v;
}
// Bug: a return before a barrier.
__global__ void bug_return_before_barrier(float *out, int n) {
  if (static_cast<int>(threadIdx.x) >= n) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}
// Bug: the two halves of the block wait at different barriers.
__global__ void bug_different_barriers(float *out) {
  if (threadIdx.x < 32) {
    __syncthreads();
    out[threadIdx.x] = 1.0f;
  } else {
    __syncthreads();
    out[threadIdx.x] = 2.0f;
  }
}
// Bug: the mask leaves out the lanes that call.
__global__ void bug_lane_not_in_mask(unsigned *out) { out[threadIdx.x] = __ballot_sync(0x0000ffffu, 1); }
// Bug: the two halves of a warp call with different masks that overlap.
__global__ void bug_mask_mismatch(unsigned *out) {
  const unsigned mask = threadIdx.x < 16 ? 0x0000ffffu : KVQ_FULL_MASK;
  out[threadIdx.x] = __shfl_sync(mask, threadIdx.x, 0);
}
// Bug: lanes read a lane that the mask does not name.
__global__ void bug_read_outside_mask(unsigned *out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, threadIdx.x, 8);
}
// Bug: one thread comes to the barrier far later than the others (a stand-in for one that never does).
__global__ void bug_late_thread(float *out, int sleeps) {
  if (threadIdx.x == 0)
    for (int i = 0; i < sleeps; ++i) __nanosleep(1000000);
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

#endif // KVQ_TESTS_CUDA_EMU_BUGS_CUH
