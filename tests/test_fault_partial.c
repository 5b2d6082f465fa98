/*
 * Fault injection on Vulkan calls that outgrow their recording's resources (docs/RELIABILITY.md,
 * "Fault injection", "Calls that outgrow staging and descriptor pools"; docs/VULKAN.md).
 *
 * The Vulkan backend records a call and submits once at its end; a failed call drops its recording, so
 * it changes nothing. Before, a recording that ran out of staging space (KVQ_VK_STAGING_BYTES) or of
 * descriptor sets (KVQ_VK_SETS_PER_BATCH) submitted part way, and a failure after that left the cache
 * and the outputs partly written. Now such a call takes overflow staging buffers and further
 * descriptor pools instead. The scenarios of tests/test_fault.c are far too small to outgrow 8 MiB
 * and 256 sets, so this test shrinks both with the backend's test-only environment variables
 * (KVQ_VULKAN_STAGING_BYTES=512, KVQ_VULKAN_DESCRIPTOR_SETS=1: every dispatch with other buffers takes
 * the next pool), checks that every per-step scenario's call does outgrow them (the backend's counters),
 * and then fails every failure point of the call, one at a time, as tests/test_fault.c does: the call
 * returns an error with a message, the cache saves to the same bytes as before, every output (host
 * arrays, and the runtime's VkBuffers) holds the bytes it held, and the same call then succeeds;
 * submissions and waits are failed once more as a lost device (KVQ_ERROR_DEVICE_LOST, then the
 * context destroyed with no host block left). Create, load and save may still submit part way
 * (kvq_call_begin_parts: a new cache, or only reads): their rows fail every point the same way
 * (save's cache unchanged included), but not as a lost device (time: a new context each).
 *
 * Rows: `vulkan` (kvq's own device, host tensors) and `vulkan-runtime` (a device made as a runtime
 * would, its host-visible VkBuffers as tensors, read and written in place; `dequantize-staged` and
 * `attention-mixed` have fp16 outputs that do not end on a word, which kvq writes through host memory:
 * attention-mixed has one output in place and one staged).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "fault_fixture.h"
#include "kvq/kvq.h"
#ifdef KVQ_HAVE_VULKAN
#include <volk.h>
#endif

/* The runtime's buffers (host-visible, mapped): inputs, and outputs the failed calls must leave as
 * they were. OUT16: a second, fp16 output of attention-mixed at byte 2 (staged). */
enum { RB_KEYS, RB_VALUES, RB_QUERIES, RB_OUT, RB_OUT16, RB_SCORES, RB_DEQ_KEYS, RB_DEQ_VALUES, RB_COUNT };
enum { RB_OUTPUTS_FROM = RB_OUT, DEQ_TOKENS = PAGE * 2 };
static struct {
  int active;
  kvq_vulkan_device handed;
  runtime_buffer buf[RB_COUNT];
} rt;

typedef struct fixture {
  kvq_context *ctx;
  kvq_cache *cache;
  uint32_t sequence;
  /* host outputs, compared like the runtime's buffers */
  float out[2][Q_FLOATS];
  float scores[NQ * HQ * TOKENS];
  float dequantized[2][DEQ_TOKENS * HKV * D];
  unsigned char *file; /* load: the saved base cache; codebooks-load: codebooks learned from other keys */
  size_t file_size;
  int fired_before_destroy;
} fixture;

static kvq_tensor t3(float *host, int which, kvq_dtype dtype, uint64_t offset, int64_t d0, int64_t d1, int64_t d2) {
  const int64_t shape[3] = {d0, d1, d2};
  if (!rt.active) return kvq_tensor_host(host, KVQ_DTYPE_F32, 3, shape);
  return kvq_tensor_vulkan(rt.buf[which].buffer, offset, dtype, 3, shape);
}

static kvq_status attend_one(fixture *f) {
  kvq_attention_request r = {.sequence = f->sequence, .mask = KVQ_MASK_CAUSAL,
                             .queries = t3(queries_in, RB_QUERIES, KVQ_DTYPE_F32, 0, NQ, HQ, D),
                             .output = t3(f->out[0], RB_OUT, KVQ_DTYPE_F32, 0, NQ, HQ, D)};
  return kvq_attention(f->cache, 0, &r, 1);
}

