/* Determinism on one backend: the same inputs and seed give the same saved cache (codes, side data,
 * matrices: every byte kvq_cache_save_to_memory writes) and the same attention outputs and scores,
 * bit for bit, from one run to the next in a process and in another process (a fork that runs the
 * same scenario from scratch). Runs on each backend available here: cpu, vulkan (lavapipe in CI) and
 * cuda (the emulated one: meson sets KVQ_CUDA_EMULATOR=1); an unavailable backend skips, saying why.
 * No tolerance: nothing in kvq may depend on timing, addresses or thread scheduling.
 *
 * Agreement between backends is tested elsewhere (docs/RELIABILITY.md, "Determinism"): codes against
 * the committed golden files on every backend (tests/test_golden.c, test_gpu.c), and the emulated
 * CUDA backend's saved caches against the CPU's, byte for byte (tests/test_cuda.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/sha256.h"
#include "helpers.h"

enum { HQ = 4, HKV = 2, D = 64, P = 16, R = 16, TOKENS = 100, FIRST = 61, NQ = 4, LAYERS = 3 };

static const char *kind_name(kvq_backend_kind kind) {
  return kind == KVQ_BACKEND_CPU ? "cpu" : kind == KVQ_BACKEND_VULKAN ? "vulkan" : "cuda";
}

/* What a run leaves: the digests of the saved cache, of every layer's attention outputs and of every
 * layer's probabilities (a digest differs when any bit does). */
typedef struct result {
  uint8_t saved[32], outputs[32], scores[32];
  size_t saved_size;
} result;

/* One run from scratch: a context, a cache of three layers (QJL keys with 2-bit uniform values,
 * PolarQuant keys with KIVI values, exact fp16), one sequence of 100 synthetic tokens appended in
 * two calls (the last page partial, a window in full precision), a causal block of 4 queries per
 * layer through kvq_attention and kvq_scores, then the saved bytes. No assertion here: a forked
 * child runs it too. Returns the first failure. */
static kvq_status run(kvq_backend_kind kind, result *out) {
  memset(out, 0, sizeof *out);
  kvq_context_options options = kvq_context_options_default();
  options.backend = kind;
  kvq_context *ctx = NULL;
  kvq_status st = kvq_context_create(&options, &ctx);
  if (st != KVQ_OK) return st;
  kvq_layer_config layers[LAYERS] = {
      th_layer(HQ, HKV, D, kvq_method_defaults(KVQ_METHOD_QJL, D), th_uniform(2, 32)),
      th_layer(HQ, HKV, D, th_polar(KVQ_ROTATION_DENSE), th_kivi(2, 0)),
      th_layer(HQ, HKV, D, th_exact(KVQ_DTYPE_F16), th_exact(KVQ_DTYPE_F16)),
  };
  kvq_cache_config config = th_config(layers, LAYERS, KVQ_DTYPE_F32, P, R, 16, 2, 20261126);
  kvq_cache *cache = NULL;
  uint32_t seq = 0;
  float *k = malloc(sizeof(float) * TOKENS * HKV * D), *v = malloc(sizeof(float) * TOKENS * HKV * D);
  float *q = malloc(sizeof(float) * TOKENS * HQ * D);
  float *o = calloc((size_t)LAYERS * NQ * HQ * D, sizeof(float)), *s = calloc((size_t)LAYERS * NQ * HQ * TOKENS, sizeof(float));
  uint8_t *saved = NULL;
  if (!k || !v || !q || !o || !s) st = KVQ_ERROR_OUT_OF_MEMORY;
  kvq_synth_config synth = kvq_synth_defaults(TOKENS, HKV, HQ, D, 4242);
  if (st == KVQ_OK) st = kvq_synth_generate(&synth, k, v, q);
  if (st == KVQ_OK) st = kvq_cache_create(ctx, &config, &cache);
  if (st == KVQ_OK) st = kvq_sequence_add(cache, &seq);
  for (uint32_t l = 0; l < LAYERS && st == KVQ_OK; l++)
    for (uint32_t part = 0; part < 2 && st == KVQ_OK; part++) {
      const uint32_t first = part ? FIRST : 0, count = part ? TOKENS - FIRST : FIRST;
      const int64_t shape[3] = {count, HKV, D};
      const kvq_tensor kt = kvq_tensor_host(k + (size_t)first * HKV * D, KVQ_DTYPE_F32, 3, shape);
      const kvq_tensor vt = kvq_tensor_host(v + (size_t)first * HKV * D, KVQ_DTYPE_F32, 3, shape);
      st = kvq_append(cache, seq, l, &kt, &vt);
    }
  const int64_t qshape[3] = {NQ, HQ, D}, sshape[3] = {NQ, HQ, TOKENS};
  const kvq_tensor queries = kvq_tensor_host(q + (size_t)(TOKENS - NQ) * HQ * D, KVQ_DTYPE_F32, 3, qshape);
  for (uint32_t l = 0; l < LAYERS && st == KVQ_OK; l++) {
    kvq_attention_request request = {.sequence = seq, .mask = KVQ_MASK_CAUSAL, .queries = queries,
                                     .output = kvq_tensor_host(o + (size_t)l * NQ * HQ * D, KVQ_DTYPE_F32, 3, qshape)};
    st = kvq_attention(cache, l, &request, 1);
    const kvq_tensor scores = kvq_tensor_host(s + (size_t)l * NQ * HQ * TOKENS, KVQ_DTYPE_F32, 3, sshape);
    if (st == KVQ_OK) st = kvq_scores(cache, seq, l, &queries, KVQ_MASK_CAUSAL, KVQ_SCORES_PROBABILITIES, &scores);
  }
  uint64_t size = 0;
  if (st == KVQ_OK) st = kvq_cache_save_size(cache, &size);
  if (st == KVQ_OK && !(saved = malloc(size))) st = KVQ_ERROR_OUT_OF_MEMORY;
  if (st == KVQ_OK) st = kvq_cache_save_to_memory(cache, saved, size, &out->saved_size);
  if (st == KVQ_OK) {
    kvq_sha256_digest(saved, out->saved_size, out->saved);
    kvq_sha256_digest(o, sizeof(float) * LAYERS * NQ * HQ * D, out->outputs);
    kvq_sha256_digest(s, sizeof(float) * LAYERS * NQ * HQ * TOKENS, out->scores);
  }
  free(saved);
  free(k);
  free(v);
  free(q);
  free(o);
  free(s);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  return st;
}

