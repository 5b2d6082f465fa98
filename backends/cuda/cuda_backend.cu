// The CUDA backend: kvq's backend table (backends/backend.h) over the CUDA runtime, written once and
// built two ways (docs/CUDA.md, runtime.cuh):
//   - nvcc, against libcudart: kvq_cuda_backend_create, the backend on a GPU;
//   - the host C++ compiler (cuda_backend_emu.cpp includes this file), against kvq's emulated runtime:
//     kvq_cuda_emu_backend_create, the same host code with its kernels run on the CPU by kvq's
//     thread-model emulator, so that the tests exercise the backend without a GPU.
// Everything here but the entry point has internal linkage (an anonymous namespace), kernels included,
// so that both builds live in one libkvq without a clash. This file holds the device and the table;
// host/*.cuh hold the state and errors, the buffers, the page jobs, the attention jobs, k-means and CONVERT,
// and the device token checks.
#include "runtime.cuh"

#include "kernels/methods.cuh"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "backends/backend.h"
#include "cuda_create.h"
#define KVQ_GPU_PLAN_HOST 1 // the plan of core/gpu_plan.c, in C++
#include "core/gpu_plan.h"

#if defined(__GNUC__)
#define KVQ_CUDA_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KVQ_CUDA_PRINTF(f, a)
#endif

// The CUDA backend's buffers: device memory, or a caller's device pointer (imported: never freed).
struct kvq_buffer {
  kvq_buffer_base base;
  unsigned char *ptr;
  uint64_t size;
  int imported;
};

