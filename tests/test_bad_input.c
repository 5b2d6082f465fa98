/* Bad input, function by function. The rule: bad input gets a clear status code and a message, and
 * changes nothing -- no partial writes, no abort, no exit() inside the library. Every rejected call
 * below is checked for
 *   - the exact kvq_status;
 *   - a fresh, non-empty kvq_context_last_error() naming the offending parameter where that is
 *     reasonable (the context is first primed with a known message, so a stale one is caught);
 *   - an unchanged cache: memory report, every live sequence's info in every layer, every kept token
 *     decoded, and the bytes kvq_cache_save_to_memory() writes, compared before and after;
 *   - untouched outputs: output tensors and out-parameters keep their sentinel bytes, and `**out`
 *     parameters are NULL after a failure. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "core/sha256.h"
#include "core/tensor.h"
#include "helpers.h"

enum { HQ = 4, HKV = 2, D = 32, P = 16, R = 16, MAX_PAGES = 8, MAX_SEQS = 4 };
/* The longest sequence the fixture cache can hold: every page plus a full window. */
enum { SEQ_LIMIT = MAX_PAGES * P + R + P };
enum { A, B, C };

#define SENTINEL 0xA5
#define PRIMER_MARK "kvq-primer"
#define PRIMER_PATH "/nonexistent-" PRIMER_MARK "/primer.kvq"

/* ---- Shared fixtures ------------------------------------------------------------------------- */

/* Everything observable of a cache (see snap()). */
typedef struct snapshot {
  kvq_memory_report report;
  kvq_sequence_info info[3][2];
  float *decoded[3][2][2]; /* [sequence][layer][keys, values] */
  uint8_t *file;
  size_t file_size;
} snapshot;

/*
 * Layer 0: QJL keys + 2-bit uniform values; layer 1: exact fp16 keys and values. 4 query heads,
 * 2 kv heads, head dim 32, page size 16, window 16, 8 pages, 4 sequence slots.
 *   a: 72 tokens in layer 0 and 70 in layer 1 (3 pages, the rest in the window);
 *   b: 20 tokens in layer 0, flushed (a partial page), none in layer 1;
 *   c: empty.
 * 5 of 8 pages and 3 of 4 slots are in use. `stale` is the id of a freed sequence whose slot b reuses.
 */
typedef struct fixture {
  kvq_context *ctx;
  kvq_cache *cache;
  kvq_layer_config layers[2];
  uint32_t layer_count;
  kvq_dtype input;
  kvq_policy_kind policy;
  uint32_t seq[3];
  int live[3];
  uint32_t stale;
  snapshot ref; /* the state every rejected call must leave behind (taken lazily) */
  int has_ref;
} fixture;

static void invalidate(fixture *f);

static float *random_tokens(uint32_t n, uint32_t heads, uint32_t seed) {
  const size_t count = (size_t)n * heads * D;
  float *x = malloc(sizeof(float) * (count ? count : 1));
  cr_assert_not_null(x);
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < count; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 3.0f; /* [-1.5, 1.5) */
  }
  return x;
}

/* Keys and values [n][HKV][D] as host tensors in `dtype`, converted from fp32 arrays. */
typedef struct kv {
  kvq_tensor k, v;
  void *ks, *vs;
  float *kf, *vf;
} kv;

static kv kv_from(float *kf, float *vf, kvq_dtype dtype, uint32_t n) {
  kv x = {.kf = kf, .vf = vf};
  x.k = th_tensor_from_f32(kf, dtype, n, HKV, D, &x.ks);
  x.v = th_tensor_from_f32(vf, dtype, n, HKV, D, &x.vs);
  return x;
}

static kv kv_random(kvq_dtype dtype, uint32_t n, uint32_t seed) {
  return kv_from(random_tokens(n, HKV, seed), random_tokens(n, HKV, seed + 1000), dtype, n);
}

static void kv_free(kv *x) {
  free(x->ks);
  free(x->vs);
  free(x->kf);
  free(x->vf);
}

static void append_ok(fixture *f, uint32_t seq, uint32_t layer, uint32_t n, uint32_t seed) {
  invalidate(f);
  kv x = kv_random(f->input, n, seed);
  KVQ_CHECK(f->ctx, kvq_append(f->cache, seq, layer, &x.k, &x.v));
  kv_free(&x);
}

static kvq_method_config method(kvq_method m) { return kvq_method_defaults(m, D); }

/* The default fixture (above) under a token policy; zeroed: KEEP_ALL. */
static void build_full(fixture *f, kvq_dtype input, kvq_policy_config policy) {
  memset(f, 0, sizeof *f);
  f->input = input;
  f->policy = policy.kind;
  f->layer_count = 2;
  f->layers[0] = th_layer(HQ, HKV, D, method(KVQ_METHOD_QJL), method(KVQ_METHOD_UNIFORM));
  f->layers[1] = th_layer(HQ, HKV, D, method(KVQ_METHOD_EXACT), method(KVQ_METHOD_EXACT));
  kvq_cache_config config = th_config(f->layers, 2, input, P, R, MAX_PAGES, MAX_SEQS, 2024);
  config.policy = policy;
  f->ctx = th_cpu_context();
  KVQ_CHECK(f->ctx, kvq_cache_create(f->ctx, &config, &f->cache));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seq[A]));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->stale));
  KVQ_CHECK(f->ctx, kvq_sequence_free(f->cache, f->stale));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seq[B]));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seq[C]));
  cr_assert_neq(f->stale, f->seq[B]);
  append_ok(f, f->seq[A], 0, 40, 1);
  append_ok(f, f->seq[A], 0, 32, 2);
  append_ok(f, f->seq[A], 1, 70, 3);
  append_ok(f, f->seq[B], 0, 20, 4);
  KVQ_CHECK(f->ctx, kvq_flush(f->cache, f->seq[B]));
  for (int i = 0; i < 3; i++) f->live[i] = 1;
  kvq_memory_report r;
  KVQ_CHECK(f->ctx, kvq_cache_memory(f->cache, &r));
  cr_assert_eq(r.pages_used, 5, "fixture: %u pages used", r.pages_used);
  cr_assert_eq(r.sequences_used, 3);
}

static void build_with(fixture *f, kvq_dtype input) { build_full(f, input, (kvq_policy_config){0}); }

static void build(fixture *f) { build_with(f, KVQ_DTYPE_F16); }

/* Tokens of c the policy of build_policy() evicts: STREAMING every candidate, H2O all but
 * floor(0.2 * 64) = 12 of them (no attention yet, so ties keep the older tokens). */
enum { POLICY_C_TOKENS = 64, STREAMING_EVICTED = 28, H2O_EVICTED = 16 };

/*
 * The default fixture under a STREAMING or H2O policy with its defaults (sinks 4, recent the
 * minimum R + P = 32). a and b are as there (a's layers hold different token counts, so the policy
 * never ran on it); c holds 64 tokens in both layers, and the policy then ran on it: candidates are
 * positions [4, 32), of which STREAMING evicts all and H2O positions 16..31. Either way page 1 of c
 * went back to the pool: 7 of 8 pages are in use.
 */
static void build_policy(fixture *f, kvq_policy_kind kind) {
  cr_assert(kind == KVQ_POLICY_STREAMING || kind == KVQ_POLICY_H2O);
  build_full(f, KVQ_DTYPE_F16, kvq_policy_defaults(kind));
  append_ok(f, f->seq[C], 0, POLICY_C_TOKENS, 6);
  append_ok(f, f->seq[C], 1, POLICY_C_TOKENS, 7);
  KVQ_CHECK(f->ctx, kvq_sequence_apply_policy(f->cache, f->seq[C]));
  const uint64_t kept = POLICY_C_TOKENS - (kind == KVQ_POLICY_STREAMING ? STREAMING_EVICTED : H2O_EVICTED);
  for (uint32_t l = 0; l < 2; l++) {
    kvq_sequence_info info;
    KVQ_CHECK(f->ctx, kvq_sequence_info_get(f->cache, f->seq[C], l, &info));
    cr_assert(info.tokens == POLICY_C_TOKENS && info.kept_tokens == kept,
              "fixture: c keeps %llu of %llu tokens in layer %u", (unsigned long long)info.kept_tokens,
              (unsigned long long)info.tokens, l);
  }
  kvq_memory_report r;
  KVQ_CHECK(f->ctx, kvq_cache_memory(f->cache, &r));
  cr_assert_eq(r.pages_used, 7, "fixture: %u pages used", r.pages_used);
}

/* The default fixture (KEEP_ALL) or that of build_policy(). */
static void build_kind(fixture *f, kvq_policy_kind kind) {
  if (kind == KVQ_POLICY_KEEP_ALL) build(f);
  else build_policy(f, kind);
}

/* A one-layer cache with the given methods and sequence a of 20 tokens (b and c do not exist). */
static void build_single(fixture *f, kvq_dtype input, kvq_method_config keys, kvq_method_config values) {
  memset(f, 0, sizeof *f);
  f->input = input;
  f->layer_count = 1;
  f->layers[0] = th_layer(HQ, HKV, D, keys, values);
  kvq_cache_config config = th_config(f->layers, 1, input, P, R, MAX_PAGES, MAX_SEQS, 7);
  f->ctx = th_cpu_context();
  KVQ_CHECK(f->ctx, kvq_cache_create(f->ctx, &config, &f->cache));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seq[A]));
  f->live[A] = 1;
  append_ok(f, f->seq[A], 0, 20, 5);
}

/* Methods that learn codebooks: CQ (4 channels of 4 bits, at most 8 Lloyd iterations: quick to
 * learn) and PolarQuant with online codebooks. */
static kvq_method_config cq_method(void) {
  kvq_method_config m = method(KVQ_METHOD_CQ);
  m.cq = (kvq_cq_config){.channels = 4, .bits = 4, .iterations = 8};
  return m;
}

static kvq_method_config polar_online(void) {
  kvq_method_config m = method(KVQ_METHOD_POLAR);
  m.polar.codebook = KVQ_CODEBOOK_ONLINE;
  return m;
}

enum { CALIBRATION = 48 };

/* Layer 0 with the given methods, layer 1 exact fp16 keys and values (which learn nothing). */
static kvq_cache_config codebook_config(kvq_layer_config layers[2], kvq_method_config keys, kvq_method_config values,
                                        uint64_t seed) {
  layers[0] = th_layer(HQ, HKV, D, keys, values);
  layers[1] = th_layer(HQ, HKV, D, method(KVQ_METHOD_EXACT), method(KVQ_METHOD_EXACT));
  return th_config(layers, 2, KVQ_DTYPE_F16, P, R, MAX_PAGES, MAX_SEQS, seed);
}

/*
 * Layer 0 learns codebooks with `keys` and `values`, layer 1 learns none (codebook_config). Sequence
 * a holds 24 tokens in layer 1 and none in layer 0, so codebooks may still be learned (b and c do
 * not exist). With `learned`, layer 0's codebooks are learned from 48 calibration tokens first.
 */
static void build_codebooks_with(fixture *f, kvq_method_config keys, kvq_method_config values, int learned) {
  memset(f, 0, sizeof *f);
  f->input = KVQ_DTYPE_F16;
  f->layer_count = 2;
  kvq_cache_config config = codebook_config(f->layers, keys, values, 11);
  f->ctx = th_cpu_context();
  KVQ_CHECK(f->ctx, kvq_cache_create(f->ctx, &config, &f->cache));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seq[A]));
  f->live[A] = 1;
  append_ok(f, f->seq[A], 1, 24, 9);
  if (learned) { /* tokens in another layer do not stand in the way */
    kv x = kv_random(KVQ_DTYPE_F32, CALIBRATION, 8);
    KVQ_CHECK(f->ctx, kvq_codebooks_learn(f->cache, 0, &x.k, &x.v, NULL));
    kv_free(&x);
  }
}

/* CQ keys and PolarQuant values with online codebooks in layer 0. */
static void build_codebooks(fixture *f, int learned) { build_codebooks_with(f, cq_method(), polar_online(), learned); }

/* Whether an id is one the fixture holds live (ids meant to be unknown are skipped if so). */
static int issued(const fixture *f, uint32_t id) {
  for (int i = 0; i < 3; i++)
    if (f->live[i] && f->seq[i] == id) return 1;
  return 0;
}

/* Frees sequence i on purpose. */
static void free_seq(fixture *f, int i) {
  invalidate(f);
  KVQ_CHECK(f->ctx, kvq_sequence_free(f->cache, f->seq[i]));
  f->live[i] = 0;
}

static void destroy(fixture *f) {
  invalidate(f);
  kvq_cache_destroy(f->cache);
  kvq_context_destroy(f->ctx);
}

/* Runs `check` on a fresh fixture under each policy kind in turn. */
static void for_each_policy(const kvq_policy_kind *kinds, size_t count, void (*check)(fixture *f)) {
  for (size_t k = 0; k < count; k++) {
    fixture f;
    build_kind(&f, kinds[k]);
    check(&f);
    destroy(&f);
  }
}
#define FOR_EACH_POLICY(check, ...)                                                                              \
  do {                                                                                                           \
    const kvq_policy_kind k_[] = {__VA_ARGS__};                                                                  \
    for_each_policy(k_, sizeof k_ / sizeof k_[0], (check));                                                      \
  } while (0)

/* ---- Snapshots: everything observable of a cache -------------------------------------------- */

static void snap(fixture *f, snapshot *s) {
  memset(s, 0, sizeof *s);
  KVQ_CHECK(f->ctx, kvq_cache_memory(f->cache, &s->report));
  s->report.scratch_bytes = 0; /* scratch grows with the snapshot's own dequantize calls: not a change */
  for (int i = 0; i < 3; i++) {
    if (!f->live[i]) continue;
    for (uint32_t l = 0; l < f->layer_count; l++) {
      KVQ_CHECK(f->ctx, kvq_sequence_info_get(f->cache, f->seq[i], l, &s->info[i][l]));
      /* kvq_dequantize indexes the kept tokens: fewer than those appended once a policy evicted some */
      const uint64_t n = s->info[i][l].kept_tokens;
      if (n == 0) continue;
      int64_t shape[3] = {(int64_t)n, HKV, D};
      for (int side = 0; side < 2; side++) {
        s->decoded[i][l][side] = malloc(sizeof(float) * n * HKV * D);
        cr_assert_not_null(s->decoded[i][l][side]);
      }
      kvq_tensor kt = kvq_tensor_host(s->decoded[i][l][0], KVQ_DTYPE_F32, 3, shape);
      kvq_tensor vt = kvq_tensor_host(s->decoded[i][l][1], KVQ_DTYPE_F32, 3, shape);
      KVQ_CHECK(f->ctx, kvq_dequantize(f->cache, f->seq[i], l, 0, n, &kt, &vt));
    }
  }
  uint64_t size = 0;
  KVQ_CHECK(f->ctx, kvq_cache_save_size(f->cache, &size));
  s->file = malloc((size_t)size);
  cr_assert_not_null(s->file);
  KVQ_CHECK(f->ctx, kvq_cache_save_to_memory(f->cache, s->file, (size_t)size, &s->file_size));
  cr_assert_eq(s->file_size, size);
}

static void snap_free(snapshot *s) {
  for (int i = 0; i < 3; i++)
    for (int l = 0; l < 2; l++)
      for (int side = 0; side < 2; side++) free(s->decoded[i][l][side]);
  free(s->file);
}

/* Compares the cache with `before` (which is kept). */
static void expect_unchanged(fixture *f, const snapshot *before, const char *what) {
  snapshot after;
  snap(f, &after);
  cr_assert_eq(memcmp(&before->report, &after.report, sizeof after.report), 0,
               "%s changed the memory report (pages used %u -> %u, sequences %u -> %u)", what, before->report.pages_used,
               after.report.pages_used, before->report.sequences_used, after.report.sequences_used);
  for (int i = 0; i < 3; i++) {
    if (!f->live[i]) continue;
    for (uint32_t l = 0; l < f->layer_count; l++) {
      const kvq_sequence_info *x = &before->info[i][l], *y = &after.info[i][l];
      cr_assert(x->tokens == y->tokens && x->quantized_tokens == y->quantized_tokens && x->pages == y->pages &&
                    x->kept_tokens == y->kept_tokens,
                "%s changed sequence %d layer %u: tokens %llu -> %llu, quantized %llu -> %llu, pages %u -> %u, "
                "kept %llu -> %llu",
                what, i, l, (unsigned long long)x->tokens, (unsigned long long)y->tokens,
                (unsigned long long)x->quantized_tokens, (unsigned long long)y->quantized_tokens, x->pages, y->pages,
                (unsigned long long)x->kept_tokens, (unsigned long long)y->kept_tokens);
      for (int side = 0; side < 2; side++)
        if (x->kept_tokens)
          cr_assert_eq(memcmp(before->decoded[i][l][side], after.decoded[i][l][side],
                              sizeof(float) * x->kept_tokens * HKV * D),
                       0, "%s changed the %s of sequence %d layer %u", what, side ? "values" : "keys", i, l);
    }
  }
  cr_assert(before->file_size == after.file_size && memcmp(before->file, after.file, after.file_size) == 0,
            "%s changed the saved bytes of the cache (%zu -> %zu bytes)", what, before->file_size, after.file_size);
  snap_free(&after);
}

/* Takes the reference snapshot unless there is one: rejected calls never change it. */
static void remember(fixture *f) {
  if (f->has_ref) return;
  snap(f, &f->ref);
  f->has_ref = 1;
}

/* Call before changing the cache on purpose. */
static void invalidate(fixture *f) {
  if (!f->has_ref) return;
  snap_free(&f->ref);
  f->has_ref = 0;
}

static void check_unchanged(fixture *f, const char *what) { expect_unchanged(f, &f->ref, what); }

/* ---- Failure checks ---------------------------------------------------------------------------- */

/* Sets a known message on the context, so that a failure that sets none is caught. */
static void prime(kvq_context *ctx) {
  kvq_cache *none = NULL;
  (void)kvq_cache_load(ctx, PRIMER_PATH, &none);
  cr_assert(strstr(kvq_context_last_error(ctx), PRIMER_MARK) != NULL, "priming the message failed: \"%s\"",
            kvq_context_last_error(ctx));
}

static void expect_failure(kvq_context *ctx, kvq_status got, kvq_status want, const char *mention, const char *what) {
  const char *msg = ctx ? kvq_context_last_error(ctx) : "";
  cr_assert_not_null(msg);
  cr_assert_eq(got, want, "%s: returned %s (\"%s\"), expected %s", what, kvq_status_string(got), msg,
               kvq_status_string(want));
  if (!ctx) return;
  cr_assert(msg[0] != 0, "%s: no error message", what);
  cr_assert(strstr(msg, PRIMER_MARK) == NULL, "%s: the error message was not set (still \"%s\")", what, msg);
  if (mention) cr_assert(strstr(msg, mention) != NULL, "%s: message \"%s\" does not mention \"%s\"", what, msg, mention);
}

static void expect_mention(kvq_context *ctx, const char *mention, const char *what) {
  const char *msg = kvq_context_last_error(ctx);
  cr_assert(strstr(msg, mention) != NULL, "%s: message \"%s\" does not mention \"%s\"", what, msg, mention);
}

static void begin(fixture *f) {
  remember(f);
  prime(f->ctx);
}

static void end(fixture *f, kvq_status got, kvq_status want, const char *mention, const char *what) {
  expect_failure(f->ctx, got, want, mention, what);
  check_unchanged(f, what);
}

/* A call on the fixture's cache must fail with `want`, a message mentioning `mention`, and change nothing;
 * `what` names the call in failure messages. */
#define REJECTS_AS(f, what, call, want, mention)                                                                   \
  do {                                                                                                             \
    begin((f));                                                                                                    \
    kvq_status st_ = (call);                                                                                       \
    end((f), st_, (want), (mention), (what));                                                                      \
  } while (0)

/* The same without a context to hold a message (a NULL cache). */
#define REJECTS_SILENTLY_AS(f, what, call, want)                                                                   \
  do {                                                                                                             \
    remember((f));                                                                                                 \
    kvq_status st_ = (call);                                                                                       \
    expect_failure(NULL, st_, (want), NULL, (what));                                                               \
    check_unchanged((f), (what));                                                                                  \
  } while (0)

#define REJECTS(f, call, want, mention) REJECTS_AS(f, #call, call, want, mention)
#define REJECTS_SILENTLY(f, call, want) REJECTS_SILENTLY_AS(f, #call, call, want)

/* "variant: call", for a call through a function pointer of one variant of a check (its text alone,
 * "s->size(NULL, &bytes)", would not say which function failed). One at a time: the text is static. */
static const char *via(const char *variant, const char *call) {
  static char text[256];
  snprintf(text, sizeof text, "%s: %s", variant, call);
  return text;
}
#define REJECTS_VIA(f, variant, call, want, mention) REJECTS_AS(f, via((variant), #call), call, want, mention)
#define REJECTS_SILENTLY_VIA(f, variant, call, want) REJECTS_SILENTLY_AS(f, via((variant), #call), call, want)

/* A getter's NULL arguments: without a cache there is no context for a message, and the out-parameter
 * keeps its sentinel bytes; without an out-parameter the message names it (`mention`). */
