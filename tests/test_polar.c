/*
 * PolarQuant in the CPU reference (backends/cpu/cpu_polar.c, core/codebook.c):
 *   - the rotations are orthogonal and unrotate inverts them;
 *   - for Gaussian input the codes of every level are distributed as the analytic angle densities
 *     predict (a chi-square goodness-of-fit test on the offline codebook's bins);
 *   - the reconstruction error falls as bits rise and meets a bound derived from Theorem 1;
 *   - offline codebooks are the Lloyd-Max fixed points of their densities;
 *   - the two decodings of core/methods/polar.h, a whole token top down (the CPU's) and one
 *     coordinate (a GPU thread's), give the same floats bit for bit, and so do the two scores.
 */
#include <criterion/criterion.h>

#include "helpers.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/cpu_io.h"
#include "core/methods/polar.h"
#include "core/codebook.h"
#include "core/layout.h"
#include "core/matrix.h"
#include "core/rng.h"

static const double pi = 3.14159265358979323846;

typedef struct polar_fixture {
  kvq_side_desc side;
  struct kvq_buffer fixed[2];
  uint8_t *block;
} polar_fixture;

static void fixture_init(polar_fixture *f, uint32_t d, uint32_t P, uint32_t levels, const uint32_t *bits,
                         kvq_rotation rotation) {
  memset(f, 0, sizeof *f);
  kvq_method_config mc = kvq_method_defaults(KVQ_METHOD_POLAR, d);
  mc.polar.levels = levels;
  for (uint32_t l = 0; l < levels; l++) mc.polar.bits[l] = bits[l];
  mc.polar.rotation = rotation;
  kvq_side_layout_init(&f->side.layout, &mc, P, d, 1);
  for (int i = 0; i < 2; i++) {
    f->fixed[i].size = kvq_side_fixed_floats(&f->side.layout, i) * 4;
    f->fixed[i].data = calloc(1, f->fixed[i].size);
    f->side.fixed[i] = &f->fixed[i];
  }
  if (rotation == KVQ_ROTATION_DENSE) kvq_build_rotation(9, 0, KVQ_PURPOSE_POLAR_ROTATION, d, (float *)f->fixed[0].data);
  else kvq_build_signs(9, 0, KVQ_PURPOSE_POLAR_SIGNS, d, (float *)f->fixed[0].data);
  kvq_polar_offline_tables(levels, f->side.layout.level_bits, (float *)f->fixed[1].data);
  f->block = calloc(1, f->side.layout.head_bytes);
}

static void fixture_free(polar_fixture *f) {
  free(f->fixed[0].data);
  free(f->fixed[1].data);
  free(f->block);
}

/* Encodes P tokens x [P][d] and decodes them back (unrotated) into out. */
static void round_trip(polar_fixture *f, const float *x, float *out) {
  const cpu_head head = kvq_cpu_head(&f->side);
  const uint32_t d = f->side.layout.head_dim, P = f->side.layout.page_size;
  memset(f->block, 0, f->side.layout.head_bytes);
  kvq_cpu_polar.encode(&head, x, d, P, f->block);
  float rotated[KVQ_MAX_HEAD_DIM];
  for (uint32_t t = 0; t < P; t++) {
    kvq_cpu_polar.decode(&head, f->block, t, rotated);
    kvq_cpu_polar.unrotate(&head, rotated, out + (size_t)t * d);
  }
}

