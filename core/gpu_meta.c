/*
 * The attention metadata of GPU backends that take it packed by core (KVQ_BACKEND_CORE_META): one
 * image per context, the layout of core/gpu_plan.h, kept from one attention job to the next and
 * updated where the page tables changed, so that a decode step re-packs and uploads only what its
 * append and the policy changed, not every listed page.
 *
 * Each sequence of a job gets a span of the page arrays of `capacity` entries (a power of two from
 * 4, kept while the sequence fits it), so that a page joining one sequence moves nothing else.
 * A sequence's page table counts its changes (kvq_page_table_changed: a version, and the first
 * entry changed since `pt_since`); the image remembers, per span, which sequence (its uid) and which
 * version it holds. Entries below the first changed one are left as they are when the span holds
 * the same sequence at a version no older than pt_since; otherwise the span is packed whole. The
 * header, the unit tables and the records (O(sequences)) are computed every time and compared.
 */
#include "gpu_meta.h"

#include <stdlib.h>
#include <string.h>

/* One sequence's span of the image's page arrays, and what it holds. */
typedef struct kvq_gpu_meta_seq {
  uint64_t uid;                  /* the sequence (kvq_sequence.uid); 0: none */
  uint64_t version;              /* its page table's version when packed */
  uint32_t page_first, capacity; /* the span */
  uint32_t pages;                /* entries packed */
} kvq_gpu_meta_seq;

struct kvq_gpu_meta {
  kvq_attention_meta image; /* what the job hands the backend: points at the arrays below */
  uint32_t *words;
  uint64_t count, capacity;
  kvq_meta_range *ranges;
  uint32_t range_count, range_capacity;
  kvq_gpu_meta_seq *seqs; /* the spans of the image's sequences */
  uint32_t seq_count, seq_capacity;
  uint64_t span_total;     /* the page arrays' length (sum of the capacities) */
  uint64_t packed;         /* words the last pack computed or compared */
  int range_failed;        /* out of memory for a range: everything counts as changed */
};

void kvq_gpu_meta_free(kvq_gpu_meta *m) {
  if (!m) return;
  free(m->words);
  free(m->ranges);
  free(m->seqs);
  free(m);
}

uint64_t kvq_context_meta_packed(const kvq_context *ctx) { return ctx->gpu_meta ? ctx->gpu_meta->packed : 0; }

/* Word w of the image becomes `value`; a word that changes (or every word, with `force`) joins the
 * changed ranges. */
static void put(kvq_gpu_meta *m, uint64_t w, uint32_t value, int force) {
  m->packed++;
  if (!force && m->words[w] == value) return;
  m->words[w] = value;
  if (m->range_count > 0) {
    kvq_meta_range *last = &m->ranges[m->range_count - 1];
    if ((uint64_t)last->first + last->count == w) {
      last->count++;
      return;
    }
  }
  if (m->range_count == m->range_capacity) {
    const uint32_t capacity = m->range_capacity ? 2 * m->range_capacity : 64;
    kvq_meta_range *grown = realloc(m->ranges, sizeof *grown * capacity);
    if (!grown) {
      m->range_failed = 1;
      return;
    }
    m->ranges = grown;
    m->range_capacity = capacity;
  }
  m->ranges[m->range_count++] = (kvq_meta_range){(uint32_t)w, 1};
}

static uint32_t span_for(uint32_t pages) {
  uint32_t capacity = 4;
  while (capacity < pages) capacity *= 2;
  return capacity;
}

