/* The one place that knows which backends exist and how to start them. */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu.h"
#ifdef KVQ_HAVE_VULKAN
#include "vulkan/vk_create.h"
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
  case KVQ_BACKEND_CUDA:
    *availability = KVQ_UNAVAILABLE_NOT_BUILT;
    snprintf(why, why_size, "this kvq was built without the %s backend", kind_name(kind));
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
