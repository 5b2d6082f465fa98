/* The CUDA backend's entry points, for backends/registry.c (which must not see the backend's own
 * types: every backend defines its own struct kvq_buffer). One source, backends/cuda/cuda_backend.cu,
 * builds both (docs/CUDA.md):
 *   kvq_cuda_backend_create      nvcc against the CUDA runtime (KVQ_HAVE_CUDA): a GPU;
 *   kvq_cuda_emu_backend_create  the host C++ compiler against kvq's emulated runtime, the kernels on
 *                                the CPU (KVQ_HAVE_CUDA_EMULATOR): a test facility, never a GPU.
 * Both start the backend on the device `options` ask for (kvq_context_options: device_index, cuda),
 * or say in `why` and `availability` why they cannot. */
#ifndef KVQ_BACKENDS_CUDA_CUDA_CREATE_H
#define KVQ_BACKENDS_CUDA_CUDA_CREATE_H

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

kvq_status kvq_cuda_backend_create(const kvq_context_options *options, kvq_backend **out, kvq_availability *availability,
                                   char *why, size_t why_size);
kvq_status kvq_cuda_emu_backend_create(const kvq_context_options *options, kvq_backend **out,
                                       kvq_availability *availability, char *why, size_t why_size);

/* The emulated driver's context stack (backends/cuda/emu/cuda_runtime_emu.h) of the calling thread,
 * for the tests: the pushes and pops of the stand-ins of cuCtxPushCurrent / cuCtxPopCurrent, the
 * stack's depth now, the last context pushed, and how many emulated runtime calls ran with a context
 * of the caller's current (the top of the stack) and without one (the primary context).
 * KVQ_HAVE_CUDA_EMULATOR only. */
typedef struct kvq_cuda_emu_context_counts {
  unsigned long long pushes, pops, depth, calls_in_context, calls_outside_context;
  void *last_pushed;
} kvq_cuda_emu_context_counts;
void kvq_cuda_emu_contexts(kvq_cuda_emu_context_counts *out);

/* The emulated device's memory allocations and events that exist now (all contexts'), and its
 * cudaDeviceReset: frees them all and returns how many it freed. A lost device's memory is kept by
 * the CUDA backend (a runtime recovers it by resetting the device), so a test that loses the
 * emulated device resets it once no context is left on it. KVQ_HAVE_CUDA_EMULATOR only; not
 * thread-safe with contexts in use. */
size_t kvq_cuda_emu_device_objects(void);
size_t kvq_cuda_emu_device_reset(void);

#ifdef __cplusplus
}
#endif

#endif
