/*
 * The CUDA backend through the public API, on its emulated build (KVQ_CUDA_EMULATOR=1: the backend's
 * host code and kernels on the CPU, docs/CUDA.md), against the CPU reference: for every method, the
 * same tokens appended to a cache on each backend must give byte-identical pages (the saved cache
 * files are compared whole) and dequantize to the same values; caller CUDA device pointers as keys,
 * values and outputs; wrong memory kinds and buffers of other backends refused; attention and scores
 * with caller device pointers in place. Skipped, with the reason, where this kvq has no CUDA emulator.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cuda/cuda_create.h"
#include "core/internal.h"
#include "helpers.h"

enum { HKV = 2, HQ = 4, D = 64, P = 16, TOKENS = 40, FIRST_APPEND = 23, CALIBRATION = 256 };

/* Skips the calling test (visibly, with the reason) where the emulated backend is not built, and
 * otherwise asks the registry for it. */
static void require_emulator(void) {
#ifndef KVQ_HAVE_CUDA_EMULATOR
  cr_skip_test("this kvq has no CUDA emulator (-Demulated_cuda; it needs a C++17 compiler and the CUDA headers)");
#endif
  cr_assert_eq(setenv("KVQ_CUDA_EMULATOR", "1", 1), 0);
}

static kvq_context *context_of(kvq_backend_kind kind) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = kind;
  kvq_context *ctx = NULL;
  const kvq_status st = kvq_context_create(&opt, &ctx);
  cr_assert_eq(st, KVQ_OK, "kvq_context_create(%d) -> %s", (int)kind, kvq_status_string(st));
  return ctx;
}

static kvq_context *cuda_context(void) {
  require_emulator();
  kvq_context *ctx = context_of(KVQ_BACKEND_CUDA);
  cr_assert_str_eq(ctx->backend->device, "kvq CUDA emulator on the CPU (tests only, not a GPU)");
  return ctx;
}

/* A deterministic input with a few large channels (QJL's outliers) and varied scales. */
static float value_at(uint32_t i, uint32_t salt) {
  uint32_t u = (i + 1u) * 2654435761u ^ (salt * 40503u);
  u ^= u >> 15;
  u *= 2246822519u;
  u ^= u >> 13;
  float v = ((float)(u & 0xffffu) / 65535.0f - 0.5f) * 4.0f;
  if (i % D == 5u || i % D == 41u) v *= 6.0f;
  return v;
}

static kvq_method_config qjl(uint32_t m, uint32_t k, uint32_t mo) {
  return (kvq_method_config){.method = KVQ_METHOD_QJL, .qjl = {.sketch_dim = m, .outlier_count = k, .outlier_sketch_dim = mo}};
}
static kvq_method_config uniform(uint32_t bits, uint32_t group) {
  return (kvq_method_config){.method = KVQ_METHOD_UNIFORM, .uniform = {.bits = bits, .group_size = group}};
}
static kvq_method_config kivi(uint32_t bits, uint32_t group_tokens) {
  return (kvq_method_config){.method = KVQ_METHOD_KIVI, .kivi = {.bits = bits, .group_tokens = group_tokens}};
}
static kvq_method_config exact(kvq_dtype dtype) { return (kvq_method_config){.method = KVQ_METHOD_EXACT, .exact = {.dtype = dtype}}; }
static kvq_method_config polar(kvq_rotation rotation, kvq_codebook_source codebook) {
  kvq_method_config m = {.method = KVQ_METHOD_POLAR, .polar = {.levels = 4, .rotation = rotation, .codebook = codebook}};
  const uint32_t bits[] = {4, 2, 2, 2};
  for (uint32_t l = 0; l < 4; l++) m.polar.bits[l] = bits[l];
  return m;
}
static kvq_method_config cq(uint32_t channels, uint32_t bits) {
  return (kvq_method_config){.method = KVQ_METHOD_CQ, .cq = {.channels = channels, .bits = bits, .iterations = 8}};
}

typedef struct spec {
  const char *name;
  kvq_dtype input;
  kvq_method_config keys, values;
} spec;

/* Every method, both sides, every input dtype. */
static const spec *specs(size_t *count) {
  static spec s[8];
  const spec all[] = {
      {"QJL m=64 k=4 m_o=32 / UNIFORM 3 bits G=16, fp32", KVQ_DTYPE_F32, qjl(64, 4, 32), uniform(3, 16)},
      {"QJL m=32 k=0 / UNIFORM 4 bits G=32, bf16", KVQ_DTYPE_BF16, qjl(32, 0, 32), uniform(4, 32)},
      {"KIVI 2 bits Gt=8 / EXACT fp16, fp16", KVQ_DTYPE_F16, kivi(2, 8), exact(KVQ_DTYPE_F16)},
      {"KIVI 3 bits whole page / EXACT bf16, fp32", KVQ_DTYPE_F32, kivi(3, 0), exact(KVQ_DTYPE_BF16)},
      {"PolarQuant dense / Hadamard offline, fp32", KVQ_DTYPE_F32, polar(KVQ_ROTATION_DENSE, KVQ_CODEBOOK_OFFLINE),
       polar(KVQ_ROTATION_HADAMARD, KVQ_CODEBOOK_OFFLINE)},
      {"PolarQuant Hadamard learned / CQ c=4 b=6 learned, fp16", KVQ_DTYPE_F16,
       polar(KVQ_ROTATION_HADAMARD, KVQ_CODEBOOK_ONLINE), cq(4, 6)},
      {"CQ c=2 b=8 learned / EXACT fp32, bf16", KVQ_DTYPE_BF16, cq(2, 8), exact(KVQ_DTYPE_F32)},
  };
  memcpy(s, all, sizeof all);
  *count = sizeof all / sizeof all[0];
  return s;
}

/* QJL's reconstruction and dense PolarQuant's rotation back sum in kvq_acc, float in CUDA code and
 * double on the CPU (core/shared_lang.h); every other decode is the CPU's floats bit for bit. */
static int bounded(const kvq_method_config *m) {
  return m->method == KVQ_METHOD_QJL || (m->method == KVQ_METHOD_POLAR && m->polar.rotation == KVQ_ROTATION_DENSE);
}

