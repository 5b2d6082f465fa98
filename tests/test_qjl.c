/*
 * QJL statistics, on the CPU reference's own encoder and estimator (backends/cpu/cpu_qjl.c):
 *   - the estimator is unbiased, with enough independent sketches that a 0.2% bias (the paper's
 *     sqrt(pi/2) constant at d = 128) is detected, which the test also demonstrates;
 *   - its error at m = 256, d = 128 respects Lemma 3.5 of the paper at a stated delta.
 */
#include <criterion/criterion.h>

#include "helpers.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "core/detmath.h"
#include "core/layout.h"
#include "core/matrix.h"
#include "core/rng.h"

typedef struct qjl_fixture {
  kvq_side_desc side;
  struct kvq_buffer fixed[2];
  uint8_t *block;
  float *prepared;
  double *dots;
} qjl_fixture;

static void fixture_init(qjl_fixture *f, uint32_t d, uint32_t m, uint32_t k, uint32_t m_o, uint32_t P, uint64_t seed,
                         uint32_t stream) {
  memset(f, 0, sizeof *f);
  kvq_method_config mc = kvq_method_defaults(KVQ_METHOD_QJL, d);
  mc.qjl = (kvq_qjl_config){.sketch_dim = m, .outlier_count = k, .outlier_sketch_dim = m_o};
  kvq_side_layout_init(&f->side.layout, &mc, P, d, 1);
  f->side.qjl_constant = kvq_qjl_unbiased_constant(d);
  uint32_t rows[2] = {m, k ? m_o : 0};
  for (int i = 0; i < 2; i++) {
    if (!rows[i]) continue;
    f->fixed[i].size = (uint64_t)rows[i] * d * 4;
    f->fixed[i].data = malloc(f->fixed[i].size);
    cr_assert_eq(kvq_build_sketch(seed, stream, i == 0 ? KVQ_PURPOSE_QJL_SKETCH : KVQ_PURPOSE_QJL_OUTLIER_SKETCH,
                                  rows[i], d, (float *)f->fixed[i].data),
                 0);
    f->side.fixed[i] = &f->fixed[i];
  }
  f->block = calloc(1, f->side.layout.head_bytes);
  f->prepared = malloc(sizeof(float) * m);
  f->dots = malloc(sizeof(double) * P);
}

static void fixture_free(qjl_fixture *f) {
  free(f->fixed[0].data);
  free(f->fixed[1].data);
  free(f->block);
  free(f->prepared);
  free(f->dots);
}

/* Encodes n keys [n][d] as one page and returns, in est[t], the estimate of q_t . k_t. */
static void estimate_pairs(qjl_fixture *f, const float *keys, const float *queries, uint32_t n, double *est) {
  const cpu_head head = kvq_cpu_head(&f->side);
  const uint32_t d = f->side.layout.head_dim;
  memset(f->block, 0, f->side.layout.head_bytes);
  kvq_cpu_qjl.encode(&head, keys, d, n, f->block);
  for (uint32_t t = 0; t < n; t++) {
    kvq_cpu_qjl.prepare(&head, queries + (size_t)t * d, f->prepared);
    kvq_cpu_qjl.dot_page(&head, f->block, n, queries + (size_t)t * d, f->prepared, f->dots);
    est[t] = f->dots[t];
  }
}

/* Keys, isotropic or LLM-like (channels 3, 40, 77, 114 scaled 10-20x, the outliers that k = 8
 * outlier channels capture); queries close to their key, where the relative variance is lowest. */
static void draw_pairs(kvq_rng *rng, uint32_t n, uint32_t d, int outlier_channels, float *keys, float *queries) {
  for (uint32_t t = 0; t < n; t++)
    for (uint32_t c = 0; c < d; c++) {
      double scale = outlier_channels && c % 37 == 3 ? 10.0 + c % 11 : 1.0;
      keys[(size_t)t * d + c] = (float)(scale * kvq_rng_gaussian(rng));
      queries[(size_t)t * d + c] = (float)(keys[(size_t)t * d + c] / scale + 0.2 * kvq_rng_gaussian(rng));
    }
}

static double dot(const float *a, const float *b, uint32_t d) {
  double s = 0;
  for (uint32_t c = 0; c < d; c++) s += (double)a[c] * b[c];
  return s;
}

