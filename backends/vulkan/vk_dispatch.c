/*
 * Pipelines and submission. Every shader shares one pipeline layout: eight storage buffers
 * (shaders/common.glsl) and the push constants of shaders/push.h. Pipelines are created on first
 * use through a VkPipelineCache. Jobs record dispatches between kvq_vk_begin and kvq_vk_submit; a
 * barrier follows every dispatch and transfer, so later work may depend on earlier work. When and how
 * often a recording is submitted: vk.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk.h"
#include "vk_shader_includes.h"

typedef struct shader_code {
  const char *name;
  const uint32_t *words;
  size_t bytes;
} shader_code;

static const shader_code shader_table[KVQ_VK_SHADER_COUNT] = {
#define KVQ_VK_SHADER_CODE(name) {#name, kvq_spv_##name, sizeof kvq_spv_##name},
    KVQ_VK_SHADERS(KVQ_VK_SHADER_CODE)
#undef KVQ_VK_SHADER_CODE
};

/* One more descriptor pool of b->sets_limit sets at the end of the chain (b->pools). */
static kvq_status grow_pools(vk_backend *b) {
  VkDescriptorPool *grown = realloc(b->pools, sizeof *grown * (b->pool_count + 1));
  if (!grown) return kvq_vk_error(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
  b->pools = grown;
  VkDescriptorPoolSize size = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = b->sets_limit * KVQ_VK_BINDINGS};
  VkDescriptorPoolCreateInfo pool = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                     .maxSets = b->sets_limit,
                                     .poolSizeCount = 1,
                                     .pPoolSizes = &size};
  VkResult r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkCreateDescriptorPool(b->device, &pool, NULL, &b->pools[b->pool_count]));
  if (r != VK_SUCCESS) return kvq_vk_fail(b, r, "vkCreateDescriptorPool");
  b->pool_count++;
  return KVQ_OK;
}

kvq_status kvq_vk_pipelines_init(vk_backend *b) {
  VkResult r;
  if (sizeof(kvq_push) > b->properties.limits.maxPushConstantsSize) {
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "kvq needs %u bytes of push constants, the device offers %u",
                        (unsigned)sizeof(kvq_push), b->properties.limits.maxPushConstantsSize);
  }
  VkDescriptorSetLayoutBinding bindings[KVQ_VK_BINDINGS];
  for (uint32_t i = 0; i < KVQ_VK_BINDINGS; i++)
    bindings[i] = (VkDescriptorSetLayoutBinding){.binding = i,
                                                 .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                 .descriptorCount = 1,
                                                 .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
  VkDescriptorSetLayoutCreateInfo set = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                         .bindingCount = KVQ_VK_BINDINGS,
                                         .pBindings = bindings};
  if ((r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkCreateDescriptorSetLayout(b->device, &set, NULL, &b->set_layout))) != VK_SUCCESS)
    return kvq_vk_fail(b, r, "vkCreateDescriptorSetLayout");
  VkPushConstantRange range = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = sizeof(kvq_push)};
  VkPipelineLayoutCreateInfo layout = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                       .setLayoutCount = 1,
                                       .pSetLayouts = &b->set_layout,
                                       .pushConstantRangeCount = 1,
                                       .pPushConstantRanges = &range};
  if ((r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkCreatePipelineLayout(b->device, &layout, NULL, &b->pipeline_layout))) != VK_SUCCESS)
    return kvq_vk_fail(b, r, "vkCreatePipelineLayout");
  kvq_status st = grow_pools(b);
  if (st != KVQ_OK) return st;
  VkPipelineCacheCreateInfo cache = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  if ((r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkCreatePipelineCache(b->device, &cache, NULL, &b->pipeline_cache))) != VK_SUCCESS)
    return kvq_vk_fail(b, r, "vkCreatePipelineCache");
  return KVQ_OK;
}

void kvq_vk_pipelines_destroy(vk_backend *b) {
  for (int i = 0; i < KVQ_VK_SHADER_COUNT; i++) {
    if (b->pipelines[i]) b->vk.vkDestroyPipeline(b->device, b->pipelines[i], NULL);
    if (b->modules[i]) b->vk.vkDestroyShaderModule(b->device, b->modules[i], NULL);
  }
  if (b->pipeline_cache) b->vk.vkDestroyPipelineCache(b->device, b->pipeline_cache, NULL);
  for (uint32_t i = 0; i < b->pool_count; i++) b->vk.vkDestroyDescriptorPool(b->device, b->pools[i], NULL);
  free(b->pools);
  b->pools = NULL;
  b->pool_count = 0;
  if (b->pipeline_layout) b->vk.vkDestroyPipelineLayout(b->device, b->pipeline_layout, NULL);
  if (b->set_layout) b->vk.vkDestroyDescriptorSetLayout(b->device, b->set_layout, NULL);
}

