/*
 * What the programs that write test fixtures through the public API share (the CUDA kernel references
 * of tests/cuda_kernels and tests/cuda_attention, the CUDA backend's test): method configurations
 * spelled out field by field (no defaults filled in) and a deterministic input. Header-only: those
 * programs link kvq but not the Criterion helpers of tests/helpers.c.
 */
#ifndef KVQ_TESTS_FIXTURE_INPUTS_H
#define KVQ_TESTS_FIXTURE_INPUTS_H

#include "kvq/kvq.h"

static inline kvq_method_config mc_qjl(uint32_t m, uint32_t k, uint32_t mo) {
  return (kvq_method_config){.method = KVQ_METHOD_QJL, .qjl = {.sketch_dim = m, .outlier_count = k, .outlier_sketch_dim = mo}};
}
static inline kvq_method_config mc_uniform(uint32_t bits, uint32_t group) {
  return (kvq_method_config){.method = KVQ_METHOD_UNIFORM, .uniform = {.bits = bits, .group_size = group}};
}
static inline kvq_method_config mc_kivi(uint32_t bits, uint32_t group_tokens) {
  return (kvq_method_config){.method = KVQ_METHOD_KIVI, .kivi = {.bits = bits, .group_tokens = group_tokens}};
}
static inline kvq_method_config mc_exact(kvq_dtype dtype) {
  return (kvq_method_config){.method = KVQ_METHOD_EXACT, .exact = {.dtype = dtype}};
}
/* bits[l] for each of the levels */
static inline kvq_method_config mc_polar(uint32_t levels, const uint32_t *bits, kvq_rotation rotation,
                                         kvq_codebook_source codebook) {
  kvq_method_config m = {.method = KVQ_METHOD_POLAR, .polar = {.levels = levels, .rotation = rotation, .codebook = codebook}};
  for (uint32_t l = 0; l < levels; l++) m.polar.bits[l] = bits[l];
  return m;
}
/* 8 k-means iterations: enough for tests, few enough for the emulated kernels */
static inline kvq_method_config mc_cq(uint32_t channels, uint32_t bits) {
  return (kvq_method_config){.method = KVQ_METHOD_CQ, .cq = {.channels = channels, .bits = bits, .iterations = 8}};
}

/* Element i of a deterministic input in [-2, 2) (a hash of i and salt), six times larger in channels
 * `outlier_a` and `outlier_b` of every head_dim d (QJL's outliers). */
static inline float fx_value_at(uint32_t i, uint32_t salt, uint32_t d, uint32_t outlier_a, uint32_t outlier_b) {
  uint32_t u = (i + 1u) * 2654435761u ^ (salt * 40503u);
  u ^= u >> 15;
  u *= 2246822519u;
  u ^= u >> 13;
  float v = ((float)(u & 0xffffu) / 65535.0f - 0.5f) * 4.0f;
  if (i % d == outlier_a || i % d == outlier_b) v *= 6.0f;
  return v;
}

/* Fills a[0..n) with values in [-1, 1) from a linear congruential generator whose state is `x`;
 * returns the state after them, so that arrays filled one after another continue one sequence (the
 * inputs of the fault-injection and thread tests). */
static inline uint32_t fx_fill_lcg(float *a, size_t n, uint32_t x) {
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    a[i] = (float)(x >> 8) / 8388608.0f - 1.0f;
  }
  return x;
}

#endif /* KVQ_TESTS_FIXTURE_INPUTS_H */
