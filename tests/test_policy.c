/*
 * Token policies (kvq.h, "Token policies"):
 *   - the statistics are what the attention calls and the quantizer produced: A_t equals the summed
 *     probabilities kvq_scores reports for the same queries, E^K_t and E^V_t the norms of x - x^ of
 *     kvq_dequantize, up to the one fp32 rounding each stored sum takes (derived below);
 *   - with that fixed history the kept set is exactly what the formula selects (an independent
 *     implementation of the documented rule), for H2O and for Q-Hitter at lambda 0, 0.5 and 1, on
 *     data where the two policies disagree;
 *   - lambda = 1 reproduces H2O step by step over a stream with evictions;
 *   - a stream many times the pool's capacity runs with bounded pages, kept tokens and statistics,
 *     and the pool is whole at the end (plus ASan's leak check in the sanitized build);
 *   - attention covers exactly the kept tokens; save/load keeps the state and the stream goes on
 *     identically.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

typedef struct stream {
  uint32_t layers, hq, hkv, d, n;
  float *k, *v, *q; /* [n][hkv][d], [n][hkv][d], [n][hq][d] (the same data in every layer) */
} stream;

static stream make_stream(uint32_t layers, uint32_t hq, uint32_t hkv, uint32_t d, uint32_t n, uint64_t seed) {
  stream s = {layers, hq, hkv, d, n, malloc(sizeof(float) * n * hkv * d), malloc(sizeof(float) * n * hkv * d),
              malloc(sizeof(float) * n * hq * d)};
  kvq_synth_config sc = kvq_synth_defaults(n, hkv, hq, d, seed);
  cr_assert_eq(kvq_synth_generate(&sc, s.k, s.v, s.q), 0);
  return s;
}

static void free_stream(stream *s) { free(s->k), free(s->v), free(s->q); }

/* Attention of queries [first, first + rows) (causal) in one layer; out may be NULL. */
static void attend(kvq_context *ctx, kvq_cache *cache, uint32_t seq, uint32_t layer, const stream *s, uint32_t first,
                   uint32_t rows, kvq_mask mask, float *out) {
  float *scratch = out ? out : malloc(sizeof(float) * rows * s->hq * s->d);
  int64_t shape[3] = {rows, s->hq, s->d};
  kvq_attention_request r = {seq, mask, kvq_tensor_host(s->q + (size_t)first * s->hq * s->d, KVQ_DTYPE_F32, 3, shape),
                             kvq_tensor_host(scratch, KVQ_DTYPE_F32, 3, shape)};
  KVQ_CHECK(ctx, kvq_attention(cache, layer, &r, 1));
  if (!out) free(scratch);
}

/* One decoding step: token t appended to every layer, then its query attends in every layer. */
static void step(kvq_context *ctx, kvq_cache *cache, uint32_t seq, const stream *s, uint32_t t, float *out) {
  for (uint32_t l = 0; l < s->layers; l++) {
    th_append(ctx, cache, seq, l, s->k, s->v, t, 1, s->hkv, s->d, KVQ_DTYPE_F32);
    attend(ctx, cache, seq, l, s, t, 1, KVQ_MASK_CAUSAL, out ? out + (size_t)l * s->hq * s->d : NULL);
  }
}

static uint32_t *positions_of(kvq_context *ctx, kvq_cache *cache, uint32_t seq, uint32_t layer, size_t *count) {
  KVQ_CHECK(ctx, kvq_sequence_positions(cache, seq, layer, NULL, 0, count));
  uint32_t *p = malloc(sizeof(uint32_t) * (*count + 1));
  KVQ_CHECK(ctx, kvq_sequence_positions(cache, seq, layer, p, *count, count));
  return p;
}

static kvq_token_stats *stats_of(kvq_context *ctx, kvq_cache *cache, uint32_t seq, size_t *count) {
  KVQ_CHECK(ctx, kvq_sequence_token_stats(cache, seq, NULL, 0, count));
  kvq_token_stats *st = malloc(sizeof *st * (*count + 1));
  KVQ_CHECK(ctx, kvq_sequence_token_stats(cache, seq, st, *count, count));
  return st;
}

static kvq_policy_config policy(kvq_policy_kind kind, uint32_t sinks, uint32_t recent, uint32_t heavy, float lambda) {
  kvq_policy_config p = kvq_policy_defaults(kind);
  p.sinks = sinks, p.recent = recent, p.heavy = heavy, p.heavy_fraction = 0.0f, p.lambda = lambda;
  return p;
}