#define REJECTS_NULL_GETTER_ARGUMENTS(f, variant, getter, out_type, mention)                                     \
  do {                                                                                                             \
    out_type out_;                                                                                                 \
    memset(&out_, SENTINEL, sizeof out_);                                                                          \
    REJECTS_SILENTLY_VIA((f), (variant), getter(NULL, &out_), KVQ_ERROR_INVALID_ARGUMENT);                         \
    expect_untouched(&out_, sizeof out_, via((variant), #getter "(NULL, &out)"));                                  \
    REJECTS_VIA((f), (variant), getter((f)->cache, NULL), KVQ_ERROR_INVALID_ARGUMENT, (mention));                  \
  } while (0)

/* ---- Sentinel-filled outputs ------------------------------------------------------------------ */

typedef struct out_buf {
  void *data;
  size_t bytes;
} out_buf;

static kvq_tensor tensor3(void *data, kvq_dtype dtype, int64_t n0, int64_t n1, int64_t n2) {
  int64_t shape[3] = {n0, n1, n2};
  return kvq_tensor_host(data, dtype, 3, shape);
}

static kvq_tensor sentinel_tensor(kvq_dtype dtype, int64_t n0, int64_t n1, int64_t n2, out_buf *b) {
  b->bytes = (size_t)(n0 * n1 * n2) * (dtype == KVQ_DTYPE_F32 ? 4 : 2);
  b->data = malloc(b->bytes);
  cr_assert_not_null(b->data);
  memset(b->data, SENTINEL, b->bytes);
  return tensor3(b->data, dtype, n0, n1, n2);
}

static void expect_sentinel(const out_buf *b, const char *what) {
  const uint8_t *p = b->data;
  for (size_t i = 0; i < b->bytes; i++)
    cr_assert_eq(p[i], SENTINEL, "%s: byte %zu of %zu of an output was written by a failing call", what, i, b->bytes);
}

static void expect_untouched(const void *p, size_t bytes, const char *what) {
  const uint8_t *q = p;
  for (size_t i = 0; i < bytes; i++)
    cr_assert_eq(q[i], SENTINEL, "%s: byte %zu of an out-parameter was written by a failing call", what, i);
}

/* ---- Tensor edits: each makes a valid tensor invalid in one way ------------------------------- */

enum { ANY_ROWS, FREE_ROWS, FIXED_ROWS }; /* whether the call fixes shape[0] (outputs) or not (inputs) */

typedef struct tensor_edit {
  const char *name;
  void (*apply)(kvq_tensor *t);
  kvq_status want;
  const char *mention;
  int rows;
} tensor_edit;

static void e_data_null(kvq_tensor *t) { t->data = NULL; }
static void e_rank0(kvq_tensor *t) { t->rank = 0; }
static void e_rank2(kvq_tensor *t) { t->rank = 2; }
static void e_rank4(kvq_tensor *t) {
  t->rank = 4;
  t->shape[3] = 1;
  t->strides[3] = 1;
}
static void e_rank_max(kvq_tensor *t) { t->rank = UINT32_MAX; }
static void e_rows0(kvq_tensor *t) { t->shape[0] = 0; }
static void e_rows_negative(kvq_tensor *t) { t->shape[0] = -5; }
static void e_rows_past_2_31(kvq_tensor *t) { t->shape[0] = ((int64_t)1 << 31) + 1; }
static void e_rows_int64_max(kvq_tensor *t) { t->shape[0] = INT64_MAX; }
static void e_rows_fewer(kvq_tensor *t) { t->shape[0] -= 1; }
static void e_heads0(kvq_tensor *t) { t->shape[1] = 0; }
static void e_heads_wrong(kvq_tensor *t) { t->shape[1] = 1; }
static void e_dim_wrong(kvq_tensor *t) { t->shape[2] /= 2; }
static void e_dtype_unknown(kvq_tensor *t) { t->dtype = (kvq_dtype)3; }
static void e_dtype_huge(kvq_tensor *t) { t->dtype = (kvq_dtype)0x7fffffff; }
static void e_memory_unknown(kvq_tensor *t) { t->memory = (kvq_memory)3; }
static void e_vulkan(kvq_tensor *t) {
  t->memory = KVQ_MEMORY_VULKAN_BUFFER;
  t->data = NULL;
  t->handle = 0xdeadbeefu;
}
static void e_cuda(kvq_tensor *t) {
  t->memory = KVQ_MEMORY_CUDA_DEVICE;
  t->data = (void *)(uintptr_t)0x1000; /* a "device pointer" that must never be dereferenced */
}
static void e_stride0(kvq_tensor *t) { t->strides[2] = 0; }
static void e_stride_negative(kvq_tensor *t) { t->strides[0] = -1; }
static void e_stride_int64_min(kvq_tensor *t) { t->strides[1] = INT64_MIN; }
static void e_stride_huge(kvq_tensor *t) { t->strides[1] = (int64_t)1 << 41; }
static void e_offset_wraps(kvq_tensor *t) { t->offset = UINT64_MAX - 8; }
static void e_offset_max(kvq_tensor *t) { t->offset = UINT64_MAX; }
static void e_data_at_top(kvq_tensor *t) { t->data = (void *)(uintptr_t)(UINTPTR_MAX - 64); }
static void e_strides_wrap(kvq_tensor *t) {
  t->shape[0] = (int64_t)1 << 31;
  t->strides[0] = (int64_t)1 << 40;
}

static const tensor_edit edits[] = {
    {"data NULL", e_data_null, KVQ_ERROR_INVALID_ARGUMENT, "data", ANY_ROWS},
    {"rank 0", e_rank0, KVQ_ERROR_INVALID_ARGUMENT, "rank", ANY_ROWS},
    {"rank 2", e_rank2, KVQ_ERROR_INVALID_ARGUMENT, "rank", ANY_ROWS},
    {"rank 4", e_rank4, KVQ_ERROR_INVALID_ARGUMENT, "rank", ANY_ROWS},
    {"rank UINT32_MAX", e_rank_max, KVQ_ERROR_INVALID_ARGUMENT, "rank", ANY_ROWS},
    {"0 rows", e_rows0, KVQ_ERROR_OUT_OF_RANGE, "shape[0]", ANY_ROWS},
    {"-5 rows", e_rows_negative, KVQ_ERROR_OUT_OF_RANGE, "shape[0]", ANY_ROWS},
    {"2^31 + 1 rows", e_rows_past_2_31, KVQ_ERROR_OUT_OF_RANGE, "shape[0]", ANY_ROWS},
    {"INT64_MAX rows", e_rows_int64_max, KVQ_ERROR_OUT_OF_RANGE, "shape[0]", ANY_ROWS},
    {"one row fewer", e_rows_fewer, KVQ_ERROR_INVALID_ARGUMENT, "shape[0]", FIXED_ROWS},
    {"0 heads", e_heads0, KVQ_ERROR_OUT_OF_RANGE, "shape[1]", ANY_ROWS},
    {"wrong head count", e_heads_wrong, KVQ_ERROR_INVALID_ARGUMENT, "shape[1]", ANY_ROWS},
    {"wrong last dimension", e_dim_wrong, KVQ_ERROR_INVALID_ARGUMENT, "shape[2]", ANY_ROWS},
    {"unknown dtype 3", e_dtype_unknown, KVQ_ERROR_INVALID_ARGUMENT, "dtype", ANY_ROWS},
    {"unknown dtype 0x7fffffff", e_dtype_huge, KVQ_ERROR_INVALID_ARGUMENT, "dtype", ANY_ROWS},
    {"unknown memory kind", e_memory_unknown, KVQ_ERROR_INVALID_ARGUMENT, "memory", ANY_ROWS},
    {"Vulkan buffer on the CPU backend", e_vulkan, KVQ_ERROR_UNSUPPORTED, "device", ANY_ROWS},
    {"CUDA device pointer on the CPU backend", e_cuda, KVQ_ERROR_UNSUPPORTED, "device", ANY_ROWS},
    {"stride 0", e_stride0, KVQ_ERROR_INVALID_ARGUMENT, "strides[2]", ANY_ROWS},
    {"stride -1", e_stride_negative, KVQ_ERROR_INVALID_ARGUMENT, "strides[0]", ANY_ROWS},
    {"stride INT64_MIN", e_stride_int64_min, KVQ_ERROR_INVALID_ARGUMENT, "strides[1]", ANY_ROWS},
    {"stride 2^41", e_stride_huge, KVQ_ERROR_INVALID_ARGUMENT, "strides[1]", ANY_ROWS},
    {"offset wrapping the address space", e_offset_wraps, KVQ_ERROR_OUT_OF_RANGE, "address space", ANY_ROWS},
    {"offset UINT64_MAX", e_offset_max, KVQ_ERROR_OUT_OF_RANGE, "address space", ANY_ROWS},
    {"data at the top of the address space", e_data_at_top, KVQ_ERROR_OUT_OF_RANGE, "address space", ANY_ROWS},
    {"2^31 rows 2^40 apart", e_strides_wrap, KVQ_ERROR_OUT_OF_RANGE, "address space", FREE_ROWS},
};
#define EDIT_COUNT (sizeof edits / sizeof edits[0])

static int edit_applies(const tensor_edit *e, int rows) { return e->rows == ANY_ROWS || e->rows == rows; }

/* ================================================================================================
 * Status strings, versions, destroy(NULL), tensor_host
 * ============================================================================================== */

Test(status, string_for_every_value_and_beyond) {
  const char *seen[KVQ_ERROR_NO_CODEBOOK + 1]; /* the last status */
  const char *unknown = kvq_status_string((kvq_status)(KVQ_ERROR_NO_CODEBOOK + 1));
  cr_assert(unknown != NULL && unknown[0] != 0, "out-of-range status: NULL or empty string");
  for (int s = KVQ_OK; s <= KVQ_ERROR_NO_CODEBOOK; s++) {
    seen[s] = kvq_status_string((kvq_status)s);
    cr_assert(seen[s] != NULL && seen[s][0] != 0, "status %d: NULL or empty string", s);
    cr_assert(strcmp(seen[s], unknown) != 0, "status %d reads like an unknown status: \"%s\"", s, seen[s]);
    for (int t = 0; t < s; t++) cr_assert(strcmp(seen[s], seen[t]) != 0, "statuses %d and %d share \"%s\"", t, s, seen[s]);
  }
  const int beyond[] = {KVQ_ERROR_NO_CODEBOOK + 1, 100, 0x7fffffff, -1};
  for (size_t i = 0; i < sizeof beyond / sizeof beyond[0]; i++) {
    const char *s = kvq_status_string((kvq_status)beyond[i]);
    cr_assert(s != NULL && s[0] != 0, "status %d: NULL or empty string", beyond[i]);
  }
}

Test(status, version_matches_header) {
  cr_assert_not_null(kvq_version());
  cr_assert_str_eq(kvq_version(), KVQ_VERSION_STRING);
  cr_assert_eq(kvq_version_number(), KVQ_VERSION_NUMBER);
}

Test(destroy, null_is_ignored) {
  kvq_cache_destroy(NULL);
  kvq_context_destroy(NULL);
  cr_assert_eq(kvq_context_backend(NULL), KVQ_BACKEND_AUTO, "no context has no backend (AUTO means none)");
  const char *msg = kvq_context_last_error(NULL);
  cr_assert(msg != NULL && msg[0] == 0, "last_error(NULL) must be an empty string");
}

/* kvq_tensor_host cannot fail, but what it makes of bad arguments must then be rejected cleanly. */
Test(tensor_host, rank_above_max_is_clamped_then_rejected) {
  fixture f;
  build(&f);
  uint16_t data[64] = {0};
  const int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  kvq_tensor t = kvq_tensor_host(data, KVQ_DTYPE_F16, 9, shape);
  cr_assert_leq(t.rank, KVQ_MAX_RANK, "rank %u was not clamped", t.rank);
  kv x = kv_random(f.input, 1, 9);
  REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, &t, &x.v), KVQ_ERROR_INVALID_ARGUMENT, "rank");
  kv_free(&x);
  destroy(&f);
}

Test(tensor_host, null_shape_gives_an_empty_shape_then_rejected) {
  fixture f;
  build(&f);
  uint16_t data[64] = {0};
  kvq_tensor t = kvq_tensor_host(data, KVQ_DTYPE_F16, 3, NULL);
  cr_assert(t.rank == 3 && t.shape[0] == 0 && t.shape[1] == 0 && t.shape[2] == 0);
  kv x = kv_random(f.input, 1, 9);
  REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, &x.k, &t), KVQ_ERROR_OUT_OF_RANGE, "shape[0]");
  kv_free(&x);
  destroy(&f);
}

Test(tensor_host, huge_shape_then_rejected) {
  fixture f;
  build(&f);
  uint16_t data[64] = {0};
  const int64_t big = (int64_t)1 << 31, shape[3] = {big, big, big};
  kvq_tensor t = kvq_tensor_host(data, KVQ_DTYPE_F16, 3, shape);
  kv x = kv_random(f.input, 1, 9);
  REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, &t, &x.v), KVQ_ERROR_INVALID_ARGUMENT, "keys");
  kv_free(&x);
  destroy(&f);
}

/* ================================================================================================
 * Backends and contexts
 * ============================================================================================== */