/*
 * Unbiasedness. For each of S independent sketches, the ratio r_s = sum_t est_t / sum_t q_t.k_t
 * over P pairs (isotropic keys without outlier channels, LLM-like keys with k = 8 outlier channels);
 * E[r_s] = 1 exactly if the estimator is unbiased (up to fp16 rounding of the norms,
 * which is symmetric and averages to ~1e-6). The r_s are independent across sketches, so
 * z = (mean(r) - 1) / (sd(r) / sqrt(S)) is asymptotically standard normal under unbiasedness:
 * |z| < 4.5 fails by chance with probability 7e-6. The test also requires the paper's constant
 * sqrt(pi/2), a +0.2% bias at d = 128, to give z > 4.5, i.e. the test has the power to see it.
 */
static void check_unbiased(uint32_t outliers) {
  const uint32_t d = 128, m = 256, P = 128, S = 100;
  double *ratios = malloc(sizeof(double) * S);
  float *keys = malloc(sizeof(float) * P * d), *queries = malloc(sizeof(float) * P * d);
  double *est = malloc(sizeof(double) * P);
  kvq_rng rng;
  kvq_rng_init(&rng, 77 + outliers, 0, KVQ_PURPOSE_TEST);
  for (uint32_t s = 0; s < S; s++) {
    qjl_fixture f;
    fixture_init(&f, d, m, outliers, m, P, 1000 + outliers, s);
    draw_pairs(&rng, P, d, outliers > 0, keys, queries);
    estimate_pairs(&f, keys, queries, P, est);
    double num = 0, den = 0;
    for (uint32_t t = 0; t < P; t++) {
      num += est[t];
      den += dot(queries + (size_t)t * d, keys + (size_t)t * d, d);
    }
    ratios[s] = num / den;
    fixture_free(&f);
  }
  double mean = 0, var = 0;
  for (uint32_t s = 0; s < S; s++) mean += ratios[s];
  mean /= S;
  for (uint32_t s = 0; s < S; s++) var += (ratios[s] - mean) * (ratios[s] - mean);
  var /= S - 1;
  const double se = sqrt(var / S);
  const double z = (mean - 1) / se;
  const double paper = sqrt(3.14159265358979323846 / 2) / kvq_qjl_unbiased_constant(d);
  const double z_paper = (mean * paper - 1) / (se * paper);
  cr_log_info("k=%u: mean ratio %.6f, standard error %.6f, z %.2f; with sqrt(pi/2): z %.2f", outliers, mean, se, z,
              z_paper);
  cr_assert(fabs(z) < 4.5, "k=%u: the estimator looks biased: mean ratio %.6f (z = %.2f)", outliers, mean, z);
  cr_assert(z_paper > 4.5, "k=%u: the test lacks power to see the paper's +0.2%% bias (z = %.2f)", outliers, z_paper);
  free(ratios);
  free(keys);
  free(queries);
  free(est);
}

Test(qjl, unbiased_without_outliers, .timeout = 120) { check_unbiased(0); }
Test(qjl, unbiased_with_outliers, .timeout = 120) { check_unbiased(8); }

/*
 * Lemma 3.5: for m >= 4/3 (1 + eps) / eps^2 log(2 / delta),
 *   Pr[|est - q.k| > eps |q| |k|] <= delta.
 * At m = 256 and delta = 0.01 the smallest admissible eps solves 256 = 4/3 (1+eps)/eps^2 log 200:
 * eps = 0.1805. Over N independent (sketch, pair) trials the number of violations is binomial
 * with p <= delta; the test fails if it exceeds delta N + 5 sqrt(delta (1 - delta) N). The lemma is
 * stated for i.i.d. Gaussian rows and kvq's orthogonalized rows only concentrate better, so a
 * violation means a broken estimator (scale, sign convention, norm), not a loose lemma.
 * Keys here have no outliers (k = 0) so that the estimator is exactly the lemma's.
 */
