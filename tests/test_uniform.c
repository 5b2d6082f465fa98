/* Uniform token-wise quantization: threshold decisions, the error bound, constant groups, and the
 * bit packing of every width (backends/cpu/cpu_uniform.c, core/quantize_math.h). */
#include <criterion/criterion.h>

#include "helpers.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "core/layout.h"
#include "core/quantize_math.h"
#include "core/rng.h"

/* A one-head side of a method, as the CPU jobs see it. */
static kvq_side_desc side_of(kvq_method_config mc, uint32_t P, uint32_t d) {
  kvq_side_desc side;
  memset(&side, 0, sizeof side);
  kvq_side_layout_init(&side.layout, &mc, P, d, 1);
  return side;
}

static kvq_side_desc uniform_side(uint32_t P, uint32_t d, uint32_t bits, uint32_t group) {
  kvq_method_config mc = kvq_method_defaults(KVQ_METHOD_UNIFORM, d);
  mc.uniform.bits = bits;
  mc.uniform.group_size = group;
  return side_of(mc, P, d);
}

static uint32_t read_word(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

Test(uniform, code_is_the_number_of_thresholds_reached) {
  kvq_rng rng;
  kvq_rng_init(&rng, 1, 0, KVQ_PURPOSE_TEST);
  const uint32_t widths[] = {1, 2, 3, 4, 8};
  for (int w = 0; w < 5; w++) {
    const uint32_t b = widths[w], L = kvq_uniform_levels(b);
    for (int trial = 0; trial < 2000; trial++) {
      float mn = (float)(kvq_rng_gaussian(&rng) * 4), mx = mn + (float)(kvq_rng_uniform(&rng) * 8);
      uint32_t params = kvq_uniform_params(mn, mx, b);
      float scale = kvq_uniform_param_scale(params), min = kvq_uniform_param_min(params);
      /* probe random points and the thresholds themselves (ties must count as reached) */
      for (int p = 0; p < 8; p++) {
        float x = p < 4 ? mn + (mx - mn) * (float)kvq_rng_uniform(&rng)
                        : kvq_uniform_threshold(min, scale, 1 + kvq_rng_u32(&rng) % L);
        uint32_t count = 0;
        for (uint32_t j = 1; j <= L; j++) count += kvq_uniform_threshold(min, scale, j) <= x;
        if (scale == 0.0f) count = 0;
        cr_assert_eq(kvq_uniform_code(x, min, scale, b), count, "b=%u x=%a", b, (double)x);
      }
    }
  }
}

/*
 * Error bound, derived: with min_h = fp16(mn), scale_h = fp16(scale32), scale32 = fl((mx - mn) *
 * fl(1/L)), thresholds t_j = fl(min_h + fl((j - 1/2) scale_h)) and x^ = fl(min_h + fl(c scale_h)):
 *   interior codes: |x - x^| <= scale_h / 2 plus the roundings of t_j and x^ (<= 4 u max|.|);
 *   code 0 below min_h: at most |mn - min_h| more;
 *   code L above the top level: mx - x^ <= |mn - min_h| + L |scale32 - scale_h| + L * 2u scale32
 *   (scale32 is within 2u of (mx - mn) / L: one rounding of 1/L, one of the product).
 * So |x - x^| <= scale_h / 2 + |mn - min_h| + L (|scale32 - scale_h| + 2u scale32) + 4u max(|mn|, |mx|),
 * u = 2^-24, which covers scale_h underflowing to 0 (then every x decodes to min_h).
 */
Test(uniform, error_within_derived_bound) {
  kvq_rng rng;
  kvq_rng_init(&rng, 2, 0, KVQ_PURPOSE_TEST);
  const uint32_t P = 16, d = 64, G = 32;
  const uint32_t widths[] = {1, 2, 3, 4, 8};
  float x[16 * 64], out[64];
  for (int w = 0; w < 5; w++) {
    const uint32_t b = widths[w], L = kvq_uniform_levels(b);
    kvq_side_desc side = uniform_side(P, d, b, G);
    const cpu_head head = kvq_cpu_head(&side);
    uint8_t *block = calloc(1, side.layout.head_bytes);
    for (int trial = 0; trial < 200; trial++) {
      /* ranges from tiny (fp16 subnormal scales) to large, offsets far from zero, all within the
       * fp16 range that kvq_append enforces */
      double magnitude = ldexp(1.0, (int)(kvq_rng_u32(&rng) % 30) - 24);
      double offset = (kvq_rng_u32(&rng) % 3) * magnitude * 50;
      for (uint32_t i = 0; i < P * d; i++) x[i] = (float)(offset + magnitude * kvq_rng_gaussian(&rng));
      memset(block, 0, side.layout.head_bytes);
      kvq_cpu_uniform.encode(&head, x, d, P, block);
      for (uint32_t t = 0; t < P; t++) {
        kvq_cpu_uniform.decode(&head, block, t, out);
        for (uint32_t g = 0; g < d / G; g++) {
          const float *xg = x + t * d + g * G;
          float mn = xg[0], mx = xg[0];
          for (uint32_t c = 1; c < G; c++) {
            mn = xg[c] < mn ? xg[c] : mn;
            mx = xg[c] > mx ? xg[c] : mx;
          }
          const double u = 0x1p-24;
          float scale32 = (mx - mn) * kvq_uniform_inv_levels(b);
          uint32_t params = kvq_uniform_params(mn, mx, b);
          double scale_h = kvq_uniform_param_scale(params), min_h = kvq_uniform_param_min(params);
          double bound = scale_h / 2 + fabs(mn - min_h) + L * (fabs(scale32 - scale_h) + 2 * u * scale32) +
                         4 * u * fmax(fabs(mn), fabs(mx));
          for (uint32_t c = 0; c < G; c++) {
            double err = fabs((double)xg[c] - out[g * G + c]);
            cr_assert(err <= bound, "b=%u trial %d token %u channel %u: error %g > bound %g", b, trial, t, g * G + c,
                      err, bound);
          }
        }
      }
    }
    free(block);
  }
}

Test(uniform, constant_group_stores_zero_scale_and_codes) {
  kvq_side_desc side = uniform_side(16, 32, 4, 32);
  const cpu_head head = kvq_cpu_head(&side);
  uint8_t *block = calloc(1, side.layout.head_bytes);
  float x[16 * 32], out[32];
  for (int i = 0; i < 16 * 32; i++) x[i] = 3.14159f;
  kvq_cpu_uniform.encode(&head, x, 32, 16, block);
  for (uint32_t w = 0; w < kvq_uniform_code_words(16, 32, 4); w++) cr_assert_eq(read_word(block + 4 * w), 0u);
  uint32_t params = read_word(block + kvq_uniform_params_offset(16, 32, 4));
  cr_assert_eq(params & 0xffff, 0u, "scale 0");
  cr_assert_eq(params >> 16, kvq_f32_to_f16_bits(3.14159f), "minimum is the value in fp16");
  kvq_cpu_uniform.decode(&head, block, 5, out);
  cr_assert_eq(out[7], kvq_round_f16(3.14159f));
  free(block);
}

/* Packing: every code lands in the documented bits (floor(32 / b) codes per word, LSB first,
 * unused top bits zero) and decodes back, for every width. */
Test(uniform, packing_round_trip_every_width) {
  const uint32_t P = 16, d = 48, G = 16;
  const uint32_t widths[] = {1, 2, 3, 4, 8};
  for (int w = 0; w < 5; w++) {
    const uint32_t b = widths[w], L = kvq_uniform_levels(b), cpw = 32 / b;
    kvq_side_desc side = uniform_side(P, d, b, G);
    const cpu_head head = kvq_cpu_head(&side);
    uint8_t *block = calloc(1, side.layout.head_bytes);
    float x[16 * 48];
    /* each group spans [0, L] exactly, so with scale 1 the code of an integer value is itself */
    for (uint32_t t = 0; t < P; t++)
      for (uint32_t c = 0; c < d; c++) x[t * d + c] = (float)((c % G == 0) ? 0 : (c % G == 1) ? L : (t * 7 + c * 3) % (L + 1));
    kvq_cpu_uniform.encode(&head, x, d, P, block);
    for (uint32_t i = 0; i < P * d; i++) {
      uint32_t word = read_word(block + 4 * (i / cpw));
      uint32_t code = (word >> ((i % cpw) * b)) & L;
      cr_assert_eq(code, (uint32_t)x[i], "b=%u code %u: %u, expected %u", b, i, code, (uint32_t)x[i]);
    }
    for (uint32_t wd = 0; wd < kvq_uniform_code_words(P, d, b); wd++)
      if (cpw * b < 32) cr_assert_eq(read_word(block + 4 * wd) >> (cpw * b), 0u, "b=%u word %u: padding bits", b, wd);
    const uint32_t used = P * d, words = kvq_uniform_code_words(P, d, b);
    for (uint32_t i = used; i < words * cpw; i++)
      cr_assert_eq((read_word(block + 4 * (i / cpw)) >> ((i % cpw) * b)) & L, 0u, "b=%u: unused slot %u", b, i);
    for (uint32_t byte = kvq_uniform_params_offset(P, d, b) + P * (d / G) * 4; byte < side.layout.head_bytes; byte++)
      cr_assert_eq(block[byte], 0, "b=%u: block padding", b);
    free(block);
  }
}

Test(uniform, error_falls_with_bits) {
  kvq_rng rng;
  kvq_rng_init(&rng, 4, 0, KVQ_PURPOSE_TEST);
  const uint32_t P = 64, d = 128;
  float *x = malloc(sizeof(float) * P * d), out[128];
  for (uint32_t i = 0; i < P * d; i++) x[i] = (float)kvq_rng_gaussian(&rng);
  const uint32_t widths[] = {1, 2, 3, 4, 8};
  double previous = INFINITY;
  for (int w = 0; w < 5; w++) {
    kvq_side_desc side = uniform_side(P, d, widths[w], 32);
    const cpu_head head = kvq_cpu_head(&side);
    uint8_t *block = calloc(1, side.layout.head_bytes);
    kvq_cpu_uniform.encode(&head, x, d, P, block);
    double mse = 0;
    for (uint32_t t = 0; t < P; t++) {
      kvq_cpu_uniform.decode(&head, block, t, out);
      for (uint32_t c = 0; c < d; c++) mse += (x[t * d + c] - out[c]) * (x[t * d + c] - out[c]);
    }
    /* one more bit halves the step: the error must fall clearly (a factor 2 at least) */
    cr_assert(mse < previous / 2, "b=%u: mse %g did not fall from %g", widths[w], mse, previous);
    previous = mse;
    free(block);
  }
  free(x);
}

/* ---- KIVI: the same quantizer over a channel's tokens ---------------------------------------- */

static kvq_side_desc kivi_side(uint32_t P, uint32_t d, uint32_t bits, uint32_t group_tokens) {
  kvq_method_config mc = kvq_method_defaults(KVQ_METHOD_KIVI, d);
  mc.kivi.bits = bits;
  mc.kivi.group_tokens = group_tokens;
  return side_of(mc, P, d);
}

/* The error bound of test_uniform's derivation, per (channel, token group), including partial groups
 * of a flushed page. */
Test(kivi, error_within_derived_bound_per_channel) {
  kvq_rng rng;
  kvq_rng_init(&rng, 6, 0, KVQ_PURPOSE_TEST);
  const uint32_t P = 32, d = 48;
  const uint32_t widths[] = {1, 2, 3, 4, 8}, groups[] = {0, 8, 16};
  float x[32 * 48], out[48];
  for (int w = 0; w < 5; w++)
    for (int gi = 0; gi < 3; gi++) {
      const uint32_t b = widths[w], L = kvq_uniform_levels(b), Gt = groups[gi] ? groups[gi] : P;
      kvq_side_desc side = kivi_side(P, d, b, groups[gi]);
      const cpu_head head = kvq_cpu_head(&side);
      uint8_t *block = calloc(1, side.layout.head_bytes);
      for (int trial = 0; trial < 20; trial++) {
        const uint32_t n = trial % 3 == 0 ? 1 + kvq_rng_u32(&rng) % P : P; /* partial pages too */
        for (uint32_t i = 0; i < P * d; i++) x[i] = (float)(((i % d) % 7) * 3.0 + kvq_rng_gaussian(&rng)); /* channel offsets */
        memset(block, 0, side.layout.head_bytes);
        kvq_cpu_kivi.encode(&head, x, d, n, block);
        for (uint32_t t = 0; t < n; t++) {
          kvq_cpu_kivi.decode(&head, block, t, out);
          const uint32_t t0 = t / Gt * Gt, t1 = t0 + Gt < n ? t0 + Gt : n;
          for (uint32_t c = 0; c < d; c++) {
            float mn = x[t0 * d + c], mx = mn;
            for (uint32_t u = t0; u < t1; u++) {
              mn = x[u * d + c] < mn ? x[u * d + c] : mn;
              mx = x[u * d + c] > mx ? x[u * d + c] : mx;
            }
            const double u = 0x1p-24;
            const float scale32 = (mx - mn) * kvq_uniform_inv_levels(b);
            const uint32_t params = kvq_uniform_params(mn, mx, b);
            const double scale_h = kvq_uniform_param_scale(params), min_h = kvq_uniform_param_min(params);
            const double bound = scale_h / 2 + fabs(mn - min_h) + L * (fabs(scale32 - scale_h) + 2 * u * scale32) +
                                 4 * u * fmax(fabs(mn), fabs(mx));
            const double err = fabs((double)x[t * d + c] - out[c]);
            cr_assert(err <= bound, "b=%u Gt=%u n=%u token %u channel %u: error %g > %g", b, Gt, n, t, c, err, bound);
          }
        }
        /* tokens and groups past n are all zero */
        const uint32_t cpw = 32 / b;
        for (uint32_t i = n * d; i < P * d; i++) {
          const uint8_t *word = block + 4 * (i / cpw);
          const uint32_t value = (uint32_t)word[0] | (uint32_t)word[1] << 8 | (uint32_t)word[2] << 16 | (uint32_t)word[3] << 24;
          cr_assert_eq(value >> ((i % cpw) * b) & L, 0u);
        }
        const uint32_t groups_used = (n + Gt - 1) / Gt;
        const uint8_t *params = block + kvq_kivi_params_offset(P, d, b);
        for (uint32_t byte = groups_used * d * 4; byte < (P / Gt) * d * 4; byte++) cr_assert_eq(params[byte], 0);
      }
      free(block);
    }
}

/* Per-channel scales follow the channels: a channel 1000 times larger than the others does not
 * coarsen them (the point of KIVI's per-channel keys), whereas token-wise groups would. */
Test(kivi, outlier_channel_does_not_coarsen_others) {
  const uint32_t P = 16, d = 32;
  kvq_side_desc kivi = kivi_side(P, d, 4, 0);
  kvq_side_desc uni;
  memset(&uni, 0, sizeof uni);
  kvq_method_config mc = kvq_method_defaults(KVQ_METHOD_UNIFORM, d);
  mc.uniform.bits = 4;
  kvq_side_layout_init(&uni.layout, &mc, P, d, 1);
  float x[16 * 32], out[32];
  kvq_rng rng;
  kvq_rng_init(&rng, 7, 0, KVQ_PURPOSE_TEST);
  for (uint32_t i = 0; i < P * d; i++) x[i] = (float)((i % d == 5 ? 1000.0 : 1.0) * kvq_rng_gaussian(&rng));
  double err[2] = {0, 0};
  const kvq_side_desc *sides[2] = {&kivi, &uni};
  const cpu_method *methods[2] = {&kvq_cpu_kivi, &kvq_cpu_uniform};
  for (int m = 0; m < 2; m++) {
    const cpu_head head = kvq_cpu_head(sides[m]);
    uint8_t *block = calloc(1, sides[m]->layout.head_bytes);
    methods[m]->encode(&head, x, d, P, block);
    for (uint32_t t = 0; t < P; t++) {
      methods[m]->decode(&head, block, t, out);
      for (uint32_t c = 0; c < d; c++)
        if (c != 5) err[m] += (x[t * d + c] - out[c]) * (x[t * d + c] - out[c]);
    }
    free(block);
  }
  cr_assert(err[0] * 100 < err[1], "per-channel error %g should be far below token-wise %g on the other channels", err[0],
            err[1]);
}
