/* Vulkan results as kvq statuses, and validation messages as failures. */
#include <stdarg.h>
#include <stdio.h>

#include "vk.h"

static const char *result_name(VkResult r) {
  switch (r) {
  case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
  case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
  case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
  case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
  case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
  case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
  case VK_ERROR_FRAGMENTED_POOL: return "VK_ERROR_FRAGMENTED_POOL";
  case VK_TIMEOUT: return "VK_TIMEOUT";
  default: return "VkResult";
  }
}

kvq_status kvq_vk_error(vk_backend *b, kvq_status status, const char *format, ...) {
  int n = snprintf(b->base.message, sizeof b->base.message, "vulkan: ");
  va_list args;
  va_start(args, format);
  vsnprintf(b->base.message + n, sizeof b->base.message - (size_t)n, format, args);
  va_end(args);
  return status;
}

kvq_status kvq_vk_fail(vk_backend *b, VkResult r, const char *what) {
  snprintf(b->base.message, sizeof b->base.message, "vulkan: %s failed: %s (%d)", what, result_name(r), (int)r);
  switch (r) {
  case VK_ERROR_OUT_OF_HOST_MEMORY: return KVQ_ERROR_OUT_OF_MEMORY;
  case VK_ERROR_OUT_OF_DEVICE_MEMORY: return KVQ_ERROR_DEVICE_MEMORY;
  case VK_ERROR_DEVICE_LOST:
  case VK_TIMEOUT: return KVQ_ERROR_DEVICE_LOST;
  default: return KVQ_ERROR_INTERNAL;
  }
}

kvq_status kvq_vk_check_validation(vk_backend *b) {
  if (b->validation_messages == 0) return KVQ_OK;
  const uint32_t count = b->validation_messages;
  b->validation_messages = 0;
  return kvq_vk_error(b, KVQ_ERROR_INTERNAL, "%u validation message(s), the first: %s", count, b->validation_first);
}