Test(qjl, lemma_3_5_distortion, .timeout = 120) {
  const uint32_t d = 128, m = 256, P = 64, S = 100;
  const double delta = 0.01, L = 4.0 / 3.0 * log(2 / delta) / m;
  const double eps = (L + sqrt(L * L + 4 * L)) / 2; /* eps^2 = L (1 + eps) */
  cr_assert(fabs(eps - 0.1805) < 1e-3, "eps %.5f", eps);
  float *keys = malloc(sizeof(float) * P * d), *queries = malloc(sizeof(float) * P * d);
  double *est = malloc(sizeof(double) * P);
  kvq_rng rng;
  kvq_rng_init(&rng, 5, 0, KVQ_PURPOSE_TEST);
  uint32_t violations = 0, trials = 0;
  double worst = 0;
  for (uint32_t s = 0; s < S; s++) {
    qjl_fixture f;
    fixture_init(&f, d, m, 0, m, P, 2000, s);
    for (uint32_t i = 0; i < P * d; i++) { /* independent q and k: the hardest case for relative error */
      keys[i] = (float)kvq_rng_gaussian(&rng);
      queries[i] = (float)kvq_rng_gaussian(&rng);
    }
    estimate_pairs(&f, keys, queries, P, est);
    for (uint32_t t = 0; t < P; t++) {
      const float *q = queries + (size_t)t * d, *k = keys + (size_t)t * d;
      double err = fabs(est[t] - dot(q, k, d)) / sqrt(dot(q, q, d) * dot(k, k, d));
      if (err > worst) worst = err;
      violations += err > eps;
      trials++;
    }
    fixture_free(&f);
  }
  const double allowed = delta * trials + 5 * sqrt(delta * (1 - delta) * trials);
  cr_log_info("Lemma 3.5 at m=%u, delta=%g: eps=%.4f, %u of %u pairs beyond, worst relative error %.4f", m, delta, eps,
              violations, trials, worst);
  cr_assert(violations <= allowed, "%u violations of eps = %.4f in %u trials (allowed %.1f)", violations, eps, trials,
            allowed);
  free(keys);
  free(queries);
  free(est);
}

/* Encoding details that the statistics cannot see. */
Test(qjl, outlier_selection_and_sign_convention) {
  const uint32_t d = 64, P = 16, k = 4;
  qjl_fixture f;
  fixture_init(&f, d, 64, k, 32, P, 3, 0);
  float keys[16 * 64] = {0};
  /* channel norms over the page: channel c gets |x| = 1 + c % 5, channels 60 and 7 tie at 9 */
  for (uint32_t t = 0; t < 3; t++)
    for (uint32_t c = 0; c < d; c++) keys[t * d + c] = (float)(1 + c % 5) * (t % 2 ? -1.0f : 1.0f);
  for (uint32_t t = 0; t < 3; t++) keys[t * d + 60] = keys[t * d + 7] = 9.0f;
  keys[0 * d + 33] = 30.0f; /* one big entry in one token makes channel 33 the largest */
  const cpu_head head = kvq_cpu_head(&f.side);
  kvq_cpu_qjl.encode(&head, keys, d, 3, f.block);
  const uint8_t *list = f.block + kvq_qjl_outliers_offset(P, 64, 32, k);
  /* largest: 33 (900 + ...), then 7 and 60 (243 each, lower index first), then channel 4 (75) */
  cr_assert(list[0] == 4 && list[1] == 7 && list[2] == 33 && list[3] == 60, "outliers %u %u %u %u", list[0], list[1],
            list[2], list[3]);
  /* sign bits: recompute S k_in for token 1 in the documented order and compare every bit */
  const float *S = (const float *)f.fixed[0].data;
  const uint8_t *signs = f.block + kvq_qjl_signs_offset() + 1 * 64 / 8;
  for (uint32_t i = 0; i < 64; i++) {
    float p = 0;
    for (uint32_t c = 0; c < d; c++) {
      float x = (c == 4 || c == 7 || c == 33 || c == 60) ? 0.0f : keys[1 * d + c];
      p = p + S[i * d + c] * x;
    }
    cr_assert_eq((signs[i / 8] >> (i % 8)) & 1, p > 0.0f, "bit %u", i);
  }
  /* tokens past the valid count are zero, including their norms */
  for (uint32_t b = 3 * 64 / 8; b < P * 64 / 8; b++) cr_assert_eq(f.block[b], 0);
  fixture_free(&f);
}
