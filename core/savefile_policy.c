/*
 * The policy section of saved caches (docs/FORMAT.md, "PLCY"): written when the cache has a token
 * policy (header flag 1), between SEQS and PAGE. It carries the policy, every live sequence's page
 * numbers and kept-token masks, and the H2O / Q-Hitter statistics. Caches without a policy are
 * saved exactly as before the section existed, so their files are unchanged.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "savefile.h"

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

void kvq_put_policy(kvq_writer *w, const kvq_policy_config *p) {
  kvq_put_u32(w, (uint32_t)p->kind);
  kvq_put_u32(w, p->sinks);
  kvq_put_u32(w, p->recent);
  kvq_put_u32(w, p->heavy);
  kvq_put_u32(w, float_bits(p->heavy_fraction));
  kvq_put_u32(w, float_bits(p->lambda));
}

void kvq_get_policy(kvq_reader *r, kvq_policy_config *p) {
  p->kind = (kvq_policy_kind)kvq_get_u32(r);
  p->sinks = kvq_get_u32(r);
  p->recent = kvq_get_u32(r);
  p->heavy = kvq_get_u32(r);
  p->heavy_fraction = bits_float(kvq_get_u32(r));
  p->lambda = bits_float(kvq_get_u32(r));
}

void kvq_put_policy_section(kvq_writer *w, const kvq_cache *cache) {
  const kvq_cache_config *c = &cache->config;
  kvq_put_policy(w, &c->policy);
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    if (!seq->live) continue;
    kvq_put_u32(w, seq->page_end);
    for (uint32_t e = 0; e < seq->page_count; e++) kvq_put_u32(w, seq->page_index[e]);
    for (uint32_t k = 0; k < seq->page_count * cache->alive_words; k++) kvq_put_u32(w, seq->alive[k]);
    const kvq_tracked *t = &seq->tracked;
    const uint32_t count = t->position ? t->count : 0;
    kvq_put_u32(w, count);
    for (uint32_t k = 0; k < count; k++) {
      uint64_t a;
      memcpy(&a, &t->attention[k], 8);
      kvq_put_u32(w, t->position[k]);
      kvq_put_u64(w, a);
      kvq_put_u32(w, float_bits(t->key_error[k]));
      kvq_put_u32(w, float_bits(t->value_error[k]));
    }
  }
}

static kvq_status bad(kvq_context *ctx, const char *what) {
  return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: %s", what);
}

/* The pages a sequence has taken: every layer's quantized tokens lie in them. */
static uint32_t pages_taken(const kvq_cache *cache, const kvq_sequence *seq) {
  const uint32_t P = cache->config.page_size;
  uint32_t end = 0;
  for (uint32_t l = 0; l < cache->config.layer_count; l++) {
    const uint32_t pages = (seq->layers[l].quantized + P - 1) / P;
    end = pages > end ? pages : end;
  }
  return end;
}

/* The positions a sequence holds: those below the largest token count of its layers. */
static uint32_t positions_end(const kvq_cache *cache, const kvq_sequence *seq) {
  uint32_t end = 0;
  for (uint32_t l = 0; l < cache->config.layer_count; l++) end = seq->layers[l].tokens > end ? seq->layers[l].tokens : end;
  return end;
}

/* The first position no decision can have evicted: a decision happens with every layer at the same
 * count n <= the smallest count now and evicts only below n - recent, so nothing at or after
 * (smallest count) - recent, nor in any layer's window. */
static uint32_t never_evicted_from(const kvq_cache *cache, const kvq_sequence *seq) {
  uint32_t never_before = UINT32_MAX, fewest = UINT32_MAX;
  for (uint32_t l = 0; l < cache->config.layer_count; l++) {
    never_before = seq->layers[l].ring_start < never_before ? seq->layers[l].ring_start : never_before;
    fewest = seq->layers[l].tokens < fewest ? seq->layers[l].tokens : fewest;
  }
  const uint32_t recent = cache->config.policy.recent, recent_from = fewest > recent ? fewest - recent : 0;
  return recent_from < never_before ? recent_from : never_before;
}

