/* Householder QR, the orthogonal sketches built from it, and SHA-256. */
#include <criterion/criterion.h>

#include "helpers.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/matrix.h"
#include "core/rng.h"
#include "core/sha256.h"

static void random_matrix(double *a, uint32_t n, uint32_t b, uint64_t seed) {
  kvq_rng rng;
  kvq_rng_init(&rng, seed, 0, KVQ_PURPOSE_TEST);
  for (size_t i = 0; i < (size_t)n * b; i++) a[i] = kvq_rng_gaussian(&rng);
}

Test(qr, orthonormal_columns_and_positive_diagonal) {
  const uint32_t shapes[][2] = {{16, 16}, {64, 64}, {128, 128}, {128, 32}, {64, 1}, {256, 200}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    uint32_t n = shapes[s][0], b = shapes[s][1];
    double *a = malloc(sizeof(double) * n * b), *a0 = malloc(sizeof(double) * n * b);
    double *q = malloc(sizeof(double) * n * b), *work = malloc(sizeof(double) * (n * b + 2 * b));
    random_matrix(a, n, b, 10 + s);
    memcpy(a0, a, sizeof(double) * n * b);
    kvq_householder_q(a, n, b, q, work);
    /* Q^T Q = I: Householder QR is backward stable, errors of order n * 2^-53 ~ 3e-14. */
    for (uint32_t i = 0; i < b; i++)
      for (uint32_t j = 0; j < b; j++) {
        double dot = 0;
        for (uint32_t r = 0; r < n; r++) dot += q[(size_t)i * n + r] * q[(size_t)j * n + r];
        cr_assert(fabs(dot - (i == j)) < 1e-12, "%ux%u: (Q^T Q)[%u][%u] = %.3g", n, b, i, j, dot);
      }
    /* R = Q^T A is upper triangular with a positive diagonal (the sign convention). */
    for (uint32_t i = 0; i < b; i++)
      for (uint32_t j = 0; j <= i; j++) {
        double r = 0, scale = 0;
        for (uint32_t k = 0; k < n; k++) {
          r += q[(size_t)i * n + k] * a0[(size_t)j * n + k];
          scale += a0[(size_t)j * n + k] * a0[(size_t)j * n + k];
        }
        if (i == j) cr_assert_gt(r, 0.0, "%ux%u: R[%u][%u] = %g must be positive", n, b, i, i, r);
        else cr_assert(fabs(r) < 1e-12 * sqrt(scale), "%ux%u: R[%u][%u] = %g must vanish", n, b, i, j, r);
      }
    free(a);
    free(a0);
    free(q);
    free(work);
  }
}

Test(sketch, blocks_of_orthogonal_rows_of_norm_sqrt_d) {
  const uint32_t cases[][2] = {{256, 128}, {96, 64}, {32, 128}, {1024, 256}};
  for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
    uint32_t m = cases[s][0], d = cases[s][1];
    float *S = malloc(sizeof(float) * m * d);
    cr_assert_eq(kvq_build_sketch(7, 1, KVQ_PURPOSE_QJL_SKETCH, m, d, S), 0);
    for (uint32_t i = 0; i < m; i++)
      for (uint32_t j = i; j < m && j / d == i / d; j++) {
        double dot = 0;
        for (uint32_t c = 0; c < d; c++) dot += (double)S[(size_t)i * d + c] * S[(size_t)j * d + c];
        /* Rounding each entry to fp32 perturbs a dot of norm-sqrt(d) rows by at most
         * 2 * d * 2^-24 relative: 1.2e-5 at d = 256. */
        double expect = i == j ? d : 0.0;
        cr_assert(fabs(dot - expect) < 2.0 * d * d * 0x1p-24, "m=%u d=%u rows %u,%u: %g", m, d, i, j, dot);
      }
    free(S);
  }
}

Test(sketch, streams_are_independent_and_reproducible) {
  const uint32_t m = 64, d = 64;
  float *a = malloc(sizeof(float) * m * d), *b = malloc(sizeof(float) * m * d), *c = malloc(sizeof(float) * m * d);
  kvq_build_sketch(1, 0, KVQ_PURPOSE_QJL_SKETCH, m, d, a);
  kvq_build_sketch(1, 0, KVQ_PURPOSE_QJL_SKETCH, m, d, b);
  kvq_build_sketch(1, 0, KVQ_PURPOSE_QJL_OUTLIER_SKETCH, m, d, c);
  cr_assert_eq(memcmp(a, b, sizeof(float) * m * d), 0, "same stream, same matrix");
  cr_assert_neq(memcmp(a, c, sizeof(float) * m * d), 0, "another purpose, another matrix");
  free(a);
  free(b);
  free(c);
}

/* The SHA-256 of a sketch pins every step of its construction: Philox stream, uniform, polar
 * Gaussian with kvq_det_log, Householder order, sign convention, scaling and fp32 rounding. A
 * change here changes every saved cache's matrices and must be deliberate (docs/FORMAT.md). */
Test(sketch, pinned_sha256) {
  const uint32_t m = 256, d = 128;
  float *S = malloc(sizeof(float) * m * d);
  kvq_build_sketch(1, 0, KVQ_PURPOSE_QJL_SKETCH, m, d, S);
  uint8_t digest[32];
  char hex[65];
  kvq_sha256_digest(S, sizeof(float) * m * d, digest);
  kvq_sha256_hex(digest, hex);
  cr_assert_str_eq(hex, "fe7fcb6e355336946dbc7b228c35e1b6f211bfec2e7ac32f0c7beb8076087520");
  free(S);
}

Test(sha256, known_vectors) {
  struct {
    const char *text;
    const char *digest;
  } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  for (size_t i = 0; i < 3; i++) {
    uint8_t digest[32];
    char hex[65];
    kvq_sha256_digest(v[i].text, strlen(v[i].text), digest);
    kvq_sha256_hex(digest, hex);
    cr_assert_str_eq(hex, v[i].digest, "sha256(\"%s\")", v[i].text);
  }
  /* One million 'a', fed in uneven pieces through the streaming interface. */
  kvq_sha256 h;
  kvq_sha256_init(&h);
  char chunk[997];
  memset(chunk, 'a', sizeof chunk);
  size_t left = 1000000;
  while (left) {
    size_t take = left < sizeof chunk ? left : sizeof chunk;
    kvq_sha256_update(&h, chunk, take);
    left -= take;
  }
  uint8_t digest[32];
  char hex[65];
  kvq_sha256_final(&h, digest);
  kvq_sha256_hex(digest, hex);
  cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
