/*
 * Attention jobs on Vulkan: SCORE, SOFTMAX (with the probability sums of the H2O and Q-Hitter
 * policies) and WEIGHTED_SUM, one dispatch per sequence of the batch, and the fused ATTENTION
 * (flash-decoding, shaders/flash.glsl) that core uses when it wants outputs only. The job's sequence
 * views and page lists go into the metadata buffer in the form shaders/attention.glsl reads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/layout.h"
#include "vk.h"

#define SEQ_WORDS 12u /* shaders/attention.glsl: KVQ_SEQ_WORDS */


static uint64_t seq_tokens(const kvq_attention_seq *s) { return (uint64_t)s->quantized + s->window; }

/* Writes the job's metadata: [slots offset, index offset, alive offset], the sequences, then the
 * page slots, page indices and kept-token masks of every page any sequence lists. */
static kvq_status upload(vk_backend *b, const kvq_job_attention *job, const kvq_side_layout *s, uint32_t *base) {
  uint64_t pages = 0;
  const uint32_t esize = job->window_dtype == KVQ_DTYPE_F32 ? 4 : 2;
  for (uint32_t i = 0; i < job->seq_count; i++) {
    const kvq_attention_seq *q = &job->seqs[i];
    const uint64_t end = (uint64_t)q->page_first + (q->quantized + s->page_size - 1) / s->page_size;
    if (end > pages) pages = end;
    if (q->ring_offset % esize || q->ring_offset / esize > UINT32_MAX || q->score_offset > UINT32_MAX ||
        q->accumulate_offset > UINT32_MAX || seq_tokens(q) * job->query_heads * q->query_count > UINT32_MAX)
      return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED,
                          "an attention sequence lies beyond the 4 GiB kvq's shaders address");
  }
  const uint64_t words = 3 + (uint64_t)job->seq_count * SEQ_WORDS + 2 * pages + pages * job->alive_words;
  uint32_t *meta = calloc((size_t)words, sizeof(uint32_t));
  if (!meta) return kvq_vk_error(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
  const uint32_t slots = 3 + job->seq_count * SEQ_WORDS;
  meta[0] = slots;
  meta[1] = (uint32_t)(slots + pages);
  meta[2] = (uint32_t)(slots + 2 * pages);
  for (uint32_t i = 0; i < job->seq_count; i++) {
    const kvq_attention_seq *q = &job->seqs[i];
    uint32_t *r = meta + 3 + i * SEQ_WORDS;
    const uint32_t record[SEQ_WORDS] = {q->page_first,    q->quantized,   q->window,          q->window_first,
                                        q->ring_capacity, (uint32_t)(q->ring_offset / esize), q->query_first,
                                        q->query_count,   q->query_position, q->mask, (uint32_t)q->score_offset,
                                        (uint32_t)q->accumulate_offset};
    memcpy(r, record, sizeof record);
  }
  if (pages) {
    memcpy(meta + meta[0], job->page_slots, pages * 4);
    memcpy(meta + meta[1], job->page_index, pages * 4);
    memcpy(meta + meta[2], job->page_alive, pages * job->alive_words * 4);
  }
  for (uint64_t p = 0; p < pages; p++)
    if (((uint64_t)job->page_slots[p] + 1) * s->page_bytes > UINT32_MAX) {
      free(meta);
      return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "a page lies beyond the 4 GiB kvq's shaders address");
    }
  kvq_status st = kvq_vk_metadata(b, meta, words * 4, base);
  free(meta);
  return st;
}

static void push_job(kvq_push *push, const kvq_job_attention *job, uint32_t base) {
  push->meta = base;
  push->query_heads = job->query_heads;
  memcpy(&push->scale_bits, &job->scale, 4);
  push->window_dtype = (uint32_t)job->window_dtype;
  push->alive_words = job->alive_words;
}

/* Every attention job's start: its host arrays into the metadata buffer, and push constants for
 * the side it reads (base: where upload() put the arrays). */
static void push_for(kvq_push *push, const kvq_job_attention *job, const kvq_side_desc *side, uint32_t base) {
  memset(push, 0, sizeof *push);
  kvq_vk_push_side(push, side);
  push_job(push, job, base);
}

/* What one invocation (or workgroup) of a per-sequence shader covers. */
enum { PER_SCORE = 0, PER_ROW = 1, PER_SLOT = 2, PER_CHANNEL = 3, PER_OUTPUT_ROW = 4 };