Test(polar, token_and_coordinate_decodings_agree_bit_for_bit) {
  const kvq_rotation rotations[] = {KVQ_ROTATION_DENSE, KVQ_ROTATION_HADAMARD};
  const uint32_t configs[][5] = {{4, 2, 2, 2}, {8, 3, 2, 1}, {1, 1, 1, 1}, {3, 4, 0, 0}, {2, 5, 3, 0}};
  const uint32_t levels[] = {4, 4, 4, 2, 3};
  const uint32_t d = 64, P = 16;
  kvq_rng rng;
  kvq_rng_init(&rng, 5, 0, KVQ_PURPOSE_TEST);
  float x[16 * 64], token[KVQ_MAX_HEAD_DIM], prepared[64];
  uint32_t compared = 0;
  for (int r = 0; r < 2; r++)
    for (int k = 0; k < 5; k++) {
      polar_fixture f;
      fixture_init(&f, d, P, levels[k], configs[k], rotations[r]);
      const kvq_side_layout *s = &f.side.layout;
      const cpu_head head = kvq_cpu_head(&f.side);
      for (uint32_t i = 0; i < P * d; i++) x[i] = (float)kvq_rng_gaussian(&rng) * (i % 7 == 0 ? 8.0f : 1.0f);
      for (uint32_t i = 0; i < d; i++) prepared[i] = (float)kvq_rng_gaussian(&rng);
      memset(f.block, 0, s->head_bytes);
      kvq_cpu_polar.encode(&head, x, d, P, f.block);
      const kvq_io io = kvq_cpu_io(&head, f.block, NULL, prepared);
      for (uint32_t t = 0; t < P; t++) {
        kvq_polar_decode_token(&io, 0, t, P, d, s->levels, s->level_bits, 0, token);
        for (uint32_t i = 0; i < d; i++) {
          const float one = kvq_polar_decode_coord(&io, 0, t, i, P, d, s->levels, s->level_bits, 0);
          cr_assert(kvq_f32_to_bits(one) == kvq_f32_to_bits(token[i]),
                    "rotation %d, config %d, token %u, coordinate %u: %a by coordinate, %a by token", r, k, t, i,
                    (double)one, (double)token[i]);
          compared++;
        }
        const double whole = kvq_polar_dot(&io, 0, token, d);
        const double by_coordinate = kvq_polar_score(&io, 0, t, 0, P, d, s->levels, s->level_bits, 0);
        cr_assert(whole == by_coordinate, "rotation %d, config %d, token %u: scores %a and %a", r, k, t, whole,
                  by_coordinate);
      }
      fixture_free(&f);
    }
  cr_assert(compared == 2 * 5 * 16 * 64);
}

/* kvq_polar_decode_run (the Vulkan fused passes' decoding of KVQ_POLAR_RUN coordinates) against the
 * whole token, bit for bit, for every level count from 1 (several radii in a run) through 3 (one
 * radius, every level inside the run) to 6 (three levels above the run), mixed code widths from 1
 * to 8 bits, among them widths whose words hold 10, 6 or 5 codes, where a run's codes of a level
 * cross into the next word (kvq_polar_run_codes: level 1 at 6 and 5 bits, level 2 at 6 bits), every
 * run of every token. */