Test(backends_list, null_count) {
  kvq_backend_info infos[4];
  memset(infos, SENTINEL, sizeof infos);
  cr_assert_eq(kvq_backends_list(infos, 4, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  expect_untouched(infos, sizeof infos, "kvq_backends_list(infos, 4, NULL)");
}

Test(backends_list, null_infos_with_capacity) {
  size_t count;
  memset(&count, SENTINEL, sizeof count);
  cr_assert_eq(kvq_backends_list(NULL, 1, &count), KVQ_ERROR_INVALID_ARGUMENT);
  expect_untouched(&count, sizeof count, "kvq_backends_list(NULL, 1, &count)");
  cr_assert_eq(kvq_backends_list(NULL, SIZE_MAX, &count), KVQ_ERROR_INVALID_ARGUMENT);
  expect_untouched(&count, sizeof count, "kvq_backends_list(NULL, SIZE_MAX, &count)");
}

Test(backends_list, zero_and_short_capacity_write_only_what_fits) {
  size_t count = 0;
  cr_assert_eq(kvq_backends_list(NULL, 0, &count), KVQ_OK, "capacity 0 only counts");
  cr_assert_geq(count, 1);
  kvq_backend_info infos[2];
  memset(infos, SENTINEL, sizeof infos);
  size_t count1 = 0;
  cr_assert_eq(kvq_backends_list(infos, 1, &count1), KVQ_OK);
  cr_assert_eq(count1, count);
  expect_untouched(&infos[1], sizeof infos[1], "kvq_backends_list(infos, 1, &count) wrote a second entry");
}

Test(context, create_null_out) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_CPU;
  cr_assert_eq(kvq_context_create(&opt, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(kvq_context_create(NULL, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  const kvq_context_options def = kvq_context_options_default();
  cr_assert(def.backend == KVQ_BACKEND_AUTO && def.device_index == -1);
}

/* kvq_context_options can grow: struct_size says how much of it the caller knows. Smaller than the
 * first layout with the field is refused; larger is accepted while the members this library does not
 * know are zero, and refused (UNSUPPORTED) when a newer caller set one; 0 means this header's size. */
Test(context, options_struct_size) {
  struct {
    kvq_context_options known;
    uint64_t newer_member;
  } bigger;
  memset(&bigger, 0, sizeof bigger);
  bigger.known = kvq_context_options_default();
  bigger.known.backend = KVQ_BACKEND_CPU;
  bigger.known.struct_size = sizeof bigger;
  kvq_context *ctx = NULL;
  cr_assert_eq(kvq_context_create(&bigger.known, &ctx), KVQ_OK, "a newer caller's options with its new member unset");
  kvq_context_destroy(ctx);
  bigger.newer_member = 1;
  ctx = (kvq_context *)(uintptr_t)1;
  cr_assert_eq(kvq_context_create(&bigger.known, &ctx), KVQ_ERROR_UNSUPPORTED, "a newer member this kvq cannot honour");
  cr_assert_null(ctx);
  kvq_context_options opt = kvq_context_options_default();
  cr_assert_eq(opt.struct_size, sizeof opt);
  opt.backend = KVQ_BACKEND_CPU;
  opt.struct_size = sizeof opt - 8;
  cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_ERROR_INVALID_ARGUMENT, "smaller than any layout with struct_size");
  kvq_context_options designated = {.backend = KVQ_BACKEND_CPU, .device_index = -1}; /* struct_size 0 */
  cr_assert_eq(kvq_context_create(&designated, &ctx), KVQ_OK, "struct_size 0: this header's layout");
  kvq_context_destroy(ctx);
}

/* A runtime's device belongs to one backend: the Vulkan member with another backend, the CUDA member
 * with another backend, or both at once, are refused before any backend starts. */
Test(context, options_runtime_device_for_another_backend) {
  kvq_vulkan_device vk;
  kvq_cuda_device cuda;
  memset(&vk, 0, sizeof vk);
  memset(&cuda, 0, sizeof cuda);
  const struct {
    kvq_backend_kind backend;
    int with_vulkan, with_cuda;
  } cases[] = {{KVQ_BACKEND_CPU, 1, 0}, {KVQ_BACKEND_CUDA, 1, 0}, {KVQ_BACKEND_CPU, 0, 1},
               {KVQ_BACKEND_VULKAN, 0, 1}, {KVQ_BACKEND_AUTO, 1, 1}, {KVQ_BACKEND_VULKAN, 1, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kvq_context_options opt = kvq_context_options_default();
    opt.backend = cases[i].backend;
    opt.vulkan = cases[i].with_vulkan ? &vk : NULL;
    opt.cuda = cases[i].with_cuda ? &cuda : NULL;
    kvq_context *ctx = (kvq_context *)(uintptr_t)1;
    cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_ERROR_INVALID_ARGUMENT, "case %zu", i);
    cr_assert_null(ctx, "case %zu", i);
  }
}

/* Device memory is named by what its kind says: a VkBuffer by its handle, a CUDA allocation by its
 * pointer; a backend importing it gets that name, never the other field. */
Test(context, device_memory_is_named_by_its_kind) {
  const int64_t shape[3] = {2, 3, 16};
  void *device_pointer = (void *)(uintptr_t)0x7f0000001000u;
  const kvq_tensor vk = kvq_tensor_vulkan(0xabcdu, 64, KVQ_DTYPE_F16, 3, shape);
  const kvq_tensor cu = kvq_tensor_cuda(device_pointer, KVQ_DTYPE_F16, 3, shape);
  cr_assert(vk.memory == KVQ_MEMORY_VULKAN_BUFFER && vk.handle == 0xabcdu && vk.data == NULL && vk.offset == 64);
  cr_assert(cu.memory == KVQ_MEMORY_CUDA_DEVICE && cu.data == device_pointer && cu.handle == 0);
  cr_assert(vk.strides[0] == 48 && vk.strides[1] == 16 && vk.strides[2] == 1 && cu.strides[0] == 48);
  const kvq_device_memory a = kvq_tensor_memory(&vk), b = kvq_tensor_memory(&cu);
  cr_assert(a.kind == KVQ_MEMORY_VULKAN_BUFFER && a.handle == 0xabcdu && a.pointer == NULL);
  cr_assert(b.kind == KVQ_MEMORY_CUDA_DEVICE && b.pointer == device_pointer && b.handle == 0,
            "a CUDA tensor is imported by its pointer (not by handle 0)");
  kvq_tensor stray = cu;
  stray.handle = 99; /* a field the kind does not use is not passed on */
  cr_assert_eq(kvq_tensor_memory(&stray).handle, 0u);
}

/* Each backend knows its own buffers: a buffer of one backend handed to another (two CPU backends,
 * and a Vulkan one where a device exists) is refused with INVALID_ARGUMENT, by buffer calls and by
 * jobs, and nothing is written. */
Test(context, buffers_of_another_backend_are_refused) {
  kvq_context *a = th_cpu_context(), *b = th_cpu_context(), *vk = NULL;
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_VULKAN;
  if (kvq_context_create(&opt, &vk) != KVQ_OK) vk = NULL; /* no Vulkan device: the CPU pair still runs */
  kvq_context *owners[2] = {b, vk};
  for (int o = 0; o < 2; o++) {
    if (!owners[o]) continue;
    kvq_backend *mine = a->backend, *theirs = owners[o]->backend;
    kvq_buffer *foreign = NULL, *own = NULL;
    cr_assert_eq(theirs->ops->buffer_create(theirs, 64, &foreign), KVQ_OK);
    cr_assert_eq(mine->ops->buffer_create(mine, 64, &own), KVQ_OK);
    uint8_t bytes[64];
    memset(bytes, 7, sizeof bytes);
    cr_assert_eq(mine->ops->buffer_write(mine, foreign, 0, bytes, 64), KVQ_ERROR_INVALID_ARGUMENT, "owner %d: write", o);
    cr_assert_eq(mine->ops->buffer_read(mine, foreign, 0, bytes, 64), KVQ_ERROR_INVALID_ARGUMENT, "owner %d: read", o);
    cr_assert_eq(mine->ops->buffer_copy(mine, own, 0, foreign, 0, 64), KVQ_ERROR_INVALID_ARGUMENT, "owner %d: copy", o);
    cr_assert_eq(mine->ops->buffer_zero(mine, foreign, 0, 64), KVQ_ERROR_INVALID_ARGUMENT, "owner %d: zero", o);
    cr_assert_eq(theirs->ops->buffer_write(theirs, own, 0, bytes, 64), KVQ_ERROR_INVALID_ARGUMENT, "owner %d: the other way", o);
    mine->ops->buffer_destroy(mine, foreign); /* refused: not freed (its owner frees it below) */
    kvq_job_kmeans job;
    memset(&job, 0, sizeof job);
    job.data = foreign, job.centroids = own, job.assignment = own;
    job.problems = 1, job.points = 1, job.dims = 1, job.clusters = 1;
    cr_assert_eq(mine->ops->kmeans_assign(mine, &job), KVQ_ERROR_INVALID_ARGUMENT, "owner %d: a job", o);
    uint8_t back[64];
    cr_assert_eq(theirs->ops->buffer_read(theirs, foreign, 0, back, 64), KVQ_OK);
    if (theirs->ops->finish) cr_assert_eq(theirs->ops->finish(theirs), KVQ_OK);
    for (int i = 0; i < 64; i++) cr_assert_eq(back[i], 0, "owner %d: byte %d of the foreign buffer was written", o, i);
    theirs->ops->buffer_destroy(theirs, foreign);
    mine->ops->buffer_destroy(mine, own);
  }
  kvq_context_destroy(a), kvq_context_destroy(b), kvq_context_destroy(vk);
}

Test(context, create_unknown_backend) {
  const int kinds[] = {KVQ_BACKEND_CUDA + 1, 100, 0x7fffffff, -1};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    kvq_context_options opt = kvq_context_options_default();
    opt.backend = (kvq_backend_kind)kinds[i];
    kvq_context *ctx = (kvq_context *)(uintptr_t)1;
    kvq_status st = kvq_context_create(&opt, &ctx);
    cr_assert_eq(st, KVQ_ERROR_INVALID_ARGUMENT, "backend %d: %s", kinds[i], kvq_status_string(st));
    cr_assert_null(ctx, "backend %d: *out must be NULL on failure", kinds[i]);
  }
}

Test(context, create_device_index_below_minus_one) {
  const int32_t indices[] = {-2, -1000, INT32_MIN};
  const kvq_backend_kind kinds[] = {KVQ_BACKEND_AUTO, KVQ_BACKEND_CPU};
  for (size_t k = 0; k < 2; k++)
    for (size_t i = 0; i < sizeof indices / sizeof indices[0]; i++) {
      kvq_context_options opt = {.backend = kinds[k], .device_index = indices[i]};
      kvq_context *ctx = (kvq_context *)(uintptr_t)1;
      kvq_status st = kvq_context_create(&opt, &ctx);
      cr_assert_eq(st, KVQ_ERROR_OUT_OF_RANGE, "backend %d, device %d: %s", (int)kinds[k], indices[i], kvq_status_string(st));
      cr_assert_null(ctx, "device %d: *out must be NULL on failure", indices[i]);
    }
}

Test(context, create_unavailable_backend) {
  kvq_backend_info infos[8];
  size_t count = 0;
  cr_assert_eq(kvq_backends_list(infos, 8, &count), KVQ_OK);
  for (size_t i = 0; i < count && i < 8; i++) {
    cr_assert_not_null(infos[i].name);
    if (infos[i].availability == KVQ_AVAILABLE) {
      cr_assert_eq(infos[i].reason[0], 0, "%s: available but with a reason", infos[i].name);
      continue;
    }
    cr_assert_neq(infos[i].reason[0], 0, "%s: unavailable without a reason", infos[i].name);
    kvq_context_options opt = {.backend = infos[i].kind, .device_index = -1};
    kvq_context *ctx = (kvq_context *)(uintptr_t)1;
    kvq_status st = kvq_context_create(&opt, &ctx);
    cr_assert_eq(st, KVQ_ERROR_BACKEND_UNAVAILABLE, "%s: %s", infos[i].name, kvq_status_string(st));
    cr_assert_null(ctx, "%s: *out must be NULL on failure", infos[i].name);
  }
}

/* ================================================================================================
 * Configurations: kvq_cache_config_check, kvq_cache_config_bytes, kvq_cache_create,
 * kvq_layer_bits_per_number and kvq_method_defaults
 * ============================================================================================== */

typedef struct cfg {
  kvq_layer_config layers[2];
  kvq_cache_config config;
} cfg;

/* A valid configuration: `layers` valid layers like the fixture's layer 0. */
static void cfg_init(cfg *c, uint32_t layers) {
  c->layers[0] = th_layer(HQ, HKV, D, method(KVQ_METHOD_QJL), method(KVQ_METHOD_UNIFORM));
  c->layers[1] = c->layers[0];
  c->config = th_config(c->layers, layers, KVQ_DTYPE_F16, P, R, MAX_PAGES, MAX_SEQS, 1);
}

/* kvq_cache_create fails with a message and sets *out to NULL. */
static void expect_create_fails(kvq_context *ctx, const kvq_cache_config *c, kvq_status want, const char *mention,
                                const char *what) {
  prime(ctx);
  kvq_cache *cache = (kvq_cache *)(uintptr_t)1;
  expect_failure(ctx, kvq_cache_create(ctx, c, &cache), want, mention, what);
  cr_assert_null(cache, "%s: kvq_cache_create must set *out to NULL on failure", what);
}

/* Every function that validates a configuration must reject it the same way and write nothing. */
static void expect_bad_config(kvq_context *ctx, const kvq_cache_config *c, kvq_status want, const char *mention,
                              const char *what) {
  char msg[512];
  memset(msg, SENTINEL, sizeof msg);
  kvq_status st = kvq_cache_config_check(c, msg, sizeof msg);
  cr_assert_eq(st, want, "%s: kvq_cache_config_check returned %s, expected %s", what, kvq_status_string(st),
               kvq_status_string(want));
  cr_assert_not_null(memchr(msg, 0, sizeof msg), "%s: message not NUL-terminated", what);
  cr_assert(strstr(msg, mention) != NULL, "%s: check message \"%s\" does not mention \"%s\"", what, msg, mention);
  cr_assert_eq(kvq_cache_config_check(c, NULL, 0), want, "%s: without a message buffer", what);
  char none[8];
  memset(none, SENTINEL, sizeof none);
  cr_assert_eq(kvq_cache_config_check(c, none, 0), want, "%s: with a 0-byte buffer", what);
  expect_untouched(none, sizeof none, "kvq_cache_config_check with message_size 0");

  uint64_t bytes;
  memset(&bytes, SENTINEL, sizeof bytes);
  st = kvq_cache_config_bytes(c, &bytes);
  cr_assert_eq(st, want, "%s: kvq_cache_config_bytes returned %s", what, kvq_status_string(st));
  expect_untouched(&bytes, sizeof bytes, "kvq_cache_config_bytes");

  expect_create_fails(ctx, c, want, mention, what);
}

/* Also checks kvq_layer_bits_per_number on the layer. */
static void expect_bad_layer(kvq_context *ctx, const kvq_cache_config *c, uint32_t layer, kvq_status want,
                             const char *mention, const char *what) {
  expect_bad_config(ctx, c, want, mention, what);
  char where[32];
  snprintf(where, sizeof where, "layers[%u]", layer);
  cr_assert(strstr(kvq_context_last_error(ctx), where) != NULL, "%s: message \"%s\" does not name %s", what,
            kvq_context_last_error(ctx), where);
  double bits[2];
  memset(bits, SENTINEL, sizeof bits);
  kvq_status st = kvq_layer_bits_per_number(&c->layers[layer], c->page_size, &bits[0], &bits[1]);
  cr_assert_eq(st, want, "%s: kvq_layer_bits_per_number returned %s", what, kvq_status_string(st));
  expect_untouched(bits, sizeof bits, "kvq_layer_bits_per_number");
}

typedef void (*layer_edit)(kvq_layer_config *L, uint32_t value);

/* Applies an edit to layer 0 of a one-layer config and to layer 1 of a two-layer config. */
static void check_layer_values(layer_edit edit, const uint32_t *values, size_t count, kvq_status want,
                               const char *mention) {
  kvq_context *ctx = th_cpu_context();
  for (size_t i = 0; i < count; i++)
    for (uint32_t layer = 0; layer < 2; layer++) {
      cfg c;
      cfg_init(&c, layer + 1);
      edit(&c.layers[layer], values[i]);
      char what[96];
      snprintf(what, sizeof what, "%s = %u in layers[%u]", mention, values[i], layer);
      expect_bad_layer(ctx, &c.config, layer, want, mention, what);
    }
  kvq_context_destroy(ctx);
}
#define CHECK_LAYER(edit, want, mention, ...)                                                                    \
  do {                                                                                                           \
    const uint32_t v_[] = {__VA_ARGS__};                                                                         \
    check_layer_values((edit), v_, sizeof v_ / sizeof v_[0], (want), (mention));                                 \
  } while (0)

Test(config, null_config) {
  char msg[64];
  memset(msg, SENTINEL, sizeof msg);
  cr_assert_eq(kvq_cache_config_check(NULL, msg, sizeof msg), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(msg, "config") != NULL, "message \"%s\"", msg);
  cr_assert_eq(kvq_cache_config_check(NULL, NULL, 0), KVQ_ERROR_INVALID_ARGUMENT);
  uint64_t bytes;
  memset(&bytes, SENTINEL, sizeof bytes);
  cr_assert_eq(kvq_cache_config_bytes(NULL, &bytes), KVQ_ERROR_INVALID_ARGUMENT);
  expect_untouched(&bytes, sizeof bytes, "kvq_cache_config_bytes(NULL)");
  cr_assert_eq(kvq_cache_config_bytes(NULL, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  kvq_context *ctx = th_cpu_context();
  expect_create_fails(ctx, NULL, KVQ_ERROR_INVALID_ARGUMENT, "config", "create(NULL config)");
  kvq_context_destroy(ctx);
}

Test(config, valid_config_and_message_buffer_sizes) {
  cfg c;
  cfg_init(&c, 2);
  char msg[32];
  memset(msg, SENTINEL, sizeof msg);
  cr_assert_eq(kvq_cache_config_check(&c.config, msg, sizeof msg), KVQ_OK);
  cr_assert_eq(msg[0], 0, "a valid config leaves an empty message");
  c.config.page_size = 17;
  memset(msg, SENTINEL, sizeof msg);
  cr_assert_eq(kvq_cache_config_check(&c.config, msg, 8), KVQ_ERROR_OUT_OF_RANGE);
  cr_assert_eq(strlen(msg), 7, "a message truncated to 8 bytes: \"%s\"", msg);
  expect_untouched(msg + 8, sizeof msg - 8, "kvq_cache_config_check wrote past message_size");
  memset(msg, SENTINEL, sizeof msg);
  cr_assert_eq(kvq_cache_config_check(&c.config, msg, 1), KVQ_ERROR_OUT_OF_RANGE);
  cr_assert_eq(msg[0], 0);
  expect_untouched(msg + 1, sizeof msg - 1, "kvq_cache_config_check wrote past message_size 1");
}

Test(config, config_bytes_null_out) {
  cfg c;
  cfg_init(&c, 1);
  cr_assert_eq(kvq_cache_config_bytes(&c.config, NULL), KVQ_ERROR_INVALID_ARGUMENT);
}

typedef void (*config_edit)(kvq_cache_config *config, uint32_t value);

/* Applies an edit to a valid one-layer config, value by value. */
static void check_config_values(config_edit edit, const uint32_t *values, size_t count, kvq_status want,
                                const char *mention) {
  kvq_context *ctx = th_cpu_context();
  for (size_t i = 0; i < count; i++) {
    cfg c;
    cfg_init(&c, 1);
    edit(&c.config, values[i]);
    char what[64];
    snprintf(what, sizeof what, "%s = %u", mention, values[i]);
    expect_bad_config(ctx, &c.config, want, mention, what);
  }
  kvq_context_destroy(ctx);
}
#define CHECK_CONFIG(edit, want, mention, ...)                                                                   \
  do {                                                                                                           \
    const uint32_t v_[] = {__VA_ARGS__};                                                                         \
    check_config_values((edit), v_, sizeof v_ / sizeof v_[0], (want), (mention));                                \
  } while (0)

static void set_layer_count(kvq_cache_config *c, uint32_t v) { c->layer_count = v; }
static void set_input_dtype(kvq_cache_config *c, uint32_t v) { c->input_dtype = (kvq_dtype)(int32_t)v; }
static void set_page_size(kvq_cache_config *c, uint32_t v) {
  c->page_size = v;
  c->residual_window = 0; /* a multiple of any page size */
}
static void set_residual_window(kvq_cache_config *c, uint32_t v) { c->residual_window = v; }
static void set_max_pages(kvq_cache_config *c, uint32_t v) { c->max_pages = v; }
static void set_max_sequences(kvq_cache_config *c, uint32_t v) { c->max_sequences = v; }

Test(config, layer_count) { CHECK_CONFIG(set_layer_count, KVQ_ERROR_OUT_OF_RANGE, "layer_count", 0, UINT32_MAX); }

Test(config, null_layers) {
  kvq_context *ctx = th_cpu_context();
  cfg c;
  cfg_init(&c, 1);
  c.config.layers = NULL;
  expect_bad_config(ctx, &c.config, KVQ_ERROR_INVALID_ARGUMENT, "layers", "layers = NULL");
  kvq_context_destroy(ctx);
}

/* UINT32_MAX: -1, as set_input_dtype reads the value back as a signed number. */
Test(config, input_dtype) {
  CHECK_CONFIG(set_input_dtype, KVQ_ERROR_INVALID_ARGUMENT, "input_dtype", 3, 99, 0x7fffffff, UINT32_MAX);
}

Test(config, page_size) {
  static const uint32_t values[] = {0, 1, 8, 15, 17, 24, 100, 255, 512, 1u << 31, UINT32_MAX};
  const size_t count = sizeof values / sizeof values[0];
  check_config_values(set_page_size, values, count, KVQ_ERROR_OUT_OF_RANGE, "page_size");
  /* a layer's bits per number depend on the page size too */
  const kvq_layer_config L = th_layer(HQ, HKV, D, method(KVQ_METHOD_QJL), method(KVQ_METHOD_UNIFORM));
  for (size_t i = 0; i < count; i++) {
    double bits[2];
    memset(bits, SENTINEL, sizeof bits);
    cr_assert_eq(kvq_layer_bits_per_number(&L, values[i], &bits[0], &bits[1]), KVQ_ERROR_OUT_OF_RANGE,
                 "kvq_layer_bits_per_number at page_size %u", values[i]);
    expect_untouched(bits, sizeof bits, "kvq_layer_bits_per_number with a bad page size");
  }
}

Test(config, residual_window) {
  CHECK_CONFIG(set_residual_window, KVQ_ERROR_OUT_OF_RANGE, "residual_window", 1, 8, 17, 24, 0xfffffff0u, UINT32_MAX);
}

Test(config, max_pages) { CHECK_CONFIG(set_max_pages, KVQ_ERROR_OUT_OF_RANGE, "max_pages", 0, 1u << 31, UINT32_MAX); }

Test(config, max_sequences) {
  CHECK_CONFIG(set_max_sequences, KVQ_ERROR_OUT_OF_RANGE, "max_sequences", 0, 65536, UINT32_MAX);
}

static void set_head_dim(kvq_layer_config *L, uint32_t v) { L->head_dim = v; }
static void set_kv_heads(kvq_layer_config *L, uint32_t v) { L->kv_heads = v; }
static void set_query_heads(kvq_layer_config *L, uint32_t v) { L->query_heads = v; }
static void set_key_method(kvq_layer_config *L, uint32_t v) { L->keys.method = (kvq_method)v; }
static void set_value_method(kvq_layer_config *L, uint32_t v) { L->values.method = (kvq_method)v; }
static void set_key_exact_dtype(kvq_layer_config *L, uint32_t v) {
  L->keys = method(KVQ_METHOD_EXACT);
  L->keys.exact.dtype = (kvq_dtype)v;
}
static void set_value_exact_dtype(kvq_layer_config *L, uint32_t v) {
  L->values = method(KVQ_METHOD_EXACT);
  L->values.exact.dtype = (kvq_dtype)v;
}
static void set_sketch_dim(kvq_layer_config *L, uint32_t v) { L->keys.qjl.sketch_dim = v; }
static void set_outlier_count(kvq_layer_config *L, uint32_t v) { L->keys.qjl.outlier_count = v; }
static void set_outlier_sketch_dim(kvq_layer_config *L, uint32_t v) { L->keys.qjl.outlier_sketch_dim = v; }
static void set_value_bits(kvq_layer_config *L, uint32_t v) { L->values.uniform.bits = v; }
static void set_key_bits(kvq_layer_config *L, uint32_t v) {
  L->keys = method(KVQ_METHOD_UNIFORM);
  L->keys.uniform.bits = v;
}
static void set_value_group(kvq_layer_config *L, uint32_t v) { L->values.uniform.group_size = v; }
static void set_key_group(kvq_layer_config *L, uint32_t v) {
  L->keys = method(KVQ_METHOD_UNIFORM);
  L->keys.uniform.group_size = v;
}
static void set_values_qjl(kvq_layer_config *L, uint32_t v) {
  (void)v;
  L->values = method(KVQ_METHOD_QJL);
}

Test(config, head_dim) {
  CHECK_LAYER(set_head_dim, KVQ_ERROR_OUT_OF_RANGE, "head_dim", 0, 1, 8, 15, 24, 63, 72, 100, 255, 272, 512,
              0xfffffff0u, UINT32_MAX);
}
Test(config, kv_heads) { CHECK_LAYER(set_kv_heads, KVQ_ERROR_OUT_OF_RANGE, "kv_heads", 0, UINT32_MAX); }
Test(config, query_heads_not_a_multiple_of_kv_heads) {
  CHECK_LAYER(set_query_heads, KVQ_ERROR_OUT_OF_RANGE, "query_heads", 0, 1, 3, 5, 7, 1u << 31, UINT32_MAX, UINT32_MAX - 1);
}
Test(config, unknown_key_method) { CHECK_LAYER(set_key_method, KVQ_ERROR_INVALID_ARGUMENT, "keys.method", 6, 99, UINT32_MAX); }
Test(config, unknown_value_method) {
  CHECK_LAYER(set_value_method, KVQ_ERROR_INVALID_ARGUMENT, "values.method", 6, 99, UINT32_MAX);
}
Test(config, qjl_for_values) { CHECK_LAYER(set_values_qjl, KVQ_ERROR_INVALID_ARGUMENT, "values.method", 0); }
Test(config, exact_dtype) {
  CHECK_LAYER(set_key_exact_dtype, KVQ_ERROR_INVALID_ARGUMENT, "keys.exact.dtype", 3, 77, UINT32_MAX);
  CHECK_LAYER(set_value_exact_dtype, KVQ_ERROR_INVALID_ARGUMENT, "values.exact.dtype", 3, 77, UINT32_MAX);
}
Test(config, qjl_sketch_dim) {
  CHECK_LAYER(set_sketch_dim, KVQ_ERROR_OUT_OF_RANGE, "keys.qjl.sketch_dim", 0, 1, 16, 31, 33, 48, 1056, 2048,
              UINT32_MAX - 31, UINT32_MAX);
}
Test(config, qjl_outlier_count) {
  CHECK_LAYER(set_outlier_count, KVQ_ERROR_OUT_OF_RANGE, "outlier_count", 33, 64, 1000, UINT32_MAX);
}
Test(config, qjl_outlier_count_not_below_head_dim) {
  kvq_context *ctx = th_cpu_context();
  const uint32_t dims[] = {16, 32};
  for (size_t i = 0; i < 2; i++)
    for (uint32_t extra = 0; extra < 2; extra++) {
      cfg c;
      cfg_init(&c, 1);
      kvq_method_config qjl = kvq_method_defaults(KVQ_METHOD_QJL, dims[i]);
      qjl.qjl.outlier_count = dims[i] + extra;
      c.layers[0] = th_layer(HQ, HKV, dims[i], qjl, kvq_method_defaults(KVQ_METHOD_UNIFORM, dims[i]));
      char what[64];
      snprintf(what, sizeof what, "outlier_count %u at head_dim %u", dims[i] + extra, dims[i]);
      expect_bad_layer(ctx, &c.config, 0, KVQ_ERROR_OUT_OF_RANGE, "outlier_count", what);
    }
  kvq_context_destroy(ctx);
}
Test(config, qjl_outlier_sketch_dim) {
  CHECK_LAYER(set_outlier_sketch_dim, KVQ_ERROR_OUT_OF_RANGE, "outlier_sketch_dim", 0, 16, 40, 1056, UINT32_MAX);
}
Test(config, uniform_bits) {
  CHECK_LAYER(set_value_bits, KVQ_ERROR_OUT_OF_RANGE, "values.uniform.bits", 0, 5, 6, 7, 9, 16, 32, UINT32_MAX);
  CHECK_LAYER(set_key_bits, KVQ_ERROR_OUT_OF_RANGE, "keys.uniform.bits", 0, 5, 6, 7, 9, 16, 32, UINT32_MAX);
}
Test(config, uniform_group_size) {
  CHECK_LAYER(set_value_group, KVQ_ERROR_OUT_OF_RANGE, "values.uniform.group_size", 0, 1, 2, 3, 12, 48, 128, 256, 512,
              1u << 31, UINT32_MAX);
  CHECK_LAYER(set_key_group, KVQ_ERROR_OUT_OF_RANGE, "keys.uniform.group_size", 0, 2, 24, 128, UINT32_MAX);
}
Test(config, uniform_group_size_not_dividing_head_dim) {
  kvq_context *ctx = th_cpu_context();
  cfg c;
  cfg_init(&c, 1);
  kvq_method_config u = kvq_method_defaults(KVQ_METHOD_UNIFORM, 48);
  u.uniform.group_size = 32; /* a power of two below head_dim 48 that does not divide it */
  c.layers[0] = th_layer(HQ, HKV, 48, kvq_method_defaults(KVQ_METHOD_QJL, 48), u);
  expect_bad_layer(ctx, &c.config, 0, KVQ_ERROR_OUT_OF_RANGE, "group_size", "group 32 at head_dim 48");
  kvq_context_destroy(ctx);
}

/* KIVI, PolarQuant and CQ: set_key_NAME and set_value_NAME make one side method `m` (its defaults
 * at head_dim D) and set one of its fields to the value. */
#define SIDE_EDITS(name, m, field)                                                                               \
  static void set_key_##name(kvq_layer_config *L, uint32_t v) {                                                  \
    L->keys = method(m);                                                                                         \
    L->keys.field = v;                                                                                           \
  }                                                                                                              \
  static void set_value_##name(kvq_layer_config *L, uint32_t v) {                                                \
    L->values = method(m);                                                                                       \
    L->values.field = v;                                                                                         \
  }
SIDE_EDITS(kivi_bits, KVQ_METHOD_KIVI, kivi.bits)
SIDE_EDITS(kivi_group_tokens, KVQ_METHOD_KIVI, kivi.group_tokens)
SIDE_EDITS(polar_levels, KVQ_METHOD_POLAR, polar.levels)
SIDE_EDITS(polar_bits_first, KVQ_METHOD_POLAR, polar.bits[0])
SIDE_EDITS(polar_bits_last, KVQ_METHOD_POLAR, polar.bits[3]) /* the defaults have 4 levels */
SIDE_EDITS(polar_rotation, KVQ_METHOD_POLAR, polar.rotation)
SIDE_EDITS(polar_codebook, KVQ_METHOD_POLAR, polar.codebook)
SIDE_EDITS(cq_channels, KVQ_METHOD_CQ, cq.channels)
SIDE_EDITS(cq_bits, KVQ_METHOD_CQ, cq.bits)
SIDE_EDITS(cq_iterations, KVQ_METHOD_CQ, cq.iterations)

Test(config, kivi_bits) {
  CHECK_LAYER(set_key_kivi_bits, KVQ_ERROR_OUT_OF_RANGE, "keys.kivi.bits", 0, 5, 6, 7, 9, 16, UINT32_MAX);
  CHECK_LAYER(set_value_kivi_bits, KVQ_ERROR_OUT_OF_RANGE, "values.kivi.bits", 0, 5, 6, 7, 9, 16, UINT32_MAX);
}
/* 0 (the whole page), 4, 8 and 16 are valid at page size 16; 32 is a power of two that does not
 * divide it. */
Test(config, kivi_group_tokens) {
  CHECK_LAYER(set_key_kivi_group_tokens, KVQ_ERROR_OUT_OF_RANGE, "keys.kivi.group_tokens", 1, 2, 3, 5, 12, 24, 32, 64,
              256, 1u << 31, UINT32_MAX);
  CHECK_LAYER(set_value_kivi_group_tokens, KVQ_ERROR_OUT_OF_RANGE, "values.kivi.group_tokens", 1, 2, 3, 12, 32,
              UINT32_MAX);
}
/* 2^levels must divide head_dim 32: levels 6 to 8 are in 1..8 but do not. */
Test(config, polar_levels) {
  CHECK_LAYER(set_key_polar_levels, KVQ_ERROR_OUT_OF_RANGE, "keys.polar.levels", 0, 6, 7, 8, 9, 31, 32, 33, UINT32_MAX);
  CHECK_LAYER(set_value_polar_levels, KVQ_ERROR_OUT_OF_RANGE, "values.polar.levels", 0, 6, 9, 32, UINT32_MAX);
}
Test(config, polar_levels_not_dividing_head_dim) {
  kvq_context *ctx = th_cpu_context();
  const struct {
    uint32_t head_dim, levels;
  } cases[] = {{48, 5}, {16, 5}, {80, 5}, {96, 6}, {16, 8}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int side = 0; side < 2; side++) {
      cfg c;
      cfg_init(&c, 1);
      kvq_method_config polar = kvq_method_defaults(KVQ_METHOD_POLAR, cases[i].head_dim);
      polar.polar.levels = cases[i].levels;
      for (uint32_t l = 0; l < KVQ_POLAR_MAX_LEVELS; l++) polar.polar.bits[l] = 2; /* only the levels are wrong */
      kvq_method_config other = kvq_method_defaults(KVQ_METHOD_EXACT, cases[i].head_dim);
      c.layers[0] = th_layer(HQ, HKV, cases[i].head_dim, side ? other : polar, side ? polar : other);
      char what[64];
      snprintf(what, sizeof what, "%u levels at head_dim %u (%s)", cases[i].levels, cases[i].head_dim,
               side ? "values" : "keys");
      expect_bad_layer(ctx, &c.config, 0, KVQ_ERROR_OUT_OF_RANGE, side ? "values.polar.levels" : "keys.polar.levels",
                       what);
    }
  kvq_context_destroy(ctx);
}
/* Every level up to `levels` needs 1..8 bits (bits[3] is the last of the defaults' 4 levels). */
Test(config, polar_bits) {
  CHECK_LAYER(set_key_polar_bits_first, KVQ_ERROR_OUT_OF_RANGE, "keys.polar.bits[0]", 0, 9, 16, UINT32_MAX);
  CHECK_LAYER(set_key_polar_bits_last, KVQ_ERROR_OUT_OF_RANGE, "keys.polar.bits[3]", 0, 9, UINT32_MAX);
  CHECK_LAYER(set_value_polar_bits_first, KVQ_ERROR_OUT_OF_RANGE, "values.polar.bits[0]", 0, 9, UINT32_MAX);
  CHECK_LAYER(set_value_polar_bits_last, KVQ_ERROR_OUT_OF_RANGE, "values.polar.bits[3]", 0, 9, UINT32_MAX);
}
Test(config, polar_unknown_rotation) {
  CHECK_LAYER(set_key_polar_rotation, KVQ_ERROR_INVALID_ARGUMENT, "keys.polar.rotation", 2, 99, UINT32_MAX);
  CHECK_LAYER(set_value_polar_rotation, KVQ_ERROR_INVALID_ARGUMENT, "values.polar.rotation", 2, 99, UINT32_MAX);
}
Test(config, polar_unknown_codebook_source) {
  CHECK_LAYER(set_key_polar_codebook, KVQ_ERROR_INVALID_ARGUMENT, "keys.polar.codebook", 2, 99, UINT32_MAX);
  CHECK_LAYER(set_value_polar_codebook, KVQ_ERROR_INVALID_ARGUMENT, "values.polar.codebook", 2, 99, UINT32_MAX);
}
/* A Walsh-Hadamard transform needs a power-of-two head_dim: every valid head_dim that is not. */
Test(config, polar_hadamard_needs_a_power_of_two_head_dim) {
  kvq_context *ctx = th_cpu_context();
  for (uint32_t d = 48; d <= 256; d += 16) {
    if ((d & (d - 1)) == 0) continue;
    for (int side = 0; side < 2; side++) {
      cfg c;
      cfg_init(&c, 1);
      kvq_method_config polar = kvq_method_defaults(KVQ_METHOD_POLAR, d);
      polar.polar.rotation = KVQ_ROTATION_HADAMARD;
      kvq_method_config other = kvq_method_defaults(KVQ_METHOD_EXACT, d);
      c.layers[0] = th_layer(HQ, HKV, d, side ? other : polar, side ? polar : other);
      char what[64];
      snprintf(what, sizeof what, "Hadamard %s at head_dim %u", side ? "values" : "keys", d);
      expect_bad_layer(ctx, &c.config, 0, KVQ_ERROR_OUT_OF_RANGE,
                       side ? "values.polar.rotation" : "keys.polar.rotation", what);
    }
  }
  kvq_context_destroy(ctx);
}
/* 1, 2, 4, 8 and 16 channels (each divides every valid head_dim). */
Test(config, cq_channels) {
  CHECK_LAYER(set_key_cq_channels, KVQ_ERROR_OUT_OF_RANGE, "keys.cq.channels", 0, 3, 5, 6, 12, 32, 64, 1u << 31,
              UINT32_MAX);
  CHECK_LAYER(set_value_cq_channels, KVQ_ERROR_OUT_OF_RANGE, "values.cq.channels", 0, 3, 32, UINT32_MAX);
}
Test(config, cq_bits) {
  CHECK_LAYER(set_key_cq_bits, KVQ_ERROR_OUT_OF_RANGE, "keys.cq.bits", 0, 13, 16, 32, 64, UINT32_MAX);
  CHECK_LAYER(set_value_cq_bits, KVQ_ERROR_OUT_OF_RANGE, "values.cq.bits", 0, 13, UINT32_MAX);
}
Test(config, cq_iterations) {
  CHECK_LAYER(set_key_cq_iterations, KVQ_ERROR_OUT_OF_RANGE, "keys.cq.iterations", 100001, 1u << 31, UINT32_MAX);
  CHECK_LAYER(set_value_cq_iterations, KVQ_ERROR_OUT_OF_RANGE, "values.cq.iterations", 100001, UINT32_MAX);
}

Test(config, method_defaults_for_bad_arguments_are_rejected) {
  kvq_context *ctx = th_cpu_context();
  cfg c;
  cfg_init(&c, 1);
  c.layers[0].keys = kvq_method_defaults((kvq_method)9, D);
  expect_bad_layer(ctx, &c.config, 0, KVQ_ERROR_INVALID_ARGUMENT, "keys.method", "defaults of method 9");
  cfg_init(&c, 1);
  c.layers[0] = th_layer(HQ, HKV, 0, kvq_method_defaults(KVQ_METHOD_QJL, 0), kvq_method_defaults(KVQ_METHOD_UNIFORM, 0));
  expect_bad_layer(ctx, &c.config, 0, KVQ_ERROR_OUT_OF_RANGE, "head_dim", "defaults at head_dim 0");
  kvq_context_destroy(ctx);
}

/* kvq_cache_config_check documents message == NULL as "no message" whatever message_size says. */
Test(config, null_message_with_a_size) {
  cfg c;
  cfg_init(&c, 2);
  c.layers[1].keys.qjl.sketch_dim = 33;
  cr_assert_eq(kvq_cache_config_check(&c.config, NULL, 64), KVQ_ERROR_OUT_OF_RANGE, "a bad layer");
  cfg_init(&c, 2);
  c.config.policy = kvq_policy_defaults(KVQ_POLICY_H2O);
  c.config.policy.lambda = 2.0f;
  cr_assert_eq(kvq_cache_config_check(&c.config, NULL, 64), KVQ_ERROR_OUT_OF_RANGE, "a bad policy");
  c.config.policy.kind = (kvq_policy_kind)7;
  cr_assert_eq(kvq_cache_config_check(&c.config, NULL, 64), KVQ_ERROR_INVALID_ARGUMENT, "an unknown policy");
}

/* ---- Token policies: kvq_cache_config.policy ---------------------------------------------------- */

static const kvq_policy_kind evicting_kinds[] = {KVQ_POLICY_STREAMING, KVQ_POLICY_H2O, KVQ_POLICY_QHITTER};
static const kvq_policy_kind heavy_kinds[] = {KVQ_POLICY_H2O, KVQ_POLICY_QHITTER};

/* The fixture's layers and sizes (R = 16, P = 16) with a policy: its defaults, one field edited. */
typedef void (*policy_edit)(kvq_policy_config *p, double value);

static void check_policy_values(const kvq_policy_kind *kinds, size_t kind_count, policy_edit edit, const double *values,
                                size_t count, kvq_status want, const char *mention) {
  kvq_context *ctx = th_cpu_context();
  for (size_t k = 0; k < kind_count; k++)
    for (size_t i = 0; i < count; i++) {
      cfg c;
      cfg_init(&c, 2);
      c.config.policy = kvq_policy_defaults(kinds[k]);
      edit(&c.config.policy, values[i]);
      char what[96];
      snprintf(what, sizeof what, "%s = %g under policy kind %d", mention, values[i], (int)kinds[k]);
      expect_bad_config(ctx, &c.config, want, mention, what);
    }
  kvq_context_destroy(ctx);
}
#define CHECK_POLICY(kinds, edit, want, mention, ...)                                                            \
  do {                                                                                                           \
    const double v_[] = {__VA_ARGS__};                                                                           \
    check_policy_values((kinds), sizeof(kinds) / sizeof(kinds)[0], (edit), v_, sizeof v_ / sizeof v_[0], (want),  \
                        (mention));                                                                              \
  } while (0)

static void set_policy_kind(kvq_policy_config *p, double v) { p->kind = (kvq_policy_kind)(int64_t)v; }
static void set_policy_sinks(kvq_policy_config *p, double v) { p->sinks = (uint32_t)v; }
static void set_policy_recent(kvq_policy_config *p, double v) { p->recent = (uint32_t)v; }
static void set_policy_heavy(kvq_policy_config *p, double v) { p->heavy = (uint32_t)v; }
static void set_policy_heavy_fraction(kvq_policy_config *p, double v) { p->heavy_fraction = (float)v; }
static void set_policy_lambda(kvq_policy_config *p, double v) { p->lambda = (float)v; }

Test(policy_config, unknown_kind) {
  static const kvq_policy_kind one[] = {KVQ_POLICY_H2O};
  CHECK_POLICY(one, set_policy_kind, KVQ_ERROR_INVALID_ARGUMENT, "policy.kind", 4, 5, 99, 0x7fffffff, -1, INT32_MIN);
}

/* recent >= residual_window + page_size = 32, or 0 for exactly that. */
Test(policy_config, recent_below_the_window_and_a_page) {
  CHECK_POLICY(evicting_kinds, set_policy_recent, KVQ_ERROR_OUT_OF_RANGE, "policy.recent", 1, 4, 16, 31);
  kvq_context *ctx = th_cpu_context();
  cfg c;
  cfg_init(&c, 1);
  c.config.residual_window = 0; /* the minimum is then one page */
  c.config.policy = kvq_policy_defaults(KVQ_POLICY_STREAMING);
  c.config.policy.recent = P - 1;
  expect_bad_config(ctx, &c.config, KVQ_ERROR_OUT_OF_RANGE, "policy.recent", "recent 15 without a window");
  c.config.policy.recent = P;
  cr_assert_eq(kvq_cache_config_check(&c.config, NULL, 0), KVQ_OK, "recent 16 = page_size without a window");
  /* the edges: 0 (the minimum, filled in by kvq_cache_create) and the minimum itself */
  cfg_init(&c, 1);
  c.config.policy = kvq_policy_defaults(KVQ_POLICY_H2O);
  c.config.policy.recent = R + P;
  cr_assert_eq(kvq_cache_config_check(&c.config, NULL, 0), KVQ_OK, "recent = R + P");
  c.config.policy.recent = 0;
  kvq_cache *cache = NULL;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &c.config, &cache));
  kvq_cache_config got;
  KVQ_CHECK(ctx, kvq_cache_get_config(cache, &got));
  cr_assert_eq(got.policy.recent, R + P, "recent 0 became %u, not residual_window + page_size", got.policy.recent);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

Test(policy_config, sinks_recent_and_heavy_from_2_31) {
  CHECK_POLICY(evicting_kinds, set_policy_sinks, KVQ_ERROR_OUT_OF_RANGE, "policy.sinks", 2147483648.0, 4294967295.0);
  CHECK_POLICY(evicting_kinds, set_policy_recent, KVQ_ERROR_OUT_OF_RANGE, "policy.recent", 2147483648.0, 4294967295.0);
  CHECK_POLICY(heavy_kinds, set_policy_heavy, KVQ_ERROR_OUT_OF_RANGE, "policy.heavy", 2147483648.0, 4294967295.0);
}

Test(policy_config, heavy_fraction_outside_0_to_1) {
  CHECK_POLICY(heavy_kinds, set_policy_heavy_fraction, KVQ_ERROR_OUT_OF_RANGE, "policy.heavy_fraction", -0.1,
               -(double)FLT_MIN, 1.0 + FLT_EPSILON, 2.0, 1e30, NAN, INFINITY, -INFINITY);
}

Test(policy_config, lambda_outside_0_to_1) {
  static const kvq_policy_kind qhitter[] = {KVQ_POLICY_QHITTER};
  CHECK_POLICY(qhitter, set_policy_lambda, KVQ_ERROR_OUT_OF_RANGE, "policy.lambda", -0.5, -(double)FLT_MIN,
               1.0 + FLT_EPSILON, 3.0, NAN, -NAN, INFINITY, -INFINITY);
}

/* The defaults of an unknown kind keep the kind, so the mistake is reported where the config is
 * used instead of turning silently into some valid policy. */
Test(policy_config, defaults_of_an_unknown_kind_are_rejected) {
  kvq_context *ctx = th_cpu_context();
  const int kinds[] = {4, 99, 0x7fffffff, -1};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    cfg c;
    cfg_init(&c, 2);
    c.config.policy = kvq_policy_defaults((kvq_policy_kind)kinds[i]);
    cr_assert_eq((int)c.config.policy.kind, kinds[i], "kvq_policy_defaults(%d) changed the kind to %d", kinds[i],
                 (int)c.config.policy.kind);
    char what[64];
    snprintf(what, sizeof what, "kvq_policy_defaults(%d)", kinds[i]);
    expect_bad_config(ctx, &c.config, KVQ_ERROR_INVALID_ARGUMENT, "policy.kind", what);
  }
  kvq_context_destroy(ctx);
}

Test(layer_bits, null_arguments) {
  kvq_layer_config L = th_layer(HQ, HKV, D, method(KVQ_METHOD_QJL), method(KVQ_METHOD_UNIFORM));
  double bits[2];
  memset(bits, SENTINEL, sizeof bits);
  cr_assert_eq(kvq_layer_bits_per_number(NULL, P, &bits[0], &bits[1]), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(kvq_layer_bits_per_number(&L, P, NULL, &bits[1]), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(kvq_layer_bits_per_number(&L, P, &bits[0], NULL), KVQ_ERROR_INVALID_ARGUMENT);
  expect_untouched(bits, sizeof bits, "kvq_layer_bits_per_number with a NULL argument");
}

/* ---- kvq_cache_create: what configuration checks cannot see ---------------------------------- */

Test(cache_create, null_context_sets_out_null) {
  cfg c;
  cfg_init(&c, 1);
  kvq_cache *cache = (kvq_cache *)(uintptr_t)1;
  cr_assert_eq(kvq_cache_create(NULL, &c.config, &cache), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_null(cache, "kvq_cache_create(NULL, ...) must set *out to NULL");
}

Test(cache_create, null_out) {
  cfg c;
  cfg_init(&c, 1);
  kvq_context *ctx = th_cpu_context();
  prime(ctx);
  expect_failure(ctx, kvq_cache_create(ctx, &c.config, NULL), KVQ_ERROR_INVALID_ARGUMENT, "out", "create(out NULL)");
  kvq_context_destroy(ctx);
}

/* 2^22 pages of 2^29 bytes: 2 PiB, valid field by field but far beyond any machine. */
Test(cache_create, impossibly_large_cache) {
  kvq_method_config ex = kvq_method_defaults(KVQ_METHOD_EXACT, 256);
  ex.exact.dtype = KVQ_DTYPE_F32;
  kvq_layer_config L = th_layer(1024, 1024, 256, ex, ex);
  kvq_cache_config config = th_config(&L, 1, KVQ_DTYPE_F32, 256, 0, 1u << 22, 1, 1);
  cr_assert_eq(kvq_cache_config_check(&config, NULL, 0), KVQ_OK);
  uint64_t bytes = 0;
  cr_assert_eq(kvq_cache_config_bytes(&config, &bytes), KVQ_OK);
  cr_assert_geq(bytes, (uint64_t)1 << 51, "config_bytes %llu is below the page pool alone", (unsigned long long)bytes);
  kvq_context *ctx = th_cpu_context();
  expect_create_fails(ctx, &config, KVQ_ERROR_OUT_OF_RANGE, "bytes", "a 2 PiB cache");
  kvq_context_destroy(ctx);
}

/* 4096 layers of 2^28-byte pages, 2^23 - 2 pages, two sequences: more than 2^64 bytes in all. The
 * byte count must not wrap around to something small, and creating must be refused up front. */
static kvq_layer_config *huge_layers(kvq_cache_config *config) {
  kvq_method_config ex = kvq_method_defaults(KVQ_METHOD_EXACT, 256);
  ex.exact.dtype = KVQ_DTYPE_F32;
  kvq_layer_config *layers = malloc(sizeof *layers * 4096);
  cr_assert_not_null(layers);
  for (int i = 0; i < 4096; i++) layers[i] = th_layer(1024, 1024, 256, ex, ex);
  *config = th_config(layers, 4096, KVQ_DTYPE_F32, 256, 0, (1u << 23) - 2, 2, 1);
  cr_assert_eq(kvq_cache_config_check(config, NULL, 0), KVQ_OK, "the configuration is valid field by field");
  return layers;
}

Test(cache_create, config_bytes_beyond_2_64_must_not_wrap) {
  kvq_cache_config config;
  kvq_layer_config *layers = huge_layers(&config);
  uint64_t bytes = 0;
  kvq_status st = kvq_cache_config_bytes(&config, &bytes);
  cr_assert(st == KVQ_ERROR_OUT_OF_RANGE || (st == KVQ_OK && bytes == UINT64_MAX),
            "kvq_cache_config_bytes of a > 2^64-byte cache: %s with %llu bytes (expected out of range, or a saturated "
            "bound)",
            kvq_status_string(st), (unsigned long long)bytes);
  free(layers);
}

Test(cache_create, cache_beyond_2_64_bytes_is_refused_up_front) {
  kvq_cache_config config;
  kvq_layer_config *layers = huge_layers(&config);
  kvq_context *ctx = th_cpu_context();
  expect_create_fails(ctx, &config, KVQ_ERROR_OUT_OF_RANGE, "bytes", "a > 2^64-byte cache");
  kvq_context_destroy(ctx);
  free(layers);
}

Test(cache_get_config, null_arguments) {
  fixture f;
  build(&f);
  kvq_cache_config config;
  memset(&config, SENTINEL, sizeof config);
  cr_assert_eq(kvq_cache_get_config(NULL, &config), KVQ_ERROR_INVALID_ARGUMENT);
  expect_untouched(&config, sizeof config, "kvq_cache_get_config(NULL, &config)");
  /* the primer is not get_config's own message: use a different one */
  cr_assert_eq(kvq_cache_memory(f.cache, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  const char *before = kvq_context_last_error(f.ctx);
  char copy[256];
  snprintf(copy, sizeof copy, "%s", before);
  cr_assert_eq(kvq_cache_get_config(f.cache, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_str_neq(kvq_context_last_error(f.ctx), copy, "no fresh message");
  expect_mention(f.ctx, "config", "kvq_cache_get_config(cache, NULL)");
  destroy(&f);
}

/* ================================================================================================
 * Sequences
 * ============================================================================================== */

Test(sequence_add, null_arguments) {
  fixture f;
  build(&f);
  uint32_t id = 0xa5a5a5a5u;
  REJECTS_SILENTLY(&f, kvq_sequence_add(NULL, &id), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(id, 0xa5a5a5a5u);
  REJECTS(&f, kvq_sequence_add(f.cache, NULL), KVQ_ERROR_INVALID_ARGUMENT, "id");
  destroy(&f);
}

Test(sequence_add, past_max_sequences) {
  fixture f;
  build(&f);
  uint32_t extra;
  KVQ_CHECK(f.ctx, kvq_sequence_add(f.cache, &extra)); /* the 4th and last slot */
  uint32_t id = 0xa5a5a5a5u;
  REJECTS(&f, kvq_sequence_add(f.cache, &id), KVQ_ERROR_CAPACITY, "sequence");
  cr_assert_eq(id, 0xa5a5a5a5u, "*sequence written by a failing kvq_sequence_add");
  REJECTS(&f, kvq_sequence_add(f.cache, &id), KVQ_ERROR_CAPACITY, "sequence");
  destroy(&f);
}

Test(sequence_free, null_cache) {
  fixture f;
  build(&f);
  REJECTS_SILENTLY(&f, kvq_sequence_free(NULL, f.seq[A]), KVQ_ERROR_INVALID_ARGUMENT);
  destroy(&f);
}

Test(sequence_free, unknown_and_stale_ids) {
  fixture f;
  build(&f);
  const uint32_t ids[] = {0, UINT32_MAX, f.stale, f.seq[A] + (1u << 16), f.seq[A] ^ 0xffff0000u, (1u << 16) | MAX_SEQS,
                          (1u << 16) | 0xffffu};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (!issued(&f, ids[i])) REJECTS(&f, kvq_sequence_free(f.cache, ids[i]), KVQ_ERROR_NOT_FOUND, "sequence");
  destroy(&f);
}

Test(sequence_free, double_free) {
  fixture f;
  build(&f);
  free_seq(&f, C);
  REJECTS(&f, kvq_sequence_free(f.cache, f.seq[C]), KVQ_ERROR_NOT_FOUND, "sequence");
  free_seq(&f, A); /* frees pages too */
  REJECTS(&f, kvq_sequence_free(f.cache, f.seq[A]), KVQ_ERROR_NOT_FOUND, "sequence");
  destroy(&f);
}

Test(sequence_info, bad_arguments) {
  fixture f;
  build(&f);
  kvq_sequence_info info;
  memset(&info, SENTINEL, sizeof info);
  REJECTS_SILENTLY(&f, kvq_sequence_info_get(NULL, f.seq[A], 0, &info), KVQ_ERROR_INVALID_ARGUMENT);
  const uint32_t ids[] = {0, UINT32_MAX, f.stale};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (!issued(&f, ids[i])) REJECTS(&f, kvq_sequence_info_get(f.cache, ids[i], 0, &info), KVQ_ERROR_NOT_FOUND, "sequence");
  const uint32_t layers[] = {2, 3, UINT32_MAX};
  for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++)
    REJECTS(&f, kvq_sequence_info_get(f.cache, f.seq[A], layers[i], &info), KVQ_ERROR_OUT_OF_RANGE, "layer");
  expect_untouched(&info, sizeof info, "kvq_sequence_info_get");
  REJECTS(&f, kvq_sequence_info_get(f.cache, f.seq[A], 0, NULL), KVQ_ERROR_INVALID_ARGUMENT, "info");
  destroy(&f);
}

/* ---- kvq_sequence_positions and kvq_sequence_token_stats ---------------------------------------- */

/* Both list something per kept token into the caller's array and count it: the positions of one layer
 * of a sequence, or the statistics of a sequence (kept per sequence, not per layer). A lister calls
 * either the same way, so that one check serves both. */
typedef kvq_status (*list_fn)(kvq_cache *cache, uint32_t seq, uint32_t layer, void *items, size_t capacity,
                              size_t *count);

typedef struct lister {
  const char *name;
  kvq_policy_kind policy; /* of a fixture whose sequences have something to list */
  list_fn list;
  size_t item_size, capacity; /* the capacity passed where it suffices */
} lister;

static kvq_status list_positions(kvq_cache *cache, uint32_t seq, uint32_t layer, void *items, size_t capacity,
                                 size_t *count) {
  return kvq_sequence_positions(cache, seq, layer, items, capacity, count);
}

static kvq_status list_token_stats(kvq_cache *cache, uint32_t seq, uint32_t layer, void *items, size_t capacity,
                                   size_t *count) {
  (void)layer;
  return kvq_sequence_token_stats(cache, seq, items, capacity, count);
}

/* Only H2O and Q-Hitter keep statistics. */
static const lister positions_lister = {"kvq_sequence_positions", KVQ_POLICY_KEEP_ALL, list_positions,
                                        sizeof(uint32_t), 200};
static const lister stats_lister = {"kvq_sequence_token_stats", KVQ_POLICY_H2O, list_token_stats,
                                    sizeof(kvq_token_stats), 100};

/* Sentinel-filled room for 200 positions or 100 statistics, and a sentinel count. */
typedef struct list_out {
  union {
    uint32_t positions[200];
    kvq_token_stats stats[100];
  } items;
  size_t count;
} list_out;

static void list_reset(list_out *o) { memset(o, SENTINEL, sizeof *o); }

static void list_null_cache(const lister *l) {
  fixture f;
  build_kind(&f, l->policy);
  list_out o;
  list_reset(&o);
  REJECTS_SILENTLY_VIA(&f, l->name, l->list(NULL, f.seq[A], 0, &o.items, l->capacity, &o.count),
                       KVQ_ERROR_INVALID_ARGUMENT);
  REJECTS_SILENTLY_VIA(&f, l->name, l->list(NULL, f.seq[A], 0, NULL, 0, &o.count), KVQ_ERROR_INVALID_ARGUMENT);
  expect_untouched(&o, sizeof o, via(l->name, "NULL cache"));
  destroy(&f);
}

/* Ids never issued or stale, then sequence `freed` once it is freed. */
static void list_unknown_sequences(const lister *l, int freed) {
  fixture f;
  build_kind(&f, l->policy);
  list_out o;
  list_reset(&o);
  const uint32_t ids[] = {0, UINT32_MAX, f.stale, (1u << 16) | MAX_SEQS};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (!issued(&f, ids[i]))
      REJECTS_VIA(&f, l->name, l->list(f.cache, ids[i], 0, &o.items, l->capacity, &o.count), KVQ_ERROR_NOT_FOUND,
                  "sequence");
  free_seq(&f, freed);
  REJECTS_VIA(&f, l->name, l->list(f.cache, f.seq[freed], 0, NULL, 0, &o.count), KVQ_ERROR_NOT_FOUND, "sequence");
  expect_untouched(&o, sizeof o, via(l->name, "an unknown sequence"));
  destroy(&f);
}

/* Without a count: with room for a, and with none for another sequence or layer. */
static void list_null_count(const lister *l, int seq, uint32_t layer) {
  fixture f;
  build_kind(&f, l->policy);
  list_out o;
  list_reset(&o);
  REJECTS_VIA(&f, l->name, l->list(f.cache, f.seq[A], 0, &o.items, l->capacity, NULL), KVQ_ERROR_INVALID_ARGUMENT,
              "count");
  REJECTS_VIA(&f, l->name, l->list(f.cache, f.seq[seq], layer, NULL, 0, NULL), KVQ_ERROR_INVALID_ARGUMENT, "count");
  expect_untouched(&o, sizeof o, via(l->name, "no count"));
  destroy(&f);
}

/* Room for fewer items than the kept tokens: nothing written, neither the items nor the count. */
static void list_too_small(fixture *f, const lister *l, uint32_t seq, uint32_t layer, size_t kept) {
  const size_t capacities[] = {0, 1, kept / 2, kept - 1};
  char needed[32];
  snprintf(needed, sizeof needed, "%zu", kept);
  for (size_t i = 0; i < sizeof capacities / sizeof capacities[0]; i++) {
    list_out o;
    list_reset(&o);
    char what[96];
    snprintf(what, sizeof what, "%s: %zu kept tokens, capacity %zu", l->name, kept, capacities[i]);
    begin(f);
    kvq_status st = l->list(f->cache, seq, layer, &o.items, capacities[i], &o.count);
    end(f, st, KVQ_ERROR_CAPACITY, needed, what);
    expect_untouched(&o, sizeof o, what);
  }
  /* the edge: room for exactly the kept tokens */
  list_out o;
  list_reset(&o);
  KVQ_CHECK(f->ctx, l->list(f->cache, seq, layer, &o.items, kept, &o.count));
  cr_assert_eq(o.count, kept);
  expect_untouched((uint8_t *)&o.items + kept * l->item_size, sizeof o.items - kept * l->item_size,
                   via(l->name, "past count"));
}

Test(sequence_positions, null_cache) { list_null_cache(&positions_lister); }

Test(sequence_positions, unknown_and_stale_sequences) { list_unknown_sequences(&positions_lister, C); }

Test(sequence_positions, layer_out_of_range) {
  fixture f;
  build(&f);
  list_out o;
  list_reset(&o);
  const uint32_t layers[] = {2, 1000, UINT32_MAX};
  for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++)
    REJECTS(&f, kvq_sequence_positions(f.cache, f.seq[A], layers[i], o.items.positions, 200, &o.count),
            KVQ_ERROR_OUT_OF_RANGE, "layer");
  expect_untouched(&o, sizeof o, "kvq_sequence_positions of a missing layer");
  destroy(&f);
}

Test(sequence_positions, null_count) { list_null_count(&positions_lister, A, 1); }

/* How many tokens sequence `seq` keeps in `layer`. */
typedef struct kept {
  int seq;
  uint32_t layer;
  size_t tokens;
} kept;

/* list_too_small() for each case, on a fixture under the given policy. */
static void list_too_small_cases(const lister *l, kvq_policy_kind policy, const kept *cases, size_t count) {
  fixture f;
  build_kind(&f, policy);
  for (size_t i = 0; i < count; i++) list_too_small(&f, l, f.seq[cases[i].seq], cases[i].layer, cases[i].tokens);
  destroy(&f);
}

Test(sequence_positions, capacity_below_the_kept_tokens) {
  static const kept keep_all[] = {{A, 0, 72}, {A, 1, 70}, {B, 0, 20}};
  /* with evictions the kept tokens count, not those appended */
  static const kept streaming[] = {{C, 0, POLICY_C_TOKENS - STREAMING_EVICTED}, {C, 1, POLICY_C_TOKENS - STREAMING_EVICTED}};
  list_too_small_cases(&positions_lister, KVQ_POLICY_KEEP_ALL, keep_all, 3);
  list_too_small_cases(&positions_lister, KVQ_POLICY_STREAMING, streaming, 2);
}

Test(sequence_token_stats, null_cache) { list_null_cache(&stats_lister); }

Test(sequence_token_stats, unknown_and_stale_sequences) { list_unknown_sequences(&stats_lister, B); }

Test(sequence_token_stats, null_count) { list_null_count(&stats_lister, C, 0); }

/* a: every position below 72 (the longer layer) has statistics; c: the 48 it keeps. */
Test(sequence_token_stats, capacity_below_the_tracked_tokens) {
  static const kept cases[] = {{A, 0, 72}, {B, 0, 20}, {C, 0, POLICY_C_TOKENS - H2O_EVICTED}};
  list_too_small_cases(&stats_lister, KVQ_POLICY_H2O, cases, 3);
}

static void expect_no_statistics(fixture *f) {
  for (int i = 0; i < 3; i++) {
    list_out o;
    list_reset(&o);
    REJECTS(f, kvq_sequence_token_stats(f->cache, f->seq[i], o.items.stats, 100, &o.count), KVQ_ERROR_INVALID_ARGUMENT,
            "statistics");
    REJECTS(f, kvq_sequence_token_stats(f->cache, f->seq[i], NULL, 0, &o.count), KVQ_ERROR_INVALID_ARGUMENT,
            "statistics");
    char what[64];
    snprintf(what, sizeof what, "token_stats under policy kind %d", (int)f->policy);
    expect_untouched(&o, sizeof o, what);
  }
}

/* Only H2O and Q-Hitter keep statistics. */
Test(sequence_token_stats, policy_keeps_no_statistics) {
  FOR_EACH_POLICY(expect_no_statistics, KVQ_POLICY_KEEP_ALL, KVQ_POLICY_STREAMING);
}

/* ---- kvq_sequence_apply_policy ----------------------------------------------------------------- */

Test(sequence_apply_policy, null_cache) {
  fixture f;
  build_policy(&f, KVQ_POLICY_H2O);
  REJECTS_SILENTLY(&f, kvq_sequence_apply_policy(NULL, f.seq[C]), KVQ_ERROR_INVALID_ARGUMENT);
  destroy(&f);
}

static void apply_to_unknown_sequences(fixture *f) {
  const uint32_t ids[] = {0, UINT32_MAX, f->stale, (1u << 16) | MAX_SEQS};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (!issued(f, ids[i])) REJECTS(f, kvq_sequence_apply_policy(f->cache, ids[i]), KVQ_ERROR_NOT_FOUND, "sequence");
  free_seq(f, C);
  REJECTS(f, kvq_sequence_apply_policy(f->cache, f->seq[C]), KVQ_ERROR_NOT_FOUND, "sequence");
}

Test(sequence_apply_policy, unknown_and_stale_sequences) {
  FOR_EACH_POLICY(apply_to_unknown_sequences, KVQ_POLICY_KEEP_ALL, KVQ_POLICY_STREAMING);
}

static void apply_to_uneven_layers(fixture *f) {
  REJECTS(f, kvq_sequence_apply_policy(f->cache, f->seq[A]), KVQ_ERROR_INVALID_ARGUMENT, "layers");
  REJECTS(f, kvq_sequence_apply_policy(f->cache, f->seq[B]), KVQ_ERROR_INVALID_ARGUMENT, "layers");
}

/* a holds 72 tokens in layer 0 and 70 in layer 1, b 20 and none: the policy needs all layers in step
 * (KEEP_ALL too, as documented). */
Test(sequence_apply_policy, layers_hold_different_token_counts) {
  FOR_EACH_POLICY(apply_to_uneven_layers, KVQ_POLICY_KEEP_ALL, KVQ_POLICY_STREAMING, KVQ_POLICY_H2O);
}

/* ================================================================================================
 * kvq_append
 * ============================================================================================== */

/* ---- Calls that take keys and values [n][HKV][D]: kvq_append and kvq_codebooks_learn ---------- */

/* What the checks of such a call need: its fixture, good keys and values for it, and the call itself. */
typedef struct kv_taker {
  const char *name;
  void (*build)(fixture *f);
  kv (*input)(const fixture *f, uint32_t seed);
  kvq_status (*take)(fixture *f, const kv *x);
} kv_taker;

/* kvq_append: 24 tokens (a page and more) to sequence a, layer 0, of the default fixture. */
static kv append_input(const fixture *f, uint32_t seed) { return kv_random(f->input, 24, seed); }
static kvq_status append_take(fixture *f, const kv *x) { return kvq_append(f->cache, f->seq[A], 0, &x->k, &x->v); }

/* kvq_codebooks_learn: 48 fp32 calibration tokens for layer 0 of a codebook fixture (learned before:
 * learning again is allowed while the layer holds no tokens). */
static kv calibration(kvq_dtype dtype, uint32_t seed) { return kv_random(dtype, CALIBRATION, seed); }
static void build_learned(fixture *f) { build_codebooks(f, 1); }
static kv learn_input(const fixture *f, uint32_t seed) {
  (void)f;
  return calibration(KVQ_DTYPE_F32, seed);
}
static kvq_status learn_take(fixture *f, const kv *x) { return kvq_codebooks_learn(f->cache, 0, &x->k, &x->v, NULL); }

static const kv_taker appender = {"kvq_append", build, append_input, append_take};
static const kv_taker learner = {"kvq_codebooks_learn", build_learned, learn_input, learn_take};

/* Builds the taker's fixture and returns good input for it; kv_close() frees both. */
static kv kv_open(const kv_taker *t, fixture *f, uint32_t seed) {
  t->build(f);
  return t->input(f, seed);
}

static void kv_close(fixture *f, kv *x) {
  kv_free(x);
  destroy(f);
}

/* Every tensor edit of one side (0: keys, 1: values) that an input with free rows can have. */
static void kv_tensor_edits(const kv_taker *t, int side, uint32_t seed) {
  fixture f;
  t->build(&f);
  for (size_t i = 0; i < EDIT_COUNT; i++) {
    if (!edit_applies(&edits[i], FREE_ROWS)) continue;
    kv x = t->input(&f, seed);
    edits[i].apply(side ? &x.v : &x.k);
    char what[128];
    snprintf(what, sizeof what, "%s with %s: %s", t->name, side ? "values" : "keys", edits[i].name);
    begin(&f);
    kvq_status st = t->take(&f, &x);
    end(&f, st, edits[i].want, edits[i].mention, what);
    expect_mention(f.ctx, side ? "values" : "keys", what);
    kv_free(&x);
  }
  destroy(&f);
}

/* One value token fewer than keys; one key token only. */
static void kv_token_counts_differ(const kv_taker *t, uint32_t seed, const char *mention) {
  fixture f;
  kv x = kv_open(t, &f, seed);
  const int64_t n = x.k.shape[0];
  x.v.shape[0] = n - 1;
  REJECTS_VIA(&f, t->name, t->take(&f, &x), KVQ_ERROR_INVALID_ARGUMENT, mention);
  x.v.shape[0] = n;
  x.k.shape[0] = 1;
  REJECTS_VIA(&f, t->name, t->take(&f, &x), KVQ_ERROR_INVALID_ARGUMENT, mention);
  kv_close(&f, &x);
}

/* n good tokens in `dtype` but for one bad number: the first or last element of the keys (side 0) or
 * the values (side 1). */
static kv kv_with_one_bad(kvq_dtype dtype, uint32_t n, uint32_t key_seed, uint32_t value_seed, int side, int last,
                          float bad) {
  float *kf = random_tokens(n, HKV, key_seed), *vf = random_tokens(n, HKV, value_seed);
  (side ? vf : kf)[last ? (size_t)n * HKV * D - 1 : 0] = bad;
  return kv_from(kf, vf, dtype, n);
}

static const float nonfinite[3] = {NAN, INFINITY, -INFINITY};

Test(append, null_arguments) {
  fixture f;
  kv x = kv_open(&appender, &f, 11);
  REJECTS_SILENTLY(&f, kvq_append(NULL, f.seq[A], 0, &x.k, &x.v), KVQ_ERROR_INVALID_ARGUMENT);
  REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, NULL, &x.v), KVQ_ERROR_INVALID_ARGUMENT, "keys");
  REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, &x.k, NULL), KVQ_ERROR_INVALID_ARGUMENT, "values");
  REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, NULL, NULL), KVQ_ERROR_INVALID_ARGUMENT, "keys");
  kv_close(&f, &x);
}

Test(append, unknown_stale_and_freed_sequences) {
  fixture f;
  kv x = kv_open(&appender, &f, 11);
  const uint32_t ids[] = {0, UINT32_MAX, f.stale, (1u << 16) | MAX_SEQS};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (!issued(&f, ids[i])) REJECTS(&f, kvq_append(f.cache, ids[i], 0, &x.k, &x.v), KVQ_ERROR_NOT_FOUND, "sequence");
  free_seq(&f, C);
  REJECTS(&f, kvq_append(f.cache, f.seq[C], 0, &x.k, &x.v), KVQ_ERROR_NOT_FOUND, "sequence");
  kv_close(&f, &x);
}

Test(append, layer_out_of_range) {
  fixture f;
  kv x = kv_open(&appender, &f, 11);
  const uint32_t layers[] = {2, 1000, UINT32_MAX};
  for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++)
    REJECTS(&f, kvq_append(f.cache, f.seq[A], layers[i], &x.k, &x.v), KVQ_ERROR_OUT_OF_RANGE, "layer");
  kv_close(&f, &x);
}

