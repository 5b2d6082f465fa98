/*
 * kvq-bench: speed of appending (quantizing) and of decode attention over compressed caches, with
 * the bytes each step actually moves and the host's copy bandwidth measured in the same run.
 * docs/BENCH.md explains the columns and lists measured figures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvq/kvq.h"
#include "method_spec.h"

typedef struct options {
  uint32_t tokens, batch, heads, kv_heads, head_dim, page_size, iterations;
  kvq_backend_kind backend;
  const char *methods;
  int json;
} options;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Host copy bandwidth: bytes read plus bytes written per second by memcpy over 256 MiB. */
static double copy_bandwidth(void) {
  const size_t size = (size_t)256 << 20;
  char *a = malloc(size), *b = malloc(size);
  if (!a || !b) {
    free(a), free(b);
    return 0;
  }
  memset(a, 1, size);
  memset(b, 2, size);
  double best = 1e30;
  for (int i = 0; i < 5; i++) {
    double t0 = now();
    memcpy(i % 2 ? a : b, i % 2 ? b : a, size);
    double t = now() - t0;
    best = t < best ? t : best;
  }
  free(a), free(b);
  return 2.0 * size / best;
}

static int bench_one(kvq_context *ctx, const options *o, const char *spec, const float *k, const float *v,
                     const float *q, double copy_bw, int first) {
  kvq_layer_config layer = {.query_heads = o->heads, .kv_heads = o->kv_heads, .head_dim = o->head_dim};
  if (kvq_parse_layer_spec(spec, strlen(spec), o->head_dim, &layer.keys, &layer.values) != 0) {
    fprintf(stderr, "kvq-bench: cannot read method '%s' (the names of kvq eval)\n", spec);
    return 2;
  }
  const uint32_t pages_per_seq = (o->tokens + o->page_size - 1) / o->page_size;
  kvq_cache_config config = {.layer_count = 1, .layers = &layer, .input_dtype = KVQ_DTYPE_F32,
                             .page_size = o->page_size, .residual_window = 0,
                             .max_pages = pages_per_seq * o->batch, .max_sequences = o->batch, .seed = 1};
  kvq_cache *cache;
  int64_t kv_shape[3] = {o->tokens, o->kv_heads, o->head_dim};
  kvq_tensor kt = kvq_tensor_host((void *)k, KVQ_DTYPE_F32, 3, kv_shape), vt = kvq_tensor_host((void *)v, KVQ_DTYPE_F32, 3, kv_shape);
  /* learned codebooks (CQ, online PolarQuant) from the first tokens: speed does not depend on their
   * quality, and 256 calibration tokens keep the learning short */
  int64_t cal_shape[3] = {o->tokens < 256 ? o->tokens : 256, o->kv_heads, o->head_dim};
  kvq_tensor kc = kvq_tensor_host((void *)k, KVQ_DTYPE_F32, 3, cal_shape), vc = kvq_tensor_host((void *)v, KVQ_DTYPE_F32, 3, cal_shape);
  const int learns = kvq_method_learns(&layer.keys) || kvq_method_learns(&layer.values);
  if (kvq_cache_create(ctx, &config, &cache) != KVQ_OK ||
      (learns && kvq_codebooks_learn(cache, 0, &kc, &vc, NULL) != KVQ_OK)) {
    fprintf(stderr, "kvq-bench: %s: %s\n", spec, kvq_context_last_error(ctx));
    kvq_cache_destroy(cache);
    return 2;
  }
  uint32_t *seqs = malloc(sizeof(uint32_t) * o->batch);
  float *out = malloc(sizeof(float) * o->batch * o->heads * o->head_dim);
  kvq_attention_request *req = malloc(sizeof *req * o->batch);
  int rc = 2;
  if (!seqs || !out || !req) {
    fprintf(stderr, "kvq-bench: out of memory\n");
    goto done;
  }
  double t0 = now();
  for (uint32_t s = 0; s < o->batch; s++)
    if (kvq_sequence_add(cache, &seqs[s]) != KVQ_OK || kvq_append(cache, seqs[s], 0, &kt, &vt) != KVQ_OK ||
        kvq_flush(cache, seqs[s]) != KVQ_OK) {
      fprintf(stderr, "kvq-bench: %s: %s\n", spec, kvq_context_last_error(ctx));
      goto done;
    }
  const double append_s = now() - t0;
  /* decode: one query position per sequence, the whole batch in one call */
  int64_t q_shape[3] = {1, o->heads, o->head_dim};
  for (uint32_t s = 0; s < o->batch; s++)
    req[s] = (kvq_attention_request){seqs[s], KVQ_MASK_CAUSAL, kvq_tensor_host((void *)q, KVQ_DTYPE_F32, 3, q_shape),
                                     kvq_tensor_host(out + (size_t)s * o->heads * o->head_dim, KVQ_DTYPE_F32, 3, q_shape)};
  double best = 1e30, best_device = -1.0; /* device time: GPU timestamps, where the backend has them */
  uint64_t device_ns = 0;
  for (uint32_t i = 0; i <= o->iterations; i++) { /* the first call warms up and is not timed */
    const int clock = kvq_context_device_time(ctx, &device_ns) == KVQ_OK; /* starts the count afresh */
    t0 = now();
    if (kvq_attention(cache, 0, req, o->batch) != KVQ_OK) {
      fprintf(stderr, "kvq-bench: %s: %s\n", spec, kvq_context_last_error(ctx));
      goto done;
    }
    double t = now() - t0;
    if (i > 0) best = t < best ? t : best;
    if (i > 0 && clock && kvq_context_device_time(ctx, &device_ns) == KVQ_OK &&
        (best_device < 0 || device_ns * 1e-9 < best_device))
      best_device = device_ns * 1e-9;
  }
  kvq_memory_report mem;
  kvq_cache_memory(cache, &mem);
  const double moved = (double)mem.pages_bytes_used + mem.window_bytes_used; /* compressed K and V read once */
  const double input_bytes = (double)o->batch * o->tokens * o->kv_heads * o->head_dim * 4 * 2;
  const double tokens = (double)o->batch * o->tokens;
  if (o->json)
    printf("%s    {\"method\": \"%s\", \"bits\": %.4f, \"append_tokens_per_s\": %.1f, \"append_input_gb_per_s\": %.4f, "
           "\"decode_ms\": %.4f, \"decode_device_ms\": %.4f, \"decode_bytes\": %.0f, \"decode_gb_per_s\": %.4f, "
           "\"fraction_of_copy\": %.5f}",
           first ? "" : ",\n", spec, mem.bits_per_number, tokens / append_s, input_bytes / append_s / 1e9,
           best * 1e3, best_device < 0 ? -1.0 : best_device * 1e3, moved, moved / best / 1e9, moved / best / copy_bw);
  else
    printf("%-26s %6.3f %12.0f %10.3f %11.3f %11.3f %12.0f %9.3f %9.4f\n", spec, mem.bits_per_number, tokens / append_s,
           input_bytes / append_s / 1e9, best * 1e3, best_device < 0 ? -1.0 : best_device * 1e3, moved, moved / best / 1e9,
           moved / best / copy_bw);
  rc = 0;
done:
  free(out), free(req), free(seqs);
  kvq_cache_destroy(cache);
  return rc;
}