Test(polar, run_and_token_decodings_agree_bit_for_bit) {
  const uint32_t configs[][6] = {{4, 0, 0, 0, 0, 0}, {2, 3, 0, 0, 0, 0}, {3, 2, 2, 0, 0, 0},
                                 {4, 2, 2, 2, 0, 0}, {3, 3, 1, 2, 2, 0}, {2, 2, 2, 2, 2, 2},
                                 {6, 6, 0, 0, 0, 0}, {5, 6, 5, 0, 0, 0}, {7, 3, 8, 1, 0, 0}};
  const uint32_t levels[] = {1, 2, 3, 4, 5, 6, 2, 3, 4};
  const uint32_t d = 64, P = 16;
  kvq_rng rng;
  kvq_rng_init(&rng, 6, 0, KVQ_PURPOSE_TEST);
  float x[16 * 64], token[KVQ_MAX_HEAD_DIM], run[KVQ_POLAR_RUN];
  uint32_t compared = 0;
  for (uint32_t k = 0; k < 9; k++) {
    polar_fixture f;
    fixture_init(&f, d, P, levels[k], configs[k], KVQ_ROTATION_HADAMARD);
    const kvq_side_layout *s = &f.side.layout;
    const cpu_head head = kvq_cpu_head(&f.side);
    for (uint32_t i = 0; i < P * d; i++) x[i] = (float)kvq_rng_gaussian(&rng) * (i % 5 == 0 ? 8.0f : 1.0f);
    memset(f.block, 0, s->head_bytes);
    kvq_cpu_polar.encode(&head, x, d, P, f.block);
    const kvq_io io = kvq_cpu_io(&head, f.block, NULL, NULL);
    for (uint32_t t = 0; t < P; t++) {
      kvq_polar_decode_token(&io, 0, t, P, d, s->levels, s->level_bits, 0, token);
      for (uint32_t c0 = 0; c0 < d; c0 += KVQ_POLAR_RUN) {
        for (uint32_t j = 0; j < KVQ_POLAR_RUN; j++) run[j] = NAN; /* every entry must be written */
        kvq_polar_decode_run(&io, 0, t, c0, P, d, s->levels, s->level_bits, 0, run);
        for (uint32_t j = 0; j < KVQ_POLAR_RUN; j++) {
          cr_assert(kvq_f32_to_bits(run[j]) == kvq_f32_to_bits(token[c0 + j]),
                    "config %u, token %u, coordinate %u: %a by run, %a by token", k, t, c0 + j, (double)run[j],
                    (double)token[c0 + j]);
          compared++;
        }
      }
    }
    fixture_free(&f);
  }
  cr_assert(compared == 9 * 16 * 64);
}

Test(polar, rotations_are_orthogonal_and_invertible) {
  const kvq_rotation rotations[] = {KVQ_ROTATION_DENSE, KVQ_ROTATION_HADAMARD};
  const uint32_t bits[4] = {4, 2, 2, 2};
  kvq_rng rng;
  kvq_rng_init(&rng, 1, 0, KVQ_PURPOSE_TEST);
  for (int r = 0; r < 2; r++) {
    polar_fixture f;
    fixture_init(&f, 128, 16, 4, bits, rotations[r]);
    const cpu_head head = kvq_cpu_head(&f.side);
    float x[128], y[128], back[128];
    for (int trial = 0; trial < 20; trial++) {
      for (int c = 0; c < 128; c++) x[c] = (float)kvq_rng_gaussian(&rng);
      kvq_cpu_polar.prepare(&head, x, y); /* the query path rotates with the same R */
      double nx = 0, ny = 0, err = 0;
      kvq_cpu_polar.unrotate(&head, y, back);
      for (int c = 0; c < 128; c++) {
        nx += (double)x[c] * x[c];
        ny += (double)y[c] * y[c];
        err += ((double)back[c] - x[c]) * ((double)back[c] - x[c]);
      }
      /* fp32 rotation of 128 terms: relative norm change and round-trip error of order d 2^-24 */
      cr_assert(fabs(ny / nx - 1) < 128 * 0x1p-24 * 4, "rotation %d changes the norm by %g", r, ny / nx - 1);
      cr_assert(sqrt(err / nx) < 128 * 0x1p-24 * 4, "rotation %d: unrotate(rotate(x)) off by %g", r, sqrt(err / nx));
    }
    fixture_free(&f);
  }
}

/* The normalized density of a level's angle (polarquant-math.md, Lemma 2). */
static double angle_density(uint32_t level, double psi) {
  if (level == 1) return 1.0 / (2 * pi);
  const double n = pow(2.0, level - 1) - 1;
  const double k = pow(2.0, level - 1);
  const double norm = exp(lgamma(k) - (k - 2) * log(2.0) - 2 * lgamma(k / 2));
  return norm * pow(sin(2 * psi), n);
}

static double integral(uint32_t level, double a, double b) {
  const int m = 2000;
  const double h = (b - a) / m;
  double sum = 0;
  for (int i = 0; i <= m; i++) sum += (i == 0 || i == m ? 1 : i % 2 ? 4 : 2) * angle_density(level, a + i * h);
  return sum * h / 3;
}

