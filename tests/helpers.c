#include "helpers.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/halfconv.h"

#if defined(__SANITIZE_ADDRESS__)
#define TH_LEAK_CHECKS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TH_LEAK_CHECKS 1
#endif
#endif
#ifdef TH_LEAK_CHECKS
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#endif

/* LeakSanitizer's report goes to a file for the length of the check and into the failure message,
 * because Criterion does not show what a worker writes to stderr next to a TAP result. */
void th_leak_check(void) {
#ifdef TH_LEAK_CHECKS
  char *dir = th_temp_dir("lsan"), prefix[256], report[8192] = "";
  snprintf(prefix, sizeof prefix, "%s/report", dir);
  __sanitizer_set_report_path(prefix); /* LeakSanitizer writes <prefix>.<pid> */
  const int leaked = __lsan_do_recoverable_leak_check();
  __sanitizer_set_report_path("stderr");
  if (leaked) {
    char path[300];
    snprintf(path, sizeof path, "%s.%d", prefix, (int)getpid());
    FILE *f = fopen(path, "r");
    if (f) {
      report[fread(report, 1, sizeof report - 1, f)] = 0;
      fclose(f);
    }
  }
  th_remove_dir(dir);
  free(dir);
  cr_assert_eq(leaked, 0, "LeakSanitizer: memory is unreachable at the end of this test:\n%s", report);
#endif
}

kvq_cache_config th_config(const kvq_layer_config *layers, uint32_t count, kvq_dtype input, uint32_t page_size,
                           uint32_t window, uint32_t max_pages, uint32_t max_sequences, uint64_t seed) {
  return (kvq_cache_config){.layer_count = count, .layers = layers, .input_dtype = input, .page_size = page_size,
                            .residual_window = window, .max_pages = max_pages, .max_sequences = max_sequences,
                            .seed = seed};
}

kvq_context *th_cpu_context(void) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_CPU;
  kvq_context *ctx = NULL;
  cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_OK);
  return ctx;
}

kvq_tensor th_tensor_from_f32(const float *data, kvq_dtype dtype, int64_t d0, int64_t d1, int64_t d2, void **storage) {
  size_t n = (size_t)(d0 * d1 * d2);
  size_t size = dtype == KVQ_DTYPE_F32 ? 4 : 2;
  uint8_t *p = malloc(n * size);
  cr_assert_not_null(p);
  for (size_t i = 0; i < n; i++) {
    if (dtype == KVQ_DTYPE_F32) {
      memcpy(p + 4 * i, &data[i], 4);
    } else {
      uint16_t h = (uint16_t)(dtype == KVQ_DTYPE_F16 ? kvq_f32_to_f16_bits(data[i]) : kvq_f32_to_bf16_bits(data[i]));
      memcpy(p + 2 * i, &h, 2);
    }
  }
  *storage = p;
  int64_t shape[3] = {d0, d1, d2};
  return kvq_tensor_host(p, dtype, 3, shape);
}

void th_exact_attention(const float *q, const float *k, const float *v, uint32_t nq, uint32_t n, uint32_t hq,
                        uint32_t hkv, uint32_t d, int causal, double *out, double *probs) {
  double *logit = malloc(sizeof(double) * n);
  const uint32_t group = hq / hkv;
  for (uint32_t i = 0; i < nq; i++)
    for (uint32_t h = 0; h < hq; h++) {
      const float *qi = q + ((size_t)i * hq + h) * d;
      uint32_t visible = causal ? n - nq + i + 1 : n;
      double max = -INFINITY;
      for (uint32_t t = 0; t < visible; t++) {
        const float *kt = k + ((size_t)t * hkv + h / group) * d;
        double dot = 0;
        for (uint32_t c = 0; c < d; c++) dot += (double)qi[c] * kt[c];
        logit[t] = dot / sqrt((double)d);
        if (logit[t] > max) max = logit[t];
      }
      double sum = 0;
      for (uint32_t t = 0; t < visible; t++) sum += exp(logit[t] - max);
      double *o = out + ((size_t)i * hq + h) * d;
      for (uint32_t c = 0; c < d; c++) o[c] = 0;
      for (uint32_t t = 0; t < n; t++) {
        double p = t < visible ? exp(logit[t] - max) / sum : 0.0;
        if (probs) probs[((size_t)i * hq + h) * n + t] = p;
        if (t >= visible) continue;
        const float *vt = v + ((size_t)t * hkv + h / group) * d;
        for (uint32_t c = 0; c < d; c++) o[c] += p * vt[c];
      }
    }
  free(logit);
}

void th_append(kvq_context *ctx, kvq_cache *cache, uint32_t seq, uint32_t layer, const float *k, const float *v,
               uint32_t first, uint32_t count, uint32_t hkv, uint32_t d, kvq_dtype dtype) {
  void *ks, *vs;
  kvq_tensor kt = th_tensor_from_f32(k + (size_t)first * hkv * d, dtype, count, hkv, d, &ks);
  kvq_tensor vt = th_tensor_from_f32(v + (size_t)first * hkv * d, dtype, count, hkv, d, &vs);
  KVQ_CHECK(ctx, kvq_append(cache, seq, layer, &kt, &vt));
  free(ks);
  free(vs);
}

void th_round_to_dtype(float *x, size_t n, kvq_dtype dtype) {
  for (size_t i = 0; i < n; i++) {
    if (dtype == KVQ_DTYPE_F16) x[i] = kvq_round_f16(x[i]);
    else if (dtype == KVQ_DTYPE_BF16) x[i] = kvq_bf16_bits_to_f32(kvq_f32_to_bf16_bits(x[i]));
  }
}

char *th_temp_dir(const char *what) {
  char *dir = malloc(strlen(what) + 32);
  cr_assert_not_null(dir);
  sprintf(dir, "/tmp/kvq-%s-XXXXXX", what);
  cr_assert_not_null(mkdtemp(dir), "mkdtemp(%s)", dir);
  return dir;
}

void th_assert_png(const char *path) {
  unsigned char head[8] = {0};
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s was not written", path);
  size_t got = fread(head, 1, sizeof head, f);
  fclose(f);
  cr_assert_eq(got, sizeof head, "%s is shorter than a PNG signature", path);
  cr_assert_eq(memcmp(head, "\x89PNG\r\n\x1a\n", sizeof head), 0, "%s is not a PNG", path);
}
