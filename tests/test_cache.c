/* Cache mechanics: the residual window, flush, re-quantization of a flushed partial page, the page
 * pool shared by sequences, and attention over pages plus window, checked with exact storage where
 * every number must come back unchanged. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static void expect_info(kvq_context *ctx, kvq_cache *cache, uint32_t seq, uint64_t tokens, uint64_t quantized,
                        uint32_t pages) {
  kvq_sequence_info info;
  KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seq, 0, &info));
  cr_assert_eq(info.tokens, tokens, "tokens %llu, expected %llu", (unsigned long long)info.tokens, (unsigned long long)tokens);
  cr_assert_eq(info.quantized_tokens, quantized, "quantized %llu, expected %llu", (unsigned long long)info.quantized_tokens,
               (unsigned long long)quantized);
  cr_assert_eq(info.pages, pages, "pages %u, expected %u", info.pages, pages);
}

/* Every token, in pages or in the window, dequantizes to exactly what was appended. */
static void expect_exact_tokens(kvq_context *ctx, kvq_cache *cache, uint32_t seq, const float *k, const float *v,
                                uint32_t n, uint32_t hkv, uint32_t d) {
  float *ko = malloc(sizeof(float) * n * hkv * d), *vo = malloc(sizeof(float) * n * hkv * d);
  int64_t shape[3] = {n, hkv, d};
  kvq_tensor kt = kvq_tensor_host(ko, KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(vo, KVQ_DTYPE_F32, 3, shape);
  KVQ_CHECK(ctx, kvq_dequantize(cache, seq, 0, 0, n, &kt, &vt));
  cr_assert_eq(memcmp(ko, k, sizeof(float) * n * hkv * d), 0, "keys differ");
  cr_assert_eq(memcmp(vo, v, sizeof(float) * n * hkv * d), 0, "values differ");
  free(ko);
  free(vo);
}

Test(cache, window_flush_and_requantization) {
  const uint32_t hkv = 2, d = 64, P = 16, R = 32, total = 200;
  kvq_layer_config layer = th_layer(4, hkv, d, th_exact(KVQ_DTYPE_F32), th_exact(KVQ_DTYPE_F32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, R, 64, 2, 1);
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  float *k = malloc(sizeof(float) * total * hkv * d), *v = malloc(sizeof(float) * total * hkv * d);
  kvq_synth_config sc = kvq_synth_defaults(total, hkv, 4, d, 5);
  kvq_synth_generate(&sc, k, v, NULL);
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  th_append(ctx, cache, seq, 0, k, v, 0, 47, hkv, d, KVQ_DTYPE_F32);
  expect_info(ctx, cache, seq, 47, 0, 0); /* 47 < R + P: all in the window */
  th_append(ctx, cache, seq, 0, k, v, 47, 1, hkv, d, KVQ_DTYPE_F32);
  expect_info(ctx, cache, seq, 48, 16, 1); /* the window reached R + P: oldest page quantized */
  KVQ_CHECK(ctx, kvq_flush(cache, seq));
  expect_info(ctx, cache, seq, 48, 48, 3);
  th_append(ctx, cache, seq, 0, k, v, 48, 5, hkv, d, KVQ_DTYPE_F32);
  KVQ_CHECK(ctx, kvq_flush(cache, seq));
  expect_info(ctx, cache, seq, 53, 53, 4); /* partial page of 5 tokens */
  expect_exact_tokens(ctx, cache, seq, k, v, 53, hkv, d);
  th_append(ctx, cache, seq, 0, k, v, 53, 11, hkv, d, KVQ_DTYPE_F32);
  expect_info(ctx, cache, seq, 64, 53, 4); /* the partial page stays; new tokens in the window */
  expect_exact_tokens(ctx, cache, seq, k, v, 64, hkv, d);
  th_append(ctx, cache, seq, 0, k, v, 64, 32, hkv, d, KVQ_DTYPE_F32);
  expect_info(ctx, cache, seq, 96, 64, 4); /* page 3 re-quantized full */
  expect_exact_tokens(ctx, cache, seq, k, v, 96, hkv, d);
  th_append(ctx, cache, seq, 0, k, v, 96, 104, hkv, d, KVQ_DTYPE_F32); /* one big append across pages */
  expect_info(ctx, cache, seq, 200, 160, 10);
  expect_exact_tokens(ctx, cache, seq, k, v, 200, hkv, d);
  free(k);
  free(v);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/* Appending one token at a time, in chunks, or all at once gives the same pages: re-quantizing a
 * flushed partial page and quantizing from the ring or from staging must not change a byte. */
Test(cache, append_pattern_does_not_change_pages) {
  const uint32_t hkv = 2, d = 64, P = 16, total = 150;
  kvq_method_config qjl = kvq_method_defaults(KVQ_METHOD_QJL, d);
  kvq_method_config uni = kvq_method_defaults(KVQ_METHOD_UNIFORM, d);
  kvq_layer_config layer = th_layer(2, hkv, d, qjl, uni);
  float *k = malloc(sizeof(float) * total * hkv * d), *v = malloc(sizeof(float) * total * hkv * d);
  kvq_synth_config sc = kvq_synth_defaults(total, hkv, 2, d, 6);
  kvq_synth_generate(&sc, k, v, NULL);
  const uint32_t windows[2] = {0, 32};
  for (int w = 0; w < 2; w++) {
    kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F16, P, windows[w], 32, 3, 9);
    kvq_context *ctx = th_cpu_context();
    kvq_cache *cache;
    KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
    uint32_t a, b, c;
    KVQ_CHECK(ctx, kvq_sequence_add(cache, &a));
    KVQ_CHECK(ctx, kvq_sequence_add(cache, &b));
    KVQ_CHECK(ctx, kvq_sequence_add(cache, &c));
    th_append(ctx, cache, a, 0, k, v, 0, total, hkv, d, KVQ_DTYPE_F16);
    for (uint32_t t = 0; t < total; t++) {
      th_append(ctx, cache, b, 0, k, v, t, 1, hkv, d, KVQ_DTYPE_F16);
      if (t % 37 == 5) KVQ_CHECK(ctx, kvq_flush(cache, b));
    }
    for (uint32_t t = 0, step = 1; t < total; t += step, step = step * 3 % 41 + 1) {
      uint32_t n = total - t < step ? total - t : step;
      th_append(ctx, cache, c, 0, k, v, t, n, hkv, d, KVQ_DTYPE_F16);
      if (step % 2) KVQ_CHECK(ctx, kvq_flush(cache, c));
    }
    KVQ_CHECK(ctx, kvq_flush(cache, a));
    KVQ_CHECK(ctx, kvq_flush(cache, b));
    KVQ_CHECK(ctx, kvq_flush(cache, c));
    const size_t count = (size_t)total * hkv * d;
    float *out[3][2];
    uint32_t ids[3] = {a, b, c};
    for (int s = 0; s < 3; s++) {
      out[s][0] = malloc(sizeof(float) * count);
      out[s][1] = malloc(sizeof(float) * count);
      int64_t shape[3] = {total, hkv, d};
      kvq_tensor kt = kvq_tensor_host(out[s][0], KVQ_DTYPE_F32, 3, shape);
      kvq_tensor vt = kvq_tensor_host(out[s][1], KVQ_DTYPE_F32, 3, shape);
      KVQ_CHECK(ctx, kvq_dequantize(cache, ids[s], 0, 0, total, &kt, &vt));
    }
    for (int s = 1; s < 3; s++)
      for (int side = 0; side < 2; side++)
        cr_assert_eq(memcmp(out[0][side], out[s][side], sizeof(float) * count), 0,
                     "window %u: sequence %d side %d decodes differently", windows[w], s, side);
    for (int s = 0; s < 3; s++) {
      free(out[s][0]);
      free(out[s][1]);
    }
    kvq_cache_destroy(cache);
    kvq_context_destroy(ctx);
  }
  free(k);
  free(v);
}

/* Exact storage: attention must equal exact attention up to the rounding of fp32 logits and
 * probabilities. Derivation: the reference CPU path rounds each logit s to fp32 (relative 2^-24)
 * and each probability to fp32 (2^-24), accumulating in double. A logit error of |s| 2^-24 moves
 * each p by a factor exp(+-2 max|s| 2^-24), so |p^ - p| <= p (4 max|s| 2^-24 + 2^-24) and the
 * output error per channel is at most that times sum_t p_t |v_tc|, plus 2^-24 |o_c| for the final
 * fp32 rounding. */
static void check_exact_attention(uint32_t hq, uint32_t hkv, kvq_dtype input, uint32_t window) {
  const uint32_t d = 64, P = 16, n = 77, nq = 9;
  kvq_method_config m = th_exact(KVQ_DTYPE_F32);
  kvq_layer_config layer = th_layer(hq, hkv, d, m, m);
  kvq_cache_config config = th_config(&layer, 1, input, P, window, 16, 2, 1);
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  float *k = malloc(sizeof(float) * n * hkv * d), *v = malloc(sizeof(float) * n * hkv * d);
  float *q = malloc(sizeof(float) * n * hq * d);
  kvq_synth_config sc = kvq_synth_defaults(n, hkv, hq, d, 11);
  kvq_synth_generate(&sc, k, v, q);
  /* the exact reference sees the numbers the cache stores: inputs rounded to the input dtype */
  th_round_to_dtype(k, (size_t)n * hkv * d, input);
  th_round_to_dtype(v, (size_t)n * hkv * d, input);
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  th_append(ctx, cache, seq, 0, k, v, 0, 40, hkv, d, input);
  th_append(ctx, cache, seq, 0, k, v, 40, n - 40, hkv, d, input);
  const float *qlast = q + (size_t)(n - nq) * hq * d;
  float *out = malloc(sizeof(float) * nq * hq * d), *logits = malloc(sizeof(float) * nq * hq * n);
  double *ref = malloc(sizeof(double) * nq * hq * d), *probs = malloc(sizeof(double) * nq * hq * n);
  for (int causal = 0; causal < 2; causal++) {
    int64_t qshape[3] = {nq, hq, d}, sshape[3] = {nq, hq, n};
    kvq_attention_request req = {.sequence = seq, .mask = causal ? KVQ_MASK_CAUSAL : KVQ_MASK_NONE,
                                 .queries = kvq_tensor_host((void *)qlast, KVQ_DTYPE_F32, 3, qshape),
                                 .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape)};
    KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
    kvq_tensor st = kvq_tensor_host(logits, KVQ_DTYPE_F32, 3, sshape);
    KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &req.queries, req.mask, KVQ_SCORES_LOGITS, &st));
    th_exact_attention(qlast, k, v, nq, n, hq, hkv, d, causal, ref, probs);
    double max_logit = 0;
    for (size_t i = 0; i < (size_t)nq * hq * n; i++)
      if (isfinite(logits[i]) && fabs(logits[i]) > max_logit) max_logit = fabs(logits[i]);
    const double eps = 0x1p-24, rel = 4 * max_logit * eps + eps;
    for (uint32_t i = 0; i < nq; i++)
      for (uint32_t h = 0; h < hq; h++) {
        for (uint32_t t = 0; t < n; t++) {
          float s = logits[((size_t)i * hq + h) * n + t];
          int masked = causal && t > n - nq + i;
          cr_assert(masked ? s == -INFINITY : isfinite(s), "logit (%u,%u,%u) masking", i, h, t);
        }
        for (uint32_t c = 0; c < d; c++) {
          double weight = 0;
          for (uint32_t t = 0; t < n; t++)
            weight += probs[((size_t)i * hq + h) * n + t] * fabs(v[((size_t)t * hkv + h / (hq / hkv)) * d + c]);
          double expect = ref[((size_t)i * hq + h) * d + c];
          double tol = rel * weight + eps * fabs(expect);
          double got = out[((size_t)i * hq + h) * d + c];
          cr_assert(fabs(got - expect) <= tol, "hq=%u hkv=%u causal=%d (%u,%u,%u): %g vs %g, tol %g", hq, hkv, causal,
                    i, h, c, got, expect, tol);
        }
      }
  }
  free(out);
  free(logits);
  free(ref);
  free(probs);
  free(k);
  free(v);
  free(q);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