Test(append, bad_key_tensors) { kv_tensor_edits(&appender, 0, 12); }
Test(append, bad_value_tensors) { kv_tensor_edits(&appender, 1, 12); }

Test(append, key_and_value_token_counts_differ) { kv_token_counts_differ(&appender, 13, "tokens"); }

Test(append, dtype_differs_from_the_input_dtype) {
  const kvq_dtype inputs[] = {KVQ_DTYPE_F16, KVQ_DTYPE_F32, KVQ_DTYPE_BF16};
  for (int i = 0; i < 3; i++) {
    fixture f;
    build_with(&f, inputs[i]);
    const int other = (i + 1) % 3, third = (i + 2) % 3;
    const int combos[3][2] = {{other, i}, {i, third}, {third, other}}; /* keys, values */
    for (int j = 0; j < 3; j++) {
      const int k = combos[j][0], v = combos[j][1];
      kv kx = kv_random(inputs[k], 24, 14), vx = kv_random(inputs[v], 24, 15);
      char what[96];
      snprintf(what, sizeof what, "input dtype %d, keys dtype %d, values dtype %d", i, k, v);
      begin(&f);
      kvq_status st = kvq_append(f.cache, f.seq[A], 0, &kx.k, &vx.v);
      end(&f, st, KVQ_ERROR_DTYPE_MISMATCH, "dtype", what);
      expect_mention(f.ctx, k != i ? "keys" : "values", what);
      kv_free(&kx);
      kv_free(&vx);
    }
    destroy(&f);
  }
}

