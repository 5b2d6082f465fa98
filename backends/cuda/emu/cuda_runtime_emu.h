// A tiny emulation of the part of the CUDA runtime API that kvq's CUDA backend calls, so that the
// backend's host code (backends/cuda/cuda_backend.cu), compiled by the host C++ compiler, runs its
// kernels on the CPU through kvq's thread-model emulator (cuda_emu.h). A test facility only
// (docs/CUDA.md, "The emulated backend"): there is no GPU behind it.
//
//   - device memory is host heap memory (operator new, so AddressSanitizer sees every access past it);
//     with the events, it is listed so that cudaDeviceReset frees what a context still holds, as
//     CUDA's does (below, "Device objects");
//   - there is one device; streams are tokens: every operation completes before it returns, in the
//     caller's order, which is one valid schedule of CUDA's in-order streams;
//   - events hold the host's steady clock at cudaEventRecord: since the work enqueued before a record
//     is done by then, cudaEventElapsedTime between two records is the host time the emulated work
//     between them took (on the CPU: no GPU time is measured here);
//   - the driver's context stack is a per-thread stack of CUcontext values that the stand-ins of
//     cuCtxPushCurrent / cuCtxPopCurrent (handed out by cudaGetDriverEntryPointByVersion) push and
//     pop; cudaSetDevice makes the primary context (a null entry) current in place of the top, as
//     CUDA does; every runtime call notes whether a caller's context was current (the counts of
//     kvq_cuda_emu_contexts, for the tests);
//   - a kernel launch is kvq_emu::launch; a failure it reports (a divergent barrier, a deadlock, a
//     bad launch configuration) becomes cudaErrorLaunchFailure, sticky as on a GPU, and its message is
//     kept for cudaGetErrorString's caller (kvq_cuda_emu_last_launch_message).
// The types and error codes are NVIDIA's own (driver_types.h, host-compilable); the functions carry
// CUDA's names in a namespace of kvq's (macros point the calls there), so that they never meet libcudart's.
#ifndef KVQ_BACKENDS_CUDA_EMU_CUDA_RUNTIME_EMU_H
#define KVQ_BACKENDS_CUDA_EMU_CUDA_RUNTIME_EMU_H

#include "cuda_emu.h"

#include <driver_types.h>

#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include <unistd.h>

namespace kvq_cuda_emu_rt {
// The sticky error of the emulated device (a failed launch), and the emulator's words for it.
inline thread_local cudaError_t sticky = cudaSuccess;
inline thread_local cudaError_t last = cudaSuccess;
inline thread_local std::string launch_message;

inline cudaError_t note(cudaError_t e) {
  if (e != cudaSuccess) last = e;
  return e;
}
// The driver's context stack of this thread (null: the primary context, made current by cudaSetDevice),
// and what the tests read of it (kvq_cuda_emu_contexts).
inline thread_local std::vector<CUcontext> context_stack;
inline thread_local unsigned long long context_pushes, context_pops, calls_in_context, calls_outside_context;
inline thread_local CUcontext context_last_pushed;

// Every call after a failed launch fails as on the GPU: the context is unusable. Each call notes
// whether a context of the caller's (a non-null top of the stack) was current.
inline cudaError_t enter() {
  if (!context_stack.empty() && context_stack.back()) calls_in_context++;
  else calls_outside_context++;
  return sticky;
}

// Device objects: the device memory and events that exist now, so that cudaDeviceReset can free them
// as CUDA's frees a context's (a runtime's recovery from a lost device: the CUDA backend keeps a lost
// device's memory, backends/cuda/host/memory.cuh) and the tests can count them
// (kvq_cuda_emu_device_objects). The addresses are kept masked: LeakSanitizer must not take the list
// for a reference, so that memory nobody frees or resets is still reported as leaked at exit.
// Shared by every thread (contexts on several threads), hence the lock.
struct object_list {
  std::mutex lock;
  std::unordered_map<std::uintptr_t, bool> live; // masked address -> is an event
};
inline object_list &objects() {
  static object_list list;
  return list;
}
constexpr std::uintptr_t address_mask = static_cast<std::uintptr_t>(0xa5a5a5a5a5a5a5a5ull);
inline void object_made(void *p, bool is_event) {
  std::lock_guard<std::mutex> hold(objects().lock);
  objects().live[reinterpret_cast<std::uintptr_t>(p) ^ address_mask] = is_event;
}
inline void object_gone(void *p) {
  std::lock_guard<std::mutex> hold(objects().lock);
  objects().live.erase(reinterpret_cast<std::uintptr_t>(p) ^ address_mask);
}
} // namespace kvq_cuda_emu_rt

// What the last failed launch of this thread reported, or "" (the backend adds it to its message).
static inline const char *kvq_cuda_emu_last_launch_message() { return kvq_cuda_emu_rt::launch_message.c_str(); }