kvq_status kvq_gpu_meta_pack(kvq_cache *cache, kvq_job_attention *job, kvq_attention_seq *seqs, kvq_sequence *const *owners,
                             const uint32_t *listed) {
  kvq_context *ctx = cache->ctx;
  if (!ctx->gpu_meta && !(ctx->gpu_meta = calloc(1, sizeof *ctx->gpu_meta)))
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for attention metadata");
  kvq_gpu_meta *m = ctx->gpu_meta;
  const uint32_t S = job->seq_count, words = job->alive_words;
  if (S > m->seq_capacity) {
    kvq_gpu_meta_seq *grown = realloc(m->seqs, sizeof *grown * S);
    if (!grown) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for attention metadata");
    memset(grown + m->seq_capacity, 0, sizeof *grown * (S - m->seq_capacity));
    m->seqs = grown;
    m->seq_capacity = S;
  }
  /* the spans: kept where the same sequence still fits its span at the same place */
  uint64_t total = 0;
  int *same = malloc(sizeof *same * (S ? S : 1));
  uint32_t *capacity = malloc(sizeof *capacity * (S ? S : 1));
  if (!same || !capacity) {
    free(same), free(capacity);
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for attention metadata");
  }
  for (uint32_t i = 0; i < S; i++) {
    kvq_sequence *seq = owners[i];
    if (!seq->uid) seq->uid = ++ctx->sequence_uids;
    const kvq_gpu_meta_seq *old = &m->seqs[i];
    same[i] = i < m->seq_count && old->uid == seq->uid && old->page_first == total && old->capacity >= listed[i];
    capacity[i] = same[i] ? old->capacity : span_for(listed[i]);
    seqs[i].page_first = (uint32_t)total;
    total += capacity[i];
  }
  const uint64_t units = KVQ_META_RECORDS + (uint64_t)S * KVQ_SEQ_WORDS, pages_at = units + (uint64_t)KVQ_PLAN_KERNELS * (S + 1);
  const uint64_t count = pages_at + total * (2 + words);
  kvq_status st = KVQ_OK;
  if (count > UINT32_MAX) st = kvq_fail(ctx, KVQ_ERROR_UNSUPPORTED, "an attention job's metadata lies beyond the 4 GiB kvq's kernels address");
  /* a new layout of the arrays (other sequences, other spans) or a grown image: every word is new */
  const int moved = S != m->seq_count || total != m->span_total || count > m->capacity;
  if (st == KVQ_OK && count > m->capacity) {
    const uint64_t grown_capacity = count + count / 2 + 64;
    uint32_t *grown = grown_capacity <= SIZE_MAX / 4 ? realloc(m->words, (size_t)grown_capacity * 4) : NULL;
    if (!grown) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for attention metadata");
    else m->words = grown, m->capacity = grown_capacity;
  }
  if (st != KVQ_OK) {
    free(same), free(capacity);
    return st;
  }
  m->range_count = 0;
  m->range_failed = 0;
  m->packed = 0;
  /* the header, the unit tables and the records */
  put(m, KVQ_META_SEQS, S, moved);
  put(m, KVQ_META_SLOTS, (uint32_t)pages_at, moved);
  put(m, KVQ_META_INDEX, (uint32_t)(pages_at + total), moved);
  put(m, KVQ_META_ALIVE, (uint32_t)(pages_at + 2 * total), moved);
  for (uint32_t k = 0; k < KVQ_PLAN_KERNELS; k++) {
    const uint64_t table = units + (uint64_t)k * (S + 1);
    put(m, KVQ_META_UNITS + k, (uint32_t)table, moved);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < S; i++) {
      put(m, table + i, (uint32_t)sum, moved);
      sum += kvq_gpu_seq_units(job, &job->seqs[i], k);
    }
    put(m, table + S, (uint32_t)sum, moved);
  }
  uint64_t scratch = 0;
  for (uint32_t i = 0; i < S; i++) {
    uint32_t record[KVQ_SEQ_WORDS];
    kvq_gpu_pack_record(job, &job->seqs[i], (uint32_t)scratch, record);
    scratch += kvq_gpu_flash_scratch_floats(job, &job->seqs[i]);
    for (uint32_t f = 0; f < KVQ_SEQ_WORDS; f++) put(m, KVQ_META_RECORDS + (uint64_t)i * KVQ_SEQ_WORDS + f, record[f], moved);
  }
  /* the page arrays: each span from its first changed entry */
  const uint64_t key_bytes = job->keys->layout.page_bytes, value_bytes = job->values->layout.page_bytes;
  for (uint32_t i = 0; i < S && st == KVQ_OK; i++) {
    kvq_sequence *seq = owners[i];
    kvq_gpu_meta_seq *span = &m->seqs[i];
    uint32_t from = 0;
    if (!moved && same[i] && span->version >= seq->pt_since) {
      from = seq->pt_dirty_from < span->pages ? seq->pt_dirty_from : span->pages;
    }
    const uint64_t first = job->seqs[i].page_first;
    /* entries below `from` whose kept-token masks alone changed */
    const uint32_t masks_to = seq->pt_masks_to < from ? seq->pt_masks_to : from;
    for (uint32_t e = from ? seq->pt_masks_from : 0; e < masks_to; e++)
      for (uint32_t w = 0; w < words; w++)
        put(m, pages_at + 2 * total + (first + e) * words + w, seq->alive[(size_t)e * words + w], moved);
    for (uint32_t e = from; e < listed[i]; e++) {
      const uint64_t slot = seq->pages[e];
      if ((slot + 1) * key_bytes > UINT32_MAX || (slot + 1) * value_bytes > UINT32_MAX) {
        st = kvq_fail(ctx, KVQ_ERROR_UNSUPPORTED, "a page lies beyond the 4 GiB kvq's kernels address");
        break;
      }
      put(m, pages_at + first + e, (uint32_t)slot, moved);
      put(m, pages_at + total + first + e, seq->page_index[e], moved);
      for (uint32_t w = 0; w < words; w++)
        put(m, pages_at + 2 * total + (first + e) * words + w, seq->alive[(size_t)e * words + w], moved);
    }
    *span = (kvq_gpu_meta_seq){seq->uid, seq->pt_version, (uint32_t)first, capacity[i], listed[i]};
    seq->pt_since = seq->pt_version; /* the image holds every change so far */
    seq->pt_dirty_from = UINT32_MAX;
    seq->pt_masks_from = UINT32_MAX, seq->pt_masks_to = 0;
  }
  free(same), free(capacity);
  if (st != KVQ_OK) { /* the image is partly new: the next pack starts over */
    m->seq_count = 0;
    m->span_total = 0;
    return st;
  }
  m->seq_count = S;
  m->span_total = total;
  m->count = count;
  m->image = (kvq_attention_meta){.words = m->words, .count = count, .changed = m->ranges,
                                  .changed_count = m->range_failed ? 0 : m->range_count,
                                  .whole = moved || m->range_failed, .serial = m->image.serial + 1};
  job->meta = &m->image;
  return KVQ_OK;
}
