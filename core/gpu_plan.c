/*
 * The attention plan of GPU backends (core/gpu_plan.h): which kernels a job takes, how many
 * workgroups each gives every sequence, the scratch it needs, and the metadata the kernels read.
 * A backend plans, packs, uploads the words and launches one dispatch per kernel.
 */
#include "gpu_plan.h"

#include <stdio.h>
#include <string.h>

#include "config.h"
#include "layout.h"

static uint64_t seq_tokens(const kvq_attention_seq *q) { return (uint64_t)q->quantized + q->window; }
static uint64_t groups_of(uint64_t invocations) { return (invocations + KVQ_GPU_GROUP_SIZE - 1) / KVQ_GPU_GROUP_SIZE; }

/* Value methods whose kernels sum pages in a rotated space and rotate each output row back
 * (KVQ_SUMS_ROTATED in shaders/method.glsl). */
static int sums_rotated(uint32_t method) { return method == KVQ_LAYOUT_POLAR; }

/* Query rows x query heads up to the last output row any sequence writes. */
static uint64_t output_rows(const kvq_job_attention *job) {
  uint64_t rows = 0;
  for (uint32_t i = 0; i < job->seq_count; i++) {
    const uint64_t end = (uint64_t)job->seqs[i].query_first + job->seqs[i].query_count;
    if (end > rows) rows = end;
  }
  return rows * job->query_heads;
}

/* Floats of a sequence's flash scratch (gpu_plan.h, kvq_flash_out_at past its last output). */
uint64_t kvq_gpu_flash_scratch_floats(const kvq_job_attention *job, const kvq_attention_seq *q) {
  const uint64_t n = seq_tokens(q), splits = (n + KVQ_FLASH_SPLIT - 1) / KVQ_FLASH_SPLIT;
  return (uint64_t)q->query_count * job->query_heads * (n + 2 * splits + splits * job->values->layout.head_dim);
}

/* Workgroups kernel k gives sequence q (gpu_plan.h, KVQ_PLAN_*). */
uint64_t kvq_gpu_seq_units(const kvq_job_attention *job, const kvq_attention_seq *q, uint32_t k) {
  const uint64_t n = seq_tokens(q), rows = (uint64_t)q->query_count * job->query_heads;
  const uint32_t kv_heads = job->keys->layout.kv_heads, d = job->values->layout.head_dim;
  switch (k) {
  case KVQ_PLAN_SCORE: return groups_of(rows * n);
  case KVQ_PLAN_SOFTMAX: return rows;
  case KVQ_PLAN_ACCUMULATE: return n;
  case KVQ_PLAN_WEIGHTED_SUM: return rows * d;
  case KVQ_PLAN_ROTATE: return groups_of(rows);
  case KVQ_PLAN_FLASH:
    return n == 0 ? 0
                  : (uint64_t)q->query_count * kv_heads * kvq_flash_passes(job->query_heads / kv_heads) *
                        ((n + KVQ_FLASH_SPLIT - 1) / KVQ_FLASH_SPLIT);
  case KVQ_PLAN_COMBINE: return groups_of(rows * d);
  }
  return 0;
}

static kvq_status too_large(char *why, size_t size, const char *what) {
  snprintf(why, size, "%s lies beyond the 4 GiB kvq's kernels address", what);
  return KVQ_ERROR_UNSUPPORTED;
}

