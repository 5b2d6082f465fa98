/* The Vulkan backend's one entry point, for backends/registry.c (which must not see vk.h: every
 * backend defines its own struct kvq_buffer). */
#ifndef KVQ_BACKENDS_VULKAN_VK_CREATE_H
#define KVQ_BACKENDS_VULKAN_VK_CREATE_H

#include "backends/backend.h"

/* Starts the backend on the device `options` ask for (kvq_context_options: device_index, vulkan),
 * or says in `why` and `availability` why it cannot. */
kvq_status kvq_vk_backend_create(const kvq_context_options *options, kvq_backend **out, kvq_availability *availability,
                                 char *why, size_t why_size);

#endif