typedef struct pair {
  kvq_context *ctx[2]; /* CPU, CUDA */
  kvq_cache *cache[2];
  uint32_t seq[2];
  kvq_layer_config layer;
} pair;

/* The same config on the CPU and on CUDA; learned codebooks are learned on the CPU and loaded into
 * both (CUDA's k-means kernels do not exist yet, and the pages are then comparable). */
static void pair_open(pair *p, const spec *sp, uint64_t seed, kvq_policy_kind policy) {
  p->ctx[0] = context_of(KVQ_BACKEND_CPU);
  p->ctx[1] = cuda_context();
  p->layer = th_layer(HQ, HKV, D, sp->keys, sp->values);
  kvq_cache_config config = th_config(&p->layer, 1, sp->input, P, 0, 8, 1, seed);
  config.policy = kvq_policy_defaults(policy);
  for (int b = 0; b < 2; b++) KVQ_CHECK(p->ctx[b], kvq_cache_create(p->ctx[b], &config, &p->cache[b]));
  if (p->cache[0]->storage[0].learned[0] + p->cache[0]->storage[0].learned[1] < 2) {
    float *calibration = malloc(sizeof(float) * CALIBRATION * HKV * D * 2);
    cr_assert_not_null(calibration);
    for (size_t i = 0; i < (size_t)CALIBRATION * HKV * D * 2; i++) calibration[i] = value_at((uint32_t)i, (uint32_t)seed + 7u);
    const int64_t shape[3] = {CALIBRATION, HKV, D};
    kvq_tensor ck = kvq_tensor_host(calibration, KVQ_DTYPE_F32, 3, shape);
    kvq_tensor cv = kvq_tensor_host(calibration + (size_t)CALIBRATION * HKV * D, KVQ_DTYPE_F32, 3, shape);
    KVQ_CHECK(p->ctx[0], kvq_codebooks_learn(p->cache[0], 0, &ck, &cv, NULL));
    free(calibration);
    uint64_t bytes = 0;
    size_t written = 0;
    KVQ_CHECK(p->ctx[0], kvq_codebooks_save_size(p->cache[0], &bytes));
    void *books = malloc((size_t)bytes);
    cr_assert_not_null(books);
    KVQ_CHECK(p->ctx[0], kvq_codebooks_save_to_memory(p->cache[0], books, (size_t)bytes, &written));
    KVQ_CHECK(p->ctx[1], kvq_codebooks_load_from_memory(p->cache[1], books, written));
    free(books);
  }
  for (int b = 0; b < 2; b++) KVQ_CHECK(p->ctx[b], kvq_sequence_add(p->cache[b], &p->seq[b]));
}

static void pair_close(pair *p) {
  for (int b = 0; b < 2; b++) {
    kvq_cache_destroy(p->cache[b]);
    kvq_context_destroy(p->ctx[b]);
  }
}

/* The tokens of one side in the input dtype: [TOKENS][HKV][D]. */
static void *tokens_of(kvq_dtype dtype, uint32_t salt) {
  float *f = malloc(sizeof(float) * TOKENS * HKV * D);
  cr_assert_not_null(f);
  for (uint32_t i = 0; i < TOKENS * HKV * D; i++) f[i] = value_at(i, salt);
  void *storage = NULL;
  th_tensor_from_f32(f, dtype, TOKENS, HKV, D, &storage);
  free(f);
  return storage;
}

static kvq_tensor rows(void *data, kvq_memory memory, kvq_dtype dtype, uint32_t first, uint32_t count) {
  const size_t esize = dtype == KVQ_DTYPE_F32 ? 4 : 2;
  const int64_t shape[3] = {count, HKV, D};
  void *at = (uint8_t *)data + (size_t)first * HKV * D * esize;
  return memory == KVQ_MEMORY_CUDA_DEVICE ? kvq_tensor_cuda(at, dtype, 3, shape) : kvq_tensor_host(at, dtype, 3, shape);
}

/* Appends every token in two calls (a partial page stays open after the first), then flushes; on
 * CUDA from `memory` (host, or emulated device memory: the emulated device's memory is the heap). */
static void append_all(pair *p, kvq_dtype dtype, const void *k, const void *v, kvq_memory cuda_memory) {
  for (int b = 0; b < 2; b++) {
    const kvq_memory memory = b == 1 ? cuda_memory : KVQ_MEMORY_HOST;
    kvq_tensor k1 = rows((void *)k, memory, dtype, 0, FIRST_APPEND), v1 = rows((void *)v, memory, dtype, 0, FIRST_APPEND);
    kvq_tensor k2 = rows((void *)k, memory, dtype, FIRST_APPEND, TOKENS - FIRST_APPEND);
    kvq_tensor v2 = rows((void *)v, memory, dtype, FIRST_APPEND, TOKENS - FIRST_APPEND);
    KVQ_CHECK(p->ctx[b], kvq_append(p->cache[b], p->seq[b], 0, &k1, &v1));
    KVQ_CHECK(p->ctx[b], kvq_append(p->cache[b], p->seq[b], 0, &k2, &v2));
    KVQ_CHECK(p->ctx[b], kvq_flush(p->cache[b], p->seq[b]));
  }
}

/* kvq's promise: the same pages on every backend. The saved files hold the config, fixed arrays,
 * page tables and every page: they must be the same bytes. */
static void check_saved_files(pair *p, const char *name) {
  uint64_t size[2];
  void *image[2];
  for (int b = 0; b < 2; b++) {
    KVQ_CHECK(p->ctx[b], kvq_cache_save_size(p->cache[b], &size[b]));
    image[b] = malloc((size_t)size[b]);
    cr_assert_not_null(image[b]);
    size_t written = 0;
    KVQ_CHECK(p->ctx[b], kvq_cache_save_to_memory(p->cache[b], image[b], (size_t)size[b], &written));
    cr_assert_eq(written, size[b]);
  }
  cr_assert_eq(size[0], size[1], "%s: saved files of %llu and %llu bytes", name, (unsigned long long)size[0],
               (unsigned long long)size[1]);
  size_t at = 0;
  while (at < size[0] && ((uint8_t *)image[0])[at] == ((uint8_t *)image[1])[at]) at++;
  cr_assert_eq(at, (size_t)size[0], "%s: the saved files differ first at byte %zu of %llu", name, at, (unsigned long long)size[0]);
  free(image[0]);
  free(image[1]);
}

