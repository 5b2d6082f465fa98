/*
 * Method configurations spelled out field by field (no defaults filled in), for the programs that
 * write test fixtures through the public API: the CUDA kernel references (tests/cuda_kernels,
 * tests/cuda_attention) and the CUDA backend's test. Header-only: those programs link kvq but not the
 * Criterion helpers of tests/helpers.c.
 */
#ifndef KVQ_TESTS_METHOD_CONFIGS_H
#define KVQ_TESTS_METHOD_CONFIGS_H

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

#endif /* KVQ_TESTS_METHOD_CONFIGS_H */
