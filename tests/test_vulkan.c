/*
 * What only the Vulkan backend has, against the CPU reference: backend selection and its error paths,
 * the runtime's own VkDevice, queue and VkBuffers as tensors, device-resident decode loops and their
 * submission and byte counters, the device-side checks. Runs on whatever Vulkan device the machine has
 * (in CI: lavapipe, Mesa's CPU implementation) with the Khronos validation layer on (meson sets
 * KVQ_VULKAN_VALIDATION=1; the backend then fails any job after which the layer said anything).
 * Without a Vulkan device every test here is skipped, saying why.
 *
 * What every GPU backend must do (the golden matrix, odd sizes, long sequences, learned codebooks,
 * batches) is tests/test_gpu.c, run on Vulkan as `gpu_vulkan`.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h" /* kvq_context_backend_stats: the backend's submission and byte counters */
#include "helpers.h"

/* Skips the calling test (visibly, with the reason) when kvq has no Vulkan device here. */
static void require_vulkan(void) {
  kvq_backend_info infos[4];
  size_t count = 0;
  cr_assert_eq(kvq_backends_list(infos, 4, &count), KVQ_OK);
  for (size_t i = 0; i < count; i++)
    if (infos[i].kind == KVQ_BACKEND_VULKAN && infos[i].availability != KVQ_AVAILABLE)
      cr_skip_test("the Vulkan backend is unavailable here: %s", infos[i].reason);
}

static kvq_context *vulkan_context(void) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_VULKAN;
  kvq_context *ctx = NULL;
  cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_OK);
  return ctx;
}


/* ---- Backend selection and error paths ----------------------------------------------------------- */

Test(vulkan, listed_with_its_device) {
  require_vulkan();
  kvq_backend_info infos[4];
  size_t count = 0;
  cr_assert_eq(kvq_backends_list(infos, 4, &count), KVQ_OK);
  for (size_t i = 0; i < count; i++)
    if (infos[i].kind == KVQ_BACKEND_VULKAN) {
      cr_assert_str_eq(infos[i].name, "vulkan");
      cr_assert_str_empty(infos[i].reason);
      cr_assert_str_not_empty(infos[i].device);
    }
  kvq_context *ctx = vulkan_context();
  cr_assert_eq(kvq_context_backend(ctx), KVQ_BACKEND_VULKAN);
  kvq_context_destroy(ctx);
}

Test(vulkan, device_index_out_of_range_is_refused_with_a_reason) {
  require_vulkan();
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_VULKAN;
  opt.device_index = 1000;
  kvq_context *ctx = (kvq_context *)(uintptr_t)1;
  cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_ERROR_BACKEND_UNAVAILABLE);
  cr_assert_null(ctx);
}

Test(vulkan, incomplete_runtime_device_is_an_invalid_argument) {
  require_vulkan();
  kvq_vulkan_device device = {0};
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_VULKAN;
  opt.vulkan = &device;
  kvq_context *ctx = (kvq_context *)(uintptr_t)1;
  cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_null(ctx);
}

/* The automatic choice takes a GPU only: on a machine whose one Vulkan device is a CPU
 * implementation, AUTO picks kvq's own CPU reference. */
Test(vulkan, auto_never_picks_a_cpu_vulkan_device) {
  require_vulkan();
  kvq_backend_info infos[4];
  size_t count = 0;
  kvq_backends_list(infos, 4, &count);
  int llvmpipe = 0;
  for (size_t i = 0; i < count; i++) llvmpipe |= infos[i].kind == KVQ_BACKEND_VULKAN && strstr(infos[i].device, "llvmpipe");
  if (!llvmpipe) cr_skip_test("the Vulkan device here is not lavapipe (llvmpipe)");
  kvq_context *ctx = NULL;
  cr_assert_eq(kvq_context_create(NULL, &ctx), KVQ_OK);
  cr_assert_eq(kvq_context_backend(ctx), KVQ_BACKEND_CPU);
  kvq_context_destroy(ctx);
}

/* A cache larger than the device's largest storage buffer is refused with a status, not a crash,
 * before anything is allocated (core/memory_limits.c; tests/test_limits.c covers every backend). */
Test(vulkan, a_pool_beyond_the_device_limits_is_refused) {
  require_vulkan();
  kvq_context *ctx = vulkan_context();
  kvq_layer_config layer = th_layer(8, 8, 256, th_exact(KVQ_DTYPE_F32), th_exact(KVQ_DTYPE_F32));
  /* 8 heads x 256 channels x 4 bytes x 256 tokens = 2 MiB per page; 4096 pages = 8 GiB per side */
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 256, 0, 4096, 4, 1);
  kvq_cache *cache = (kvq_cache *)(uintptr_t)1;
  const kvq_status st = kvq_cache_create(ctx, &config, &cache);
  cr_assert(st == KVQ_ERROR_OUT_OF_RANGE, "got %s: %s", kvq_status_string(st), kvq_context_last_error(ctx));
  cr_assert_null(cache);
  cr_assert_str_not_empty(kvq_context_last_error(ctx));
  kvq_context_destroy(ctx);
}

/* ---- Submissions and host<->device traffic ---------------------------------------------------------- */

/* The keys, values and queries these tests attend with: fixed patterns in [-1, 1]. */
static void fill_kvq(float *k, float *v, size_t kv_count, float *q, size_t q_count) {
  for (size_t i = 0; i < kv_count; i++) k[i] = (float)((i * 37) % 101) / 50.0f - 1.0f, v[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
  for (size_t i = 0; i < q_count; i++) q[i] = (float)((i * 29) % 89) / 44.0f - 1.0f;
}

/* A cache of `config` on ctx with one sequence (*seq). */
static kvq_cache *cache_with_sequence(kvq_context *ctx, const kvq_cache_config *config, uint32_t *seq) {
  kvq_cache *cache = NULL;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, config, &cache));
  KVQ_CHECK(ctx, kvq_sequence_add(cache, seq));
  return cache;
}

/* The context's backend counters since the last call, reset. */
static kvq_backend_stats counted(kvq_context *ctx) {
  kvq_backend_stats s;
  cr_assert_eq(kvq_context_backend_stats(ctx, &s, 1), KVQ_OK);
  return s;
}

/*
 * An append larger than the staging buffer takes overflow staging buffers for the rest of its
 * recording (one submission per call). The context keeps them once the device is done with them
 * (KVQ_VK_SPARE_STAGES), so that the next large append reuses them instead of allocating host-visible
 * memory again: on lavapipe that took a 16k-token prefill's host time from 97 to 55 ms (UNIFORM 4-bit,
 * 8 kv heads, d 128). The staging buffer is shrunk to 64 KiB (KVQ_VULKAN_STAGING_BYTES) so that
 * appends of 256 KiB of keys and values take a few; what the reused buffers carried must not leak
 * into the second sequence's tokens.
 */