/* kvq_dequantize on both backends (on CUDA into `memory`): bit for bit, or for QJL and dense
 * PolarQuant within docs/CUDA.md's bound for those decodes, |cuda - cpu| <= 1e-5 (1 + |cpu|). */
static void check_dequantize(pair *p, const spec *sp, kvq_memory cuda_memory) {
  const size_t n = (size_t)TOKENS * HKV * D;
  float *out[2][2];
  for (int b = 0; b < 2; b++) {
    for (int s = 0; s < 2; s++) {
      out[b][s] = malloc(sizeof(float) * n);
      cr_assert_not_null(out[b][s]);
      for (size_t i = 0; i < n; i++) out[b][s][i] = NAN; /* every element must be written */
    }
    const kvq_memory memory = b == 1 ? cuda_memory : KVQ_MEMORY_HOST;
    kvq_tensor kd = rows(out[b][0], memory, KVQ_DTYPE_F32, 0, TOKENS), vd = rows(out[b][1], memory, KVQ_DTYPE_F32, 0, TOKENS);
    KVQ_CHECK(p->ctx[b], kvq_dequantize(p->cache[b], p->seq[b], 0, 0, TOKENS, &kd, &vd));
  }
  for (int s = 0; s < 2; s++) {
    const kvq_method_config *m = s == 0 ? &sp->keys : &sp->values;
    for (size_t i = 0; i < n; i++) {
      const float cpu = out[0][s][i], gpu = out[1][s][i];
      if (!bounded(m))
        cr_assert(memcmp(&cpu, &gpu, 4) == 0, "%s, %s: element %zu is %.9g on CUDA, %.9g on the CPU", sp->name,
                  s ? "values" : "keys", i, (double)gpu, (double)cpu);
      else
        cr_assert(fabs((double)gpu - cpu) <= 1e-5 * (1.0 + fabs((double)cpu)), "%s, %s: element %zu is %.9g on CUDA, %.9g on the CPU",
                  sp->name, s ? "values" : "keys", i, (double)gpu, (double)cpu);
    }
  }
  for (int b = 0; b < 2; b++)
    for (int s = 0; s < 2; s++) free(out[b][s]);
}

static void run_spec(const spec *sp, uint64_t seed, kvq_memory cuda_memory) {
  pair p;
  pair_open(&p, sp, seed, KVQ_POLICY_KEEP_ALL);
  void *k = tokens_of(sp->input, (uint32_t)seed), *v = tokens_of(sp->input, (uint32_t)seed + 1u);
  append_all(&p, sp->input, k, v, cuda_memory);
  check_saved_files(&p, sp->name);
  check_dequantize(&p, sp, cuda_memory);
  free(k);
  free(v);
  pair_close(&p);
}

Test(cuda, every_method_gives_the_cpu_pages_and_decodes, .timeout = 300) {
  size_t count;
  const spec *s = specs(&count);
  for (size_t i = 0; i < count; i++) run_spec(&s[i], 100 + i, KVQ_MEMORY_HOST);
}

/* Caller device pointers (emulated device memory is the heap, so host pointers serve as CUDA device
 * pointers here) as keys, values and dequantize outputs, in place of host tensors. */
Test(cuda, caller_device_pointers_as_keys_values_and_outputs, .timeout = 120) {
  size_t count;
  const spec *s = specs(&count);
  run_spec(&s[0], 200, KVQ_MEMORY_CUDA_DEVICE);
  run_spec(&s[4], 201, KVQ_MEMORY_CUDA_DEVICE);
}

/* Q-Hitter reads every token's quantization error from QUANTIZE (the errors buffer of the job): for
 * the methods whose decode is bit for bit the CPU's, the errors (||x - x^||_2 summed in double in
 * channel order on both) are too, and so are the saved files, which hold them. */
Test(cuda, qhitter_quantization_errors_are_the_cpus, .timeout = 120) {
  size_t count;
  const spec *s = specs(&count);
  const size_t cases[] = {2, 5};
  for (size_t c = 0; c < 2; c++) {
    const spec *sp = &s[cases[c]];
    pair p;
    pair_open(&p, sp, 300 + c, KVQ_POLICY_QHITTER);
    void *k = tokens_of(sp->input, 300 + (uint32_t)c), *v = tokens_of(sp->input, 400 + (uint32_t)c);
    append_all(&p, sp->input, k, v, KVQ_MEMORY_HOST);
    kvq_token_stats stats[2][TOKENS];
    size_t n[2];
    for (int b = 0; b < 2; b++) KVQ_CHECK(p.ctx[b], kvq_sequence_token_stats(p.cache[b], p.seq[b], stats[b], TOKENS, &n[b]));
    cr_assert_eq(n[0], n[1]);
    cr_assert_gt(n[0], 0u);
    size_t measured = 0; /* tokens of whole pages: the first 2 P (docs: errors of pages quantized whole) */
    for (size_t t = 0; t < n[0]; t++) {
      measured += stats[0][t].key_error > 0.0f || stats[0][t].value_error > 0.0f;
      cr_assert(memcmp(&stats[0][t].key_error, &stats[1][t].key_error, sizeof(float)) == 0 &&
                    memcmp(&stats[0][t].value_error, &stats[1][t].value_error, sizeof(float)) == 0,
                "%s: token %zu's errors are %.9g, %.9g on CUDA and %.9g, %.9g on the CPU", sp->name, t,
                (double)stats[1][t].key_error, (double)stats[1][t].value_error, (double)stats[0][t].key_error,
                (double)stats[0][t].value_error);
    }
    cr_assert_geq(measured, 2u * P, "%s: %zu tokens with errors", sp->name, measured);
    check_saved_files(&p, sp->name);
    free(k);
    free(v);
    pair_close(&p);
  }
}

