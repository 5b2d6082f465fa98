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

/* Whether a page's kept-token masks are possible: no bit past P, at least one bit, and every token
 * the policy never evicts kept: the sinks, and every token at or after `never_before` (the recent
 * window of the last possible decision, which covers the full-precision window and partial pages). */
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

void kvq_default_page_numbers(kvq_cache *cache, kvq_sequence *seq) {
  const uint32_t P = cache->config.page_size, words = cache->alive_words;
  for (uint32_t e = 0; e < seq->page_count; e++) {
    seq->page_index[e] = e;
    for (uint32_t w = 0; w < words; w++)
      seq->alive[e * words + w] = P - 32 * w >= 32 ? 0xffffffffu : (1u << (P - 32 * w)) - 1u;
  }
  seq->page_end = seq->page_count;
  seq->tracked.end = 0;
  for (uint32_t l = 0; l < cache->config.layer_count; l++)
    if (seq->layers[l].tokens > seq->tracked.end) seq->tracked.end = seq->layers[l].tokens;
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
  const uint32_t P = c->page_size, words = cache->alive_words;
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    kvq_sequence *seq = &cache->seqs[slot];
    if (!seq->live) continue;
    seq->page_end = kvq_get_u32(r);
    /* A decision happens with every layer at the same count n <= the smallest count now and evicts
     * only below n - recent: nothing at or after (smallest count) - recent, nor in any window. */
    uint32_t never_before = UINT32_MAX, end = 0, fewest = UINT32_MAX;
    for (uint32_t l = 0; l < c->layer_count; l++) {
      never_before = seq->layers[l].ring_start < never_before ? seq->layers[l].ring_start : never_before;
      end = seq->layers[l].tokens > end ? seq->layers[l].tokens : end;
      fewest = seq->layers[l].tokens < fewest ? seq->layers[l].tokens : fewest;
    }
    const uint32_t recent_from = fewest > p.recent ? fewest - p.recent : 0;
    never_before = recent_from < never_before ? recent_from : never_before;
    if (r->short_read || seq->page_end != pages_taken(cache, seq)) return bad(ctx, "a sequence's page count is inconsistent");
    for (uint32_t e = 0; e < seq->page_count; e++) {
      ctx->load_work.steps++;
      seq->page_index[e] = kvq_get_u32(r);
      if (r->short_read || seq->page_index[e] >= seq->page_end || (e > 0 && seq->page_index[e] <= seq->page_index[e - 1]))
        return bad(ctx, "a page table's page numbers are not ascending below the pages taken");
    }
    /* pages holding tokens not yet quantized in every layer must all be there */
    for (uint32_t j = never_before / P; j < seq->page_end; j++, ctx->load_work.steps++)
      if (kvq_page_entry(seq, j) == UINT32_MAX) return bad(ctx, "a page table lacks a page still in use");
    for (uint32_t e = 0; e < seq->page_count; e++) {
      ctx->load_work.steps += P; /* masks_possible visits the page's positions */
      for (uint32_t w = 0; w < words; w++) seq->alive[e * words + w] = kvq_get_u32(r);
      if (r->short_read || !masks_possible(cache, seq->alive + e * words, seq->page_index[e], p.sinks, never_before))
        return bad(ctx, "a page's kept-token masks are impossible");
    }
    /* the statistics: exactly the kept positions below `end`, ascending */
    const uint32_t count = kvq_get_u32(r);
    if (r->short_read || count > end) return bad(ctx, "policy statistics out of range");
    seq->tracked.count = seq->tracked.end = 0;
    if (!kvq_policy_tracks(&p)) {
      if (count != 0) return bad(ctx, "statistics for a policy that keeps none");
      seq->tracked.end = end;
      continue;
    }
    ctx->load_work.reserved += count;
    kvq_status st = kvq_tracked_reserve(cache, seq, count);
    if (st != KVQ_OK) return st;
    kvq_tracked *t = &seq->tracked;
    uint32_t expect = 0; /* the next kept position */
    for (uint32_t k = 0; k < count; k++, ctx->load_work.steps++) {
      const uint32_t position = kvq_get_u32(r);
      uint64_t a = kvq_get_u64(r);
      double attention;
      memcpy(&attention, &a, 8);
      const float key_error = bits_float(kvq_get_u32(r)), value_error = bits_float(kvq_get_u32(r));
      while (expect < end && expect / P < seq->page_end) {
        ctx->load_work.steps++;
        const uint32_t e = kvq_page_entry(seq, expect / P);
        if (e != UINT32_MAX && kvq_token_kept(cache, seq, e, expect % P)) break;
        expect++;
      }
      if (r->short_read || position != expect || position >= end || !(attention >= 0.0) || isinf(attention) ||
          !(key_error >= 0.0f) || isinf(key_error) || !(value_error >= 0.0f) || isinf(value_error))
        return bad(ctx, "policy statistics do not match the kept tokens");
      t->position[k] = position;
      t->attention[k] = attention;
      t->key_error[k] = key_error;
      t->value_error[k] = value_error;
      expect++;
    }
    t->count = count;
    t->end = end;
    /* nothing kept may be left without statistics */
    for (; expect < end; expect++, ctx->load_work.steps++) {
      const uint32_t e = expect / P < seq->page_end ? kvq_page_entry(seq, expect / P) : 0;
      if (expect / P >= seq->page_end || (e != UINT32_MAX && kvq_token_kept(cache, seq, e, expect % P)))
        return bad(ctx, "a kept token has no policy statistics");
    }
  }
  return KVQ_OK;
}