/* BASE: TOKENS tokens appended and attended once (H2O's statistics); LEARNED: codebooks learned. */
static kvq_status make_cache(kvq_context *ctx, which_cache which, fixture *f) {
  kvq_layer_config layer;
  kvq_cache_config config = cache_config(which, &layer);
  kvq_status st = kvq_cache_create(ctx, &config, &f->cache);
  if (st == KVQ_OK) st = kvq_sequence_add(f->cache, &f->sequence);
  const int64_t shape[3] = {TOKENS, HKV, D};
  kvq_tensor k = kvq_tensor_host(keys_in, KVQ_DTYPE_F32, 3, shape), v = kvq_tensor_host(values_in, KVQ_DTYPE_F32, 3, shape);
  if (st == KVQ_OK && which == BASE) st = kvq_append(f->cache, f->sequence, 0, &k, &v);
  if (st == KVQ_OK && which == BASE) st = attend_one(f);
  if (st == KVQ_OK && which == LEARNED) st = fault_learn(f->cache);
  return st;
}

static kvq_status call_create(fixture *f) {
  kvq_layer_config layer;
  kvq_cache_config config = cache_config(BASE, &layer);
  kvq_cache *cache = NULL;
  const kvq_status st = kvq_cache_create(f->ctx, &config, &cache);
  f->fired_before_destroy = kvq_fault_fired();
  kvq_cache_destroy(cache);
  return st;
}
static kvq_status call_append(fixture *f) {
  const uint64_t at = (uint64_t)TOKENS * HKV * D;
  kvq_tensor k = t3(keys_in + at, RB_KEYS, KVQ_DTYPE_F32, at * 4, MORE, HKV, D),
             v = t3(values_in + at, RB_VALUES, KVQ_DTYPE_F32, at * 4, MORE, HKV, D);
  return kvq_append(f->cache, f->sequence, 0, &k, &v);
}
static kvq_status call_flush(fixture *f) { return kvq_flush(f->cache, f->sequence); }
static kvq_status call_attention(fixture *f) { return attend_one(f); }
static kvq_status call_attention_unfused(fixture *f) {
  f->ctx->bench_jobs = KVQ_BENCH_JOBS_UNFUSED;
  const kvq_status st = attend_one(f);
  f->ctx->bench_jobs = 0;
  return st;
}
/* Two requests on the sequence: one output in place (f32), one staged (fp16 ending off a word). */
static kvq_status call_attention_mixed(fixture *f) {
  kvq_attention_request r[2] = {
      {.sequence = f->sequence, .mask = KVQ_MASK_CAUSAL,
       .queries = t3(queries_in, RB_QUERIES, KVQ_DTYPE_F32, 0, NQ, HQ, D),
       .output = t3(f->out[0], RB_OUT, KVQ_DTYPE_F32, 0, NQ, HQ, D)},
      {.sequence = f->sequence, .mask = KVQ_MASK_CAUSAL,
       .queries = t3(queries_in, RB_QUERIES, KVQ_DTYPE_F32, 0, NQ, HQ, D),
       .output = t3(f->out[1], RB_OUT16, KVQ_DTYPE_F16, 2, NQ, HQ, D)}};
  return kvq_attention(f->cache, 0, r, 2);
}
static kvq_status call_scores(fixture *f) {
  kvq_tensor q = t3(queries_in, RB_QUERIES, KVQ_DTYPE_F32, 0, NQ, HQ, D),
             s = t3(f->scores, RB_SCORES, KVQ_DTYPE_F32, 0, NQ, HQ, TOKENS);
  return kvq_scores(f->cache, f->sequence, 0, &q, KVQ_MASK_NONE, KVQ_SCORES_PROBABILITIES, &s);
}
static kvq_status call_dequantize(fixture *f) {
  kvq_tensor k = t3(f->dequantized[0], RB_DEQ_KEYS, KVQ_DTYPE_F32, 0, DEQ_TOKENS, HKV, D),
             v = t3(f->dequantized[1], RB_DEQ_VALUES, KVQ_DTYPE_F32, 0, DEQ_TOKENS, HKV, D);
  return kvq_dequantize(f->cache, f->sequence, 0, 0, DEQ_TOKENS, &k, &v);
}
static kvq_status call_dequantize_staged(fixture *f) {
  kvq_tensor k = t3(NULL, RB_DEQ_KEYS, KVQ_DTYPE_F16, 2, DEQ_TOKENS, HKV, D),
             v = t3(NULL, RB_DEQ_VALUES, KVQ_DTYPE_F16, 2, DEQ_TOKENS, HKV, D);
  return kvq_dequantize(f->cache, f->sequence, 0, 0, DEQ_TOKENS, &k, &v);
}
static kvq_status call_save(fixture *f) { return fault_save(f->cache); }
static kvq_status call_load(fixture *f) { return fault_load(f->ctx, f->file, f->file_size, &f->fired_before_destroy); }
static kvq_status call_learn(fixture *f) { return fault_learn(f->cache); }
static kvq_status call_codebooks_load(fixture *f) { return kvq_codebooks_load_from_memory(f->cache, f->file, f->file_size); }