/* What the caller may hand over: CUDA memory only to CUDA, and CUDA only CUDA memory. */
Test(cuda, wrong_memory_kinds_are_refused) {
  kvq_context *cpu = context_of(KVQ_BACKEND_CPU), *ctx = cuda_context();
  kvq_layer_config layer = th_layer(HQ, HKV, D, uniform(4, 32), uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 0, 8, 1, 3);
  kvq_cache *on_cpu = NULL, *on_cuda = NULL;
  uint32_t seq_cpu, seq_cuda;
  KVQ_CHECK(cpu, kvq_cache_create(cpu, &config, &on_cpu));
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &on_cuda));
  KVQ_CHECK(cpu, kvq_sequence_add(on_cpu, &seq_cpu));
  KVQ_CHECK(ctx, kvq_sequence_add(on_cuda, &seq_cuda));
  float data[4 * HKV * D] = {0};
  const int64_t shape[3] = {4, HKV, D};
  kvq_tensor device = kvq_tensor_cuda(data, KVQ_DTYPE_F32, 3, shape);
  kvq_tensor vk = kvq_tensor_vulkan(1, 0, KVQ_DTYPE_F32, 3, shape);
  cr_assert_eq(kvq_append(on_cpu, seq_cpu, 0, &device, &device), KVQ_ERROR_UNSUPPORTED, "CUDA memory on the CPU backend");
  cr_assert_eq(kvq_append(on_cuda, seq_cuda, 0, &vk, &vk), KVQ_ERROR_UNSUPPORTED, "a VkBuffer on the CUDA backend");
  cr_assert_not_null(strstr(kvq_context_last_error(ctx), "vulkan"), "%s", kvq_context_last_error(ctx));
  /* the backend itself imports CUDA device memory only */
  kvq_backend *be = ctx->backend;
  kvq_buffer *buffer = NULL;
  const kvq_device_memory host = {KVQ_MEMORY_HOST, data, 0}, vulkan = {KVQ_MEMORY_VULKAN_BUFFER, NULL, 1};
  const kvq_device_memory null_device = {KVQ_MEMORY_CUDA_DEVICE, NULL, 0}, cuda = {KVQ_MEMORY_CUDA_DEVICE, data, 0};
  cr_assert_eq(be->ops->buffer_import(be, &host, sizeof data, &buffer), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(be->ops->buffer_import(be, &vulkan, sizeof data, &buffer), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(be->ops->buffer_import(be, &null_device, sizeof data, &buffer), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_null(buffer);
  cr_assert_eq(be->ops->buffer_import(be, &cuda, sizeof data, &buffer), KVQ_OK, "%s", be->message);
  be->ops->buffer_destroy(be, buffer); /* the wrapper only: `data` stays the caller's */
  kvq_cache_destroy(on_cpu);
  kvq_cache_destroy(on_cuda);
  kvq_context_destroy(cpu);
  kvq_context_destroy(ctx);
}

/* A buffer of another backend is refused by every CUDA operation (kvq_buffer_base's owner), never
 * read as a CUDA buffer; destroying it through CUDA leaves it to its owner. */
static void check_foreign_buffer(kvq_backend *cuda, kvq_backend *other) {
  kvq_buffer *foreign = NULL, *mine = NULL;
  cr_assert_eq(other->ops->buffer_create(other, 4096, &foreign), KVQ_OK, "%s", other->message);
  cr_assert_eq(cuda->ops->buffer_create(cuda, 4096, &mine), KVQ_OK, "%s", cuda->message);
  uint8_t bytes[64] = {1};
  cr_assert_eq(cuda->ops->buffer_write(cuda, foreign, 0, bytes, sizeof bytes), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(cuda->message, "another backend"), "%s", cuda->message);
  cr_assert_eq(cuda->ops->buffer_read(cuda, foreign, 0, bytes, sizeof bytes), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(cuda->ops->buffer_copy(cuda, mine, 0, foreign, 0, 64), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(cuda->ops->buffer_copy(cuda, foreign, 0, mine, 0, 64), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(cuda->ops->buffer_zero(cuda, foreign, 0, 64), KVQ_ERROR_INVALID_ARGUMENT);
  const uint32_t slots[1] = {0};
  kvq_side_desc side = {0};
  side.layout.method = 0; /* EXACT: the check comes before any layout is read */
  kvq_job_dequantize job = {.side = &side, .pages = foreign, .count = 1, .slots = slots, .out = mine};
  cr_assert_eq(cuda->ops->dequantize(cuda, &job), KVQ_ERROR_INVALID_ARGUMENT);
  cuda->ops->buffer_destroy(cuda, foreign); /* refused: still the other backend's */
  uint8_t back[64];
  cr_assert_eq(other->ops->buffer_read(other, foreign, 0, back, sizeof back), KVQ_OK, "%s", other->message);
  other->ops->buffer_destroy(other, foreign);
  cuda->ops->buffer_destroy(cuda, mine);
}

Test(cuda, buffers_of_other_backends_are_refused) {
  kvq_context *cpu = context_of(KVQ_BACKEND_CPU), *ctx = cuda_context();
  check_foreign_buffer(ctx->backend, cpu->backend);
  kvq_context_destroy(cpu);
  kvq_backend_info infos[4];
  size_t count = 0;
  cr_assert_eq(kvq_backends_list(infos, 4, &count), KVQ_OK);
  if (infos[1].availability == KVQ_AVAILABLE) {
    kvq_context *vk = context_of(KVQ_BACKEND_VULKAN);
    check_foreign_buffer(ctx->backend, vk->backend);
    kvq_context_destroy(vk);
  } else {
    cr_log_warn("# the Vulkan half of this check was not run: %s", infos[1].reason);
  }
  kvq_context_destroy(ctx);
}

/* kvq_attention and kvq_scores on the CUDA backend (SCORE, SOFTMAX and WEIGHTED_SUM: no fused kernel,
 * so core runs the three), with queries, outputs and scores as host tensors and then as caller CUDA
 * device pointers (the emulated device's memory is the heap): the same kernels on the same pages and
 * queries must give the same bits both ways, and in place nothing of the queries, outputs or scores
 * crosses between host and device (the backend's counters: the host run moves at least the queries
 * to the device and the outputs back, the device run at most the 4-byte check word back). A context
 * that picks its backend itself never lands on the emulator. */
Test(cuda, attention_and_scores_run_in_place_on_device_pointers_and_auto_never_picks_the_emulator) {
  kvq_context *ctx = cuda_context();
  kvq_layer_config layer = th_layer(HQ, HKV, D, uniform(4, 32), uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 0, 8, 1, 3);
  kvq_cache *cache = NULL;
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  float *k = tokens_of(KVQ_DTYPE_F32, 5), *v = tokens_of(KVQ_DTYPE_F32, 7), *q = tokens_of(KVQ_DTYPE_F32, 6);
  kvq_tensor kt = rows(k, KVQ_MEMORY_HOST, KVQ_DTYPE_F32, 0, TOKENS), vt = rows(v, KVQ_MEMORY_HOST, KVQ_DTYPE_F32, 0, TOKENS);
  KVQ_CHECK(ctx, kvq_append(cache, seq, 0, &kt, &vt));
  kvq_backend_stats stats[2];
  cr_assert_eq(kvq_context_backend_stats(ctx, &stats[0], 1), KVQ_OK);
  /* 2 full pages per side were quantized, one launch each side and append */
  cr_assert_geq(stats[0].submissions, 2u);
  cr_assert_geq(stats[0].bytes_to_device, sizeof(float) * TOKENS * HKV * D);
  enum { OUT = HQ * D, SCORES = HQ * TOKENS };
  static float out[2][OUT], scores[2][SCORES];
  const int64_t qshape[3] = {1, HQ, D}, sshape[3] = {1, HQ, TOKENS};
  for (int m = 0; m < 2; m++) { /* host tensors, then device pointers */
    for (int i = 0; i < OUT; i++) out[m][i] = NAN;
    for (int i = 0; i < SCORES; i++) scores[m][i] = NAN;
    kvq_tensor (*make)(void *, kvq_dtype, uint32_t, const int64_t *) = m ? kvq_tensor_cuda : kvq_tensor_host;
    kvq_attention_request req = {.sequence = seq, .mask = KVQ_MASK_CAUSAL, .queries = make(q, KVQ_DTYPE_F32, 3, qshape),
                                 .output = make(out[m], KVQ_DTYPE_F32, 3, qshape)};
    cr_assert_eq(kvq_context_backend_stats(ctx, &stats[m], 1), KVQ_OK);
    KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
    KVQ_CHECK(ctx, kvq_context_wait(ctx));
    cr_assert_eq(kvq_context_backend_stats(ctx, &stats[m], 1), KVQ_OK);
    cr_assert_geq(stats[m].submissions, 2u, "the fused attention launched, its splits and their combine (%llu launches)",
                  (unsigned long long)stats[m].submissions);
    kvq_tensor st = make(scores[m], KVQ_DTYPE_F32, 3, sshape);
    KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &req.queries, KVQ_MASK_NONE, KVQ_SCORES_PROBABILITIES, &st));
    KVQ_CHECK(ctx, kvq_context_wait(ctx));
  }
  const uint64_t moved = sizeof(float) * OUT;
  cr_assert_geq(stats[0].bytes_to_device, moved, "host queries uploaded: %llu bytes", (unsigned long long)stats[0].bytes_to_device);
  cr_assert_geq(stats[0].bytes_to_host, moved, "host outputs read back: %llu bytes", (unsigned long long)stats[0].bytes_to_host);
  cr_assert_leq(stats[1].bytes_to_device + moved, stats[0].bytes_to_device, "device queries were uploaded: %llu vs %llu bytes",
                (unsigned long long)stats[1].bytes_to_device, (unsigned long long)stats[0].bytes_to_device);
  cr_assert_leq(stats[1].bytes_to_host, 4u, "device outputs crossed to the host: %llu bytes", (unsigned long long)stats[1].bytes_to_host);
  for (int i = 0; i < OUT; i++) {
    cr_assert(isfinite(out[0][i]), "output %d not written: %g", i, (double)out[0][i]);
    cr_assert(memcmp(&out[0][i], &out[1][i], 4) == 0, "output %d: %.9g in place, %.9g through the host", i, (double)out[1][i],
              (double)out[0][i]);
  }
  for (int i = 0; i < SCORES; i++) {
    cr_assert(scores[0][i] >= 0.0f && scores[0][i] <= 1.0f, "probability %d: %g", i, (double)scores[0][i]);
    cr_assert(memcmp(&scores[0][i], &scores[1][i], 4) == 0, "probability %d: %.9g in place, %.9g through the host", i,
              (double)scores[1][i], (double)scores[0][i]);
  }
  free(k);
  free(v);
  free(q);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  kvq_context *automatic = context_of(KVQ_BACKEND_AUTO);
  cr_assert_null(strstr(automatic->backend->device, "emulator"), "AUTO chose %s", automatic->backend->device);
  kvq_context_destroy(automatic);
}

/* A cache's saved file, whole (the caller frees it). */
static uint8_t *saved_image(kvq_context *ctx, kvq_cache *cache, uint64_t *size) {
  KVQ_CHECK(ctx, kvq_cache_save_size(cache, size));
  uint8_t *image = malloc((size_t)*size);
  cr_assert_not_null(image);
  size_t written = 0;
  KVQ_CHECK(ctx, kvq_cache_save_to_memory(cache, image, (size_t)*size, &written));
  cr_assert_eq(written, *size);
  return image;
}

static void check_same_image(kvq_context *ctx, kvq_cache *a, kvq_cache *b, const char *what, size_t m, int side, double x) {
  uint64_t size[2];
  uint8_t *image[2] = {saved_image(ctx, a, &size[0]), saved_image(ctx, b, &size[1])};
  cr_assert(size[0] == size[1] && memcmp(image[0], image[1], (size_t)size[0]) == 0, "method %zu on side %d, element %g: %s", m, side,
            x, what);
  free(image[0]);
  free(image[1]);
}

/*
 * Appended caller device keys and values are checked on the device (the backend's TOKEN_CHECK kernel,
 * kvq_cuda_token_check, after CONVERT's finite check) and quantized from there, never staged through
 * the host: what a host append refuses (a NaN; a value whose method cannot store it: EXACT fp16
 * overflow, QJL's fp16 norm, UNIFORM's fp16 minimum or scale, KIVI's |x| > 32752, PolarQuant's fp16
 * radii) a device append refuses with the same status, changing nothing (the saved file is the same
 * bytes); what a host append takes, a device append takes with the host append's bytes, including
 * 17 more tokens that fill and quantize a page from device memory. Nothing of a device append's keys
 * or values comes back to the host (at most the 4-byte check word per call). Asynchronously the wait
 * reports a refusal.
 */
Test(cuda, device_appends_are_checked_on_the_device_and_refuse_what_host_appends_refuse, .timeout = 300) {
  kvq_context *ctx = cuda_context();
  enum { N = 3, MORE = 17 };
  const kvq_method_config methods[] = {exact(KVQ_DTYPE_F16), qjl(64, 4, 32), uniform(4, 32), kivi(2, 8),
                                       polar(KVQ_ROTATION_DENSE, KVQ_CODEBOOK_OFFLINE)};
  /* far out, then next to each limit: KIVI's 32752, fp16's largest finite 65504 and the first value
   * that rounds to fp16 infinity, 65520 (EXACT fp16, QJL's norm), beyond PolarQuant's 65440 */
  const float extremes[] = {-70000.0f, -60000.0f, -40000.0f, 1000.0f, NAN, 32752.0f, 32753.0f, 65504.0f, 65520.0f};
  enum { EXTREMES = sizeof extremes / sizeof extremes[0] };
  static float k[(N + 1 + MORE) * HKV * D], v[(N + 1 + MORE) * HKV * D];
  for (uint32_t i = 0; i < (N + 1 + MORE) * HKV * D; i++) k[i] = value_at(i, 11), v[i] = value_at(i, 12);
  const int64_t shape[3] = {1, HKV, D}, more_shape[3] = {MORE, HKV, D};
  static float dk[HKV * D], dv[HKV * D]; /* the emulated device's memory is the heap */
  const kvq_tensor kd = kvq_tensor_cuda(dk, KVQ_DTYPE_F32, 3, shape), vd = kvq_tensor_cuda(dv, KVQ_DTYPE_F32, 3, shape);
  const kvq_tensor kmore = kvq_tensor_cuda(k + (N + 1) * HKV * D, KVQ_DTYPE_F32, 3, more_shape);
  const kvq_tensor vmore = kvq_tensor_cuda(v + (N + 1) * HKV * D, KVQ_DTYPE_F32, 3, more_shape);
  const kvq_tensor kmore_host = kvq_tensor_host(k + (N + 1) * HKV * D, KVQ_DTYPE_F32, 3, more_shape);
  const kvq_tensor vmore_host = kvq_tensor_host(v + (N + 1) * HKV * D, KVQ_DTYPE_F32, 3, more_shape);
  int refused = 0, taken = 0;
  for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++)
    for (int side = 0; side < 2; side++)
      for (size_t x = 0; x < EXTREMES && !(m == 1 && side == 1); x++) { /* QJL: keys only */
        kvq_layer_config layer = th_layer(HQ, HKV, D, side ? exact(KVQ_DTYPE_F32) : methods[m], side ? methods[m] : exact(KVQ_DTYPE_F32));
        kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 0, 8, 1, 5);
        uint32_t host_seq, dev_seq;
        kvq_cache *host, *dev;
        KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &host));
        KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &dev));
        KVQ_CHECK(ctx, kvq_sequence_add(host, &host_seq));
        KVQ_CHECK(ctx, kvq_sequence_add(dev, &dev_seq));
        th_append(ctx, host, host_seq, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
        th_append(ctx, dev, dev_seq, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
        float token[2][HKV * D];
        memcpy(token[0], k + N * HKV * D, sizeof token[0]), memcpy(token[1], v + N * HKV * D, sizeof token[1]);
        token[side][D + 5] = extremes[x]; /* kv head 1, channel 5 */
        const kvq_tensor kh = kvq_tensor_host(token[0], KVQ_DTYPE_F32, 3, shape), vh = kvq_tensor_host(token[1], KVQ_DTYPE_F32, 3, shape);
        memcpy(dk, token[0], sizeof dk), memcpy(dv, token[1], sizeof dv);
        const kvq_status host_st = kvq_append(host, host_seq, 0, &kh, &vh);
        uint64_t before_size;
        uint8_t *before = saved_image(ctx, dev, &before_size);
        kvq_backend_stats stats;
        cr_assert_eq(kvq_context_backend_stats(ctx, &stats, 1), KVQ_OK);
        const kvq_status dev_st = kvq_append(dev, dev_seq, 0, &kd, &vd);
        const char *why = kvq_context_last_error(ctx);
        cr_assert_eq(dev_st, host_st, "method %zu on side %d, element %g: the device append returned %s, the host append %s (%s)", m,
                     side, (double)extremes[x], kvq_status_string(dev_st), kvq_status_string(host_st), why);
        cr_assert(host_st == KVQ_OK || host_st == KVQ_ERROR_NON_FINITE, "%s", kvq_status_string(host_st));
        if (dev_st != KVQ_OK)
          cr_assert(strstr(why, isnan(extremes[x]) ? "non-finite" : "method stores"), "element %g: %s", (double)extremes[x], why);
        cr_assert_eq(kvq_context_backend_stats(ctx, &stats, 1), KVQ_OK);
        cr_assert_leq(stats.bytes_to_host, 4u, "method %zu on side %d: %llu bytes of the device append came to the host", m, side,
                      (unsigned long long)stats.bytes_to_host);
        if (dev_st != KVQ_OK) {
          refused++;
          uint64_t after_size;
          uint8_t *after = saved_image(ctx, dev, &after_size);
          cr_assert(after_size == before_size && memcmp(before, after, (size_t)before_size) == 0,
                    "method %zu on side %d, element %g: a refused device append changed the cache", m, side, (double)extremes[x]);
          free(after);
        } else {
          taken++;
          check_same_image(ctx, host, dev, "the device append's cache differs from the host append's", m, side, extremes[x]);
          /* and a page filled and quantized from device memory */
          KVQ_CHECK(ctx, kvq_append(host, host_seq, 0, &kmore_host, &vmore_host));
          KVQ_CHECK(ctx, kvq_append(dev, dev_seq, 0, &kmore, &vmore));
          check_same_image(ctx, host, dev, "a page quantized from device tokens differs from the host's", m, side, extremes[x]);
        }
        free(before);
        if (m == 3 && side == 0 && x == 2) { /* asynchronously: the wait reports it */
          KVQ_CHECK(ctx, kvq_context_set_async(ctx, 1));
          cr_assert_eq(kvq_append(dev, dev_seq, 0, &kd, &vd), KVQ_OK, "checked on the device: reported at the wait");
          cr_assert_eq(kvq_context_wait(ctx), KVQ_ERROR_NON_FINITE);
          cr_assert_eq(kvq_context_wait(ctx), KVQ_OK, "reported once");
          KVQ_CHECK(ctx, kvq_context_set_async(ctx, 0));
        }
        kvq_cache_destroy(host);
        kvq_cache_destroy(dev);
      }
  /* range: EXACT fp16 -70000 (2 sides), QJL -70000 (keys), UNIFORM -70000 (2), KIVI -70000, -60000,
   * -40000 (2 x 3), PolarQuant -70000 (2); NaN: every method and side (9); 32752 nothing; 32753 KIVI
   * (2); 65504 KIVI and PolarQuant (4); 65520 EXACT fp16, QJL, KIVI and PolarQuant (7) */
  cr_assert_eq(refused, 2 * (1 + 1 + 1 + 3 + 1) - 1 + 9 + 2 + 4 + 7, "%d appends refused", refused);
  cr_assert_eq(taken, 9 * EXTREMES - refused, "%d appends taken", taken);
  kvq_context_destroy(ctx);
}