/* Whether a page table holds every page number in [first, end). Its numbers strictly ascend, so that
 * is whether the entry of `first` is followed by end - first - 1 consecutive ones: checked in
 * O(log pages), whatever the numbers, never by walking them. */
static int pages_present(const kvq_sequence *seq, uint32_t first, uint32_t end) {
  if (first >= end) return 1;
  const uint32_t e = kvq_page_entry(seq, first);
  return e != UINT32_MAX && end - first <= seq->page_count - e && seq->page_index[e + (end - first - 1)] == end - 1;
}

/* Whether a page's kept-token masks are possible: no bit past P, at least one bit (a page whose
 * tokens were all evicted went back to the pool), and every token the policy never evicts kept: the
 * sinks, and every token at or after `never_before`. */
static int masks_possible(const kvq_cache *cache, const uint32_t *alive, uint32_t page, uint32_t sinks,
                          uint32_t never_before) {
  const uint32_t P = cache->config.page_size;
  uint32_t any = 0;
  for (uint32_t w = 0; w < cache->alive_words; w++) {
    const uint32_t valid = P - 32 * w >= 32 ? 0xffffffffu : (1u << (P - 32 * w)) - 1u;
    if (alive[w] & ~valid) return 0;
    any |= alive[w];
  }
  for (uint32_t i = 0; i < P; i++) {
    const uint64_t position = (uint64_t)page * P + i;
    if ((position < sinks || position >= never_before) && !(alive[i / 32] >> (i % 32) & 1u)) return 0;
  }
  return any != 0;
}

/*
 * The kept positions of a sequence. Position x below `end` (the largest token count) is kept when
 * its page was never taken (x >= page_end * P: the window), or its page-table entry is there with
 * x's bit set. Every walk below visits page-table entries and the positions past the pages (fewer
 * than R + P), never the positions of pages that are gone: a stream of 2^31 tokens that kept two
 * pages costs two pages (KVQ_POLICY_POSITION_PASSES counts these walks).
 */

/* The number of kept positions in [from, to), to <= end. */
static uint64_t kept_between(const kvq_cache *cache, const kvq_sequence *seq, uint32_t from, uint32_t to) {
  const uint32_t P = cache->config.page_size;
  const uint64_t past_pages = (uint64_t)seq->page_end * P;
  uint64_t kept = 0, visited = 0;
  for (uint32_t e = 0; e < seq->page_count; e++) {
    const uint64_t first = (uint64_t)seq->page_index[e] * P;
    for (uint32_t i = 0; i < P; i++, visited++)
      if (first + i >= from && first + i < to) kept += (uint32_t)kvq_token_kept(cache, seq, e, i);
  }
  const uint64_t window_from = from > past_pages ? from : past_pages;
  if (to > window_from) kept += to - window_from;
  cache->ctx->load_work.steps += visited;
  return kept;
}

/* The smallest x such that every position in [x, end) is kept: where the kept suffix begins, walked
 * back from the last entry until a position is evicted or its page is gone. */
static uint32_t kept_suffix_start(const kvq_cache *cache, const kvq_sequence *seq, uint32_t end) {
  const uint32_t P = cache->config.page_size;
  const uint64_t past_pages = (uint64_t)seq->page_end * P;
  uint32_t x = end < past_pages ? end : (uint32_t)past_pages; /* positions past the pages are kept */
  uint64_t visited = 0;
  for (uint32_t e = seq->page_count; e-- > 0 && x > 0 && (x - 1) / P == seq->page_index[e];) {
    while (x > seq->page_index[e] * P && kvq_token_kept(cache, seq, e, (x - 1) % P)) x--, visited++;
    if (x > seq->page_index[e] * P) break; /* position x - 1 was evicted */
  }
  cache->ctx->load_work.steps += visited;
  return x;
}

/* Whether the kept positions are what decisions leave. A decision at n keeps, of the candidates
 * [sinks, n - recent), at most kvq_policy_candidates_kept(n) (every candidate evicted under
 * StreamingLLM) and never evicts at or after n - recent; n only grows. So if the kept suffix starts at
 * x > sinks, position x - 1 was evicted by a decision with n - recent >= x, and the last decision
 * left at most candidates_kept(n) kept in [sinks, n - recent), all of [x, n - recent) among them; the
 * least n, x + recent, is the weakest requirement (candidates_kept grows by at most 1 per token). */
