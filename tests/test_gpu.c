/*
 * Every GPU backend against the CPU reference: one suite, run once per GPU backend. Meson runs this
 * executable as `gpu_vulkan` (KVQ_TEST_GPU=vulkan: whatever Vulkan device the machine has, in CI
 * lavapipe, with the Khronos validation layer on), `gpu_cuda` (KVQ_TEST_GPU=cuda: the CUDA backend on a GPU) and
 * `gpu_cuda_emulated` (the same on kvq's CUDA emulation on the CPU, KVQ_CUDA_EMULATOR=1,
 * docs/CUDA.md: how CI, which has no GPU, tests the CUDA backend). Where the backend is unavailable
 * every test is skipped, saying why. What only one backend has (Vulkan's runtime device and VkBuffers, its
 * submission counters) is tested in that backend's own file (tests/test_vulkan.c).
 *
 * Agreement is judged by the golden checker (tools/golden, docs/GOLDEN.md): codes byte-identical
 * with near-ties proven, side data within 1 ulp, scores/probabilities/outputs within the derived
 * bounds of docs/ACCURACY.md. The same checker that holds the CPU to the committed golden files holds
 * every GPU backend to them, and to files the CPU writes here for odd sizes.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/gpu_plan.h"
#include "golden/cases.h"
#include "golden/golden.h"
#include "gpu_odd_sizes.h"
#include "helpers.h"

/* The backend under test, from KVQ_TEST_GPU (meson sets it for each run of this executable). */
static kvq_backend_kind gpu_kind(void) {
  const char *name = getenv("KVQ_TEST_GPU");
  cr_assert_not_null(name, "KVQ_TEST_GPU names the GPU backend under test (vulkan, cuda)");
  if (!strcmp(name, "vulkan")) return KVQ_BACKEND_VULKAN;
  cr_assert_str_eq(name, "cuda", "KVQ_TEST_GPU=%s: not a GPU backend (vulkan, cuda)", name);
  return KVQ_BACKEND_CUDA;
}

static const char *gpu_name(void) { return gpu_kind() == KVQ_BACKEND_VULKAN ? "Vulkan" : "CUDA"; }

/* Skips the calling test (visibly, with the reason) when the backend under test is unavailable here. */
static void require_gpu(void) {
  kvq_backend_info infos[4];
  size_t count = 0;
  cr_assert_eq(kvq_backends_list(infos, 4, &count), KVQ_OK);
  for (size_t i = 0; i < count; i++)
    if (infos[i].kind == gpu_kind() && infos[i].availability != KVQ_AVAILABLE)
      cr_skip_test("the %s backend is unavailable here: %s", gpu_name(), infos[i].reason);
}

static kvq_context *gpu_context(void) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = gpu_kind();
  kvq_context *ctx = NULL;
  cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_OK);
  return ctx;
}

static void log_lines(FILE *out) {
  rewind(out);
  char line[512];
  while (fgets(line, sizeof line, out)) cr_log_info("%s", line);
  fclose(out);
}

/* Every golden-matrix configuration, policy stream and saved file, on the backend under test. */
Test(gpu, agrees_with_committed_golden_files, .timeout = 600) {
  require_gpu();
  golden_totals t;
  FILE *out = tmpfile();
  const int rc = kvq_golden_check(KVQ_SOURCE_GOLDEN_DIR, gpu_kind(), out, &t);
  log_lines(out);
  cr_assert_eq(rc, 0, "kvq golden --check on %s failed (the log above says where)", gpu_name());
  cr_assert_eq(t.configurations, kvq_golden_case_count());
  cr_assert_gt(t.code_bytes, 100000u);
  cr_assert_eq(t.unexplained, 0u);
  cr_assert_eq(t.side_beyond, 0u);
  cr_assert_gt(t.class3_values, 10000u);
  cr_assert_eq(t.class3_beyond, 0u);
  cr_assert_eq(t.decisions_differing, 0u);
  cr_assert_eq(t.files_failed, 0u);
}

/* ---- Odd sizes: files the CPU writes here, checked on the backend under test ------------------------- */

/* The CPU writes golden files of `cases` here; the backend under test must agree with them (codes byte
 * for byte or proven near-ties, side data within 1 ulp, class-3 values within their bounds). */
static void check_cases(const golden_case *cases, uint32_t count, uint64_t min_code_bytes, uint64_t min_class3) {
  char *dir = th_temp_dir("gpu");
  FILE *log = tmpfile();
  for (uint32_t i = 0; i < count; i++) cr_assert_eq(kvq_golden_write_case(&cases[i], dir, log), 0, "writing %s", cases[i].name);
  fclose(log);
  golden_totals t;
  FILE *out = tmpfile();
  kvq_golden_check(dir, gpu_kind(), out, &t); /* no saved files here: those are counted failed */
  log_lines(out);
  th_remove_dir(dir);
  free(dir);
  cr_assert_eq(t.configurations, count);
  cr_assert_eq(t.configurations_failed, 0u, "the log above names the configurations that failed");
  cr_assert_gt(t.code_bytes, min_code_bytes);
  cr_assert_eq(t.code_bytes_differing, t.near_ties + t.implied, "every differing byte is a proven near-tie");
  cr_assert_eq(t.unexplained, 0u);
  cr_assert_eq(t.side_beyond, 0u);
  cr_assert_gt(t.class3_values, min_class3);
  cr_assert_eq(t.class3_beyond, 0u);
}

