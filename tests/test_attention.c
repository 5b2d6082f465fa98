/*
 * Attention over compressed caches against exact attention, on synthetic LLM-like data
 * (kvq_synth_generate, docs/EVAL.md: 4 key channels per head 10-20x larger than the rest). Three derived checks:
 *
 * A. Logits. kvq_scores against exact q.k / sqrt(d), per (query, token):
 *    - QJL keys: Lemma 3.5 of the paper with delta = 0.01 gives eps = eps(m) such that each of the
 *      two sketches errs by more than eps |q_x| |k_x| with probability <= delta; so the logit errs
 *      by more than eps (|q_in||k_in| + |q_out||k_out|) / sqrt(d) <= eps |q||k| / sqrt(d) with
 *      probability <= 2 delta, plus 2^-11 |s^| for the fp16 rounding of the stored norms. The
 *      expected number of violations is <= 2 delta N; the test allows 3 times that (pairs share a
 *      sketch, so the count is not binomial; Markov's inequality bounds a false failure by 1/3 in
 *      the worst case, and the observed count is 0 on this data).
 *    - uniform keys: deterministic, |s^ - s| <= sum_c |q_c| B_c / sqrt(d) with B_c the per-element
 *      bound of test_uniform.c.
 * B. Propagation. With D = max_t |s^_t - s_t| measured for a query, every probability satisfies
 *    p^_t / p_t in [e^-2D, e^2D], so per output channel
 *      |o^ - o| <= (e^2D - 1) sum_t p_t |v_t| + sum_t p^_t |v^_t - v_t| + 2^-22 sum_t p^_t |v^_t|,
 *    with |v^ - v| bounded per element by the value method (B for uniform) and the last term for
 *    fp32 rounding of probabilities and outputs.
 * C. Consistency. kvq_dequantize returns keys whose inner product with any query is the estimator,
 *    so attention must equal exact attention over the dequantized K^, V^ up to float rounding:
 *    |logit difference| <= tau = 8 * 2^-24 * c_d |q| |k| / sqrt(d) + 2^-24 |s^| (the fp32 query
 *    sketch and the fp32 reconstruction each round relative 2^-24 on sums bounded by c_d |q||k|:
 *    |S q|_1 <= m |q| and |S^T sign|_2 <= m for rows of norm sqrt(d) in orthogonal blocks), and
 *    outputs then within (e^2tau - 1 + 2^-22) sum p |v^| + 2^-24 |o|.
 *    Methods that work in a rotated space (PolarQuant) or through lookup tables (CQ) apply R or the
 *    tables at another point than dequantization does: each fp32 application of a d x d
 *    orthogonal matrix errs by at most gamma(d) ||R_i||_2 ||y||_2 <= 2 d u ||y|| per entry, so tau
 *    gets 4 d u |q| |k^| / sqrt(d) and every output 4 d u sum p ||v^||.
 * For PolarQuant and CQ, whose errors have no simple per-element bound, A and B use the measured
 * error |x^ - x| of the dequantized tokens plus that rounding margin: the inequalities of A and B
 * hold for the true errors.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/detmath.h"
#include "core/gpu_plan.h"
#include "core/quantize_math.h"
#include "helpers.h"

typedef struct scenario {
  const char *name;
  uint32_t d, hq, hkv, n, nq, P, R;
  kvq_dtype input;
  kvq_mask mask;
  int flush;
  kvq_method_config keys, values;
} scenario;

static double norm(const float *x, uint32_t d) {
  double s = 0;
  for (uint32_t c = 0; c < d; c++) s += (double)x[c] * x[c];
  return sqrt(s);
}

/* Lemma 3.5: smallest eps with m >= 4/3 (1 + eps) / eps^2 log(2 / delta). */
static double lemma_eps(uint32_t m, double delta) {
  double L = 4.0 / 3.0 * log(2 / delta) / m;
  return (L + sqrt(L * L + 4 * L)) / 2;
}

