/* The fault-injection tests' shared fixture (tests/fault_fixture.h). */
#include "fault_fixture.h"
#include "fixture_inputs.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <string.h>

#ifdef KVQ_HAVE_CUDA_EMULATOR
#include "backends/cuda/cuda_create.h"
#endif
#ifdef KVQ_HAVE_VULKAN
#include <volk.h>
#endif

float keys_in[KV_FLOATS], values_in[KV_FLOATS], queries_in[Q_FLOATS];

void fill_inputs(uint32_t seed) {
  uint32_t x = seed;
  x = fx_fill_lcg(keys_in, KV_FLOATS, x);
  x = fx_fill_lcg(values_in, KV_FLOATS, x);
  (void)fx_fill_lcg(queries_in, Q_FLOATS, x);
}

kvq_cache_config cache_config(which_cache which, kvq_layer_config *layer) {
  static const kvq_method keys[] = {[BASE] = KVQ_METHOD_QJL, [LEARNED] = KVQ_METHOD_CQ, [POLAR_KIVI] = KVQ_METHOD_POLAR,
                                    [EXACT] = KVQ_METHOD_EXACT};
  static const kvq_method values[] = {[BASE] = KVQ_METHOD_UNIFORM, [LEARNED] = KVQ_METHOD_UNIFORM,
                                      [POLAR_KIVI] = KVQ_METHOD_KIVI, [EXACT] = KVQ_METHOD_EXACT};
  *layer = (kvq_layer_config){.query_heads = HQ, .kv_heads = HKV, .head_dim = D,
                              .keys = kvq_method_defaults(keys[which], D), .values = kvq_method_defaults(values[which], D)};
  if (which == LEARNED) {
    layer->keys.cq.bits = 4;
    layer->keys.cq.iterations = 4;
  }
  if (which == EXACT) layer->values.exact.dtype = KVQ_DTYPE_BF16;
  kvq_cache_config config = {.layer_count = 1, .layers = layer, .input_dtype = KVQ_DTYPE_F32, .page_size = PAGE,
                             .residual_window = WINDOW, .max_pages = 16, .max_sequences = 2, .seed = 11};
  if (which != LEARNED) {
    config.policy = kvq_policy_defaults(KVQ_POLICY_H2O);
    config.policy.heavy_fraction = 0;
    config.policy.heavy = 4;
  }
  return config;
}

kvq_status fault_save(kvq_cache *cache) {
  uint64_t size = 0;
  kvq_status st = kvq_cache_save_size(cache, &size);
  if (st != KVQ_OK) return st;
  unsigned char *buffer = malloc((size_t)size);
  size_t written = 0;
  st = buffer ? kvq_cache_save_to_memory(cache, buffer, (size_t)size, &written) : KVQ_ERROR_OUT_OF_MEMORY;
  free(buffer);
  return st;
}

kvq_status fault_load(kvq_context *ctx, const unsigned char *file, size_t size, int *fired_before_destroy) {
  kvq_cache *cache = NULL;
  const kvq_status st = kvq_cache_load_from_memory(ctx, file, size, &cache);
  *fired_before_destroy = kvq_fault_fired();
  kvq_cache_destroy(cache);
  return st;
}

kvq_status fault_learn(kvq_cache *cache) {
  const int64_t shape[3] = {TOKENS, HKV, D};
  kvq_tensor k = kvq_tensor_host(keys_in, KVQ_DTYPE_F32, 3, shape);
  return kvq_codebooks_learn(cache, 0, &k, NULL, NULL);
}

void release(kvq_cache **cache, unsigned char **file) {
  kvq_cache_destroy(*cache);
  *cache = NULL;
  free(*file);
  *file = NULL;
}

kvq_status saved_bytes(kvq_cache *cache, unsigned char **bytes, size_t *size) {
  uint64_t n = 0;
  *bytes = NULL;
  kvq_status st = kvq_cache_save_size(cache, &n);
  if (st != KVQ_OK) return st;
  if (!(*bytes = malloc((size_t)n))) return KVQ_ERROR_OUT_OF_MEMORY;
  return kvq_cache_save_to_memory(cache, *bytes, (size_t)n, size);
}

const char *const kind_names[KVQ_FAULT_KINDS + 1] = {"host alloc", "device alloc", "device object", "map", "copy",
                                                     "launch", "submit", "wait", "none failed"};

int may_be_lost(kvq_fault_kind kind) { return kind == KVQ_FAULT_SUBMIT || kind == KVQ_FAULT_WAIT; }