static kvq_status pipeline(vk_backend *b, kvq_vk_shader shader, VkPipeline *out) {
  if (!b->pipelines[shader]) {
    VkResult r;
    const shader_code *code = &shader_table[shader];
    VkShaderModuleCreateInfo module = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = code->bytes, .pCode = code->words};
    if (!b->modules[shader] && (r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkCreateShaderModule(b->device, &module, NULL, &b->modules[shader]))) != VK_SUCCESS)
      return kvq_vk_fail(b, r, "vkCreateShaderModule");
    VkComputePipelineCreateInfo info = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                                        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                                                  .module = b->modules[shader],
                                                  .pName = "main"},
                                        .layout = b->pipeline_layout};
    if ((r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkCreateComputePipelines(b->device, b->pipeline_cache, 1, &info, NULL, &b->pipelines[shader]))) != VK_SUCCESS) {
      b->pipelines[shader] = VK_NULL_HANDLE;
      char what[96];
      snprintf(what, sizeof what, "creating the %s pipeline", code->name);
      return kvq_vk_fail(b, r, what);
    }
  }
  *out = b->pipelines[shader];
  return KVQ_OK;
}

static void barrier(vk_backend *b, VkPipelineStageFlags from, VkPipelineStageFlags to) {
  VkMemoryBarrier m = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                       .srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT,
                       .dstAccessMask = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT};
  b->vk.vkCmdPipelineBarrier(b->cmd, from, to, 0, 1, &m, 0, NULL, 0, NULL);
}

void kvq_vk_transfer_barrier(vk_backend *b) {
  barrier(b, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT);
}

void kvq_vk_retire(vk_backend *b, kvq_buffer *buffer) {
  if (!buffer) return;
  if (b->recording || b->in_flight) { /* a list through the buffer: nothing to allocate, nothing to submit */
    buffer->next_retired = b->retired;
    b->retired = buffer;
    return;
  }
  kvq_vk_buffer_free(b, buffer);
}

void kvq_vk_fill(vk_backend *b, kvq_buffer *buffer) {
  b->vk.vkCmdFillBuffer(b->cmd, buffer->buffer, 0, VK_WHOLE_SIZE, 0);
  kvq_vk_transfer_barrier(b);
  if (buffer->unfilled) return;
  buffer->unfilled = 1;
  buffer->next_unfilled = b->unfilled;
  b->unfilled = buffer;
}

void kvq_vk_fill_forget(vk_backend *b, kvq_buffer *buffer) {
  if (!buffer->unfilled) return;
  for (kvq_buffer **at = &b->unfilled; *at; at = &(*at)->next_unfilled)
    if (*at == buffer) {
      *at = buffer->next_unfilled;
      break;
    }
  buffer->unfilled = 0;
  buffer->next_unfilled = NULL;
}

/* A submission took every recorded zero fill (the fence orders them before later work). */
static void fills_submitted(vk_backend *b) {
  while (b->unfilled) {
    kvq_buffer *u = b->unfilled;
    b->unfilled = u->next_unfilled;
    u->unfilled = 0;
    u->next_unfilled = NULL;
  }
}

/* Frees the retired buffers (the device is done with them). */
void kvq_vk_free_retired(vk_backend *b) {
  while (b->retired) {
    kvq_buffer *r = b->retired;
    b->retired = r->next_retired;
    if (r->overflow_stage && b->spare_stage_count < KVQ_VK_SPARE_STAGES) {
      r->next_retired = b->spare_stages;
      b->spare_stages = r;
      b->spare_stage_count++;
    } else {
      kvq_vk_buffer_free(b, r);
    }
  }
}

void kvq_vk_free_spare_stages(vk_backend *b) {
  while (b->spare_stages) {
    kvq_buffer *r = b->spare_stages;
    b->spare_stages = r->next_retired;
    kvq_vk_buffer_free(b, r);
  }
  b->spare_stage_count = 0;
}

/* Once a submission is done (or failed to start): its command buffer, descriptor sets (every pool of
 * the chain it used), overflow staging and the buffers retired while it was recorded or in flight
 * are released. */