/* What a scenario's setup makes besides its cache. */
typedef enum extra { NONE, SAVED_CACHE, OTHER_CODEBOOKS } extra;

typedef struct scenario {
  const char *name;
  int has_cache;
  which_cache which;
  extra needs;
  int whole; /* a per-step call: it must outgrow staging or descriptor pools here (checked) */
  int rows;  /* 1: the vulkan row, 2: the runtime row, 3: both */
  kvq_status (*call)(fixture *);
} scenario;

static const scenario scenarios[] = {
    {"create", 0, BASE, NONE, 0, 1, call_create},
    {"append", 1, BASE, NONE, 1, 3, call_append},
    {"flush", 1, BASE, NONE, 1, 1, call_flush},
    {"attention", 1, BASE, NONE, 1, 3, call_attention},
    {"attention-unfused", 1, BASE, NONE, 1, 3, call_attention_unfused},
    {"attention-mixed", 1, BASE, NONE, 1, 2, call_attention_mixed},
    {"scores", 1, BASE, NONE, 1, 3, call_scores},
    {"dequantize", 1, BASE, NONE, 1, 3, call_dequantize},
    {"dequantize-staged", 1, BASE, NONE, 1, 2, call_dequantize_staged},
    {"save", 1, BASE, NONE, 0, 1, call_save},
    {"load", 0, BASE, SAVED_CACHE, 0, 1, call_load},
    {"learn-codebooks", 1, LEARNED, NONE, 1, 1, call_learn},
    {"codebooks-load", 1, LEARNED, OTHER_CODEBOOKS, 1, 1, call_codebooks_load},
};
enum { SCENARIOS = sizeof scenarios / sizeof scenarios[0] };

static kvq_status setup(const scenario *s, fixture *f) {
  kvq_context *ctx = f->ctx;
  memset(f, 0, sizeof *f);
  f->ctx = ctx;
  kvq_fault_arm(0, 0);
  kvq_status st = KVQ_OK;
  if (s->needs == SAVED_CACHE) {
    fixture base = {.ctx = ctx};
    st = make_cache(ctx, BASE, &base);
    if (st == KVQ_OK) st = saved_bytes(base.cache, &f->file, &f->file_size);
    kvq_cache_destroy(base.cache);
  }
  if (st == KVQ_OK && s->has_cache) st = make_cache(ctx, s->which, f);
  if (st == KVQ_OK && s->needs == OTHER_CODEBOOKS) {
    /* codebooks learned from other keys (the last TOKENS of the inputs), which the call loads into
     * the cache: a failed load must leave the cache's own */
    fixture other = {.ctx = ctx};
    kvq_layer_config layer;
    kvq_cache_config config = cache_config(LEARNED, &layer);
    const int64_t shape[3] = {TOKENS, HKV, D};
    kvq_tensor k = kvq_tensor_host(keys_in + (uint64_t)MORE * HKV * D, KVQ_DTYPE_F32, 3, shape);
    uint64_t size = 0;
    st = kvq_cache_create(ctx, &config, &other.cache);
    if (st == KVQ_OK) st = kvq_codebooks_learn(other.cache, 0, &k, NULL, NULL);
    if (st == KVQ_OK) st = kvq_codebooks_save_size(other.cache, &size);
    if (st == KVQ_OK && !(f->file = malloc((size_t)size))) st = KVQ_ERROR_OUT_OF_MEMORY;
    if (st == KVQ_OK) st = kvq_codebooks_save_to_memory(other.cache, f->file, (size_t)size, &f->file_size);
    kvq_cache_destroy(other.cache);
  }
  return st;
}

static void teardown(fixture *f) { release(&f->cache, &f->file); }

static kvq_status context_on(kvq_context **ctx) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_VULKAN;
  if (rt.active) opt.vulkan = &rt.handed;
  kvq_fault_arm(0, 0);
  return kvq_context_create(&opt, ctx);
}

/* Every output the calls write, host and runtime: filled with 0xa5 bytes before a failed call (the
 * setup leaves there what the call itself writes), kept to compare. */