static uint64_t now_ns(void) {
  struct timespec t;
  cr_assert_eq(clock_gettime(CLOCK_MONOTONIC, &t), 0);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* kvq_context_device_time on CUDA: the backend brackets each call's work with cudaEvents on its
 * stream and sums cudaEventElapsedTime (on the emulator, events hold the host clock and the work is
 * done on the CPU when they are recorded, docs/CUDA.md). The first call starts the count; after an
 * append, a flush and an attention the time is reported, above 0 (the emulated kernels take host time)
 * and within the wall time of that work; with no work since, the next call reports 0. More calls than
 * the backend's ring of events holds spans (16) are read as they come (the oldest span when the ring
 * is full). */
Test(cuda, device_time_comes_from_cuda_events, .timeout = 120) {
  kvq_context *ctx = cuda_context();
  kvq_layer_config layer = th_layer(HQ, HKV, D, uniform(4, 32), uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 0, 8, 1, 3);
  kvq_cache *cache = NULL;
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  float *k = tokens_of(KVQ_DTYPE_F32, 5), *v = tokens_of(KVQ_DTYPE_F32, 7), *q = tokens_of(KVQ_DTYPE_F32, 6);
  uint64_t ns = 12345;
  KVQ_CHECK(ctx, kvq_context_device_time(ctx, &ns)); /* starts the count: the cache's creation */
  const uint64_t wall_start = now_ns();
  kvq_tensor kt = rows(k, KVQ_MEMORY_HOST, KVQ_DTYPE_F32, 0, TOKENS), vt = rows(v, KVQ_MEMORY_HOST, KVQ_DTYPE_F32, 0, TOKENS);
  KVQ_CHECK(ctx, kvq_append(cache, seq, 0, &kt, &vt));
  KVQ_CHECK(ctx, kvq_flush(cache, seq));
  static float out[HQ * D];
  const int64_t qshape[3] = {1, HQ, D};
  kvq_attention_request req = {.sequence = seq, .mask = KVQ_MASK_CAUSAL, .queries = kvq_tensor_host(q, KVQ_DTYPE_F32, 3, qshape),
                               .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape)};
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
  const uint64_t wall = now_ns() - wall_start;
  ns = 0;
  KVQ_CHECK(ctx, kvq_context_device_time(ctx, &ns));
  cr_assert_gt(ns, 0u, "no device time reported for an append, a flush and an attention");
  cr_assert_leq(ns, wall, "device time %llu ns beyond the calls' wall time %llu ns", (unsigned long long)ns, (unsigned long long)wall);
  ns = 12345;
  KVQ_CHECK(ctx, kvq_context_device_time(ctx, &ns));
  cr_assert_eq(ns, 0u, "%llu ns with no work since the previous call", (unsigned long long)ns);
  /* 40 calls: more spans than the ring holds */
  const uint64_t wall_start2 = now_ns();
  for (int i = 0; i < 40; i++) KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
  const uint64_t wall2 = now_ns() - wall_start2;
  KVQ_CHECK(ctx, kvq_context_device_time(ctx, &ns));
  cr_assert_gt(ns, 0u);
  cr_assert_leq(ns, wall2, "device time %llu ns beyond the calls' wall time %llu ns", (unsigned long long)ns, (unsigned long long)wall2);
  free(k);
  free(v);
  free(q);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