/* Per-element error bound of a uniform-quantized group (derivation in test_uniform.c). */
static double uniform_bound(const float *group, uint32_t G, uint32_t b) {
  float mn = group[0], mx = group[0];
  for (uint32_t c = 1; c < G; c++) {
    mn = group[c] < mn ? group[c] : mn;
    mx = group[c] > mx ? group[c] : mx;
  }
  const double u = 0x1p-24;
  const uint32_t L = kvq_uniform_levels(b);
  float scale32 = (mx - mn) * kvq_uniform_inv_levels(b);
  uint32_t params = kvq_uniform_params(mn, mx, b);
  double scale_h = kvq_uniform_param_scale(params), min_h = kvq_uniform_param_min(params);
  return scale_h / 2 + fabs(mn - min_h) + L * (fabs(scale32 - scale_h) + 2 * u * scale32) + 4 * u * fmax(fabs(mn), fabs(mx));
}

/* Bound on |x^ - x| for element c of token t (kv head h) of `all` ([n][hkv][d]) under a method;
 * `dequantized` holds the same tokens as the cache decodes them. KIVI's group is channel c over
 * the token group of t within its page (every token is quantized when this is asked for keys;
 * window tokens are exact and only over-bounded). */
static double element_bound(const scenario *sc, const kvq_method_config *m, const float *all, const float *dequantized,
                            uint32_t h, uint32_t t, uint32_t c) {
  const uint32_t d = sc->d, hkv = sc->hkv;
  const float *x = all + ((size_t)t * hkv + h) * d;
  if (m->method == KVQ_METHOD_UNIFORM) {
    uint32_t G = m->uniform.group_size;
    return uniform_bound(x + c / G * G, G, m->uniform.bits);
  }
  if (m->method == KVQ_METHOD_KIVI) {
    const uint32_t Gt = m->kivi.group_tokens ? m->kivi.group_tokens : sc->P;
    const uint32_t first = t / Gt * Gt, last = first + Gt < sc->n ? first + Gt : sc->n;
    float group[256];
    for (uint32_t u = first; u < last; u++) group[u - first] = all[((size_t)u * hkv + h) * d + c];
    return uniform_bound(group, last - first, m->kivi.bits);
  }
  if (m->method == KVQ_METHOD_POLAR || m->method == KVQ_METHOD_CQ) {
    const float *xh = dequantized + ((size_t)t * hkv + h) * d;
    return fabs((double)xh[c] - x[c]) + 4 * d * 0x1p-24 * norm(xh, d);
  }
  if (m->method == KVQ_METHOD_EXACT)
    return m->exact.dtype == KVQ_DTYPE_F32 ? 0.0 : fabs(x[c]) * (m->exact.dtype == KVQ_DTYPE_F16 ? 0x1p-11 : 0x1p-8);
  return INFINITY;
}

static int needs_codebooks(const kvq_method_config *m) {
  return m->method == KVQ_METHOD_CQ || (m->method == KVQ_METHOD_POLAR && m->polar.codebook == KVQ_CODEBOOK_ONLINE);
}

