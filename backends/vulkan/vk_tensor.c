/*
 * The CONVERT job (backends/backend.h): caller tensors read and written in place by a compute shader
 * (shaders/tensor_convert.comp), strides, dtype conversion and value checks included, so that a
 * runtime's VkBuffers never travel through host memory.
 */
#include <string.h>

#include "vk.h"

_Static_assert(KVQ_JOB_CONVERT_FINITE == KVQ_CONVERT_CHECK_FINITE && KVQ_JOB_CONVERT_FITS == KVQ_CONVERT_CHECK_FITS &&
                   KVQ_JOB_CONVERT_NO_WRITE == KVQ_CONVERT_NO_WRITE && KVQ_JOB_CONVERT_IF_CLEAR == KVQ_CONVERT_IF_CLEAR &&
                   KVQ_JOB_CONVERT_MASKED == KVQ_CONVERT_MASKED && KVQ_JOB_CHECK_RANGE == KVQ_CHECK_RANGE,
               "the job's check bits are the shader's");


/* The largest element index the place reaches (shape checked non-empty), or UINT64_MAX past 2^32. */
static uint64_t last_element(const uint32_t shape[3], const kvq_tensor_place *p) {
  uint64_t last = p->offset;
  for (int i = 0; i < 3; i++) {
    if (p->strides[i] < 0 || (uint64_t)p->strides[i] > UINT32_MAX) return UINT64_MAX;
    last += (uint64_t)(shape[i] - 1) * (uint64_t)p->strides[i];
  }
  return last;
}

static int plain_words(const kvq_job_convert *job);
static kvq_status copy_words(vk_backend *b, const kvq_job_convert *job, uint64_t words);

kvq_status kvq_vk_convert(kvq_backend *backend, const kvq_job_convert *job) {
  vk_backend *b = (vk_backend *)backend;
  const uint64_t count = (uint64_t)job->shape[0] * job->shape[1] * job->shape[2];
  if (count == 0) return KVQ_OK;
  if (job->src.buffer == job->dst.buffer) return kvq_vk_error(b, KVQ_ERROR_INTERNAL, "a conversion within one buffer");
  if (plain_words(job)) return copy_words(b, job, count);
  const kvq_tensor_place *places[2] = {&job->src, &job->dst};
  uint32_t meta[16] = {job->shape[0], job->shape[1], job->shape[2]};
  kvq_status st = KVQ_OK;
  for (int k = 0; k < 2 && st == KVQ_OK; k++) {
    const kvq_tensor_place *p = places[k];
    const uint64_t last = last_element(job->shape, p);
    if (last >= UINT32_MAX || count > UINT32_MAX)
      return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "a tensor of %llu elements reaching element %llu lies beyond the 2^32 elements kvq's shaders index",
                          (unsigned long long)count, (unsigned long long)last);
    st = kvq_vk_check_range(b, p->buffer, p->offset * kvq_dtype_size(p->dtype), (last + 1 - p->offset) * kvq_dtype_size(p->dtype),
                            k ? "a converted tensor's destination" : "a converted tensor's source");
    meta[8 * k + 3] = (uint32_t)p->offset;
    for (int i = 0; i < 3; i++) meta[8 * k + 4 + i] = (uint32_t)p->strides[i];
  }
  /* the destination words are shared with neighbours (16-bit halves): bits are ORed in atomically */
  if (st == KVQ_OK && job->checks && (!job->flags || job->flag_offset % 4))
    st = kvq_vk_error(b, KVQ_ERROR_INTERNAL, "a checked conversion without an aligned flag word");
  if (st == KVQ_OK && job->checks) st = kvq_vk_check_range(b, job->flags, job->flag_offset, 4, "a conversion's flag word");
  if (st == KVQ_OK && job->src.buffer == job->dst.buffer)
    st = kvq_vk_error(b, KVQ_ERROR_INTERNAL, "a conversion within one buffer");
  uint32_t base = 0;
  if (st == KVQ_OK) st = kvq_vk_metadata(b, meta, sizeof meta, &base);
  if (st != KVQ_OK) return st;
  kvq_push push = {0};
  push.count = (uint32_t)count;
  push.input_dtype = (uint32_t)job->src.dtype;
  push.window_dtype = (uint32_t)job->dst.dtype;
  push.flags = job->checks;
  push.meta = base;
  push.dst_word = job->checks ? (uint32_t)(job->flag_offset / 4) : 0; /* the flag word, in the results binding */
  kvq_buffer *buffers[KVQ_VK_BINDINGS] = {0};
  buffers[KVQ_BINDING_META] = b->metadata;
  buffers[KVQ_BINDING_SRC] = job->src.buffer;
  buffers[KVQ_BINDING_DST] = job->dst.buffer;
  buffers[KVQ_BINDING_RESULTS] = job->checks ? job->flags : NULL;
  st = kvq_vk_dispatch(b, KVQ_VK_SHADER_tensor_convert, &push, buffers, count);
  return kvq_vk_done(b, st);
}

/* The range checks of tokens gathered on the device (shaders/token_check.comp): one invocation per
 * (token, kv head) vector. */