/* The matrix: tests/gpu_odd_sizes.c (test_gpu_matrices runs it too). */
static void check_odd_sizes(void) {
  static char names[GPU_ODD_SIZE_MAX][GPU_ODD_SIZE_NAME];
  golden_case cases[GPU_ODD_SIZE_MAX];
  const uint32_t count = gpu_odd_size_cases(cases, names);
  check_cases(cases, count, 10000u, 1000u);
}

/* On Vulkan twice: as the device is, then with the fallback every device has (no subgroup operations),
 * which the device line must then not claim. */
Test(gpu, odd_sizes_agree_with_the_cpu, .timeout = 900) {
  require_gpu();
  check_odd_sizes();
  if (gpu_kind() != KVQ_BACKEND_VULKAN) return;
  cr_assert_eq(setenv("KVQ_VULKAN_NO_SUBGROUPS", "1", 1), 0); /* this test's own process (Criterion forks) */
  kvq_backend_info infos[4];
  size_t count = 0;
  kvq_backends_list(infos, 4, &count);
  for (size_t i = 0; i < count; i++)
    if (infos[i].kind == KVQ_BACKEND_VULKAN) cr_assert_null(strstr(infos[i].device, "subgroups"), "%s", infos[i].device);
  check_odd_sizes();
}


/*
 * PolarQuant at the largest head_dim (256): the Vulkan backend encodes KVQ_POLAR_GROUP_TOKENS tokens
 * per workgroup (shaders/methods/polar.glsl), so this covers eight dense rows per invocation, its
 * shared memory at its largest, units cut short by the valid count (a page + 7 and 2 tokens) and
 * the worst case for the loop limit (docs/VULKAN.md: 8 bits at every level). Dense 8 levels keys,
 * Hadamard 3 levels values, fp16 and fp32 inputs. On lavapipe, the encoder of one token per
 * invocation wrote zero codes here (past the loop limit with fp16 inputs), and so did the dense query
 * rotation in one invocation (wrong logits).
 */
Test(gpu, polarquant_at_the_largest_head_dim_agrees_with_the_cpu, .timeout = 600) {
  require_gpu();
  enum { P = 16, D = 256 };
  kvq_method_config keys = th_polar(KVQ_ROTATION_DENSE), values = th_polar(KVQ_ROTATION_HADAMARD);
  keys.polar.levels = 8;
  for (uint32_t l = 0; l < 8; l++) keys.polar.bits[l] = 8;
  values.polar.levels = 3;
  values.polar.bits[0] = 8, values.polar.bits[1] = 4, values.polar.bits[2] = 1;
  static const kvq_dtype inputs[2] = {KVQ_DTYPE_F16, KVQ_DTYPE_F32};
  static const char *names[2] = {"polar-d256-f16", "polar-d256-f32"};
  golden_case cases[2];
  for (uint32_t i = 0; i < 2; i++) {
    golden_case *c = &cases[i];
    memset(c, 0, sizeof *c);
    c->name = names[i];
    c->input = inputs[i];
    c->page_size = P;
    c->layer_count = 1;
    c->layers[0] = th_layer(4, 2, D, keys, values);
    c->lengths[0] = P + 7;
    c->lengths[1] = 2;
    c->seed = 3000 + i;
    c->policy = kvq_policy_defaults(KVQ_POLICY_KEEP_ALL);
  }
  check_cases(cases, 2, 10000u, 100u);
}

/*
 * PolarQuant at one and two levels: a run of 8 rotated coordinates (kvq_polar_decode_run, which the
 * Vulkan fused passes use for keys and values) then holds four or two block radii, which the shaders
 * read with two word loads and selects, and the level offsets come from the arrays that
 * shaders/methods/polar.glsl fills once per invocation; 5-, 6- and 3-bit levels, whose words hold
 * 6, 5 and 10 codes, so that a run's codes of a level may cross into the next word. The other
 * PolarQuant cases here have three or more levels (one radius per run). Bounds as check_cases. With
 * the shaders reading every radius from the low half of its word, this case fails.
 */
Test(gpu, polarquant_runs_of_several_radii_agree_with_the_cpu, .timeout = 300) {
  require_gpu();
  kvq_method_config keys = th_polar(KVQ_ROTATION_HADAMARD), values = th_polar(KVQ_ROTATION_DENSE);
  keys.polar.levels = 1;
  keys.polar.bits[0] = 5;
  values.polar.levels = 2;
  values.polar.bits[0] = 6, values.polar.bits[1] = 3;
  golden_case c;
  memset(&c, 0, sizeof c);
  c.name = "polar-l1-l2";
  c.input = KVQ_DTYPE_F32;
  c.page_size = 16;
  c.layer_count = 1;
  c.layers[0] = th_layer(4, 2, 64, keys, values);
  c.lengths[0] = 3 * 16 + 5;
  c.lengths[1] = 16;
  c.seed = 3100;
  c.policy = kvq_policy_defaults(KVQ_POLICY_KEEP_ALL);
  check_cases(&c, 1, 5000u, 100u);
}