Test(cache, exact_attention_gqa_1) { check_exact_attention(4, 4, KVQ_DTYPE_F32, 0); }
Test(cache, exact_attention_gqa_4_window) { check_exact_attention(8, 2, KVQ_DTYPE_F32, 32); }
Test(cache, exact_attention_gqa_8_bf16) { check_exact_attention(8, 1, KVQ_DTYPE_BF16, 16); }

Test(cache, page_pool_reuse_and_capacity) {
  const uint32_t hkv = 1, d = 16, P = 16, n = 64;
  kvq_method_config m = th_exact(KVQ_DTYPE_F16);
  kvq_layer_config layers[2] = {th_layer(1, hkv, d, m, m), th_layer(2, hkv, d, m, m)};
  kvq_cache_config config = th_config(layers, 2, KVQ_DTYPE_F32, P, 0, 8, 2, 1);
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  float *k = malloc(sizeof(float) * n * hkv * d), *v = malloc(sizeof(float) * n * hkv * d);
  kvq_synth_config sc = kvq_synth_defaults(n, hkv, 1, d, 3);
  sc.outliers = 0;
  kvq_synth_generate(&sc, k, v, NULL);
  for (int round = 0; round < 50; round++) { /* stream far beyond capacity: nothing leaks */
    uint32_t a, b, c;
    KVQ_CHECK(ctx, kvq_sequence_add(cache, &a));
    KVQ_CHECK(ctx, kvq_sequence_add(cache, &b));
    cr_assert_eq(kvq_sequence_add(cache, &c), KVQ_ERROR_CAPACITY);
    th_append(ctx, cache, a, 0, k, v, 0, n, hkv, d, KVQ_DTYPE_F32); /* 4 pages */
    th_append(ctx, cache, a, 1, k, v, 0, 32, hkv, d, KVQ_DTYPE_F32); /* layer 1 shares them */
    th_append(ctx, cache, b, 1, k, v, 0, 48, hkv, d, KVQ_DTYPE_F32); /* 3 pages */
    kvq_memory_report r;
    KVQ_CHECK(ctx, kvq_cache_memory(cache, &r));
    cr_assert_eq(r.pages_used, 7);
    /* 2 more pages would exceed the pool of 8: refused, and nothing changes */
    void *ks, *vs;
    kvq_tensor kt = th_tensor_from_f32(k, KVQ_DTYPE_F32, 32, hkv, d, &ks);
    kvq_tensor vt = th_tensor_from_f32(v, KVQ_DTYPE_F32, 32, hkv, d, &vs);
    cr_assert_eq(kvq_append(cache, b, 0, &kt, &vt), KVQ_OK); /* layer 0 of b uses b's existing pages */
    cr_assert_eq(kvq_append(cache, b, 1, &kt, &vt), KVQ_ERROR_CAPACITY);
    cr_assert(strstr(kvq_context_last_error(ctx), "free") != NULL, "message: %s", kvq_context_last_error(ctx));
    kvq_sequence_info info;
    KVQ_CHECK(ctx, kvq_sequence_info_get(cache, b, 1, &info));
    cr_assert_eq(info.tokens, 48);
    free(ks);
    free(vs);
    KVQ_CHECK(ctx, kvq_sequence_free(cache, a));
    cr_assert_eq(kvq_sequence_free(cache, a), KVQ_ERROR_NOT_FOUND, "a freed id stays invalid");
    KVQ_CHECK(ctx, kvq_sequence_free(cache, b));
    KVQ_CHECK(ctx, kvq_cache_memory(cache, &r));
    cr_assert_eq(r.pages_used, 0);
    cr_assert_eq(r.sequences_used, 0);
  }
  free(k);
  free(v);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/* A prefill longer than the staging buffer (64 pages per job) quantizes in several jobs and gives
 * the same pages as appending token by token. */
Test(cache, long_prefill_spans_staging_chunks, .timeout = 120) {
  const uint32_t hkv = 1, d = 16, P = 16, n = 70 * 16 + 9;
  kvq_layer_config layer = th_layer(1, hkv, d, th_qjl(32, 2, 32), th_uniform(4, 16));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 16, 200, 2, 3);
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  float *k = malloc(sizeof(float) * n * hkv * d), *v = malloc(sizeof(float) * n * hkv * d);
  kvq_synth_config sc = kvq_synth_defaults(n, hkv, 1, d, 4);
  sc.outliers = 2;
  kvq_synth_generate(&sc, k, v, NULL);
  uint32_t a, b;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &a));
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &b));
  th_append(ctx, cache, a, 0, k, v, 0, n, hkv, d, KVQ_DTYPE_F32);
  for (uint32_t t = 0; t < n; t++) th_append(ctx, cache, b, 0, k, v, t, 1, hkv, d, KVQ_DTYPE_F32);
  float *x[2][2];
  for (int s = 0; s < 2; s++) {
    x[s][0] = malloc(sizeof(float) * n * hkv * d);
    x[s][1] = malloc(sizeof(float) * n * hkv * d);
    int64_t shape[3] = {n, hkv, d};
    kvq_tensor kt = kvq_tensor_host(x[s][0], KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(x[s][1], KVQ_DTYPE_F32, 3, shape);
    KVQ_CHECK(ctx, kvq_dequantize(cache, s ? b : a, 0, 0, n, &kt, &vt));
  }
  cr_assert_eq(memcmp(x[0][0], x[1][0], sizeof(float) * n * hkv * d), 0, "keys");
  cr_assert_eq(memcmp(x[0][1], x[1][1], sizeof(float) * n * hkv * d), 0, "values");
  kvq_sequence_info info;
  KVQ_CHECK(ctx, kvq_sequence_info_get(cache, a, 0, &info));
  /* pages are quantized while the window holds R + P = 32 tokens or more: 1104 quantized, 25 left */
  cr_assert_eq(info.quantized_tokens, 1104, "quantized %llu", (unsigned long long)info.quantized_tokens);
  for (int s = 0; s < 2; s++) free(x[s][0]), free(x[s][1]);
  free(k), free(v);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/* Results that do not fit the caller's fp16 output are an error, not Inf with KVQ_OK. */
Test(cache, fp16_outputs_that_would_overflow) {
  const uint32_t d = 16;
  kvq_layer_config layer = th_layer(1, 1, d, th_exact(KVQ_DTYPE_F32), th_exact(KVQ_DTYPE_F32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 0, 4, 1, 1);
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  float k[2 * 16] = {0}, v[2 * 16], q[16] = {0};
  for (int i = 0; i < 32; i++) v[i] = 1e5f; /* beyond fp16's 65504 */
  th_append(ctx, cache, seq, 0, k, v, 0, 2, 1, d, KVQ_DTYPE_F32);
  uint16_t out16[16];
  float out32[16];
  int64_t shape[3] = {1, 1, d};
  kvq_attention_request req = {seq, KVQ_MASK_CAUSAL, kvq_tensor_host(q, KVQ_DTYPE_F32, 3, shape),
                               kvq_tensor_host(out16, KVQ_DTYPE_F16, 3, shape)};
  memset(out16, 0x5a, sizeof out16);
  cr_assert_eq(kvq_attention(cache, 0, &req, 1), KVQ_ERROR_NON_FINITE);
  cr_assert_not_null(strstr(kvq_context_last_error(ctx), "fp16"), "%s", kvq_context_last_error(ctx));
  for (int i = 0; i < 16; i++) cr_assert_eq(out16[i], 0x5a5a, "output untouched");
  req.output = kvq_tensor_host(out32, KVQ_DTYPE_F32, 3, shape);
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
  cr_assert_eq(out32[0], 1e5f);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/* kvq_append reads a host tensor already packed in the input dtype in place (no host copy,
 * core/append.c), gathers a strided one row by row or element by element (core/tensor.c), and checks
 * an fp32 buffer in place only where it is aligned (core/token_check.c). Every layout of the same
 * numbers must store the same bytes, and a non-finite number must be refused, changing nothing, on
 * each path: these are four code paths to one result. */
static kvq_tensor layout_of(int which, const float *src, void **storage, uint32_t n, uint32_t hkv, uint32_t d) {
  const int64_t shape[3] = {n, hkv, d};
  const size_t count = (size_t)n * hkv * d;
  if (which == 0) { /* packed: read in place */
    *storage = NULL;
    return kvq_tensor_host((void *)src, KVQ_DTYPE_F32, 3, shape);
  }
  if (which == 3) { /* packed but 2 bytes off alignment: read in place, checked through a copy */
    uint8_t *bytes = malloc(sizeof(float) * count + 2);
    memcpy(bytes + 2, src, sizeof(float) * count);
    *storage = bytes;
    return kvq_tensor_host(bytes + 2, KVQ_DTYPE_F32, 3, shape);
  }
  /* 1: rows of d with 8 floats between them (a slice of a wider tensor); 2: every other float */
  const int64_t row = which == 1 ? d + 8 : 2 * (int64_t)d, step = which == 1 ? 1 : 2;
  float *wide = calloc((size_t)n * hkv * (size_t)row, sizeof(float));
  for (size_t t = 0; t < (size_t)n * hkv; t++)
    for (uint32_t c = 0; c < d; c++) wide[t * (size_t)row + c * (size_t)step] = src[t * d + c];
  *storage = wide;
  kvq_tensor tensor = kvq_tensor_host(wide, KVQ_DTYPE_F32, 3, shape);
  tensor.strides[0] = hkv * row, tensor.strides[1] = row, tensor.strides[2] = step;
  return tensor;
}

Test(cache, host_input_layouts_append_the_same_bytes) {
  const uint32_t hkv = 2, d = 64, P = 16, n = 70, hq = 4;
  const kvq_method_config uni = kvq_method_defaults(KVQ_METHOD_UNIFORM, d);
  const kvq_layer_config layer = th_layer(hq, hkv, d, uni, uni);
  const size_t count = (size_t)n * hkv * d;
  float *k = malloc(sizeof(float) * count), *v = malloc(sizeof(float) * count);
  kvq_synth_config sc = kvq_synth_defaults(n, hkv, hq, d, 17);
  kvq_synth_generate(&sc, k, v, NULL);
  float *out[4][2];
  for (int which = 0; which < 4; which++) {
    const kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 16, 16, 1, 3);
    kvq_context *ctx = th_cpu_context();
    kvq_cache *cache;
    KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
    uint32_t seq;
    KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
    /* the values with a NaN in their last number, in the same layout: refused, nothing appended */
    v[count - 1] = NAN;
    void *ks, *vs;
    kvq_tensor kt = layout_of(which, k, &ks, n, hkv, d), vt = layout_of(which, v, &vs, n, hkv, d);
    kvq_status st = kvq_append(cache, seq, 0, &kt, &vt);
    cr_assert_eq(st, KVQ_ERROR_NON_FINITE, "layout %d: a NaN value gave %s", which, kvq_status_string(st));
    kvq_sequence_info info;
    KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seq, 0, &info));
    cr_assert_eq(info.tokens, 0, "layout %d: a refused append left %llu tokens", which, (unsigned long long)info.tokens);
    free(vs);
    v[count - 1] = v[count - 2];
    vt = layout_of(which, v, &vs, n, hkv, d);
    KVQ_CHECK(ctx, kvq_append(cache, seq, 0, &kt, &vt));
    KVQ_CHECK(ctx, kvq_flush(cache, seq));
    const int64_t shape[3] = {n, hkv, d};
    out[which][0] = malloc(sizeof(float) * count), out[which][1] = malloc(sizeof(float) * count);
    kvq_tensor ko = kvq_tensor_host(out[which][0], KVQ_DTYPE_F32, 3, shape);
    kvq_tensor vo = kvq_tensor_host(out[which][1], KVQ_DTYPE_F32, 3, shape);
    KVQ_CHECK(ctx, kvq_dequantize(cache, seq, 0, 0, n, &ko, &vo));
    if (which > 0) {
      cr_assert_eq(memcmp(out[which][0], out[0][0], sizeof(float) * count), 0, "layout %d: keys differ from the packed input's", which);
      cr_assert_eq(memcmp(out[which][1], out[0][1], sizeof(float) * count), 0, "layout %d: values differ from the packed input's", which);
    }
    free(ks), free(vs);
    kvq_cache_destroy(cache);
    kvq_context_destroy(ctx);
  }
  for (int which = 0; which < 4; which++) free(out[which][0]), free(out[which][1]);
  free(k), free(v);
}