typedef struct outputs {
  unsigned char *copy[RB_COUNT + 1];
} outputs;
static void outputs_fill(fixture *f, outputs *o) {
  memset(o, 0, sizeof *o);
  unsigned char *host = (unsigned char *)f->out;
  const size_t host_bytes = sizeof f->out + sizeof f->scores + sizeof f->dequantized;
  memset(host, 0xa5, host_bytes);
  if ((o->copy[RB_COUNT] = malloc(host_bytes))) memcpy(o->copy[RB_COUNT], host, host_bytes);
  for (int b = RB_OUTPUTS_FROM; b < RB_COUNT && rt.active; b++) {
    memset(rt.buf[b].mapped, 0xa5, rt.buf[b].bytes);
    if ((o->copy[b] = malloc(rt.buf[b].bytes))) memcpy(o->copy[b], rt.buf[b].mapped, rt.buf[b].bytes);
  }
}
/* The first output the failed call changed (RB_COUNT: the host arrays), or -1. */
static int outputs_changed(fixture *f, outputs *o) {
  int changed = -1;
  const size_t host_bytes = sizeof f->out + sizeof f->scores + sizeof f->dequantized;
  if (o->copy[RB_COUNT] && memcmp(o->copy[RB_COUNT], f->out, host_bytes)) changed = RB_COUNT;
  for (int b = RB_OUTPUTS_FROM; b < RB_COUNT && rt.active && changed < 0; b++)
    if (o->copy[b] && memcmp(o->copy[b], rt.buf[b].mapped, rt.buf[b].bytes)) changed = b;
  for (int b = 0; b <= RB_COUNT; b++) free(o->copy[b]);
  return changed;
}

typedef struct tally {
  uint64_t by_kind[KVQ_FAULT_KINDS], points, lost, counted;
  kvq_backend_stats stats; /* of the counted run */
  fault_log log;
} tally;

static void fail_point(const scenario *s, fixture *f, uint64_t k, int lost, tally *t) {
  const char *how = lost ? " as a lost device" : "";
  kvq_status st = setup(s, f);
  if (st != KVQ_OK) {
    failure(&t->log, "point %llu: the setup failed: %s", (unsigned long long)k, kvq_context_last_error(f->ctx));
    teardown(f);
    return;
  }
  unsigned char *before = NULL, *after = NULL;
  size_t before_size = 0, after_size = 0;
  if (s->has_cache && saved_bytes(f->cache, &before, &before_size) != KVQ_OK)
    failure(&t->log, "point %llu: saving before the call failed", (unsigned long long)k);
  outputs o;
  outputs_fill(f, &o);
  kvq_fault_arm(k, lost);
  st = s->call(f);
  const int fired = kvq_fault_fired();
  const kvq_fault_kind kind = kvq_fault_fired_kind();
  kvq_fault_arm(0, 0);
  const char *message = kvq_context_last_error(f->ctx);
  const int changed = outputs_changed(f, &o);
  if (!fired)
    failure(&t->log, "point %llu was not reached: the call passes fewer points than counted", (unsigned long long)k);
  else if (st == KVQ_OK)
    failure(&t->log, "point %llu (%s) failed%s, yet the call returned KVQ_OK", (unsigned long long)k, kind_names[kind], how);
  else if (!message || !message[0])
    failure(&t->log, "point %llu (%s) failed%s: %s without a message", (unsigned long long)k, kind_names[kind], how,
            kvq_status_string(st));
  else if (lost && st != KVQ_ERROR_DEVICE_LOST)
    failure(&t->log, "point %llu (%s) failed as a lost device: %s (%s)", (unsigned long long)k, kind_names[kind],
            kvq_status_string(st), message);
  /* a lost device's outputs are not compared: work submitted before the loss may have run (kvq.h) */
  if (fired && !lost && changed >= 0)
    failure(&t->log, "point %llu (%s): the failed call wrote %s %d (%s)", (unsigned long long)k, kind_names[kind],
            changed == RB_COUNT ? "a host output" : "the runtime's output buffer", changed, message);
  if (fired && !lost) {
    if (s->has_cache) {
      if (saved_bytes(f->cache, &after, &after_size) != KVQ_OK)
        failure(&t->log, "point %llu (%s): saving after the failed call failed: %s", (unsigned long long)k, kind_names[kind],
                kvq_context_last_error(f->ctx));
      else if (before && (after_size != before_size || memcmp(before, after, before_size)))
        failure(&t->log, "point %llu (%s): the failed call changed the cache (%s: %s)", (unsigned long long)k,
                kind_names[kind], kvq_status_string(st), message);
    }
    if ((st = s->call(f)) != KVQ_OK)
      failure(&t->log, "point %llu (%s): the same call after the failure: %s (%s)", (unsigned long long)k, kind_names[kind],
              kvq_status_string(st), kvq_context_last_error(f->ctx));
  }
  free(before);
  free(after);
  teardown(f);
  if (lost) {
    kvq_context_destroy(f->ctx);
    f->ctx = NULL;
    check_nothing_held(&t->log, KVQ_BACKEND_VULKAN, k, 1, "after a lost device's context was destroyed");
    if (context_on(&f->ctx) != KVQ_OK) failure(&t->log, "a new context after a lost device");
  }
}

