/* The counter-based generator (core/rng.h), kvq's own log, and the Gaussian sampler. */
#include <criterion/criterion.h>

#include "helpers.h"
#include <math.h>

#include <string.h>

#include "core/detmath.h"
#include "core/rng.h"

static const double pi = 3.14159265358979323846;

/* Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors). */
Test(rng, philox_known_answers) {
  const uint32_t counters[3][4] = {{0, 0, 0, 0},
                                   {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                   {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
  const uint32_t keys[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
  const uint32_t expect[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                 {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                 {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
  for (int i = 0; i < 3; i++) {
    uint32_t out[4];
    kvq_philox4x32_10(counters[i], keys[i], out);
    for (int j = 0; j < 4; j++) cr_assert_eq(out[j], expect[i][j], "vector %d word %d: %08x", i, j, out[j]);
  }
}

/* The stream layout (docs/FORMAT.md): word w of (seed, layer, purpose) is word w % 4 of
 * Philox(counter = (w / 4, 0, layer, purpose), key = seed halves). */
Test(rng, stream_layout) {
  kvq_rng rng;
  const uint64_t seed = 0x0123456789abcdefull;
  kvq_rng_init(&rng, seed, 7, KVQ_PURPOSE_QJL_SKETCH);
  for (uint32_t block = 0; block < 5; block++) {
    uint32_t counter[4] = {block, 0, 7, KVQ_PURPOSE_QJL_SKETCH}, key[2] = {0x89abcdefu, 0x01234567u}, out[4];
    kvq_philox4x32_10(counter, key, out);
    for (int j = 0; j < 4; j++) cr_assert_eq(kvq_rng_u32(&rng), out[j], "block %u word %d", block, j);
  }
}

/* Pinned values for fixed seeds: any change to the generator, the uniform or the Gaussian
 * construction changes them (and every matrix of every saved cache). */
Test(rng, pinned_stream) {
  kvq_rng rng;
  kvq_rng_init(&rng, 42, 3, KVQ_PURPOSE_QJL_OUTLIER_SKETCH);
  const uint32_t expect_u32[4] = {0xd760a9f5u, 0xe4275069u, 0x86783204u, 0x9430bdc8u};
  for (int i = 0; i < 4; i++) cr_assert_eq(kvq_rng_u32(&rng), expect_u32[i], "word %d", i);
  kvq_rng_init(&rng, 42, 3, KVQ_PURPOSE_QJL_OUTLIER_SKETCH);
  /* 1.227992105535963, 0.09092161763505678 (checked by hand from the words above), -0.216407, 2.06654 */
  const uint64_t expect_gauss[4] = {0x3ff3a5db0cd05ecaull, 0x3fb746a39e3df2c7ull, 0xbfcbb338761f61d4ull,
                                    0x4000884677020007ull};
  for (int i = 0; i < 4; i++) {
    double g = kvq_rng_gaussian(&rng);
    uint64_t bits;
    memcpy(&bits, &g, 8);
    cr_assert_eq(bits, expect_gauss[i], "gaussian %d = %a", i, g);
  }
}

Test(rng, uniform_range_and_moments) {
  kvq_rng rng;
  kvq_rng_init(&rng, 1, 0, KVQ_PURPOSE_TEST);
  const int n = 200000;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; i++) {
    double u = kvq_rng_uniform(&rng);
    cr_assert(u >= 0.0 && u < 1.0);
    sum += u;
    sum2 += u * u;
  }
  /* Mean 1/2 with standard error sqrt(1/12/n) = 6.5e-4; 5 standard errors. */
  cr_assert(fabs(sum / n - 0.5) < 5 * sqrt(1.0 / 12 / n), "mean %f", sum / n);
  cr_assert(fabs(sum2 / n - 1.0 / 3) < 5 * sqrt(4.0 / 45 / n), "second moment %f", sum2 / n);
}

Test(rng, gaussian_moments) {
  kvq_rng rng;
  kvq_rng_init(&rng, 2, 0, KVQ_PURPOSE_TEST);
  const int n = 400000;
  double m1 = 0, m2 = 0, m4 = 0;
  int beyond3 = 0;
  for (int i = 0; i < n; i++) {
    double g = kvq_rng_gaussian(&rng);
    m1 += g;
    m2 += g * g;
    m4 += g * g * g * g;
    beyond3 += fabs(g) > 3.0;
  }
  m1 /= n;
  m2 /= n;
  m4 /= n;
  /* Standard errors: mean 1/sqrt(n), E g^2: sqrt(2/n), E g^4: sqrt(96/n); 5 of each. */
  cr_assert(fabs(m1) < 5 / sqrt(n), "mean %f", m1);
  cr_assert(fabs(m2 - 1) < 5 * sqrt(2.0 / n), "variance %f", m2);
  cr_assert(fabs(m4 - 3) < 5 * sqrt(96.0 / n), "fourth moment %f", m4);
  /* P(|g| > 3) = 0.0026998; binomial standard error sqrt(p(1-p)/n). */
  double p = (double)beyond3 / n;
  cr_assert(fabs(p - 0.0026998) < 5 * sqrt(0.0027 / n), "tail %f", p);
}

Test(detmath, log_matches_libm) {
  /* kvq_det_log is not required to equal libm's log, only to be deterministic and accurate.
   * Error budget: z = (f - 1) / (f + 1) carries 1 rounding (f - 1 and f + 1 are exact or 1 ulp),
   * the Horner series 1 more, 2 z * series 1, the final sum with e ln 2 one more; truncation is
   * below 1e-20. So |error| <= 4 ulp of |ln f| plus 2 ulp of |e ln 2|; libm adds its own 1 ulp.
   * Allowed: 8 * 2^-53 * (|ln x| + |e| ln 2). */
  kvq_rng rng;
  kvq_rng_init(&rng, 3, 0, KVQ_PURPOSE_TEST);
  for (int i = 0; i < 100000; i++) {
    double x = kvq_rng_uniform(&rng);
    if (x == 0) continue;
    if (i % 3 == 0) x = ldexp(x, -(i % 900));
    double got = kvq_det_log(x), want = log(x);
    int e = ilogb(x);
    double allowed = 8 * 0x1p-53 * (fabs(want) + fabs((double)e) * 0.6931471805599453);
    cr_assert(fabs(got - want) <= allowed, "log(%a) = %a, libm %a", x, got, want);
  }
  cr_assert_eq(kvq_det_log(1.0), 0.0);
  cr_assert(fabs(kvq_det_log(2.0) - 0.6931471805599453) < 1e-16);
}

Test(detmath, qjl_constant) {
  /* c_d = sqrt(pi) Gamma((d+1)/2) / (sqrt(d) Gamma(d/2)), against lgamma, and its known limit
   * sqrt(pi/2) (1 + 1/(4d) + ...): the paper's constant is c_d's large-d limit. */
  for (uint32_t d = 16; d <= 256; d += 16) {
    double expect = sqrt(pi) * exp(lgamma((d + 1) / 2.0) - lgamma(d / 2.0)) / sqrt((double)d);
    cr_assert(fabs(kvq_qjl_unbiased_constant(d) - expect) < 1e-13, "d = %u", d);
  }
  double bias128 = sqrt(pi / 2) / kvq_qjl_unbiased_constant(128) - 1;
  double bias64 = sqrt(pi / 2) / kvq_qjl_unbiased_constant(64) - 1;
  cr_assert(bias128 > 0.0019 && bias128 < 0.0021, "sqrt(pi/2) biases by %g at d = 128", bias128);
  cr_assert(bias64 > 0.0038 && bias64 < 0.0041, "sqrt(pi/2) biases by %g at d = 64", bias64);
}