static void release_submission(vk_backend *b) {
  b->vk.vkResetCommandPool(b->device, b->command_pool, 0);
  for (uint32_t i = 0; i <= b->pool_at && i < b->pool_count; i++) b->vk.vkResetDescriptorPool(b->device, b->pools[i], 0);
  b->pool_at = 0;
  b->sets_used = 0;
  b->bound_set = VK_NULL_HANDLE;
  kvq_vk_free_retired(b);
  b->stage = b->staging;
  b->staging_used = 0;
  b->later_count = 0; /* delivered by kvq_vk_wait, or dropped with a submission that failed */
}

kvq_status kvq_vk_wait(vk_backend *b) {
  if (b->lost)
    return kvq_vk_error(b, KVQ_ERROR_DEVICE_LOST,
                        "vulkan: an earlier submission did not finish (device lost or timed out); destroy the context");
  if (!b->in_flight) return KVQ_OK;
  b->stats.waits++;
  VkResult r = KVQ_VK_TRY(KVQ_FAULT_WAIT, b->vk.vkWaitForFences(b->device, 1, &b->fence, VK_TRUE, b->fence_timeout_ns));
  if (r != VK_SUCCESS) {
    /* The command buffer may still be pending: resetting its pool, its fence or the descriptor sets,
     * or freeing the buffers retired behind it, would pull them from under the device. Keep them all
     * (in_flight stays set, so retired buffers keep waiting too) until vk_destroy waits for the device. */
    b->lost = 1;
    return kvq_vk_fail(b, r, "waiting for the device");
  }
  b->in_flight = 0;
  b->vk.vkResetFences(b->device, 1, &b->fence);
  /* buffer_read_later's bytes: in the staging buffer now, reused by the next recording */
  for (uint32_t i = 0; i < b->later_count; i++) {
    const struct kvq_vk_later *l = &b->later[i];
    memcpy(l->dst, l->src, (size_t)l->bytes);
    b->stats.bytes_to_host += l->bytes;
  }
  release_submission(b);
  if (b->timestamps) {
    uint64_t ticks[2];
    if (b->vk.vkGetQueryPoolResults(b->device, b->timestamps, 0, 2, sizeof ticks, ticks, sizeof ticks[0],
                                    VK_QUERY_RESULT_64_BIT) == VK_SUCCESS)
      b->device_ns += (uint64_t)((double)(ticks[1] - ticks[0]) * b->timestamp_period);
  }
  return kvq_vk_check_validation(b);
}

kvq_status kvq_vk_begin(vk_backend *b) {
  if (b->recording) return KVQ_OK;
  kvq_status st = kvq_vk_wait(b); /* one command buffer: the previous submission must be done */
  if (st != KVQ_OK) return st;
  VkCommandBufferBeginInfo info = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
  VkResult r = KVQ_VK_TRY(KVQ_FAULT_LAUNCH, b->vk.vkBeginCommandBuffer(b->cmd, &info));
  if (r != VK_SUCCESS) return kvq_vk_fail(b, r, "vkBeginCommandBuffer");
  b->recording = 1;
  b->stage = b->staging;
  b->staging_used = b->metadata_used = 0;
  b->resident_recorded = 0;
  if (b->timestamps) {
    b->vk.vkCmdResetQueryPool(b->cmd, b->timestamps, 0, 2);
    b->vk.vkCmdWriteTimestamp(b->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, b->timestamps, 0);
  }
  /* what earlier submissions wrote is visible to this one (a fence wait alone orders the host only) */
  barrier(b, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT);
  /* the zero fills of buffers created while a recording that never ran was recorded */
  for (kvq_buffer *u = b->unfilled; u; u = u->next_unfilled) b->vk.vkCmdFillBuffer(b->cmd, u->buffer, 0, VK_WHOLE_SIZE, 0);
  if (b->unfilled) kvq_vk_transfer_barrier(b);
  return KVQ_OK;
}