/* One dispatch per sequence, sized by `what` the shader's invocations cover. */
static kvq_status per_sequence(vk_backend *b, const kvq_job_attention *job, kvq_vk_shader shader, kvq_push *push,
                               kvq_buffer *const buffers[KVQ_VK_BINDINGS], int what) {
  kvq_status st = KVQ_OK;
  for (uint32_t i = 0; st == KVQ_OK && i < job->seq_count; i++) {
    const kvq_attention_seq *q = &job->seqs[i];
    const uint64_t n = seq_tokens(q), rows = (uint64_t)q->query_count * job->query_heads;
    /* PER_ROW, PER_SLOT and PER_CHANNEL shaders give each row, slot or channel a workgroup;
     * PER_OUTPUT_ROW one invocation per row */
    const uint64_t invocations = what == PER_SCORE ? rows * n
                                 : what == PER_ROW ? rows * KVQ_VK_GROUP_SIZE
                                 : what == PER_SLOT ? n * KVQ_VK_GROUP_SIZE
                                 : what == PER_OUTPUT_ROW ? rows
                                                    : rows * push->head_dim * KVQ_VK_GROUP_SIZE;
    push->first = i;
    st = kvq_vk_dispatch(b, shader, push, buffers, invocations);
  }
  return st;
}

kvq_status kvq_vk_score(kvq_backend *backend, const kvq_job_attention *job) {
  vk_backend *b = (vk_backend *)backend;
  const kvq_vk_shader shader = KVQ_VK_VARIANT(score, job->keys->layout.method);
  if (shader == KVQ_VK_SHADER_COUNT)
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "no score shader for this key method");
  if (kvq_prepared_floats(&job->keys->layout) && !job->prepared)
    return kvq_vk_error(b, KVQ_ERROR_INTERNAL, "scores without the prepared queries");
  uint32_t base = 0;
  kvq_status st = upload(b, job, &job->keys->layout, &base);
  if (st != KVQ_OK) return st;
  kvq_push push;
  push_for(&push, job, job->keys, base);
  kvq_buffer *buffers[KVQ_VK_BINDINGS];
  kvq_vk_bind_side(buffers, b, job->keys, job->key_pages, job->key_ring);
  buffers[KVQ_BINDING_SRC] = job->queries;
  buffers[KVQ_BINDING_DST] = job->scores;
  buffers[KVQ_BINDING_AUX] = job->prepared;
  st = per_sequence(b, job, shader, &push, buffers, PER_SCORE);
  kvq_status submitted = kvq_vk_submit(b);
  return st == KVQ_OK ? submitted : st;
}

kvq_status kvq_vk_softmax(kvq_backend *backend, const kvq_job_attention *job) {
  vk_backend *b = (vk_backend *)backend;
  uint32_t base = 0;
  kvq_status st = upload(b, job, &job->keys->layout, &base);
  if (st != KVQ_OK) return st;
  kvq_push push;
  push_for(&push, job, job->keys, base);
  kvq_buffer *buffers[KVQ_VK_BINDINGS] = {0};
  buffers[KVQ_BINDING_META] = b->metadata;
  buffers[KVQ_BINDING_DST] = job->scores;
  buffers[KVQ_BINDING_AUX] = job->accumulate;
  st = per_sequence(b, job, KVQ_VK_SHADER_softmax, &push, buffers, PER_ROW);
  if (st == KVQ_OK && job->accumulate) st = per_sequence(b, job, KVQ_VK_SHADER_accumulate, &push, buffers, PER_SLOT);
  kvq_status submitted = kvq_vk_submit(b);
  return st == KVQ_OK ? submitted : st;
}

/* Value methods whose shaders define KVQ_SUMS_ROTATED (shaders/method.glsl): step 1 leaves the page
 * sums in their rotated space in scratch memory, step 2 (weighted_sum_rotate) rotates them back. */
static int sums_rotated(uint32_t method) { return method == KVQ_LAYOUT_POLAR; }

/* Query rows x query heads of the job's output. */
static uint64_t output_rows(const kvq_job_attention *job) {
  uint64_t rows = 0;
  for (uint32_t i = 0; i < job->seq_count; i++) {
    const uint64_t end = (uint64_t)job->seqs[i].query_first + job->seqs[i].query_count;
    if (end > rows) rows = end;
  }
  return rows * job->query_heads;
}

kvq_status kvq_vk_weighted_sum(kvq_backend *backend, const kvq_job_attention *job) {
  vk_backend *b = (vk_backend *)backend;
  const kvq_vk_shader shader = KVQ_VK_VARIANT(weighted_sum, job->values->layout.method);
  if (shader == KVQ_VK_SHADER_COUNT)
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "no weighted-sum shader for this value method");
  uint32_t base = 0;
  kvq_status st = upload(b, job, &job->values->layout, &base);
  if (st != KVQ_OK) return st;
  kvq_push push;
  push_for(&push, job, job->values, base);
  kvq_buffer *buffers[KVQ_VK_BINDINGS];
  kvq_vk_bind_side(buffers, b, job->values, job->value_pages, job->value_ring);
  buffers[KVQ_BINDING_SRC] = job->scores;
  buffers[KVQ_BINDING_AUX] = job->output;
  const kvq_side_layout *s = &job->values->layout;
  if (sums_rotated(s->method)) st = kvq_vk_scratch(b, output_rows(job) * s->head_dim * 4, &buffers[KVQ_BINDING_DST]);
  if (st == KVQ_OK) st = per_sequence(b, job, shader, &push, buffers, PER_CHANNEL);
  if (st == KVQ_OK && sums_rotated(s->method))
    st = per_sequence(b, job, KVQ_VK_VARIANT(weighted_sum_rotate, s->method), &push, buffers, PER_OUTPUT_ROW);
  kvq_status submitted = kvq_vk_submit(b);
  return st == KVQ_OK ? submitted : st;
}

