// The language of kvq's CUDA kernels: what a kernel .cuh includes so that nvcc compiles it for the GPU
// and a host C++17 compiler compiles it against kvq's CUDA thread-model emulation (emu/cuda_emu.h), for
// tests without a GPU (docs/CUDA.md, "Testing CUDA kernels without a GPU").
//
// Rules for a kernel .cuh:
//   - shared memory only through these macros, never a plain __shared__ (which the emulator refuses):
//       KVQ_SHARED(type, name, count);            // __shared__ type name[count];
//       KVQ_SHARED_2D(type, name, rows, cols);    // __shared__ type name[rows][cols];
//       KVQ_DYNAMIC_SHARED(type, name);           // extern __shared__ type name[]; (16-byte aligned)
//     `type` is one type name (a typedef for anything longer), `name` an identifier unique in its function;
//   - barriers and warp operations as CUDA spells them (__syncthreads, __syncwarp, __shfl*_sync,
//     __ballot_sync, __any_sync, __all_sync), with masks that name exactly the lanes that call them;
//   - inline PTX (asm) only under `#if defined(__CUDA_ARCH__)`, with a plain C++ fallback after `#else`
//     that the emulator runs;
//   - half and bf16 from cuda_fp16.h / cuda_bf16.h (included here, on both sides);
//   - host-visible helpers `__host__ __device__`, kernels `__global__`, nothing that needs the CUDA runtime.
#ifndef KVQ_BACKENDS_CUDA_KERNEL_LANG_CUH
#define KVQ_BACKENDS_CUDA_KERNEL_LANG_CUH

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define KVQ_SHARED(type, name, count) __shared__ type name[count]
#define KVQ_SHARED_2D(type, name, rows, cols) __shared__ type name[rows][cols]
#define KVQ_DYNAMIC_SHARED(type, name)                                                                           \
  extern __shared__ __align__(16) unsigned char kvq_dynamic_shared_bytes[];                                      \
  type *const name = reinterpret_cast<type *>(kvq_dynamic_shared_bytes)
#else
#include "emu/cuda_emu.h"
#define KVQ_SHARED(type, name, count) KVQ_CUDA_EMU_SHARED(type, name, count)
#define KVQ_SHARED_2D(type, name, rows, cols) KVQ_CUDA_EMU_SHARED_2D(type, name, rows, cols)
#define KVQ_DYNAMIC_SHARED(type, name) KVQ_CUDA_EMU_DYNAMIC_SHARED(type, name)
#endif

// Before a loop of constant trip count whose per-thread arrays must stay in registers (indexed by
// constants once unrolled): nvcc's unroll pragma; nothing for the emulator's host compiler.
// KVQ_UNROLL_BY_8: before a loop of runtime trip count whose iterations' loads are independent, so
// that eight iterations' loads are in flight at once (a latency-bound loop over memory).
#if defined(__CUDACC__)
#define KVQ_UNROLL _Pragma("unroll")
#define KVQ_UNROLL_BY_8 _Pragma("unroll 8")
#else
#define KVQ_UNROLL
#define KVQ_UNROLL_BY_8
#endif

#define KVQ_FULL_MASK 0xffffffffu
#define KVQ_WARP_SIZE 32

#endif // KVQ_BACKENDS_CUDA_KERNEL_LANG_CUH