namespace {

#include "kernels/convert.cuh"
#include "kernels/dequantize.cuh"
#include "kernels/flash.cuh"
#include "kernels/kmeans.cuh"
#include "kernels/prepare.cuh"
#include "kernels/quantize.cuh"
#include "kernels/score.cuh"
#include "kernels/softmax.cuh"
#include "kernels/token_check.cuh"
#include "kernels/weighted_sum.cuh"

// key_dots.cuh's kernel of its own (its tests launch it) is not one of the backend's: SCORE calls its
// device functions.
[[maybe_unused]] const auto key_dots_kernel = &kvq_cuda_key_dots;

#include "host/backend.cuh"
#include "host/context.cuh"
#include "host/memory.cuh"
#include "host/jobs.cuh"
#include "host/attention.cuh"
#include "host/kmeans.cuh"
#include "host/token_check.cuh"

int cuda_supports(const kvq_backend *, kvq_job_kind kind, const kvq_side_layout *keys, const kvq_side_layout *values) {
  if (kind == KVQ_JOB_KMEANS_ASSIGN || kind == KVQ_JOB_KMEANS_UPDATE) return 1;
  return (!keys || known_method(keys->method)) && (!values || known_method(values->method));
}

kvq_status cuda_finish(kvq_backend *backend) {
  cuda_backend *b = as_cuda(backend);
  kvq_status st = enter_device(b);
  if (st == KVQ_OK) st = span_end(b);
  if (st == KVQ_OK) st = check(b, cudaStreamSynchronize(b->stream), "waiting for the stream (cudaStreamSynchronize)");
  if (st == KVQ_OK) b->stats.waits++;
  return st;
}

// A stream needs no flush: deferred or not, work is enqueued as it comes and stays in flight.
void cuda_defer(kvq_backend *backend) { as_cuda(backend)->deferred = true; }

kvq_status cuda_end_deferred(kvq_backend *backend, int wait) {
  cuda_backend *b = as_cuda(backend);
  b->deferred = false;
  if (wait) return cuda_finish(backend);
  kvq_status st = enter_device(b); // the call's span ends after its work, which stays in flight
  return st == KVQ_OK ? span_end(b) : st;
}

// The device time of the spans since the previous call (host/backend.cuh): the open span is ended and
// every ended span read, which waits for the work they measure.
kvq_status cuda_device_time(kvq_backend *backend, uint64_t *ns) {
  cuda_backend *b = as_cuda(backend);
  kvq_status st = enter_device(b);
  if (st == KVQ_OK) st = span_end(b);
  while (st == KVQ_OK && b->span_count > 0) st = span_read(b);
  if (st != KVQ_OK) return st;
  *ns = b->device_ns;
  b->device_ns = 0;
  return KVQ_OK;
}

void cuda_stats(kvq_backend *backend, kvq_backend_stats *out, int reset) {
  cuda_backend *b = as_cuda(backend);
  *out = b->stats;
  if (reset) b->stats = kvq_backend_stats{};
}

void cuda_destroy(kvq_backend *backend) {
  cuda_backend *b = as_cuda(backend);
  const bool pushed = b->context && context_push(b) == KVQ_OK;
  if (!b->lost && (b->context ? pushed : cudaSetDevice(b->device) == cudaSuccess)) {
    cudaStreamSynchronize(b->stream); // nothing of kvq's may still run when its memory goes
    if (b->scratch) cudaFree(b->scratch);
    if (b->owns_stream) cudaStreamDestroy(b->stream);
    for (unsigned i = 0; i < cuda_backend::spans; i++) {
      if (b->span_start[i]) cudaEventDestroy(b->span_start[i]);
      if (b->span_end[i]) cudaEventDestroy(b->span_end[i]);
    }
  }
  if (pushed) context_pop(b, true);
  std::free(b);
}

// Every entry point that touches CUDA runs with the runtime's CUcontext current (host/context.cuh);
// supports, stats and defer touch nothing of CUDA's, destroy pushes the context itself.
const kvq_backend_ops cuda_ops = {
    KVQ_BACKEND_ABI_VERSION,
    "cuda",
    cuda_destroy,
    cuda_supports,
    KVQ_CUDA_IN_CONTEXT(cuda_buffer_create),
    KVQ_CUDA_IN_CONTEXT(cuda_buffer_destroy),
    KVQ_CUDA_IN_CONTEXT(cuda_buffer_write),
    KVQ_CUDA_IN_CONTEXT(cuda_buffer_read),
    KVQ_CUDA_IN_CONTEXT(cuda_buffer_copy),
    KVQ_CUDA_IN_CONTEXT(cuda_buffer_zero),
    KVQ_CUDA_IN_CONTEXT(cuda_quantize),
    KVQ_CUDA_IN_CONTEXT(cuda_dequantize),
    KVQ_CUDA_IN_CONTEXT(cuda_prepare),
    KVQ_CUDA_IN_CONTEXT(cuda_score),
    KVQ_CUDA_IN_CONTEXT(cuda_softmax),
    KVQ_CUDA_IN_CONTEXT(cuda_weighted_sum),
    KVQ_CUDA_IN_CONTEXT(cuda_attention),
    KVQ_CUDA_IN_CONTEXT(cuda_kmeans_assign),
    KVQ_CUDA_IN_CONTEXT(cuda_kmeans_update),
    KVQ_CUDA_IN_CONTEXT(cuda_finish),
    KVQ_CUDA_IN_CONTEXT(cuda_buffer_import),
    KVQ_CUDA_IN_CONTEXT(cuda_device_time),
    cuda_stats,
    cuda_defer,
    KVQ_CUDA_IN_CONTEXT(cuda_end_deferred),
    KVQ_CUDA_IN_CONTEXT(cuda_convert),
    KVQ_CUDA_IN_CONTEXT(cuda_check_tokens),
    nullptr, // buffer_read_later: a read synchronizes the stream, which submits nothing of its own
    nullptr, // discard: each operation runs as it is issued, nothing is recorded to drop
    nullptr, // defer_parts: defer serves (nothing is recorded, so nothing runs out)
};

// Why the runtime cannot start, as kvq_availability: no driver (or one too old for this runtime), no
// device, or something else.
kvq_availability availability_of(cudaError_t e) {
  switch (e) {
  case cudaErrorInsufficientDriver:
  case cudaErrorCallRequiresNewerDriver: return KVQ_UNAVAILABLE_NO_LOADER;
  case cudaErrorNoDevice:
  case cudaErrorDevicesUnavailable: return KVQ_UNAVAILABLE_NO_DEVICE;
  default: return KVQ_UNAVAILABLE_ERROR;
  }
}

// The device ordinal the options ask for: the runtime's, device_index, or (-1) the device with the
// most multiprocessors (the most capable, as kvq_context_options promises).
kvq_status choose_device(const kvq_context_options *options, int count, int *device, kvq_availability *availability, char *why,
                         size_t why_size) {
  const int asked = options && options->cuda ? options->cuda->device_ordinal : options ? options->device_index : -1;
  if (asked >= count || (options && options->cuda && asked < 0)) {
    *availability = KVQ_UNAVAILABLE_NO_DEVICE;
    std::snprintf(why, why_size, "cuda: CUDA device %d asked for, %d present", asked, count);
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  *device = asked >= 0 ? asked : 0;
  int best = -1;
  for (int d = 0; asked < 0 && d < count; d++) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess && prop.multiProcessorCount > best)
      best = prop.multiProcessorCount, *device = d;
  }
  return KVQ_OK;
}