static uint32_t code_at(const polar_fixture *f, uint32_t level, uint32_t t, uint32_t a) {
  const kvq_side_layout *s = &f->side.layout;
  const uint32_t b = kvq_polar_level_bits(s->level_bits, level), cpw = 32 / b, angles = s->head_dim >> level;
  const uint32_t i = t * angles + a;
  const uint8_t *w = f->block + kvq_polar_level_offset(s->page_size, s->head_dim, s->level_bits, level) + 4 * (i / cpw);
  const uint32_t word = (uint32_t)w[0] | (uint32_t)w[1] << 8 | (uint32_t)w[2] << 16 | (uint32_t)w[3] << 24;
  return (word >> ((i % cpw) * b)) & ((1u << b) - 1u);
}

/*
 * Goodness of fit. For Gaussian input the rotated coordinates are i.i.d. Gaussian and every angle
 * follows its level's density (Lemma 2), so the count of each code is multinomial with the
 * probability of its bin: the density integrated between the midpoints of neighbouring centroids.
 * Pearson's statistic sum (O - E)^2 / E is then approximately chi-square with K - 1 degrees of
 * freedom; the test rejects above its 1 - 1e-4 quantile (Wilson-Hilferty, z = 3.719), so a correct
 * encoder fails with probability 1e-4 per level, while a wrong boundary, an angle measured from the
 * wrong axis or a swapped half moves whole bins and is caught.
 */
Test(polar, angle_codes_follow_the_analytic_densities, .timeout = 120) {
  const uint32_t d = 128, P = 64, levels = 5, bits[5] = {4, 3, 3, 2, 2};
  const kvq_rotation rotations[] = {KVQ_ROTATION_DENSE, KVQ_ROTATION_HADAMARD};
  kvq_rng rng;
  kvq_rng_init(&rng, 2, 0, KVQ_PURPOSE_TEST);
  float *x = malloc(sizeof(float) * P * d);
  for (int r = 0; r < 2; r++) {
    polar_fixture f;
    fixture_init(&f, d, P, levels, bits, rotations[r]);
    const cpu_head head = kvq_cpu_head(&f.side);
    uint64_t counts[5][16] = {{0}};
    for (int page = 0; page < 40; page++) {
      for (uint32_t i = 0; i < P * d; i++) x[i] = (float)kvq_rng_gaussian(&rng);
      memset(f.block, 0, f.side.layout.head_bytes);
      kvq_cpu_polar.encode(&head, x, d, P, f.block);
      for (uint32_t l = 1; l <= levels; l++)
        for (uint32_t t = 0; t < P; t++)
          for (uint32_t a = 0; a < (d >> l); a++) counts[l - 1][code_at(&f, l, t, a)]++;
    }
    for (uint32_t l = 1; l <= levels; l++) {
      const uint32_t K = 1u << bits[l - 1];
      double c[256];
      kvq_polar_lloyd_max(l, bits[l - 1], c);
      uint64_t total = 0;
      for (uint32_t j = 0; j < K; j++) total += counts[l - 1][j];
      double chi2 = 0;
      for (uint32_t j = 0; j < K; j++) {
        double lo, hi;
        if (l == 1) { /* bins on the circle around evenly spaced centroids */
          lo = c[j] - pi / K;
          hi = c[j] + pi / K;
        } else {
          lo = j == 0 ? 0 : (c[j - 1] + c[j]) / 2;
          hi = j + 1 == K ? pi / 2 : (c[j] + c[j + 1]) / 2;
        }
        const double expected = total * (l == 1 ? (hi - lo) / (2 * pi) : integral(l, lo, hi));
        chi2 += (counts[l - 1][j] - expected) * (counts[l - 1][j] - expected) / expected;
      }
      const double k = K - 1, z = 3.719;
      const double critical = k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
      cr_log_info("rotation %d level %u: chi2 %.2f with %u bins (critical %.2f)", r, l, chi2, K, critical);
      cr_assert(chi2 < critical, "rotation %d level %u: codes do not follow the density (chi2 %.2f > %.2f)", r, l, chi2,
                critical);
    }
    fixture_free(&f);
  }
  free(x);
}