Test(vulkan, large_appends_reuse_overflow_staging) {
  require_vulkan();
  setenv("KVQ_VULKAN_STAGING_BYTES", "65536", 1);
  kvq_context *ctx = vulkan_context();
  unsetenv("KVQ_VULKAN_STAGING_BYTES");
  enum { HQ = 4, HKV = 2, D = 64, N = 256 };
  const kvq_method_config exact = kvq_method_defaults(KVQ_METHOD_EXACT, D);
  const kvq_layer_config layer = th_layer(HQ, HKV, D, exact, exact);
  const kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 0, 2 * N / 16 + 2, 2, 5);
  static float k[N * HKV * D], v[N * HKV * D], q[HQ * D], ka[N * HKV * D], kb[N * HKV * D];
  fill_kvq(k, v, N * HKV * D, q, HQ * D);
  kvq_cache *cache = NULL;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  uint32_t a, b;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &a));
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &b));
  (void)counted(ctx);
  th_append(ctx, cache, a, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
  const kvq_backend_stats first = counted(ctx);
  cr_assert(first.staging_overflows > 0, "the first append took no overflow staging: nothing tested");
  cr_assert_eq(first.staging_allocations, first.staging_overflows, "a fresh context had spare staging");
  /* b's keys are a's reversed in sign: a stale byte of a's staging would show */
  for (size_t i = 0; i < (size_t)N * HKV * D; i++) kb[i] = -k[i];
  th_append(ctx, cache, b, 0, kb, v, 0, N, HKV, D, KVQ_DTYPE_F32);
  const kvq_backend_stats second = counted(ctx);
  cr_assert_eq(second.staging_overflows, first.staging_overflows, "the second append's overflows: %llu, the first's %llu",
               (unsigned long long)second.staging_overflows, (unsigned long long)first.staging_overflows);
  cr_assert_eq(second.staging_allocations, 0u, "the second append allocated %llu overflow buffers of %llu",
               (unsigned long long)second.staging_allocations, (unsigned long long)second.staging_overflows);
  /* fp16 rounding is symmetric in sign: b's stored keys are exactly a's negated, its values a's */
  const int64_t shape[3] = {N, HKV, D};
  static float va[N * HKV * D], vb[N * HKV * D];
  kvq_tensor tka = kvq_tensor_host(ka, KVQ_DTYPE_F32, 3, shape), tva = kvq_tensor_host(va, KVQ_DTYPE_F32, 3, shape);
  kvq_tensor tkb = kvq_tensor_host(kb, KVQ_DTYPE_F32, 3, shape), tvb = kvq_tensor_host(vb, KVQ_DTYPE_F32, 3, shape);
  KVQ_CHECK(ctx, kvq_dequantize(cache, a, 0, 0, N, &tka, &tva));
  KVQ_CHECK(ctx, kvq_dequantize(cache, b, 0, 0, N, &tkb, &tvb));
  for (size_t i = 0; i < (size_t)N * HKV * D; i++) {
    cr_assert_eq(kb[i], -ka[i], "sequence b, key element %zu: %g, expected %g", i, (double)kb[i], (double)-ka[i]);
    cr_assert_eq(vb[i], va[i], "sequence b, value element %zu: %g, expected %g", i, (double)vb[i], (double)va[i]);
  }
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/*
 * Creating a cache, loading one and loading codebooks each upload their matrices, codebooks, pages
 * and windows in one queue submission (docs/VULKAN.md), not one per buffer, and saving one reads its
 * pages and windows back in one submission, not one per page and token: a cache with QJL keys
 * (sketch and outlier sketch) and PolarQuant values (rotation and tables) over two layers has eight
 * fixed arrays and, loaded, pages and windows besides.
 */
Test(vulkan, create_and_load_are_one_submission_each) {
  require_vulkan();
  kvq_context *ctx = vulkan_context();
  enum { HQ = 4, HKV = 2, D = 64, N = 40 };
  kvq_method_config qjl = kvq_method_defaults(KVQ_METHOD_QJL, D), polar = kvq_method_defaults(KVQ_METHOD_POLAR, D);
  kvq_layer_config layers[2] = {th_layer(HQ, HKV, D, qjl, polar), th_layer(HQ, HKV, D, qjl, polar)};
  kvq_cache_config config = th_config(layers, 2, KVQ_DTYPE_F32, 16, 16, 16, 1, 7);
  (void)counted(ctx);
  kvq_cache *cache = NULL;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  kvq_backend_stats s = counted(ctx);
  cr_assert_eq(s.submissions, 1u, "kvq_cache_create: %llu submissions", (unsigned long long)s.submissions);
  static float k[N * HKV * D], v[N * HKV * D], q[HQ * D];
  fill_kvq(k, v, N * HKV * D, q, HQ * D);
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  for (uint32_t l = 0; l < 2; l++) th_append(ctx, cache, seq, l, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
  uint64_t bytes = 0;
  KVQ_CHECK(ctx, kvq_cache_save_size(cache, &bytes));
  uint8_t *image = malloc((size_t)bytes);
  size_t written = 0;
  (void)counted(ctx);
  KVQ_CHECK(ctx, kvq_cache_save_to_memory(cache, image, (size_t)bytes, &written));
  s = counted(ctx);
  cr_assert_eq(s.submissions, 1u, "kvq_cache_save_to_memory: %llu submissions", (unsigned long long)s.submissions);
  kvq_cache *loaded = NULL;
  KVQ_CHECK(ctx, kvq_cache_load_from_memory(ctx, image, written, &loaded));
  s = counted(ctx);
  cr_assert_eq(s.submissions, 1u, "kvq_cache_load: %llu submissions", (unsigned long long)s.submissions);
  free(image);
  kvq_cache_destroy(loaded);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/*
 * A fence wait that fails (a hung or lost device; on a loaded 2-core machine llvmpipe compiling shaders
 * on first use has come near the 120 s limit) fails its call with KVQ_ERROR_DEVICE_LOST, and the
 * submission may still be running, so nothing it uses may be reset or freed until the context is
 * destroyed. Before this was handled the command pool was reset under the pending command buffer and
 * then reused: validation errors, then a crash. KVQ_VULKAN_FENCE_TIMEOUT_NS=0 makes every wait that
 * finds its job unfinished time out; PolarQuant appends of 256 tokens at head_dim 128 take
 * milliseconds on llvmpipe, so some wait within a few calls finds its job unfinished (the test fails
 * if none does). Every later call that submits must then fail the same way, and destroying the cache
 * and the context must be clean (AddressSanitizer and LeakSanitizer in this build).
 */
Test(vulkan, a_wait_that_times_out_fails_every_later_call_and_destroys_cleanly) {
  require_vulkan();
  cr_assert_eq(setenv("KVQ_VULKAN_FENCE_TIMEOUT_NS", "0", 1), 0); /* this test's own process (Criterion forks) */
  kvq_context *ctx = vulkan_context();
  enum { HQ = 4, HKV = 2, D = 128, N = 256, P = 16 };
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_polar(KVQ_ROTATION_DENSE), th_polar(KVQ_ROTATION_DENSE));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 0, 64, 1, 7);
  static float k[N * HKV * D], v[N * HKV * D], q[HQ * D], out[HQ * D];
  fill_kvq(k, v, N * HKV * D, q, HQ * D);
  const int64_t shape[3] = {N, HKV, D}, qshape[3] = {1, HQ, D};
  const kvq_tensor kt = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(v, KVQ_DTYPE_F32, 3, shape);
  kvq_cache *cache = NULL;
  uint32_t seq = 0;
  int live = 0; /* whether seq was added (adding one uploads its record: it may be the call that times out) */
  int appended = 0; /* appends that succeeded: with none (the first one timed out, which load makes likely),
                       attention is refused for want of tokens, an argument error the call itself returns */
  kvq_status st = kvq_cache_create(ctx, &config, &cache);
  if (st == KVQ_OK) st = kvq_sequence_add(cache, &seq), live = st == KVQ_OK;
  for (int call = 0; st == KVQ_OK && call < 16; call++)
    if ((st = kvq_append(cache, seq, 0, &kt, &vt)) == KVQ_OK) appended++;
  cr_assert_eq(st, KVQ_ERROR_DEVICE_LOST, "no wait timed out in 16 appends (status %d: %s)", (int)st, kvq_context_last_error(ctx));
  cr_assert_not_null(strstr(kvq_context_last_error(ctx), "VK_TIMEOUT"), "%s", kvq_context_last_error(ctx));
  /* later calls: creating a cache (always one submission), and with a live sequence an append and attention */
  kvq_cache *second = NULL;
  cr_assert_eq(kvq_cache_create(ctx, &config, &second), KVQ_ERROR_DEVICE_LOST, "a cache created after the timeout: %s",
               kvq_context_last_error(ctx));
  cr_assert_null(second);
  cr_assert_not_null(strstr(kvq_context_last_error(ctx), "did not finish"), "%s", kvq_context_last_error(ctx));
  if (live) {
    cr_assert_eq(kvq_append(cache, seq, 0, &kt, &vt), KVQ_ERROR_DEVICE_LOST, "an append after the timeout: %s",
                 kvq_context_last_error(ctx));
  }
  if (appended > 0) {
    kvq_attention_request req = {.sequence = seq, .queries = kvq_tensor_host(q, KVQ_DTYPE_F32, 3, qshape),
                                 .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape), .mask = KVQ_MASK_NONE};
    cr_assert_eq(kvq_attention(cache, 0, &req, 1), KVQ_ERROR_DEVICE_LOST, "attention after the timeout: %s",
                 kvq_context_last_error(ctx));
  }
  if (cache) kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/*
 * A decode loop with host tensors (docs/VULKAN.md, "What each call moves"): every kvq_append is one
 * submission that moves its tokens to the device (plus 16 bytes of metadata per side when a page is
 * quantized) and nothing back; every kvq_attention of one query is one submission, waited for once,
 * moving the query and the attention metadata up and exactly the output back.
 */
Test(vulkan, a_decode_step_with_host_tensors_is_one_submission) {
  require_vulkan();
  kvq_context *ctx = vulkan_context();
  enum { HQ = 4, HKV = 2, D = 64, N = 40, P = 16, W = 16 };
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_kivi(2, 16), th_uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, W, 16, 1, 7);
  static float k[N * HKV * D], v[N * HKV * D], q[HQ * D], out[HQ * D];
  fill_kvq(k, v, N * HKV * D, q, HQ * D);
  uint32_t seq;
  kvq_cache *cache = cache_with_sequence(ctx, &config, &seq);
  const int64_t qshape[3] = {1, HQ, D};
  kvq_attention_request req = {.sequence = seq, .queries = kvq_tensor_host(q, KVQ_DTYPE_F32, 3, qshape),
                               .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape), .mask = KVQ_MASK_CAUSAL};
  const uint64_t token_bytes = (uint64_t)HKV * D * 4;
  uint32_t ring_start = 0;
  for (uint32_t t = 0; t < N; t++) {
    (void)counted(ctx);
    th_append(ctx, cache, seq, 0, k, v, t, 1, HKV, D, KVQ_DTYPE_F32);
    kvq_backend_stats s = counted(ctx);
    const int quantizes = t + 1 - ring_start >= (uint32_t)(W + P);
    if (quantizes) ring_start += P;
    cr_assert_eq(s.submissions, 1u, "append of token %u: %llu submissions", t, (unsigned long long)s.submissions);
    cr_assert_eq(s.bytes_to_host, 0u, "append of token %u read %llu bytes back", t, (unsigned long long)s.bytes_to_host);
    cr_assert_eq(s.bytes_to_device, 2 * token_bytes + (quantizes ? 2 * 16u : 0u), "append of token %u moved %llu bytes", t,
                 (unsigned long long)s.bytes_to_device);
    KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
    s = counted(ctx);
    cr_assert_eq(s.submissions, 1u, "attention after token %u: %llu submissions", t, (unsigned long long)s.submissions);
    cr_assert_eq(s.waits, 1u, "attention after token %u: %llu waits", t, (unsigned long long)s.waits);
    cr_assert_eq(s.bytes_to_host, sizeof out, "attention after token %u read %llu bytes", t, (unsigned long long)s.bytes_to_host);
    cr_assert_geq(s.bytes_to_device, sizeof q, "attention after token %u moved %llu bytes up", t, (unsigned long long)s.bytes_to_device);
  }
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/*
 * Q-Hitter needs every token's quantization error on the host (core/policy.c), so an append that
 * quantizes pages reads the QUANTIZE job's errors back, for keys and for values: with the rest of the
 * append, in its one submission (docs/VULKAN.md), not one read of its own per side. Token by token
 * (appends that quantize one page per side, and those that quantize none) and then 40 tokens at once
 * (two pages per side), each kvq_append is one submission, and the result is the CPU reference's: the
 * same dequantized tokens bit for bit (KIVI and uniform codes are class 1, docs/ACCURACY.md), the
 * same statistics positions and lengths, and the same errors up to their fp32 arithmetic. An attention
 * of host tensors is one submission too, with the policy's sums read back in it, and so is a
 * kvq_dequantize of every token into host tensors.
 *
 * The error bound: the shader (shaders/quantize_errors.comp) rounds each difference x - x^ and its
 * square (3 u for the term, u = 2^-24), sums d terms in fp32 (gamma(d - 1) more), takes a sqrt (which
 * halves the relative error of its argument) that Vulkan allows within 3 ulp (6 u relative); the CPU
 * sums in double and rounds the root to fp32 (u). Summing the kv heads' positive terms keeps the
 * relative bound, and each side stores the sum in fp32 (u each): |e_vk - e_cpu| <= ((d + 2) / 2 + 9) u e_cpu
 * to first order. A stale, missing or swapped read is off by far more (or 0 where the CPU has errors).
 */