static void run_scenario(const scenario *s, kvq_context **ctx, tally *t) {
  fixture *f = calloc(1, sizeof *f);
  if (!f) {
    failure(&t->log, "out of memory");
    return;
  }
  f->ctx = *ctx;
  /* warm-up (twice: pipelines, the pools of the chain, metadata and scratch exist before counting) */
  kvq_status st = KVQ_OK;
  for (int round = 0; round < 2 && st == KVQ_OK; round++) {
    st = setup(s, f);
    if (st == KVQ_OK) st = s->call(f);
    teardown(f);
  }
  if (st != KVQ_OK) failure(&t->log, "the scenario fails without a fault: %s", kvq_context_last_error(f->ctx));
  st = setup(s, f);
  kvq_fault_arm(0, 0);
  (void)kvq_context_backend_stats(f->ctx, NULL, 1);
  if (st == KVQ_OK) st = s->call(f);
  const uint64_t n = kvq_fault_count(), failed_plain = kvq_fault_eligible();
  (void)kvq_context_backend_stats(f->ctx, &t->stats, 1);
  uint64_t failed_lost = 0;
  for (uint64_t k = 1; k <= n && k <= KVQ_FAULT_TRACE; k++) {
    t->by_kind[kvq_fault_kind_at(k)]++;
    failed_lost += may_be_lost(kvq_fault_kind_at(k));
  }
  teardown(f);
  if (st != KVQ_OK) failure(&t->log, "the counting run failed: %s", kvq_context_last_error(f->ctx));
  if (n > KVQ_FAULT_TRACE) failure(&t->log, "%llu points: more than the trace holds", (unsigned long long)n);
  /* the point of the test: the call outgrew what one recording has */
  if (s->whole && t->stats.staging_overflows == 0 && t->stats.pool_steps == 0)
    failure(&t->log, "the call outgrew neither the staging space nor a descriptor pool: nothing tested");
  if (!s->whole && t->stats.submissions < 2)
    failure(&t->log, "the call did not submit part way (%llu submissions): nothing tested", (unsigned long long)t->stats.submissions);
  t->counted = failed_plain;
  for (uint64_t k = 1; !t->log.failures && k <= failed_plain; k++) {
    fail_point(s, f, k, 0, t);
    t->points++;
  }
  /* As a lost device: the per-step calls' submissions and waits. Not create, load and save, which
   * submit part way here (dozens of submissions, each a new context as a lost device; their lost
   * points are failed by tests/test_fault.c at the shipped limits). */
  for (uint64_t k = 1; s->whole && !t->log.failures && k <= failed_lost; k++) {
    t->lost++;
    fail_point(s, f, k, 1, t);
    if (!f->ctx) break;
    fixture warm = {.ctx = f->ctx};
    st = setup(s, &warm);
    if (st == KVQ_OK) st = s->call(&warm);
    teardown(&warm);
    if (st != KVQ_OK) failure(&t->log, "the scenario on a new context after a lost device: %s", kvq_context_last_error(f->ctx));
  }
  kvq_context_destroy(f->ctx);
  f->ctx = NULL;
  check_nothing_held(&t->log, KVQ_BACKEND_VULKAN, 0, 0, "once the scenario's context is destroyed");
  if (context_on(&f->ctx) != KVQ_OK) failure(&t->log, "a new context");
  *ctx = f->ctx;
  free(f);
}

#ifdef KVQ_HAVE_VULKAN
static const char *runtime_start(void) {
  const char *failed = runtime_device_start(&rt.handed);
  if (failed) return failed;
  const size_t sizes[RB_COUNT] = {sizeof keys_in, sizeof values_in, sizeof queries_in, Q_FLOATS * 4, Q_FLOATS * 2 + 4,
                                  NQ * HQ * TOKENS * 4, DEQ_TOKENS * HKV * D * 4, DEQ_TOKENS * HKV * D * 4};
  const float *inputs[RB_COUNT] = {keys_in, values_in, queries_in};
  return runtime_buffers_make(&rt.handed, RB_COUNT, sizes, inputs, RB_OUTPUTS_FROM, rt.buf);
}