/* The offline codebooks are Lloyd-Max fixed points: each centroid is the conditional mean of its
 * bin (checked with libm's sin, independently of kvq's own), and the level-1 one is uniform. */
Test(polar, offline_codebooks_are_lloyd_max) {
  for (uint32_t l = 2; l <= 6; l++)
    for (uint32_t b = 1; b <= 4; b++) {
      const uint32_t K = 1u << b;
      double c[16];
      kvq_polar_lloyd_max(l, b, c);
      for (uint32_t j = 0; j < K; j++) {
        const double lo = j == 0 ? 0 : (c[j - 1] + c[j]) / 2, hi = j + 1 == K ? pi / 2 : (c[j] + c[j + 1]) / 2;
        const int m = 4000;
        double m0 = 0, m1 = 0;
        for (int i = 0; i <= m; i++) {
          const double psi = lo + (hi - lo) * i / m, w = (i == 0 || i == m ? 1 : i % 2 ? 4 : 2) * angle_density(l, psi);
          m0 += w;
          m1 += w * psi;
        }
        cr_assert(fabs(m1 / m0 - c[j]) < 1e-6, "level %u, %u bits, centroid %u: %.9f, conditional mean %.9f", l, b, j, c[j],
                  m1 / m0);
        if (j > 0) cr_assert_gt(c[j], c[j - 1]);
      }
      /* the density is symmetric about pi/4, so are the centroids */
      for (uint32_t j = 0; j < K; j++) cr_assert(fabs(c[j] + c[K - 1 - j] - pi / 2) < 1e-9);
    }
  double c[8];
  kvq_polar_lloyd_max(1, 3, c);
  for (int j = 0; j < 8; j++) cr_assert(fabs(c[j] - (j + 0.5) * pi / 4) < 1e-15);
}

/* The Lloyd-Max distortion E[(psi - psi~)^2] of a level's quantizer, by quadrature. */
static double level_distortion(uint32_t level, uint32_t bits) {
  const uint32_t K = 1u << bits;
  if (level == 1) return pow(2 * pi / K, 2) / 12; /* uniform bins of width 2 pi / K */
  double c[256], total = 0;
  kvq_polar_lloyd_max(level, bits, c);
  for (uint32_t j = 0; j < K; j++) {
    const double lo = j == 0 ? 0 : (c[j - 1] + c[j]) / 2, hi = j + 1 == K ? pi / 2 : (c[j] + c[j + 1]) / 2;
    const int m = 2000;
    for (int i = 0; i <= m; i++) {
      const double psi = lo + (hi - lo) * i / m;
      total += (i == 0 || i == m ? 1 : i % 2 ? 4 : 2) * angle_density(level, psi) * (psi - c[j]) * (psi - c[j]) * (hi - lo) / m / 3;
    }
  }
  return total;
}

/*
 * Theorem 1 gives E||x - x~||^2 <= eps ||x||^2 with O(log 1/eps) bits. The bound kvq checks, derived
 * for its quantizer: let y_j be the reconstruction that uses quantized angles at levels >= j and exact
 * ones below. Changing the level-j angles of sub-blocks of radius rho moves each by rho * 2|sin(D/2)|
 * <= rho |D| (the halves below keep their directions), and the sub-blocks have orthogonal supports
 * with sum rho^2 = r^2, so ||y_{j+1} - y_j||^2 <= sum rho^2 D^2. For Gaussian input the angles are
 * independent of each other and of r (Lemma 2), hence E||y_{j+1} - y_j||^2 <= D_j E r^2 with D_j the
 * level's distortion, and by the triangle and Cauchy-Schwarz inequalities
 *   E||x - x~||^2 <= L (sum_j D_j) E||x||^2,
 * plus the fp16 rounding of the radius (relative 2^-11): (sqrt(L sum D_j) + 2^-11)^2 in all.
 * The test compares sample means over 32,768 blocks with 5 standard errors of slack.
 */