Test(vulkan, qhitter_appends_that_quantize_pages_are_one_submission) {
  require_vulkan();
  kvq_context *ctx = vulkan_context(), *cpu = th_cpu_context();
  enum { HQ = 4, HKV = 2, D = 64, STEPS = 50, CHUNK = 40, N = STEPS + CHUNK, P = 16, W = 16 };
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_kivi(2, 16), th_uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, W, 16, 1, 7);
  config.policy = kvq_policy_defaults(KVQ_POLICY_QHITTER);
  config.policy.heavy_fraction = 1.0f; /* keeps every token: no eviction, which near-ties could decide apart */
  static float k[N * HKV * D], v[N * HKV * D], q[1];
  fill_kvq(k, v, N * HKV * D, q, 1);
  uint32_t seq, cpu_seq;
  kvq_cache *cache = cache_with_sequence(ctx, &config, &seq), *ref = cache_with_sequence(cpu, &config, &cpu_seq);
  uint32_t ring_start = 0, quantizing = 0;
  for (uint32_t t = 0; t < N;) {
    const uint32_t count = t < STEPS ? 1 : CHUNK;
    (void)counted(ctx);
    th_append(ctx, cache, seq, 0, k, v, t, count, HKV, D, KVQ_DTYPE_F32);
    const kvq_backend_stats s = counted(ctx);
    th_append(cpu, ref, cpu_seq, 0, k, v, t, count, HKV, D, KVQ_DTYPE_F32);
    t += count;
    const int quantizes = t - ring_start >= (uint32_t)(W + P);
    while (t - ring_start >= (uint32_t)(W + P)) ring_start += P;
    quantizing += quantizes;
    cr_assert_eq(s.submissions, 1u, "append up to token %u (%s pages): %llu submissions", t, quantizes ? "quantizing" : "no",
                 (unsigned long long)s.submissions);
  }
  cr_assert_geq(quantizing, 3u, "%u appends quantized pages", quantizing);
  /* kvq_flush quantizes the window (one whole page and a partial one per side): one submission too,
   * and afterwards the tokens of whole pages carry errors, the partial page's none */
  (void)counted(ctx);
  KVQ_CHECK(ctx, kvq_flush(cache, seq));
  const kvq_backend_stats f = counted(ctx);
  KVQ_CHECK(cpu, kvq_flush(ref, cpu_seq));
  cr_assert_eq(f.submissions, 1u, "flush: %llu submissions", (unsigned long long)f.submissions);
  kvq_token_stats got[N], want[N];
  size_t n_got = 0, n_want = 0;
  KVQ_CHECK(ctx, kvq_sequence_token_stats(cache, seq, got, N, &n_got));
  KVQ_CHECK(cpu, kvq_sequence_token_stats(ref, cpu_seq, want, N, &n_want));
  cr_assert_eq(n_got, (size_t)N);
  cr_assert_eq(n_want, (size_t)N);
  const double bound = ((D + 2) / 2.0 + 9.0) * 0x1p-24;
  uint32_t with_errors = 0;
  for (uint32_t t = 0; t < N; t++) {
    cr_assert_eq(got[t].position, want[t].position);
    const double wk = want[t].key_error, wv = want[t].value_error;
    with_errors += wk > 0.0 && wv > 0.0;
    cr_assert(fabs(got[t].key_error - wk) <= bound * wk, "token %u: E^K %.9g on Vulkan, %.9g on the CPU", t,
              (double)got[t].key_error, wk);
    cr_assert(fabs(got[t].value_error - wv) <= bound * wv, "token %u: E^V %.9g on Vulkan, %.9g on the CPU", t,
              (double)got[t].value_error, wv);
  }
  cr_assert_eq(with_errors, N / P * P, "%u tokens with errors, %u in whole pages", with_errors, N / P * P);
  kvq_sequence_info info, cpu_info;
  KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seq, 0, &info));
  KVQ_CHECK(cpu, kvq_sequence_info_get(ref, cpu_seq, 0, &cpu_info));
  cr_assert_eq(info.tokens, cpu_info.tokens);
  cr_assert_eq(info.kept_tokens, cpu_info.kept_tokens);
  static float kd[2][N * HKV * D], vd[2][N * HKV * D];
  const int64_t shape[3] = {N, HKV, D};
  for (int b = 0; b < 2; b++) {
    const kvq_tensor kt = kvq_tensor_host(kd[b], KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(vd[b], KVQ_DTYPE_F32, 3, shape);
    (void)counted(ctx);
    KVQ_CHECK(b ? cpu : ctx, kvq_dequantize(b ? ref : cache, b ? cpu_seq : seq, 0, 0, N, &kt, &vt));
    const kvq_backend_stats d = counted(ctx);
    if (b == 0) /* the pages' and the window's tokens of both sides, read back with one wait */
      cr_assert_eq(d.submissions, 1u, "dequantize into host tensors: %llu submissions", (unsigned long long)d.submissions);
  }
  cr_assert_eq(memcmp(kd[0], kd[1], sizeof kd[0]), 0, "the Vulkan cache's keys are not the CPU's");
  cr_assert_eq(memcmp(vd[0], vd[1], sizeof vd[0]), 0, "the Vulkan cache's values are not the CPU's");
  /* An attention over it reads the output and the policy's probability sums back with one wait: every
   * token's A_t, 0 before, is then positive (the sums reached the host). */
  static float query[HQ * D], out[HQ * D];
  fill_kvq(kd[0], vd[0], 1, query, HQ * D);
  const int64_t qshape[3] = {1, HQ, D};
  kvq_attention_request req = {.sequence = seq, .queries = kvq_tensor_host(query, KVQ_DTYPE_F32, 3, qshape),
                               .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape), .mask = KVQ_MASK_CAUSAL};
  (void)counted(ctx);
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
  const kvq_backend_stats a = counted(ctx);
  cr_assert_eq(a.submissions, 1u, "attention: %llu submissions", (unsigned long long)a.submissions);
  cr_assert_eq(a.waits, 1u, "attention: %llu waits", (unsigned long long)a.waits);
  KVQ_CHECK(ctx, kvq_sequence_token_stats(cache, seq, got, N, &n_got));
  for (uint32_t t = 0; t < N; t++) cr_assert_gt(got[t].attention, 0.0, "token %u: A_t %g after an attention", t, got[t].attention);
  kvq_cache_destroy(ref);
  kvq_cache_destroy(cache);
  kvq_context_destroy(cpu);
  kvq_context_destroy(ctx);
}

/*
 * Page tables stay packed in core between calls (core/gpu_meta.c, docs/VULKAN.md): a decode step
 * after a one-token append packs (computes or compares) only the header, the sequence's record and
 * unit totals, and the page-table entries that changed (a page that joined, a page whose kept tokens
 * changed), not every listed page; and only those words cross to the device. Two sequences (so that
 * a page joining one moves nothing of the other) stream 700 tokens each through pages of 16 (43
 * listed pages at the end), one with a StreamingLLM policy whose evictions change kept-token masks
 * and return pages at the front of its table. Counted with kvq_context_meta_packed and the backend's
 * byte counter.
 */
Test(vulkan, decode_steps_pack_only_what_changed, .timeout = 240) {
  require_vulkan();
  kvq_context *ctx = vulkan_context();
  enum { HQ = 2, HKV = 1, D = 32, N = 700, P = 16, W = 16, S = 2 };
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_kivi(2, 16), th_uniform(4, 32));
  static float k[N * HKV * D], v[N * HKV * D], q[S * HQ * D], out[S * HQ * D];
  fill_kvq(k, v, N * HKV * D, q, S * HQ * D);
  for (int evicting = 0; evicting < 2; evicting++) {
    kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, W, 2 * N / P, S, 7);
    if (evicting) config.policy = kvq_policy_defaults(KVQ_POLICY_STREAMING), config.policy.recent = 160;
    kvq_cache *cache;
    KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
    uint32_t seqs[S];
    for (int i = 0; i < S; i++) KVQ_CHECK(ctx, kvq_sequence_add(cache, &seqs[i]));
    const int64_t qshape[3] = {1, HQ, D};
    kvq_attention_request req[S];
    for (int i = 0; i < S; i++)
      req[i] = (kvq_attention_request){.sequence = seqs[i], .queries = kvq_tensor_host(q + i * HQ * D, KVQ_DTYPE_F32, 3, qshape),
                                       .output = kvq_tensor_host(out + i * HQ * D, KVQ_DTYPE_F32, 3, qshape), .mask = KVQ_MASK_CAUSAL};
    /* every call: the header (11 words), the unit tables (7 (S + 1)) and the records (13 S); per
     * sequence its changed entries: a joined page (slot, page number, mask word: 3), under
     * StreamingLLM a mask word that changed (1) */
    const uint64_t fixed = 11 + 7 * (S + 1) + 13 * S, budget = fixed + 3 * 3 * S;
    uint64_t packed_total = 0, over = 0;
    for (uint32_t t = 0; t < N; t++) {
      for (int i = 0; i < S; i++) th_append(ctx, cache, seqs[i], 0, k, v, t, 1, HKV, D, KVQ_DTYPE_F32);
      (void)counted(ctx);
      KVQ_CHECK(ctx, kvq_attention(cache, 0, req, S));
      const kvq_backend_stats s = counted(ctx);
      const uint64_t packed = kvq_context_meta_packed(ctx);
      kvq_sequence_info info;
      KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seqs[0], 0, &info));
      packed_total += packed;
      /* metadata bytes: what crossed beyond the queries (host tensors: written through staging) */
      const uint64_t metadata = s.bytes_to_device - sizeof q;
      if (t == 0) continue; /* the first image goes whole */
      if (packed > budget) { /* a sequence outgrew its span (4, 8, 16, 32, 64 entries) or returned a page */
        over++;
        continue;
      }
      cr_assert_leq(metadata, 4u * budget, "step %u (%u pages): %llu bytes of metadata", t, info.pages, (unsigned long long)metadata);
    }
    /* without core's image every step packs every listed page: 3 words each, 700 steps, up to 43
     * pages per sequence, over 60000 words; here the steps that outgrow a span or return a page */
    cr_assert_leq(over, evicting ? 2u * N / P + 8 : 8u, "%llu steps packed more than the changed entries", (unsigned long long)over);
    cr_assert_leq(packed_total, (uint64_t)N * budget + over * (fixed + 3 * S * 64),
                  "%llu words packed in %d steps", (unsigned long long)packed_total, N);
    kvq_sequence_info info;
    KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seqs[0], 0, &info));
    cr_assert_geq(info.pages, evicting ? 10u : 40u, "%u pages listed at the end", info.pages);
    kvq_cache_destroy(cache);
  }
  kvq_context_destroy(ctx);
}

/* ---- The runtime's own device ----------------------------------------------------------------------- */

/* These tests create the runtime's side with volk, which only a build with the Vulkan backend has;
 * without it they skip like the others, saying the backend is not built. */
#ifdef KVQ_HAVE_VULKAN
#include <volk.h>

/* What a runtime would have: its instance, a physical device with a compute queue, a device; in
 * validation runs, the messenger that counts what the layer says about them. */
typedef struct runtime_device {
  VkInstance instance;
  VkPhysicalDevice physical;
  VkDevice device;
  uint32_t family;
  VkDebugUtilsMessengerEXT messenger;
} runtime_device;

/* Validation runs (KVQ_VULKAN_VALIDATION=1): kvq validates only the instances it creates, so the
 * runtime's instance enables the layer itself, with synchronization validation as kvq's has it
 * (backends/vulkan/vk_device.c), and the test fails on any warning or error the layer reports about
 * kvq's work on the runtime's device and buffers (runtime_stop). */
static unsigned runtime_messages;
static char runtime_first_message[1024];

static VKAPI_ATTR VkBool32 VKAPI_CALL runtime_on_validation(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                            VkDebugUtilsMessageTypeFlagsEXT types,
                                                            const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
  (void)types, (void)user;
  if (!(severity & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)))
    return VK_FALSE;
  const char *text = data && data->pMessage ? data->pMessage : "?";
  if (runtime_messages++ == 0) snprintf(runtime_first_message, sizeof runtime_first_message, "%s", text);
  fprintf(stderr, "runtime's validation layer: %s\n", text);
  return VK_FALSE;
}

static void runtime_start(runtime_device *r) {
  memset(r, 0, sizeof *r);
  cr_assert_eq(volkInitialize(), VK_SUCCESS);
  const char *v = getenv("KVQ_VULKAN_VALIDATION");
  const int validate = v && v[0] == '1';
  const char *layer = "VK_LAYER_KHRONOS_validation";
  const char *extensions[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME};
  VkDebugUtilsMessengerCreateInfoEXT messenger = {
      .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
      .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
      .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT,
      .pfnUserCallback = runtime_on_validation};
  const VkValidationFeatureEnableEXT enables[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  VkValidationFeaturesEXT features = {.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT, .pNext = &messenger,
                                      .enabledValidationFeatureCount = 1, .pEnabledValidationFeatures = enables};
  runtime_messages = 0;
  /* the layer stays loaded, as kvq keeps it for its own instances (keep_layer_loaded): LeakSanitizer
   * can then name the blocks it leaks (tests/sanitizers/lsan.supp) */
  void *loaded = validate ? dlopen("libVkLayer_khronos_validation.so", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) : NULL;
  if (loaded) dlclose(loaded);
  VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_2};
  VkInstanceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pNext = validate ? &features : NULL,
                               .pApplicationInfo = &app, .enabledLayerCount = validate ? 1 : 0,
                               .ppEnabledLayerNames = &layer, .enabledExtensionCount = validate ? 2 : 0,
                               .ppEnabledExtensionNames = extensions};
  cr_assert_eq(vkCreateInstance(&info, NULL, &r->instance), VK_SUCCESS);
  volkLoadInstanceOnly(r->instance);
  if (validate)
    cr_assert_eq(vkCreateDebugUtilsMessengerEXT(r->instance, &messenger, NULL, &r->messenger), VK_SUCCESS);
  uint32_t count = 1;
  const VkResult listed = vkEnumeratePhysicalDevices(r->instance, &count, &r->physical);
  cr_assert(listed == VK_SUCCESS || listed == VK_INCOMPLETE);
  cr_assert_eq(count, 1u);
  VkQueueFamilyProperties families[16];
  uint32_t fc = 16;
  vkGetPhysicalDeviceQueueFamilyProperties(r->physical, &fc, families);
  r->family = UINT32_MAX;
  for (uint32_t i = 0; i < fc && r->family == UINT32_MAX; i++)
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) r->family = i;
  cr_assert_neq(r->family, UINT32_MAX);
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = r->family,
                                   .queueCount = 1, .pQueuePriorities = &priority};
  VkDeviceCreateInfo dinfo = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1, .pQueueCreateInfos = &queue};
  cr_assert_eq(vkCreateDevice(r->physical, &dinfo, NULL, &r->device), VK_SUCCESS);
  volkLoadDevice(r->device); /* the runtime's own device functions; kvq keeps a table of its own */
}