/* ---- The documented rule, implemented again for the test ------------------------------------- */

typedef struct cand {
  double score, attention;
  uint32_t position;
} cand;

static int better(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->attention != y->attention) return x->attention > y->attention ? -1 : 1;
  return x->position < y->position ? -1 : 1;
}

/* The positions a policy keeps of n tokens with these statistics (all positions tracked), ascending
 * in keep[]; returns how many. */
static size_t expected_kept(const kvq_policy_config *p, const kvq_token_stats *st, size_t count, uint32_t n, uint32_t *keep) {
  const uint32_t last = n > p->recent ? n - p->recent : 0;
  cand *c = malloc(sizeof *c * count);
  size_t cands = 0, kept = 0;
  double a_max = 0, k_max = 0, v_max = 0;
  for (size_t i = 0; i < count; i++)
    if (st[i].position >= p->sinks && st[i].position < last) {
      a_max = fmax(a_max, st[i].attention), k_max = fmax(k_max, st[i].key_error), v_max = fmax(v_max, st[i].value_error);
    }
  for (size_t i = 0; i < count; i++) {
    if (st[i].position < p->sinks || st[i].position >= last) continue;
    double score = st[i].attention;
    if (p->kind == KVQ_POLICY_QHITTER)
      score = p->lambda * (a_max > 0 ? st[i].attention / a_max : 0) +
              (1.0 - p->lambda) * (2.0 - (k_max > 0 ? st[i].key_error / k_max : 0) - (v_max > 0 ? st[i].value_error / v_max : 0)) / 2.0;
    c[cands++] = (cand){score, st[i].attention, st[i].position};
  }
  qsort(c, cands, sizeof *c, better);
  uint8_t *mark = calloc(n, 1);
  for (size_t i = 0; i < count; i++)
    if (st[i].position < p->sinks || st[i].position >= last) mark[st[i].position] = 1;
  for (size_t i = 0; i < cands && i < p->heavy; i++) mark[c[i].position] = 1;
  for (uint32_t t = 0; t < n; t++)
    if (mark[t]) keep[kept++] = t;
  free(mark);
  free(c);
  return kept;
}

/* ---- Statistics and the formula on a fixed history ------------------------------------------- */

/*
 * Two layers, uniform 2-bit keys (large per-token errors on the outlier-heavy synthetic data) and
 * 3-bit values, a 96-token prefill in one append per layer (the policy has nothing to do before),
 * then a history of attention calls: the causal prefill block and an unmasked block per layer.
 * Tolerances: every call writes its per-token sums as fp32 after summing in double, so A_t differs
 * from the double sum of the fp32 probabilities of kvq_scores by at most 2^-24 of each call's sum,
 * i.e. 2^-24 A_t in total (plus 1e-30 for zeros); each error is an fp32 rounding of a double norm per
 * (layer, head), summed in double and rounded again: within 2^-23 E_t.
 */
