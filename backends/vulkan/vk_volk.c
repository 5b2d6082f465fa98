/* volk, compiled into kvq (Debian's libvulkan-volk-dev ships its source as /usr/include/volk.c; any include directory will do).
 * Its symbols are hidden like all of kvq's (-fvisibility=hidden), so the host application's own
 * volk or loader function pointers are never touched. Its code is not ours: its warnings are off.
 *
 * kvq uses volk for its VolkDeviceTable and the generated code that fills one, nothing else: none of
 * volk's process-wide pointers (vk.h forbids them), so volkInitialize and volkLoadInstance are never
 * called. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <volk.c>
#pragma GCC diagnostic pop

#include "vk.h"

/* What volkGenLoadDeviceTable passes to its loading function: the device and the instance's
 * vkGetDeviceProcAddr for it. */
typedef struct device_loader {
  VkDevice device;
  PFN_vkGetDeviceProcAddr get_device_proc_addr;
} device_loader;

static PFN_vkVoidFunction load_device_function(void *context, const char *name) {
  const device_loader *loader = context;
  return loader->get_device_proc_addr(loader->device, name);
}

/* volkLoadDeviceTable without its global: the generated filler (static in volk.c, hence here) with
 * the backend's own vkGetDeviceProcAddr. */
void kvq_vk_load_device_table(struct VolkDeviceTable *table, VkDevice device, PFN_vkGetDeviceProcAddr get_device_proc_addr) {
  device_loader loader = {device, get_device_proc_addr};
  volkGenLoadDeviceTable(table, &loader, load_device_function);
}