int main(int argc, char **argv) {
  options o = {.tokens = 4096, .batch = 4, .heads = 32, .kv_heads = 8, .head_dim = 128, .page_size = 32,
               .iterations = 3, .backend = KVQ_BACKEND_CPU,
               .methods = "exact-f16/exact-f16,qjl-m256-k8/uniform-b2,qjl-m256-k0/uniform-b2,uniform-b4/uniform-b4,"
                          "kivi-b2/uniform-b2,polar-b4222,cq-c4-b8"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint32_t *n = !strcmp(a, "--tokens") ? &o.tokens : !strcmp(a, "--batch") ? &o.batch : !strcmp(a, "--heads") ? &o.heads
                  : !strcmp(a, "--kv-heads") ? &o.kv_heads : !strcmp(a, "--head-dim") ? &o.head_dim
                  : !strcmp(a, "--iterations") ? &o.iterations : !strcmp(a, "--page-size") ? &o.page_size : NULL;
    if (!strcmp(a, "--json")) o.json = 1;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf("usage: kvq-bench [--backend cpu|vulkan|cuda] [--tokens N] [--batch B] [--heads H] [--kv-heads H]\n"
             "                 [--head-dim D] [--page-size P] [--iterations I] [--methods K/V,...] [--json]\n");
      return 0;
    } else if (n && v) {
      char *end;
      unsigned long value = strtoul(v, &end, 10);
      if (!*v || *end || value == 0 || value > 0x7fffffffUL) {
        fprintf(stderr, "kvq-bench: %s %s: a positive number\n", a, v);
        return 2;
      }
      *n = (uint32_t)value;
      i++;
    } else if (!strcmp(a, "--methods") && v) {
      o.methods = v;
      i++;
    } else if (!strcmp(a, "--backend") && v) {
      if (!strcmp(v, "cpu")) o.backend = KVQ_BACKEND_CPU;
      else if (!strcmp(v, "vulkan")) o.backend = KVQ_BACKEND_VULKAN;
      else if (!strcmp(v, "cuda")) o.backend = KVQ_BACKEND_CUDA;
      else if (!strcmp(v, "auto")) o.backend = KVQ_BACKEND_AUTO;
      else {
        fprintf(stderr, "kvq-bench: unknown backend '%s' (cpu, vulkan, cuda, auto)\n", v);
        return 2;
      }
      i++;
    } else {
      fprintf(stderr, "kvq-bench: unknown option '%s' (see --help)\n", a);
      return 2;
    }
  }
  if (!o.tokens || !o.batch || !o.heads || !o.kv_heads || o.heads % o.kv_heads || !o.iterations) {
    fprintf(stderr, "kvq-bench: sizes must be positive and --heads a multiple of --kv-heads\n");
    return 2;
  }
  kvq_context_options copt = kvq_context_options_default();
  copt.backend = o.backend;
  kvq_context *ctx;
  if (kvq_context_create(&copt, &ctx) != KVQ_OK) {
    fprintf(stderr, "kvq-bench: backend unavailable (kvq info says why)\n");
    return 2;
  }
  const size_t kv = (size_t)o.tokens * o.kv_heads * o.head_dim;
  float *k = malloc(sizeof(float) * kv), *v = malloc(sizeof(float) * kv), *q = malloc(sizeof(float) * o.tokens * o.heads * o.head_dim);
  kvq_synth_config sc = kvq_synth_defaults(o.tokens, o.kv_heads, o.heads, o.head_dim, 1);
  if (!k || !v || !q || kvq_synth_generate(&sc, k, v, q) != 0) {
    fprintf(stderr, "kvq-bench: out of memory\n");
    return 2;
  }
  const double copy_bw = copy_bandwidth();
  const float *last_q = q + (size_t)(o.tokens - 1) * o.heads * o.head_dim;
  if (o.json)
    printf("{\"backend\": \"%s\", \"tokens\": %u, \"batch\": %u, \"heads\": %u, \"kv_heads\": %u, \"head_dim\": %u, "
           "\"copy_gb_per_s\": %.3f, \"methods\": [\n",
           kvq_context_backend(ctx) == KVQ_BACKEND_CPU ? "cpu" : "gpu", o.tokens, o.batch, o.heads, o.kv_heads, o.head_dim,
           copy_bw / 1e9);
  else
    printf("kvq-bench: backend %s, %u sequences x %u tokens, %u query heads, %u kv heads, head_dim %u\n"
           "host copy bandwidth (read + write): %.2f GB/s\n\n"
           "%-26s %6s %12s %10s %11s %11s %12s %9s %9s\n",
           kvq_context_backend(ctx) == KVQ_BACKEND_CPU ? "cpu (scalar reference)" : "gpu", o.batch, o.tokens, o.heads,
           o.kv_heads, o.head_dim, copy_bw / 1e9, "keys/values", "bits", "append tok/s", "append GB/s", "decode ms",
           "device ms", "decode bytes", "GB/s", "of copy");
  int rc = 0;
  char *list = strdup(o.methods);
  int first = 1;
  for (char *spec = strtok(list, ","); spec && rc == 0; spec = strtok(NULL, ","), first = 0)
    rc = bench_one(ctx, &o, spec, k, v, last_q, copy_bw, first);
  if (o.json) printf("\n]}\n");
  free(list), free(k), free(v), free(q);
  kvq_context_destroy(ctx);
  return rc;
}