Test(policy, statistics_and_formula_on_a_fixed_history, .timeout = 120) {
  const uint32_t L = 2, hq = 4, hkv = 2, d = 32, n = 96, P = 16;
  stream s = make_stream(L, hq, hkv, d, n, 21);
  kvq_layer_config layers[2];
  for (uint32_t l = 0; l < L; l++) layers[l] = th_layer(hq, hkv, d, th_uniform(2, 16), th_uniform(3, 16));
  const kvq_policy_kind kinds[4] = {KVQ_POLICY_H2O, KVQ_POLICY_QHITTER, KVQ_POLICY_QHITTER, KVQ_POLICY_QHITTER};
  const float lambdas[4] = {0.0f, 0.5f, 0.0f, 1.0f};
  uint32_t *sets[4];
  size_t sizes[4];
  for (int run = 0; run < 4; run++) {
    kvq_cache_config config = th_config(layers, L, KVQ_DTYPE_F32, P, 0, 16, 1, 4);
    config.policy = policy(kinds[run], 3, 16, 20, lambdas[run]);
    kvq_context *ctx = th_cpu_context();
    kvq_cache *cache;
    KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
    uint32_t seq;
    KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
    for (uint32_t l = 0; l < L; l++) th_append(ctx, cache, seq, l, s.k, s.v, 0, n, hkv, d, KVQ_DTYPE_F32);
    /* the history, and the same probabilities from kvq_scores (which adds nothing) */
    double *expect = calloc(n, sizeof(double));
    float *probs = malloc(sizeof(float) * n * hq * n);
    for (uint32_t l = 0; l < L; l++)
      for (int block = 0; block < 2; block++) {
        const uint32_t first = block ? n - 8 : 0, rows = block ? 8 : n;
        const kvq_mask mask = block ? KVQ_MASK_NONE : KVQ_MASK_CAUSAL;
        attend(ctx, cache, seq, l, &s, first, rows, mask, NULL);
        int64_t qs[3] = {rows, hq, d}, ps[3] = {rows, hq, n};
        kvq_tensor qt = kvq_tensor_host(s.q + (size_t)first * hq * d, KVQ_DTYPE_F32, 3, qs);
        kvq_tensor pt = kvq_tensor_host(probs, KVQ_DTYPE_F32, 3, ps);
        KVQ_CHECK(ctx, kvq_scores(cache, seq, l, &qt, mask, KVQ_SCORES_PROBABILITIES, &pt));
        for (uint32_t r = 0; r < rows * hq; r++)
          for (uint32_t t = 0; t < n; t++) expect[t] += probs[(size_t)r * n + t];
      }
    size_t count;
    kvq_token_stats *st = stats_of(ctx, cache, seq, &count);
    cr_assert_eq(count, n, "every appended token has statistics");
    /* errors from the dequantized tokens */
    float *kd = malloc(sizeof(float) * n * hkv * d), *vd = malloc(sizeof(float) * n * hkv * d);
    int64_t ks[3] = {n, hkv, d};
    kvq_tensor kt = kvq_tensor_host(kd, KVQ_DTYPE_F32, 3, ks), vt = kvq_tensor_host(vd, KVQ_DTYPE_F32, 3, ks);
    double *ek = calloc(n, sizeof(double)), *ev = calloc(n, sizeof(double));
    for (uint32_t l = 0; l < L; l++) {
      KVQ_CHECK(ctx, kvq_dequantize(cache, seq, l, 0, n, &kt, &vt));
      for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < hkv; h++) {
          double a = 0, b = 0;
          for (uint32_t c = 0; c < d; c++) {
            const size_t i = ((size_t)t * hkv + h) * d + c;
            a += ((double)s.k[i] - kd[i]) * ((double)s.k[i] - kd[i]);
            b += ((double)s.v[i] - vd[i]) * ((double)s.v[i] - vd[i]);
          }
          ek[t] += sqrt(a), ev[t] += sqrt(b);
        }
    }
    const int errors = kinds[run] == KVQ_POLICY_QHITTER;
    for (uint32_t t = 0; t < n; t++) {
      cr_assert_eq(st[t].position, t);
      cr_assert(fabs(st[t].attention - expect[t]) <= 0x1p-24 * expect[t] + 1e-30, "A_%u = %.17g, summed %.17g", t,
                st[t].attention, expect[t]);
      /* only whole pages carry errors: the last partial page (n = 96 is whole here) would not */
      const double want_k = errors ? ek[t] : 0, want_v = errors ? ev[t] : 0;
      cr_assert(fabs(st[t].key_error - want_k) <= 0x1p-23 * want_k, "E^K_%u = %g, expected %g", t, st[t].key_error, want_k);
      cr_assert(fabs(st[t].value_error - want_v) <= 0x1p-23 * want_v, "E^V_%u = %g, expected %g", t, st[t].value_error, want_v);
    }
    /* the decision */
    uint32_t *want = malloc(sizeof(uint32_t) * n);
    const size_t wanted = expected_kept(&config.policy, st, count, n, want);
    cr_assert_eq(wanted, 3 + 20 + 16u);
    KVQ_CHECK(ctx, kvq_sequence_apply_policy(cache, seq));
    for (uint32_t l = 0; l < L; l++) {
      size_t kept;
      uint32_t *got = positions_of(ctx, cache, seq, l, &kept);
      cr_assert_eq(kept, wanted, "run %d layer %u keeps %zu tokens, the formula %zu", run, l, kept, wanted);
      for (size_t i = 0; i < kept; i++) cr_assert_eq(got[i], want[i], "run %d layer %u: kept token %zu", run, l, i);
      if (l == 0) sets[run] = got, sizes[run] = kept;
      else free(got);
    }
    /* the statistics shrink to the kept tokens; attention now sees only them */
    free(st);
    st = stats_of(ctx, cache, seq, &count);
    cr_assert_eq(count, wanted);
    kvq_sequence_info info;
    KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seq, 1, &info));
    cr_assert_eq(info.kept_tokens, wanted);
    cr_assert_eq(info.tokens, n);
    free(st), free(want), free(kd), free(vd), free(ek), free(ev), free(expect), free(probs);
    kvq_cache_destroy(cache);
    kvq_context_destroy(ctx);
  }
  /* lambda = 1 selects as H2O; on this data lambda 0.5 and 0 select otherwise (so the test can tell
   * the formulas apart) */
  cr_assert_eq(sizes[0], sizes[3]);
  cr_assert_eq(memcmp(sets[0], sets[3], sizeof(uint32_t) * sizes[0]), 0, "Q-Hitter with lambda 1 is H2O");
  cr_assert_neq(memcmp(sets[0], sets[1], sizeof(uint32_t) * sizes[0]), 0, "lambda 0.5 must differ from H2O here");
  cr_assert_neq(memcmp(sets[1], sets[2], sizeof(uint32_t) * sizes[0]), 0, "lambda 0 must differ from 0.5 here");
  for (int run = 0; run < 4; run++) free(sets[run]);
  free_stream(&s);
}

