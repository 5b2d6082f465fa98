// The CUDA runtime as the CUDA backend's host code sees it, so that one source (cuda_backend.cu) builds
// two ways (docs/CUDA.md):
//   - by nvcc, against NVIDIA's CUDA runtime (cuda_runtime.h, libcudart): the real backend;
//   - by the host C++ compiler, against kvq's emulated runtime (emu/cuda_runtime_emu.h), whose kernel
//     launches run on the CPU through kvq's thread-model emulator: the emulated backend of the tests.
// Host code calls the runtime by CUDA's own names and launches kernels only through KVQ_CUDA_LAUNCH.
#ifndef KVQ_BACKENDS_CUDA_RUNTIME_CUH
#define KVQ_BACKENDS_CUDA_RUNTIME_CUH

#include "kernel_lang.cuh"

// The driver API's types only (CUcontext, CUresult): kvq never links libcuda; the two driver functions
// it calls for a runtime's CUcontext come from cudaGetDriverEntryPointByVersion (host/context.cuh).
#include <cuda.h>

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#define KVQ_CUDA_EMULATED 0
// kernel<<<grid, block, shared_bytes, stream>>>(args...), as an expression: the launch's own error
// (a bad configuration; a fault inside the kernel shows at a later synchronization, sticky).
#define KVQ_CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                                        \
  ((kernel)<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__), cudaGetLastError())
// Words the runtime has for an error besides cudaGetErrorString's (none on the GPU).
static inline const char *kvq_cuda_error_detail(cudaError_t) { return ""; }

#else
#include "emu/cuda_runtime_emu.h"

#define KVQ_CUDA_EMULATED 1
// The emulator runs the grid before returning; its report (a divergent barrier, a deadlock, a bad
// configuration) becomes a sticky cudaErrorLaunchFailure with the emulator's message.
#define KVQ_CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                                        \
  ((void)(stream), kvq_cuda_emu_launched(kvq_emu::launch((kernel), (grid), (block), (shared_bytes), __VA_ARGS__)))
static inline const char *kvq_cuda_error_detail(cudaError_t e) {
  return e == cudaErrorLaunchFailure ? kvq_cuda_emu_last_launch_message() : "";
}
#endif

#endif // KVQ_BACKENDS_CUDA_RUNTIME_CUH
