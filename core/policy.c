/*
 * Token policies: StreamingLLM (Xiao et al.), H2O (Zhang et al.) and Q-Hitter (Zhang et al.,
 * ../shared/papers/002, Algorithm 1), decided on the host from statistics the jobs produce.
 *
 * A sequence's kept tokens below `tracked.end` carry their accumulated attention A_t (added after
 * every kvq_attention call from the SOFTMAX job's per-slot sums) and, for Q-Hitter, the errors
 * E^K_t and E^V_t (added when a page is quantized whole, from the QUANTIZE job's per-token errors;
 * each page is quantized whole exactly once per layer). A decision evicts candidates: the tokens
 * past the sinks and before the recent window, which by the rule recent >= R + P all lie in whole
 * pages quantized in every layer.
 */
#include "policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvq_policy_tracks(const kvq_policy_config *p) { return p->kind == KVQ_POLICY_H2O || p->kind == KVQ_POLICY_QHITTER; }
int kvq_policy_needs_errors(const kvq_policy_config *p) { return p->kind == KVQ_POLICY_QHITTER; }

uint32_t kvq_policy_candidates_kept(const kvq_policy_config *p, uint32_t n) {
  if (!kvq_policy_tracks(p)) return 0; /* StreamingLLM evicts every candidate */
  return p->heavy_fraction > 0.0f ? (uint32_t)floor((double)p->heavy_fraction * n) : p->heavy;
}

kvq_policy_config kvq_policy_defaults(kvq_policy_kind kind) {
  kvq_policy_config p = {.kind = kind, .sinks = 4, .recent = 0, .heavy = 0, .heavy_fraction = 0.2f, .lambda = 0.5f};
  if (kind == KVQ_POLICY_KEEP_ALL) p = (kvq_policy_config){0};
  if (kind == KVQ_POLICY_STREAMING) p.heavy_fraction = 0.0f;
  return p;
}

