/*
 * Starting and stopping the Vulkan backend: the loader, the instance, the choice of a physical
 * device, the logical device and its queue, or the runtime's own objects when it hands them over
 * (kvq_vulkan_device).
 *
 * Every Vulkan function comes from a pointer kvq resolved for itself, never from a process-wide one
 * that another thread may be writing: kvq_context_create and kvq_backends_list are thread-safe, and
 * several threads start backends at once. The loader's entry points are resolved once per process
 * (pthread_once) and only read afterwards; each backend loads the instance functions it calls for its
 * own instance (kvq_vk_instance_fns) and its device functions for its device (VolkDeviceTable). So
 * no lock is needed here: the Vulkan loader and drivers synchronize their own state (instance and
 * device creation have no external synchronization requirements in the Vulkan specification), and
 * nothing kvq shares between backends is written after pthread_once.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk.h"

/* The loader's entry points, for the whole process: vkGetInstanceProcAddr (dlsym) and what it gives
 * before any instance exists. Written once by open_loader (under pthread_once, which orders those
 * writes before every read that follows it in any thread), read-only afterwards. The library stays
 * open for the life of the process, as a loader opened by volk would; a process that found no loader
 * keeps reporting none (a loader installed while it runs is not seen). */
typedef struct vk_loader {
  PFN_vkGetInstanceProcAddr get_instance_proc_addr; /* NULL: no loader could be opened */
  PFN_vkCreateInstance create_instance;
  PFN_vkEnumerateInstanceVersion enumerate_instance_version; /* NULL on a Vulkan 1.0 loader */
  PFN_vkEnumerateInstanceLayerProperties enumerate_instance_layers;
} vk_loader;

static vk_loader loader;
static pthread_once_t loader_once = PTHREAD_ONCE_INIT;

static void open_loader(void) {
  void *library = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) library = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
  if (!library) return;
  /* dlsym returns an object pointer; POSIX guarantees it converts to the function's pointer, ISO C
   * has no cast for it (-Wpedantic), so the bits are copied. */
  void *symbol = dlsym(library, "vkGetInstanceProcAddr");
  _Static_assert(sizeof symbol == sizeof loader.get_instance_proc_addr, "function and object pointers differ in size");
  memcpy(&loader.get_instance_proc_addr, &symbol, sizeof symbol);
  if (!loader.get_instance_proc_addr) return;
  PFN_vkGetInstanceProcAddr get = loader.get_instance_proc_addr;
  loader.create_instance = (PFN_vkCreateInstance)get(VK_NULL_HANDLE, "vkCreateInstance");
  loader.enumerate_instance_version = (PFN_vkEnumerateInstanceVersion)get(VK_NULL_HANDLE, "vkEnumerateInstanceVersion");
  loader.enumerate_instance_layers =
      (PFN_vkEnumerateInstanceLayerProperties)get(VK_NULL_HANDLE, "vkEnumerateInstanceLayerProperties");
  if (!loader.create_instance || !loader.enumerate_instance_layers) loader.get_instance_proc_addr = NULL;
}

/* The loader's entry points, or NULL when no usable Vulkan loader is installed. */
static const vk_loader *vulkan_loader(void) {
  if (pthread_once(&loader_once, open_loader) != 0) return NULL;
  return loader.get_instance_proc_addr ? &loader : NULL;
}

/* The first instance function kvq needs that `f` lacks, or NULL. */
static const char *missing_instance_fn(const kvq_vk_instance_fns *f) {
  return !f->destroy_instance             ? "vkDestroyInstance"
         : !f->enumerate_physical_devices ? "vkEnumeratePhysicalDevices"
         : !f->get_properties             ? "vkGetPhysicalDeviceProperties"
         : !f->get_properties2            ? "vkGetPhysicalDeviceProperties2"
         : !f->get_memory_properties      ? "vkGetPhysicalDeviceMemoryProperties"
         : !f->get_queue_families         ? "vkGetPhysicalDeviceQueueFamilyProperties"
         : !f->create_device              ? "vkCreateDevice"
         : !f->get_device_proc_addr       ? "vkGetDeviceProcAddr"
                                          : NULL;
}

/* Loads the instance functions kvq calls for `instance` (kvq's own, or the runtime's: the loader's
 * vkGetInstanceProcAddr serves every instance it created); returns the first one missing, or NULL. */