/* The runtime shutting down: its device, then its instance; nothing may have been reported. */
static void runtime_stop(runtime_device *r) {
  vkDestroyDevice(r->device, NULL);
  if (r->messenger) vkDestroyDebugUtilsMessengerEXT(r->instance, r->messenger, NULL);
  vkDestroyInstance(r->instance, NULL);
  cr_assert_eq(runtime_messages, 0u, "the validation layer on the runtime's instance reported %u message(s), the first: %s",
               runtime_messages, runtime_first_message);
}

/* Creating a context on the runtime's device with `family` as its queue family. */
static kvq_status runtime_context(const runtime_device *r, uint32_t family, kvq_context **ctx) {
  kvq_vulkan_device handed = {r->instance, r->physical, r->device, family, 0};
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_VULKAN;
  opt.vulkan = &handed;
  return kvq_context_create(&opt, ctx);
}

/* Attention on a cache of the runtime's device equals attention on kvq's own Vulkan device, bit for
 * bit (same device, same shaders), and the runtime's device outlives the context, still usable. */
Test(vulkan, runs_on_the_runtimes_device) {
  require_vulkan();
  runtime_device r;
  runtime_start(&r);
  kvq_context *theirs = NULL, *ours = vulkan_context();
  cr_assert_eq(runtime_context(&r, r.family, &theirs), KVQ_OK);
  enum { HQ = 4, HKV = 2, D = 64, N = 40 };
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_kivi(2, 16), th_uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 16, 16, 2, 7);
  static float k[N * HKV * D], v[N * HKV * D], q[HQ * D], out[2][HQ * D];
  for (int i = 0; i < N * HKV * D; i++) k[i] = (float)((i * 37) % 101) / 50.0f - 1.0f, v[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
  for (int i = 0; i < HQ * D; i++) q[i] = (float)((i * 29) % 89) / 44.0f - 1.0f;
  kvq_context *ctxs[2] = {theirs, ours};
  for (int c = 0; c < 2; c++) {
    kvq_cache *cache = NULL;
    uint32_t seq;
    KVQ_CHECK(ctxs[c], kvq_cache_create(ctxs[c], &config, &cache));
    KVQ_CHECK(ctxs[c], kvq_sequence_add(cache, &seq));
    th_append(ctxs[c], cache, seq, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
    int64_t qshape[3] = {1, HQ, D};
    kvq_attention_request req = {.sequence = seq, .queries = kvq_tensor_host(q, KVQ_DTYPE_F32, 3, qshape),
                                 .output = kvq_tensor_host(out[c], KVQ_DTYPE_F32, 3, qshape), .mask = KVQ_MASK_CAUSAL};
    KVQ_CHECK(ctxs[c], kvq_attention(cache, 0, &req, 1));
    kvq_cache_destroy(cache);
  }
  cr_assert_eq(memcmp(out[0], out[1], sizeof out[0]), 0, "the same device and shaders give the same bits");
  kvq_context_destroy(theirs);
  kvq_context_destroy(ours);
  cr_assert_eq(vkDeviceWaitIdle(r.device), VK_SUCCESS, "kvq left the runtime's device usable");
  runtime_stop(&r);
}

Test(vulkan, a_queue_the_device_lacks_is_an_invalid_argument) {
  require_vulkan();
  runtime_device r;
  runtime_start(&r);
  kvq_context *ctx = (kvq_context *)(uintptr_t)1;
  cr_assert_eq(runtime_context(&r, 999, &ctx), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_null(ctx);
  runtime_stop(&r);
}

/* ---- Caller VkBuffers as tensors -------------------------------------------------------------------- */

/* A host-visible VkBuffer of the runtime's device, mapped, holding `bytes`. */
typedef struct runtime_buffer {
  VkBuffer buffer;
  VkDeviceMemory memory;
  void *mapped;
} runtime_buffer;

/* A runtime started, and a context on its device and compute queue. */
static kvq_context *runtime_with_context(runtime_device *r) {
  runtime_start(r);
  kvq_context *ctx = NULL;
  cr_assert_eq(runtime_context(r, r->family, &ctx), KVQ_OK);
  return ctx;
}

/* Frees `count` runtime buffers. */
static void runtime_buffers_free(const runtime_device *r, runtime_buffer *const *buffers, int count);

static runtime_buffer runtime_buffer_make(const runtime_device *r, const void *data, size_t bytes) {
  runtime_buffer rb = {0};
  VkBufferCreateInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes,
                             .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                      VK_BUFFER_USAGE_STORAGE_BUFFER_BIT};
  cr_assert_eq(vkCreateBuffer(r->device, &info, NULL, &rb.buffer), VK_SUCCESS);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(r->device, rb.buffer, &req);
  VkPhysicalDeviceMemoryProperties mp;
  vkGetPhysicalDeviceMemoryProperties(r->physical, &mp);
  const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  uint32_t type = UINT32_MAX;
  for (uint32_t i = 0; i < mp.memoryTypeCount && type == UINT32_MAX; i++)
    if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) type = i;
  cr_assert_neq(type, UINT32_MAX);
  VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = type};
  cr_assert_eq(vkAllocateMemory(r->device, &alloc, NULL, &rb.memory), VK_SUCCESS);
  cr_assert_eq(vkBindBufferMemory(r->device, rb.buffer, rb.memory, 0), VK_SUCCESS);
  cr_assert_eq(vkMapMemory(r->device, rb.memory, 0, VK_WHOLE_SIZE, 0, &rb.mapped), VK_SUCCESS);
  if (data) memcpy(rb.mapped, data, bytes);
  else memset(rb.mapped, 0x5a, bytes);
  return rb;
}

static void runtime_buffer_free(const runtime_device *r, runtime_buffer *rb) {
  vkUnmapMemory(r->device, rb->memory);
  vkDestroyBuffer(r->device, rb->buffer, NULL);
  vkFreeMemory(r->device, rb->memory, NULL);
}

static void runtime_buffers_free(const runtime_device *r, runtime_buffer *const *buffers, int count) {
  for (int i = 0; i < count; i++) runtime_buffer_free(r, buffers[i]);
}

static kvq_tensor device_tensor(const runtime_buffer *rb, uint64_t offset, kvq_dtype dtype, const int64_t shape[3],
                                const int64_t strides[3]) {
  kvq_tensor t = kvq_tensor_vulkan((uint64_t)(uintptr_t)rb->buffer, offset, dtype, 3, shape);
  if (strides) memcpy(t.strides, strides, 3 * sizeof strides[0]);
  return t;
}

/*
 * Keys, values and queries in the runtime's VkBuffers (fp16, at an offset) and the output in one too,
 * strided with gaps: the same bits as host tensors on the same context, the gaps untouched, and the
 * input buffers unchanged.
 */
Test(vulkan, runtime_vkbuffers_as_inputs_and_outputs) {
  require_vulkan();
  runtime_device r;
  kvq_context *ctx = runtime_with_context(&r);
  enum { HQ = 8, HKV = 2, D = 64, N = 37, NQ = 2, OFFSET = 6 };
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_kivi(2, 16), th_uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F16, 16, 16, 16, 2, 3);
  static float k[N * HKV * D], v[N * HKV * D], q[NQ * HQ * D], host_out[NQ * HQ * D];
  for (int i = 0; i < N * HKV * D; i++) k[i] = (float)((i * 37) % 101) / 50.0f - 1.0f, v[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
  for (int i = 0; i < NQ * HQ * D; i++) q[i] = (float)((i * 29) % 89) / 44.0f - 1.0f;
  void *ks = NULL, *vs = NULL, *qs = NULL;
  kvq_tensor kt = th_tensor_from_f32(k, KVQ_DTYPE_F16, N, HKV, D, &ks);
  kvq_tensor vt = th_tensor_from_f32(v, KVQ_DTYPE_F16, N, HKV, D, &vs);
  kvq_tensor qt = th_tensor_from_f32(q, KVQ_DTYPE_F16, NQ, HQ, D, &qs);
  uint8_t staging[2 * N * HKV * D + OFFSET];
  runtime_buffer kb, vb, qb, ob;
  memset(staging, 0, OFFSET), memcpy(staging + OFFSET, ks, 2 * N * HKV * D);
  kb = runtime_buffer_make(&r, staging, sizeof staging);
  memcpy(staging + OFFSET, vs, 2 * N * HKV * D);
  vb = runtime_buffer_make(&r, staging, sizeof staging);
  qb = runtime_buffer_make(&r, qs, 2 * NQ * HQ * D);
  /* output rows of HQ * (D + 8) floats: the 8 floats after each head are a gap */
  const int64_t oshape[3] = {NQ, HQ, D}, ostrides[3] = {HQ * (D + 8), D + 8, 1};
  ob = runtime_buffer_make(&r, NULL, 4 * NQ * HQ * (D + 8));
  const int64_t kshape[3] = {N, HKV, D}, qshape[3] = {NQ, HQ, D};

  kvq_cache *cache[2];
  uint32_t seq[2];
  for (int c = 0; c < 2; c++) {
    KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache[c]));
    KVQ_CHECK(ctx, kvq_sequence_add(cache[c], &seq[c]));
  }
  KVQ_CHECK(ctx, kvq_append(cache[0], seq[0], 0, &kt, &vt));
  kvq_tensor kd = device_tensor(&kb, OFFSET, KVQ_DTYPE_F16, kshape, NULL), vd = device_tensor(&vb, OFFSET, KVQ_DTYPE_F16, kshape, NULL);
  KVQ_CHECK(ctx, kvq_append(cache[1], seq[1], 0, &kd, &vd));
  kvq_attention_request host_req = {.sequence = seq[0], .mask = KVQ_MASK_NONE, .queries = qt,
                                    .output = kvq_tensor_host(host_out, KVQ_DTYPE_F32, 3, oshape)};
  kvq_attention_request dev_req = {.sequence = seq[1], .mask = KVQ_MASK_NONE,
                                   .queries = device_tensor(&qb, 0, KVQ_DTYPE_F16, qshape, NULL),
                                   .output = device_tensor(&ob, 0, KVQ_DTYPE_F32, oshape, ostrides)};
  KVQ_CHECK(ctx, kvq_attention(cache[0], 0, &host_req, 1));
  KVQ_CHECK(ctx, kvq_attention(cache[1], 0, &dev_req, 1));
  const float *o = ob.mapped;
  const uint8_t *raw = ob.mapped;
  for (int r0 = 0; r0 < NQ; r0++)
    for (int h = 0; h < HQ; h++) {
      const size_t at = (size_t)(r0 * HQ + h) * (D + 8);
      cr_assert_eq(memcmp(o + at, host_out + (r0 * HQ + h) * D, 4 * D), 0, "row %d head %d differs", r0, h);
      for (int g = 0; g < 4 * 8; g++) cr_assert_eq(raw[4 * (at + D) + g], 0x5a, "the gap after row %d head %d was written", r0, h);
    }
  cr_assert_eq(memcmp((uint8_t *)kb.mapped + OFFSET, ks, 2 * N * HKV * D), 0, "the key buffer is an input: unchanged");

  /* a VkBuffer tensor without a buffer, and on a CPU context */
  kvq_tensor bad = device_tensor(&qb, 0, KVQ_DTYPE_F16, qshape, NULL);
  bad.handle = 0;
  dev_req.queries = bad;
  cr_assert_eq(kvq_attention(cache[1], 0, &dev_req, 1), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(kvq_context_last_error(ctx), "handle"), "%s", kvq_context_last_error(ctx));
  kvq_context *cpu = th_cpu_context();
  kvq_cache *cpu_cache;
  uint32_t cpu_seq;
  KVQ_CHECK(cpu, kvq_cache_create(cpu, &config, &cpu_cache));
  KVQ_CHECK(cpu, kvq_sequence_add(cpu_cache, &cpu_seq));
  cr_assert_eq(kvq_append(cpu_cache, cpu_seq, 0, &kd, &vd), KVQ_ERROR_UNSUPPORTED);
  cr_assert(strstr(kvq_context_last_error(cpu), "vulkan"), "%s", kvq_context_last_error(cpu));
  kvq_cache_destroy(cpu_cache);
  kvq_context_destroy(cpu);

  for (int c = 0; c < 2; c++) kvq_cache_destroy(cache[c]);
  kvq_context_destroy(ctx);
  runtime_buffer *all[] = {&kb, &vb, &qb, &ob};
  runtime_buffers_free(&r, all, 4);
  free(ks), free(vs), free(qs);
  runtime_stop(&r);
}