#ifdef KVQ_HAVE_CUDA_EMULATOR
/* The emulated driver's context stack is balanced, the runtime's CUcontext was the context pushed,
 * and every emulated runtime call since `outside` (the count of calls without a caller's context
 * current when the runtime's context was handed over) ran with it current. */
static void check_contexts(void *context, unsigned long long outside, const char *after) {
  kvq_cuda_emu_context_counts c;
  kvq_cuda_emu_contexts(&c);
  cr_assert_gt(c.pushes, 0u, "after %s: the runtime's context was never pushed", after);
  cr_assert_eq(c.pushes, c.pops, "after %s: %llu pushes, %llu pops", after, c.pushes, c.pops);
  cr_assert_eq(c.depth, 0u, "after %s: the caller's context stack is %llu deep", after, c.depth);
  cr_assert_eq(c.last_pushed, context, "after %s: another context was pushed", after);
  cr_assert_eq(c.calls_outside_context, outside, "after %s: %llu runtime calls ran without the runtime's context current", after,
               c.calls_outside_context - outside);
  cr_assert_gt(c.calls_in_context, 0u);
}
#endif

/* A CUcontext of the runtime's own (kvq_cuda_device.context): kvq takes cuCtxPushCurrent and
 * cuCtxPopCurrent from the runtime (cudaGetDriverEntryPointByVersion; on the emulator, stand-ins that
 * keep a per-thread stack) and makes the context current around every call that touches CUDA: after
 * each kind of call (context and cache creation, appends from host and device memory, flush, attention,
 * scores, dequantize, wait, device time, save, destroy) the pushes and pops balance, the stack is as
 * the caller left it, and no runtime call ran outside the context (a cudaSetDevice inside would put
 * the primary context in its place, which the pops would find). The results are those of a context
 * without one (run first, before the runtime's context is handed over). */