/* ---- Streams ------------------------------------------------------------------------------------ */

/*
 * lambda = 1 reproduces H2O at every step of a stream with evictions: same kept positions and the
 * same attention outputs (bit for bit: the same tokens give the same computation).
 */
Test(policy, lambda_one_reproduces_h2o_over_a_stream, .timeout = 120) {
  const uint32_t hq = 4, hkv = 1, d = 32, n = 400, P = 16;
  stream s = make_stream(1, hq, hkv, d, n, 33);
  kvq_layer_config layer = th_layer(hq, hkv, d, th_uniform(2, 16), th_uniform(2, 16));
  kvq_context *ctx = th_cpu_context();
  kvq_cache *caches[2];
  uint32_t seqs[2];
  for (int i = 0; i < 2; i++) {
    kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 16, 24, 1, 8);
    config.policy = policy(i ? KVQ_POLICY_QHITTER : KVQ_POLICY_H2O, 4, 48, 24, 1.0f);
    KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &caches[i]));
    KVQ_CHECK(ctx, kvq_sequence_add(caches[i], &seqs[i]));
  }
  float out[2][4 * 32];
  uint32_t evictions = 0;
  for (uint32_t t = 0; t < n; t++) {
    for (int i = 0; i < 2; i++) step(ctx, caches[i], seqs[i], &s, t, out[i]);
    cr_assert_eq(memcmp(out[0], out[1], sizeof out[0]), 0, "step %u: outputs differ", t);
    size_t a, b;
    uint32_t *pa = positions_of(ctx, caches[0], seqs[0], 0, &a), *pb = positions_of(ctx, caches[1], seqs[1], 0, &b);
    cr_assert_eq(a, b, "step %u", t);
    cr_assert_eq(memcmp(pa, pb, sizeof(uint32_t) * a), 0, "step %u: kept sets differ", t);
    evictions = t + 1 - (uint32_t)a;
    free(pa), free(pb);
  }
  cr_assert_gt(evictions, n / 2, "the stream must evict (%u evicted)", evictions);
  for (int i = 0; i < 2; i++) kvq_cache_destroy(caches[i]);
  kvq_context_destroy(ctx);
  free_stream(&s);
}

/*
 * Two sequences stream through every evicting policy, the first one 12 times the pool's capacity.
 * A pool of 13 pages of 16 tokens per sequence suffices for the worst case: sinks 4 (1 page), 8 heavy
 * hitters in up to 8 pages, and recent 32 plus the step's new token across up to 4 pages (the second
 * sequence pauses now and then). At every step the kept tokens are at most
 * sinks + heavy + recent + 1, and the page table at most 13 entries; at the end every page is back
 * in the pool.
 */