/*
 * The decode loop of a runtime that keeps everything on its device: keys, values and queries in its
 * VkBuffers (fp16 keys and values, fp32 queries), each step's output written into row t of an fp32
 * VkBuffer, counted with the backend's counters against docs/VULKAN.md ("What each call moves"):
 *   - every kvq_attention and every kvq_append is exactly one queue submission: a synchronous append
 *     records its writes behind the device checks of its keys and values and reads the check word
 *     once, at the end (a refused append writes nothing: refused_device_append_changes_nothing);
 *   - nothing comes back to the host but the 4-byte check word, once per synchronous call (nothing
 *     at all in the asynchronous mode);
 *   - an append moves 64 bytes of conversion metadata per side, and 16 per side when it quantizes a
 *     page; an attention 64 bytes per conversion (2: the output's write is a plain copy of fp32
 *     words, without metadata) and only the attention metadata words that changed since the
 *     previous step: at most 32 bytes, 12 more when a page joined the list (the whole metadata the
 *     first time, and when the sequence outgrows its span of the page arrays).
 * `async` runs the context asynchronously, waiting only at the end, and checks that the calls
 * returned without waiting for their own work. The outputs are left in `ob`.
 */
enum { DL_HQ = 4, DL_HKV = 2, DL_D = 64, DL_N = 160, DL_P = 16, DL_W = 16 };
static void decode_loop(const runtime_device *r, const runtime_buffer *kb, const runtime_buffer *vb, const runtime_buffer *qb,
                        const runtime_buffer *ob, int async) {
  kvq_context *ctx = NULL;
  cr_assert_eq(runtime_context(r, r->family, &ctx), KVQ_OK);
  KVQ_CHECK(ctx, kvq_context_set_async(ctx, async));
  kvq_layer_config layer = th_layer(DL_HQ, DL_HKV, DL_D, th_kivi(2, 16), th_uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F16, DL_P, DL_W, 16, 1, 5);
  uint32_t seq;
  kvq_cache *cache = cache_with_sequence(ctx, &config, &seq);
  const int64_t kshape[3] = {1, DL_HKV, DL_D}, qshape[3] = {1, DL_HQ, DL_D};
  uint64_t waits = 0;
  uint32_t ring_start = 0;
  for (uint32_t t = 0; t < DL_N; t++) {
    kvq_tensor kt = device_tensor(kb, 2ull * t * DL_HKV * DL_D, KVQ_DTYPE_F16, kshape, NULL);
    kvq_tensor vt = device_tensor(vb, 2ull * t * DL_HKV * DL_D, KVQ_DTYPE_F16, kshape, NULL);
    kvq_attention_request req = {.sequence = seq, .mask = KVQ_MASK_CAUSAL,
                                 .queries = device_tensor(qb, 4ull * t * DL_HQ * DL_D, KVQ_DTYPE_F32, qshape, NULL),
                                 .output = device_tensor(ob, 4ull * t * DL_HQ * DL_D, KVQ_DTYPE_F32, qshape, NULL)};
    (void)counted(ctx);
    KVQ_CHECK(ctx, kvq_append(cache, seq, 0, &kt, &vt));
    const kvq_backend_stats a = counted(ctx);
    KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
    const kvq_backend_stats s = counted(ctx);
    /* docs/VULKAN.md, "What each call moves" */
    const int quantizes = t + 1 - ring_start >= (uint32_t)(DL_W + DL_P);
    if (quantizes) ring_start += DL_P;
    cr_assert_eq(a.submissions, 1u, "append %u: %llu submissions", t, (unsigned long long)a.submissions);
    cr_assert_eq(s.submissions, 1u, "attention %u: %llu submissions", t, (unsigned long long)s.submissions);
    cr_assert_eq(a.bytes_to_host, async ? 0u : 4u, "append %u read back %llu bytes", t, (unsigned long long)a.bytes_to_host);
    cr_assert_eq(s.bytes_to_host, async ? 0u : 4u, "attention %u read back %llu bytes", t, (unsigned long long)s.bytes_to_host);
    cr_assert_eq(a.bytes_to_device, 2 * 64u + (quantizes ? 2 * 16u : 0u), "append %u moved %llu bytes", t,
                 (unsigned long long)a.bytes_to_device);
    /* two conversions (the queries' gather, the output's check), the output's write a plain copy of
     * fp32 words (COPY_WORDS: its push constants say everything), then only the attention metadata
     * words that changed since the last step: the sequence's record and unit totals, and when the
     * page list grew the page tables behind it */
    const uint64_t metadata = s.bytes_to_device - 2 * 64u;
    cr_assert_geq(s.bytes_to_device, 2 * 64u, "attention %u moved %llu bytes", t, (unsigned long long)s.bytes_to_device);
    const uint64_t listed = ring_start / DL_P; /* pages the attention lists */
    /* core keeps the page lists packed (core/gpu_meta.c): a page that joins is its 3 words, unless
     * the sequence outgrows its span of the page arrays (4, 8, 16 entries): then the whole image
     * (38 words and 3 per entry of the new span) */
    const int outgrows = quantizes && listed > 4 && ((listed - 1) & (listed - 2)) == 0;
    if (t > 0)
      cr_assert_leq(metadata, quantizes ? (outgrows ? 4u * (38u + 3u * 2u * (listed - 1)) : 48u + 12u) : 32u,
                    "attention %u moved %llu bytes of metadata (%llu pages listed)", t, (unsigned long long)metadata,
                    (unsigned long long)listed);
    waits += a.waits + s.waits;
  }
  if (async) {
    /* each call waits for the previous one's work before recording (one command buffer), never for its own */
    cr_assert_leq(waits, 2u * DL_N - 1, "asynchronous calls waited %llu times in %d calls", (unsigned long long)waits, 2 * DL_N);
    KVQ_CHECK(ctx, kvq_context_wait(ctx));
  } else {
    cr_assert_eq(waits, 2u * DL_N, "synchronous calls waited %llu times in %d calls", (unsigned long long)waits, 2 * DL_N);
  }
  KVQ_CHECK(ctx, kvq_context_wait(ctx)); /* nothing in flight: returns at once */
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/* A device-resident decode loop is one submission per call and moves only the documented bytes, and
 * the asynchronous mode gives the same bytes as the synchronous one. */
Test(vulkan, device_resident_decode_loop_sync_and_async) {
  require_vulkan();
  runtime_device r;
  runtime_start(&r);
  enum { TOK = DL_N * DL_HKV * DL_D, QN = DL_N * DL_HQ * DL_D };
  static float k[TOK], v[TOK], q[QN];
  fill_kvq(k, v, TOK, q, QN);
  void *ks = NULL, *vs = NULL;
  (void)th_tensor_from_f32(k, KVQ_DTYPE_F16, DL_N, DL_HKV, DL_D, &ks);
  (void)th_tensor_from_f32(v, KVQ_DTYPE_F16, DL_N, DL_HKV, DL_D, &vs);
  runtime_buffer kb = runtime_buffer_make(&r, ks, 2 * TOK), vb = runtime_buffer_make(&r, vs, 2 * TOK);
  runtime_buffer qb = runtime_buffer_make(&r, q, sizeof q);
  runtime_buffer ob[2] = {runtime_buffer_make(&r, NULL, sizeof q), runtime_buffer_make(&r, NULL, sizeof q)};
  decode_loop(&r, &kb, &vb, &qb, &ob[0], 0);
  decode_loop(&r, &kb, &vb, &qb, &ob[1], 1);
  for (size_t i = 0; i < sizeof q; i++)
    cr_assert_eq(((const uint8_t *)ob[0].mapped)[i], ((const uint8_t *)ob[1].mapped)[i], "output byte %zu (step %zu) differs", i,
                 i / (4 * DL_HQ * DL_D));
  const float *o = ob[0].mapped;
  cr_assert(o[0] != 0.0f && isfinite(o[0]) && o[QN - 1] != 0.0f && isfinite(o[QN - 1]), "outputs were written");
  runtime_buffer *all[] = {&kb, &vb, &qb, &ob[0], &ob[1]};
  runtime_buffers_free(&r, all, 5);
  free(ks), free(vs);
  runtime_stop(&r);
}

/*
 * The finite-value checks of device tensors run on the device (docs/VULKAN.md): a non-finite query
 * makes kvq_attention fail with KVQ_ERROR_NON_FINITE and leaves the output untouched, synchronously
 * from the call, asynchronously from kvq_context_wait; a clean call afterwards succeeds and writes.
 * A non-finite appended device key makes a synchronous kvq_append fail with KVQ_ERROR_NON_FINITE
 * before it changes anything, as host tensors do (the sequence keeps its tokens). The CPU backend accepts the mode and
 * its wait returns at once.
 */
Test(vulkan, device_checks_report_non_finite_values) {
  require_vulkan();
  runtime_device r;
  kvq_context *ctx = runtime_with_context(&r);
  enum { HQ = 4, HKV = 2, D = 64, N = 20 };
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_kivi(2, 16), th_uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 16, 16, 1, 3);
  static float k[N * HKV * D], v[N * HKV * D], q[HQ * D];
  fill_kvq(k, v, N * HKV * D, q, HQ * D);
  uint32_t seq;
  kvq_cache *cache = cache_with_sequence(ctx, &config, &seq);
  th_append(ctx, cache, seq, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
  q[5] = NAN;
  runtime_buffer qb = runtime_buffer_make(&r, q, sizeof q), ob = runtime_buffer_make(&r, NULL, sizeof q);
  const int64_t qshape[3] = {1, HQ, D};
  kvq_attention_request req = {.sequence = seq, .mask = KVQ_MASK_CAUSAL, .queries = device_tensor(&qb, 0, KVQ_DTYPE_F32, qshape, NULL),
                               .output = device_tensor(&ob, 0, KVQ_DTYPE_F32, qshape, NULL)};
  const uint8_t *out = ob.mapped;
  for (int async = 0; async < 2; async++) {
    KVQ_CHECK(ctx, kvq_context_set_async(ctx, async));
    const kvq_status st = kvq_attention(cache, 0, &req, 1);
    if (!async) {
      cr_assert_eq(st, KVQ_ERROR_NON_FINITE, "got %s", kvq_status_string(st));
    } else {
      cr_assert_eq(st, KVQ_OK, "the check runs on the device: reported at the wait");
      cr_assert_eq(kvq_context_wait(ctx), KVQ_ERROR_NON_FINITE);
    }
    cr_assert(strstr(kvq_context_last_error(ctx), "non-finite"), "%s", kvq_context_last_error(ctx));
    for (size_t i = 0; i < sizeof q; i++) cr_assert_eq(out[i], 0x5a, "output byte %zu was written", i);
    cr_assert_eq(kvq_context_wait(ctx), KVQ_OK, "reported once");
  }
  ((float *)qb.mapped)[5] = 0.5f;
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &req, 1));
  KVQ_CHECK(ctx, kvq_context_wait(ctx));
  cr_assert(out[0] != 0x5a || out[1] != 0x5a, "a clean call writes its output");
  KVQ_CHECK(ctx, kvq_context_set_async(ctx, 0));
  /* an appended key with an infinity */
  const int64_t kshape[3] = {1, HKV, D};
  k[3] = INFINITY;
  runtime_buffer kb = runtime_buffer_make(&r, k, 4 * HKV * D), vb = runtime_buffer_make(&r, v, 4 * HKV * D);
  kvq_tensor kt = device_tensor(&kb, 0, KVQ_DTYPE_F32, kshape, NULL), vt = device_tensor(&vb, 0, KVQ_DTYPE_F32, kshape, NULL);
  kvq_sequence_info before, after;
  KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seq, 0, &before));
  cr_assert_eq(kvq_append(cache, seq, 0, &kt, &vt), KVQ_ERROR_NON_FINITE);
  cr_assert(strstr(kvq_context_last_error(ctx), "kvq_append"), "%s", kvq_context_last_error(ctx));
  KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seq, 0, &after));
  cr_assert(before.tokens == after.tokens && before.quantized_tokens == after.quantized_tokens && before.pages == after.pages &&
                before.kept_tokens == after.kept_tokens,
            "a refused append changed the sequence (%llu -> %llu tokens)", (unsigned long long)before.tokens,
            (unsigned long long)after.tokens);
  k[3] = 0.25f; /* the same tokens, clean, append */
  memcpy(kb.mapped, k, 4 * HKV * D);
  KVQ_CHECK(ctx, kvq_append(cache, seq, 0, &kt, &vt));
  KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seq, 0, &after));
  cr_assert_eq(after.tokens, before.tokens + 1, "the clean append took place");
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  kvq_context *cpu = th_cpu_context();
  KVQ_CHECK(cpu, kvq_context_set_async(cpu, 1));
  cr_assert_eq(kvq_context_wait(cpu), KVQ_OK);
  cr_assert_eq(kvq_context_wait(NULL), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(kvq_context_set_async(NULL, 1), KVQ_ERROR_INVALID_ARGUMENT);
  kvq_context_destroy(cpu);
  runtime_buffer *all[] = {&qb, &ob, &kb, &vb};
  runtime_buffers_free(&r, all, 4);
  runtime_stop(&r);
}