static void run(const scenario *sc) {
  const uint32_t d = sc->d, hq = sc->hq, hkv = sc->hkv, n = sc->n, nq = sc->nq, group = hq / hkv;
  kvq_layer_config layer = th_layer(hq, hkv, d, sc->keys, sc->values);
  kvq_cache_config config = th_config(&layer, 1, sc->input, sc->P, sc->R, (n + sc->P - 1) / sc->P + 1, 1, 1234);
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  float *k = malloc(sizeof(float) * n * hkv * d), *v = malloc(sizeof(float) * n * hkv * d);
  float *q = malloc(sizeof(float) * n * hq * d);
  kvq_synth_config syn = kvq_synth_defaults(n, hkv, hq, d, 99);
  kvq_synth_generate(&syn, k, v, q);
  th_round_to_dtype(k, (size_t)n * hkv * d, sc->input);
  th_round_to_dtype(v, (size_t)n * hkv * d, sc->input);
  if (needs_codebooks(&sc->keys) || needs_codebooks(&sc->values)) { /* calibrate on the data itself */
    int64_t shape[3] = {n, hkv, d};
    kvq_tensor kt = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(v, KVQ_DTYPE_F32, 3, shape);
    KVQ_CHECK(ctx, kvq_codebooks_learn(cache, 0, &kt, &vt, NULL));
  }
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  for (uint32_t t = 0; t < n;) { /* uneven chunks */
    uint32_t count = t % 3 == 0 ? 37 : 1;
    if (count > n - t) count = n - t;
    th_append(ctx, cache, seq, 0, k, v, t, count, hkv, d, sc->input);
    t += count;
  }
  if (sc->flush) KVQ_CHECK(ctx, kvq_flush(cache, seq));
  const float *ql = q + (size_t)(n - nq) * hq * d;
  const int causal = sc->mask == KVQ_MASK_CAUSAL;

  float *logits = malloc(sizeof(float) * nq * hq * n), *probs = malloc(sizeof(float) * nq * hq * n);
  float *out = malloc(sizeof(float) * nq * hq * d);
  float *kd = malloc(sizeof(float) * n * hkv * d), *vd = malloc(sizeof(float) * n * hkv * d);
  double *o_exact = malloc(sizeof(double) * nq * hq * d), *p_exact = malloc(sizeof(double) * nq * hq * n);
  double *o_deq = malloc(sizeof(double) * nq * hq * d), *p_deq = malloc(sizeof(double) * nq * hq * n);
  int64_t qshape[3] = {nq, hq, d}, sshape[3] = {nq, hq, n}, kshape[3] = {n, hkv, d};
  kvq_tensor qt = kvq_tensor_host((void *)ql, KVQ_DTYPE_F32, 3, qshape);
  kvq_tensor lt = kvq_tensor_host(logits, KVQ_DTYPE_F32, 3, sshape), pt = kvq_tensor_host(probs, KVQ_DTYPE_F32, 3, sshape);
  KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &qt, sc->mask, KVQ_SCORES_LOGITS, &lt));
  KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &qt, sc->mask, KVQ_SCORES_PROBABILITIES, &pt));
  kvq_attention_request req = {.sequence = seq, .mask = sc->mask, .queries = qt,
                               .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape)};
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
  kvq_tensor kdt = kvq_tensor_host(kd, KVQ_DTYPE_F32, 3, kshape), vdt = kvq_tensor_host(vd, KVQ_DTYPE_F32, 3, kshape);
  KVQ_CHECK(ctx, kvq_dequantize(cache, seq, 0, 0, n, &kdt, &vdt));
  th_exact_attention(ql, k, v, nq, n, hq, hkv, d, causal, o_exact, p_exact);
  th_exact_attention(ql, kd, vd, nq, n, hq, hkv, d, causal, o_deq, p_deq);

  const int qjl = sc->keys.method == KVQ_METHOD_QJL;
  const int rotating_keys = sc->keys.method == KVQ_METHOD_POLAR || sc->keys.method == KVQ_METHOD_CQ;
  const int rotating_values = sc->values.method == KVQ_METHOD_POLAR || sc->values.method == KVQ_METHOD_CQ;
  /* eps of the weaker of the two sketches bounds both parts of the estimator */
  const double delta = 0.01;
  const double eps = !qjl ? 0
                     : sc->keys.qjl.outlier_count == 0
                         ? lemma_eps(sc->keys.qjl.sketch_dim, delta)
                         : fmax(lemma_eps(sc->keys.qjl.sketch_dim, delta), lemma_eps(sc->keys.qjl.outlier_sketch_dim, delta));
  const double c_d = kvq_qjl_unbiased_constant(d), sqrt_d = sqrt((double)d);
  uint64_t pairs = 0, violations = 0;
  double worst_a = 0;
  for (uint32_t i = 0; i < nq; i++)
    for (uint32_t h = 0; h < hq; h++) {
      const float *qi = ql + ((size_t)i * hq + h) * d;
      const uint32_t visible = causal ? n - nq + i + 1 : n;
      double D = 0, tau_max = 0;
      for (uint32_t t = 0; t < n; t++) {
        const size_t si = ((size_t)i * hq + h) * n + t;
        if (t >= visible) {
          cr_assert(logits[si] == -INFINITY && probs[si] == 0.0f, "%s: masked token (%u,%u,%u)", sc->name, i, h, t);
          continue;
        }
        const float *kt = k + ((size_t)t * hkv + h / group) * d;
        double s = 0, sd = 0;
        for (uint32_t c = 0; c < d; c++) {
          s += (double)qi[c] * kt[c];
          sd += (double)qi[c] * kd[((size_t)t * hkv + h / group) * d + c];
        }
        s /= sqrt_d;
        sd /= sqrt_d;
        const double err = fabs(logits[si] - s);
        if (err > D) D = err;
        /* A */
        if (qjl) {
          double allowed = eps * norm(qi, d) * norm(kt, d) / sqrt_d + 0x1p-11 * fabs(logits[si]);
          violations += err > allowed;
          if (err / allowed > worst_a) worst_a = err / allowed;
        } else {
          double allowed = 0x1p-20 * fabs(s);
          for (uint32_t c = 0; c < d; c++) allowed += fabs(qi[c]) * element_bound(sc, &sc->keys, k, kd, h / group, t, c) / sqrt_d;
          cr_assert(err <= allowed, "%s A: logit (%u,%u,%u) error %g > %g", sc->name, i, h, t, err, allowed);
        }
        pairs++;
        /* C: logits against the dequantized keys */
        const float *kdt = kd + ((size_t)t * hkv + h / group) * d;
        double tau = (qjl ? 8 * 0x1p-24 * c_d * norm(qi, d) * norm(kt, d) / sqrt_d : 4 * 0x1p-24 * norm(qi, d) * norm(kt, d) / sqrt_d) +
                     (rotating_keys ? 4 * d * 0x1p-24 * norm(qi, d) * norm(kdt, d) / sqrt_d : 0) +
                     0x1p-24 * fabs(logits[si]);
        cr_assert(fabs(logits[si] - sd) <= tau, "%s C: logit (%u,%u,%u) %g vs dequantized %g (tau %g)", sc->name, i, h, t,
                  (double)logits[si], sd, tau);
        if (tau > tau_max) tau_max = tau;
      }
      /* B and C on the outputs */
      for (uint32_t c = 0; c < d; c++) {
        double weight = 0, weight_hat = 0, value_err = 0, weight_deq = 0, weight_rot = 0;
        for (uint32_t t = 0; t < visible; t++) {
          const size_t si = ((size_t)i * hq + h) * n + t;
          const float *vt = v + ((size_t)t * hkv + h / group) * d;
          const double vh = vd[((size_t)t * hkv + h / group) * d + c];
          weight += p_exact[si] * fabs(vt[c]);
          weight_hat += probs[si] * fabs(vh);
          value_err += probs[si] * element_bound(sc, &sc->values, v, vd, h / group, t, c);
          if (rotating_values) weight_rot += p_deq[si] * norm(vd + ((size_t)t * hkv + h / group) * d, d);
          weight_deq += p_deq[si] * fabs(vh);
        }
        const size_t oi = ((size_t)i * hq + h) * d + c;
        double bound_b = expm1(2 * D) * weight + value_err + 0x1p-22 * weight_hat + 1e-30;
        cr_assert(fabs(out[oi] - o_exact[oi]) <= bound_b, "%s B: output (%u,%u,%u) %g vs exact %g, bound %g (D=%g)",
                  sc->name, i, h, c, (double)out[oi], o_exact[oi], bound_b, D);
        double bound_c = (expm1(2 * tau_max) + 0x1p-22) * weight_deq + 0x1p-24 * fabs(o_deq[oi]) + 4 * d * 0x1p-24 * weight_rot + 1e-30;
        cr_assert(fabs(out[oi] - o_deq[oi]) <= bound_c, "%s C: output (%u,%u,%u) %g vs dequantized %g, bound %g",
                  sc->name, i, h, c, (double)out[oi], o_deq[oi], bound_c);
      }
    }
  if (qjl) {
    cr_log_info("%s: eps(delta=%.2f) = %.4f, %llu of %llu logits beyond, worst error/allowed %.3f", sc->name, delta, eps,
                (unsigned long long)violations, (unsigned long long)pairs, worst_a);
    cr_assert(violations <= 3 * 2 * delta * pairs, "%s A: %llu of %llu logits beyond the Lemma 3.5 bound", sc->name,
              (unsigned long long)violations, (unsigned long long)pairs);
  }
  free(logits);
  free(probs);
  free(out);
  free(kd);
  free(vd);
  free(o_exact);
  free(p_exact);
  free(o_deq);
  free(p_deq);
  free(k);
  free(v);
  free(q);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