Test(append, past_the_longest_sequence) {
  fixture f;
  build(&f);
  /* a holds 72 tokens in layer 0: 89 more exceed the limit of 160 by one */
  kv x = kv_random(f.input, SEQ_LIMIT - 72 + 1, 16);
  REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, &x.k, &x.v), KVQ_ERROR_CAPACITY, "tokens");
  kv_free(&x);
  x = kv_random(f.input, SEQ_LIMIT + 1, 17);
  REJECTS(&f, kvq_append(f.cache, f.seq[C], 0, &x.k, &x.v), KVQ_ERROR_CAPACITY, "tokens");
  kv_free(&x);
  destroy(&f);
}

Test(append, past_the_free_pages) {
  fixture f;
  build(&f);
  /* c is empty; 96 tokens quantize 5 pages, 3 are free */
  kv x = kv_random(f.input, 96, 18);
  REJECTS(&f, kvq_append(f.cache, f.seq[C], 0, &x.k, &x.v), KVQ_ERROR_CAPACITY, "pages");
  kv_free(&x);
  /* b holds 20 tokens flushed into 2 pages; 96 more quantize 6 pages in all, 4 new */
  x = kv_random(f.input, 96, 19);
  REJECTS(&f, kvq_append(f.cache, f.seq[B], 0, &x.k, &x.v), KVQ_ERROR_CAPACITY, "pages");
  kv_free(&x);
  destroy(&f);
}

/* An append to layer 0 runs the policy first, since evictions may free the pages it needs; when the
 * pages are still too few, the policy's evictions must not happen either. */
static void append_past_the_free_pages(fixture *f) { /* build_policy() leaves 1 page free */
  append_ok(f, f->seq[C], 0, 8, 60); /* the policy runs on c's 64 tokens and evicts nothing new */
  append_ok(f, f->seq[C], 1, 8, 61); /* 72 in both layers: positions 32..39 are new candidates */
  kv x = kv_random(f->input, 40, 62); /* 112 tokens: 6 pages quantized, 3 of them new */
  REJECTS(f, kvq_append(f->cache, f->seq[C], 0, &x.k, &x.v), KVQ_ERROR_CAPACITY, "pages");
  kv_free(&x);
}

Test(append, past_the_free_pages_under_a_policy) {
  FOR_EACH_POLICY(append_past_the_free_pages, KVQ_POLICY_STREAMING, KVQ_POLICY_H2O);
}

/* One bad number in an otherwise good block of 24 tokens (which would quantize a page of a): first
 * or last element, keys or values, NaN or an infinity, in either layer. */
static void nonfinite_case(kvq_dtype input, int side) {
  fixture f;
  build_with(&f, input);
  for (uint32_t layer = 0; layer < 2; layer++)
    for (int b = 0; b < 3; b++)
      for (int last = 0; last < 2; last++) {
        kv x = kv_with_one_bad(input, 24, 20 + b, 30 + b, side, last, nonfinite[b]);
        char what[128];
        snprintf(what, sizeof what, "%g in the %s element of the %s, layer %u, input dtype %d", (double)nonfinite[b],
                 last ? "last" : "first", side ? "values" : "keys", layer, (int)input);
        begin(&f);
        kvq_status st = kvq_append(f.cache, f.seq[A], layer, &x.k, &x.v);
        end(&f, st, KVQ_ERROR_NON_FINITE, side ? "values" : "keys", what);
        kv_free(&x);
      }
  destroy(&f);
}

Test(append, nonfinite_keys_f16) { nonfinite_case(KVQ_DTYPE_F16, 0); }
Test(append, nonfinite_values_f16) { nonfinite_case(KVQ_DTYPE_F16, 1); }
Test(append, nonfinite_keys_f32) { nonfinite_case(KVQ_DTYPE_F32, 0); }
Test(append, nonfinite_values_f32) { nonfinite_case(KVQ_DTYPE_F32, 1); }
Test(append, nonfinite_keys_bf16) { nonfinite_case(KVQ_DTYPE_BF16, 0); }
Test(append, nonfinite_values_bf16) { nonfinite_case(KVQ_DTYPE_BF16, 1); }

/* Appends 24 tokens where token 5, head 1 of one side has channels [c0, c1) set to `value`. */
static kvq_status append_with_block(fixture *f, uint32_t seq, uint32_t layer, int side, uint32_t c0, uint32_t c1,
                                    float value) {
  const uint32_t n = 24;
  float *kf = random_tokens(n, HKV, 40), *vf = random_tokens(n, HKV, 41);
  float *x = (side ? vf : kf) + ((size_t)5 * HKV + 1) * D;
  for (uint32_t c = c0; c < c1; c++) x[c] = value;
  kv t = kv_from(kf, vf, f->input, n);
  kvq_status st = kvq_append(f->cache, seq, layer, &t.k, &t.v);
  kv_free(&t);
  return st;
}

Test(append, qjl_key_norm_beyond_fp16) {
  fixture f;
  build(&f); /* fp16 input: every number fits, the norm of 32 numbers of 12000 (67882) does not */
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 0, 0, D, 12000.0f), KVQ_ERROR_NON_FINITE, "norm");
  REJECTS(&f, append_with_block(&f, f.seq[C], 0, 0, 0, D, -65504.0f), KVQ_ERROR_NON_FINITE, "norm");
  /* the edge: a norm of 62225 (32 numbers of 11000) is stored */
  invalidate(&f);
  KVQ_CHECK(f.ctx, append_with_block(&f, f.seq[C], 0, 0, 0, D, 11000.0f));
  destroy(&f);
}

Test(append, uniform_minimum_overflows_fp16) {
  fixture f;
  build_with(&f, KVQ_DTYPE_F32);
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 1, 7, 8, -1e5f), KVQ_ERROR_NON_FINITE, "group");
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 1, 0, 32, 7e4f), KVQ_ERROR_NON_FINITE, "group");
  destroy(&f);
}

Test(append, uniform_scale_overflows_fp16) {
  fixture f;
  build_with(&f, KVQ_DTYPE_F32); /* 2 bits: scale = (max - min) / 3 > 65504, the minimum fits */
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 1, 20, 21, 2e5f), KVQ_ERROR_NON_FINITE, "group");
  destroy(&f);
  /* fp16 input, 1 bit: scale = max - min = 120000 from numbers of +-60000 */
  kvq_method_config one = method(KVQ_METHOD_UNIFORM);
  one.uniform.bits = 1;
  build_single(&f, KVQ_DTYPE_F16, method(KVQ_METHOD_EXACT), one);
  const uint32_t n = 24;
  float *kf = random_tokens(n, HKV, 42), *vf = random_tokens(n, HKV, 43);
  vf[(size_t)3 * HKV * D + 0] = -60000.0f;
  vf[(size_t)3 * HKV * D + 1] = 60000.0f;
  kv x = kv_from(kf, vf, f.input, n);
  REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, &x.k, &x.v), KVQ_ERROR_NON_FINITE, "group");
  kv_free(&x);
  destroy(&f);
}

Test(append, exact_fp16_storage_out_of_range) {
  fixture f;
  build_with(&f, KVQ_DTYPE_F32); /* layer 1 stores fp16 */
  REJECTS(&f, append_with_block(&f, f.seq[A], 1, 0, 3, 4, 1e6f), KVQ_ERROR_NON_FINITE, "fp16");
  REJECTS(&f, append_with_block(&f, f.seq[A], 1, 1, 3, 4, -1e6f), KVQ_ERROR_NON_FINITE, "fp16");
  REJECTS(&f, append_with_block(&f, f.seq[A], 1, 0, D - 1, D, 65520.0f), KVQ_ERROR_NON_FINITE, "fp16");
  REJECTS(&f, append_with_block(&f, f.seq[A], 1, 1, 0, 1, FLT_MAX), KVQ_ERROR_NON_FINITE, "fp16");
  /* the edge: the largest fp16 and numbers that round to it are stored */
  invalidate(&f);
  KVQ_CHECK(f.ctx, append_with_block(&f, f.seq[C], 1, 0, 3, 4, 65504.0f));
  KVQ_CHECK(f.ctx, append_with_block(&f, f.seq[C], 1, 1, 3, 4, -65519.0f));
  destroy(&f);
  build_with(&f, KVQ_DTYPE_BF16); /* bf16 holds 1e6, fp16 does not */
  REJECTS(&f, append_with_block(&f, f.seq[A], 1, 0, 0, D, 1e6f), KVQ_ERROR_NON_FINITE, "fp16");
  destroy(&f);
}