Test(policy, streams_many_times_the_capacity, .timeout = 240) {
  const uint32_t hq = 2, hkv = 1, d = 16, P = 16, pool = 26, n = 5000;
  const kvq_policy_kind kinds[3] = {KVQ_POLICY_STREAMING, KVQ_POLICY_H2O, KVQ_POLICY_QHITTER};
  stream s = make_stream(2, hq, hkv, d, n, 44);
  kvq_layer_config layers[2] = {th_layer(hq, hkv, d, th_qjl(64, 2, 32), th_uniform(4, 16)),
                                th_layer(hq, hkv, d, th_uniform(2, 16), th_exact(KVQ_DTYPE_F16))};
  for (int k = 0; k < 3; k++) {
    kvq_cache_config config = th_config(layers, 2, KVQ_DTYPE_F32, P, 16, pool, 2, 9);
    config.policy = policy(kinds[k], 4, 32, 8, 0.5f);
    kvq_context *ctx = th_cpu_context();
    kvq_cache *cache;
    KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
    uint32_t seqs[2];
    for (int i = 0; i < 2; i++) KVQ_CHECK(ctx, kvq_sequence_add(cache, &seqs[i]));
    const uint32_t heavy = kinds[k] == KVQ_POLICY_STREAMING ? 0 : 8;
    for (uint32_t t = 0; t < n; t++)
      for (int i = 0; i < 2; i++) {
        if (i == 1 && (t / 100) % 2) continue; /* the second sequence pauses now and then */
        kvq_sequence_info info;
        KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seqs[i], 0, &info));
        step(ctx, cache, seqs[i], &s, (uint32_t)info.tokens, NULL);
        KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seqs[i], 1, &info));
        cr_assert_leq(info.kept_tokens, 4 + heavy + 32 + 1, "policy %d step %u: %llu kept", k, t,
                      (unsigned long long)info.kept_tokens);
        cr_assert_leq(info.pages, 13u, "policy %d step %u: %u pages", k, t, info.pages);
        if (kinds[k] != KVQ_POLICY_STREAMING) {
          size_t count;
          KVQ_CHECK(ctx, kvq_sequence_token_stats(cache, seqs[i], NULL, 0, &count));
          cr_assert_eq(count, info.kept_tokens, "statistics only for kept tokens");
        }
      }
    kvq_sequence_info info;
    KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seqs[0], 0, &info));
    cr_assert_eq(info.tokens, n, "the first sequence streamed all %u tokens", n);
    cr_assert_geq(info.tokens, 12ull * pool * P, "12 times the pool's capacity");
    kvq_memory_report before;
    KVQ_CHECK(ctx, kvq_cache_memory(cache, &before));
    for (int i = 0; i < 2; i++) KVQ_CHECK(ctx, kvq_sequence_free(cache, seqs[i]));
    kvq_memory_report after;
    KVQ_CHECK(ctx, kvq_cache_memory(cache, &after));
    cr_assert_eq(after.pages_used, 0u, "every page is back in the pool");
    kvq_cache_destroy(cache);
    kvq_context_destroy(ctx);
  }
  free_stream(&s);
}

/*
 * Attention covers exactly the kept tokens: with exact fp32 storage, the output of a query after
 * evictions equals exact attention over the kept tokens (positions from kvq_sequence_positions,
 * vectors from kvq_dequantize) within fp32 rounding: logits within 8 * 2^-24 |q||k| / sqrt(d) and
 * outputs within (e^(2 tau) - 1 + 2^-22) sum p |v| (test_attention.c's consistency bound), with
 * tau the logit bound.
 */