kvq_status start(cuda_backend *b, const kvq_context_options *options, kvq_availability *availability, char *why, size_t why_size) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    *availability = e != cudaSuccess ? availability_of(e) : KVQ_UNAVAILABLE_NO_DEVICE;
    if (e != cudaSuccess)
      std::snprintf(why, why_size, "cuda: cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    else
      std::snprintf(why, why_size, "cuda: the CUDA runtime reports no device");
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  const kvq_cuda_device *runtime = options ? options->cuda : nullptr;
  *availability = KVQ_UNAVAILABLE_ERROR;
  kvq_status st = choose_device(options, count, &b->device, availability, why, why_size);
  if (st != KVQ_OK) return st;
  *availability = KVQ_UNAVAILABLE_ERROR;
  cudaDeviceProp prop;
  bool pushed = false;
  if (runtime && runtime->context) {
    // the runtime's own CUcontext (host/context.cuh): current for the rest of the start, and checked
    // to be of the device the options name
    st = context_take(b, static_cast<CUcontext>(runtime->context));
    if (st == KVQ_OK) st = context_push(b);
    pushed = st == KVQ_OK;
    int current = -1;
    if (st == KVQ_OK) st = check(b, cudaGetDevice(&current), "cudaGetDevice (the runtime's CUcontext)");
    if (st == KVQ_OK && current != b->device)
      st = fail(b, KVQ_ERROR_INVALID_ARGUMENT, "the runtime's CUcontext is of CUDA device %d, kvq_cuda_device.device_ordinal says %d",
                current, b->device);
  } else {
    st = check(b, cudaSetDevice(b->device), "cudaSetDevice");
  }
  if (st == KVQ_OK) st = check(b, cudaGetDeviceProperties(&prop, b->device), "cudaGetDeviceProperties");
  if (st == KVQ_OK && runtime) b->stream = static_cast<cudaStream_t>(runtime->stream);
  if (st == KVQ_OK && !runtime) {
    st = check(b, cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    b->owns_stream = st == KVQ_OK;
  }
  if (pushed) {
    const kvq_status popped = context_pop(b, st == KVQ_OK);
    if (st == KVQ_OK) st = popped;
  }
  if (st != KVQ_OK) {
    std::snprintf(why, why_size, "%s", b->base.message);
    return st == KVQ_ERROR_INVALID_ARGUMENT ? st : KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  // what the device holds, for core's checks before allocation (core/memory_limits.c): one cudaMalloc
  // can take all of it, no more
  b->base.memory_bytes = b->base.max_buffer_bytes = prop.totalGlobalMem;
#if KVQ_CUDA_EMULATED
  std::snprintf(b->base.device, sizeof b->base.device, "%.200s", prop.name);
#else
  std::snprintf(b->base.device, sizeof b->base.device, "%.160s (sm_%d%d, CUDA device %d%s)", prop.name, prop.major, prop.minor,
                b->device, !runtime ? "" : b->context ? ", the runtime's stream and CUcontext" : ", the runtime's stream");
#endif
  *availability = KVQ_AVAILABLE;
  return KVQ_OK;
}

} // namespace

#if KVQ_CUDA_EMULATED
#define KVQ_CUDA_ENTRY kvq_cuda_emu_backend_create
#else
#define KVQ_CUDA_ENTRY kvq_cuda_backend_create
#endif

#if KVQ_CUDA_EMULATED
// The emulated driver's context stack of the calling thread, for the tests (cuda_create.h).
extern "C" void kvq_cuda_emu_contexts(kvq_cuda_emu_context_counts *out) {
  out->pushes = kvq_cuda_emu_rt::context_pushes;
  out->pops = kvq_cuda_emu_rt::context_pops;
  out->depth = kvq_cuda_emu_rt::context_stack.size();
  out->calls_in_context = kvq_cuda_emu_rt::calls_in_context;
  out->calls_outside_context = kvq_cuda_emu_rt::calls_outside_context;
  out->last_pushed = kvq_cuda_emu_rt::context_last_pushed;
}
extern "C" size_t kvq_cuda_emu_device_objects(void) { return kvq_cuda_emu_rt::device_objects(); }
extern "C" size_t kvq_cuda_emu_device_reset(void) {
  size_t freed = 0;
  kvq_cuda_emu_rt::cudaDeviceReset(&freed);
  return freed;
}
#endif

extern "C" kvq_status KVQ_CUDA_ENTRY(const kvq_context_options *options, kvq_backend **out, kvq_availability *availability,
                                     char *why, size_t why_size) {
  *out = nullptr;
  cuda_backend *b = static_cast<cuda_backend *>(KVQ_CUDA_HOST_ALLOC_FAILS() ? nullptr : std::calloc(1, sizeof *b));
  if (!b) {
    *availability = KVQ_UNAVAILABLE_ERROR;
    std::snprintf(why, why_size, "cuda: out of host memory");
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  b->base.ops = &cuda_ops;
  b->base.kind = KVQ_BACKEND_CUDA;
  const kvq_status st = start(b, options, availability, why, why_size);
  if (st != KVQ_OK) {
    cuda_destroy(&b->base);
    return st;
  }
  *out = &b->base;
  return KVQ_OK;
}