/*
 * 16-bit queries and outputs in place: bf16 queries and an fp16 output whose rows have a one-element
 * gap (so neighbouring 16-bit halves of a word belong to an output element and to the gap), against
 * the same dtypes in host tensors on the same context: the same bytes, the gaps untouched.
 */
Test(vulkan, half_precision_device_queries_and_outputs) {
  require_vulkan();
  runtime_device r;
  kvq_context *ctx = runtime_with_context(&r);
  enum { HQ = 4, HKV = 2, D = 64, N = 40, NQ = 3, ROW = HQ * D + 1 };
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_kivi(2, 16), th_uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 16, 16, 1, 9);
  static float k[N * HKV * D], v[N * HKV * D], q[NQ * HQ * D];
  fill_kvq(k, v, N * HKV * D, q, NQ * HQ * D);
  uint32_t seq;
  kvq_cache *cache = cache_with_sequence(ctx, &config, &seq);
  th_append(ctx, cache, seq, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
  void *qs = NULL;
  kvq_tensor qt = th_tensor_from_f32(q, KVQ_DTYPE_BF16, NQ, HQ, D, &qs);
  static uint16_t host_out[NQ * HQ * D];
  const int64_t shape[3] = {NQ, HQ, D}, ostrides[3] = {ROW, D, 1};
  runtime_buffer qb = runtime_buffer_make(&r, qs, 2 * NQ * HQ * D), ob = runtime_buffer_make(&r, NULL, 2 * NQ * ROW + 2);
  kvq_attention_request host_req = {.sequence = seq, .mask = KVQ_MASK_CAUSAL, .queries = qt,
                                    .output = kvq_tensor_host(host_out, KVQ_DTYPE_F16, 3, shape)};
  kvq_attention_request dev_req = {.sequence = seq, .mask = KVQ_MASK_CAUSAL,
                                   .queries = device_tensor(&qb, 0, KVQ_DTYPE_BF16, shape, NULL),
                                   .output = device_tensor(&ob, 0, KVQ_DTYPE_F16, shape, ostrides)};
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &host_req, 1));
  (void)counted(ctx);
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &dev_req, 1));
  cr_assert_eq(counted(ctx).bytes_to_host, 4u, "read in place: only the check word comes back");
  const uint16_t *o = ob.mapped;
  for (int row = 0; row < NQ; row++) {
    cr_assert_eq(memcmp(o + row * ROW, host_out + row * HQ * D, 2 * HQ * D), 0, "row %d differs", row);
    cr_assert_eq(o[row * ROW + HQ * D], 0x5a5a, "the gap after row %d was written", row);
  }
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  runtime_buffer *all[] = {&qb, &ob};
  runtime_buffers_free(&r, all, 2);
  free(qs);
  runtime_stop(&r);
}

/*
 * kvq_scores and kvq_dequantize into the runtime's VkBuffers, in place (docs/VULKAN.md): on a
 * StreamingLLM cache whose evictions leave the kept tokens in several runs of slots, with a window
 * that wraps in its ring (tokens 48..69 in ring slots 16..31 and 0..5) and fp16 input. Logits (fp16, rows with a one-element gap, causal: the
 * first query row's masked entries are -inf), probabilities (fp32) and dequantized keys (fp32,
 * strided) and values (fp16), each against the same call with host tensors of the same dtypes on
 * the same context: the same bytes, the gaps untouched. Each device call is one submission that
 * brings back nothing but the 4-byte check word (none for fp32-only dequantized tokens: the host
 * path checks nothing there either) and moves up only its conversions' 64 bytes each and its jobs'
 * metadata; the staging path read the whole tensor back and wrote it again. Logits beyond fp16
 * fail with KVQ_ERROR_NON_FINITE and write nothing, as with host tensors.
 */