int can_be_lost(kvq_backend_kind backend) {
#ifdef KVQ_HAVE_CUDA_EMULATOR
  return backend == KVQ_BACKEND_VULKAN || backend == KVQ_BACKEND_CUDA;
#else
  return backend == KVQ_BACKEND_VULKAN;
#endif
}

size_t device_objects(kvq_backend_kind backend) {
#ifdef KVQ_HAVE_CUDA_EMULATOR
  if (backend == KVQ_BACKEND_CUDA) return kvq_cuda_emu_device_objects();
#endif
  (void)backend;
  return 0;
}

void device_reset(kvq_backend_kind backend) {
#ifdef KVQ_HAVE_CUDA_EMULATOR
  if (backend == KVQ_BACKEND_CUDA) (void)kvq_cuda_emu_device_reset();
#endif
  (void)backend;
}

void failure(fault_log *log, const char *format, ...) {
  char line[600];
  va_list ap;
  va_start(ap, format);
  vsnprintf(line, sizeof line, format, ap);
  va_end(ap);
  if (log->failures < MAX_FAILURES_SHOWN) printf("#   %s\n", line);
  if (!log->failures) snprintf(log->first, sizeof log->first, "%s", line);
  log->failures++;
}

void check_nothing_held(fault_log *log, kvq_backend_kind backend, uint64_t k, int lost, const char *when) {
  if (kvq_fault_live_blocks() != 0)
    failure(log, "point %llu%s: %lld host blocks of kvq's remain %s", (unsigned long long)k, lost ? " (lost)" : "",
            (long long)kvq_fault_live_blocks(), when);
  if (lost) device_reset(backend);
  const size_t left = device_objects(backend);
  if (left) failure(log, "point %llu: %zu emulated device objects remain %s", (unsigned long long)k, left, when);
}

void in_destroy_text(uint64_t n, char *out, size_t size) {
  out[0] = 0;
  if (n) snprintf(out, size, " (%llu in kvq_cache_destroy, reported by the context's next call)", (unsigned long long)n);
}

uint64_t kinds_text(const uint64_t by_kind[KVQ_FAULT_KINDS], char *out, size_t size) {
  size_t at = 0;
  uint64_t points = 0;
  out[0] = 0;
  for (int k = 0; k < KVQ_FAULT_KINDS; k++) {
    points += by_kind[k];
    if (by_kind[k] && at < size)
      at += (size_t)snprintf(out + at, size - at, "%s%s %llu", at ? ", " : "", kind_names[k], (unsigned long long)by_kind[k]);
  }
  return points;
}

const char *known_defect_of(const known_defect *list, const char *row, const char *scenario) {
  for (size_t i = 0; list[i].row; i++)
    if (!strcmp(list[i].row, row) && !strcmp(list[i].scenario, scenario)) return list[i].why;
  return NULL;
}

#ifdef KVQ_HAVE_VULKAN
/* The Vulkan loader loads the drivers (ICDs) and implicit layers at each vkCreateInstance and unloads
 * them at vkDestroyInstance, so a test that makes thousands of contexts maps them again and again,
 * each time wherever the kernel finds room. Once a driver landed where the stack of an exited thread
 * had been: AddressSanitizer's shadow of that stack still said "out of scope" (ASan does not clear the
 * shadow of memory unmapped behind its back), and the driver's own strcmp on its data, through ASan's
 * interceptor, aborted the test (seen once: Mesa's hasvk inside kvq_context_create, fault_injection_contexts,
 * row vulkan-async append). An instance of the test's own, made before the first context and kept
 * to the end, holds every driver at the address it got first. */
static VkInstance drivers_held;
static PFN_vkDestroyInstance destroy_held;

static void vulkan_drivers_release(void) {
  if (drivers_held && destroy_held) destroy_held(drivers_held, NULL);
  drivers_held = VK_NULL_HANDLE;
}

void vulkan_drivers_hold(void) {
  if (drivers_held || volkInitialize() != VK_SUCCESS) return; /* no loader: no driver to hold */
  VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_2};
  VkInstanceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
  if (vkCreateInstance(&info, NULL, &drivers_held) != VK_SUCCESS) {
    drivers_held = VK_NULL_HANDLE;
    return;
  }
  /* through the loader, not volk's globals, which runtime_device_start points at its own instance */
  destroy_held = (PFN_vkDestroyInstance)vkGetInstanceProcAddr(drivers_held, "vkDestroyInstance");
  atexit(vulkan_drivers_release); /* before LeakSanitizer's check, registered earlier, runs */
}
#else
void vulkan_drivers_hold(void) {}
#endif