kvq_status kvq_policy_validate(const kvq_policy_config *p, uint32_t page_size, uint32_t residual_window, char *message,
                               size_t size) {
  /* kvq_cache_config_check allows message == NULL with any size; snprintf may only skip writing
   * when the size is 0 */
  if (!message) size = 0;
  if ((unsigned)p->kind > KVQ_POLICY_QHITTER) {
    snprintf(message, size, "policy.kind = %d: must be KEEP_ALL, STREAMING, H2O or QHITTER", (int)p->kind);
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  if (p->kind == KVQ_POLICY_KEEP_ALL) return KVQ_OK;
  const uint64_t minimum = (uint64_t)residual_window + page_size;
  if (p->recent != 0 && p->recent < minimum) {
    snprintf(message, size,
             "policy.recent = %u: must be 0 (the minimum) or at least residual_window + page_size (%llu), so that "
             "no token in the full-precision window is evicted",
             p->recent, (unsigned long long)minimum);
    return KVQ_ERROR_OUT_OF_RANGE;
  }
  /* positions are 32-bit signed in jobs and kernels; the message names the field at fault */
  const struct {
    const char *name;
    uint32_t value;
  } counts[] = {{"sinks", p->sinks}, {"recent", p->recent}, {"heavy", p->heavy}};
  for (int i = 0; i < 3; i++)
    if (counts[i].value > 0x7fffffffu) {
      snprintf(message, size, "policy.%s = %u: must be below 2^31", counts[i].name, counts[i].value);
      return KVQ_ERROR_OUT_OF_RANGE;
    }
  if (!(p->heavy_fraction >= 0.0f && p->heavy_fraction <= 1.0f)) {
    snprintf(message, size, "policy.heavy_fraction = %g: must be from 0 to 1", (double)p->heavy_fraction);
    return KVQ_ERROR_OUT_OF_RANGE;
  }
  if (!(p->lambda >= 0.0f && p->lambda <= 1.0f)) {
    snprintf(message, size, "policy.lambda = %g: must be from 0 to 1", (double)p->lambda);
    return KVQ_ERROR_OUT_OF_RANGE;
  }
  return KVQ_OK;
}

void kvq_tracked_free(kvq_tracked *t) {
  free(t->position);
  free(t->attention);
  free(t->key_error);
  free(t->value_error);
  memset(t, 0, sizeof *t);
}

kvq_status kvq_tracked_reserve(kvq_cache *cache, kvq_sequence *seq, uint32_t end) {
  kvq_tracked *t = &seq->tracked;
  if (!kvq_policy_tracks(&cache->config.policy) || end <= t->end) return KVQ_OK;
  const uint64_t need = (uint64_t)t->count + (end - t->end);
  if (need <= t->capacity) return KVQ_OK;
  uint64_t capacity = t->capacity ? t->capacity : 256;
  while (capacity < need) capacity *= 2;
  uint32_t *position = realloc(t->position, sizeof *position * capacity);
  if (position) t->position = position;
  double *attention = position ? realloc(t->attention, sizeof *attention * capacity) : NULL;
  if (attention) t->attention = attention;
  float *key_error = attention ? realloc(t->key_error, sizeof *key_error * capacity) : NULL;
  if (key_error) t->key_error = key_error;
  float *value_error = key_error ? realloc(t->value_error, sizeof *value_error * capacity) : NULL;
  if (value_error) t->value_error = value_error;
  if (!value_error) return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for token statistics");
  t->capacity = (uint32_t)capacity;
  return KVQ_OK;
}

void kvq_tracked_extend(kvq_sequence *seq, uint32_t end) {
  kvq_tracked *t = &seq->tracked;
  if (!t->position) { /* a policy without statistics: only the end moves */
    t->end = end > t->end ? end : t->end;
    return;
  }
  for (uint32_t p = t->end; p < end; p++) {
    t->position[t->count] = p;
    t->attention[t->count] = 0.0;
    t->key_error[t->count] = t->value_error[t->count] = 0.0f;
    t->count++;
  }
  t->end = end > t->end ? end : t->end;
}

/* The first entry at or after a position. */
static uint32_t lower_bound(const kvq_tracked *t, uint32_t position) {
  uint32_t lo = 0, hi = t->count;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (t->position[mid] < position) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

uint32_t kvq_tracked_find(const kvq_tracked *t, uint32_t position) {
  const uint32_t k = lower_bound(t, position);
  return k < t->count && t->position[k] == position ? k : UINT32_MAX;
}

void kvq_policy_add_attention(const kvq_cache *cache, kvq_sequence *seq, const kvq_layer_view *view, const double *sums) {
  kvq_tracked *t = &seq->tracked;
  if (!t->position) return;
  const uint32_t P = cache->config.page_size;
  uint32_t k = 0; /* positions ascend with slots, so one forward walk finds every kept token */
  for (uint32_t e = 0; e < view->pages; e++) {
    const uint32_t valid = e + 1 == view->pages ? view->slots - e * P : P;
    for (uint32_t i = 0; i < valid; i++) {
      if (!kvq_token_kept(cache, seq, e, i)) continue;
      const uint32_t position = seq->page_index[e] * P + i;
      while (k < t->count && t->position[k] < position) k++;
      if (k < t->count && t->position[k] == position) t->attention[k] += sums[e * P + i];
    }
  }
  for (uint32_t w = 0; w < view->window; w++) {
    const uint32_t position = view->window_first + w;
    while (k < t->count && t->position[k] < position) k++;
    if (k < t->count && t->position[k] == position) t->attention[k] += sums[view->slots + w];
  }
}

void kvq_policy_add_errors(const kvq_cache *cache, kvq_sequence *seq, int side, uint32_t first_page, uint32_t pages,
                           uint32_t kv_heads, const float *errors) {
  kvq_tracked *t = &seq->tracked;
  if (!t->position) return;
  const uint32_t P = cache->config.page_size;
  float *target = side ? t->value_error : t->key_error;
  for (uint32_t i = 0; i < pages; i++) {
    const uint32_t first = (first_page + i) * P;
    uint32_t k = lower_bound(t, first);
    for (uint32_t j = 0; j < P; j++) {
      while (k < t->count && t->position[k] < first + j) k++;
      if (k >= t->count || t->position[k] != first + j) continue;
      double sum = 0.0;
      for (uint32_t h = 0; h < kv_heads; h++) sum += errors[((size_t)i * P + j) * kv_heads + h];
      target[k] += (float)sum;
    }
  }
}

int kvq_sequence_in_step(const kvq_cache *cache, const kvq_sequence *seq) {
  for (uint32_t l = 1; l < cache->config.layer_count; l++)
    if (seq->layers[l].tokens != seq->layers[0].tokens) return 0;
  return 1;
}

typedef struct ranked {
  double score, attention;
  uint32_t position, index;
} ranked;

/* Best first: higher score, then higher attention, then the older token. */
static int by_rank(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->attention != y->attention) return x->attention > y->attention ? -1 : 1;
  return x->position < y->position ? -1 : x->position > y->position;
}

/* Clears a token's kept bit in a copy of the sequence's masks (a plan's). */
static void evict(const kvq_cache *cache, const kvq_sequence *seq, uint32_t *alive, uint32_t position) {
  const uint32_t P = cache->config.page_size, e = kvq_page_entry(seq, position / P), i = position % P;
  if (e != UINT32_MAX) alive[e * cache->alive_words + i / 32] &= ~(1u << (i % 32));
}

/* Returns the pages whose tokens were all evicted to the pool. */
static void release_empty_pages(kvq_cache *cache, kvq_sequence *seq) {
  for (uint32_t e = seq->page_count; e-- > 0;) {
    uint32_t any = 0;
    for (uint32_t w = 0; w < cache->alive_words; w++) any |= seq->alive[e * cache->alive_words + w];
    if (!any) kvq_release_entry(cache, seq, e);
  }
}

/* The candidates of an H2O or Q-Hitter decision ranked best first (*r allocated, *count of them),
 * and how many the decision keeps. KVQ_OK with *r NULL when nothing would be evicted. */
static kvq_status rank_candidates(const kvq_cache *cache, const kvq_sequence *seq, ranked **out, uint32_t *count,
                                  uint32_t *keep) {
  const kvq_policy_config *p = &cache->config.policy;
  const kvq_tracked *t = &seq->tracked;
  const uint32_t n = seq->layers[0].tokens;
  const uint32_t first = p->sinks, last = n > p->recent ? n - p->recent : 0; /* candidates: [first, last) */
  const uint32_t heavy = kvq_policy_candidates_kept(p, n);
  *out = NULL;
  *count = 0;
  *keep = heavy;
  if (first >= last || !t->position) return KVQ_OK;
  const uint32_t lo = lower_bound(t, first), hi = lower_bound(t, last);
  const uint32_t candidates = hi - lo;
  if (candidates <= heavy) return KVQ_OK;
  ranked *r = malloc(sizeof *r * candidates);
  if (!r) return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for a token policy");
  double a_max = 0.0, k_max = 0.0, v_max = 0.0;
  for (uint32_t k = lo; k < hi; k++) {
    a_max = t->attention[k] > a_max ? t->attention[k] : a_max;
    k_max = t->key_error[k] > k_max ? t->key_error[k] : k_max;
    v_max = t->value_error[k] > v_max ? t->value_error[k] : v_max;
  }
  const double lambda = p->lambda;
  for (uint32_t k = lo; k < hi; k++) {
    double score = t->attention[k];
    if (p->kind == KVQ_POLICY_QHITTER) {
      const double a = a_max > 0.0 ? t->attention[k] / a_max : 0.0;
      const double ek = k_max > 0.0 ? t->key_error[k] / k_max : 0.0, ev = v_max > 0.0 ? t->value_error[k] / v_max : 0.0;
      score = lambda * a + (1.0 - lambda) * (2.0 - ek - ev) / 2.0;
    }
    r[k - lo] = (ranked){score, t->attention[k], t->position[k], k};
  }
  qsort(r, candidates, sizeof *r, by_rank);
  *out = r;
  *count = candidates;
  return KVQ_OK;
}

double kvq_policy_margin(const kvq_cache *cache, const kvq_sequence *seq) {
  const kvq_policy_config *p = &cache->config.policy;
  if (!kvq_policy_tracks(p)) return INFINITY;
  ranked *r;
  uint32_t count, keep;
  if (rank_candidates(cache, seq, &r, &count, &keep) != KVQ_OK || !r || keep == 0) {
    free(r);
    return INFINITY; /* no decision, or every candidate goes: nothing depends on the scores */
  }
  double scale = 0.0;
  for (uint32_t k = 0; k < count; k++) scale = fabs(r[k].score) > scale ? fabs(r[k].score) : scale;
  const double margin = scale > 0.0 ? (r[keep - 1].score - r[keep].score) / scale : 0.0;
  free(r);
  return margin;
}

void kvq_policy_plan_free(kvq_policy_plan *plan) {
  free(plan->alive);
  free(plan->drop);
  memset(plan, 0, sizeof *plan);
}

kvq_status kvq_policy_plan_make(const kvq_cache *cache, const kvq_sequence *seq, kvq_policy_plan *plan) {
  memset(plan, 0, sizeof *plan);
  const kvq_policy_config *p = &cache->config.policy;
  if (p->kind == KVQ_POLICY_KEEP_ALL) return KVQ_OK;
  const uint32_t P = cache->config.page_size, n = seq->layers[0].tokens, words = cache->alive_words;
  const uint32_t first = p->sinks, last = n > p->recent ? n - p->recent : 0; /* candidates: [first, last) */
  if (first >= last) return KVQ_OK;
  ranked *r = NULL;
  uint32_t candidates = 0, heavy = 0;
  if (p->kind != KVQ_POLICY_STREAMING) {
    kvq_status st = rank_candidates(cache, seq, &r, &candidates, &heavy);
    if (st != KVQ_OK || !r) return st;
  }
  plan->alive = malloc(sizeof(uint32_t) * ((size_t)seq->page_count * words + 1));
  plan->drop = r ? calloc(seq->tracked.count, 1) : NULL;
  if (!plan->alive || (r && !plan->drop)) {
    free(r);
    kvq_policy_plan_free(plan);
    return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for a token policy");
  }
  memcpy(plan->alive, seq->alive, sizeof(uint32_t) * seq->page_count * words);
  if (!r) { /* STREAMING: every candidate goes */
    for (uint32_t e = 0; e < seq->page_count && seq->page_index[e] * P < last; e++)
      for (uint32_t i = 0; i < P; i++) {
        const uint32_t position = seq->page_index[e] * P + i;
        if (position >= first && position < last) evict(cache, seq, plan->alive, position);
      }
  } else {
    for (uint32_t k = heavy; k < candidates; k++) {
      evict(cache, seq, plan->alive, r[k].position);
      plan->drop[r[k].index] = 1;
    }
    free(r);
  }
  for (uint32_t e = 0; e < seq->page_count; e++) {
    uint32_t any = 0;
    for (uint32_t w = 0; w < words; w++) any |= plan->alive[e * words + w];
    plan->pages_freed += !any;
  }
  return KVQ_OK;
}

void kvq_policy_plan_apply(kvq_cache *cache, kvq_sequence *seq, kvq_policy_plan *plan) {
  if (plan->alive) {
    const size_t words = (size_t)seq->page_count * cache->alive_words;
    size_t first = 0, last = words; /* the words whose kept tokens change: [first, last) */
    while (first < words && seq->alive[first] == plan->alive[first]) first++;
    while (last > first && seq->alive[last - 1] == plan->alive[last - 1]) last--;
    if (first < last)
      kvq_page_masks_changed(seq, (uint32_t)(first / cache->alive_words), (uint32_t)((last - 1) / cache->alive_words + 1));
    memcpy(seq->alive, plan->alive, sizeof(uint32_t) * words);
  }
  if (plan->drop) {
    kvq_tracked *t = &seq->tracked;
    uint32_t kept = 0;
    for (uint32_t k = 0; k < t->count; k++) {
      if (plan->drop[k]) continue;
      t->position[kept] = t->position[k];
      t->attention[kept] = t->attention[k];
      t->key_error[kept] = t->key_error[k];
      t->value_error[kept] = t->value_error[k];
      kept++;
    }
    t->count = kept;
  }
  if (plan->alive) release_empty_pages(cache, seq);
  kvq_policy_plan_free(plan);
}

kvq_status kvq_policy_run(kvq_cache *cache, kvq_sequence *seq) {
  kvq_policy_plan plan;
  const kvq_status st = kvq_policy_plan_make(cache, seq, &plan);
  if (st == KVQ_OK) kvq_policy_plan_apply(cache, seq, &plan);
  return st;
}

kvq_status kvq_sequence_token_stats(const kvq_cache *cache, uint32_t id, kvq_token_stats *stats, size_t capacity,
                                    size_t *count) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_status st;
  const kvq_sequence *seq = kvq_sequence_lookup(cache, id, "kvq_sequence_token_stats", &st);
  if (!seq) return st;
  if (!count) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_sequence_token_stats: count is NULL");
  if (!kvq_policy_tracks(&cache->config.policy))
    return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT,
                    "kvq_sequence_token_stats: the cache's policy keeps no statistics (only H2O and Q-Hitter do)");
  const kvq_tracked *t = &seq->tracked;
  /* a failing call writes nothing, *count included (kvq.h); stats == NULL asks for the count */
  if (stats && capacity < t->count)
    return kvq_fail(cache->ctx, KVQ_ERROR_CAPACITY, "kvq_sequence_token_stats: %u tokens, room for %zu", t->count, capacity);
  for (uint32_t k = 0; stats && k < t->count; k++)
    stats[k] = (kvq_token_stats){t->position[k], t->attention[k], t->key_error[k], t->value_error[k]};
  *count = t->count;
  return KVQ_OK;
}

kvq_status kvq_sequence_apply_policy(kvq_cache *cache, uint32_t id) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_status st;
  kvq_sequence *seq = kvq_sequence_lookup(cache, id, "kvq_sequence_apply_policy", &st);
  if (!seq) return st;
  if (!kvq_sequence_in_step(cache, seq))
    return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT,
                    "kvq_sequence_apply_policy: the layers of sequence %u hold different numbers of tokens (append to "
                    "every layer first)",
                    id);
  return kvq_policy_run(cache, seq);
}