/* ---- Long sequences ---------------------------------------------------------------------------------- */

/*
 * 70000 tokens: more than llvmpipe lets one shader invocation loop (65535 iterations; past that a loop
 * ends silently), so every per-token loop must be spread over a workgroup. Probabilities (SCORE and
 * SOFTMAX) and outputs (the fused attention) against the CPU reference, exact fp32 keys and values.
 *
 * Tolerances: the logits come from the same fp32 keys and queries (d = 16 products and sums, both
 * sides rounding in fp32 or better: |dlogit| <= 2 * 16 u |q||k| <= 2^-18 here, with |q|, |k| <= 1
 * per channel and the scale 1/4); a probability's relative error is then at most |dlogit| for each of
 * the exp terms plus n u for the sum of n terms: (2 * 2^-18 + n * 2^-24) relative, about 0.5%. An
 * output, a convex combination of values in [0, 1), moves by at most that relative error times
 * max |v| = 1, plus n u for its own sum.
 */
Test(gpu, long_sequences_agree_with_the_cpu, .timeout = 600) {
  require_gpu();
  enum { N = 70000, D = 16, P = 256 };
  kvq_layer_config layer = th_layer(1, 1, D, th_exact(KVQ_DTYPE_F32), th_exact(KVQ_DTYPE_F32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 0, N / P + 2, 1, 5);
  float *k = malloc(sizeof(float) * N * D), *v = malloc(sizeof(float) * N * D);
  float *probs[2] = {malloc(sizeof(float) * N), malloc(sizeof(float) * N)};
  float q[D], out[2][D];
  cr_assert(k && v && probs[0] && probs[1]);
  /* values in [0, 1), not centred on 0 (centred values average to about 0 whatever the weights, and
   * hid a combine that halved its output), half of each set by its token's flash split modulo
   * KVQ_FLASH_COMBINE_GROUPS (splits of KVQ_FLASH_SPLIT tokens, core/gpu_plan.h): a combine that
   * drops or rescales splits, or one group of them, moves the output far past the bound */
  for (int i = 0; i < N * D; i++) {
    const int split = i / D / KVQ_FLASH_SPLIT;
    k[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    v[i] = 0.5f * (float)((i * 53) % 97) / 97.0f + 0.5f * (float)(split % KVQ_FLASH_COMBINE_GROUPS) / KVQ_FLASH_COMBINE_GROUPS;
  }
  for (int i = 0; i < D; i++) q[i] = (float)((i * 29) % 89) / 44.0f - 1.0f;
  kvq_context *ctxs[2] = {th_cpu_context(), gpu_context()};
  const int64_t qshape[3] = {1, 1, D}, sshape[3] = {1, 1, N};
  for (int c = 0; c < 2; c++) {
    kvq_cache *cache;
    uint32_t seq;
    KVQ_CHECK(ctxs[c], kvq_cache_create(ctxs[c], &config, &cache));
    KVQ_CHECK(ctxs[c], kvq_sequence_add(cache, &seq));
    th_append(ctxs[c], cache, seq, 0, k, v, 0, N, 1, D, KVQ_DTYPE_F32);
    kvq_tensor qt = kvq_tensor_host(q, KVQ_DTYPE_F32, 3, qshape), st = kvq_tensor_host(probs[c], KVQ_DTYPE_F32, 3, sshape);
    KVQ_CHECK(ctxs[c], kvq_scores(cache, seq, 0, &qt, KVQ_MASK_NONE, KVQ_SCORES_PROBABILITIES, &st));
    kvq_attention_request req = {.sequence = seq, .mask = KVQ_MASK_NONE, .queries = qt,
                                 .output = kvq_tensor_host(out[c], KVQ_DTYPE_F32, 3, qshape)};
    KVQ_CHECK(ctxs[c], kvq_attention(cache, 0, &req, 1));
    kvq_cache_destroy(cache);
    kvq_context_destroy(ctxs[c]);
  }
  const double relative = 2.0 * 0x1p-18 + N * 0x1p-24;
  for (int t = 0; t < N; t++)
    cr_assert_leq(fabs((double)probs[1][t] - probs[0][t]), relative * probs[0][t] + 1e-45, "probability of token %d: %g vs %g", t,
                  probs[1][t], probs[0][t]);
  for (int c = 0; c < D; c++)
    cr_assert_leq(fabs((double)out[1][c] - out[0][c]), relative + N * 0x1p-24, "output channel %d: %g vs %g", c, out[1][c], out[0][c]);
  free(k), free(v), free(probs[0]), free(probs[1]);
}

/*
 * UNIFORM and KIVI side data in the fp16 subnormal range: decoding reads scales and minimums with the
 * hardware conversion on Vulkan (unpackHalf2x16, which a device may flush for subnormal inputs) and
 * makes subnormals exactly itself (core/halfconv.h kvq_f16_read2, core/quantize_math.h
 * kvq_uniform_read_params). Every |x| here is below 2^-15, so every minimum (|min| <= 2^-15) and
 * scale (range / 15 <= 2^-14 / 15) is an fp16 subnormal or zero (tokens 0..7 are zeros: UNIFORM zero scales
 * and minimums), while the values and the encoder's fp32 thresholds stay fp32 normals (above 2^-126),
 * so the codes are the CPU's byte for byte (no near-tie class applies) and the decoded values,
 * min_h + code * scale_h in fp32 from the same floats, must be the CPU's bit for bit: a conversion
 * that flushed or misread one subnormal changes a value.
 */
Test(gpu, subnormal_uniform_and_kivi_side_data_decodes_as_on_the_cpu, .timeout = 300) {
  require_gpu();
  enum { N = 64, D = 64, P = 32 };
  kvq_layer_config layer = th_layer(1, 1, D, th_kivi(4, 0), th_uniform(4, 16));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, 0, N / P + 1, 1, 7);
  static float x[N * D], out[2][2][N * D];
  for (int i = 0; i < N * D; i++)
    x[i] = i < 8 * D ? 0.0f : ldexpf((float)((i * 37) % 61) - 30.0f, -21); /* |x| <= 30 * 2^-21 < 2^-15 */
  kvq_context *ctxs[2] = {th_cpu_context(), gpu_context()};
  const int64_t shape[3] = {N, 1, D};
  for (int c = 0; c < 2; c++) {
    kvq_cache *cache;
    uint32_t seq;
    KVQ_CHECK(ctxs[c], kvq_cache_create(ctxs[c], &config, &cache));
    KVQ_CHECK(ctxs[c], kvq_sequence_add(cache, &seq));
    th_append(ctxs[c], cache, seq, 0, x, x, 0, N, 1, D, KVQ_DTYPE_F32);
    KVQ_CHECK(ctxs[c], kvq_flush(cache, seq));
    kvq_tensor ko = kvq_tensor_host(out[c][0], KVQ_DTYPE_F32, 3, shape), vo = kvq_tensor_host(out[c][1], KVQ_DTYPE_F32, 3, shape);
    KVQ_CHECK(ctxs[c], kvq_dequantize(cache, seq, 0, 0, N, &ko, &vo));
    kvq_cache_destroy(cache);
    kvq_context_destroy(ctxs[c]);
  }
  int nonzero = 0;
  for (int side = 0; side < 2; side++)
    for (int i = 0; i < N * D; i++) {
      nonzero += out[0][side][i] != 0.0f;
      cr_assert(memcmp(&out[1][side][i], &out[0][side][i], sizeof(float)) == 0, "%s element %d: %a on %s, %a on the CPU",
                side ? "value" : "key", i, out[1][side][i], gpu_name(), out[0][side][i]);
    }
  cr_assert_gt(nonzero, N * D, "the data decodes to non-zero values (subnormal scales in use)");
}

/* ---- Codebook learning (the k-means jobs) ------------------------------------------------------------ */

/*
 * CQ codebooks learned on the GPU backend and on the CPU from the same calibration data: four well separated
 * prototypes per channel group (corners of [-4, 4]^4) plus noise below 0.01, so every point's
 * nearest centroid is the same on both (the assignment is decided by the same fp32 operations
 * anyway) and only the means can differ. A mean on the CPU is a double sum rounded once; on Vulkan a
 * compensated fp32 sum (error at most 2u sum|x|) divided in fp32 (u): |difference| <= 4u max|x|,
 * with u = 2^-24 and max|x| < 4.01. CUDA sums in double as the CPU does (docs/CUDA.md), so its
 * difference is 0, well within the same bound. The centroids are read back as the dequantized tokens of a
 * cache holding one token per prototype.
 */
Test(gpu, learned_codebooks_agree_with_the_cpu, .timeout = 300) {
  require_gpu();
  enum { D = 16, T = 512, G = D / 4 };
  kvq_layer_config layer = th_layer(1, 1, D, th_cq(4, 2), th_exact(KVQ_DTYPE_F32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 0, 4, 1, 11);
  static float cal[T * D], probe[4 * D], keys[2][16 * D], values[16 * D];
  for (int t = 0; t < T; t++)
    for (int c = 0; c < D; c++) {
      const int corner = (t + c / 4) % 4; /* which prototype the token's group c / 4 takes */
      const float sign = ((corner >> (c % 2)) & 1) ? 4.0f : -4.0f;
      cal[t * D + c] = sign + (float)(((t * 31 + c * 17) % 19) - 9) * 0.001f;
    }
  for (int p = 0; p < 4; p++)
    for (int c = 0; c < D; c++) probe[p * D + c] = ((p >> (c % 2)) & 1) ? 4.0f : -4.0f;
  kvq_context *ctxs[2] = {th_cpu_context(), gpu_context()};
  const int64_t cal_shape[3] = {T, 1, D}, out_shape[3] = {4, 1, D};
  for (int x = 0; x < 2; x++) {
    kvq_cache *cache;
    uint32_t seq;
    KVQ_CHECK(ctxs[x], kvq_cache_create(ctxs[x], &config, &cache));
    kvq_tensor kt = kvq_tensor_host(cal, KVQ_DTYPE_F32, 3, cal_shape);
    KVQ_CHECK(ctxs[x], kvq_codebooks_learn(cache, 0, &kt, NULL, NULL));
    KVQ_CHECK(ctxs[x], kvq_sequence_add(cache, &seq));
    th_append(ctxs[x], cache, seq, 0, probe, probe, 0, 4, 1, D, KVQ_DTYPE_F32);
    KVQ_CHECK(ctxs[x], kvq_flush(cache, seq));
    kvq_tensor ko = kvq_tensor_host(keys[x], KVQ_DTYPE_F32, 3, out_shape), vo = kvq_tensor_host(values, KVQ_DTYPE_F32, 3, out_shape);
    KVQ_CHECK(ctxs[x], kvq_dequantize(cache, seq, 0, 0, 4, &ko, &vo));
    kvq_cache_destroy(cache);
    kvq_context_destroy(ctxs[x]);
  }
  const double bound = 4.0 * 0x1p-24 * 4.01;
  for (int i = 0; i < 4 * D; i++) {
    cr_assert_lt(fabs((double)keys[0][i] - probe[i]), 0.01, "the CPU learned the prototypes (centroid %d)", i);
    cr_assert_leq(fabs((double)keys[1][i] - keys[0][i]), bound, "centroid component %d: %.9g on %s, %.9g on the CPU", i, gpu_name(),
                  keys[1][i], keys[0][i]);
  }
}

/* ---- A batch of sequences in one call ---------------------------------------------------------------- */

/*
 * One kvq_attention call with four sequences: one shorter than a page (all in the residual window),
 * one of many pages, and two between (pages and the window in use), on three caches: KIVI keys with
 * uniform values (the fused path, where the backend has fused kernels), PolarQuant keys and values (the fused path too: values
 * summed in the rotated space per split, the page and window parts combined apart, each output row
 * rotated back once; core/gpu_plan.h) and an H2O cache (the unfused path with the probability sums). A GPU
 * backend runs each kernel once for the whole batch, every workgroup finding its sequence in the
 * metadata (core/gpu_plan.h, kvq_locate in shaders/attention.glsl). Checked two ways:
 *
 *   - against each sequence attended alone on the same device: the same bits, since no sequence's
 *     arithmetic depends on the others in the batch (a workgroup that took another sequence's
 *     record, pages or scratch would show here first);
 *   - against the CPU backend on the same cache contents (one saved CPU cache loaded on both), so
 *     codes are identical and only the fp32 arithmetic differs. The bound follows the derivation of
 *     long_sequences_agree_with_the_cpu above, widened for decoded keys and values: with queries in
 *     [-1, 1], K and V the largest decoded key and value (kvq_dequantize of the same cache), d = 64,
 *     u = 2^-24 and gamma(n) = n u / (1 - n u),
 *       a logit |s| <= xmax = d K / sqrt(d); both backends round a dot product of d terms, a decode
 *       of at most L + 2 products per term and (PolarQuant) a query rotated in d terms of size <= 1,
 *       which with Cauchy-Schwarz over the rotated coordinates gives
 *       |ds| <= (2 gamma(2d + 8) d K + gamma(d) d^2 K) / sqrt(d);
 *       Vulkan's exp is good to (3 + 2|x|) 2^-23 (docs/ACCURACY.md; CUDA's expf is better) with |x| <= 2 xmax, so each
 *       probability moves by a relative rel = 2 (|ds| + e) + 2 gamma(n) (numerator and normalizer);
 *       an output moves by rel V, plus its own sum's 2 gamma(n + 2) V, plus the decode and rotation
 *       back of the values on both sides, 2 gamma(2d + 8) d V.
 *   The bound is loose next to the fused path's real differences, but far below what taking another
 *   sequence's tokens changes (outputs of different sequences differ by about 0.1 here).
 */
enum { BATCH_P = 16, BATCH_W = 16, BATCH_D = 64, BATCH_HKV = 2, BATCH_HQ = 8, BATCH_SEQS = 4 };
static const uint32_t batch_tokens[BATCH_SEQS] = {5, 9 * BATCH_P + 3, 2 * BATCH_P + 7, BATCH_W + BATCH_P + 1};
static const uint32_t batch_rows[BATCH_SEQS] = {1, 1, 2, 1};

static double batch_gamma(double n) { return n * 0x1p-24 / (1.0 - n * 0x1p-24); }

/* Attention of the batch's sequences on a cache loaded from `image`: all in one call, or one call
 * each; out[i] is sequence i's [rows][HQ][D]. */
static void batch_attend(kvq_context *ctx, const void *image, size_t size, const uint32_t seqs[BATCH_SEQS],
                         float *const q[BATCH_SEQS],
                         float *out[BATCH_SEQS], int together) {
  kvq_cache *cache = NULL;
  KVQ_CHECK(ctx, kvq_cache_load_from_memory(ctx, image, size, &cache));
  kvq_attention_request req[BATCH_SEQS];
  for (uint32_t i = 0; i < BATCH_SEQS; i++) {
    const int64_t shape[3] = {batch_rows[i], BATCH_HQ, BATCH_D};
    req[i] = (kvq_attention_request){.sequence = seqs[i], .mask = KVQ_MASK_CAUSAL,
                                     .queries = kvq_tensor_host(q[i], KVQ_DTYPE_F32, 3, shape),
                                     .output = kvq_tensor_host(out[i], KVQ_DTYPE_F32, 3, shape)};
  }
  if (together) KVQ_CHECK(ctx, kvq_attention(cache, 0, req, BATCH_SEQS));
  else
    for (uint32_t i = 0; i < BATCH_SEQS; i++) KVQ_CHECK(ctx, kvq_attention(cache, 0, &req[i], 1));
  kvq_cache_destroy(cache);
}

/* The largest decoded key and value of every kept token of the cache loaded from `image`. */
static void batch_maxima(kvq_context *cpu, const void *image, size_t size, const uint32_t seqs[BATCH_SEQS], double *kmax,
                         double *vmax) {
  kvq_cache *cache = NULL;
  KVQ_CHECK(cpu, kvq_cache_load_from_memory(cpu, image, size, &cache));
  *kmax = *vmax = 0.0;
  for (uint32_t i = 0; i < BATCH_SEQS; i++) {
    kvq_sequence_info info;
    KVQ_CHECK(cpu, kvq_sequence_info_get(cache, seqs[i], 0, &info));
    const size_t n = (size_t)info.kept_tokens * BATCH_HKV * BATCH_D;
    float *k = malloc(n * 4), *v = malloc(n * 4);
    cr_assert(k && v);
    const int64_t shape[3] = {(int64_t)info.kept_tokens, BATCH_HKV, BATCH_D};
    kvq_tensor kt = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(v, KVQ_DTYPE_F32, 3, shape);
    KVQ_CHECK(cpu, kvq_dequantize(cache, seqs[i], 0, 0, info.kept_tokens, &kt, &vt));
    for (size_t j = 0; j < n; j++) {
      *kmax = fmax(*kmax, fabs(k[j]));
      *vmax = fmax(*vmax, fabs(v[j]));
    }
    free(k), free(v);
  }
  kvq_cache_destroy(cache);
}

static void check_batch(kvq_method_config keys, kvq_method_config values, kvq_policy_kind policy, uint64_t seed) {
  kvq_context *cpu = th_cpu_context(), *vk = gpu_context();
  kvq_layer_config layer = th_layer(BATCH_HQ, BATCH_HKV, BATCH_D, keys, values);
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F16, BATCH_P, BATCH_W, 32, BATCH_SEQS, seed);
  config.policy = kvq_policy_defaults(policy);
  kvq_cache *cache = NULL;
  KVQ_CHECK(cpu, kvq_cache_create(cpu, &config, &cache));
  float *q[BATCH_SEQS], *out[3][BATCH_SEQS];
  uint32_t n_max = 0, seqs[BATCH_SEQS];
  for (uint32_t i = 0; i < BATCH_SEQS; i++) {
    const uint32_t n = batch_tokens[i], rows = batch_rows[i];
    n_max = n > n_max ? n : n_max;
    KVQ_CHECK(cpu, kvq_sequence_add(cache, &seqs[i]));
    float *k = malloc(sizeof(float) * n * BATCH_HKV * BATCH_D), *v = malloc(sizeof(float) * n * BATCH_HKV * BATCH_D);
    cr_assert(k && v);
    for (uint32_t j = 0; j < n * BATCH_HKV * BATCH_D; j++) {
      const uint32_t x = j + 7919 * i; /* each sequence its own data */
      k[j] = (float)((x * 37) % 101) / 50.0f - 1.0f, v[j] = (float)((x * 53) % 97) / 48.0f - 1.0f;
    }
    th_append(cpu, cache, seqs[i], 0, k, v, 0, n, BATCH_HKV, BATCH_D, KVQ_DTYPE_F16);
    free(k), free(v);
    q[i] = malloc(sizeof(float) * rows * BATCH_HQ * BATCH_D);
    cr_assert(q[i]);
    for (uint32_t j = 0; j < rows * BATCH_HQ * BATCH_D; j++) q[i][j] = (float)(((j + 31 * i) * 29) % 89) / 44.0f - 1.0f;
    for (int r = 0; r < 3; r++) cr_assert((out[r][i] = malloc(sizeof(float) * rows * BATCH_HQ * BATCH_D)));
  }
  uint64_t size = 0;
  KVQ_CHECK(cpu, kvq_cache_save_size(cache, &size));
  void *image = malloc(size);
  size_t written = 0;
  cr_assert(image);
  KVQ_CHECK(cpu, kvq_cache_save_to_memory(cache, image, size, &written));
  kvq_cache_destroy(cache);

  batch_attend(cpu, image, written, seqs, q, out[0], 1);
  batch_attend(vk, image, written, seqs, q, out[1], 1);
  batch_attend(vk, image, written, seqs, q, out[2], 0);
  double kmax, vmax;
  batch_maxima(cpu, image, written, seqs, &kmax, &vmax);
  const double d = BATCH_D, scale = 1.0 / sqrt(d), xmax = d * kmax * scale;
  const double ds = (2.0 * batch_gamma(2 * d + 8) * d * kmax + batch_gamma(d) * d * d * kmax) * scale;
  const double e = (3.0 + 4.0 * xmax) * 0x1p-23;
  const double rel = 2.0 * (ds + e) + 2.0 * batch_gamma(n_max);
  const double bound = rel * vmax + 2.0 * batch_gamma(n_max + 2) * vmax + 2.0 * batch_gamma(2 * d + 8) * d * vmax + 1e-45;
  double worst = 0.0;
  for (uint32_t i = 0; i < BATCH_SEQS; i++) {
    const uint32_t floats = batch_rows[i] * BATCH_HQ * BATCH_D;
    cr_assert_eq(memcmp(out[1][i], out[2][i], sizeof(float) * floats), 0,
                 "sequence %u: the batch gives other bits than the sequence alone", i);
    for (uint32_t j = 0; j < floats; j++) worst = fmax(worst, fabs((double)out[1][i][j] - out[0][i][j]));
    for (uint32_t j = 0; j < floats; j++)
      cr_assert_leq(fabs((double)out[1][i][j] - out[0][i][j]), bound, "sequence %u output %u: %.9g on %s, %.9g on the CPU (bound %g)",
                    i, j, out[1][i][j], gpu_name(), out[0][i][j], bound);
  }
  cr_log_info("largest difference from the CPU %g, bound %g (K %g, V %g)", worst, bound, kmax, vmax);
  for (uint32_t i = 0; i < BATCH_SEQS; i++) {
    free(q[i]);
    for (int r = 0; r < 3; r++) free(out[r][i]);
  }
  free(image);
  kvq_context_destroy(cpu);
  kvq_context_destroy(vk);
}

Test(gpu, a_batch_of_sequences_runs_fused_in_one_call, .timeout = 300) {
  require_gpu();
  check_batch(th_kivi(2, BATCH_P), th_uniform(4, 32), KVQ_POLICY_KEEP_ALL, 21);
}

Test(gpu, a_batch_with_polarquant_values_runs_fused_in_one_call, .timeout = 300) {
  require_gpu();
  check_batch(th_polar(KVQ_ROTATION_DENSE), th_polar(KVQ_ROTATION_HADAMARD), KVQ_POLICY_KEEP_ALL, 22);
}

Test(gpu, a_batch_of_sequences_accumulates_in_one_call, .timeout = 300) {
  require_gpu();
  check_batch(th_exact(KVQ_DTYPE_F16), th_uniform(2, 32), KVQ_POLICY_H2O, 23);
}

/* ---- The H2O and Q-Hitter sums --------------------------------------------------------------------- */

/*
 * The attention each token receives (A_t, kvq_sequence_token_stats) under H2O and Q-Hitter, summed
 * by the GPU backend's attention (the fused path with the probability sums, core/gpu_plan.h, where
 * the backend has fused kernels) against the CPU backend's, from the same tokens: 150 tokens (pages
 * of 16 and a window of 16; three flash splits of 64, 64 and 22), GQA 2 (4 query heads, 2 kv heads),
 * d = 32, exact fp32 keys and values, keys, values and queries in [-1, 1]; a causal prefill block of
 * 8 rows, then one unmasked decode row.
 *
 * Tolerance, relative to A_t (every call's slot sum is a sum of nonnegative probabilities, so each
 * relative bound below carries over to A_t), u = 2^-24, to first order:
 *   - logits: the CPU's double dot times the scale rounded to fp32 (u |s|); the GPU's fp32 dot of d
 *     terms (gamma(d) sum |q_c k_c| <= gamma(d) d) times the scale (u |s|): with |s| <= d scale,
 *     |ds| <= delta = (gamma(d) + 2u) d scale, which moves a probability by at most 2 delta relative
 *     (numerator and normalizer);
 *   - the GPU's probabilities: Vulkan's exp within (3 + 2|x|) 2^-23 (docs/ACCURACY.md; CUDA's expf is
 *     tighter) plus its argument's rounding |x| u, for the fused path twice (p_t = e^(x_t - m_s) and
 *     f_s = e^(m_s - M) / L, |x_t - m_s| + |m_s - M| = M - x_t <= X = 2 d scale, the logit range):
 *     (12 + 5X) u; L: those weights' (12 + 5X) u, FLASH's split sums (< 64 roundings), w l_s (1), the
 *     normalization's sum of S splits (S); the division and the product (2): 2 (12 + 5X) u + (67 + S) u;
 *     the unfused softmax instead: one exp (6 + 5X) u, its sum of n terms (n), the division (1),
 *     below the sum of both, which is taken: (10 X + n + S + 97) u;
 *   - each call's slot sum: the GPU's fp32 sum of R = 8 x 4 probabilities ((R - 1) u), the CPU's
 *     fp32 probabilities summed in double and rounded once (2u, its double exps below u): (R + 1) u.
 * So |A_gpu - A_cpu| <= (2 delta + (10 X + n + S + R + 98) u) A_cpu, times 1 + 2^-9 for the
 * second-order terms (the relative terms are below 2^-10); about 4.7e-5 relative here, while a sum
 * that took another split's factor, or missed the normalization, is off by far more than 1%.
 */
Test(gpu, attention_sums_agree_with_the_cpu, .timeout = 300) {
  require_gpu();
  enum { N = 150, D = 32, HQ = 4, HKV = 2, P = 16, W = 16, ROWS = 8 };
  kvq_layer_config layer = th_layer(HQ, HKV, D, th_exact(KVQ_DTYPE_F32), th_exact(KVQ_DTYPE_F32));
  float *k = malloc(sizeof(float) * N * HKV * D), *v = malloc(sizeof(float) * N * HKV * D), q[(ROWS + 1) * HQ * D],
        out[(ROWS + 1) * HQ * D];
  cr_assert(k && v);
  for (int i = 0; i < N * HKV * D; i++) k[i] = (float)((i * 37) % 101) / 50.0f - 1.0f, v[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
  for (int i = 0; i < (ROWS + 1) * HQ * D; i++) q[i] = (float)((i * 29) % 89) / 44.0f - 1.0f;
  const double scale = 1.0 / sqrt((double)D), u = 0x1p-24, X = 2.0 * D * scale;
  const double delta = (D * u / (1.0 - D * u) + 2.0 * u) * D * scale;
  const double S = (N + 63) / 64, R = ROWS * HQ;
  const double relative = (2.0 * delta + (10.0 * X + N + S + R + 98.0) * u) * (1.0 + 0x1p-9);
  cr_assert_lt(relative, 0x1p-10, "the first-order condition");
  const kvq_policy_kind kinds[2] = {KVQ_POLICY_H2O, KVQ_POLICY_QHITTER};
  for (int p = 0; p < 2; p++) {
    kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, P, W, N / P + 2, 1, 31);
    config.policy = kvq_policy_defaults(kinds[p]);
    kvq_token_stats *stats[2];
    size_t counts[2];
    kvq_context *ctxs[2] = {th_cpu_context(), gpu_context()};
    for (int c = 0; c < 2; c++) {
      kvq_cache *cache;
      uint32_t seq;
      KVQ_CHECK(ctxs[c], kvq_cache_create(ctxs[c], &config, &cache));
      KVQ_CHECK(ctxs[c], kvq_sequence_add(cache, &seq));
      th_append(ctxs[c], cache, seq, 0, k, v, 0, N, HKV, D, KVQ_DTYPE_F32);
      for (int call = 0; call < 2; call++) { /* the prefill block (causal), then a decode row (unmasked) */
        const int64_t shape[3] = {call ? 1 : ROWS, HQ, D};
        float *rows = q + (call ? ROWS * HQ * D : 0);
        kvq_attention_request req = {.sequence = seq, .mask = call ? KVQ_MASK_NONE : KVQ_MASK_CAUSAL,
                                     .queries = kvq_tensor_host(rows, KVQ_DTYPE_F32, 3, shape),
                                     .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, shape)};
        KVQ_CHECK(ctxs[c], kvq_attention(cache, 0, &req, 1));
      }
      KVQ_CHECK(ctxs[c], kvq_sequence_token_stats(cache, seq, NULL, 0, &counts[c]));
      cr_assert_eq(counts[c], N, "every token has statistics");
      stats[c] = malloc(sizeof(kvq_token_stats) * N);
      cr_assert(stats[c]);
      KVQ_CHECK(ctxs[c], kvq_sequence_token_stats(cache, seq, stats[c], N, &counts[c]));
      kvq_cache_destroy(cache);
      kvq_context_destroy(ctxs[c]);
    }
    double worst = 0.0, total = 0.0;
    for (uint32_t t = 0; t < N; t++) {
      const double cpu = stats[0][t].attention, gpu = stats[1][t].attention;
      cr_assert_eq(stats[1][t].position, stats[0][t].position);
      cr_assert_gt(cpu, 0.0, "token %u is seen by the decode row", t);
      total += cpu;
      worst = fmax(worst, fabs(gpu - cpu) / cpu);
      cr_assert_leq(fabs(gpu - cpu), relative * cpu, "%s, A_%u: %.9g on %s, %.9g on the CPU (relative bound %g)",
                    p ? "Q-Hitter" : "H2O", t, gpu, gpu_name(), cpu, relative);
    }
    /* every row's probabilities sum to 1: the CPU's A_t add up to the rows x heads attended */
    cr_assert_leq(fabs(total - (ROWS + 1) * HQ), 1e-4, "the CPU's sums add up to %g", total);
    cr_log_info("%s: largest relative difference from the CPU %g, bound %g", p ? "Q-Hitter" : "H2O", worst, relative);
    free(stats[0]), free(stats[1]);
  }
  free(k), free(v);
}