Test(cuda, a_runtimes_cucontext_is_current_around_every_call, .timeout = 120) {
  require_emulator();
#ifdef KVQ_HAVE_CUDA_EMULATOR
  static int context_token; /* the emulated driver takes any non-null CUcontext */
  void *context = &context_token;
  kvq_context *plain = context_of(KVQ_BACKEND_CUDA), *ctx = NULL;
  kvq_layer_config layer = th_layer(HQ, HKV, D, uniform(4, 32), kivi(2, 8));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 0, 8, 1, 3);
  kvq_cache *cache[2];
  uint32_t seq[2];
  float *k = tokens_of(KVQ_DTYPE_F32, 5), *v = tokens_of(KVQ_DTYPE_F32, 7), *q = tokens_of(KVQ_DTYPE_F32, 6);
  static float out[2][HQ * D], deq[2][2][TOKENS * HKV * D];
  uint8_t *image[2];
  uint64_t size[2];
  unsigned long long outside = 0;
  for (int b = 0; b < 2; b++) {
    if (b) {
      kvq_cuda_emu_context_counts c;
      kvq_cuda_emu_contexts(&c);
      cr_assert_eq(c.pushes + c.pops + c.depth, 0u, "no context pushed without one");
      outside = c.calls_outside_context;
      kvq_cuda_device device = {.device_ordinal = 0, .stream = NULL, .context = context};
      kvq_context_options opt = kvq_context_options_default();
      opt.backend = KVQ_BACKEND_CUDA;
      opt.cuda = &device;
      cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_OK);
      cr_assert_not_null(strstr(ctx->backend->device, "emulator"), "%s", ctx->backend->device);
      check_contexts(context, outside, "kvq_context_create");
    }
    kvq_context *c = b ? ctx : plain;
    KVQ_CHECK(c, kvq_cache_create(c, &config, &cache[b]));
    KVQ_CHECK(c, kvq_sequence_add(cache[b], &seq[b]));
    kvq_tensor kh = rows(k, KVQ_MEMORY_HOST, KVQ_DTYPE_F32, 0, FIRST_APPEND), vh = rows(v, KVQ_MEMORY_HOST, KVQ_DTYPE_F32, 0, FIRST_APPEND);
    kvq_tensor kd = rows(k, KVQ_MEMORY_CUDA_DEVICE, KVQ_DTYPE_F32, FIRST_APPEND, TOKENS - FIRST_APPEND);
    kvq_tensor vd = rows(v, KVQ_MEMORY_CUDA_DEVICE, KVQ_DTYPE_F32, FIRST_APPEND, TOKENS - FIRST_APPEND);
    KVQ_CHECK(c, kvq_append(cache[b], seq[b], 0, &kh, &vh));
    KVQ_CHECK(c, kvq_append(cache[b], seq[b], 0, &kd, &vd));
    KVQ_CHECK(c, kvq_flush(cache[b], seq[b]));
    if (b) check_contexts(context, outside, "cache creation, appends and a flush");
    const int64_t qshape[3] = {1, HQ, D};
    kvq_attention_request req = {.sequence = seq[b], .mask = KVQ_MASK_CAUSAL, .queries = kvq_tensor_cuda(q, KVQ_DTYPE_F32, 3, qshape),
                                 .output = kvq_tensor_cuda(out[b], KVQ_DTYPE_F32, 3, qshape)};
    KVQ_CHECK(c, kvq_attention(cache[b], 0, &req, 1));
    static float scores[HQ * TOKENS];
    const int64_t sshape[3] = {1, HQ, TOKENS};
    kvq_tensor st = kvq_tensor_host(scores, KVQ_DTYPE_F32, 3, sshape);
    KVQ_CHECK(c, kvq_scores(cache[b], seq[b], 0, &req.queries, KVQ_MASK_NONE, KVQ_SCORES_PROBABILITIES, &st));
    kvq_tensor dk = rows(deq[b][0], KVQ_MEMORY_CUDA_DEVICE, KVQ_DTYPE_F32, 0, TOKENS), dv = rows(deq[b][1], KVQ_MEMORY_HOST, KVQ_DTYPE_F32, 0, TOKENS);
    KVQ_CHECK(c, kvq_dequantize(cache[b], seq[b], 0, 0, TOKENS, &dk, &dv));
    KVQ_CHECK(c, kvq_context_wait(c));
    uint64_t ns = 0;
    KVQ_CHECK(c, kvq_context_device_time(c, &ns));
    if (b) check_contexts(context, outside, "attention, scores, dequantize, a wait and the device time");
    image[b] = saved_image(c, cache[b], &size[b]);
    kvq_cache_destroy(cache[b]);
    if (b) check_contexts(context, outside, "saving and destroying the cache");
  }
  kvq_context_destroy(ctx);
  check_contexts(context, outside, "destroying the context");
  cr_assert(size[0] == size[1] && memcmp(image[0], image[1], (size_t)size[0]) == 0, "the cache made in the runtime's context differs");
  cr_assert(memcmp(out[0], out[1], sizeof out[0]) == 0, "attention differs in the runtime's context");
  cr_assert(memcmp(deq[0], deq[1], sizeof deq[0]) == 0, "dequantize differs in the runtime's context");
  kvq_context_destroy(plain);
  free(image[0]);
  free(image[1]);
  free(k);
  free(v);
  free(q);
#endif
}
