/*
 * Buffers of the Vulkan backend. kvq's buffers live in device-local memory where the device has
 * it; the host reaches them through one host-visible staging buffer, in chunks. Operations record
 * into the backend's command buffer; outside a deferred call each is complete when it returns, inside
 * one only reads wait (vk.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk.h"

/* A memory type allowed by `bits` with all of `want`, preferring one with `prefer` too. */
static uint32_t memory_type(const vk_backend *b, uint32_t bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags prefer) {
  for (int pass = 0; pass < 2; pass++)
    for (uint32_t i = 0; i < b->memory.memoryTypeCount; i++) {
      VkMemoryPropertyFlags f = b->memory.memoryTypes[i].propertyFlags;
      if (!(bits & (1u << i)) || (f & want) != want) continue;
      if (pass == 0 && (f & prefer) != prefer) continue;
      return i;
    }
  return UINT32_MAX;
}

kvq_status kvq_vk_check_range(vk_backend *b, const kvq_buffer *buffer, uint64_t offset, uint64_t bytes, const char *what) {
  if (!kvq_buffer_owned(&b->base, buffer))
    return kvq_vk_error(b, KVQ_ERROR_INVALID_ARGUMENT, "%s: a buffer of another backend was handed to the Vulkan backend", what);
  if (!buffer || offset > buffer->size || bytes > buffer->size - offset) {
    return kvq_vk_error(b, KVQ_ERROR_INTERNAL, "%s [%llu, +%llu) lies outside a buffer of %llu bytes",
                        what, (unsigned long long)offset, (unsigned long long)bytes,
                        (unsigned long long)(buffer ? buffer->size : 0));
  }
  return KVQ_OK;
}

void kvq_vk_buffer_free(vk_backend *b, kvq_buffer *buffer) {
  if (!buffer) return;
  kvq_vk_fill_forget(b, buffer);
  if (buffer->mapped) b->vk.vkUnmapMemory(b->device, buffer->memory);
  if (buffer->buffer && !buffer->imported) b->vk.vkDestroyBuffer(b->device, buffer->buffer, NULL);
  if (buffer->memory) b->vk.vkFreeMemory(b->device, buffer->memory, NULL);
  free(buffer);
}

/* A buffer (not yet zeroed): device-local, or host-visible and mapped. Sizes are rounded up to
 * whole words (shaders address words); `size` keeps what was asked for. */
kvq_status kvq_vk_buffer_make(vk_backend *b, uint64_t bytes, int host_visible, kvq_buffer **out) {
  *out = NULL;
  /* (a size near 2^64 saturates instead of wrapping to a small one when rounded up) */
  const uint64_t rounded = bytes < 16 ? 16 : bytes > UINT64_MAX - 15 ? UINT64_MAX : (bytes + 15) / 16 * 16;
  if (rounded > b->properties.limits.maxStorageBufferRange) {
    return kvq_vk_error(b, KVQ_ERROR_DEVICE_MEMORY,
                        "a buffer of %llu bytes exceeds this device's largest storage buffer (maxStorageBufferRange %u)",
                        (unsigned long long)bytes, b->properties.limits.maxStorageBufferRange);
  }
  kvq_buffer *buf = calloc(1, sizeof *buf);
  if (!buf) {
    return kvq_vk_error(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
  }
  buf->base.owner = &b->base;
  buf->size = bytes;
  VkBufferCreateInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                             .size = rounded,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
  VkResult r = KVQ_VK_TRY(KVQ_FAULT_OBJECT, b->vk.vkCreateBuffer(b->device, &info, NULL, &buf->buffer));
  if (r != VK_SUCCESS) {
    kvq_vk_buffer_free(b, buf);
    return kvq_vk_fail(b, r, "vkCreateBuffer");
  }
  VkMemoryRequirements req;
  b->vk.vkGetBufferMemoryRequirements(b->device, buf->buffer, &req);
  const VkMemoryPropertyFlags want =
      host_visible ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT : 0;
  const VkMemoryPropertyFlags prefer = host_visible ? VK_MEMORY_PROPERTY_HOST_CACHED_BIT : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
  const uint32_t type = memory_type(b, req.memoryTypeBits, want, prefer);
  if (type == UINT32_MAX) {
    kvq_vk_buffer_free(b, buf);
    return kvq_vk_error(b, KVQ_ERROR_INTERNAL, "no memory type fits a %s buffer",
                        host_visible ? "host-visible" : "device");
  }
  VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = type};
  if ((r = KVQ_VK_TRY(KVQ_FAULT_DEVICE_ALLOC, b->vk.vkAllocateMemory(b->device, &alloc, NULL, &buf->memory))) != VK_SUCCESS ||
      (r = KVQ_VK_TRY(KVQ_FAULT_DEVICE_ALLOC, b->vk.vkBindBufferMemory(b->device, buf->buffer, buf->memory, 0))) != VK_SUCCESS ||
      (host_visible && (r = KVQ_VK_TRY(KVQ_FAULT_MAP, b->vk.vkMapMemory(b->device, buf->memory, 0, VK_WHOLE_SIZE, 0, &buf->mapped))) != VK_SUCCESS)) {
    kvq_vk_buffer_free(b, buf);
    return kvq_vk_fail(b, r, "allocating buffer memory");
  }
  *out = buf;
  return KVQ_OK;
}