Test(policy, attention_covers_exactly_the_kept_tokens, .timeout = 120) {
  const uint32_t hq = 4, hkv = 2, d = 32, n = 300, P = 16;
  stream s = make_stream(1, hq, hkv, d, n, 55);
  kvq_layer_config layer = th_layer(hq, hkv, d, th_exact(KVQ_DTYPE_F32), th_exact(KVQ_DTYPE_F32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 0, 40, 1, 1);
  config.policy = policy(KVQ_POLICY_H2O, 4, 0, 30, 0.5f); /* recent 0: the minimum, R + P */
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  kvq_cache_config got;
  KVQ_CHECK(ctx, kvq_cache_get_config(cache, &got));
  cr_assert_eq(got.policy.recent, P, "recent 0 becomes residual_window + page_size");
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  for (uint32_t t = 0; t < n - 1; t++) step(ctx, cache, seq, &s, t, NULL);
  th_append(ctx, cache, seq, 0, s.k, s.v, n - 1, 1, hkv, d, KVQ_DTYPE_F32);
  size_t kept;
  uint32_t *pos = positions_of(ctx, cache, seq, 0, &kept);
  cr_assert_lt(kept, n / 4, "most tokens were evicted (%zu kept)", kept);
  float *kk = malloc(sizeof(float) * kept * hkv * d), *vv = malloc(sizeof(float) * kept * hkv * d);
  int64_t ks[3] = {(int64_t)kept, hkv, d};
  kvq_tensor kt = kvq_tensor_host(kk, KVQ_DTYPE_F32, 3, ks), vt = kvq_tensor_host(vv, KVQ_DTYPE_F32, 3, ks);
  KVQ_CHECK(ctx, kvq_dequantize(cache, seq, 0, 0, kept, &kt, &vt));
  for (size_t j = 0; j < kept; j++) /* exact storage: the kept tokens' own vectors */
    cr_assert_eq(memcmp(kk + j * hkv * d, s.k + (size_t)pos[j] * hkv * d, sizeof(float) * hkv * d), 0, "token %u", pos[j]);
  float out[4 * 32], logits[4 * 300];
  attend(ctx, cache, seq, 0, &s, n - 1, 1, KVQ_MASK_CAUSAL, out);
  int64_t qs[3] = {1, hq, d}, ls[3] = {1, hq, (int64_t)kept};
  kvq_tensor qt = kvq_tensor_host(s.q + (size_t)(n - 1) * hq * d, KVQ_DTYPE_F32, 3, qs);
  kvq_tensor lt = kvq_tensor_host(logits, KVQ_DTYPE_F32, 3, ls);
  KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &qt, KVQ_MASK_CAUSAL, KVQ_SCORES_LOGITS, &lt));
  double o_ref[4 * 32], p_ref[300];
  for (uint32_t h = 0; h < hq; h++) {
    const float *q = s.q + ((size_t)(n - 1) * hq + h) * d;
    const uint32_t kvh = h / (hq / hkv);
    double qn = 0, tau = 0, max = -INFINITY, z = 0;
    for (uint32_t c = 0; c < d; c++) qn += (double)q[c] * q[c];
    for (size_t j = 0; j < kept; j++) {
      const float *k = kk + (j * hkv + kvh) * d;
      double dot = 0, kn = 0;
      for (uint32_t c = 0; c < d; c++) dot += (double)q[c] * k[c], kn += (double)k[c] * k[c];
      const double logit = dot / sqrt((double)d), bound = 8 * 0x1p-24 * sqrt(qn * kn) / sqrt((double)d) + 0x1p-24 * fabs(logit);
      cr_assert(fabs(logits[h * kept + j] - logit) <= bound, "head %u token %u: logit %g, exact %g", h, pos[j],
                logits[h * kept + j], logit);
      tau = fmax(tau, bound);
      p_ref[j] = logit;
      max = fmax(max, logit);
    }
    for (size_t j = 0; j < kept; j++) z += exp(p_ref[j] - max);
    for (uint32_t c = 0; c < d; c++) o_ref[h * d + c] = 0;
    double weight[32] = {0};
    for (size_t j = 0; j < kept; j++) {
      const double p = exp(p_ref[j] - max) / z;
      for (uint32_t c = 0; c < d; c++) {
        o_ref[h * d + c] += p * vv[(j * hkv + kvh) * d + c];
        weight[c] += p * fabs(vv[(j * hkv + kvh) * d + c]);
      }
    }
    for (uint32_t c = 0; c < d; c++)
      cr_assert(fabs(out[h * d + c] - o_ref[h * d + c]) <= (exp(2 * tau) - 1 + 0x1p-22) * weight[c] + 0x1p-24 * fabs(o_ref[h * d + c]),
                "head %u channel %u: %g, exact over the kept tokens %g", h, c, out[h * d + c], o_ref[h * d + c]);
  }
  free(pos), free(kk), free(vv);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  free_stream(&s);
}

/*
 * A cache saved mid-stream loads with its policy, page numbers, kept masks and statistics: it
 * re-saves to the same bytes, and both caches go on identically (same kept sets, same outputs).
 */