static const char *load_instance_fns(VkInstance instance, kvq_vk_instance_fns *f) {
  PFN_vkGetInstanceProcAddr get = vulkan_loader()->get_instance_proc_addr;
  f->destroy_instance = (PFN_vkDestroyInstance)get(instance, "vkDestroyInstance");
  f->enumerate_physical_devices = (PFN_vkEnumeratePhysicalDevices)get(instance, "vkEnumeratePhysicalDevices");
  f->get_properties = (PFN_vkGetPhysicalDeviceProperties)get(instance, "vkGetPhysicalDeviceProperties");
  f->get_properties2 = (PFN_vkGetPhysicalDeviceProperties2)get(instance, "vkGetPhysicalDeviceProperties2");
  f->get_memory_properties = (PFN_vkGetPhysicalDeviceMemoryProperties)get(instance, "vkGetPhysicalDeviceMemoryProperties");
  f->get_queue_families =
      (PFN_vkGetPhysicalDeviceQueueFamilyProperties)get(instance, "vkGetPhysicalDeviceQueueFamilyProperties");
  f->create_device = (PFN_vkCreateDevice)get(instance, "vkCreateDevice");
  f->get_device_proc_addr = (PFN_vkGetDeviceProcAddr)get(instance, "vkGetDeviceProcAddr");
  /* NULL unless the instance enabled VK_EXT_debug_utils (validation runs) */
  f->create_messenger = (PFN_vkCreateDebugUtilsMessengerEXT)get(instance, "vkCreateDebugUtilsMessengerEXT");
  f->destroy_messenger = (PFN_vkDestroyDebugUtilsMessengerEXT)get(instance, "vkDestroyDebugUtilsMessengerEXT");
  return missing_instance_fn(f);
}

/* Validation runs (tests set KVQ_VULKAN_VALIDATION=1): every validation message is recorded, and the
 * next finished job fails with it, so that a message can never pass unnoticed. */
static VKAPI_ATTR VkBool32 VKAPI_CALL on_validation(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                    VkDebugUtilsMessageTypeFlagsEXT types,
                                                    const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
  (void)types;
  vk_backend *b = user;
  if (!(severity & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)))
    return VK_FALSE;
  if (b->validation_messages++ == 0)
    snprintf(b->validation_first, sizeof b->validation_first, "%s", data && data->pMessage ? data->pMessage : "?");
  fprintf(stderr, "kvq vulkan validation: %s\n", data && data->pMessage ? data->pMessage : "?");
  return VK_FALSE;
}

static int validation_requested(void) {
  const char *v = getenv("KVQ_VULKAN_VALIDATION");
  return v && v[0] == '1';
}

static int layer_present(const char *name) {
  const PFN_vkEnumerateInstanceLayerProperties enumerate = vulkan_loader()->enumerate_instance_layers;
  uint32_t count = 0;
  if (enumerate(&count, NULL) != VK_SUCCESS || count == 0) return 0;
  VkLayerProperties *layers = calloc(count, sizeof *layers);
  int found = 0;
  if (layers && enumerate(&count, layers) == VK_SUCCESS)
    for (uint32_t i = 0; i < count; i++) found |= !strcmp(layers[i].layerName, name);
  free(layers);
  return found;
}

/* Validation runs only: the layer stays loaded for the life of the process. With synchronization
 * validation on, the layer of Debian 12 (1.3.239) leaks a few blocks whenever an instance is
 * destroyed; once the loader unloads it, LeakSanitizer reports them with frames it cannot name, and
 * no suppression can tell them from kvq's own. Loaded, they are named, and tests/sanitizers/lsan.supp
 * matches the layer's library. (RTLD_LOCAL: nothing resolves to the layer's exported vk* symbols.) */