Test(append, exact_bf16_storage_out_of_range) {
  kvq_method_config bf = method(KVQ_METHOD_EXACT);
  bf.exact.dtype = KVQ_DTYPE_BF16;
  fixture f;
  build_single(&f, KVQ_DTYPE_F32, bf, bf); /* FLT_MAX rounds up to bf16 infinity */
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 0, 0, 1, FLT_MAX), KVQ_ERROR_NON_FINITE, "bf16");
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 1, 9, 10, -FLT_MAX), KVQ_ERROR_NON_FINITE, "bf16");
  /* the edge (core/token_check.c passes magnitudes up to the largest bf16 without converting them):
   * halfway between the largest bf16 (bits 0x7f7f0000) and infinity rounds to even, up, and is
   * refused; the largest bf16 and the float just below halfway (which rounds down to it) are stored */
  const uint32_t edge[3] = {0x7f7f8000u, 0x7f7f0000u, 0x7f7f7fffu};
  float at[3];
  memcpy(at, edge, sizeof at);
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 0, 5, 6, at[0]), KVQ_ERROR_NON_FINITE, "bf16");
  invalidate(&f);
  KVQ_CHECK(f.ctx, append_with_block(&f, f.seq[A], 0, 0, 5, 6, at[1]));
  KVQ_CHECK(f.ctx, append_with_block(&f, f.seq[A], 0, 1, 5, 6, -at[2]));
  destroy(&f);
}

/* KIVI stores channel scales in fp16 and refuses |x| > 32752; PolarQuant refuses a token whose norm
 * passes 65440 (its fp16 radii). Both edges, also where core/token_check.c passes a vector without
 * range.h's test (every |x| <= 32752; d top^2 <= 4e9 for PolarQuant). */
Test(append, kivi_and_polar_ranges) {
  fixture f;
  build_single(&f, KVQ_DTYPE_F32, method(KVQ_METHOD_KIVI), method(KVQ_METHOD_UNIFORM));
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 0, 3, 4, 32753.0f), KVQ_ERROR_NON_FINITE, "32752");
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 0, 3, 4, -32753.0f), KVQ_ERROR_NON_FINITE, "32752");
  invalidate(&f);
  KVQ_CHECK(f.ctx, append_with_block(&f, f.seq[A], 0, 0, 3, 4, -32752.0f));
  destroy(&f);
  build_single(&f, KVQ_DTYPE_F32, method(KVQ_METHOD_POLAR), method(KVQ_METHOD_UNIFORM));
  /* one channel of 65500 (norm above 65440), and all 32 channels at 11600 (norm 65620, though every
   * number is small) are refused; 32 channels of 11500 (norm 65054) are stored */
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 0, 3, 4, 65500.0f), KVQ_ERROR_NON_FINITE, "norm");
  REJECTS(&f, append_with_block(&f, f.seq[A], 0, 0, 0, D, 11600.0f), KVQ_ERROR_NON_FINITE, "norm");
  invalidate(&f);
  KVQ_CHECK(f.ctx, append_with_block(&f, f.seq[A], 0, 0, 0, D, 11500.0f));
  destroy(&f);
}

/* ================================================================================================
 * kvq_flush
 * ============================================================================================== */

Test(flush, bad_arguments) {
  fixture f;
  build(&f);
  REJECTS_SILENTLY(&f, kvq_flush(NULL, f.seq[A]), KVQ_ERROR_INVALID_ARGUMENT);
  const uint32_t ids[] = {0, UINT32_MAX, f.stale, (1u << 16) | MAX_SEQS};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (!issued(&f, ids[i])) REJECTS(&f, kvq_flush(f.cache, ids[i]), KVQ_ERROR_NOT_FOUND, "sequence");
  destroy(&f);
}

Test(flush, past_the_free_pages) {
  fixture f;
  build(&f);
  append_ok(&f, f.seq[C], 0, 63, 50); /* 2 pages quantized, 31 tokens in the window: 1 page free */
  append_ok(&f, f.seq[C], 1, 10, 51);
  kvq_memory_report r;
  KVQ_CHECK(f.ctx, kvq_cache_memory(f.cache, &r));
  cr_assert_eq(r.pages_used, 7);
  REJECTS(&f, kvq_flush(f.cache, f.seq[C]), KVQ_ERROR_CAPACITY, "pages"); /* needs 4 pages */
  destroy(&f);
}

/* ================================================================================================
 * kvq_attention
 * ============================================================================================== */

typedef struct attn {
  float *q;
  out_buf out;
  kvq_attention_request req;
} attn;

static void attn_make(attn *a, uint32_t seq, kvq_mask mask, uint32_t nq, uint32_t seed) {
  a->q = random_tokens(nq, HQ, seed);
  a->req = (kvq_attention_request){.sequence = seq,
                                   .mask = mask,
                                   .queries = tensor3(a->q, KVQ_DTYPE_F32, nq, HQ, D),
                                   .output = sentinel_tensor(KVQ_DTYPE_F32, nq, HQ, D, &a->out)};
}

static void attn_free(attn *a) {
  free(a->q);
  free(a->out.data);
}

/* One failing request: status, message, unchanged cache, untouched output. */
static void attention_rejects(fixture *f, uint32_t layer, attn *a, kvq_status want, const char *mention,
                              const char *what) {
  begin(f);
  kvq_status st = kvq_attention(f->cache, layer, &a->req, 1);
  end(f, st, want, mention, what);
  expect_sentinel(&a->out, what);
}

Test(attention, null_cache_and_requests) {
  fixture f;
  build(&f);
  attn a;
  attn_make(&a, f.seq[A], KVQ_MASK_NONE, 3, 60);
  REJECTS_SILENTLY(&f, kvq_attention(NULL, 0, &a.req, 1), KVQ_ERROR_INVALID_ARGUMENT);
  REJECTS(&f, kvq_attention(f.cache, 0, NULL, 1), KVQ_ERROR_INVALID_ARGUMENT, "requests");
  expect_sentinel(&a.out, "kvq_attention(NULL cache)");
  attn_free(&a);
  destroy(&f);
}

Test(attention, zero_requests_do_nothing) {
  fixture f;
  build(&f);
  attn a;
  attn_make(&a, f.seq[A], KVQ_MASK_NONE, 3, 61);
  remember(&f);
  cr_assert_eq(kvq_attention(f.cache, 0, &a.req, 0), KVQ_OK);
  cr_assert_eq(kvq_attention(f.cache, 0, NULL, 0), KVQ_OK);
  check_unchanged(&f, "kvq_attention with count 0");
  expect_sentinel(&a.out, "kvq_attention with count 0");
  attn_free(&a);
  destroy(&f);
}

Test(attention, overflowing_request_count) {
  fixture f;
  build(&f);
  attn a;
  attn_make(&a, f.seq[A], KVQ_MASK_NONE, 3, 62);
  const size_t counts[] = {SIZE_MAX, SIZE_MAX / sizeof(kvq_attention_request) + 1};
  for (size_t i = 0; i < 2; i++)
    REJECTS(&f, kvq_attention(f.cache, 0, &a.req, counts[i]), KVQ_ERROR_OUT_OF_RANGE, "requests");
  expect_sentinel(&a.out, "kvq_attention with an overflowing count");
  attn_free(&a);
  destroy(&f);
}

Test(attention, layer_out_of_range) {
  fixture f;
  build(&f);
  const uint32_t layers[] = {2, UINT32_MAX};
  for (size_t i = 0; i < 2; i++) {
    attn a;
    attn_make(&a, f.seq[A], KVQ_MASK_NONE, 3, 63);
    attention_rejects(&f, layers[i], &a, KVQ_ERROR_OUT_OF_RANGE, "layer", "kvq_attention on a missing layer");
    attn_free(&a);
  }
  destroy(&f);
}

Test(attention, unknown_and_stale_sequences) {
  fixture f;
  build(&f);
  const uint32_t ids[] = {0, UINT32_MAX, f.stale, (1u << 16) | MAX_SEQS};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    if (issued(&f, ids[i])) continue;
    attn a;
    attn_make(&a, ids[i], KVQ_MASK_NONE, 3, 64);
    attention_rejects(&f, 0, &a, KVQ_ERROR_NOT_FOUND, "sequence", "kvq_attention on an unknown sequence");
    attn_free(&a);
  }
  destroy(&f);
}

Test(attention, empty_sequence) {
  fixture f;
  build(&f);
  for (int mask = 0; mask < 2; mask++) {
    attn a;
    attn_make(&a, f.seq[C], (kvq_mask)mask, 1, 65);
    attention_rejects(&f, 0, &a, KVQ_ERROR_OUT_OF_RANGE, "no tokens", "kvq_attention on an empty sequence");
    attn_free(&a);
    attn_make(&a, f.seq[B], (kvq_mask)mask, 1, 66); /* b has no tokens in layer 1 */
    attention_rejects(&f, 1, &a, KVQ_ERROR_OUT_OF_RANGE, "no tokens", "kvq_attention on an empty layer");
    attn_free(&a);
  }
  destroy(&f);
}

Test(attention, causal_with_more_queries_than_tokens) {
  fixture f;
  build(&f);
  attn a;
  attn_make(&a, f.seq[B], KVQ_MASK_CAUSAL, 21, 67); /* b has 20 tokens in layer 0 */
  attention_rejects(&f, 0, &a, KVQ_ERROR_OUT_OF_RANGE, "causal", "21 causal queries over 20 tokens");
  attn_free(&a);
  attn_make(&a, f.seq[A], KVQ_MASK_CAUSAL, 71, 68); /* a has 70 tokens in layer 1 */
  attention_rejects(&f, 1, &a, KVQ_ERROR_OUT_OF_RANGE, "causal", "71 causal queries over 70 tokens");
  attn_free(&a);
  destroy(&f);
}

Test(attention, unknown_mask) {
  fixture f;
  build(&f);
  const int masks[] = {2, 99, -1};
  for (size_t i = 0; i < 3; i++) {
    attn a;
    attn_make(&a, f.seq[A], (kvq_mask)masks[i], 3, 69);
    attention_rejects(&f, 0, &a, KVQ_ERROR_INVALID_ARGUMENT, "mask", "kvq_attention with an unknown mask");
    attn_free(&a);
  }
  destroy(&f);
}

static void attention_tensor_edits(int output) {
  fixture f;
  build(&f);
  for (size_t i = 0; i < EDIT_COUNT; i++) {
    if (!edit_applies(&edits[i], output ? FIXED_ROWS : FREE_ROWS)) continue;
    attn a;
    attn_make(&a, f.seq[A], KVQ_MASK_NONE, 3, 70);
    edits[i].apply(output ? &a.req.output : &a.req.queries);
    char what[128];
    snprintf(what, sizeof what, "kvq_attention with %s: %s", output ? "output" : "queries", edits[i].name);
    attention_rejects(&f, 0, &a, edits[i].want, edits[i].mention, what);
    expect_mention(f.ctx, output ? "output" : "queries", what);
    attn_free(&a);
  }
  destroy(&f);
}

Test(attention, bad_query_tensors) { attention_tensor_edits(0); }
Test(attention, bad_output_tensors) { attention_tensor_edits(1); }

/* Every request is validated before any output is written: a good first request's output stays. */
Test(attention, one_bad_request_in_a_batch) {
  fixture f;
  build(&f);
  for (int bad = 0; bad < 4; bad++) {
    attn a[2];
    attn_make(&a[0], f.seq[A], KVQ_MASK_CAUSAL, 3, 71);
    attn_make(&a[1], f.seq[B], KVQ_MASK_NONE, 2, 72);
    kvq_status want = KVQ_ERROR_INVALID_ARGUMENT;
    const char *mention = "output";
    if (bad == 0) {
      a[1].req.output.shape[2] = D + 16; /* not head_dim */
    } else if (bad == 1) {
      a[1].req.sequence = f.stale;
      want = KVQ_ERROR_NOT_FOUND;
      mention = "sequence";
    } else if (bad == 2) {
      a[1].req.sequence = f.seq[C];
      want = KVQ_ERROR_OUT_OF_RANGE;
      mention = "no tokens";
    } else {
      a[1].q[5] = NAN;
      want = KVQ_ERROR_NON_FINITE;
      mention = "queries";
    }
    kvq_attention_request reqs[2] = {a[0].req, a[1].req};
    char what[64];
    snprintf(what, sizeof what, "batch with bad request kind %d", bad);
    begin(&f);
    kvq_status st = kvq_attention(f.cache, 0, reqs, 2);
    end(&f, st, want, mention, what);
    expect_sentinel(&a[0].out, what);
    expect_sentinel(&a[1].out, what);
    attn_free(&a[0]);
    attn_free(&a[1]);
  }
  destroy(&f);
}

/* NaN or infinite queries make every output NaN: they are bad input like NaN keys. */
Test(attention, nonfinite_queries) {
  fixture f;
  build(&f);
  for (uint32_t layer = 0; layer < 2; layer++)
    for (int b = 0; b < 3; b++)
      for (int dtype = 0; dtype < 2; dtype++) {
        attn a;
        attn_make(&a, f.seq[A], KVQ_MASK_CAUSAL, 3, 73);
        a.q[(size_t)3 * HQ * D - 1] = nonfinite[b];
        void *storage = NULL;
        if (dtype) a.req.queries = th_tensor_from_f32(a.q, KVQ_DTYPE_F16, 3, HQ, D, &storage);
        char what[96];
        snprintf(what, sizeof what, "kvq_attention, layer %u, %s queries with %g", layer, dtype ? "fp16" : "fp32",
                 (double)nonfinite[b]);
        attention_rejects(&f, layer, &a, KVQ_ERROR_NON_FINITE, "queries", what);
        free(storage);
        attn_free(&a);
      }
  destroy(&f);
}

static int all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

/* Finite queries whose logits overflow fp32 must not give NaN with KVQ_OK: either refuse them
 * (untouched output) or return a finite answer. */
Test(attention, huge_finite_queries) {
  fixture f;
  build_with(&f, KVQ_DTYPE_F32);
  for (uint32_t layer = 0; layer < 2; layer++) {
    attn a;
    attn_make(&a, f.seq[A], KVQ_MASK_NONE, 2, 74);
    for (size_t i = 0; i < (size_t)2 * HQ * D; i++) a.q[i] = a.q[i] < 0 ? -1e38f : 1e38f;
    remember(&f);
    kvq_status st = kvq_attention(f.cache, layer, &a.req, 1);
    check_unchanged(&f, "attention with huge queries");
    if (st == KVQ_OK) {
      cr_assert(all_finite(a.out.data, (size_t)2 * HQ * D),
                "layer %u: KVQ_OK with non-finite outputs for finite queries of 1e38", layer);
    } else {
      cr_assert_eq(st, KVQ_ERROR_NON_FINITE, "layer %u: %s", layer, kvq_status_string(st));
      expect_sentinel(&a.out, "attention with huge queries");
    }
    attn_free(&a);
  }
  destroy(&f);
}

/* ================================================================================================
 * kvq_scores
 * ============================================================================================== */

typedef struct scores_call {
  float *q;
  kvq_tensor queries, scores;
  out_buf out;
} scores_call;

/* nq queries against all n tokens of (seq, layer). */
static void scores_make(scores_call *c, uint32_t nq, int64_t n, uint32_t seed) {
  c->q = random_tokens(nq, HQ, seed);
  c->queries = tensor3(c->q, KVQ_DTYPE_F32, nq, HQ, D);
  c->scores = sentinel_tensor(KVQ_DTYPE_F32, nq, HQ, n > 0 ? n : 1, &c->out);
}

static void scores_free(scores_call *c) {
  free(c->q);
  free(c->out.data);
}

static void scores_rejects(fixture *f, uint32_t seq, uint32_t layer, scores_call *c, kvq_mask mask, kvq_score_kind kind,
                           kvq_status want, const char *mention, const char *what) {
  begin(f);
  kvq_status st = kvq_scores(f->cache, seq, layer, &c->queries, mask, kind, &c->scores);
  end(f, st, want, mention, what);
  expect_sentinel(&c->out, what);
}

Test(scores, null_arguments) {
  fixture f;
  build(&f);
  scores_call c;
  scores_make(&c, 3, 72, 80);
  REJECTS_SILENTLY(&f, kvq_scores(NULL, f.seq[A], 0, &c.queries, KVQ_MASK_NONE, KVQ_SCORES_LOGITS, &c.scores),
                   KVQ_ERROR_INVALID_ARGUMENT);
  REJECTS(&f, kvq_scores(f.cache, f.seq[A], 0, NULL, KVQ_MASK_NONE, KVQ_SCORES_LOGITS, &c.scores),
          KVQ_ERROR_INVALID_ARGUMENT, "queries");
  REJECTS(&f, kvq_scores(f.cache, f.seq[A], 0, &c.queries, KVQ_MASK_NONE, KVQ_SCORES_LOGITS, NULL),
          KVQ_ERROR_INVALID_ARGUMENT, "scores");
  expect_sentinel(&c.out, "kvq_scores with NULL arguments");
  scores_free(&c);
  destroy(&f);
}

Test(scores, layer_sequence_mask_and_kind) {
  fixture f;
  build(&f);
  scores_call c;
  scores_make(&c, 3, 72, 81);
  const uint32_t layers[] = {2, UINT32_MAX};
  for (size_t i = 0; i < 2; i++)
    scores_rejects(&f, f.seq[A], layers[i], &c, KVQ_MASK_NONE, KVQ_SCORES_LOGITS, KVQ_ERROR_OUT_OF_RANGE, "layer",
                   "kvq_scores on a missing layer");
  const uint32_t ids[] = {0, UINT32_MAX, f.stale};
  for (size_t i = 0; i < 3; i++)
    if (!issued(&f, ids[i])) scores_rejects(&f, ids[i], 0, &c, KVQ_MASK_NONE, KVQ_SCORES_LOGITS, KVQ_ERROR_NOT_FOUND, "sequence",
                   "kvq_scores on an unknown sequence");
  const int masks[] = {2, 99, -1};
  for (size_t i = 0; i < 3; i++)
    scores_rejects(&f, f.seq[A], 0, &c, (kvq_mask)masks[i], KVQ_SCORES_LOGITS, KVQ_ERROR_INVALID_ARGUMENT, "mask",
                   "kvq_scores with an unknown mask");
  const int kinds[] = {2, 99, -1};
  for (size_t i = 0; i < 3; i++)
    scores_rejects(&f, f.seq[A], 0, &c, KVQ_MASK_NONE, (kvq_score_kind)kinds[i], KVQ_ERROR_INVALID_ARGUMENT, "kind",
                   "kvq_scores with an unknown score kind");
  scores_free(&c);
  destroy(&f);
}

Test(scores, empty_sequence_and_causal_overflow) {
  fixture f;
  build(&f);
  scores_call c;
  scores_make(&c, 1, 1, 82);
  for (int mask = 0; mask < 2; mask++) {
    scores_rejects(&f, f.seq[C], 0, &c, (kvq_mask)mask, KVQ_SCORES_PROBABILITIES, KVQ_ERROR_OUT_OF_RANGE, "no tokens",
                   "kvq_scores on an empty sequence");
    scores_rejects(&f, f.seq[B], 1, &c, (kvq_mask)mask, KVQ_SCORES_LOGITS, KVQ_ERROR_OUT_OF_RANGE, "no tokens",
                   "kvq_scores on an empty layer");
  }
  scores_free(&c);
  scores_make(&c, 21, 20, 83);
  scores_rejects(&f, f.seq[B], 0, &c, KVQ_MASK_CAUSAL, KVQ_SCORES_LOGITS, KVQ_ERROR_OUT_OF_RANGE, "causal",
                 "21 causal queries over 20 tokens");
  scores_free(&c);
  destroy(&f);
}

static void scores_tensor_edits(int scores_side) {
  fixture f;
  build(&f);
  for (size_t i = 0; i < EDIT_COUNT; i++) {
    if (!edit_applies(&edits[i], scores_side ? FIXED_ROWS : FREE_ROWS)) continue;
    scores_call c;
    scores_make(&c, 3, 72, 84);
    edits[i].apply(scores_side ? &c.scores : &c.queries);
    char what[128];
    snprintf(what, sizeof what, "kvq_scores with %s: %s", scores_side ? "scores" : "queries", edits[i].name);
    scores_rejects(&f, f.seq[A], 0, &c, KVQ_MASK_CAUSAL, KVQ_SCORES_PROBABILITIES, edits[i].want, edits[i].mention, what);
    expect_mention(f.ctx, scores_side ? "kvq_scores scores" : "queries", what);
    scores_free(&c);
  }
  destroy(&f);
}

Test(scores, bad_query_tensors) { scores_tensor_edits(0); }
Test(scores, bad_score_tensors) { scores_tensor_edits(1); }

Test(scores, score_tensor_for_the_wrong_token_count) {
  fixture f;
  build(&f);
  const int64_t counts[] = {71, 73, 70};
  for (size_t i = 0; i < 3; i++) {
    scores_call c;
    scores_make(&c, 3, counts[i], 85);
    scores_rejects(&f, f.seq[A], 0, &c, KVQ_MASK_NONE, KVQ_SCORES_LOGITS, KVQ_ERROR_INVALID_ARGUMENT, "shape[2]",
                   "scores sized for the wrong token count");
    scores_free(&c);
  }
  destroy(&f);
}

/* Under a policy the scores cover the kept tokens: c keeps 36 of its 64 in both layers. */
Test(scores, score_tensor_for_the_appended_instead_of_the_kept_tokens) {
  fixture f;
  build_policy(&f, KVQ_POLICY_STREAMING);
  const int64_t kept = POLICY_C_TOKENS - STREAMING_EVICTED, counts[] = {POLICY_C_TOKENS, kept + 1, kept - 1};
  for (uint32_t layer = 0; layer < 2; layer++)
    for (size_t i = 0; i < 3; i++) {
      scores_call c;
      scores_make(&c, 2, counts[i], 88);
      scores_rejects(&f, f.seq[C], layer, &c, KVQ_MASK_NONE, KVQ_SCORES_LOGITS, KVQ_ERROR_INVALID_ARGUMENT, "shape[2]",
                     "scores sized for other than the kept tokens");
      scores_free(&c);
    }
  destroy(&f);
}

Test(scores, nonfinite_queries) {
  fixture f;
  build(&f);
  for (uint32_t layer = 0; layer < 2; layer++)
    for (int b = 0; b < 3; b++)
      for (int kind = 0; kind < 2; kind++) {
        scores_call c;
        scores_make(&c, 2, layer ? 70 : 72, 86);
        c.q[7] = nonfinite[b];
        char what[96];
        snprintf(what, sizeof what, "kvq_scores, layer %u, kind %d, queries with %g", layer, kind, (double)nonfinite[b]);
        scores_rejects(&f, f.seq[A], layer, &c, KVQ_MASK_NONE, (kvq_score_kind)kind, KVQ_ERROR_NON_FINITE, "queries",
                       what);
        scores_free(&c);
      }
  destroy(&f);
}