Test(polar, error_falls_with_bits_and_meets_the_theorem_1_bound, .timeout = 120) {
  const uint32_t d = 128, P = 64;
  const uint32_t configs[][4] = {{1, 2, 2, 2}, {2, 2, 2, 2}, {4, 2, 2, 2}, {4, 3, 3, 3}, {6, 4, 4, 4}};
  kvq_rng rng;
  kvq_rng_init(&rng, 3, 0, KVQ_PURPOSE_TEST);
  float *x = malloc(sizeof(float) * P * d), *out = malloc(sizeof(float) * P * d);
  double previous = INFINITY;
  for (int k = 0; k < 5; k++) {
    polar_fixture f;
    fixture_init(&f, d, P, 4, configs[k], KVQ_ROTATION_DENSE);
    double sum_d = 0;
    for (uint32_t l = 1; l <= 4; l++) sum_d += level_distortion(l, configs[k][l - 1]);
    const double bound = pow(sqrt(4 * sum_d) + 0x1p-11, 2);
    double err_sum = 0, norm_sum = 0, diff_sum = 0, diff_sq = 0;
    const int pages = 64;
    for (int page = 0; page < pages; page++) {
      for (uint32_t i = 0; i < P * d; i++) x[i] = (float)kvq_rng_gaussian(&rng);
      round_trip(&f, x, out);
      for (uint32_t t = 0; t < P; t++) {
        double e = 0, nrm = 0;
        for (uint32_t c = 0; c < d; c++) {
          e += ((double)out[t * d + c] - x[t * d + c]) * ((double)out[t * d + c] - x[t * d + c]);
          nrm += (double)x[t * d + c] * x[t * d + c];
        }
        err_sum += e;
        norm_sum += nrm;
        diff_sum += e - bound * nrm;
        diff_sq += (e - bound * nrm) * (e - bound * nrm);
      }
    }
    const double n = (double)pages * P, mean = diff_sum / n, se = sqrt((diff_sq / n - mean * mean) / n);
    const double ratio = err_sum / norm_sum;
    cr_log_info("bits %u,%u,%u,%u: E||x - x~||^2 / E||x||^2 = %.5f, bound %.5f", configs[k][0], configs[k][1],
                configs[k][2], configs[k][3], ratio, bound);
    cr_assert(mean <= 5 * se, "bits %u,%u,%u,%u: error ratio %.5f above the bound %.5f", configs[k][0], configs[k][1],
              configs[k][2], configs[k][3], ratio, bound);
    cr_assert(ratio < previous, "error must fall as bits rise: %.5f after %.5f", ratio, previous);
    previous = ratio;
    fixture_free(&f);
  }
  free(x);
  free(out);
}

/* 3.875, 2.875 and 2.375 bits per number at head_dim 128 (L = 4; 4/2/1 bits at level 1). */
Test(polar, bits_per_number) {
  const uint32_t level1[] = {4, 2, 1};
  const double expect[] = {3.875, 2.875, 2.375};
  for (int i = 0; i < 3; i++) {
    kvq_method_config m = kvq_method_defaults(KVQ_METHOD_POLAR, 128);
    m.polar.bits[0] = level1[i];
    kvq_layer_config layer = {.query_heads = 1, .kv_heads = 1, .head_dim = 128, .keys = m, .values = m};
    double kb, vb;
    cr_assert_eq(kvq_layer_bits_per_number(&layer, 32, &kb, &vb), KVQ_OK);
    cr_assert_eq(kb, expect[i], "%g bits, expected %g", kb, expect[i]);
  }
}