static void keep_layer_loaded(void) {
  void *layer = dlopen("libVkLayer_khronos_validation.so", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (layer) dlclose(layer); /* RTLD_NODELETE: the library stays */
}

/* The messenger that sees validation messages after instance creation (the one chained to
 * VkInstanceCreateInfo sees those of creation and destruction only). Without it, messages after
 * creation would go unnoticed: the backend still starts, as before, but validation is weaker. */
/* Not a failure point (core/fault.h), as its failure fails nothing. */
static void create_messenger(vk_backend *b, const VkDebugUtilsMessengerCreateInfoEXT *info) {
  if (!b->vki.create_messenger || !b->vki.destroy_messenger ||
      b->vki.create_messenger(b->instance, info, NULL, &b->messenger) != VK_SUCCESS)
    b->messenger = VK_NULL_HANDLE;
}

static kvq_status create_instance(vk_backend *b, kvq_availability *availability, char *why, size_t why_size) {
  const vk_loader *vulkan = vulkan_loader();
  uint32_t version = VK_API_VERSION_1_0; /* a loader without vkEnumerateInstanceVersion is 1.0 */
  if (vulkan->enumerate_instance_version && vulkan->enumerate_instance_version(&version) != VK_SUCCESS)
    version = VK_API_VERSION_1_0;
  if (version < VK_API_VERSION_1_2) {
    *availability = KVQ_UNAVAILABLE_NO_DEVICE;
    snprintf(why, why_size, "vulkan: the loader offers Vulkan %u.%u; kvq needs 1.2", VK_API_VERSION_MAJOR(version),
             VK_API_VERSION_MINOR(version));
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  const int validate = validation_requested();
  const char *layer = "VK_LAYER_KHRONOS_validation";
  if (validate && !layer_present(layer)) {
    *availability = KVQ_UNAVAILABLE_ERROR;
    snprintf(why, why_size, "vulkan: KVQ_VULKAN_VALIDATION=1 but %s is not installed (vulkan-validationlayers)", layer);
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  if (validate) keep_layer_loaded();
  VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "kvq",
                           .pEngineName = "kvq", .apiVersion = VK_API_VERSION_1_2};
  VkDebugUtilsMessengerCreateInfoEXT messenger = {
      .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
      .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
      .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT,
      .pfnUserCallback = on_validation,
      .pUserData = b};
  /* Synchronization validation too: a missing barrier between two dispatches (or a copy and a
   * dispatch) is a hazard the core checks cannot see, and lavapipe, which runs work in order, hides
   * it. VK_EXT_validation_features is an extension of the layer itself (1.3.239 in Debian 12). */
  const VkValidationFeatureEnableEXT enables[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  VkValidationFeaturesEXT features = {.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
                                      .pNext = &messenger,
                                      .enabledValidationFeatureCount = 1,
                                      .pEnabledValidationFeatures = enables};
  const char *extensions[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME};
  VkInstanceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                               .pNext = validate ? &features : NULL,
                               .pApplicationInfo = &app,
                               .enabledLayerCount = validate ? 1 : 0,
                               .ppEnabledLayerNames = &layer,
                               .enabledExtensionCount = validate ? 2 : 0,
                               .ppEnabledExtensionNames = extensions};
  VkResult r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, vulkan->create_instance(&info, NULL, &b->instance));
  if (r != VK_SUCCESS) {
    *availability = r == VK_ERROR_INCOMPATIBLE_DRIVER ? KVQ_UNAVAILABLE_NO_DEVICE : KVQ_UNAVAILABLE_ERROR;
    snprintf(why, why_size, "vulkan: vkCreateInstance failed (VkResult %d)", (int)r);
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  b->owns_instance = 1;
  const char *missing = load_instance_fns(b->instance, &b->vki);
  if (missing) {
    b->owns_instance = b->vki.destroy_instance != NULL; /* without it the instance cannot be destroyed */
    *availability = KVQ_UNAVAILABLE_ERROR;
    snprintf(why, why_size, "vulkan: the loader gives no %s for kvq's instance", missing);
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  if (validate) create_messenger(b, &messenger);
  return KVQ_OK;
}

/* A device's queue families (the first 32: more exist on no device); returns their count. */
static uint32_t queue_families(const vk_backend *b, VkPhysicalDevice device, VkQueueFamilyProperties families[32]) {
  uint32_t count = 0;
  b->vki.get_queue_families(device, &count, NULL);
  if (count > 32) count = 32;
  b->vki.get_queue_families(device, &count, families);
  return count;
}

/* The first queue family with compute, or UINT32_MAX. */
static uint32_t compute_family(const vk_backend *b, VkPhysicalDevice device) {
  VkQueueFamilyProperties families[32];
  const uint32_t count = queue_families(b, device, families);
  for (uint32_t i = 0; i < count; i++)
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) return i;
  return UINT32_MAX;
}

/* How capable a device is, for the automatic choice: its kind first, then its device-local memory. */
static uint64_t capability(const vk_backend *b, VkPhysicalDevice device) {
  VkPhysicalDeviceProperties p;
  VkPhysicalDeviceMemoryProperties m;
  b->vki.get_properties(device, &p);
  b->vki.get_memory_properties(device, &m);
  uint64_t kind = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU     ? 4
                  : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? 3
                  : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU    ? 2
                  : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU            ? 1
                                                                           : 0;
  uint64_t local = 0;
  for (uint32_t i = 0; i < m.memoryHeapCount; i++)
    if (m.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) local += m.memoryHeaps[i].size;
  return kind << 56 | (local >> 20 & ((1ull << 56) - 1));
}

static kvq_status choose_device(vk_backend *b, const kvq_context_options *options, kvq_availability *availability,
                                char *why, size_t why_size) {
  uint32_t count = 0;
  VkPhysicalDevice devices[16];
  const VkResult counted = b->vki.enumerate_physical_devices(b->instance, &count, NULL);
  if (count > 16) count = 16;
  if (counted != VK_SUCCESS || count == 0 || b->vki.enumerate_physical_devices(b->instance, &count, devices) < 0 ||
      count == 0) {
    *availability = KVQ_UNAVAILABLE_NO_DEVICE;
    snprintf(why, why_size, "vulkan: the loader reports no device");
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  int32_t index = options ? options->device_index : -1;
  if (index >= (int32_t)count) {
    *availability = KVQ_UNAVAILABLE_NO_DEVICE;
    snprintf(why, why_size, "vulkan: device_index %d asked for, but there are %u devices", (int)index, count);
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  if (index < 0) {
    uint64_t best = 0;
    for (uint32_t i = 0; i < count; i++) {
      VkPhysicalDeviceProperties p;
      b->vki.get_properties(devices[i], &p);
      if (p.apiVersion < VK_API_VERSION_1_2 || compute_family(b, devices[i]) == UINT32_MAX) continue;
      uint64_t c = capability(b, devices[i]);
      if (index < 0 || c > best) index = (int32_t)i, best = c;
    }
    if (index < 0) {
      *availability = KVQ_UNAVAILABLE_NO_DEVICE;
      snprintf(why, why_size, "vulkan: no device offers Vulkan 1.2 and a compute queue");
      return KVQ_ERROR_BACKEND_UNAVAILABLE;
    }
  }
  b->physical = devices[index];
  b->vki.get_properties(b->physical, &b->properties);
  if (b->properties.apiVersion < VK_API_VERSION_1_2) {
    *availability = KVQ_UNAVAILABLE_NO_DEVICE;
    snprintf(why, why_size, "vulkan: %s offers Vulkan %u.%u; kvq needs 1.2", b->properties.deviceName,
             VK_API_VERSION_MAJOR(b->properties.apiVersion), VK_API_VERSION_MINOR(b->properties.apiVersion));
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  /* The automatic choice wants a GPU: a CPU implementation (lavapipe) is slower than kvq's own CPU
   * reference, so it is used only when asked for by name. */
  if (options && options->backend == KVQ_BACKEND_AUTO && b->properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) {
    *availability = KVQ_UNAVAILABLE_NO_DEVICE;
    snprintf(why, why_size, "vulkan: the only device is a CPU implementation (%s)", b->properties.deviceName);
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  b->queue_family = compute_family(b, b->physical);
  if (b->queue_family == UINT32_MAX) {
    *availability = KVQ_UNAVAILABLE_NO_DEVICE;
    snprintf(why, why_size, "vulkan: %s has no compute queue", b->properties.deviceName);
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  return KVQ_OK;
}

static kvq_status create_device(vk_backend *b, char *why, size_t why_size) {
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                   .queueFamilyIndex = b->queue_family,
                                   .queueCount = 1,
                                   .pQueuePriorities = &priority};
  VkDeviceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1, .pQueueCreateInfos = &queue};
  VkResult r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vki.create_device(b->physical, &info, NULL, &b->device));
  if (r != VK_SUCCESS) {
    snprintf(why, why_size, "vulkan: vkCreateDevice failed on %s (VkResult %d)", b->properties.deviceName, (int)r);
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  b->owns_device = 1;
  return KVQ_OK;
}

/* The runtime's objects (kvq_vulkan_device). */
static kvq_status adopt_device(vk_backend *b, const kvq_vulkan_device *v, char *why, size_t why_size) {
  if (!v->instance || !v->physical_device || !v->device) {
    snprintf(why, why_size, "vulkan: kvq_vulkan_device needs instance, physical_device and device");
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  b->instance = (VkInstance)v->instance;
  b->physical = (VkPhysicalDevice)v->physical_device;
  b->device = (VkDevice)v->device;
  const char *missing = load_instance_fns(b->instance, &b->vki);
  if (missing) {
    snprintf(why, why_size, "vulkan: the loader gives no %s for the runtime's instance (kvq needs one created for "
                            "Vulkan 1.2 or later through the system's loader, libvulkan.so.1)", missing);
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  b->vki.get_properties(b->physical, &b->properties);
  VkQueueFamilyProperties families[32];
  const uint32_t count = queue_families(b, b->physical, families);
  if (v->queue_family >= count || !(families[v->queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT) ||
      v->queue_index >= families[v->queue_family].queueCount) {
    snprintf(why, why_size, "vulkan: queue family %u, index %u is not a compute queue of %s", v->queue_family,
             v->queue_index, b->properties.deviceName);
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  if (b->properties.apiVersion < VK_API_VERSION_1_2) {
    snprintf(why, why_size, "vulkan: %s offers Vulkan %u.%u; kvq needs 1.2", b->properties.deviceName,
             VK_API_VERSION_MAJOR(b->properties.apiVersion), VK_API_VERSION_MINOR(b->properties.apiVersion));
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  b->queue_family = v->queue_family;
  return KVQ_OK;
}

/* Whether compute shaders may use subgroup arithmetic (Vulkan 1.1 core properties). */
static int subgroup_arithmetic(const vk_backend *b) {
  const char *off = getenv("KVQ_VULKAN_NO_SUBGROUPS");
  if (off && off[0] == '1') return 0;
  VkPhysicalDeviceSubgroupProperties sub = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 props = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sub};
  b->vki.get_properties2(b->physical, &props);
  return (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) && (sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
         (sub.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT);
}

/* What the device can hold (kvq_backend.memory_bytes, max_buffer_bytes), for core's checks before
 * allocation: kvq's buffers are storage buffers of one allocation each, in the device-local heap
 * where there is one (kvq_vk_buffer_make), rounded up to 16 bytes. */
static void device_limits(vk_backend *b) {
  VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceProperties2 props = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
  b->vki.get_properties2(b->physical, &props);
  uint64_t largest = b->properties.limits.maxStorageBufferRange & ~(uint64_t)15;
  if (m3.maxMemoryAllocationSize && m3.maxMemoryAllocationSize < largest) largest = m3.maxMemoryAllocationSize & ~(uint64_t)15;
  uint64_t local = 0, any = 0;
  for (uint32_t i = 0; i < b->memory.memoryHeapCount; i++) {
    const uint64_t size = b->memory.memoryHeaps[i].size;
    if (b->memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) local = size > local ? size : local;
    any = size > any ? size : any;
  }
  b->base.memory_bytes = local ? local : any;
  b->base.max_buffer_bytes = largest;
}

/* How long a fence wait may take before the submission is taken for hung: 120 s (llvmpipe on a loaded
 * 2-core machine, compiling shaders on first use, has taken tens of seconds). The environment variable
 * KVQ_VULKAN_FENCE_TIMEOUT_NS overrides it so that a test can make waits time out. */
static uint64_t fence_timeout_ns(void) {
  const char *v = getenv("KVQ_VULKAN_FENCE_TIMEOUT_NS");
  char *end;
  if (v && *v) {
    const unsigned long long ns = strtoull(v, &end, 10);
    if (*end == '\0') return (uint64_t)ns;
  }
  return 120ull * 1000 * 1000 * 1000;
}

/* A limit from the environment variable `name` (a decimal number) where it is smaller than `limit`
 * and at least `least`, else `limit`: the variable can only shrink it. */
static uint64_t shrunk_limit(const char *name, uint64_t limit, uint64_t least) {
  const char *v = getenv(name);
  char *end;
  if (v && *v) {
    const unsigned long long n = strtoull(v, &end, 10);
    if (*end == '\0' && n >= least && n < limit) return n;
  }
  return limit;
}

/* What one recording may use before it needs more: the staging buffer's bytes and the descriptor
 * sets of one pool (vk.h). For tests only, KVQ_VULKAN_STAGING_BYTES (at least 256, rounded down to
 * 16 bytes, the staging offsets' alignment) and KVQ_VULKAN_DESCRIPTOR_SETS (at least 1) make them
 * smaller, so that small calls outgrow them (tests/test_fault_partial.c); never larger. */
static void resource_limits(vk_backend *b) {
  b->staging_limit = shrunk_limit("KVQ_VULKAN_STAGING_BYTES", KVQ_VK_STAGING_BYTES, 256) / 16 * 16;
  b->sets_limit = (uint32_t)shrunk_limit("KVQ_VULKAN_DESCRIPTOR_SETS", KVQ_VK_SETS_PER_BATCH, 1);
}

/* Command pool and buffer, fence and timestamp queries. */
static kvq_status create_submission(vk_backend *b) {
  VkResult r;
  b->fence_timeout_ns = fence_timeout_ns();
  resource_limits(b);
  VkCommandPoolCreateInfo pool = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .queueFamilyIndex = b->queue_family};
  if ((r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkCreateCommandPool(b->device, &pool, NULL, &b->command_pool))) != VK_SUCCESS)
    return kvq_vk_fail(b, r, "vkCreateCommandPool");
  VkCommandBufferAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                       .commandPool = b->command_pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                       .commandBufferCount = 1};
  if ((r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkAllocateCommandBuffers(b->device, &alloc, &b->cmd))) != VK_SUCCESS)
    return kvq_vk_fail(b, r, "vkAllocateCommandBuffers");
  VkFenceCreateInfo fence = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  if ((r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkCreateFence(b->device, &fence, NULL, &b->fence))) != VK_SUCCESS)
    return kvq_vk_fail(b, r, "vkCreateFence");
  VkQueueFamilyProperties families[32];
  const uint32_t count = queue_families(b, b->physical, families);
  if (b->queue_family < count && families[b->queue_family].timestampValidBits > 0 && b->properties.limits.timestampPeriod > 0) {
    VkQueryPoolCreateInfo q = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 2};
    /* not a failure point (core/fault.h): without the pool the context starts, without device time */
    if (b->vk.vkCreateQueryPool(b->device, &q, NULL, &b->timestamps) == VK_SUCCESS)
      b->timestamp_period = b->properties.limits.timestampPeriod;
  }
  return KVQ_OK;
}

static void vk_destroy(kvq_backend *backend) {
  vk_backend *b = (vk_backend *)backend;
  if (b->device && b->vk.vkDeviceWaitIdle) { /* the table is loaded once the device is known good */
    b->vk.vkDeviceWaitIdle(b->device);
    kvq_vk_free_retired(b);
    kvq_vk_free_spare_stages(b);
    free(b->later);
    kvq_vk_buffer_free(b, b->staging);
    kvq_vk_buffer_free(b, b->metadata);
    kvq_vk_buffer_free(b, b->dummy);
    kvq_vk_buffer_free(b, b->resident);
    kvq_vk_buffer_free(b, b->scratch);
    kvq_vk_pipelines_destroy(b);
    if (b->timestamps) b->vk.vkDestroyQueryPool(b->device, b->timestamps, NULL);
    if (b->fence) b->vk.vkDestroyFence(b->device, b->fence, NULL);
    if (b->command_pool) b->vk.vkDestroyCommandPool(b->device, b->command_pool, NULL);
    if (b->owns_device) b->vk.vkDestroyDevice(b->device, NULL);
  }
  if (b->messenger) b->vki.destroy_messenger(b->instance, b->messenger, NULL);
  if (b->owns_instance) b->vki.destroy_instance(b->instance, NULL);
  free(b);
}

static const kvq_backend_ops vk_ops = {
    .abi_version = KVQ_BACKEND_ABI_VERSION,
    .name = "vulkan",
    .destroy = vk_destroy,
    .supports = kvq_vk_supports,
    .buffer_create = kvq_vk_buffer_create,
    .buffer_destroy = kvq_vk_buffer_destroy,
    .buffer_write = kvq_vk_buffer_write,
    .buffer_read = kvq_vk_buffer_read,
    .buffer_copy = kvq_vk_buffer_copy,
    .buffer_zero = kvq_vk_buffer_zero,
    .quantize = kvq_vk_quantize,
    .dequantize = kvq_vk_dequantize,
    .prepare_queries = kvq_vk_prepare,
    .score = kvq_vk_score,
    .softmax = kvq_vk_softmax,
    .weighted_sum = kvq_vk_weighted_sum,
    .attention = kvq_vk_attention,
    .kmeans_assign = kvq_vk_kmeans_assign,
    .kmeans_update = kvq_vk_kmeans_update,
    .finish = kvq_vk_finish,
    .buffer_import = kvq_vk_buffer_import,
    .device_time = kvq_vk_device_time,
    .stats = kvq_vk_stats,
    .defer = kvq_vk_defer,
    .end_deferred = kvq_vk_end_deferred,
    .convert = kvq_vk_convert,
    .check_tokens = kvq_vk_check_tokens,
    .buffer_read_later = kvq_vk_buffer_read_later,
    .discard = kvq_vk_discard,
    .defer_parts = kvq_vk_defer_parts,
};

kvq_status kvq_vk_backend_create(const kvq_context_options *options, kvq_backend **out, kvq_availability *availability,
                                 char *why, size_t why_size) {
  *out = NULL;
  if (!vulkan_loader()) {
    *availability = KVQ_UNAVAILABLE_NO_LOADER;
    snprintf(why, why_size, "vulkan: no Vulkan loader (libvulkan.so.1) could be opened");
    return KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  vk_backend *b = calloc(1, sizeof *b);
  if (!b) {
    *availability = KVQ_UNAVAILABLE_ERROR;
    snprintf(why, why_size, "vulkan: out of host memory");
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  b->base.ops = &vk_ops;
  b->base.kind = KVQ_BACKEND_VULKAN;
  /* kvq_vk_quantize honours if_clear; attention jobs take core's packed metadata */
  b->base.features = KVQ_BACKEND_IF_CLEAR | KVQ_BACKEND_CORE_META | KVQ_BACKEND_RECORDS | KVQ_BACKEND_WRITE_COPIES;
  kvq_status st;
  if (options && options->vulkan) {
    *availability = KVQ_UNAVAILABLE_ERROR;
    st = adopt_device(b, options->vulkan, why, why_size);
  } else {
    st = create_instance(b, availability, why, why_size);
    if (st == KVQ_OK) st = choose_device(b, options, availability, why, why_size);
    *availability = st == KVQ_OK ? KVQ_UNAVAILABLE_ERROR : *availability;
    if (st == KVQ_OK) st = create_device(b, why, why_size);
  }
  if (st == KVQ_OK) {
    kvq_vk_load_device_table(&b->vk, b->device, b->vki.get_device_proc_addr);
    b->vk.vkGetDeviceQueue(b->device, b->queue_family, options && options->vulkan ? options->vulkan->queue_index : 0,
                           &b->queue);
    b->vki.get_memory_properties(b->physical, &b->memory);
    device_limits(b);
    b->subgroups = subgroup_arithmetic(b);
    st = create_submission(b);
    if (st == KVQ_OK) st = kvq_vk_pipelines_init(b);
    if (st == KVQ_OK) st = kvq_vk_buffer_make(b, b->staging_limit, 1, &b->staging);
    if (st == KVQ_OK) st = kvq_vk_buffer_make(b, 1u << 16, 1, &b->metadata);
    if (st == KVQ_OK) st = kvq_vk_buffer_make(b, 16, 0, &b->dummy);
    if (st != KVQ_OK) snprintf(why, why_size, "%s", b->base.message);
  }
  if (st != KVQ_OK) {
    vk_destroy(&b->base);
    return st == KVQ_ERROR_INVALID_ARGUMENT ? st : KVQ_ERROR_BACKEND_UNAVAILABLE;
  }
  snprintf(b->base.device, sizeof b->base.device, "%.180s (Vulkan %u.%u.%u%s%s)", b->properties.deviceName,
           VK_API_VERSION_MAJOR(b->properties.apiVersion), VK_API_VERSION_MINOR(b->properties.apiVersion),
           VK_API_VERSION_PATCH(b->properties.apiVersion), b->subgroups ? ", subgroups" : "",
           b->owns_device ? "" : ", the runtime's device");
  *availability = KVQ_AVAILABLE;
  *out = &b->base;
  return KVQ_OK;
}