kvq_status kvq_gpu_plan_attention(const kvq_job_attention *job, int fused_kernels, kvq_gpu_attention_plan *plan,
                                  char *why, size_t why_size) {
  memset(plan, 0, sizeof *plan);
  const kvq_side_layout *ks = &job->keys->layout, *vs = &job->values->layout;
  const uint32_t esize = (uint32_t)kvq_dtype_size(job->window_dtype);
  uint64_t scratch = 0;
  for (uint32_t i = 0; i < job->seq_count; i++) {
    const kvq_attention_seq *q = &job->seqs[i];
    const uint64_t end = (uint64_t)q->page_first + (q->quantized + ks->page_size - 1) / ks->page_size;
    if (end > plan->pages) plan->pages = end;
    if (q->ring_offset % esize || q->ring_offset / esize > UINT32_MAX || q->score_offset > UINT32_MAX ||
        q->accumulate_offset > UINT32_MAX || seq_tokens(q) * job->query_heads * q->query_count > UINT32_MAX)
      return too_large(why, why_size, "an attention sequence");
    scratch += kvq_gpu_flash_scratch_floats(job, q);
  }
  /* (core's packed metadata checked its pages as it packed them: core/gpu_meta.c) */
  for (uint64_t p = 0; p < plan->pages && job->page_slots; p++) {
    const uint64_t end = (uint64_t)job->page_slots[p] + 1;
    if (end * ks->page_bytes > UINT32_MAX || end * vs->page_bytes > UINT32_MAX)
      return too_large(why, why_size, "a page");
  }
  plan->rotated_sums = sums_rotated(vs->method);
  /* Values summed in a rotated space are rotated back per output row by the unfused weighted sum:
   * they take the unfused kernels, and so does a batch whose flash scratch (every sequence's at once)
   * the kernels could not address. The probability sums of the policies that track attention (H2O,
   * Q-Hitter) come from the flash scratch after the combine (SOFTMAX's and ACCUMULATE's units,
   * gpu_plan.h), so they do not keep a job off the fused path. */
  plan->fused = fused_kernels && !plan->rotated_sums && scratch * 4 <= UINT32_MAX;
  if (plan->fused) {
    plan->scratch_bytes = scratch * 4;
  } else if (plan->rotated_sums) {
    plan->scratch_bytes = output_rows(job) * vs->head_dim * 4;
  }
  for (uint32_t i = 0; i < job->seq_count; i++)
    for (uint32_t k = 0; k < KVQ_PLAN_KERNELS; k++) plan->units[k] += kvq_gpu_seq_units(job, &job->seqs[i], k);
  for (uint32_t k = 0; k < KVQ_PLAN_KERNELS; k++)
    if (plan->units[k] * KVQ_GPU_GROUP_SIZE > UINT32_MAX) return too_large(why, why_size, "an attention dispatch");
  plan->meta_words = KVQ_META_RECORDS + (uint64_t)job->seq_count * KVQ_SEQ_WORDS +
                     (uint64_t)KVQ_PLAN_KERNELS * (job->seq_count + 1) + 2 * plan->pages +
                     plan->pages * job->alive_words;
  if (plan->meta_words > UINT32_MAX) return too_large(why, why_size, "an attention job's metadata");
  return KVQ_OK;
}

void kvq_gpu_pack_attention(const kvq_job_attention *job, const kvq_gpu_attention_plan *plan, uint32_t *meta) {
  const uint32_t S = job->seq_count;
  uint32_t at = KVQ_META_RECORDS + S * KVQ_SEQ_WORDS;
  meta[KVQ_META_SEQS] = S;
  for (uint32_t k = 0; k < KVQ_PLAN_KERNELS; k++) {
    meta[KVQ_META_UNITS + k] = at;
    uint32_t sum = 0;
    for (uint32_t i = 0; i < S; i++) {
      meta[at + i] = sum;
      sum += (uint32_t)kvq_gpu_seq_units(job, &job->seqs[i], k);
    }
    meta[at + S] = sum;
    at += S + 1;
  }
  const uint32_t pages = (uint32_t)plan->pages;
  meta[KVQ_META_SLOTS] = at;
  meta[KVQ_META_INDEX] = at + pages;
  meta[KVQ_META_ALIVE] = at + 2 * pages;
  uint64_t scratch = 0;
  for (uint32_t i = 0; i < S; i++) {
    const kvq_attention_seq *q = &job->seqs[i];
    kvq_gpu_pack_record(job, q, plan->fused ? (uint32_t)scratch : 0, meta + KVQ_META_RECORDS + i * KVQ_SEQ_WORDS);
    if (plan->fused) scratch += kvq_gpu_flash_scratch_floats(job, q);
  }
  if (pages) {
    memcpy(meta + meta[KVQ_META_SLOTS], job->page_slots, (size_t)pages * 4);
    memcpy(meta + meta[KVQ_META_INDEX], job->page_index, (size_t)pages * 4);
    memcpy(meta + meta[KVQ_META_ALIVE], job->page_alive, (size_t)pages * job->alive_words * 4);
  }
}

void kvq_gpu_pack_record(const kvq_job_attention *job, const kvq_attention_seq *q, uint32_t scratch, uint32_t *r) {
  const uint32_t esize = (uint32_t)kvq_dtype_size(job->window_dtype);
  r[KVQ_SEQ_PAGE_FIRST] = q->page_first;
  r[KVQ_SEQ_QUANTIZED] = q->quantized;
  r[KVQ_SEQ_WINDOW] = q->window;
  r[KVQ_SEQ_WINDOW_FIRST] = q->window_first;
  r[KVQ_SEQ_RING_CAPACITY] = q->ring_capacity;
  r[KVQ_SEQ_RING_ELEMENT] = (uint32_t)(q->ring_offset / esize);
  r[KVQ_SEQ_QUERY_FIRST] = q->query_first;
  r[KVQ_SEQ_QUERY_COUNT] = q->query_count;
  r[KVQ_SEQ_QUERY_POSITION] = q->query_position;
  r[KVQ_SEQ_MASK] = q->mask;
  r[KVQ_SEQ_SCORE_OFFSET] = (uint32_t)q->score_offset;
  r[KVQ_SEQ_ACCUMULATE_OFFSET] = (uint32_t)q->accumulate_offset;
  r[KVQ_SEQ_SCRATCH] = scratch;
}
