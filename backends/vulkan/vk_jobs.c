/*
 * The Vulkan backend's jobs: each checks its buffers, copies its host arrays into the metadata
 * buffer, records its dispatches and submits them. Shader variants are chosen per method; methods
 * without shader code are refused by supports(), so a cache never reaches a job it cannot run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/layout.h"
#include "shaders/work_units.h"
#include "vk.h"

static int method_has_shaders(uint32_t method) { return KVQ_VK_VARIANT(quantize, method) != KVQ_VK_SHADER_COUNT; }

int kvq_vk_supports(const kvq_backend *backend, kvq_job_kind kind, const kvq_side_layout *keys,
                    const kvq_side_layout *values) {
  (void)backend;
  if (kind == KVQ_JOB_KMEANS_ASSIGN || kind == KVQ_JOB_KMEANS_UPDATE) return 1; /* vk_kmeans.c */
  return (!keys || method_has_shaders(keys->method)) && (!values || method_has_shaders(values->method));
}

static kvq_status unsupported(vk_backend *b, const char *job, uint32_t method) {
  return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "no %s shader for layout method %u", job, method);
}

/* Offsets the shaders address in 32-bit indices must fit them. */
static kvq_status too_large(vk_backend *b, const char *what) {
  return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "%s lies beyond the 4 GiB kvq's shaders address", what);
}

void kvq_vk_push_side(kvq_push *push, const kvq_side_desc *side) {
  const kvq_side_layout *s = &side->layout;
#define KVQ_PUSH_SIDE_FIELD(name) push->name = s->name;
  KVQ_SIDE_FIELDS(KVQ_PUSH_SIDE_FIELD)
#undef KVQ_PUSH_SIDE_FIELD
  push->head_words = s->head_bytes / 4;
  float constant = (float)side->qjl_constant;
  memcpy(&push->constant_bits, &constant, 4);
}

/* Whether the shaders find a head block's kv head from its offset in the pool (per-head fixed data:
 * learned PolarQuant tables, CQ codebooks): that holds for pages at whole multiples of page_bytes,
 * where core places them. */
static int head_from_offset(const kvq_side_layout *s) {
  return (s->method == KVQ_LAYOUT_POLAR && s->codebook == KVQ_LAYOUT_CODEBOOK_ONLINE) || s->method == KVQ_LAYOUT_CQ;
}