Test(policy, save_and_load_mid_stream, .timeout = 120) {
  const uint32_t hq = 2, hkv = 1, d = 32, n = 260, P = 16;
  stream s = make_stream(2, hq, hkv, d, n, 66);
  kvq_layer_config layers[2] = {th_layer(hq, hkv, d, th_uniform(2, 16), th_uniform(2, 16)),
                                th_layer(hq, hkv, d, th_qjl(64, 0, 32), th_uniform(4, 32))};
  const kvq_policy_kind kinds[3] = {KVQ_POLICY_QHITTER, KVQ_POLICY_STREAMING, KVQ_POLICY_H2O};
  for (int k = 0; k < 3; k++) {
    kvq_cache_config config = th_config(layers, 2, KVQ_DTYPE_F32, P, 16, 20, 2, 12);
    config.policy = policy(kinds[k], 2, 40, 12, 0.3f);
    kvq_context *ctx = th_cpu_context();
    kvq_cache *cache, *loaded;
    KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
    uint32_t seq, other;
    KVQ_CHECK(ctx, kvq_sequence_add(cache, &other)); /* a second, short sequence shares the pool */
    KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
    for (uint32_t t = 0; t < 20; t++) step(ctx, cache, other, &s, t, NULL);
    for (uint32_t t = 0; t < 200; t++) step(ctx, cache, seq, &s, t, NULL);
    uint64_t size;
    KVQ_CHECK(ctx, kvq_cache_save_size(cache, &size));
    uint8_t *file = malloc(size), *again = malloc(size);
    size_t written;
    KVQ_CHECK(ctx, kvq_cache_save_to_memory(cache, file, size, &written));
    KVQ_CHECK(ctx, kvq_cache_load_from_memory(ctx, file, written, &loaded));
    KVQ_CHECK(ctx, kvq_cache_save_to_memory(loaded, again, size, &written));
    cr_assert_eq(memcmp(file, again, size), 0, "policy %d: a loaded cache re-saves to the same bytes", k);
    kvq_cache_config lc;
    KVQ_CHECK(ctx, kvq_cache_get_config(loaded, &lc));
    cr_assert_eq(memcmp(&lc.policy, &config.policy, sizeof lc.policy), 0, "the policy is saved");
    for (uint32_t t = 200; t < n; t++) {
      float a[2 * 2 * 32], b[2 * 2 * 32];
      step(ctx, cache, seq, &s, t, a);
      step(ctx, loaded, seq, &s, t, b);
      cr_assert_eq(memcmp(a, b, sizeof a), 0, "policy %d step %u: outputs differ after loading", k, t);
      size_t ca, cb;
      uint32_t *pa = positions_of(ctx, cache, seq, 1, &ca), *pb = positions_of(ctx, loaded, seq, 1, &cb);
      cr_assert(ca == cb && memcmp(pa, pb, sizeof(uint32_t) * ca) == 0, "policy %d step %u: kept sets differ", k, t);
      free(pa), free(pb);
    }
    free(file), free(again); /* forged policy sections: test_savefile.c */
    kvq_cache_destroy(loaded);
    kvq_cache_destroy(cache);
    kvq_context_destroy(ctx);
  }
  free_stream(&s);
}

/* A failed kvq_attention changes nothing, the policy's statistics included: values of 70000 make
 * the fp16 output overflow (KVQ_ERROR_NON_FINITE) after the probabilities were computed. */
Test(policy, a_failed_attention_adds_no_statistics) {
  const uint32_t hq = 2, hkv = 1, d = 16, n = 40;
  kvq_layer_config layer = th_layer(hq, hkv, d, th_exact(KVQ_DTYPE_F32), th_exact(KVQ_DTYPE_F32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 0, 8, 1, 1);
  config.policy = policy(KVQ_POLICY_H2O, 2, 16, 8, 0.5f);
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  float *k = calloc(n * d, sizeof(float)), *v = malloc(sizeof(float) * n * d), q[2 * 16] = {0};
  for (uint32_t i = 0; i < n * d; i++) v[i] = 70000.0f;
  th_append(ctx, cache, seq, 0, k, v, 0, n, hkv, d, KVQ_DTYPE_F32);
  size_t count;
  kvq_token_stats before[40], after[40];
  KVQ_CHECK(ctx, kvq_sequence_token_stats(cache, seq, before, 40, &count));
  uint16_t out[2 * 16];
  int64_t shape[3] = {1, hq, d};
  kvq_attention_request r = {seq, KVQ_MASK_CAUSAL, kvq_tensor_host(q, KVQ_DTYPE_F32, 3, shape),
                             kvq_tensor_host(out, KVQ_DTYPE_F16, 3, shape)};
  cr_assert_eq(kvq_attention(cache, 0, &r, 1), KVQ_ERROR_NON_FINITE, "%s", kvq_context_last_error(ctx));
  KVQ_CHECK(ctx, kvq_sequence_token_stats(cache, seq, after, 40, &count));
  for (size_t i = 0; i < count; i++) /* field by field: the struct has padding */
    cr_assert(before[i].attention == after[i].attention && before[i].position == after[i].position,
              "the failed call added attention to token %u", before[i].position);
  float out32[2 * 16];
  r.output = kvq_tensor_host(out32, KVQ_DTYPE_F32, 3, shape);
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &r, 1)); /* the same call succeeds in fp32 and adds */
  KVQ_CHECK(ctx, kvq_sequence_token_stats(cache, seq, after, 40, &count));
  cr_assert_gt(after[0].attention, 0.0);
  free(k), free(v);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/*
 * Every state a stream passes through is one the loader accepts (docs/FORMAT.md, "What a stream
 * under a policy holds": sinks' pages, the eviction budget, statistics): under each policy, with a
 * fixed heavy budget and with a fraction, 5 sinks (a partial page of them), a prefill, decoding steps
 * with the policy applied by hand now and then and a flush in the middle, the cache is saved and
 * loaded after every step, and the loaded cache re-saves to the same bytes. A rule stricter than what
 * decisions leave fails here.
 */
