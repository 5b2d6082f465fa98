/* Limits: sizes near the limits of 64 bits and of the device are refused with KVQ_ERROR_OUT_OF_RANGE
 * and a message naming the limit, before anything is allocated (core/memory_limits.c), and a refused
 * call leaves the cache as it was (saved bytes and memory report compared). Every case runs on each
 * backend available here: cpu, vulkan (lavapipe in CI) and cuda (the emulated one: meson sets
 * KVQ_CUDA_EMULATOR=1); an unavailable backend skips, saying why.
 *
 * "Nothing big is allocated" is checked by the allocator: meson runs this test with AddressSanitizer's
 * max_allocation_size at 1 GiB and allocator_may_return_null=1, so any attempt to allocate more than
 * that (kvq's own malloc, or lavapipe's or the emulator's device memory, which are host memory too)
 * fails, and the call would return KVQ_ERROR_OUT_OF_MEMORY or KVQ_ERROR_DEVICE_MEMORY instead of the
 * KVQ_ERROR_OUT_OF_RANGE asserted. Without AddressSanitizer the cases still ask for more than the
 * host's memory, which malloc refuses the same way. Every oversized tensor below points at a small
 * real buffer: a call that read it before refusing would be caught by AddressSanitizer. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

/* Large heads so that the token counts the API accepts (2^31 - 1 positions, 2^31 queries, 2^24
 * calibration tokens) make working memory far beyond any host's: a token is 8 x 256 fp32 = 8 KiB. */
enum { HQ = 8, HKV = 8, D = 256, P = 16, R = 16, MAX_PAGES = 8, MAX_SEQS = 2 };

static const char *kind_name(kvq_backend_kind kind) {
  return kind == KVQ_BACKEND_CPU ? "cpu" : kind == KVQ_BACKEND_VULKAN ? "vulkan" : "cuda";
}

/* A context on `kind`, or a visible skip saying why the backend is unavailable. */
static kvq_context *context_on(kvq_backend_kind kind) {
  kvq_backend_info infos[4];
  size_t count = 0;
  cr_assert_eq(kvq_backends_list(infos, 4, &count), KVQ_OK);
  for (size_t i = 0; i < count; i++)
    if (infos[i].kind == kind && infos[i].availability != KVQ_AVAILABLE)
      cr_skip_test("the %s backend is unavailable here: %s", kind_name(kind), infos[i].reason);
  kvq_context_options options = kvq_context_options_default();
  options.backend = kind;
  kvq_context *ctx = NULL;
  cr_assert_eq(kvq_context_create(&options, &ctx), KVQ_OK, "%s context", kind_name(kind));
  return ctx;
}

/* Skips (visibly) a case whose working memory a host this large could hold: kvq would then rightly
 * try to allocate it. */
static void require_beyond_host(uint64_t bytes, const char *what) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const uint64_t host = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
  if (host >= bytes)
    cr_skip_test("%s: this host's %llu bytes of memory could hold the %llu bytes the case asks for", what,
                 (unsigned long long)host, (unsigned long long)bytes);
}

/* Asserts that creating the cache is refused as out of range, with a message holding `words`. */
static void expect_create_refused(kvq_context *ctx, const kvq_cache_config *config, const char *words, const char *what) {
  kvq_cache *cache = (kvq_cache *)(uintptr_t)1;
  const kvq_status st = kvq_cache_create(ctx, config, &cache);
  cr_assert_eq(st, KVQ_ERROR_OUT_OF_RANGE, "%s on %s: %s (%s)", what, kind_name(kvq_context_backend(ctx)), kvq_status_string(st),
               kvq_context_last_error(ctx));
  cr_assert_null(cache, "%s: *out is NULL after a failure", what);
  cr_assert(strstr(kvq_context_last_error(ctx), words), "%s: the message names the limit (%s): %s", what, words,
            kvq_context_last_error(ctx));
  cr_log_info("%s on %s: %s", what, kind_name(kvq_context_backend(ctx)), kvq_context_last_error(ctx));
}