kvq_status kvq_vk_submit_nowait(vk_backend *b) {
  if (!b->recording) return KVQ_OK;
  b->recording = 0;
  if (b->timestamps) b->vk.vkCmdWriteTimestamp(b->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, b->timestamps, 1);
  /* host reads of staging memory after the fence see what transfers wrote */
  VkMemoryBarrier host = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
  b->vk.vkCmdPipelineBarrier(b->cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &host, 0, NULL, 0,
                             NULL);
  VkResult r = KVQ_VK_TRY(KVQ_FAULT_LAUNCH, b->vk.vkEndCommandBuffer(b->cmd));
  VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &b->cmd};
  const char *what = "vkEndCommandBuffer";
  if (r == VK_SUCCESS) {
    what = "vkQueueSubmit";
    r = KVQ_VK_TRY(KVQ_FAULT_SUBMIT, b->vk.vkQueueSubmit(b->queue, 1, &submit, b->fence));
    b->stats.submissions++;
  }
  if (r != VK_SUCCESS) { /* nothing is in flight: the pools start over (the zero fills wait on b->unfilled) */
    release_submission(b);
    return kvq_vk_fail(b, r, what);
  }
  b->in_flight = 1;
  fills_submitted(b);
  return KVQ_OK;
}

kvq_status kvq_vk_submit(vk_backend *b) {
  kvq_status st = kvq_vk_submit_nowait(b);
  kvq_status waited = kvq_vk_wait(b);
  return st == KVQ_OK ? waited : st;
}

kvq_status kvq_vk_done(vk_backend *b, kvq_status st) {
  if (b->deferring) return st;
  kvq_status submitted = kvq_vk_submit(b);
  return st == KVQ_OK ? submitted : st;
}

void kvq_vk_defer(kvq_backend *backend) {
  vk_backend *b = (vk_backend *)backend;
  b->deferring = 1;
  b->in_parts = 0;
}

void kvq_vk_defer_parts(kvq_backend *backend) {
  vk_backend *b = (vk_backend *)backend;
  b->deferring = 1;
  b->in_parts = 1;
}

kvq_status kvq_vk_end_deferred(kvq_backend *backend, int wait) {
  vk_backend *b = (vk_backend *)backend;
  b->deferring = 0;
  b->in_parts = 0;
  return wait ? kvq_vk_submit(b) : kvq_vk_submit_nowait(b);
}

/* What the recording holds is dropped as a failed submission drops it (release_submission): the
 * command buffer back to its initial state, its descriptor sets and retired buffers released, its
 * later reads forgotten, the zero fills it held left on b->unfilled for the next recording. Host
 * writes it made into the metadata, resident and staging buffers need no undoing: the next recording
 * starts their rings over, and the resident buffer holds the image its serial names (vk.h). */
void kvq_vk_discard(kvq_backend *backend) {
  vk_backend *b = (vk_backend *)backend;
  if (!b->recording) return;
  b->recording = 0;
  release_submission(b);
}

kvq_status kvq_vk_staging(vk_backend *b, uint64_t bytes, kvq_buffer **buffer, uint64_t *offset) {
  kvq_status st;
  if (bytes > b->staging_limit) return kvq_vk_error(b, KVQ_ERROR_INTERNAL, "%llu bytes of staging asked for at once", (unsigned long long)bytes);
  if (b->recording && b->staging_used + bytes > b->staging_limit) {
    if (b->deferring && !b->in_parts) {
      /* A call that must not submit part way (a failed call drops its whole recording): an overflow
       * buffer for the rest of it, freed once its submission is done or dropped. */
      kvq_buffer *overflow = b->spare_stages;
      if (overflow) { /* one the device is done with (kvq_vk_free_retired) */
        b->spare_stages = overflow->next_retired;
        b->spare_stage_count--;
      } else {
        if ((st = kvq_vk_buffer_make(b, b->staging_limit, 1, &overflow)) != KVQ_OK) return st;
        overflow->overflow_stage = 1;
        b->stats.staging_allocations++;
      }
      kvq_vk_retire(b, overflow);
      b->stage = overflow;
      b->staging_used = 0;
      b->stats.staging_overflows++;
    } else if ((st = kvq_vk_submit(b)) != KVQ_OK) {
      return st;
    }
  }
  if ((st = kvq_vk_begin(b)) != KVQ_OK) return st;
  *buffer = b->stage;
  *offset = b->staging_used;
  b->staging_used += (bytes + 15) / 16 * 16;
  return KVQ_OK;
}

kvq_status kvq_vk_finish(kvq_backend *backend) {
  vk_backend *b = (vk_backend *)backend;
  return kvq_vk_submit(b);
}

void kvq_vk_stats(kvq_backend *backend, kvq_backend_stats *out, int reset) {
  vk_backend *b = (vk_backend *)backend;
  if (out) *out = b->stats;
  if (reset) memset(&b->stats, 0, sizeof b->stats);
}