Test(attention, qjl_outliers_uniform2_gqa4_fp16_flushed, .timeout = 120) {
  scenario sc = {"qjl256/k8 + u2, gqa 4, fp16, flushed", 128, 8, 2, 300, 16, 32, 0, KVQ_DTYPE_F16, KVQ_MASK_CAUSAL, 1,
                 th_qjl(256, 8, 256), th_uniform(2, 32)};
  run(&sc);
}

Test(attention, qjl512_uniform4_gqa8_bf16_window, .timeout = 120) {
  scenario sc = {"qjl512/k0 + u4, gqa 8, bf16, window 64", 64, 8, 1, 200, 8, 16, 64, KVQ_DTYPE_BF16, KVQ_MASK_NONE, 0,
                 th_qjl(512, 0, 32), th_uniform(4, 16)};
  run(&sc);
}

Test(attention, uniform_keys_exact_values_gqa1_fp32, .timeout = 120) {
  scenario sc = {"u4 keys + fp16 values, gqa 1, fp32", 64, 4, 4, 150, 12, 16, 32, KVQ_DTYPE_F32, KVQ_MASK_CAUSAL, 1,
                 th_uniform(4, 32), th_exact(KVQ_DTYPE_F16)};
  run(&sc);
}

Test(attention, kivi_keys_uniform_values_gqa4_flushed, .timeout = 120) {
  scenario sc = {"kivi 2-bit keys + u2 values, gqa 4, fp16, flushed", 64, 8, 2, 150, 10, 16, 0, KVQ_DTYPE_F16,
                 KVQ_MASK_CAUSAL, 1, th_kivi(2, 0), th_uniform(2, 32)};
  run(&sc);
}