/* Layers of exact fp32 keys and values, 8 kv heads of 256 channels: a page of 256 tokens is 2 MiB a side. */
static kvq_layer_config *exact_layers(uint32_t count, uint32_t kv_heads) {
  kvq_layer_config *layers = malloc(sizeof *layers * count);
  cr_assert_not_null(layers);
  for (uint32_t l = 0; l < count; l++)
    layers[l] = th_layer(kv_heads, kv_heads, D, th_exact(KVQ_DTYPE_F32), th_exact(KVQ_DTYPE_F32));
  return layers;
}

/* All buffers together beyond the device's memory, each one small enough: 4096 layers of 64 pages
 * of 2 MiB a side (128 MiB buffers: the least maxStorageBufferRange Vulkan allows, lavapipe's) are
 * over 1 TiB, beyond every device and host here yet below the 2^46 bytes (64 TiB) kvq_cache_create
 * accepts at most, so the refusal is the backend's limit, not that one. */
static void cache_beyond_memory(kvq_backend_kind kind) {
  require_beyond_host((uint64_t)1 << 40, "a cache of 1 TiB");
  kvq_context *ctx = context_on(kind);
  kvq_layer_config *layers = exact_layers(4096, HKV);
  kvq_cache_config config = th_config(layers, 4096, KVQ_DTYPE_F32, 256, 0, 64, 1, 1);
  uint64_t bytes = 0;
  cr_assert_eq(kvq_cache_config_bytes(&config, &bytes), KVQ_OK);
  cr_assert(bytes > ((uint64_t)1 << 40) && bytes < ((uint64_t)1 << 46), "%llu bytes: between 1 TiB and 64 TiB",
            (unsigned long long)bytes);
  expect_create_refused(ctx, &config, "memory is", "1 TiB of 128 MiB buffers");
  free(layers);
  kvq_context_destroy(ctx);
}

/* One buffer beyond the device's largest (and its memory): a pool of 2^22 pages of 2 MiB, 8 TiB. */
static void buffer_beyond_device(kvq_backend_kind kind) {
  require_beyond_host((uint64_t)1 << 43, "a page pool of 8 TiB");
  kvq_context *ctx = context_on(kind);
  kvq_layer_config *layers = exact_layers(1, HKV);
  kvq_cache_config config = th_config(layers, 1, KVQ_DTYPE_F32, 256, 0, 1u << 22, 1, 1);
  expect_create_refused(ctx, &config, "in one buffer", "an 8 TiB page pool");
  free(layers);
  kvq_context_destroy(ctx);
}

/* A configuration every field of which is in range but whose size does not fit 64 bits: 4096
 * layers of 1024 kv heads of 256 channels, 2^23 - 2 pages of 256 tokens (about 2^63 bytes a side;
 * positions must stay below 2^31). */
static void cache_beyond_64_bits(kvq_backend_kind kind) {
  kvq_context *ctx = context_on(kind);
  kvq_layer_config *layers = exact_layers(4096, 1024);
  kvq_cache_config config = th_config(layers, 4096, KVQ_DTYPE_F32, 256, 0, (1u << 23) - 2, 65535, 1);
  cr_assert_eq(kvq_cache_config_check(&config, NULL, 0), KVQ_OK, "every field in range");
  uint64_t bytes = 0;
  cr_assert_eq(kvq_cache_config_bytes(&config, &bytes), KVQ_ERROR_OUT_OF_RANGE);
  cr_assert_eq(bytes, UINT64_MAX);
  expect_create_refused(ctx, &config, "more than", "a cache beyond 2^64 bytes");
  free(layers);
  kvq_context_destroy(ctx);
}

/* ---- Calls on a cache ------------------------------------------------------------------------- */

/* Layer 0: exact fp16 keys and values, holding 40 tokens of one sequence; layer 1: CQ keys and
 * values, without tokens (so that its codebooks may be learned). StreamingLLM, so that an append is
 * not first refused for the pool's capacity. */