Test(vulkan, scores_and_dequantize_into_device_tensors) {
  require_vulkan();
  runtime_device r;
  kvq_context *ctx = runtime_with_context(&r);
  enum { HQ = 4, HKV = 2, D = 64, N = 70, P = 16, W = 16, NQ = 3 }; /* NQ odd: the fp16 logits end on a word */
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_kivi(2, 16), th_uniform(4, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F16, P, W, 16, 1, 13);
  config.policy = kvq_policy_defaults(KVQ_POLICY_STREAMING);
  config.policy.recent = W + P;
  static float k[N * HKV * D], v[N * HKV * D], q[NQ * HQ * D];
  fill_kvq(k, v, N * HKV * D, q, NQ * HQ * D);
  uint32_t seq;
  kvq_cache *cache = cache_with_sequence(ctx, &config, &seq);
  for (uint32_t t = 0; t < N; t++) th_append(ctx, cache, seq, 0, k, v, t, 1, HKV, D, KVQ_DTYPE_F16);
  uint32_t positions[N];
  size_t kept = 0;
  KVQ_CHECK(ctx, kvq_sequence_positions(cache, seq, 0, positions, N, &kept));
  cr_assert_lt(kept, (size_t)N, "the policy evicted tokens");
  size_t runs = 1; /* runs of consecutive positions: at least as many as runs of slots */
  for (size_t j = 1; j < kept; j++) runs += positions[j] != positions[j - 1] + 1;
  cr_assert_gt(runs, 1u, "the kept tokens lie in several runs");
  const uint32_t n = (uint32_t)kept, LROW = HQ * n + 1;
  /* logits fp16 [NQ][HQ][n] with rows of LROW; probabilities fp32; keys fp32 with rows of TROW floats */
  enum { TROW = HKV * D + 4 };
  const int64_t qshape[3] = {NQ, HQ, D}, sshape[3] = {NQ, HQ, n}, lstrides[3] = {LROW, n, 1};
  const int64_t tshape[3] = {n, HKV, D}, kstrides[3] = {TROW, D, 1};
  uint16_t *host_logits = malloc(2 * NQ * HQ * n), *host_values = malloc(2 * n * HKV * D);
  float *host_probs = malloc(4 * NQ * HQ * n), *host_keys = malloc(4 * n * HKV * D);
  runtime_buffer qb = runtime_buffer_make(&r, q, sizeof q), lb = runtime_buffer_make(&r, NULL, 2 * NQ * LROW + 2);
  runtime_buffer pb = runtime_buffer_make(&r, NULL, 4 * NQ * HQ * n), kb = runtime_buffer_make(&r, NULL, 4 * n * TROW);
  runtime_buffer vb = runtime_buffer_make(&r, NULL, 2 * n * HKV * D);
  kvq_tensor qh = kvq_tensor_host(q, KVQ_DTYPE_F32, 3, qshape), qd = device_tensor(&qb, 0, KVQ_DTYPE_F32, qshape, NULL);
  kvq_tensor lh = kvq_tensor_host(host_logits, KVQ_DTYPE_F16, 3, sshape), ld = device_tensor(&lb, 0, KVQ_DTYPE_F16, sshape, lstrides);
  kvq_tensor ph = kvq_tensor_host(host_probs, KVQ_DTYPE_F32, 3, sshape), pd = device_tensor(&pb, 0, KVQ_DTYPE_F32, sshape, NULL);
  kvq_tensor kh = kvq_tensor_host(host_keys, KVQ_DTYPE_F32, 3, tshape), kd = device_tensor(&kb, 0, KVQ_DTYPE_F32, tshape, kstrides);
  kvq_tensor vh = kvq_tensor_host(host_values, KVQ_DTYPE_F16, 3, tshape), vd = device_tensor(&vb, 0, KVQ_DTYPE_F16, tshape, NULL);
  KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &qh, KVQ_MASK_CAUSAL, KVQ_SCORES_LOGITS, &lh));
  KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &qh, KVQ_MASK_CAUSAL, KVQ_SCORES_PROBABILITIES, &ph));
  KVQ_CHECK(ctx, kvq_dequantize(cache, seq, 0, 0, n, &kh, &vh));
  cr_assert_eq(host_logits[n - 1], 0xfc00, "the first row cannot see the last tokens: -inf");
  /* the conversions of each call: queries (device only), then the outputs' check and write passes */
  const uint64_t conversions = 64u * 2 * runs;
  (void)counted(ctx);
  KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &qd, KVQ_MASK_CAUSAL, KVQ_SCORES_LOGITS, &ld));
  kvq_backend_stats s = counted(ctx);
  cr_assert_eq(s.submissions, 1u, "logits: %llu submissions", (unsigned long long)s.submissions);
  cr_assert_eq(s.bytes_to_host, 4u, "logits: %llu bytes back (the check word only)", (unsigned long long)s.bytes_to_host);
  cr_assert_leq(s.bytes_to_device, 64u + conversions + 256u, "logits: %llu bytes up", (unsigned long long)s.bytes_to_device);
  KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &qh, KVQ_MASK_CAUSAL, KVQ_SCORES_PROBABILITIES, &pd));
  s = counted(ctx);
  cr_assert_eq(s.submissions, 1u, "probabilities: %llu submissions", (unsigned long long)s.submissions);
  cr_assert_eq(s.bytes_to_host, 4u, "probabilities: %llu bytes back", (unsigned long long)s.bytes_to_host);
  cr_assert_leq(s.bytes_to_device, sizeof q + conversions + 256u, "probabilities: %llu bytes up", (unsigned long long)s.bytes_to_device);
  KVQ_CHECK(ctx, kvq_dequantize(cache, seq, 0, 0, n, &kd, &vd));
  s = counted(ctx);
  cr_assert_eq(s.submissions, 1u, "dequantize: %llu submissions", (unsigned long long)s.submissions);
  cr_assert_eq(s.bytes_to_host, 4u, "dequantize: %llu bytes back", (unsigned long long)s.bytes_to_host);
  cr_assert_leq(s.bytes_to_device, 2 * (conversions + 64u * N / P) + 8u * N / P, "dequantize: %llu bytes up",
                (unsigned long long)s.bytes_to_device);
  KVQ_CHECK(ctx, kvq_dequantize(cache, seq, 0, 0, n, &kd, NULL));
  s = counted(ctx);
  cr_assert_eq(s.submissions, 1u, "fp32 keys: %llu submissions", (unsigned long long)s.submissions);
  cr_assert_eq(s.bytes_to_host, 0u, "fp32 keys: %llu bytes back (nothing to check)", (unsigned long long)s.bytes_to_host);
  /* asynchronously: the same calls leave their work in flight (nothing read back) until the wait,
   * which gives the same bytes (compared below) */
  memset(lb.mapped, 0x5a, 2 * NQ * LROW + 2), memset(kb.mapped, 0x5a, 4 * n * TROW), memset(vb.mapped, 0x5a, 2 * n * HKV * D);
  KVQ_CHECK(ctx, kvq_context_set_async(ctx, 1));
  KVQ_CHECK(ctx, kvq_scores(cache, seq, 0, &qd, KVQ_MASK_CAUSAL, KVQ_SCORES_LOGITS, &ld));
  KVQ_CHECK(ctx, kvq_dequantize(cache, seq, 0, 0, n, &kd, &vd));
  s = counted(ctx);
  cr_assert_eq(s.bytes_to_host, 0u, "asynchronous calls read back %llu bytes", (unsigned long long)s.bytes_to_host);
  cr_assert_eq(s.submissions, 2u, "asynchronous calls: %llu submissions", (unsigned long long)s.submissions);
  cr_assert_leq(s.waits, 1u, "asynchronous calls waited %llu times (only the second for the first)", (unsigned long long)s.waits);
  KVQ_CHECK(ctx, kvq_context_wait(ctx));
  KVQ_CHECK(ctx, kvq_context_set_async(ctx, 0));
  const uint16_t *lo = lb.mapped;
  const float *ko = kb.mapped;
  for (int row = 0; row < NQ; row++) {
    cr_assert_eq(memcmp(lo + row * LROW, host_logits + row * HQ * n, 2 * HQ * n), 0, "logits row %d differ", row);
    cr_assert_eq(lo[row * LROW + HQ * n], 0x5a5a, "the gap after logits row %d was written", row);
  }
  cr_assert_eq(memcmp(pb.mapped, host_probs, 4 * NQ * HQ * n), 0, "probabilities differ");
  for (uint32_t t = 0; t < n; t++) {
    cr_assert_eq(memcmp(ko + t * TROW, host_keys + t * HKV * D, 4 * HKV * D), 0, "key %u differs", t);
    for (int g = 0; g < 16; g++) cr_assert_eq(((const uint8_t *)(ko + t * TROW + HKV * D))[g], 0x5a, "the gap after key %u was written", t);
  }
  cr_assert_eq(memcmp(vb.mapped, host_values, 2 * n * HKV * D), 0, "values differ");
  /* logits beyond fp16: refused on both paths, the device tensor untouched */
  for (int i = 0; i < NQ * HQ * D; i++) ((float *)qb.mapped)[i] = q[i] * 100000.0f;
  memset(lb.mapped, 0x5a, 2 * NQ * LROW + 2);
  cr_assert_eq(kvq_scores(cache, seq, 0, &qd, KVQ_MASK_CAUSAL, KVQ_SCORES_LOGITS, &ld), KVQ_ERROR_NON_FINITE);
  for (size_t i = 0; i < 2 * NQ * LROW + 2; i++) cr_assert_eq(((const uint8_t *)lb.mapped)[i], 0x5a, "logit byte %zu was written", i);
  for (int i = 0; i < NQ * HQ * D; i++) q[i] *= 100000.0f;
  cr_assert_eq(kvq_scores(cache, seq, 0, &qh, KVQ_MASK_CAUSAL, KVQ_SCORES_LOGITS, &lh), KVQ_ERROR_NON_FINITE);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  runtime_buffer *all[] = {&qb, &lb, &pb, &kb, &vb};
  runtime_buffers_free(&r, all, 5);
  free(host_logits), free(host_values), free(host_probs), free(host_keys);
  runtime_stop(&r);
}

/*
 * The per-method range checks of appended tokens (core/token_check.c) hold for device keys and values
 * too: a token that a method cannot store (an fp16 value, QJL norm, uniform minimum or scale beyond
 * fp16, a KIVI value beyond 32752, a PolarQuant radius beyond 65440) refuses a synchronous append of
 * device tensors with KVQ_ERROR_NON_FINITE and changes nothing, exactly where a host append refuses
 * it, on either side (the other side exact fp32, which refuses nothing finite); asynchronously the
 * wait reports it.
 */
Test(vulkan, device_appends_refuse_what_host_appends_refuse) {
  require_vulkan();
  runtime_device r;
  kvq_context *ctx = runtime_with_context(&r);
  enum { HQ = 4, HKV = 2, D = 64, N = 3 };
  const kvq_method_config methods[] = {th_exact(KVQ_DTYPE_F16), kvq_method_defaults(KVQ_METHOD_QJL, D), th_uniform(4, 32), th_kivi(2, 16),
                                       th_polar(KVQ_ROTATION_DENSE)};
  const float extremes[] = {-70000.0f, -60000.0f, -40000.0f, 1000.0f};
  static float k[(N + 1) * HKV * D], v[(N + 1) * HKV * D], q[1];
  fill_kvq(k, v, (N + 1) * HKV * D, q, 1);
  const int64_t shape[3] = {1, HKV, D};
  runtime_buffer kb = runtime_buffer_make(&r, NULL, 4 * HKV * D), vb = runtime_buffer_make(&r, NULL, 4 * HKV * D);
  const kvq_tensor kd = device_tensor(&kb, 0, KVQ_DTYPE_F32, shape, NULL), vd = device_tensor(&vb, 0, KVQ_DTYPE_F32, shape, NULL);
  int refused = 0;
  for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++)
    for (int side = 0; side < 2; side++)
      for (size_t x = 0; x < sizeof extremes / sizeof extremes[0] && !(m == 1 && side == 1); x++) { /* QJL: keys only */
        kvq_layer_config layer = th_layer(HQ, HKV, D, side ? th_exact(KVQ_DTYPE_F32) : methods[m], side ? methods[m] : th_exact(KVQ_DTYPE_F32));
        kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 16, 16, 1, 5);
        uint32_t host_seq, dev_seq;
        kvq_cache *host = cache_with_sequence(ctx, &config, &host_seq), *dev = cache_with_sequence(ctx, &config, &dev_seq);
        th_append(ctx, host, host_seq, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
        th_append(ctx, dev, dev_seq, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
        float token[2][HKV * D];
        memcpy(token[0], k + N * HKV * D, sizeof token[0]), memcpy(token[1], v + N * HKV * D, sizeof token[1]);
        token[side][D + 5] = extremes[x]; /* kv head 1, channel 5 */
        const kvq_tensor kh = kvq_tensor_host(token[0], KVQ_DTYPE_F32, 3, shape), vh = kvq_tensor_host(token[1], KVQ_DTYPE_F32, 3, shape);
        memcpy(kb.mapped, token[0], sizeof token[0]), memcpy(vb.mapped, token[1], sizeof token[1]);
        const kvq_status host_st = kvq_append(host, host_seq, 0, &kh, &vh);
        kvq_sequence_info before, after;
        KVQ_CHECK(ctx, kvq_sequence_info_get(dev, dev_seq, 0, &before));
        const kvq_status dev_st = kvq_append(dev, dev_seq, 0, &kd, &vd);
        KVQ_CHECK(ctx, kvq_sequence_info_get(dev, dev_seq, 0, &after));
        cr_assert_eq(dev_st, host_st, "method %zu on side %d, element %g: the device append returned %s, the host append %s (%s)", m,
                     side, (double)extremes[x], kvq_status_string(dev_st), kvq_status_string(host_st), kvq_context_last_error(ctx));
        cr_assert(host_st == KVQ_OK || host_st == KVQ_ERROR_NON_FINITE, "%s", kvq_status_string(host_st));
        cr_assert_eq(after.tokens, before.tokens + (dev_st == KVQ_OK), "a refused append changed the sequence");
        if (dev_st != KVQ_OK) {
          refused++;
          cr_assert(strstr(kvq_context_last_error(ctx), "method stores"), "%s", kvq_context_last_error(ctx));
        }
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
  cr_assert_eq(refused, 2 * (1 + 1 + 1 + 3 + 1) - 1, "%d appends refused", refused);
  kvq_context_destroy(ctx);
  runtime_buffer *all[] = {&kb, &vb};
  runtime_buffers_free(&r, all, 2);
  runtime_stop(&r);
}

/*
 * A refused append of device tokens changes nothing and costs one submission (docs/VULKAN.md): what
 * it records behind its device checks (the pages it quantizes, a page its evictions freed and it
 * takes and clears, the window slots it writes) is skipped on the device, and its host bookkeeping
 * (page table, free pages, statistics, lengths) is put back. Under StreamingLLM, H2O and Q-Hitter a
 * two-layer cache with a pool of 8 pages of 16 streams chunks of 1, 5 and 40 device tokens; before
 * each real append the same tokens with one NaN are refused, and the saved cache (page table, pages,
 * windows, statistics) is byte for byte what it was. A chunk of 40 overwrites window slots whose
 * tokens the append quantizes first and takes pages the policy just freed. Q-Hitter's quantization
 * errors come back with the same one submission (buffer_read_later), and a refused append drops them.
 */
enum { RA_HQ = 2, RA_HKV = 2, RA_D = 32, RA_P = 16, RA_CHUNK = 40, RA_N = 260 };
static float ra_value(uint32_t token, uint32_t i, int side) {
  return (float)(((token * 131u + i * 17u + (uint32_t)side * 7u) % 97u)) / 48.0f - 1.0f;
}
static uint8_t *ra_saved(kvq_context *ctx, kvq_cache *cache, size_t *size) {
  uint64_t bytes = 0;
  KVQ_CHECK(ctx, kvq_cache_save_size(cache, &bytes));
  uint8_t *image = malloc((size_t)bytes);
  cr_assert(image);
  KVQ_CHECK(ctx, kvq_cache_save_to_memory(cache, image, (size_t)bytes, size));
  return image;
}
/*
 * Attention of device queries into a device output on an H2O cache is one submission, which carries
 * the output's in-place write, the policy's sums and the check word (docs/VULKAN.md). It was two: the
 * wait for the sums ran the output's write before the check word's read, so a failure of that read
 * left the output written (tests/test_fault.c, point 27 of the runtime rows). The output is the host
 * path's, bit for bit, on the same cache (the same jobs on the same fp32 values).
 */
Test(vulkan, device_attention_with_h2o_is_one_submission) {
  require_vulkan();
  runtime_device r;
  kvq_context *ctx = runtime_with_context(&r);
  enum { NQ = 3, N = 50 };
  kvq_layer_config layer = th_layer(RA_HQ, RA_HKV, RA_D, th_kivi(2, 16), th_uniform(4, 16));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, RA_P, 16, 8, 1, 7);
  config.policy = kvq_policy_defaults(KVQ_POLICY_H2O);
  config.policy.heavy_fraction = 0.0f, config.policy.heavy = 4;
  uint32_t seq;
  kvq_cache *cache = cache_with_sequence(ctx, &config, &seq);
  static float k[N * RA_HKV * RA_D], v[N * RA_HKV * RA_D], q[NQ * RA_HQ * RA_D], host_out[NQ * RA_HQ * RA_D];
  for (uint32_t t = 0; t < N; t++)
    for (uint32_t i = 0; i < RA_HKV * RA_D; i++) k[t * RA_HKV * RA_D + i] = ra_value(t, i, 0), v[t * RA_HKV * RA_D + i] = ra_value(t, i, 1);
  for (uint32_t i = 0; i < NQ * RA_HQ * RA_D; i++) q[i] = ra_value(N + i / (RA_HQ * RA_D), i, 2);
  const int64_t kshape[3] = {N, RA_HKV, RA_D}, qshape[3] = {NQ, RA_HQ, RA_D};
  const kvq_tensor kt = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, kshape), vt = kvq_tensor_host(v, KVQ_DTYPE_F32, 3, kshape);
  KVQ_CHECK(ctx, kvq_append(cache, seq, 0, &kt, &vt));
  runtime_buffer qb = runtime_buffer_make(&r, q, sizeof q), ob = runtime_buffer_make(&r, NULL, sizeof host_out);
  const kvq_attention_request host_req = {.sequence = seq, .mask = KVQ_MASK_CAUSAL,
                                          .queries = kvq_tensor_host(q, KVQ_DTYPE_F32, 3, qshape),
                                          .output = kvq_tensor_host(host_out, KVQ_DTYPE_F32, 3, qshape)};
  const kvq_attention_request dev_req = {.sequence = seq, .mask = KVQ_MASK_CAUSAL,
                                         .queries = device_tensor(&qb, 0, KVQ_DTYPE_F32, qshape, NULL),
                                         .output = device_tensor(&ob, 0, KVQ_DTYPE_F32, qshape, NULL)};
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &host_req, 1));
  (void)counted(ctx);
  KVQ_CHECK(ctx, kvq_attention(cache, 0, &dev_req, 1));
  const kvq_backend_stats s = counted(ctx);
  cr_assert_eq(s.submissions, 1u, "attention of device tensors under H2O: %llu submissions", (unsigned long long)s.submissions);
  cr_assert_eq(memcmp(ob.mapped, host_out, sizeof host_out), 0, "the device output is not the host path's");
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  runtime_buffer *all[] = {&qb, &ob};
  runtime_buffers_free(&r, all, 2);
  runtime_stop(&r);
}