/* Shaders/flash.glsl's constants and scratch size. */
#define FLASH_SPLIT 64u
#define FLASH_HEADS_PER_PASS 8u

static uint64_t flash_scratch_floats(const kvq_job_attention *job, const kvq_attention_seq *q) {
  const uint64_t n = seq_tokens(q), splits = (n + FLASH_SPLIT - 1) / FLASH_SPLIT;
  return (uint64_t)q->query_count * job->query_heads * (n + 2 * splits + splits * job->values->layout.head_dim);
}

/* The unfused jobs, one after the other (what the fused path cannot give: per-token sums). */
static kvq_status unfused(kvq_backend *backend, const kvq_job_attention *job) {
  kvq_status st = kvq_vk_score(backend, job);
  if (st == KVQ_OK) st = kvq_vk_softmax(backend, job);
  if (st == KVQ_OK) st = kvq_vk_weighted_sum(backend, job);
  return st;
}

kvq_status kvq_vk_attention(kvq_backend *backend, const kvq_job_attention *job) {
  vk_backend *b = (vk_backend *)backend;
  const kvq_side_layout *ks = &job->keys->layout, *vs = &job->values->layout;
  const kvq_vk_shader logits = b->subgroups ? KVQ_VK_VARIANT(flash_logits_subgroups, ks->method)
                                            : KVQ_VK_VARIANT(flash_logits, ks->method);
  const kvq_vk_shader values = KVQ_VK_VARIANT(flash_values, vs->method);
  /* Policies that track attention need every probability, and values summed in a rotated space
   * (PolarQuant) are rotated back per output row by the unfused weighted sum: both take the unfused
   * jobs. */
  if (job->accumulate || sums_rotated(vs->method) || logits == KVQ_VK_SHADER_COUNT || values == KVQ_VK_SHADER_COUNT)
    return unfused(backend, job);
  uint64_t scratch = 0;
  for (uint32_t i = 0; i < job->seq_count; i++) {
    const uint64_t f = flash_scratch_floats(job, &job->seqs[i]);
    scratch = f > scratch ? f : scratch;
  }
  if (scratch * 4 > UINT32_MAX)
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED,
                        "a fused attention's scratch lies beyond the 4 GiB kvq's shaders address");
  uint32_t base = 0;
  kvq_status st = upload(b, job, ks, &base);
  kvq_buffer *partials = NULL;
  if (st == KVQ_OK) st = kvq_vk_scratch(b, scratch * 4, &partials);
  if (st != KVQ_OK) return st;
  kvq_push key_push, value_push;
  push_for(&key_push, job, job->keys, base);
  push_for(&value_push, job, job->values, base);
  kvq_buffer *key_buffers[KVQ_VK_BINDINGS], *value_buffers[KVQ_VK_BINDINGS];
  kvq_vk_bind_side(key_buffers, b, job->keys, job->key_pages, job->key_ring);
  kvq_vk_bind_side(value_buffers, b, job->values, job->value_pages, job->value_ring);
  key_buffers[KVQ_BINDING_DST] = value_buffers[KVQ_BINDING_DST] = partials;
  key_buffers[KVQ_BINDING_SRC] = job->queries;
  key_buffers[KVQ_BINDING_AUX] = job->prepared; /* methods that score from prepared queries (QJL) */
  value_buffers[KVQ_BINDING_AUX] = job->output;
  const uint32_t group = job->query_heads / ks->kv_heads;
  const uint64_t passes = (group + FLASH_HEADS_PER_PASS - 1) / FLASH_HEADS_PER_PASS;
  for (uint32_t i = 0; st == KVQ_OK && i < job->seq_count; i++) {
    const kvq_attention_seq *q = &job->seqs[i];
    const uint64_t n = seq_tokens(q), splits = (n + FLASH_SPLIT - 1) / FLASH_SPLIT;
    const uint64_t workgroups = (uint64_t)q->query_count * ks->kv_heads * passes * splits;
    key_push.first = value_push.first = i;
    st = kvq_vk_dispatch(b, logits, &key_push, key_buffers, workgroups * FLASH_SPLIT);
    if (st == KVQ_OK) st = kvq_vk_dispatch(b, values, &value_push, value_buffers, workgroups * FLASH_SPLIT);
    if (st == KVQ_OK)
      st = kvq_vk_dispatch(b, KVQ_VK_SHADER_flash_combine, &value_push, value_buffers,
                           (uint64_t)q->query_count * job->query_heads * vs->head_dim);
  }
  kvq_status submitted = kvq_vk_submit(b);
  return st == KVQ_OK ? submitted : st;
}