static void runtime_stop(void) {
  runtime_buffers_free(&rt.handed, RB_COUNT, rt.buf);
  runtime_device_stop(&rt.handed);
  memset(&rt, 0, sizeof rt);
}
#endif

typedef struct totals {
  int number, failed;
  uint64_t points, lost;
} totals;

static void row(const scenario *s, const char *name, const char *why, kvq_context **ctx, totals *all) {
  all->number++;
  if (why[0]) {
    printf("ok %d - %s %s # SKIP %s\n", all->number, name, s->name, why);
    return;
  }
  tally t = {0};
  run_scenario(s, ctx, &t);
  all->points += t.points;
  all->lost += t.lost;
  char kinds[300];
  const uint64_t points = kinds_text(t.by_kind, kinds, sizeof kinds);
  if (t.log.failures) all->failed++;
  printf("%s %d - %s %s: %llu points (%s): %llu failed, %llu failed as a lost device; counted run: %llu overflow "
         "staging buffers, %llu further descriptor pools, %llu submissions%s%s\n",
         t.log.failures ? "not ok" : "ok", all->number, name, s->name, (unsigned long long)points, kinds,
         (unsigned long long)t.points, (unsigned long long)t.lost, (unsigned long long)t.stats.staging_overflows,
         (unsigned long long)t.stats.pool_steps, (unsigned long long)t.stats.submissions, t.log.failures ? ": " : "",
         t.log.failures ? t.log.first : "");
  fflush(stdout);
}

int main(void) {
  /* the backend reads them when a context is created; they can only shrink its limits (vk.h) */
  setenv("KVQ_VULKAN_STAGING_BYTES", "512", 1);
  setenv("KVQ_VULKAN_DESCRIPTOR_SETS", "1", 1);
  fill_inputs(2026);
  vulkan_drivers_hold();
  size_t rows = 0;
  for (size_t i = 0; i < SCENARIOS; i++) rows += (scenarios[i].rows & 1) + (scenarios[i].rows >> 1);
  printf("1..%zu\n", rows + 1);
  const char *only = getenv("KVQ_FAULT_ONLY"); /* a row name, or "ROW SCENARIO": the others skip */
  totals all = {0};
  for (int runtime_row = 0; runtime_row < 2; runtime_row++) {
    const char *name = runtime_row ? "vulkan-runtime" : "vulkan";
    kvq_context *ctx = NULL;
    char why[300] = "";
#ifdef KVQ_HAVE_VULKAN
    const char *failed_at = NULL;
    if (runtime_row && (failed_at = runtime_start()) != NULL) snprintf(why, sizeof why, "no runtime device: %s", failed_at);
    rt.active = runtime_row && !failed_at;
    if (!why[0] && context_on(&ctx) != KVQ_OK) snprintf(why, sizeof why, "no Vulkan context here");
#else
    snprintf(why, sizeof why, "the Vulkan backend is not built");
#endif
    for (size_t i = 0; i < SCENARIOS; i++) {
      if (!(scenarios[i].rows & (runtime_row ? 2 : 1))) continue;
      char only_why[300] = "";
      char full[128];
      snprintf(full, sizeof full, "%s %s", name, scenarios[i].name);
      if (only && only[0] && strcmp(only, name) && strcmp(only, full)) snprintf(only_why, sizeof only_why, "KVQ_FAULT_ONLY=%s", only);
      row(&scenarios[i], name, why[0] ? why : only_why, &ctx, &all);
      if (!ctx && !why[0]) snprintf(why, sizeof why, "no context after a lost device");
    }
    kvq_context_destroy(ctx);
#ifdef KVQ_HAVE_VULKAN
    if (runtime_row) runtime_stop();
#endif
  }
  all.number++;
  printf("%s %d - every context destroyed, kvq holds %lld host blocks (0 expected); %llu failure points covered, "
         "%llu more as a lost device\n",
         kvq_fault_live_blocks() == 0 ? "ok" : "not ok", all.number, (long long)kvq_fault_live_blocks(),
         (unsigned long long)all.points, (unsigned long long)all.lost);
  if (kvq_fault_live_blocks() != 0) all.failed++;
  return all.failed ? 1 : 0;
}