Test(attention, kivi_keys_groups_of_8_kivi_values, .timeout = 120) {
  scenario sc = {"kivi 4-bit keys in groups of 8 tokens + kivi values, gqa 1, fp32, partial", 32, 2, 2, 77, 6, 32, 0,
                 KVQ_DTYPE_F32, KVQ_MASK_NONE, 1, th_kivi(4, 8), th_kivi(3, 16)};
  run(&sc);
}

static kvq_method_config polar(uint32_t l1, kvq_rotation rotation) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_POLAR, 128);
  c.polar.bits[0] = l1;
  c.polar.rotation = rotation;
  return c;
}

Test(attention, polar_keys_and_values_gqa4_window, .timeout = 120) {
  scenario sc = {"polar 4,2,2,2 keys and values (dense), gqa 4, fp16, window 32", 128, 8, 2, 140, 8, 32, 32,
                 KVQ_DTYPE_F16, KVQ_MASK_CAUSAL, 0, polar(4, KVQ_ROTATION_DENSE), polar(4, KVQ_ROTATION_DENSE)};
  run(&sc);
}

Test(attention, polar_hadamard_values_qjl_keys_flushed, .timeout = 120) {
  scenario sc = {"qjl keys + polar 2,2,2,2 values (Hadamard), gqa 8, bf16, flushed", 64, 8, 1, 90, 5, 16, 0,
                 KVQ_DTYPE_BF16, KVQ_MASK_NONE, 1, th_qjl(256, 4, 128), polar(2, KVQ_ROTATION_HADAMARD)};
  run(&sc);
}

Test(attention, qjl_uniform8_gqa7_window_partial, .timeout = 120) {
  scenario sc = {"qjl256/k4 + u8, gqa 7, fp32, window 32, partial page", 64, 7, 1, 97, 5, 16, 32, KVQ_DTYPE_F32,
                 KVQ_MASK_CAUSAL, 1, th_qjl(256, 4, 128), th_uniform(8, 64)};
  run(&sc);
}

static kvq_method_config cq(uint32_t channels, uint32_t bits) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_CQ, 64);
  c.cq.channels = channels;
  c.cq.bits = bits;
  c.cq.iterations = 20;
  return c;
}

Test(attention, cq_keys_and_values_gqa4_window, .timeout = 120) {
  scenario sc = {"cq 4c8b keys + 2c4b values, gqa 4, fp16, window 16", 64, 8, 2, 120, 6, 16, 16, KVQ_DTYPE_F16,
                 KVQ_MASK_CAUSAL, 0, cq(4, 8), cq(2, 4)};
  run(&sc);
}