kvq_status kvq_vk_buffer_create(kvq_backend *backend, uint64_t bytes, kvq_buffer **out) {
  vk_backend *b = (vk_backend *)backend;
  kvq_status st = kvq_vk_buffer_make(b, bytes, 0, out);
  if (st != KVQ_OK) return st;
  /* zero-filled by contract: the whole (rounded) buffer, so shaders never read garbage words (recorded
   * again by a later recording when this one does not run: b->unfilled) */
  if ((st = kvq_vk_begin(b)) == KVQ_OK) {
    kvq_vk_fill(b, *out);
    st = kvq_vk_done(b, KVQ_OK);
  }
  if (st != KVQ_OK) {
    kvq_vk_retire(b, *out);
    *out = NULL;
  }
  return st;
}

/* A caller's VkBuffer (kvq_tensor.vk_buffer). Vulkan cannot tell a buffer's size: the caller
 * promises `bytes` (the tensor's span), and the validation layer checks what kvq does with it.
 * It must have been created with STORAGE_BUFFER usage (CONVERT binds it, vk_tensor.c), TRANSFER_SRC
 * usage (inputs) and TRANSFER_DST usage (outputs). */
kvq_status kvq_vk_buffer_import(kvq_backend *backend, const kvq_device_memory *memory, uint64_t bytes, kvq_buffer **out) {
  vk_backend *b = (vk_backend *)backend;
  *out = NULL;
  const uint64_t handle = memory->handle;
  if (memory->kind != KVQ_MEMORY_VULKAN_BUFFER || !handle) {
    return kvq_vk_error(b, KVQ_ERROR_INVALID_ARGUMENT, "only a VkBuffer can be imported");
  }
  kvq_buffer *buf = calloc(1, sizeof *buf);
  if (!buf) {
    return kvq_vk_error(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
  }
  buf->buffer = (VkBuffer)(uintptr_t)handle;
  buf->base.owner = &b->base;
  buf->size = bytes;
  buf->imported = 1;
  *out = buf;
  return KVQ_OK;
}

void kvq_vk_buffer_destroy(kvq_backend *backend, kvq_buffer *buffer) {
  if (!kvq_buffer_owned(backend, buffer)) { /* not ours to free: leave it to its owner */
    kvq_vk_error((vk_backend *)backend, KVQ_ERROR_INVALID_ARGUMENT, "a buffer of another backend was handed to the Vulkan backend");
    return;
  }
  kvq_vk_retire((vk_backend *)backend, buffer); /* recorded work may still use it */
}

static void copy_region(vk_backend *b, kvq_buffer *dst, uint64_t dst_offset, kvq_buffer *src, uint64_t src_offset, uint64_t bytes) {
  VkBufferCopy region = {.srcOffset = src_offset, .dstOffset = dst_offset, .size = bytes};
  b->vk.vkCmdCopyBuffer(b->cmd, src->buffer, dst->buffer, 1, &region);
}

kvq_status kvq_vk_buffer_write(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, const void *src, uint64_t bytes) {
  vk_backend *b = (vk_backend *)backend;
  kvq_status st = kvq_vk_check_range(b, buffer, offset, bytes, "a write");
  for (uint64_t done = 0; st == KVQ_OK && done < bytes;) {
    const uint64_t chunk = bytes - done < b->staging_limit ? bytes - done : b->staging_limit;
    kvq_buffer *stage;
    uint64_t at;
    if ((st = kvq_vk_staging(b, chunk, &stage, &at)) != KVQ_OK) break;
    memcpy((uint8_t *)stage->mapped + at, (const uint8_t *)src + done, (size_t)chunk);
    b->stats.bytes_to_device += chunk;
    copy_region(b, buffer, offset + done, stage, at, chunk);
    kvq_vk_transfer_barrier(b);
    done += chunk;
  }
  return kvq_vk_done(b, st);
}

/* A read without a submission of its own: the copies into the staging buffer are recorded and
 * kvq_vk_wait hands their bytes over (b->later), so a deferred call's reads share its submission. */
kvq_status kvq_vk_buffer_read_later(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, void *dst, uint64_t bytes) {
  vk_backend *b = (vk_backend *)backend;
  kvq_status st = kvq_vk_check_range(b, buffer, offset, bytes, "a read");
  for (uint64_t done = 0; st == KVQ_OK && done < bytes;) {
    const uint64_t chunk = bytes - done < b->staging_limit ? bytes - done : b->staging_limit;
    if (b->later_count == b->later_capacity) { /* before the staging space, which may submit and deliver */
      const uint32_t capacity = b->later_capacity ? 2 * b->later_capacity : 8;
      struct kvq_vk_later *grown = realloc(b->later, sizeof *grown * capacity);
      if (!grown) {
        st = kvq_vk_error(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
        break;
      }
      b->later = grown;
      b->later_capacity = capacity;
    }
    kvq_buffer *stage;
    uint64_t at;
    if ((st = kvq_vk_staging(b, chunk, &stage, &at)) != KVQ_OK) break;
    copy_region(b, stage, at, buffer, offset + done, chunk);
    kvq_vk_transfer_barrier(b);
    b->later[b->later_count++] = (struct kvq_vk_later){(uint8_t *)dst + done, (const uint8_t *)stage->mapped + at, chunk};
    done += chunk;
  }
  if (st != KVQ_OK) /* a failed call writes nothing: the caller may free dst */
    for (uint32_t i = b->later_count; i-- > 0;)
      if ((uint8_t *)b->later[i].dst >= (uint8_t *)dst && (uint8_t *)b->later[i].dst < (uint8_t *)dst + bytes)
        b->later[i] = b->later[--b->later_count];
  return kvq_vk_done(b, st);
}

/* The data must be on the host when it returns: deferred or not, what is recorded is submitted and
 * waited for, and the wait hands the bytes over. */
kvq_status kvq_vk_buffer_read(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, void *dst, uint64_t bytes) {
  kvq_status st = kvq_vk_buffer_read_later(backend, buffer, offset, dst, bytes);
  return st == KVQ_OK ? kvq_vk_submit((vk_backend *)backend) : st;
}

kvq_status kvq_vk_buffer_copy(kvq_backend *backend, kvq_buffer *dst, uint64_t dst_offset, kvq_buffer *src,
                              uint64_t src_offset, uint64_t bytes) {
  vk_backend *b = (vk_backend *)backend;
  kvq_status st = kvq_vk_check_range(b, dst, dst_offset, bytes, "a copy's destination");
  if (st == KVQ_OK) st = kvq_vk_check_range(b, src, src_offset, bytes, "a copy's source");
  if (st != KVQ_OK || bytes == 0) return st;
  const int overlap = dst == src && dst_offset < src_offset + bytes && src_offset < dst_offset + bytes;
  if (!overlap) {
    if ((st = kvq_vk_begin(b)) != KVQ_OK) return st;
    copy_region(b, dst, dst_offset, src, src_offset, bytes);
    kvq_vk_transfer_barrier(b);
    return kvq_vk_done(b, KVQ_OK);
  }
  /* Overlapping ranges of one buffer (Vulkan forbids them in one copy): through the staging buffer,
   * chunk by chunk in the direction memmove would take. */
  const int forward = dst_offset < src_offset;
  for (uint64_t done = 0; st == KVQ_OK && done < bytes;) {
    const uint64_t chunk = bytes - done < b->staging_limit ? bytes - done : b->staging_limit;
    const uint64_t at = forward ? done : bytes - done - chunk;
    kvq_buffer *stage;
    uint64_t through;
    if ((st = kvq_vk_staging(b, chunk, &stage, &through)) != KVQ_OK) break;
    copy_region(b, stage, through, src, src_offset + at, chunk);
    kvq_vk_transfer_barrier(b);
    copy_region(b, dst, dst_offset + at, stage, through, chunk);
    kvq_vk_transfer_barrier(b);
    done += chunk;
  }
  return kvq_vk_done(b, st);
}

kvq_status kvq_vk_buffer_zero(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, uint64_t bytes) {
  vk_backend *b = (vk_backend *)backend;
  kvq_status st = kvq_vk_check_range(b, buffer, offset, bytes, "a zero fill");
  if (st != KVQ_OK || bytes == 0) return st;
  /* vkCmdFillBuffer works on whole words; ragged ends are written from the host */
  static const uint8_t zeros[4];
  const uint64_t head = offset % 4 ? 4 - offset % 4 : 0;
  if (head >= bytes) return kvq_vk_buffer_write(backend, buffer, offset, zeros, bytes);
  if (head && (st = kvq_vk_buffer_write(backend, buffer, offset, zeros, head)) != KVQ_OK) return st;
  const uint64_t words = (bytes - head) / 4 * 4, tail = bytes - head - words;
  if (words) {
    if ((st = kvq_vk_begin(b)) != KVQ_OK) return st;
    b->vk.vkCmdFillBuffer(b->cmd, buffer->buffer, offset + head, words, 0);
    kvq_vk_transfer_barrier(b);
    if ((st = kvq_vk_done(b, KVQ_OK)) != KVQ_OK) return st;
  }
  if (tail) st = kvq_vk_buffer_write(backend, buffer, offset + head + words, zeros, tail);
  return st;
}