Test(scores, huge_finite_queries) {
  fixture f;
  build_with(&f, KVQ_DTYPE_F32);
  scores_call c;
  scores_make(&c, 2, 72, 87);
  for (size_t i = 0; i < (size_t)2 * HQ * D; i++) c.q[i] = c.q[i] < 0 ? -1e38f : 1e38f;
  kvq_status st = kvq_scores(f.cache, f.seq[A], 0, &c.queries, KVQ_MASK_NONE, KVQ_SCORES_PROBABILITIES, &c.scores);
  if (st == KVQ_OK) {
    cr_assert(all_finite(c.out.data, (size_t)2 * HQ * 72), "KVQ_OK with non-finite probabilities for finite queries");
  } else {
    cr_assert_eq(st, KVQ_ERROR_NON_FINITE, "%s", kvq_status_string(st));
    expect_sentinel(&c.out, "scores with huge queries");
  }
  scores_free(&c);
  destroy(&f);
}

/* ================================================================================================
 * kvq_dequantize
 * ============================================================================================== */

typedef struct deq {
  out_buf kb, vb;
  kvq_tensor k, v;
} deq;

static void deq_make(deq *d, int64_t count) {
  d->k = sentinel_tensor(KVQ_DTYPE_F32, count, HKV, D, &d->kb);
  d->v = sentinel_tensor(KVQ_DTYPE_F16, count, HKV, D, &d->vb);
}

static void deq_free(deq *d) {
  free(d->kb.data);
  free(d->vb.data);
}

static void deq_rejects(fixture *f, uint32_t seq, uint32_t layer, uint64_t first, uint64_t count, deq *d,
                        const kvq_tensor *k, const kvq_tensor *v, kvq_status want, const char *mention, const char *what) {
  begin(f);
  kvq_status st = kvq_dequantize(f->cache, seq, layer, first, count, k, v);
  end(f, st, want, mention, what);
  expect_sentinel(&d->kb, what);
  expect_sentinel(&d->vb, what);
}

Test(dequantize, null_arguments) {
  fixture f;
  build(&f);
  deq d;
  deq_make(&d, 40);
  REJECTS_SILENTLY(&f, kvq_dequantize(NULL, f.seq[A], 0, 10, 40, &d.k, &d.v), KVQ_ERROR_INVALID_ARGUMENT);
  deq_rejects(&f, f.seq[A], 0, 10, 40, &d, NULL, NULL, KVQ_ERROR_INVALID_ARGUMENT, "NULL", "keys and values NULL");
  deq_free(&d);
  destroy(&f);
}

Test(dequantize, layer_and_sequence) {
  fixture f;
  build(&f);
  deq d;
  deq_make(&d, 40);
  const uint32_t layers[] = {2, UINT32_MAX};
  for (size_t i = 0; i < 2; i++)
    deq_rejects(&f, f.seq[A], layers[i], 10, 40, &d, &d.k, &d.v, KVQ_ERROR_OUT_OF_RANGE, "layer", "missing layer");
  const uint32_t ids[] = {0, UINT32_MAX, f.stale};
  for (size_t i = 0; i < 3; i++)
    if (!issued(&f, ids[i])) deq_rejects(&f, ids[i], 0, 10, 40, &d, &d.k, &d.v, KVQ_ERROR_NOT_FOUND, "sequence", "unknown sequence");
  deq_free(&d);
  destroy(&f);
}

Test(dequantize, ranges_outside_the_sequence) {
  fixture f;
  build(&f);
  /* a has 72 tokens in layer 0 */
  const struct {
    uint64_t first, count;
  } ranges[] = {
      {0, 0},
      {72, 1},
      {71, 2},
      {0, 73},
      {73, 1},
      {UINT64_MAX, 1},
      {1, UINT64_MAX},
      {UINT64_MAX, UINT64_MAX},
      {(uint64_t)1 << 32, 1},            /* would be token 0 if truncated to 32 bits */
      {0, ((uint64_t)1 << 32) + 1},      /* would be 1 token if truncated */
      {((uint64_t)1 << 32) + 10, 40},    /* would be [10, 50) if truncated */
      {10, ((uint64_t)1 << 32) + 40},
  };
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    deq d;
    const uint64_t c = ranges[i].count;
    deq_make(&d, c >= 1 && c <= 100 ? (int64_t)c : 40);
    char what[96];
    snprintf(what, sizeof what, "tokens [%llu, +%llu) of 72", (unsigned long long)ranges[i].first,
             (unsigned long long)ranges[i].count);
    deq_rejects(&f, f.seq[A], 0, ranges[i].first, ranges[i].count, &d, &d.k, &d.v, KVQ_ERROR_OUT_OF_RANGE, "tokens",
                what);
    deq_free(&d);
  }
  deq d;
  deq_make(&d, 1);
  deq_rejects(&f, f.seq[C], 0, 0, 1, &d, &d.k, &d.v, KVQ_ERROR_OUT_OF_RANGE, "tokens", "an empty sequence");
  deq_rejects(&f, f.seq[B], 1, 0, 1, &d, &d.k, &d.v, KVQ_ERROR_OUT_OF_RANGE, "tokens", "an empty layer");
  deq_free(&d);
  destroy(&f);
}

/* Under a policy first and count index the kept tokens: c keeps 36 of its 64 in both layers. */
Test(dequantize, ranges_past_the_kept_tokens) {
  fixture f;
  build_policy(&f, KVQ_POLICY_STREAMING);
  const uint64_t kept = POLICY_C_TOKENS - STREAMING_EVICTED;
  const struct {
    uint64_t first, count;
  } ranges[] = {{0, kept + 1}, {kept, 1}, {kept - 5, 6}, {0, POLICY_C_TOKENS}, {POLICY_C_TOKENS - 1, 1}};
  for (uint32_t layer = 0; layer < 2; layer++)
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
      deq d;
      deq_make(&d, (int64_t)ranges[i].count);
      char what[96];
      snprintf(what, sizeof what, "kept tokens [%llu, +%llu) of %llu in layer %u", (unsigned long long)ranges[i].first,
               (unsigned long long)ranges[i].count, (unsigned long long)kept, layer);
      deq_rejects(&f, f.seq[C], layer, ranges[i].first, ranges[i].count, &d, &d.k, &d.v, KVQ_ERROR_OUT_OF_RANGE,
                  "tokens", what);
      deq_free(&d);
    }
  destroy(&f);
}

static void dequantize_tensor_edits(int side) {
  fixture f;
  build(&f);
  for (size_t i = 0; i < EDIT_COUNT; i++) {
    if (!edit_applies(&edits[i], FIXED_ROWS)) continue;
    { /* alternately with the other output valid, and with it NULL */
      const int only = (int)(i % 2);
      deq d;
      deq_make(&d, 40);
      kvq_tensor *t = side ? &d.v : &d.k;
      edits[i].apply(t);
      char what[128];
      snprintf(what, sizeof what, "kvq_dequantize with %s%s: %s", side ? "values" : "keys", only ? " only" : "",
               edits[i].name);
      const kvq_tensor *k = side && only ? NULL : &d.k, *v = !side && only ? NULL : &d.v;
      deq_rejects(&f, f.seq[A], 0, 10, 40, &d, k, v, edits[i].want, edits[i].mention, what);
      expect_mention(f.ctx, side ? "values" : "keys", what);
      deq_free(&d);
    }
  }
  destroy(&f);
}

Test(dequantize, bad_key_outputs) { dequantize_tensor_edits(0); }
Test(dequantize, bad_value_outputs) { dequantize_tensor_edits(1); }

/* ================================================================================================
 * Memory accounting, saving and loading
 * ============================================================================================== */

Test(cache_memory, null_arguments) {
  fixture f;
  build(&f);
  REJECTS_NULL_GETTER_ARGUMENTS(&f, "kvq_cache_memory", kvq_cache_memory, kvq_memory_report, "report");
  destroy(&f);
}

/* A fresh directory per test, removed with everything the tests put there by .fini (which also
 * runs when an assertion fails). */
static char temp_path[64];

static char *temp_dir(void) {
  snprintf(temp_path, sizeof temp_path, "/tmp/kvq-bad-input-XXXXXX");
  cr_assert_not_null(mkdtemp(temp_path));
  return temp_path;
}

static void remove_temp_dir(void) {
  if (!temp_path[0]) return;
  const char *names[] = {"good.kvq",  "good.kvq.tmp-kvq",  "empty.kvq",    "garbage.kvq", "missing.kvq",
                         "cache.kvq", "cache.kvq.tmp-kvq", "truncated.kvq"};
  char path[128];
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", temp_path, names[i]);
    remove(path);
  }
  snprintf(path, sizeof path, "%s.tmp-kvq", temp_path);
  remove(path);
  rmdir(temp_path);
  temp_path[0] = 0;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static void write_file(const char *path, const void *data, size_t size) {
  FILE *fp = fopen(path, "wb");
  cr_assert_not_null(fp);
  cr_assert_eq(fwrite(data, 1, size, fp), size);
  cr_assert_eq(fclose(fp), 0);
}

/* ---- Saving: kvq_cache_save* and kvq_codebooks_save* -------------------------------------------- */

/* A cache and its codebooks are saved the same three ways, by functions of the same types: a saver
 * names one family, and the checks below run for both. */
typedef struct saver {
  const char *name;
  void (*build)(fixture *f); /* a fixture with something to save */
  const char *missing;       /* a path in a directory that does not exist */
  kvq_status (*size)(kvq_cache *cache, uint64_t *bytes);
  kvq_status (*to_memory)(kvq_cache *cache, void *buffer, size_t capacity, size_t *written);
  kvq_status (*to_file)(kvq_cache *cache, const char *path);
} saver;

static const saver cache_saver = {"kvq_cache_save",         build,
                                  "/nonexistent-kvq-dir/cache.kvq", kvq_cache_save_size,
                                  kvq_cache_save_to_memory, kvq_cache_save};
static const saver codebooks_saver = {"kvq_codebooks_save",         build_learned,
                                      "/nonexistent-kvq-dir/codebooks.kvq", kvq_codebooks_save_size,
                                      kvq_codebooks_save_to_memory, kvq_codebooks_save};

/* What a saver writes for a cache, in memory (free() it), with room for 64 bytes more. */
static uint8_t *saved_image(const saver *s, kvq_context *ctx, kvq_cache *cache, size_t *size) {
  uint64_t bytes;
  KVQ_CHECK(ctx, s->size(cache, &bytes));
  uint8_t *data = malloc((size_t)bytes + 64);
  cr_assert_not_null(data);
  KVQ_CHECK(ctx, s->to_memory(cache, data, (size_t)bytes, size));
  return data;
}

/* A sentinel-filled buffer of the size the saver asks for. */
static out_buf save_buffer(const saver *s, fixture *f, uint64_t *size) {
  KVQ_CHECK(f->ctx, s->size(f->cache, size));
  out_buf b = {malloc((size_t)*size), (size_t)*size};
  cr_assert_not_null(b.data);
  memset(b.data, SENTINEL, b.bytes);
  return b;
}

static void save_size_null_arguments(const saver *s) {
  fixture f;
  s->build(&f);
  REJECTS_NULL_GETTER_ARGUMENTS(&f, s->name, s->size, uint64_t, "bytes");
  destroy(&f);
}

static void save_to_memory_null_arguments(const saver *s) {
  fixture f;
  s->build(&f);
  uint64_t size;
  out_buf b = save_buffer(s, &f, &size);
  size_t written;
  memset(&written, SENTINEL, sizeof written);
  REJECTS_SILENTLY_VIA(&f, s->name, s->to_memory(NULL, b.data, b.bytes, &written), KVQ_ERROR_INVALID_ARGUMENT);
  REJECTS_VIA(&f, s->name, s->to_memory(f.cache, NULL, b.bytes, &written), KVQ_ERROR_INVALID_ARGUMENT, "buffer");
  REJECTS_VIA(&f, s->name, s->to_memory(f.cache, b.data, b.bytes, NULL), KVQ_ERROR_INVALID_ARGUMENT, "written");
  expect_sentinel(&b, via(s->name, "to_memory with a NULL argument"));
  expect_untouched(&written, sizeof written, via(s->name, "to_memory with a NULL argument"));
  free(b.data);
  destroy(&f);
}

/* Any capacity below the size: the message names the size, and neither the buffer nor *written is
 * written. */
static void save_to_memory_too_small(const saver *s) {
  fixture f;
  s->build(&f);
  uint64_t size;
  out_buf b = save_buffer(s, &f, &size);
  char needed[32];
  snprintf(needed, sizeof needed, "%llu", (unsigned long long)size);
  const size_t capacities[] = {0, 1, 64, (size_t)size / 2, (size_t)size - 32, (size_t)size - 1};
  for (size_t i = 0; i < sizeof capacities / sizeof capacities[0]; i++) {
    memset(b.data, SENTINEL, b.bytes);
    size_t written;
    memset(&written, SENTINEL, sizeof written);
    char what[80];
    snprintf(what, sizeof what, "%s_to_memory into %zu of %llu bytes", s->name, capacities[i],
             (unsigned long long)size);
    begin(&f);
    kvq_status st = s->to_memory(f.cache, b.data, capacities[i], &written);
    end(&f, st, KVQ_ERROR_BUFFER_TOO_SMALL, needed, what);
    expect_sentinel(&b, what);
    expect_untouched(&written, sizeof written, what);
  }
  free(b.data);
  destroy(&f);
}

/* Run with .fini = remove_temp_dir. */
static void save_to_bad_paths(const saver *s) {
  fixture f;
  s->build(&f);
  REJECTS_SILENTLY_VIA(&f, s->name, s->to_file(NULL, "/tmp/kvq-never-written.kvq"), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert(!exists("/tmp/kvq-never-written.kvq"));
  REJECTS_VIA(&f, s->name, s->to_file(f.cache, NULL), KVQ_ERROR_INVALID_ARGUMENT, "path");
  REJECTS_VIA(&f, s->name, s->to_file(f.cache, ""), KVQ_ERROR_INVALID_ARGUMENT, "path");
  REJECTS_VIA(&f, s->name, s->to_file(f.cache, s->missing), KVQ_ERROR_IO, s->missing);
  /* a directory cannot be replaced by a file: the directory stays, no temporary file is left */
  char *dir = temp_dir();
  char tmp[128];
  snprintf(tmp, sizeof tmp, "%s.tmp-kvq", dir);
  REJECTS_VIA(&f, s->name, s->to_file(f.cache, dir), KVQ_ERROR_IO, dir);
  struct stat st;
  cr_assert(stat(dir, &st) == 0 && S_ISDIR(st.st_mode), "the directory was replaced");
  cr_assert(!exists(tmp), "a temporary file %s was left behind", tmp);
  destroy(&f);
}

Test(save, save_size_null_arguments) { save_size_null_arguments(&cache_saver); }
Test(save, to_memory_null_arguments) { save_to_memory_null_arguments(&cache_saver); }
Test(save, to_memory_buffer_too_small) { save_to_memory_too_small(&cache_saver); }
Test(save, to_a_file_bad_paths, .fini = remove_temp_dir) { save_to_bad_paths(&cache_saver); }

/* ---- Loading: kvq_cache_load* and kvq_codebooks_load* ------------------------------------------ */

/* Both families read a file or a buffer: kvq_cache_load* into a new cache (*out, NULL on failure),
 * kvq_codebooks_load* into the fixture's cache (and *out is set to NULL: there is no new cache). */
typedef struct loader {
  const char *name;
  kvq_status (*from_file)(fixture *f, const char *path, kvq_cache **out);
  kvq_status (*from_memory)(fixture *f, const void *buffer, size_t size, kvq_cache **out);
  const char *format_mention; /* in messages about truncated or unreadable content; NULL: not checked */
} loader;

static kvq_status cache_from_file(fixture *f, const char *path, kvq_cache **out) {
  return kvq_cache_load(f->ctx, path, out);
}
static kvq_status cache_from_memory(fixture *f, const void *buffer, size_t size, kvq_cache **out) {
  return kvq_cache_load_from_memory(f->ctx, buffer, size, out);
}
static kvq_status codebooks_from_file(fixture *f, const char *path, kvq_cache **out) {
  *out = NULL;
  return kvq_codebooks_load(f->cache, path);
}
static kvq_status codebooks_from_memory(fixture *f, const void *buffer, size_t size, kvq_cache **out) {
  *out = NULL;
  return kvq_codebooks_load_from_memory(f->cache, buffer, size);
}

static const loader cache_loader = {"kvq_cache_load", cache_from_file, cache_from_memory, NULL};
static const loader codebooks_loader = {"kvq_codebooks_load", codebooks_from_file, codebooks_from_memory,
                                        "kvq_codebooks_load"};

/* A load that failed: its status and message, an unchanged fixture cache, and no new cache. */
static void expect_load_failed(fixture *f, kvq_status st, const kvq_cache *out, kvq_status want, const char *mention,
                               const char *what) {
  end(f, st, want, mention, what);
  cr_assert_null(out, "%s: *out must be NULL on failure", what);
}

static void expect_file_rejected(fixture *f, const loader *l, const char *path, kvq_status want, const char *mention,
                                 const char *what) {
  begin(f);
  kvq_cache *out = (kvq_cache *)(uintptr_t)1;
  kvq_status st = l->from_file(f, path, &out);
  expect_load_failed(f, st, out, want, mention, what);
}

static void expect_buffer_rejected(fixture *f, const loader *l, const void *buffer, size_t size, kvq_status want,
                                   const char *mention, const char *what) {
  begin(f);
  kvq_cache *out = (kvq_cache *)(uintptr_t)1;
  kvq_status st = l->from_memory(f, buffer, size, &out);
  expect_load_failed(f, st, out, want, mention, what);
}

/* Files of no kind at all in `dir`: missing, a directory, empty, 1000 bytes of garbage. */
static void reject_bad_files(fixture *f, const loader *l, const char *dir) {
  char missing[128], empty[128], garbage[128];
  snprintf(missing, sizeof missing, "%s/missing.kvq", dir);
  snprintf(empty, sizeof empty, "%s/empty.kvq", dir);
  snprintf(garbage, sizeof garbage, "%s/garbage.kvq", dir);
  expect_file_rejected(f, l, missing, KVQ_ERROR_IO, missing, "a missing file");
  expect_file_rejected(f, l, dir, KVQ_ERROR_IO, dir, "a directory");
  write_file(empty, "", 0);
  expect_file_rejected(f, l, empty, KVQ_ERROR_TRUNCATED, l->format_mention, "an empty file");
  uint8_t junk[1000];
  for (int i = 0; i < 1000; i++) junk[i] = (uint8_t)(i * 37);
  write_file(garbage, junk, sizeof junk);
  expect_file_rejected(f, l, garbage, KVQ_ERROR_BAD_FORMAT, l->format_mention, "a file of garbage");
}

/* The first sizes[i] bytes of a good buffer of `size`. */
static void reject_truncated(fixture *f, const loader *l, const uint8_t *data, size_t size, const size_t *sizes,
                             size_t count) {
  for (size_t i = 0; i < count; i++) {
    char what[64];
    snprintf(what, sizeof what, "%zu of %zu bytes", sizes[i], size);
    expect_buffer_rejected(f, l, data, sizes[i], KVQ_ERROR_TRUNCATED, l->format_mention, what);
  }
}

/* 200 bytes that are no file of any kind. */
static void reject_garbage_buffer(fixture *f, const loader *l, const char *mention) {
  uint8_t junk[200];
  for (int i = 0; i < 200; i++) junk[i] = (uint8_t)(i * 91 + 7);
  expect_buffer_rejected(f, l, junk, sizeof junk, KVQ_ERROR_BAD_FORMAT, mention, "garbage");
}

Test(load, null_arguments_set_out_null, .fini = remove_temp_dir) {
  fixture f;
  build(&f);
  char *dir = temp_dir();
  char path[128];
  snprintf(path, sizeof path, "%s/good.kvq", dir);
  KVQ_CHECK(f.ctx, kvq_cache_save(f.cache, path));
  kvq_cache *out = (kvq_cache *)(uintptr_t)1;
  cr_assert_eq(kvq_cache_load(NULL, path, &out), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_null(out, "kvq_cache_load(NULL context) must set *out to NULL");
  expect_file_rejected(&f, &cache_loader, NULL, KVQ_ERROR_INVALID_ARGUMENT, "path", "kvq_cache_load(ctx, NULL path)");
  prime(f.ctx);
  expect_failure(f.ctx, kvq_cache_load(f.ctx, path, NULL), KVQ_ERROR_INVALID_ARGUMENT, "out", "kvq_cache_load(out NULL)");
  destroy(&f);
}

Test(load, bad_files, .fini = remove_temp_dir) {
  fixture f;
  build(&f);
  expect_file_rejected(&f, &cache_loader, "", KVQ_ERROR_INVALID_ARGUMENT, "path", "an empty path (as kvq_cache_save)");
  reject_bad_files(&f, &cache_loader, temp_dir());
  destroy(&f);
}

Test(load, from_memory_null_arguments_set_out_null) {
  fixture f;
  build(&f);
  size_t written;
  uint8_t *data = saved_image(&cache_saver, f.ctx, f.cache, &written);
  kvq_cache *out = (kvq_cache *)(uintptr_t)1;
  cr_assert_eq(kvq_cache_load_from_memory(NULL, data, written, &out), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_null(out, "kvq_cache_load_from_memory(NULL context) must set *out to NULL");
  expect_buffer_rejected(&f, &cache_loader, NULL, written, KVQ_ERROR_INVALID_ARGUMENT, "buffer",
                         "load_from_memory(NULL buffer)");
  expect_buffer_rejected(&f, &cache_loader, NULL, 0, KVQ_ERROR_INVALID_ARGUMENT, "buffer", "load_from_memory(NULL, 0)");
  prime(f.ctx);
  expect_failure(f.ctx, kvq_cache_load_from_memory(f.ctx, data, written, NULL), KVQ_ERROR_INVALID_ARGUMENT, "out",
                 "load_from_memory(out NULL)");
  free(data);
  destroy(&f);
}

Test(load, from_memory_bad_buffers) {
  fixture f;
  build(&f);
  size_t written;
  uint8_t *data = saved_image(&cache_saver, f.ctx, f.cache, &written);
  const size_t sizes[] = {0, 5, written - 1}; /* nothing, part of the magic, all but the last byte */
  reject_truncated(&f, &cache_loader, data, written, sizes, sizeof sizes / sizeof sizes[0]);
  reject_garbage_buffer(&f, &cache_loader, NULL);
  free(data);
  destroy(&f);
}

/* ================================================================================================
 * Codebooks: appending before them, kvq_codebooks_learn, saving and loading them
 * ============================================================================================== */

Test(append, before_the_codebooks_exist) {
  const kvq_method_config exact = method(KVQ_METHOD_EXACT);
  const struct {
    kvq_method_config keys, values;
    const char *side; /* the first side that lacks codebooks */
  } cases[] = {{cq_method(), polar_online(), "keys"}, {cq_method(), exact, "keys"}, {exact, cq_method(), "values"},
               {polar_online(), exact, "keys"},      {exact, polar_online(), "values"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fixture f;
    build_codebooks_with(&f, cases[i].keys, cases[i].values, 0);
    kv x = kv_random(f.input, 24, 70);
    REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, &x.k, &x.v), KVQ_ERROR_NO_CODEBOOK, cases[i].side);
    expect_mention(f.ctx, "codebooks", "kvq_append before the codebooks exist");
    kv_free(&x);
    x = kv_random(f.input, 1, 71);
    REJECTS(&f, kvq_append(f.cache, f.seq[A], 0, &x.k, &x.v), KVQ_ERROR_NO_CODEBOOK, cases[i].side);
    kv_free(&x);
    destroy(&f);
  }
}

/* ---- kvq_codebooks_learn ----------------------------------------------------------------------- */

Test(codebooks_learn, null_cache) {
  fixture f;
  build_codebooks(&f, 0);
  kv x = calibration(KVQ_DTYPE_F32, 80);
  REJECTS_SILENTLY(&f, kvq_codebooks_learn(NULL, 0, &x.k, &x.v, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  kv_free(&x);
  destroy(&f);
}

Test(codebooks_learn, layer_out_of_range) {
  fixture f;
  kv x = kv_open(&learner, &f, 81);
  const uint32_t layers[] = {2, 1000, UINT32_MAX};
  for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++)
    REJECTS(&f, kvq_codebooks_learn(f.cache, layers[i], &x.k, &x.v, NULL), KVQ_ERROR_OUT_OF_RANGE, "layer");
  kv_close(&f, &x);
}

/* Exact, QJL, uniform and KIVI learn nothing, nor does PolarQuant with offline codebooks. */
Test(codebooks_learn, layer_that_learns_nothing) {
  fixture f;
  kv x = kv_open(&learner, &f, 82);
  REJECTS(&f, kvq_codebooks_learn(f.cache, 1, &x.k, &x.v, NULL), KVQ_ERROR_INVALID_ARGUMENT, "codebooks");
  destroy(&f);
  build(&f);
  for (uint32_t l = 0; l < 2; l++)
    REJECTS(&f, kvq_codebooks_learn(f.cache, l, &x.k, &x.v, NULL), KVQ_ERROR_INVALID_ARGUMENT, "codebooks");
  destroy(&f);
  build_codebooks_with(&f, method(KVQ_METHOD_POLAR), method(KVQ_METHOD_KIVI), 0);
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, &x.k, &x.v, NULL), KVQ_ERROR_INVALID_ARGUMENT, "codebooks");
  destroy(&f);
  kv_free(&x);
}

Test(codebooks_learn, missing_calibration_data) {
  fixture f;
  kv x = kv_open(&learner, &f, 83);
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, NULL, &x.v, NULL), KVQ_ERROR_INVALID_ARGUMENT, "keys");
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, &x.k, NULL, NULL), KVQ_ERROR_INVALID_ARGUMENT, "values");
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, NULL, NULL, NULL), KVQ_ERROR_INVALID_ARGUMENT, "keys");
  destroy(&f);
  /* CQ values and exact keys: the values are still needed */
  build_codebooks_with(&f, method(KVQ_METHOD_EXACT), cq_method(), 0);
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, &x.k, NULL, NULL), KVQ_ERROR_INVALID_ARGUMENT, "values");
  destroy(&f);
  kv_free(&x);
}