Test(policy, every_state_of_a_stream_loads) {
  const uint32_t hq = 2, hkv = 1, d = 32, n = 150, P = 16, prefill = 37;
  stream s = make_stream(2, hq, hkv, d, n, 77);
  kvq_layer_config layers[2] = {th_layer(hq, hkv, d, th_uniform(2, 16), th_uniform(2, 16)),
                                th_layer(hq, hkv, d, th_qjl(64, 0, 32), th_uniform(4, 32))};
  const kvq_policy_kind kinds[3] = {KVQ_POLICY_STREAMING, KVQ_POLICY_H2O, KVQ_POLICY_QHITTER};
  kvq_context *ctx = th_cpu_context();
  for (int k = 0; k < 3; k++)
    for (int fraction = 0; fraction < 2; fraction++) {
      kvq_cache_config config = th_config(layers, 2, KVQ_DTYPE_F32, P, 16, 24, 1, 13);
      config.policy = policy(kinds[k], 5, 40, 9, 0.5f);
      if (fraction) config.policy.heavy_fraction = 0.15f;
      kvq_cache *cache;
      uint32_t seq;
      KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
      KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
      for (uint32_t l = 0; l < 2; l++) {
        th_append(ctx, cache, seq, l, s.k, s.v, 0, prefill, hkv, d, KVQ_DTYPE_F32);
        attend(ctx, cache, seq, l, &s, 0, prefill, KVQ_MASK_CAUSAL, NULL);
      }
      /* the first failure, asserted once after the stream (thousands of passing assertions in the
       * runner's channel are what this test need not add) */
      char failure[512] = "";
      for (uint32_t t = prefill; t < n && !failure[0]; t++) {
        step(ctx, cache, seq, &s, t, NULL);
        kvq_status st = t % 10 == 3 ? kvq_sequence_apply_policy(cache, seq) : KVQ_OK;
        if (st == KVQ_OK && t == 90) st = kvq_flush(cache, seq);
        uint64_t size = 0;
        if (st == KVQ_OK) st = kvq_cache_save_size(cache, &size);
        uint8_t *file = malloc(size + 1), *again = malloc(size + 1);
        size_t written = 0;
        kvq_cache *loaded = NULL;
        if (st == KVQ_OK) st = kvq_cache_save_to_memory(cache, file, size, &written);
        if (st == KVQ_OK) st = kvq_cache_load_from_memory(ctx, file, written, &loaded);
        if (st == KVQ_OK) st = kvq_cache_save_to_memory(loaded, again, size, &written);
        if (st != KVQ_OK)
          snprintf(failure, sizeof failure, "after token %u: %s: %s", t, kvq_status_string(st), kvq_context_last_error(ctx));
        else if (memcmp(file, again, size) != 0)
          snprintf(failure, sizeof failure, "after token %u: the loaded cache re-saves to other bytes", t);
        kvq_cache_destroy(loaded);
        free(file), free(again);
      }
      cr_assert_eq(failure[0], 0, "policy %d (fraction %d) %s", (int)kinds[k], fraction, failure);
      kvq_sequence_info info;
      KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seq, 0, &info));
      cr_assert_gt(info.tokens - info.kept_tokens, 50u, "policy %d (fraction %d): the stream evicted", (int)kinds[k], fraction);
      kvq_cache_destroy(cache);
    }
  kvq_context_destroy(ctx);
  free_stream(&s);
}