// The result of kvq_emu::launch as the runtime's error code (KVQ_CUDA_LAUNCH, backends/cuda/runtime.cuh).
static inline cudaError_t kvq_cuda_emu_launched(const kvq_emu::Result &r) {
  if (r.ok) return cudaSuccess;
  kvq_cuda_emu_rt::launch_message = r.message;
  kvq_cuda_emu_rt::sticky = cudaErrorLaunchFailure;
  return kvq_cuda_emu_rt::note(cudaErrorLaunchFailure);
}

// The functions, in kvq's namespace: NVIDIA's headers (pulled in by cuda_fp16.h) declare CUDA's own
// with external linkage, and the emulated backend must never call those (libcudart may be linked into
// the same libkvq for the real backend). The macros below send the backend's calls here.
namespace kvq_cuda_emu_rt {
inline const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  default: return "unknown error";
  }
}
inline const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  default: return "cudaErrorUnknown";
  }
}
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = kvq_cuda_emu_rt::last;
  kvq_cuda_emu_rt::last = kvq_cuda_emu_rt::sticky;
  return e;
}

inline cudaError_t cudaGetDeviceCount(int *count) {
  *count = 1;
  return cudaSuccess;
}
// As CUDA's: the device's primary context becomes current, in place of a context the caller pushed.
inline cudaError_t cudaSetDevice(int device) {
  if (device != 0) return kvq_cuda_emu_rt::note(cudaErrorInvalidDevice);
  if (!kvq_cuda_emu_rt::context_stack.empty()) kvq_cuda_emu_rt::context_stack.back() = nullptr;
  return kvq_cuda_emu_rt::note(kvq_cuda_emu_rt::enter());
}
// The current context's device: there is one.
inline cudaError_t cudaGetDevice(int *device) {
  *device = 0;
  return kvq_cuda_emu_rt::note(kvq_cuda_emu_rt::enter());
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
  if (device != 0) return kvq_cuda_emu_rt::note(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "kvq CUDA emulator on the CPU (tests only, not a GPU)");
  // its device memory is the host's (cudaMalloc below)
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  prop->totalGlobalMem = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  return cudaSuccess;
}

inline cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = nullptr;
  if (const cudaError_t e = kvq_cuda_emu_rt::enter()) return kvq_cuda_emu_rt::note(e);
  *p = ::operator new(bytes ? bytes : 1, std::nothrow);
  if (*p) object_made(*p, false);
  return *p ? cudaSuccess : kvq_cuda_emu_rt::note(cudaErrorMemoryAllocation);
}
inline cudaError_t cudaFree(void *p) {
  if (p) object_gone(p);
  ::operator delete(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  if (const cudaError_t e = kvq_cuda_emu_rt::enter()) return kvq_cuda_emu_rt::note(e);
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t) {
  if (const cudaError_t e = kvq_cuda_emu_rt::enter()) return kvq_cuda_emu_rt::note(e);
  if (bytes) std::memset(dst, value, bytes);
  return cudaSuccess;
}

// Every pointer is "device memory" of device 0 here: the emulated device's memory is the host heap,
// and a test hands host pointers in as CUDA device pointers.
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attributes, const void *p) {
  std::memset(attributes, 0, sizeof *attributes);
  attributes->type = cudaMemoryTypeDevice;
  attributes->device = 0;
  attributes->devicePointer = const_cast<void *>(p);
  return kvq_cuda_emu_rt::note(kvq_cuda_emu_rt::enter());
}

// Streams: a distinct non-null token per stream kvq creates (the work is done by then anyway).
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned) {
  static char token;
  *stream = reinterpret_cast<cudaStream_t>(&token);
  return kvq_cuda_emu_rt::note(kvq_cuda_emu_rt::enter());
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return kvq_cuda_emu_rt::note(kvq_cuda_emu_rt::enter()); }