Test(codebooks_learn, bad_key_tensors) { kv_tensor_edits(&learner, 0, 84); }
Test(codebooks_learn, bad_value_tensors) { kv_tensor_edits(&learner, 1, 84); }

Test(codebooks_learn, key_and_value_token_counts_differ) { kv_token_counts_differ(&learner, 85, "token counts"); }

/* 2^24 + 1 tokens over a small buffer (rows one element apart): refused before a byte is read. */
Test(codebooks_learn, more_than_2_24_calibration_tokens) {
  fixture f;
  kv x = kv_open(&learner, &f, 86);
  for (int side = 0; side < 2; side++) {
    kvq_tensor *t = side ? &x.v : &x.k;
    t->shape[0] = ((int64_t)1 << 24) + 1;
    t->strides[0] = 1;
  }
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, &x.k, &x.v, NULL), KVQ_ERROR_OUT_OF_RANGE, "2^24");
  kv_close(&f, &x);
}

/* One bad number in otherwise good calibration data: first or last element, keys or values, NaN or an
 * infinity, in every input dtype. */
Test(codebooks_learn, nonfinite_calibration_data) {
  fixture f;
  build_codebooks(&f, 1);
  const kvq_dtype dtypes[] = {KVQ_DTYPE_F32, KVQ_DTYPE_F16, KVQ_DTYPE_BF16};
  for (int d = 0; d < 3; d++)
    for (int side = 0; side < 2; side++)
      for (int b = 0; b < 3; b++)
        for (int last = 0; last < 2; last++) {
          kv x = kv_with_one_bad(dtypes[d], CALIBRATION, 87, 88, side, last, nonfinite[b]);
          char what[128];
          snprintf(what, sizeof what, "%g in the %s element of the calibration %s, dtype %d", (double)nonfinite[b],
                   last ? "last" : "first", side ? "values" : "keys", (int)dtypes[d]);
          begin(&f);
          kvq_status st = kvq_codebooks_learn(f.cache, 0, &x.k, &x.v, NULL);
          end(&f, st, KVQ_ERROR_NON_FINITE, side ? "values" : "keys", what);
          kv_free(&x);
        }
  destroy(&f);
}

/* Weights are finite and non-negative (NaN and infinities: non-finite; negative: out of range), and
 * not all zero. */
Test(codebooks_learn, bad_weights) {
  fixture f;
  kv x = kv_open(&learner, &f, 89);
  float w[CALIBRATION];
  const struct {
    float value;
    kvq_status want;
  } cases[] = {{-1.0f, KVQ_ERROR_OUT_OF_RANGE}, {-FLT_MIN, KVQ_ERROR_OUT_OF_RANGE}, {-FLT_MAX, KVQ_ERROR_OUT_OF_RANGE},
               {NAN, KVQ_ERROR_NON_FINITE},     {INFINITY, KVQ_ERROR_NON_FINITE},  {-INFINITY, KVQ_ERROR_NON_FINITE}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int last = 0; last < 2; last++) {
      for (int t = 0; t < CALIBRATION; t++) w[t] = 1.0f;
      w[last ? CALIBRATION - 1 : 0] = cases[i].value;
      char what[96];
      snprintf(what, sizeof what, "weight %g at token %d", (double)cases[i].value, last ? CALIBRATION - 1 : 0);
      begin(&f);
      kvq_status st = kvq_codebooks_learn(f.cache, 0, &x.k, &x.v, w);
      end(&f, st, cases[i].want, "weight", what);
    }
  for (int t = 0; t < CALIBRATION; t++) w[t] = 0.0f;
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, &x.k, &x.v, w), KVQ_ERROR_OUT_OF_RANGE, "weights");
  w[7] = -0.0f;
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, &x.k, &x.v, w), KVQ_ERROR_OUT_OF_RANGE, "weights");
  kv_close(&f, &x);
}

/* Codes already stored would change meaning: refused while any sequence holds tokens in the layer. */
Test(codebooks_learn, while_the_layer_holds_tokens) {
  fixture f;
  build_codebooks(&f, 1);
  append_ok(&f, f.seq[A], 0, 20, 90);
  kv x = calibration(KVQ_DTYPE_F32, 91);
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, &x.k, &x.v, NULL), KVQ_ERROR_INVALID_ARGUMENT, "holds tokens");
  /* an empty second sequence changes nothing; a flushed first one neither */
  invalidate(&f);
  KVQ_CHECK(f.ctx, kvq_sequence_add(f.cache, &f.seq[B]));
  f.live[B] = 1;
  KVQ_CHECK(f.ctx, kvq_flush(f.cache, f.seq[A]));
  REJECTS(&f, kvq_codebooks_learn(f.cache, 0, &x.k, &x.v, NULL), KVQ_ERROR_INVALID_ARGUMENT, "holds tokens");
  kv_free(&x);
  destroy(&f);
}

/* ---- kvq_codebooks_save_size, kvq_codebooks_save_to_memory, kvq_codebooks_save ----------------- */

Test(codebooks_save, size_null_arguments) { save_size_null_arguments(&codebooks_saver); }
Test(codebooks_save, to_memory_null_arguments) { save_to_memory_null_arguments(&codebooks_saver); }
Test(codebooks_save, to_memory_buffer_too_small) { save_to_memory_too_small(&codebooks_saver); }
Test(codebooks_save, to_a_file_bad_paths, .fini = remove_temp_dir) { save_to_bad_paths(&codebooks_saver); }

/* ---- kvq_codebooks_load, kvq_codebooks_load_from_memory ---------------------------------------- */

/* The codebook file of a cache, in memory (free() it), with room to append bytes. */
static uint8_t *codebooks_image(kvq_context *ctx, kvq_cache *cache, size_t *size) {
  return saved_image(&codebooks_saver, ctx, cache, size);
}

/* The codebook file of a new cache with this config, learned from calibration data drawn with
 * `seed` (0: not learned). */
static uint8_t *codebooks_of(kvq_context *ctx, const kvq_cache_config *config, uint32_t seed, size_t *size) {
  kvq_cache *cache = NULL;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, config, &cache));
  if (seed) {
    kv x = calibration(KVQ_DTYPE_F32, seed);
    KVQ_CHECK(ctx, kvq_codebooks_learn(cache, 0, &x.k, &x.v, NULL));
    kv_free(&x);
  }
  uint8_t *data = codebooks_image(ctx, cache, size);
  kvq_cache_destroy(cache);
  return data;
}

static void expect_codebooks_rejected(fixture *f, const void *data, size_t size, kvq_status want, const char *mention,
                                      const char *what) {
  expect_buffer_rejected(f, &codebooks_loader, data, size, want, mention, what);
}

Test(codebooks_load, null_arguments) {
  fixture f;
  build_codebooks(&f, 1);
  size_t size;
  uint8_t *data = codebooks_image(f.ctx, f.cache, &size);
  REJECTS_SILENTLY(&f, kvq_codebooks_load(NULL, "/tmp/kvq-never-written.kvq"), KVQ_ERROR_INVALID_ARGUMENT);
  REJECTS(&f, kvq_codebooks_load(f.cache, NULL), KVQ_ERROR_INVALID_ARGUMENT, "path");
  REJECTS(&f, kvq_codebooks_load(f.cache, ""), KVQ_ERROR_INVALID_ARGUMENT, "path");
  REJECTS_SILENTLY(&f, kvq_codebooks_load_from_memory(NULL, data, size), KVQ_ERROR_INVALID_ARGUMENT);
  REJECTS(&f, kvq_codebooks_load_from_memory(f.cache, NULL, size), KVQ_ERROR_INVALID_ARGUMENT, "buffer");
  REJECTS(&f, kvq_codebooks_load_from_memory(f.cache, NULL, 0), KVQ_ERROR_INVALID_ARGUMENT, "buffer");
  free(data);
  destroy(&f);
}

Test(codebooks_load, bad_files, .fini = remove_temp_dir) {
  fixture f;
  build_codebooks(&f, 1);
  char *dir = temp_dir();
  reject_bad_files(&f, &codebooks_loader, dir);
  char truncated[128], cache[128];
  snprintf(truncated, sizeof truncated, "%s/truncated.kvq", dir);
  snprintf(cache, sizeof cache, "%s/cache.kvq", dir);
  size_t size;
  uint8_t *data = codebooks_image(f.ctx, f.cache, &size);
  write_file(truncated, data, size - 1);
  REJECTS(&f, kvq_codebooks_load(f.cache, truncated), KVQ_ERROR_TRUNCATED, "kvq_codebooks_load");
  KVQ_CHECK(f.ctx, kvq_cache_save(f.cache, cache)); /* a cache file is not a codebook file */
  REJECTS(&f, kvq_codebooks_load(f.cache, cache), KVQ_ERROR_BAD_FORMAT, "codebook file");
  free(data);
  destroy(&f);
}

Test(codebooks_load, truncated_buffers) {
  fixture f;
  build_codebooks(&f, 1);
  size_t size;
  uint8_t *data = codebooks_image(f.ctx, f.cache, &size);
  const size_t sizes[] = {0, 5, 8, 63, 64, 100, size / 2, size - 32, size - 1};
  reject_truncated(&f, &codebooks_loader, data, size, sizes, sizeof sizes / sizeof sizes[0]);
  free(data);
  destroy(&f);
}

Test(codebooks_load, corrupted_buffers) {
  fixture f;
  build_codebooks(&f, 1);
  size_t size;
  uint8_t *data = codebooks_image(f.ctx, f.cache, &size);
  const size_t flips[] = {24, 100, size / 2, size - 40, size - 1}; /* header, config, codebooks, checksum */
  for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
    data[flips[i]] ^= 0x10;
    char what[64];
    snprintf(what, sizeof what, "byte %zu of %zu flipped", flips[i], size);
    expect_codebooks_rejected(&f, data, size, KVQ_ERROR_CHECKSUM, "SHA-256", what);
    data[flips[i]] ^= 0x10;
  }
  data[8] += 1; /* the format version */
  expect_codebooks_rejected(&f, data, size, KVQ_ERROR_VERSION, "version", "another format version");
  data[8] -= 1;
  data[size] = 0;
  expect_codebooks_rejected(&f, data, size + 1, KVQ_ERROR_BAD_FORMAT, "trailing", "a byte after the checksum");
  memcpy(data, "KVQCACHE", 8);
  expect_codebooks_rejected(&f, data, size, KVQ_ERROR_BAD_FORMAT, "codebook file", "a cache file's magic");
  reject_garbage_buffer(&f, &codebooks_loader, "codebook file");
  free(data);
  destroy(&f);
}

/* ---- Files with a correct checksum but content kvq could not have written ---------------------- */

static uint32_t get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}

/* Where the payload of section `index` (0: CONF, 1: CODE) of a codebook file starts. */
static size_t section_payload(const uint8_t *data, int index) {
  size_t at = 64; /* the header */
  for (int i = 0; i < index; i++) {
    const uint64_t n = get_le32(data + at + 8) | (uint64_t)get_le32(data + at + 12) << 32;
    at += 16 + n + (8 - n % 8) % 8;
  }
  return at + 16;
}

/* Word `word` of a method record of layer 0 (side 0: keys, 1: values) in the CONF section. */
static uint8_t *method_word(uint8_t *data, int side, uint32_t word) {
  return data + section_payload(data, 0) + 32 + 12 + (size_t)side * 23 * 4 + (size_t)word * 4;
}

static void reseal(uint8_t *data, size_t size) { kvq_sha256_digest(data, size - 32, data + size - 32); }

Test(codebooks_load, consistent_checksum_bad_content) {
  fixture f;
  build_codebooks(&f, 1);
  size_t size;
  uint8_t *good = codebooks_image(f.ctx, f.cache, &size), *data = malloc(size);
  cr_assert_eq(get_le32(method_word(good, 0, 0)), KVQ_METHOD_CQ, "the config record's layout");
  cr_assert_eq(get_le32(method_word(good, 1, 0)), KVQ_METHOD_POLAR, "the config record's layout");
  const struct {
    int side;
    uint32_t word, value;
    const char *what;
  } configs[] = {
      {0, 20, 0, "cq.channels 0"},           {0, 20, 3, "cq.channels 3"},         {0, 21, 0, "cq.bits 0"},
      {0, 21, 64, "cq.bits 64"},             {0, 0, 77, "an unknown key method"}, {1, 9, 0, "polar.levels 0"},
      {1, 9, 1000, "polar.levels 1000"},     {1, 10, 0, "polar.bits[0] = 0"},     {1, 18, 5, "an unknown rotation"},
      {1, 19, 9, "an unknown codebook source"}};
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
    memcpy(data, good, size);
    put_le32(method_word(data, configs[i].side, configs[i].word), configs[i].value);
    reseal(data, size);
    expect_codebooks_rejected(&f, data, size, KVQ_ERROR_BAD_FORMAT, "config", configs[i].what);
  }
  /* the first codebook array (layer 0's keys): u32 count, then layer, side, index, kind, ready, 0,
   * u64 floats, SHA-256 of the floats, the floats */
  const size_t code = section_payload(good, 1), sha = code + 4 + 24 + 8, floats = sha + 32;
  const uint32_t count = get_le32(good + code + 28);
  cr_assert_eq(get_le32(good + code), 2, "two codebook arrays");
  cr_assert_eq(count, (uint32_t)HKV * D << 4, "CQ keys: kv_heads * head_dim * 2^bits floats");
  const float nan = NAN, big = 1e30f;
  for (int resign = 0; resign < 2; resign++) {
    memcpy(data, good, size);
    memcpy(data + floats + 4 * 5, resign ? &nan : &big, 4);
    if (resign) kvq_sha256_digest(data + floats, (size_t)count * 4, data + sha);
    reseal(data, size);
    expect_codebooks_rejected(&f, data, size, KVQ_ERROR_BAD_FORMAT, resign ? "non-finite" : "SHA-256",
                              resign ? "a NaN centroid" : "a centroid that does not match its SHA-256");
  }
  memcpy(data, good, size);
  data[40] = 1; /* reserved header bytes */
  reseal(data, size);
  expect_codebooks_rejected(&f, data, size, KVQ_ERROR_BAD_FORMAT, "reserved", "reserved header bytes");
  memcpy(data, good, size);
  put_le32(data + code + 4 + 16, 2); /* the readiness flag of the first array */
  reseal(data, size);
  expect_codebooks_rejected(&f, data, size, KVQ_ERROR_BAD_FORMAT, "codebook", "readiness 2");
  free(data);
  free(good);
  destroy(&f);
}

/* Codebooks of another shape, rotation or layer count: INVALID_ARGUMENT, as documented. */
Test(codebooks_load, from_a_cache_of_another_shape) {
  fixture f;
  build_codebooks(&f, 1);
  kvq_layer_config layers[2];
  kvq_method_config cq5 = cq_method(), hadamard = polar_online(), polar3 = polar_online();
  cq5.cq.bits = 5;
  hadamard.polar.rotation = KVQ_ROTATION_HADAMARD;
  polar3.polar.levels = 3;
  const struct {
    kvq_cache_config config;
    const char *what;
  } others[] = {
      {codebook_config(layers, cq5, polar_online(), 11), "CQ keys of 5 bits"},
      {codebook_config(layers, cq_method(), hadamard, 11), "a Hadamard rotation"},
      {codebook_config(layers, cq_method(), polar3, 11), "3 levels"},
      {codebook_config(layers, cq_method(), polar_online(), 12), "another seed (another rotation)"},
      {codebook_config(layers, method(KVQ_METHOD_EXACT), polar_online(), 11), "no key codebooks"},
      {codebook_config(layers, cq_method(), method(KVQ_METHOD_POLAR), 11), "offline value codebooks"},
  };
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    size_t size;
    uint8_t *data = codebooks_of(f.ctx, &others[i].config, 92, &size);
    expect_codebooks_rejected(&f, data, size, KVQ_ERROR_INVALID_ARGUMENT, "codebooks", others[i].what);
    free(data);
  }
  /* one layer instead of two */
  kvq_cache_config one = codebook_config(layers, cq_method(), polar_online(), 11);
  one.layer_count = 1;
  size_t size;
  uint8_t *data = codebooks_of(f.ctx, &one, 93, &size);
  expect_codebooks_rejected(&f, data, size, KVQ_ERROR_INVALID_ARGUMENT, "layers", "a one-layer cache's codebooks");
  free(data);
  /* the default fixture learns none: neither side accepts the other's file */
  data = codebooks_image(f.ctx, f.cache, &size);
  fixture g;
  build(&g);
  expect_codebooks_rejected(&g, data, size, KVQ_ERROR_INVALID_ARGUMENT, "codebooks", "codebooks into a cache without");
  free(data);
  data = codebooks_image(g.ctx, g.cache, &size);
  expect_codebooks_rejected(&f, data, size, KVQ_ERROR_INVALID_ARGUMENT, "codebooks", "no codebooks into a cache with");
  free(data);
  destroy(&g);
  destroy(&f);
}

/* Tokens already coded keep their codebooks: only the identical ones may be loaded. */
Test(codebooks_load, into_a_layer_holding_tokens) {
  fixture f;
  build_codebooks(&f, 1);
  append_ok(&f, f.seq[A], 0, 20, 94);
  kvq_layer_config layers[2];
  const kvq_cache_config same = codebook_config(layers, cq_method(), polar_online(), 11);
  const uint32_t seeds[] = {95, 0}; /* other calibration data; not learned at all */
  for (size_t i = 0; i < 2; i++) {
    size_t size;
    uint8_t *data = codebooks_of(f.ctx, &same, seeds[i], &size);
    expect_codebooks_rejected(&f, data, size, KVQ_ERROR_INVALID_ARGUMENT, "holds tokens",
                              seeds[i] ? "other codebooks" : "codebooks not learned");
    free(data);
  }
  destroy(&f);
}

/* Codebooks learned from all-zero data are all zeros, the very floats of codebooks not learned at
 * all: the two files differ only in their learned flag. Loading the unlearned ones into a layer that
 * holds tokens would un-learn it (every later append refused with NO_CODEBOOK, and a save that
 * kvq_cache_load refuses), so it is refused and the layer keeps working. */
Test(codebooks_load, unlearned_codebooks_into_a_busy_layer_of_zero_codebooks) {
  fixture f;
  build_codebooks_with(&f, cq_method(), method(KVQ_METHOD_EXACT), 0);
  kv zeros = kv_from(calloc((size_t)CALIBRATION * HKV * D, sizeof(float)), calloc((size_t)CALIBRATION * HKV * D, sizeof(float)),
                     KVQ_DTYPE_F32, CALIBRATION);
  KVQ_CHECK(f.ctx, kvq_codebooks_learn(f.cache, 0, &zeros.k, NULL, NULL));
  kv_free(&zeros);
  append_ok(&f, f.seq[A], 0, 20, 96);
  kvq_layer_config layers[2];
  const kvq_cache_config same = codebook_config(layers, cq_method(), method(KVQ_METHOD_EXACT), 11);
  size_t size, learned_size;
  uint8_t *learned = codebooks_image(f.ctx, f.cache, &learned_size), *unlearned = codebooks_of(f.ctx, &same, 0, &size);
  /* CODE: u32 count, then the array's layer, side, index, kind, ready, 0, u64 floats, SHA-256, floats */
  const size_t ready = section_payload(learned, 1) + 4 + 16;
  cr_assert(size == learned_size && get_le32(learned + ready) == 1 && get_le32(unlearned + ready) == 0, "learned flags");
  for (size_t i = 0; i < size - 32; i++) /* everything else but the checksum is the same */
    cr_assert((i >= ready && i < ready + 4) || learned[i] == unlearned[i], "byte %zu differs: the codebooks are not all zero", i);
  expect_codebooks_rejected(&f, unlearned, size, KVQ_ERROR_INVALID_ARGUMENT, "not learned", "unlearned codebooks");
  append_ok(&f, f.seq[A], 0, 4, 97); /* the layer still codes tokens */
  free(learned);
  free(unlearned);
  destroy(&f);
}