kvq_status kvq_vk_check_tokens(kvq_backend *backend, const kvq_job_token_check *job) {
  vk_backend *b = (vk_backend *)backend;
  const kvq_side_layout *s = &job->side->layout;
  const uint64_t esize = kvq_dtype_size(job->dtype), vectors = (uint64_t)job->count * s->kv_heads;
  if (vectors == 0) return KVQ_OK;
  kvq_status st = kvq_vk_check_range(b, job->src, job->src_offset, vectors * s->head_dim * esize, "the tokens to check");
  if (st == KVQ_OK) st = kvq_vk_check_range(b, job->flags, job->flag_offset, 4, "a token check's flag word");
  if (st == KVQ_OK && (job->src_offset % esize || job->flag_offset % 4))
    st = kvq_vk_error(b, KVQ_ERROR_INTERNAL, "a token check of misaligned tokens or flag word");
  if (st == KVQ_OK && job->src_offset / esize + vectors * s->head_dim > UINT32_MAX)
    st = kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "tokens to check lie beyond the 2^32 elements kvq's shaders index");
  if (st != KVQ_OK) return st;
  kvq_push push = {0};
  kvq_vk_push_side(&push, job->side);
  push.input_dtype = (uint32_t)job->dtype;
  push.count = (uint32_t)vectors;
  push.src_word = (uint32_t)(job->src_offset / esize); /* an element index */
  push.dst_word = (uint32_t)(job->flag_offset / 4);
  kvq_buffer *buffers[KVQ_VK_BINDINGS] = {0};
  buffers[KVQ_BINDING_SRC] = job->src;
  buffers[KVQ_BINDING_RESULTS] = job->flags;
  st = kvq_vk_dispatch(b, KVQ_VK_SHADER_token_check, &push, buffers, vectors);
  return kvq_vk_done(b, st);
}

kvq_status kvq_vk_if_clear(vk_backend *b, kvq_push *push, kvq_buffer *buffers[KVQ_VK_BINDINGS], kvq_buffer *flags,
                           uint64_t flag_offset) {
  if (!flags) return KVQ_OK;
  kvq_status st = kvq_vk_check_range(b, flags, flag_offset, 4, "a check word");
  if (st == KVQ_OK && (flag_offset % 4 || flag_offset / 4 > UINT32_MAX))
    st = kvq_vk_error(b, KVQ_ERROR_INTERNAL, "a check word at byte %llu", (unsigned long long)flag_offset);
  if (st != KVQ_OK) return st;
  push->flags |= KVQ_PUSH_IF_CLEAR;
  push->check_word = (uint32_t)(flag_offset / 4);
  buffers[KVQ_BINDING_RESULTS] = flags;
  return KVQ_OK;
}

/* A CONVERT that is a plain copy of packed 32-bit words (fp32 to fp32, contiguous, no checks but
 * IF_CLEAR: the window writes and page clearing an append records behind its checks, core/append.c)
 * runs as COPY_WORDS (shaders/copy_words.comp), whose push constants say everything: no metadata
 * crosses to the device. One invocation per word. */
static int plain_words(const kvq_job_convert *job) {
  const kvq_tensor_place *places[2] = {&job->src, &job->dst};
  if ((job->checks & ~(uint32_t)KVQ_JOB_CONVERT_IF_CLEAR) != 0) return 0;
  for (int k = 0; k < 2; k++) {
    const kvq_tensor_place *p = places[k];
    if (p->dtype != KVQ_DTYPE_F32 || p->strides[2] != 1 || p->strides[1] != (int64_t)job->shape[2] ||
        p->strides[0] != (int64_t)job->shape[1] * job->shape[2])
      return 0;
  }
  return 1;
}

static kvq_status copy_words(vk_backend *b, const kvq_job_convert *job, uint64_t words) {
  kvq_status st = KVQ_OK;
  for (int k = 0; k < 2 && st == KVQ_OK; k++) {
    const kvq_tensor_place *p = k ? &job->dst : &job->src;
    if (p->offset + words >= UINT32_MAX)
      return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "a copy lies beyond the 2^32 words kvq's shaders index");
    st = kvq_vk_check_range(b, p->buffer, p->offset * 4, words * 4, k ? "a copy's destination" : "a copy's source");
  }
  kvq_push push = {0};
  kvq_buffer *buffers[KVQ_VK_BINDINGS] = {0};
  if (st == KVQ_OK && (job->checks & KVQ_JOB_CONVERT_IF_CLEAR))
    st = kvq_vk_if_clear(b, &push, buffers, job->flags, job->flag_offset);
  if (st != KVQ_OK) return st;
  push.count = (uint32_t)words;
  push.src_word = (uint32_t)job->src.offset;
  push.dst_word = (uint32_t)job->dst.offset;
  buffers[KVQ_BINDING_SRC] = job->src.buffer;
  buffers[KVQ_BINDING_DST] = job->dst.buffer;
  st = kvq_vk_dispatch(b, KVQ_VK_SHADER_copy_words, &push, buffers, words);
  return kvq_vk_done(b, st);
}
