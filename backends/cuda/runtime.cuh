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
#define KVQ_CUDA_LAUNCH_CALL(kernel, grid, block, shared_bytes, stream, ...)                                        \
  ((kernel)<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__), cudaGetLastError())
// Words the runtime has for an error besides cudaGetErrorString's (none on the GPU).
static inline const char *kvq_cuda_error_detail(cudaError_t) { return ""; }

#else
#include "emu/cuda_runtime_emu.h"

#define KVQ_CUDA_EMULATED 1
// The emulator runs the grid before returning; its report (a divergent barrier, a deadlock, a bad
// configuration) becomes a sticky cudaErrorLaunchFailure with the emulator's message.
#define KVQ_CUDA_LAUNCH_CALL(kernel, grid, block, shared_bytes, stream, ...)                                        \
  ((void)(stream), kvq_cuda_emu_launched(kvq_emu::launch((kernel), (grid), (block), (shared_bytes), __VA_ARGS__)))
static inline const char *kvq_cuda_error_detail(cudaError_t e) {
  return e == cudaErrorLaunchFailure ? kvq_cuda_emu_last_launch_message() : "";
}
#endif

// Fault points (core/fault.h, docs/RELIABILITY.md "Fault injection"): in the fault-injection test build
// every runtime call of the host code that can fail, and every launch, first asks kvq_fault_point, and
// the armed one is skipped and returns the error the runtime would: out of memory for an allocation, a
// sticky launch failure (the device is lost) in the device-lost mode, an invalid value otherwise. The
// host code keeps CUDA's names: each becomes a wrapper defined here, before the name is redirected
// (the emulated runtime's names are macros already: they are replaced). In the shipped library they
// are the plain calls.
#ifdef KVQ_FAULT_INJECTION
#include "core/fault.h"
static inline cudaError_t kvq_cuda_fault_result(kvq_fault_kind kind) {
  if (kvq_fault_lost()) return cudaErrorLaunchFailure;
  return kind == KVQ_FAULT_DEVICE_ALLOC ? cudaErrorMemoryAllocation : cudaErrorInvalidValue;
}
#define KVQ_CUDA_FAULT(kind, call) (kvq_fault_point(kind) ? kvq_cuda_fault_result(kind) : (call))
namespace kvq_cuda_fault {
// Each calls the runtime through its name as it stands here (the emulator's macro, or CUDA's function).
#define KVQ_CUDA_FAULT_WRAPPER(wrapper, name, kind)                                                           \
  template <class... A> cudaError_t wrapper(A... a) { return KVQ_CUDA_FAULT(kind, name(a...)); }
KVQ_CUDA_FAULT_WRAPPER(malloc_, cudaMalloc, KVQ_FAULT_DEVICE_ALLOC)
KVQ_CUDA_FAULT_WRAPPER(memcpy_async, cudaMemcpyAsync, KVQ_FAULT_COPY)
KVQ_CUDA_FAULT_WRAPPER(memset_async, cudaMemsetAsync, KVQ_FAULT_COPY)
KVQ_CUDA_FAULT_WRAPPER(stream_synchronize, cudaStreamSynchronize, KVQ_FAULT_WAIT)
KVQ_CUDA_FAULT_WRAPPER(event_synchronize, cudaEventSynchronize, KVQ_FAULT_WAIT)
KVQ_CUDA_FAULT_WRAPPER(event_create, cudaEventCreate, KVQ_FAULT_OBJECT)
KVQ_CUDA_FAULT_WRAPPER(stream_create, cudaStreamCreateWithFlags, KVQ_FAULT_OBJECT)
KVQ_CUDA_FAULT_WRAPPER(event_record, cudaEventRecord, KVQ_FAULT_LAUNCH)
#undef KVQ_CUDA_FAULT_WRAPPER
} // namespace kvq_cuda_fault
#undef cudaMalloc
#undef cudaMemcpyAsync
#undef cudaMemsetAsync
#undef cudaStreamSynchronize
#undef cudaEventSynchronize
#undef cudaEventCreate
#undef cudaEventRecord
#undef cudaStreamCreateWithFlags
#define cudaMalloc kvq_cuda_fault::malloc_
#define cudaMemcpyAsync kvq_cuda_fault::memcpy_async
#define cudaMemsetAsync kvq_cuda_fault::memset_async
#define cudaStreamSynchronize kvq_cuda_fault::stream_synchronize
#define cudaEventSynchronize kvq_cuda_fault::event_synchronize
#define cudaEventCreate kvq_cuda_fault::event_create
#define cudaEventRecord kvq_cuda_fault::event_record
#define cudaStreamCreateWithFlags kvq_cuda_fault::stream_create
#define KVQ_CUDA_LAUNCH(...) KVQ_CUDA_FAULT(KVQ_FAULT_LAUNCH, KVQ_CUDA_LAUNCH_CALL(__VA_ARGS__))
// Host blocks: the C++ host code's std::calloc and vector reserves (C code's allocations are counted
// by core/fault_alloc.h).
#define KVQ_CUDA_HOST_ALLOC_FAILS() kvq_fault_point(KVQ_FAULT_HOST_ALLOC)
#else
#define KVQ_CUDA_LAUNCH(...) KVQ_CUDA_LAUNCH_CALL(__VA_ARGS__)
#define KVQ_CUDA_HOST_ALLOC_FAILS() false
#endif

#endif // KVQ_BACKENDS_CUDA_RUNTIME_CUH