// The stand-ins of the driver's cuCtxPushCurrent and cuCtxPopCurrent (CUDA's errors for a null
// context and an empty stack), and the runtime's way to them.
inline CUresult CUDAAPI ctx_push(CUcontext c) {
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  context_stack.push_back(c);
  context_pushes++;
  context_last_pushed = c;
  return CUDA_SUCCESS;
}
inline CUresult CUDAAPI ctx_pop(CUcontext *out) {
  if (context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (out) *out = context_stack.back();
  context_stack.pop_back();
  context_pops++;
  return CUDA_SUCCESS;
}
inline cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version, unsigned long long,
                                                    cudaDriverEntryPointQueryResult *status) {
  *fn = nullptr;
  if (std::strcmp(symbol, "cuCtxPushCurrent") == 0 && version >= 4000u) *fn = reinterpret_cast<void *>(&ctx_push);
  if (std::strcmp(symbol, "cuCtxPopCurrent") == 0 && version >= 4000u) *fn = reinterpret_cast<void *>(&ctx_pop);
  if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

// Events: the host's steady clock when recorded (the work before them is done when they are).
struct event {
  std::chrono::steady_clock::time_point at;
  bool recorded;
};
inline event *event_of(cudaEvent_t e) { return reinterpret_cast<event *>(e); }
inline cudaError_t cudaEventCreate(cudaEvent_t *e) {
  *e = nullptr;
  if (const cudaError_t err = kvq_cuda_emu_rt::enter()) return kvq_cuda_emu_rt::note(err);
  event *p = new (std::nothrow) event{};
  if (!p) return kvq_cuda_emu_rt::note(cudaErrorMemoryAllocation);
  object_made(p, true);
  *e = reinterpret_cast<cudaEvent_t>(p);
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return kvq_cuda_emu_rt::note(cudaErrorInvalidResourceHandle);
  object_gone(e);
  delete event_of(e);
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (const cudaError_t err = kvq_cuda_emu_rt::enter()) return kvq_cuda_emu_rt::note(err);
  if (!e) return kvq_cuda_emu_rt::note(cudaErrorInvalidResourceHandle);
  event_of(e)->at = std::chrono::steady_clock::now();
  event_of(e)->recorded = true;
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return kvq_cuda_emu_rt::note(cudaErrorInvalidResourceHandle);
  return kvq_cuda_emu_rt::note(kvq_cuda_emu_rt::enter());
}
// As CUDA: milliseconds from start to end; an event never recorded is cudaErrorInvalidResourceHandle.
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (const cudaError_t err = kvq_cuda_emu_rt::enter()) return kvq_cuda_emu_rt::note(err);
  if (!start || !end || !event_of(start)->recorded || !event_of(end)->recorded)
    return kvq_cuda_emu_rt::note(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(event_of(end)->at - event_of(start)->at).count();
  return cudaSuccess;
}
// As CUDA's for the one device: every device allocation and event goes, the sticky error with them.
// Returns how many objects it freed through *freed (kvq's own extension, for the tests).
inline cudaError_t cudaDeviceReset(size_t *freed = nullptr) {
  std::unordered_map<std::uintptr_t, bool> live;
  {
    std::lock_guard<std::mutex> hold(objects().lock);
    live.swap(objects().live);
  }
  for (const auto &o : live) {
    void *p = reinterpret_cast<void *>(o.first ^ address_mask);
    if (o.second) delete event_of(reinterpret_cast<cudaEvent_t>(p));
    else ::operator delete(p);
  }
  if (freed) *freed = live.size();
  sticky = last = cudaSuccess;
  return cudaSuccess;
}
// How many device allocations and events exist now.
inline size_t device_objects() {
  std::lock_guard<std::mutex> hold(objects().lock);
  return objects().live.size();
}
} // namespace kvq_cuda_emu_rt

#define cudaGetErrorString kvq_cuda_emu_rt::cudaGetErrorString
#define cudaGetErrorName kvq_cuda_emu_rt::cudaGetErrorName
#define cudaGetLastError kvq_cuda_emu_rt::cudaGetLastError
#define cudaGetDeviceCount kvq_cuda_emu_rt::cudaGetDeviceCount
#define cudaSetDevice kvq_cuda_emu_rt::cudaSetDevice
#define cudaGetDevice kvq_cuda_emu_rt::cudaGetDevice
#define cudaGetDriverEntryPointByVersion kvq_cuda_emu_rt::cudaGetDriverEntryPointByVersion
#define cudaGetDeviceProperties kvq_cuda_emu_rt::cudaGetDeviceProperties
#define cudaMalloc kvq_cuda_emu_rt::cudaMalloc
#define cudaFree kvq_cuda_emu_rt::cudaFree
#define cudaMemcpyAsync kvq_cuda_emu_rt::cudaMemcpyAsync
#define cudaMemsetAsync kvq_cuda_emu_rt::cudaMemsetAsync
#define cudaPointerGetAttributes kvq_cuda_emu_rt::cudaPointerGetAttributes
#define cudaStreamCreateWithFlags kvq_cuda_emu_rt::cudaStreamCreateWithFlags
#define cudaStreamDestroy kvq_cuda_emu_rt::cudaStreamDestroy
#define cudaStreamSynchronize kvq_cuda_emu_rt::cudaStreamSynchronize
#define cudaEventCreate kvq_cuda_emu_rt::cudaEventCreate
#define cudaEventDestroy kvq_cuda_emu_rt::cudaEventDestroy
#define cudaEventRecord kvq_cuda_emu_rt::cudaEventRecord
#define cudaEventSynchronize kvq_cuda_emu_rt::cudaEventSynchronize
#define cudaEventElapsedTime kvq_cuda_emu_rt::cudaEventElapsedTime

#endif // KVQ_BACKENDS_CUDA_EMU_CUDA_RUNTIME_EMU_H