/* Skips (visibly, with the reason) when the backend is unavailable here. */
static void require_backend(kvq_backend_kind kind) {
  kvq_backend_info infos[4];
  size_t count = 0;
  cr_assert_eq(kvq_backends_list(infos, 4, &count), KVQ_OK);
  for (size_t i = 0; i < count; i++)
    if (infos[i].kind == kind && infos[i].availability != KVQ_AVAILABLE)
      cr_skip_test("the %s backend is unavailable here: %s", kind_name(kind), infos[i].reason);
}

static void assert_same(const result *a, const result *b, const char *between, kvq_backend_kind kind) {
  char x[65], y[65];
  kvq_sha256_hex(a->saved, x);
  kvq_sha256_hex(b->saved, y);
  cr_log_info("%s, %s: saved cache %zu bytes, sha256 %s / %s", kind_name(kind), between, a->saved_size, x, y);
  cr_assert_eq(a->saved_size, b->saved_size, "%s, %s: saved sizes differ", kind_name(kind), between);
  cr_assert(!memcmp(a->saved, b->saved, 32), "%s, %s: the saved caches differ (sha256 %s, %s)", kind_name(kind), between, x, y);
  cr_assert(!memcmp(a->outputs, b->outputs, 32), "%s, %s: the attention outputs differ", kind_name(kind), between);
  cr_assert(!memcmp(a->scores, b->scores, 32), "%s, %s: the scores differ", kind_name(kind), between);
}

/* Two runs in this process. */
static void across_runs(kvq_backend_kind kind) {
  require_backend(kind);
  result a, b;
  kvq_status st = run(kind, &a);
  cr_assert_eq(st, KVQ_OK, "first run on %s: %s", kind_name(kind), kvq_status_string(st));
  st = run(kind, &b);
  cr_assert_eq(st, KVQ_OK, "second run on %s: %s", kind_name(kind), kvq_status_string(st));
  assert_same(&a, &b, "two runs in one process", kind);
}

/* A run in a forked child, started before this process touched any backend, and one here. */
static void across_processes(kvq_backend_kind kind) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  const pid_t child = fork();
  cr_assert_neq(child, -1, "fork: %s", strerror(errno));
  if (child == 0) {
    close(fds[0]);
    result r;
    const kvq_status st = run(kind, &r);
    const ssize_t wrote = st == KVQ_OK ? write(fds[1], &r, sizeof r) : 0;
    _exit(st == KVQ_OK && wrote == (ssize_t)sizeof r ? 0 : st == KVQ_ERROR_BACKEND_UNAVAILABLE ? 77 : 1);
  }
  close(fds[1]);
  result theirs, ours;
  const ssize_t got = read(fds[0], &theirs, sizeof theirs);
  close(fds[0]);
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) require_backend(kind); /* skips, saying why */
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0 && got == (ssize_t)sizeof theirs,
            "the child's run on %s failed (status %d)", kind_name(kind), status);
  require_backend(kind);
  const kvq_status st = run(kind, &ours);
  cr_assert_eq(st, KVQ_OK, "run on %s: %s", kind_name(kind), kvq_status_string(st));
  assert_same(&theirs, &ours, "two processes", kind);
}

#define ON_EVERY_BACKEND(name)                                      \
  Test(determinism_cpu, name, .timeout = 300) { name(KVQ_BACKEND_CPU); }       \
  Test(determinism_vulkan, name, .timeout = 300) { name(KVQ_BACKEND_VULKAN); } \
  Test(determinism_cuda, name, .timeout = 300) { name(KVQ_BACKEND_CUDA); }

ON_EVERY_BACKEND(across_runs)
ON_EVERY_BACKEND(across_processes)
