/* Shared helpers of the kvq tests. */
#ifndef KVQ_TESTS_HELPERS_H
#define KVQ_TESTS_HELPERS_H

#include <criterion/criterion.h>
#include <stdint.h>

#include "kvq/kvq.h"
#include "th_configs.h"

/*
 * Every test ends with a leak check. Criterion runs each test in a worker process that leaves
 * without running exit handlers, so LeakSanitizer's usual check at exit never happens there and a
 * leak inside a test would pass unnoticed. In AddressSanitizer builds th_leak_check() runs
 * LeakSanitizer on the spot and fails the test when memory is unreachable (its report is on
 * stderr); elsewhere it does nothing. Test is redefined here, after Criterion's own definition, so
 * that no test can leave the check out: every test file includes this header.
 */
void th_leak_check(void);
#undef Test
#define Test(...) CR_EXPAND(TH_TEST_(__VA_ARGS__, .sentinel_ = 0))
#define TH_TEST_(Suite, Name, ...)                                                                  \
  static void th_body_##Suite##_##Name(void);                                                       \
  CR_TEST_BASE(Suite, Name, __VA_ARGS__) {                                                         \
    th_body_##Suite##_##Name();                                                                     \
    th_leak_check();                                                                                \
  }                                                                                                 \
  static void th_body_##Suite##_##Name(void)

/* Asserts a kvq call returned KVQ_OK, printing the context's message otherwise. */
#define KVQ_CHECK(ctx, call)                                                                             \
  do {                                                                                                   \
    kvq_status st_ = (call);                                                                             \
    cr_assert_eq(st_, KVQ_OK, "%s -> %s: %s", #call, kvq_status_string(st_), kvq_context_last_error(ctx)); \
  } while (0)

kvq_cache_config th_config(const kvq_layer_config *layers, uint32_t count, kvq_dtype input, uint32_t page_size,
                           uint32_t window, uint32_t max_pages, uint32_t max_sequences, uint64_t seed);

kvq_context *th_cpu_context(void);

/* fp32 arrays to a host tensor of dtype `dtype` (the caller frees *storage). */
kvq_tensor th_tensor_from_f32(const float *data, kvq_dtype dtype, int64_t d0, int64_t d1, int64_t d2, void **storage);

/* Rounds values in place to what a dtype can hold (round half to even). */
void th_round_to_dtype(float *x, size_t n, kvq_dtype dtype);

/* Exact attention in double: queries [nq][hq][d] against keys/values [n][hkv][d], causal if asked
 * (query i at position n - nq + i). out [nq][hq][d]; probs (optional) [nq][hq][n]. */
void th_exact_attention(const float *q, const float *k, const float *v, uint32_t nq, uint32_t n, uint32_t hq,
                        uint32_t hkv, uint32_t d, int causal, double *out, double *probs);

/* Appends tokens [first, first + count) of packed fp32 keys/values [n][hkv][d] in the input dtype. */
void th_append(kvq_context *ctx, kvq_cache *cache, uint32_t seq, uint32_t layer, const float *k, const float *v,
               uint32_t first, uint32_t count, uint32_t hkv, uint32_t d, kvq_dtype dtype);

/* A fresh directory /tmp/kvq-<what>-XXXXXX (the caller frees the name), and removing it with the
 * files in it (no subdirectories). */
char *th_temp_dir(const char *what);

/* Asserts that the file at path exists and starts with PNG's 8-byte signature (plots written through
 * gnuplot). */
void th_assert_png(const char *path);

#endif