kvq_status kvq_vk_quantize(kvq_backend *backend, const kvq_job_quantize *job) {
  vk_backend *b = (vk_backend *)backend;
  const kvq_side_layout *s = &job->side->layout;
  const kvq_vk_shader encode = KVQ_VK_VARIANT(quantize, s->method), errors = KVQ_VK_VARIANT(quantize_errors, s->method);
  if (encode == KVQ_VK_SHADER_COUNT) return unsupported(b, "quantize", s->method);
  if (job->count == 0) return KVQ_OK;
  const uint64_t per_token = (uint64_t)s->kv_heads * s->head_dim;
  const uint32_t esize = job->input_dtype == KVQ_DTYPE_F32 ? 4 : 2;
  kvq_status st = KVQ_OK;
  if (job->errors)
    st = kvq_vk_check_range(b, job->errors, 0, (uint64_t)job->count * s->page_size * s->kv_heads * 4, "the quantization errors");
  uint32_t *meta = calloc((size_t)job->count * 4, sizeof(uint32_t));
  if (!meta) {
    return kvq_vk_error(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
  }
  for (uint32_t i = 0; st == KVQ_OK && i < job->count; i++) { /* every item is checked before any page is written */
    const kvq_quantize_item *it = &job->items[i];
    if (it->tokens == 0 || it->tokens > s->page_size || it->src_offset % esize)
      st = kvq_vk_error(b, KVQ_ERROR_INTERNAL, "quantize item %u: %u tokens from byte %llu", i, it->tokens,
                        (unsigned long long)it->src_offset);
    if (st == KVQ_OK) st = kvq_vk_check_range(b, it->src, it->src_offset, per_token * esize * it->tokens, "a quantize item's tokens");
    if (st == KVQ_OK) st = kvq_vk_check_range(b, job->dst, it->dst_offset, s->page_bytes, "a quantized page");
    if (st == KVQ_OK && (it->src_offset / esize > UINT32_MAX || it->dst_offset + s->page_bytes > UINT32_MAX))
      st = too_large(b, "a quantize item");
    if (st == KVQ_OK && head_from_offset(s) && it->dst_offset % s->page_bytes)
      st = kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED,
                        "a quantized page at byte %llu is not a whole page into its pool (per-head codebooks)",
                        (unsigned long long)it->dst_offset);
    meta[4 * i] = (uint32_t)(it->src_offset / esize);
    meta[4 * i + 1] = (uint32_t)it->dst_offset;
    meta[4 * i + 2] = it->tokens;
  }
  uint32_t base = 0;
  if (st == KVQ_OK) st = kvq_vk_metadata(b, meta, (uint64_t)job->count * 16, &base);
  free(meta);
  kvq_push push = {0};
  kvq_vk_push_side(&push, job->side);
  push.input_dtype = (uint32_t)job->input_dtype;
  push.meta = base;
  kvq_buffer *check[KVQ_VK_BINDINGS] = {0}; /* the check word, when the job is recorded behind one */
  if (st == KVQ_OK) st = kvq_vk_if_clear(b, &push, check, job->if_clear, job->if_clear_offset);
  /* the largest unit count of a head block (a full page) */
  push.units = kvq_encode_units_of(s->method, s->page_size, s->head_dim, s->group, s->sketch_dim, s->outliers,
                                     s->outlier_sketch_dim, s->channels);
  /* Items sharing a source buffer run in one dispatch per step. */
  for (uint32_t first = 0; st == KVQ_OK && first < job->count;) {
    uint32_t count = 1;
    while (first + count < job->count && job->items[first + count].src == job->items[first].src) count++;
    push.range_first = first;
    push.count = count;
    kvq_buffer *buffers[KVQ_VK_BINDINGS];
    kvq_vk_bind_side(buffers, b, job->side, job->dst, NULL);
    buffers[KVQ_BINDING_SRC] = job->items[first].src;
    buffers[KVQ_BINDING_DST] = job->errors;
    buffers[KVQ_BINDING_RESULTS] = check[KVQ_BINDING_RESULTS]; /* every step skips once a check failed */
    st = kvq_vk_dispatch(b, KVQ_VK_SHADER_zero_pages, &push, buffers, (uint64_t)count * s->kv_heads * (s->head_bytes / 4));
    /* QJL: every token's encoding reads its page's outlier list, so the list is decided first */
    if (st == KVQ_OK && s->method == KVQ_LAYOUT_QJL && s->outliers > 0)
      st = kvq_vk_dispatch(b, KVQ_VK_SHADER_qjl_outliers, &push, buffers, (uint64_t)count * s->kv_heads * KVQ_GPU_GROUP_SIZE);
    /* a unit per invocation, or per workgroup where the method spreads one over its invocations */
    const uint64_t per_unit = kvq_encode_by_workgroup(s->method) ? KVQ_GPU_GROUP_SIZE : 1;
    if (st == KVQ_OK) st = kvq_vk_dispatch(b, encode, &push, buffers, (uint64_t)count * s->kv_heads * push.units * per_unit);
    if (st == KVQ_OK && job->errors)
      st = kvq_vk_dispatch(b, errors, &push, buffers, (uint64_t)count * s->kv_heads * s->page_size);
    first += count;
  }
  return kvq_vk_done(b, st);
}

