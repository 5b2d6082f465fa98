/* The one place that knows which backends exist and how to start them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu.h"
#ifdef KVQ_HAVE_VULKAN
#include "vulkan/vk_create.h"
#endif
#if defined(KVQ_HAVE_CUDA) || defined(KVQ_HAVE_CUDA_EMULATOR)
#include "cuda/cuda_create.h"
#endif

/* The emulated CUDA backend (a test facility, docs/CUDA.md) stands in for CUDA when the environment
 * asks for it with KVQ_CUDA_EMULATOR=1 and this kvq has it, for an explicit KVQ_BACKEND_CUDA or a probe,
 * never for KVQ_BACKEND_AUTO: a context that picks its backend itself must not land on the CPU
 * through an emulator. */
static int cuda_emulator_asked(const kvq_context_options *options) {
  const char *env = getenv("KVQ_CUDA_EMULATOR");
  return env && strcmp(env, "1") == 0 && !(options && options->backend == KVQ_BACKEND_AUTO && !options->cuda);
}

#ifdef KVQ_HAVE_CUDA_EMULATOR
#define KVQ_CUDA_EMULATOR_BUILT 1
#else
#define KVQ_CUDA_EMULATOR_BUILT 0
#endif

static const char *kind_name(kvq_backend_kind kind) {
  switch (kind) {
  case KVQ_BACKEND_CPU: return "cpu";
  case KVQ_BACKEND_VULKAN: return "vulkan";
  case KVQ_BACKEND_CUDA: return "cuda";
  case KVQ_BACKEND_AUTO: break;
  }
  return "auto";
}

kvq_status kvq_backend_create(kvq_backend_kind kind, const kvq_context_options *options, kvq_backend **out,
                              kvq_availability *availability, char *why, size_t why_size) {
  *out = NULL;
  if (why_size) why[0] = 0;
  switch (kind) {
  case KVQ_BACKEND_CPU: {
    (void)options;
    kvq_status st = kvq_cpu_backend_create(out, why, why_size);
    *availability = st == KVQ_OK ? KVQ_AVAILABLE : KVQ_UNAVAILABLE_ERROR;
    return st == KVQ_OK ? KVQ_OK : KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  case KVQ_BACKEND_VULKAN:
#ifdef KVQ_HAVE_VULKAN
    return kvq_vk_backend_create(options, out, availability, why, why_size);
#endif
  /* fall through: not built */
  case KVQ_BACKEND_CUDA:
    if (kind == KVQ_BACKEND_CUDA && cuda_emulator_asked(options)) {
#ifdef KVQ_HAVE_CUDA_EMULATOR
      return kvq_cuda_emu_backend_create(options, out, availability, why, why_size);
#else
      *availability = KVQ_UNAVAILABLE_NOT_BUILT;
      snprintf(why, why_size, "KVQ_CUDA_EMULATOR=1, but this kvq was built without the CUDA emulator");
      return KVQ_ERROR_BACKEND_UNAVAILABLE;
#endif
    }
#ifdef KVQ_HAVE_CUDA
    if (kind == KVQ_BACKEND_CUDA) return kvq_cuda_backend_create(options, out, availability, why, why_size);
#endif
    *availability = KVQ_UNAVAILABLE_NOT_BUILT;
    snprintf(why, why_size, "this kvq was built without the %s backend%s", kind_name(kind),
             kind == KVQ_BACKEND_CUDA && KVQ_CUDA_EMULATOR_BUILT ? " (it has the CUDA emulator for tests: KVQ_CUDA_EMULATOR=1)" : "");
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  case KVQ_BACKEND_AUTO: break;
  }
  *availability = KVQ_UNAVAILABLE_ERROR;
  snprintf(why, why_size, "unknown backend kind %d", (int)kind);
  return KVQ_ERROR_INVALID_ARGUMENT;
}

void kvq_backend_probe(kvq_backend_kind kind, kvq_backend_info *info) {
  memset(info, 0, sizeof *info);
  info->kind = kind;
  info->name = kind_name(kind);
  kvq_backend *backend = NULL;
  kvq_backend_create(kind, NULL, &backend, &info->availability, info->reason, sizeof info->reason);
  if (backend) {
    snprintf(info->device, sizeof info->device, "%s", backend->device);
    backend->ops->destroy(backend);
  }
}
