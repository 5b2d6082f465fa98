/* Method and layer configs of the kvq tests, and the helpers that need no Criterion: the Criterion
 * tests get them through helpers.h, and the plain TAP programs (tests/test_gpu_matrices.c: Criterion
 * cannot start under ThreadSanitizer) include this header and compile th_configs.c themselves. */
#ifndef KVQ_TESTS_TH_CONFIGS_H
#define KVQ_TESTS_TH_CONFIGS_H

#include <stdint.h>

#include "kvq/kvq.h"

/* Method configs with explicit parameters. */
kvq_method_config th_qjl(uint32_t m, uint32_t k, uint32_t m_o);
kvq_method_config th_uniform(uint32_t bits, uint32_t group);
kvq_method_config th_kivi(uint32_t bits, uint32_t group_tokens); /* 0: each channel's scale over the page */
kvq_method_config th_cq(uint32_t channels, uint32_t bits);
/* PolarQuant with offline codebooks: L = 3, bits 3, 2, 2, dense or Hadamard rotation. */
kvq_method_config th_polar(kvq_rotation rotation);
kvq_method_config th_exact(kvq_dtype dtype);

/* A one-layer config with the given methods. */
kvq_layer_config th_layer(uint32_t hq, uint32_t hkv, uint32_t d, kvq_method_config keys, kvq_method_config values);

/* Removes a directory of plain files (a test's temporary directory) and the files in it. */
void th_remove_dir(const char *dir);

#endif