kvq_status kvq_vk_dequantize(kvq_backend *backend, const kvq_job_dequantize *job) {
  vk_backend *b = (vk_backend *)backend;
  const kvq_side_layout *s = &job->side->layout;
  const kvq_vk_shader shader = KVQ_VK_VARIANT(dequantize, s->method);
  if (shader == KVQ_VK_SHADER_COUNT) return unsupported(b, "dequantize", s->method);
  if (job->count == 0) return KVQ_OK;
  const uint64_t page_floats = (uint64_t)s->page_size * s->kv_heads * s->head_dim;
  kvq_status st = kvq_vk_check_range(b, job->out, job->out_offset, page_floats * 4 * job->count, "dequantize output");
  if (st == KVQ_OK && (job->out_offset % 4 || job->out_offset / 4 + page_floats * job->count > UINT32_MAX))
    st = too_large(b, "the dequantize output");
  for (uint32_t i = 0; st == KVQ_OK && i < job->count; i++) {
    st = kvq_vk_check_range(b, job->pages, (uint64_t)job->slots[i] * s->page_bytes, s->page_bytes, "a dequantized page");
    if (st == KVQ_OK && ((uint64_t)job->slots[i] + 1) * s->page_bytes > UINT32_MAX) st = too_large(b, "a dequantized page");
  }
  uint32_t base = 0;
  if (st == KVQ_OK) st = kvq_vk_metadata(b, job->slots, (uint64_t)job->count * 4, &base);
  if (st != KVQ_OK) return st;
  kvq_push push = {0};
  kvq_vk_push_side(&push, job->side);
  push.meta = base;
  push.count = job->count;
  push.dst_word = (uint32_t)(job->out_offset / 4);
  kvq_buffer *buffers[KVQ_VK_BINDINGS];
  kvq_vk_bind_side(buffers, b, job->side, job->pages, NULL);
  buffers[KVQ_BINDING_DST] = job->out;
  st = kvq_vk_dispatch(b, shader, &push, buffers, page_floats * job->count);
  return kvq_vk_done(b, st);
}

/* Key methods with prepared floats define KVQ_PREPARES in their shaders (shaders/method.glsl). */
kvq_status kvq_vk_prepare(kvq_backend *backend, const kvq_job_prepare *job) {
  vk_backend *b = (vk_backend *)backend;
  const kvq_side_layout *s = &job->keys->layout;
  const uint32_t pf = kvq_prepared_floats(s);
  const kvq_vk_shader shader = KVQ_VK_VARIANT(prepare, s->method);
  if (pf == 0) return KVQ_OK; /* the method scores the query itself */
  if (shader == KVQ_VK_SHADER_COUNT) return unsupported(b, "query preparation", s->method);
  if (job->rows == 0) return KVQ_OK;
  const uint64_t in_bytes = (uint64_t)job->rows * s->head_dim * 4, out_bytes = (uint64_t)job->rows * pf * 4;
  kvq_status st = kvq_vk_check_range(b, job->queries, job->q_offset, in_bytes, "the queries to prepare");
  if (st == KVQ_OK) st = kvq_vk_check_range(b, job->out, job->out_offset, out_bytes, "the prepared queries");
  if (st == KVQ_OK && (job->q_offset % 4 || job->out_offset % 4 || job->query_heads == 0 ||
                       job->query_heads % s->kv_heads))
    st = kvq_vk_error(b, KVQ_ERROR_INTERNAL,
                      "a query preparation with misaligned buffers or %u query heads for %u kv heads",
                      job->query_heads, s->kv_heads);
  if (st == KVQ_OK && ((job->q_offset + in_bytes) / 4 > UINT32_MAX || (job->out_offset + out_bytes) / 4 > UINT32_MAX))
    st = too_large(b, "a query preparation");
  if (st != KVQ_OK) return st;
  kvq_push push = {0};
  kvq_vk_push_side(&push, job->keys);
  push.input_dtype = KVQ_LAYOUT_F32; /* queries are fp32 */
  push.count = job->rows;
  push.query_heads = job->query_heads;
  push.src_word = (uint32_t)(job->q_offset / 4);
  push.dst_word = (uint32_t)(job->out_offset / 4);
  kvq_buffer *buffers[KVQ_VK_BINDINGS];
  kvq_vk_bind_side(buffers, b, job->keys, NULL, NULL);
  buffers[KVQ_BINDING_SRC] = job->queries;
  buffers[KVQ_BINDING_DST] = job->out;
  const uint32_t units = kvq_prepare_units_of(s->method, s->sketch_dim, s->head_dim, s->channels, s->code_bits);
  st = kvq_vk_dispatch(b, shader, &push, buffers, (uint64_t)job->rows * units);
  return kvq_vk_done(b, st);
}