kvq_status kvq_vk_device_time(kvq_backend *backend, uint64_t *ns) {
  vk_backend *b = (vk_backend *)backend;
  if (!b->timestamps) {
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "the queue has no timestamps");
  }
  *ns = b->device_ns;
  b->device_ns = 0;
  return KVQ_OK;
}

/* A descriptor set for these buffers, bound in a recording command buffer. */
static kvq_status bind_buffers(vk_backend *b, const VkBuffer handles[KVQ_VK_BINDINGS]) {
  kvq_status st;
  if ((st = kvq_vk_begin(b)) != KVQ_OK) return st; /* (waiting for work in flight resets the pool) */
  if (b->sets_used == b->sets_limit) {
    /* the pool is spent: the next of the chain (made now the first time), not a submission, so that
     * a failed call still drops everything it recorded */
    if (b->pool_at + 1 == b->pool_count && (st = grow_pools(b)) != KVQ_OK) return st;
    b->pool_at++;
    b->sets_used = 0;
    b->stats.pool_steps++;
  }
  VkDescriptorSetAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                       .descriptorPool = b->pools[b->pool_at],
                                       .descriptorSetCount = 1,
                                       .pSetLayouts = &b->set_layout};
  VkDescriptorSet set;
  VkResult r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkAllocateDescriptorSets(b->device, &alloc, &set));
  if (r != VK_SUCCESS) return kvq_vk_fail(b, r, "vkAllocateDescriptorSets");
  b->sets_used++;
  VkDescriptorBufferInfo infos[KVQ_VK_BINDINGS];
  VkWriteDescriptorSet writes[KVQ_VK_BINDINGS];
  for (uint32_t i = 0; i < KVQ_VK_BINDINGS; i++) {
    infos[i] = (VkDescriptorBufferInfo){.buffer = handles[i], .offset = 0, .range = VK_WHOLE_SIZE};
    writes[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                       .dstSet = set,
                                       .dstBinding = i,
                                       .descriptorCount = 1,
                                       .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       .pBufferInfo = &infos[i]};
  }
  b->vk.vkUpdateDescriptorSets(b->device, KVQ_VK_BINDINGS, writes, 0, NULL);
  b->vk.vkCmdBindDescriptorSets(b->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, b->pipeline_layout, 0, 1, &set, 0, NULL);
  b->bound_set = set;
  memcpy(b->bound, handles, sizeof b->bound);
  return KVQ_OK;
}

kvq_status kvq_vk_dispatch(vk_backend *b, kvq_vk_shader shader, const kvq_push *push,
                           kvq_buffer *const buffers[KVQ_VK_BINDINGS], uint64_t invocations) {
  if (invocations == 0) return KVQ_OK;
  if (!kvq_buffers_owned(&b->base, NULL, buffers, KVQ_VK_BINDINGS))
    return kvq_vk_error(b, KVQ_ERROR_INVALID_ARGUMENT, "a buffer of another backend was bound to a Vulkan job");
  /* workgroups of KVQ_GPU_GROUP_SIZE in a grid of x by y (x at most 65535, the least every device
   * offers); shaders fold the grid back into one index (kvq_invocation) and ignore the excess */
  const uint64_t groups = (invocations + KVQ_GPU_GROUP_SIZE - 1) / KVQ_GPU_GROUP_SIZE;
  const uint32_t groups_x = groups < 65535 ? (uint32_t)groups : 65535;
  const uint64_t groups_y = (groups + groups_x - 1) / groups_x;
  if (groups_y > b->properties.limits.maxComputeWorkGroupCount[1] || invocations > UINT32_MAX) {
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "a dispatch of %llu invocations is larger than kvq's shaders index",
                        (unsigned long long)invocations);
  }
  VkPipeline p = VK_NULL_HANDLE;
  kvq_status st = pipeline(b, shader, &p);
  if (st != KVQ_OK) return st;
  VkBuffer handles[KVQ_VK_BINDINGS];
  for (uint32_t i = 0; i < KVQ_VK_BINDINGS; i++) handles[i] = (buffers[i] ? buffers[i] : b->dummy)->buffer;
  if (!b->bound_set || memcmp(handles, b->bound, sizeof handles) != 0) {
    if ((st = bind_buffers(b, handles)) != KVQ_OK) return st;
  }
  b->vk.vkCmdBindPipeline(b->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p);
  b->vk.vkCmdPushConstants(b->cmd, b->pipeline_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof *push, push);
  b->vk.vkCmdDispatch(b->cmd, groups_x, (uint32_t)groups_y, 1);
  barrier(b, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT);
  return KVQ_OK;
}