Test(attention, polar_online_keys_cq_values_flushed, .timeout = 120) {
  kvq_method_config keys = polar(4, KVQ_ROTATION_HADAMARD);
  keys.polar.codebook = KVQ_CODEBOOK_ONLINE;
  scenario sc = {"polar online 4,2,2,2 keys (Hadamard) + cq 8c8b values, gqa 2, fp32, flushed", 64, 4, 2, 100, 5, 16,
                 0, KVQ_DTYPE_F32, KVQ_MASK_NONE, 1, keys, cq(8, 8)};
  run(&sc);
}

/* ---- The GPU attention plan (core/gpu_plan.c), without a GPU ------------------------------------- */

/* The kernels' kvq_locate (shaders/attention.glsl) in C: the sequence of workgroup wg of `kernel`. */
static uint32_t plan_locate(const uint32_t *meta, uint32_t kernel, uint32_t wg, uint32_t *unit) {
  const uint32_t table = meta[KVQ_META_UNITS + kernel];
  uint32_t lo = 0, hi = meta[KVQ_META_SEQS];
  if (wg >= meta[table + hi]) return UINT32_MAX;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (meta[table + mid] <= wg) lo = mid;
    else hi = mid;
  }
  *unit = wg - meta[table + lo];
  return lo;
}

/*
 * Three sequences (a window-only one, one of many pages, an empty one between): the plan's unit
 * tables send every workgroup of every kernel to the sequence whose units it falls in, in order,
 * the records and page lists are the job's, each fused sequence gets its own scratch, and the
 * paths are those vk_attention.c took before the plan moved to core.
 */