static int evictions_possible(const kvq_cache *cache, const kvq_sequence *seq, uint32_t end) {
  const kvq_policy_config *p = &cache->config.policy;
  const uint32_t x = kept_suffix_start(cache, seq, end);
  if (x <= p->sinks) return 1;
  return kept_between(cache, seq, p->sinks, x) <= kvq_policy_candidates_kept(p, x + p->recent);
}

/* Writes the kept positions below `end` in ascending order (count of them, reserved before). */
static void list_kept(const kvq_cache *cache, const kvq_sequence *seq, uint32_t end, uint32_t *positions) {
  const uint32_t P = cache->config.page_size;
  uint64_t k = 0, visited = 0;
  for (uint32_t e = 0; e < seq->page_count; e++)
    for (uint32_t i = 0; i < P; i++, visited++) {
      const uint64_t x = (uint64_t)seq->page_index[e] * P + i;
      if (x < end && kvq_token_kept(cache, seq, e, i)) positions[k++] = (uint32_t)x;
    }
  for (uint64_t x = (uint64_t)seq->page_end * P; x < end; x++, visited++) positions[k++] = (uint32_t)x;
  cache->ctx->load_work.steps += visited;
}

void kvq_default_page_numbers(kvq_cache *cache, kvq_sequence *seq) {
  const uint32_t P = cache->config.page_size, words = cache->alive_words;
  for (uint32_t e = 0; e < seq->page_count; e++) {
    seq->page_index[e] = e;
    for (uint32_t w = 0; w < words; w++)
      seq->alive[e * words + w] = P - 32 * w >= 32 ? 0xffffffffu : (1u << (P - 32 * w)) - 1u;
  }
  seq->page_end = seq->page_count;
  seq->tracked.end = positions_end(cache, seq);
}

/* Reads a sequence's page numbers: ascending, below the pages taken. */
static int get_page_numbers(kvq_cache *cache, kvq_sequence *seq, kvq_reader *r) {
  cache->ctx->load_work.steps += seq->page_count;
  for (uint32_t e = 0; e < seq->page_count; e++) {
    seq->page_index[e] = kvq_get_u32(r);
    if (r->short_read || seq->page_index[e] >= seq->page_end || (e > 0 && seq->page_index[e] <= seq->page_index[e - 1]))
      return -1;
  }
  return 0;
}

/* Reads a sequence's kept-token masks, each possible for its page. */
static int get_masks(kvq_cache *cache, kvq_sequence *seq, kvq_reader *r, uint32_t never_before) {
  const uint32_t words = cache->alive_words;
  cache->ctx->load_work.steps += (uint64_t)seq->page_count * cache->config.page_size; /* masks_possible's positions */
  for (uint32_t e = 0; e < seq->page_count; e++) {
    for (uint32_t w = 0; w < words; w++) seq->alive[e * words + w] = kvq_get_u32(r);
    if (r->short_read ||
        !masks_possible(cache, seq->alive + e * words, seq->page_index[e], cache->config.policy.sinks, never_before))
      return -1;
  }
  return 0;
}

/* Reads a sequence's statistics: exactly one record per kept position below `end`, ascending, finite
 * and non-negative; H2O measures no quantization errors, so its are zero. The count a file gives is
 * checked against the records the section can still hold and against the kept positions before
 * anything is reserved, so neither memory nor work follows a number the file merely claims. */