Test(vulkan, refused_device_append_changes_nothing_in_one_submission, .timeout = 300) {
  require_vulkan();
  runtime_device r;
  kvq_context *ctx = runtime_with_context(&r);
  const kvq_policy_kind kinds[3] = {KVQ_POLICY_STREAMING, KVQ_POLICY_H2O, KVQ_POLICY_QHITTER};
  const uint64_t token_bytes = 4u * RA_HKV * RA_D;
  runtime_buffer kb = runtime_buffer_make(&r, NULL, RA_CHUNK * token_bytes), vb = runtime_buffer_make(&r, NULL, RA_CHUNK * token_bytes);
  const uint32_t chunks[3] = {1, 5, RA_CHUNK};
  for (int k = 0; k < 3; k++) {
    kvq_layer_config layers[2] = {th_layer(RA_HQ, RA_HKV, RA_D, th_kivi(2, 16), th_uniform(4, 16)),
                                  th_layer(RA_HQ, RA_HKV, RA_D, th_exact(KVQ_DTYPE_F16), th_kivi(2, 0))};
    kvq_cache_config config = th_config(layers, 2, KVQ_DTYPE_F32, RA_P, 16, 8, 1, 7);
    config.policy = kvq_policy_defaults(kinds[k]);
    config.policy.heavy_fraction = 0.0f, config.policy.heavy = 4;
    uint32_t seq;
    kvq_cache *cache = cache_with_sequence(ctx, &config, &seq);
    uint32_t refusals = 0, step = 0;
    for (uint32_t t = 0; t < RA_N; t += chunks[step++ % 3]) {
      const uint32_t count = chunks[step % 3];
      float *kf = kb.mapped, *vf = vb.mapped;
      for (uint32_t j = 0; j < count; j++)
        for (uint32_t i = 0; i < RA_HKV * RA_D; i++) {
          kf[j * RA_HKV * RA_D + i] = ra_value(t + j, i, 0);
          vf[j * RA_HKV * RA_D + i] = ra_value(t + j, i, 1);
        }
      const int64_t shape[3] = {count, RA_HKV, RA_D};
      const kvq_tensor kd = device_tensor(&kb, 0, KVQ_DTYPE_F32, shape, NULL), vd = device_tensor(&vb, 0, KVQ_DTYPE_F32, shape, NULL);
      for (uint32_t layer = 0; layer < 2; layer++) {
        size_t before_size, after_size;
        uint8_t *before = ra_saved(ctx, cache, &before_size);
        float *poisoned = (step % 2 ? vf : kf) + (count - 1) * RA_HKV * RA_D + 3;
        const float clean = *poisoned;
        *poisoned = NAN;
        (void)counted(ctx);
        const kvq_status st = kvq_append(cache, seq, layer, &kd, &vd);
        const kvq_backend_stats s = counted(ctx);
        cr_assert_eq(st, KVQ_ERROR_NON_FINITE, "policy %d, token %u, layer %u: %s", k, t, layer, kvq_status_string(st));
        if (kinds[k] != KVQ_POLICY_QHITTER) /* Q-Hitter: and the errors of the pages it quantized, dropped */
          cr_assert_eq(s.bytes_to_host, 4u, "a refused append read back %llu bytes", (unsigned long long)s.bytes_to_host);
        cr_assert_eq(s.submissions, 1u, "policy %d, token %u, layer %u: a refused append made %llu submissions", k, t, layer,
                     (unsigned long long)s.submissions);
        uint8_t *after = ra_saved(ctx, cache, &after_size);
        cr_assert_eq(after_size, before_size, "policy %d, token %u, layer %u: the refused append changed the cache's size", k, t, layer);
        for (size_t i = 0; i < before_size; i++)
          cr_assert_eq(after[i], before[i], "policy %d, token %u (+%u), layer %u: the refused append changed byte %zu of the saved cache",
                       k, t, count, layer, i);
        free(before), free(after);
        refusals++;
        *poisoned = clean;
        (void)counted(ctx);
        KVQ_CHECK(ctx, kvq_append(cache, seq, layer, &kd, &vd));
        const kvq_backend_stats a = counted(ctx);
        cr_assert_eq(a.submissions, 1u, "policy %d, token %u, layer %u: %llu submissions", k, t, layer,
                     (unsigned long long)a.submissions);
      }
    }
    kvq_sequence_info info;
    KVQ_CHECK(ctx, kvq_sequence_info_get(cache, seq, 1, &info));
    cr_assert_geq(info.tokens, (uint64_t)RA_N, "%llu tokens", (unsigned long long)info.tokens);
    cr_assert_lt(info.kept_tokens, info.tokens, "the policy evicted");
    cr_assert_gt(refusals, 20u);
    kvq_cache_destroy(cache);
  }
  kvq_context_destroy(ctx);
  runtime_buffer *all[] = {&kb, &vb};
  runtime_buffers_free(&r, all, 2);
  runtime_stop(&r);
}

#else
Test(vulkan, runs_on_the_runtimes_device) { require_vulkan(); }
Test(vulkan, a_queue_the_device_lacks_is_an_invalid_argument) { require_vulkan(); }
Test(vulkan, runtime_vkbuffers_as_inputs_and_outputs) { require_vulkan(); }
Test(vulkan, device_resident_decode_loop_sync_and_async) { require_vulkan(); }
Test(vulkan, device_checks_report_non_finite_values) { require_vulkan(); }
Test(vulkan, half_precision_device_queries_and_outputs) { require_vulkan(); }
Test(vulkan, scores_and_dequantize_into_device_tensors) { require_vulkan(); }
Test(vulkan, device_appends_refuse_what_host_appends_refuse) { require_vulkan(); }
Test(vulkan, refused_device_append_changes_nothing_in_one_submission) { require_vulkan(); }
#endif

/* ---- Codebook learning ---------------------------------------------------------------------------- */

/*
 * Codebook learning records its k-means steps into one submission each (docs/VULKAN.md): the buffers,
 * the calibration upload and the first assignment go with the first step's read of the assignment,
 * each later Lloyd step (update, then assignment) with its read; then one read of the centroids and
 * the codebooks' upload at the end. Only the assignment comes back per step (the distances are not
 * read where nothing uses them). Before, every buffer operation and job was a submission of its own
 * (19 here for 3 steps), and each step read the distances back too.
 */
Test(vulkan, codebook_learning_is_one_submission_per_step) {
  require_vulkan();
  kvq_context *ctx = vulkan_context();
  enum { D = 16, T = 512, G = D / 4, STEPS_MAX = 100 };
  kvq_method_config c = th_cq(4, 2);
  c.cq.iterations = STEPS_MAX;
  kvq_layer_config layer = th_layer(1, 1, D, c, th_exact(KVQ_DTYPE_F32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 0, 4, 1, 11);
  static float cal[T * D];
  for (int i = 0; i < T * D; i++) cal[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  const int64_t cal_shape[3] = {T, 1, D};
  kvq_tensor kt = kvq_tensor_host(cal, KVQ_DTYPE_F32, 3, cal_shape);
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  (void)counted(ctx);
  KVQ_CHECK(ctx, kvq_codebooks_learn(cache, 0, &kt, NULL, NULL));
  const kvq_backend_stats s = counted(ctx);
  /* at most STEPS_MAX + 1 assignments read back (G problems of T points, 4 bytes each), and the
   * centroids (G problems of 4 clusters of 4 floats) */
  const uint64_t centroids = 4u * G * 4 * 4, steps = (s.bytes_to_host - centroids) / (4u * G * T);
  cr_assert_eq(s.bytes_to_host, steps * 4u * G * T + centroids, "only assignments and centroids came back: %llu bytes", (unsigned long long)s.bytes_to_host);
  cr_assert(steps >= 2 && steps <= STEPS_MAX + 1, "%llu assignments read", (unsigned long long)steps);
  cr_assert_eq(s.submissions, steps + 2, "%llu submissions for %llu k-means steps", (unsigned long long)s.submissions,
               (unsigned long long)steps);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}