#ifdef KVQ_HAVE_VULKAN
const char *runtime_device_start(kvq_vulkan_device *handed) {
  memset(handed, 0, sizeof *handed);
  if (volkInitialize() != VK_SUCCESS) return "volkInitialize";
  VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_2};
  VkInstanceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
  VkInstance instance;
  if (vkCreateInstance(&info, NULL, &instance) != VK_SUCCESS) return "vkCreateInstance";
  volkLoadInstanceOnly(instance);
  handed->instance = instance;
  uint32_t count = 1;
  VkPhysicalDevice physical;
  const VkResult listed = vkEnumeratePhysicalDevices(instance, &count, &physical);
  if ((listed != VK_SUCCESS && listed != VK_INCOMPLETE) || count < 1) return "vkEnumeratePhysicalDevices";
  handed->physical_device = physical;
  VkQueueFamilyProperties families[16];
  uint32_t fc = 16;
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &fc, families);
  uint32_t family = UINT32_MAX;
  for (uint32_t i = 0; i < fc && family == UINT32_MAX; i++)
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
  if (family == UINT32_MAX) return "a compute queue family";
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = family,
                                   .queueCount = 1, .pQueuePriorities = &priority};
  VkDeviceCreateInfo dinfo = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1, .pQueueCreateInfos = &queue};
  VkDevice device;
  if (vkCreateDevice(physical, &dinfo, NULL, &device) != VK_SUCCESS) return "vkCreateDevice";
  volkLoadDevice(device);
  handed->device = device;
  handed->queue_family = family;
  return NULL;
}

void runtime_device_stop(kvq_vulkan_device *handed) {
  if (handed->device) vkDestroyDevice(handed->device, NULL);
  if (handed->instance) vkDestroyInstance(handed->instance, NULL);
  memset(handed, 0, sizeof *handed);
}

const char *runtime_buffers_make(const kvq_vulkan_device *handed, int count, const size_t *sizes,
                                 const float *const *inputs, int outputs_from, runtime_buffer *out) {
  VkDevice device = handed->device;
  VkPhysicalDeviceMemoryProperties mp;
  vkGetPhysicalDeviceMemoryProperties(handed->physical_device, &mp);
  for (int b = 0; b < count; b++) {
    VkBufferCreateInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = sizes[b],
                               .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                        VK_BUFFER_USAGE_STORAGE_BUFFER_BIT};
    VkBuffer buffer;
    if (vkCreateBuffer(device, &info, NULL, &buffer) != VK_SUCCESS) return "vkCreateBuffer";
    out[b].buffer = (uint64_t)(uintptr_t)buffer;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(device, buffer, &req);
    const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t type = UINT32_MAX;
    for (uint32_t i = 0; i < mp.memoryTypeCount && type == UINT32_MAX; i++)
      if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) type = i;
    if (type == UINT32_MAX) return "host-visible memory";
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size,
                                  .memoryTypeIndex = type};
    VkDeviceMemory memory;
    if (vkAllocateMemory(device, &alloc, NULL, &memory) != VK_SUCCESS) return "vkAllocateMemory";
    out[b].memory = (uint64_t)(uintptr_t)memory;
    if (vkBindBufferMemory(device, buffer, memory, 0) != VK_SUCCESS) return "vkBindBufferMemory";
    if (vkMapMemory(device, memory, 0, VK_WHOLE_SIZE, 0, &out[b].mapped) != VK_SUCCESS) return "vkMapMemory";
    out[b].bytes = sizes[b];
    if (b < outputs_from) memcpy(out[b].mapped, inputs[b], sizes[b]);
    else memset(out[b].mapped, 0x5a, sizes[b]);
  }
  return NULL;
}

void runtime_buffers_free(const kvq_vulkan_device *handed, int count, runtime_buffer *buffers) {
  VkDevice device = handed->device;
  for (int b = 0; b < count && device; b++) {
    if (buffers[b].mapped) vkUnmapMemory(device, (VkDeviceMemory)(uintptr_t)buffers[b].memory);
    if (buffers[b].buffer) vkDestroyBuffer(device, (VkBuffer)(uintptr_t)buffers[b].buffer, NULL);
    if (buffers[b].memory) vkFreeMemory(device, (VkDeviceMemory)(uintptr_t)buffers[b].memory, NULL);
  }
  memset(buffers, 0, (size_t)count * sizeof *buffers);
}
#else
const char *runtime_device_start(kvq_vulkan_device *handed) {
  memset(handed, 0, sizeof *handed);
  return "the Vulkan backend is not built";
}

void runtime_device_stop(kvq_vulkan_device *handed) { memset(handed, 0, sizeof *handed); }
#endif