kvq_status kvq_vk_metadata(vk_backend *b, const void *data, uint64_t bytes, uint32_t *word_offset) {
  /* after the recording's earlier arrays, in a buffer no submission in flight reads */
  kvq_status st = kvq_vk_begin(b);
  if (st != KVQ_OK) return st;
  const uint64_t at = (b->metadata_used + 15) / 16 * 16;
  if (at + bytes > b->metadata->size || at / 4 > UINT32_MAX - bytes / 4) {
    kvq_buffer *grown;
    const uint64_t size = bytes > b->metadata->size ? bytes + bytes / 2 : 2 * b->metadata->size;
    if ((st = kvq_vk_buffer_make(b, size, 1, &grown)) != KVQ_OK) return st;
    kvq_vk_retire(b, b->metadata); /* dispatches recorded before bound the old one */
    b->metadata = grown;
    b->metadata_used = 0;
    return kvq_vk_metadata(b, data, bytes, word_offset);
  }
  memcpy((uint8_t *)b->metadata->mapped + at, data, (size_t)bytes);
  b->stats.bytes_to_device += bytes;
  b->metadata_used = at + bytes;
  *word_offset = (uint32_t)(at / 4);
  return KVQ_OK;
}

kvq_status kvq_vk_metadata_resident(vk_backend *b, const kvq_attention_meta *meta, uint32_t *word_offset, kvq_buffer **buffer) {
  kvq_status st = kvq_vk_begin(b); /* waits for work in flight, which may read the resident words */
  if (st != KVQ_OK) return st;
  const uint64_t count = meta->count;
  if (b->resident_recorded && b->resident_serial != meta->serial) { /* recorded jobs read another image */
    b->resident_serial = 0; /* the resident buffer misses this image's changes: the next goes whole */
    *buffer = b->metadata;
    return kvq_vk_metadata(b, meta->words, count * 4, word_offset);
  }
  if (count > b->resident_capacity) {
    kvq_buffer *grown;
    const uint64_t capacity = count + count / 2 + 64;
    if ((st = kvq_vk_buffer_make(b, capacity * 4, 1, &grown)) != KVQ_OK) return st;
    kvq_vk_retire(b, b->resident);
    b->resident = grown;
    b->resident_capacity = capacity;
    b->resident_serial = 0;
  }
  uint32_t *device = b->resident->mapped;
  if (b->resident_serial == meta->serial) {
    /* the image is on the device already (a job of the same batch) */
  } else if (meta->whole || b->resident_serial == 0 || b->resident_serial + 1 != meta->serial) {
    memcpy(device, meta->words, count * 4);
    b->stats.bytes_to_device += count * 4;
  } else { /* the previous image is there: only what changed since crosses to the device */
    for (uint32_t r = 0; r < meta->changed_count; r++) {
      const kvq_meta_range *range = &meta->changed[r];
      memcpy(device + range->first, meta->words + range->first, (size_t)range->count * 4);
      b->stats.bytes_to_device += (uint64_t)range->count * 4;
    }
  }
  b->resident_serial = meta->serial;
  b->resident_recorded = 1;
  *word_offset = 0;
  *buffer = b->resident;
  return KVQ_OK;
}

kvq_status kvq_vk_scratch(vk_backend *b, uint64_t bytes, kvq_buffer **out) {
  if (!b->scratch || bytes > b->scratch->size) {
    kvq_buffer *grown;
    kvq_status st = kvq_vk_buffer_make(b, bytes + bytes / 2, 0, &grown);
    if (st != KVQ_OK) return st;
    kvq_vk_retire(b, b->scratch); /* dispatches recorded before bound the old one */
    b->scratch = grown;
  }
  *out = b->scratch;
  return KVQ_OK;
}

void kvq_vk_bind_side(kvq_buffer *buffers[KVQ_VK_BINDINGS], vk_backend *b, const kvq_side_desc *side, kvq_buffer *pages,
                      kvq_buffer *ring) {
  memset(buffers, 0, sizeof(kvq_buffer *) * KVQ_VK_BINDINGS);
  buffers[KVQ_BINDING_META] = b->metadata;
  buffers[KVQ_BINDING_PAGES] = pages;
  buffers[KVQ_BINDING_FIXED0] = side->fixed[0];
  buffers[KVQ_BINDING_FIXED1] = side->fixed[1];
  buffers[KVQ_BINDING_RING] = ring;
}