typedef struct fixture {
  kvq_context *ctx;
  kvq_cache *cache;
  kvq_layer_config layers[2];
  uint32_t seq;
  float *small; /* what every oversized tensor points at */
} fixture;

static void fixture_build(fixture *f, kvq_backend_kind kind) {
  memset(f, 0, sizeof *f);
  f->ctx = context_on(kind);
  f->layers[0] = th_layer(HQ, HKV, D, th_exact(KVQ_DTYPE_F16), th_exact(KVQ_DTYPE_F16));
  f->layers[1] = th_layer(HQ, HKV, D, th_cq(4, 4), th_cq(4, 4));
  kvq_cache_config config = th_config(f->layers, 2, KVQ_DTYPE_F32, P, R, MAX_PAGES, MAX_SEQS, 7);
  config.policy = kvq_policy_defaults(KVQ_POLICY_STREAMING);
  config.policy.sinks = P;
  config.policy.recent = R + 2 * P;
  KVQ_CHECK(f->ctx, kvq_cache_create(f->ctx, &config, &f->cache));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seq));
  enum { N = 40 };
  float *k = malloc(sizeof(float) * N * HKV * D), *v = malloc(sizeof(float) * N * HKV * D);
  cr_assert(k && v);
  for (size_t i = 0; i < (size_t)N * HKV * D; i++) k[i] = (float)((i * 37) % 101) / 50.0f - 1.0f, v[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
  th_append(f->ctx, f->cache, f->seq, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
  free(k);
  free(v);
  f->small = calloc(HQ * D, sizeof(float));
  cr_assert_not_null(f->small);
}

static void fixture_free(fixture *f) {
  kvq_cache_destroy(f->cache);
  kvq_context_destroy(f->ctx);
  free(f->small);
}

/* The saved bytes of the cache and its memory report. */
typedef struct state {
  uint8_t *bytes;
  size_t size;
  kvq_memory_report report;
} state;

static state snap(fixture *f) {
  state s = {0};
  uint64_t size = 0;
  KVQ_CHECK(f->ctx, kvq_cache_save_size(f->cache, &size));
  s.bytes = malloc(size);
  cr_assert_not_null(s.bytes);
  KVQ_CHECK(f->ctx, kvq_cache_save_to_memory(f->cache, s.bytes, size, &s.size));
  KVQ_CHECK(f->ctx, kvq_cache_memory(f->cache, &s.report));
  return s;
}

/* Asserts a call was refused as out of range for its working memory, the cache unchanged. */
static void expect_refused(fixture *f, const state *before, kvq_status st, const char *what) {
  cr_assert_eq(st, KVQ_ERROR_OUT_OF_RANGE, "%s on %s: %s (%s)", what, kind_name(kvq_context_backend(f->ctx)),
               kvq_status_string(st), kvq_context_last_error(f->ctx));
  cr_assert(strstr(kvq_context_last_error(f->ctx), "working memory"), "%s: %s", what, kvq_context_last_error(f->ctx));
  cr_log_info("%s on %s: %s", what, kind_name(kvq_context_backend(f->ctx)), kvq_context_last_error(f->ctx));
  state after = snap(f);
  cr_assert_eq(after.size, before->size, "%s: the saved cache changed size", what);
  cr_assert(!memcmp(after.bytes, before->bytes, after.size), "%s: the saved cache changed", what);
  cr_assert(!memcmp(&after.report, &before->report, sizeof after.report), "%s: the memory report changed", what);
  free(after.bytes);
}

/* A [rows, heads, D] fp32 tensor over the small buffer: its shape claims far more. */
static kvq_tensor oversized(fixture *f, int64_t rows, int64_t heads) {
  const int64_t shape[3] = {rows, heads, D};
  return kvq_tensor_host(f->small, KVQ_DTYPE_F32, 3, shape);
}

/* 2^30 tokens (positions stay below 2^31 - 1): 2 x 2^30 x 8 KiB = 16 TiB of working memory. */
static void append_beyond_memory(kvq_backend_kind kind) {
  require_beyond_host((uint64_t)2 << 30 << 13, "appending 2^30 tokens");
  fixture f;
  fixture_build(&f, kind);
  state before = snap(&f);
  const kvq_tensor k = oversized(&f, (int64_t)1 << 30, HKV), v = oversized(&f, (int64_t)1 << 30, HKV);
  expect_refused(&f, &before, kvq_append(f.cache, f.seq, 0, &k, &v), "appending 2^30 tokens");
  free(before.bytes);
  fixture_free(&f);
}

/* 2^31 queries without a mask (a causal block may not exceed the tokens): 2^31 x 8 KiB, twice. */
static void attention_beyond_memory(kvq_backend_kind kind) {
  require_beyond_host((uint64_t)2 << 31 << 13, "attention of 2^31 queries");
  fixture f;
  fixture_build(&f, kind);
  state before = snap(&f);
  kvq_attention_request request = {.sequence = f.seq, .mask = KVQ_MASK_NONE, .queries = oversized(&f, (int64_t)1 << 31, HQ),
                                   .output = oversized(&f, (int64_t)1 << 31, HQ)};
  expect_refused(&f, &before, kvq_attention(f.cache, 0, &request, 1), "attention of 2^31 queries");
  free(before.bytes);
  fixture_free(&f);
}

static void scores_beyond_memory(kvq_backend_kind kind) {
  require_beyond_host((uint64_t)1 << 31 << 13, "scores of 2^31 queries");
  fixture f;
  fixture_build(&f, kind);
  state before = snap(&f);
  uint32_t kept = 0;
  kvq_sequence_info info;
  KVQ_CHECK(f.ctx, kvq_sequence_info_get(f.cache, f.seq, 0, &info));
  kept = info.kept_tokens;
  const kvq_tensor q = oversized(&f, (int64_t)1 << 31, HQ);
  const int64_t shape[3] = {(int64_t)1 << 31, HQ, kept};
  const kvq_tensor scores = kvq_tensor_host(f.small, KVQ_DTYPE_F32, 3, shape);
  expect_refused(&f, &before, kvq_scores(f.cache, f.seq, 0, &q, KVQ_MASK_NONE, KVQ_SCORES_LOGITS, &scores),
                 "scores of 2^31 queries");
  free(before.bytes);
  fixture_free(&f);
}

/* The most calibration tokens accepted, 2^24: 2^24 x 8 KiB = 128 GiB of keys, learned three times over. */
static void learn_beyond_memory(kvq_backend_kind kind) {
  require_beyond_host((uint64_t)3 << 24 << 13, "learning from 2^24 tokens");
  fixture f;
  fixture_build(&f, kind);
  state before = snap(&f);
  const kvq_tensor k = oversized(&f, (int64_t)1 << 24, HKV), v = oversized(&f, (int64_t)1 << 24, HKV);
  expect_refused(&f, &before, kvq_codebooks_learn(f.cache, 1, &k, &v, NULL), "learning from 2^24 tokens");
  free(before.bytes);
  fixture_free(&f);
}

/* Every case on every backend. */
#define ON_EVERY_BACKEND(name)                                  \
  Test(limits_cpu, name) { name(KVQ_BACKEND_CPU); }          \
  Test(limits_vulkan, name) { name(KVQ_BACKEND_VULKAN); }    \
  Test(limits_cuda, name) { name(KVQ_BACKEND_CUDA); }

ON_EVERY_BACKEND(cache_beyond_memory)
ON_EVERY_BACKEND(buffer_beyond_device)
ON_EVERY_BACKEND(cache_beyond_64_bits)
ON_EVERY_BACKEND(append_beyond_memory)
ON_EVERY_BACKEND(attention_beyond_memory)
ON_EVERY_BACKEND(scores_beyond_memory)
ON_EVERY_BACKEND(learn_beyond_memory)