Test(attention, gpu_plan_places_every_workgroup) {
  enum { P = 16, HQ = 8, HKV = 2, D = 64 };
  kvq_method_config kc = kvq_method_defaults(KVQ_METHOD_KIVI, D), vc = kvq_method_defaults(KVQ_METHOD_UNIFORM, D),
                    pc = kvq_method_defaults(KVQ_METHOD_POLAR, D);
  kvq_side_desc keys = {0}, values = {0}, polar = {0};
  kvq_side_layout_init(&keys.layout, &kc, P, D, HKV);
  kvq_side_layout_init(&values.layout, &vc, P, D, HKV);
  kvq_side_layout_init(&polar.layout, &pc, P, D, HKV);
  const kvq_attention_seq seqs[3] = {
      {.page_first = 0, .quantized = 0, .window = 5, .ring_capacity = 32, .query_first = 0, .query_count = 1},
      {.page_first = 0, .quantized = 9 * P, .window = 3, .ring_capacity = 32, .ring_offset = 256, .query_first = 1,
       .query_count = 2, .score_offset = 5 * HQ, .accumulate_offset = 5},
      {.page_first = 9, .quantized = 0, .window = 0, .query_first = 3, .query_count = 1},
  };
  uint32_t slots[9], index[9], alive[9];
  for (uint32_t p = 0; p < 9; p++) slots[p] = 20 - p, index[p] = p, alive[p] = 0xffffu;
  kvq_job_attention job = {.keys = &keys, .values = &values, .query_heads = HQ, .window_dtype = KVQ_DTYPE_F16,
                           .scale = 0.125f, .seq_count = 3, .seqs = seqs, .page_slots = slots, .page_index = index,
                           .page_alive = alive, .alive_words = 1};
  kvq_gpu_attention_plan plan;
  char why[160];
  cr_assert_eq(kvq_gpu_plan_attention(&job, 1, &plan, why, sizeof why), KVQ_OK, "%s", why);
  cr_assert(plan.fused);
  cr_assert_eq(plan.pages, 9u);
  uint32_t *meta = calloc((size_t)plan.meta_words, 4);
  cr_assert(meta);
  kvq_gpu_pack_attention(&job, &plan, meta);
  cr_assert_eq(meta[KVQ_META_SEQS], 3u);
  cr_assert_eq(memcmp(meta + meta[KVQ_META_SLOTS], slots, sizeof slots), 0);
  cr_assert_eq(memcmp(meta + meta[KVQ_META_INDEX], index, sizeof index), 0);
  cr_assert_eq(memcmp(meta + meta[KVQ_META_ALIVE], alive, sizeof alive), 0);
  cr_assert_eq(meta[KVQ_META_ALIVE] + 9, plan.meta_words);
  uint64_t scratch = 0;
  for (uint32_t i = 0; i < 3; i++) {
    const uint32_t *r = meta + KVQ_META_RECORDS + i * KVQ_SEQ_WORDS;
    const uint32_t n = seqs[i].quantized + seqs[i].window, rows = seqs[i].query_count * HQ;
    cr_assert_eq(r[KVQ_SEQ_QUANTIZED], seqs[i].quantized);
    cr_assert_eq(r[KVQ_SEQ_QUERY_FIRST], seqs[i].query_first);
    cr_assert_eq(r[KVQ_SEQ_RING_ELEMENT], (uint32_t)(seqs[i].ring_offset / 2));
    cr_assert_eq(r[KVQ_SEQ_SCORE_OFFSET], (uint32_t)seqs[i].score_offset);
    cr_assert_eq(r[KVQ_SEQ_SCRATCH], scratch, "sequence %u's flash scratch follows the ones before", i);
    scratch += (uint64_t)rows * (n + 2 * kvq_flash_splits(n) + kvq_flash_splits(n) * D);
    /* each kernel's units for the sequence, as gpu_plan.h describes them */
    const uint64_t units[KVQ_PLAN_KERNELS] = {
        [KVQ_PLAN_SCORE] = ((uint64_t)rows * n + 63) / 64, [KVQ_PLAN_SOFTMAX] = rows, [KVQ_PLAN_ACCUMULATE] = n,
        [KVQ_PLAN_WEIGHTED_SUM] = (uint64_t)rows * D, [KVQ_PLAN_ROTATE] = (rows + 63) / 64,
        [KVQ_PLAN_FLASH] = n ? (uint64_t)seqs[i].query_count * HKV * kvq_flash_passes(HQ / HKV) * kvq_flash_splits(n) : 0,
        [KVQ_PLAN_COMBINE] = ((uint64_t)rows * D + 63) / 64};
    for (uint32_t k = 0; k < KVQ_PLAN_KERNELS; k++) {
      const uint32_t *table = meta + meta[KVQ_META_UNITS + k];
      cr_assert_eq(table[i + 1] - table[i], units[k], "kernel %u, sequence %u", k, i);
      for (uint32_t u = 0; u < units[k]; u++) {
        uint32_t unit = UINT32_MAX;
        cr_assert_eq(plan_locate(meta, k, table[i] + u, &unit), i, "kernel %u workgroup %u", k, table[i] + u);
        cr_assert_eq(unit, u);
      }
    }
  }
  cr_assert_eq(plan.scratch_bytes, scratch * 4);
  for (uint32_t k = 0; k < KVQ_PLAN_KERNELS; k++) {
    uint32_t unit;
    cr_assert_eq(meta[meta[KVQ_META_UNITS + k] + 3], plan.units[k]);
    cr_assert_eq(plan_locate(meta, k, (uint32_t)plan.units[k], &unit), UINT32_MAX, "past the last unit: no sequence");
  }
  free(meta);

  /* the probability sums of H2O and Q-Hitter stay on the fused path (the fused ACCUMULATE reads the
   * same flash scratch, over SOFTMAX's and ACCUMULATE's units, whose tables are checked above) */
  kvq_buffer *sums = (kvq_buffer *)(uintptr_t)1;
  job.accumulate = sums;
  cr_assert_eq(kvq_gpu_plan_attention(&job, 1, &plan, why, sizeof why), KVQ_OK);
  cr_assert(plan.fused && !plan.rotated_sums && plan.scratch_bytes == scratch * 4, "a job with accumulate sums plans fused");
  job.accumulate = NULL;
  /* the unfused paths: values summed rotated, a backend without fused kernels */
  job.values = &polar;
  cr_assert_eq(kvq_gpu_plan_attention(&job, 1, &plan, why, sizeof why), KVQ_OK);
  cr_assert(!plan.fused && plan.rotated_sums);
  cr_assert_eq(plan.scratch_bytes, 4u * HQ * 4 * D, "rotated sums of every output row (4 rows)");
  job.values = &values;
  cr_assert_eq(kvq_gpu_plan_attention(&job, 0, &plan, why, sizeof why), KVQ_OK);
  cr_assert(!plan.fused);

  /* a page the kernels cannot address */
  slots[3] = UINT32_MAX / 2;
  cr_assert_eq(kvq_gpu_plan_attention(&job, 1, &plan, why, sizeof why), KVQ_ERROR_UNSUPPORTED);
  cr_assert(strstr(why, "page"), "%s", why);
}