static kvq_status get_statistics(kvq_cache *cache, kvq_sequence *seq, kvq_reader *r, uint32_t end) {
  kvq_context *ctx = cache->ctx;
  const kvq_policy_config *p = &cache->config.policy;
  const uint32_t count = kvq_get_u32(r);
  kvq_tracked *t = &seq->tracked;
  t->count = t->end = 0;
  if (r->short_read) return bad(ctx, "policy section too short");
  if (!kvq_policy_tracks(p)) {
    t->end = end;
    return count == 0 ? KVQ_OK : bad(ctx, "statistics for a policy that keeps none");
  }
  if ((uint64_t)count * KVQ_STATISTICS_RECORD_BYTES > r->size - r->pos)
    return bad(ctx, "the statistics count is larger than the records the policy section holds");
  if (count != kept_between(cache, seq, 0, end)) return bad(ctx, "policy statistics do not match the kept tokens");
  ctx->load_work.reserved += count;
  kvq_status st = kvq_tracked_reserve(cache, seq, count); /* room for `count` entries: t->count and t->end are 0 */
  if (st != KVQ_OK) return st;
  list_kept(cache, seq, end, t->position);
  ctx->load_work.steps += count;
  for (uint32_t k = 0; k < count; k++) {
    const uint32_t position = kvq_get_u32(r);
    uint64_t a = kvq_get_u64(r);
    double attention;
    memcpy(&attention, &a, 8);
    const float key_error = bits_float(kvq_get_u32(r)), value_error = bits_float(kvq_get_u32(r));
    if (r->short_read || position != t->position[k] || !(attention >= 0.0) || isinf(attention) ||
        !(key_error >= 0.0f) || isinf(key_error) || !(value_error >= 0.0f) || isinf(value_error))
      return bad(ctx, "policy statistics do not match the kept tokens");
    if (!kvq_policy_needs_errors(p) && (key_error != 0.0f || value_error != 0.0f))
      return bad(ctx, "quantization errors in the statistics of a policy that measures none");
    t->attention[k] = attention;
    t->key_error[k] = key_error;
    t->value_error[k] = value_error;
  }
  t->count = count;
  t->end = end;
  return KVQ_OK;
}

/* Reads one live sequence's part of the policy section and checks that a stream under the policy
 * could have left it (docs/FORMAT.md, "PLCY"). */
static kvq_status get_sequence_policy(kvq_cache *cache, kvq_sequence *seq, kvq_reader *r) {
  kvq_context *ctx = cache->ctx;
  const kvq_policy_config *p = &cache->config.policy;
  const uint32_t P = cache->config.page_size;
  seq->page_end = kvq_get_u32(r);
  if (r->short_read || seq->page_end != pages_taken(cache, seq)) return bad(ctx, "a sequence's page count is inconsistent");
  if (get_page_numbers(cache, seq, r) != 0)
    return bad(ctx, "a page table's page numbers are not ascending below the pages taken");
  const uint32_t never_before = never_evicted_from(cache, seq);
  /* pages holding tokens not yet quantized in every layer, or the recent window, are all there */
  if (!pages_present(seq, never_before / P, seq->page_end)) return bad(ctx, "a page table lacks a page still in use");
  /* and so are the sinks' pages (among those taken): no decision evicts a sink */
  const uint32_t sink_pages = p->sinks / P + (p->sinks % P != 0);
  if (!pages_present(seq, 0, sink_pages < seq->page_end ? sink_pages : seq->page_end))
    return bad(ctx, "a page table lacks the page of the attention sinks");
  if (get_masks(cache, seq, r, never_before) != 0) return bad(ctx, "a page's kept-token masks are impossible");
  const uint32_t end = positions_end(cache, seq);
  if (!evictions_possible(cache, seq, end))
    return bad(ctx, "more tokens kept before the recent window than the policy's decisions keep");
  return get_statistics(cache, seq, r, end);
}

kvq_status kvq_get_policy_section(kvq_cache *cache, kvq_reader *r) {
  kvq_context *ctx = cache->ctx;
  kvq_cache_config *c = &cache->config;
  kvq_policy_config p;
  kvq_get_policy(r, &p);
  char why[256];
  if (r->short_read) return bad(ctx, "policy section too short");
  if (p.kind == KVQ_POLICY_KEEP_ALL || kvq_policy_validate(&p, c->page_size, c->residual_window, why, sizeof why) != KVQ_OK ||
      p.recent == 0)
    return bad(ctx, "the policy section holds an invalid policy");
  c->policy = p;
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    if (!cache->seqs[slot].live) continue;
    const kvq_status st = get_sequence_policy(cache, &cache->seqs[slot], r);
    if (st != KVQ_OK) return st;
  }
  return KVQ_OK;
}
