/*
 * Fault injection, the undo of a failed call's in-place writes on the backends that run each
 * operation as it is issued (the CPU backend and the emulated CUDA backend; docs/RELIABILITY.md,
 * "Fault injection", test `fault_injection_undo`). Vulkan records a call and runs none of a failed
 * one (KVQ_BACKEND_RECORDS), so its rows are in tests/test_fault.c and tests/test_fault_more.c.
 * The scenarios reach what the other fault tests' small cache does not:
 *   - append-wrap: an append whose new tokens run more than a whole ring turn past the window's
 *     first token, so that they overwrite the old window's slots in two places (core/append.c puts
 *     the whole old window back after a failure);
 *   - append-partial-page, flush-partial-page: an append and a flush that quantize again, in place, a
 *     page an earlier flush left partly filled (core/page_backup.c puts it back);
 *   - append-evicted-pages: an append whose policy step (H2O) evicts whole pages that the same append
 *     then takes again, clears and fills (core/page_backup.c);
 *   - append-second-layer: layer 1's append into pages layer 0's append took (their layer-1 bytes
 *     zeros, cleared again after a failure: core/page_backup.c);
 *   - dequantize-host-keys, dequantize-host-values (emulated CUDA): one output a host tensor and the
 *     other CUDA device memory, so that kvq_dequantize writes both through host memory (the staged
 *     path: kvq_tensors_write, core/tensor_device.c; the device one put back by core/output_undo.c).
 * For every point the call passes, counted in a run with none armed (after three warm-up runs, as
 * tests/test_fault.c): the point failed on a fresh copy of the state; the call must return an error
 * with a message, leave its outputs (host and device) and the cache's saved bytes as they were, and
 * the same call must then succeed. The emulated CUDA backend's waits are failed as a lost device too
 * (KVQ_ERROR_DEVICE_LOST; the context destroyed, the emulated device reset, nothing left held). A
 * plain TAP program, one thread (the fault counter counts on the calling thread's order).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_fixture.h"
#include "fixture_inputs.h"
#include "kvq/kvq.h"

/* Tokens enough for the longest scenario (48, then 50 more). */
enum { MAX_TOKENS = 128, TOKEN_FLOATS = HKV * D, DEQ_TOKENS = 2 * PAGE };
static float keys[MAX_TOKENS * TOKEN_FLOATS], values[MAX_TOKENS * TOKEN_FLOATS];

/* What a scenario works on. The outputs must be as they were after a failed call (kvq.h); on the
 * emulated CUDA backend device memory is host memory, so both kinds are compared with memcmp. */
typedef struct fixture {
  kvq_context *ctx;
  kvq_cache *cache;
  uint32_t sequence, appended; /* tokens appended so far */
  float dequantized[2][DEQ_TOKENS * TOKEN_FLOATS];
} fixture;

static kvq_tensor tokens(float *data, uint32_t first, uint32_t count) {
  const int64_t shape[3] = {count, HKV, D};
  return kvq_tensor_host(data + (size_t)first * TOKEN_FLOATS, KVQ_DTYPE_F32, 3, shape);
}

/* The next `count` tokens of the inputs. */
static kvq_status append(fixture *f, uint32_t count) {
  kvq_tensor k = tokens(keys, f->appended, count), v = tokens(values, f->appended, count);
  const kvq_status st = kvq_append(f->cache, f->sequence, 0, &k, &v);
  if (st == KVQ_OK) f->appended += count;
  return st;
}

static kvq_status attend(fixture *f) {
  float out[Q_FLOATS];
  const int64_t shape[3] = {NQ, HQ, D};
  kvq_attention_request request = {.sequence = f->sequence, .mask = KVQ_MASK_CAUSAL,
                                   .queries = kvq_tensor_host(queries_in, KVQ_DTYPE_F32, 3, shape),
                                   .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, shape)};
  return kvq_attention(f->cache, 0, &request, 1);
}

/* The fixture's base cache (QJL keys, 2-bit uniform values; tests/fault_fixture.c), with H2O or
 * with nothing evicted; with `two_layers`, two such layers. */
static kvq_status make_cache_of(fixture *f, int h2o, int two_layers) {
  kvq_layer_config layers[2];
  kvq_cache_config config = cache_config(BASE, &layers[0]);
  layers[1] = layers[0];
  config.layers = layers;
  config.layer_count = two_layers ? 2 : 1;
  if (!h2o) config.policy = kvq_policy_defaults(KVQ_POLICY_KEEP_ALL);
  f->appended = 0;
  kvq_status st = kvq_cache_create(f->ctx, &config, &f->cache);
  if (st == KVQ_OK) st = kvq_sequence_add(f->cache, &f->sequence);
  return st;
}
static kvq_status make_cache(fixture *f, int h2o) { return make_cache_of(f, h2o, 0); }

/* The setups (the ring holds WINDOW + PAGE = 32 slots; token t in slot t % 32). */
/* 48 tokens: pages 0 and 1 quantized, the window tokens 32..47 in slots 0..15. */
static kvq_status setup_window(fixture *f) {
  kvq_status st = make_cache(f, 0);
  return st == KVQ_OK ? append(f, TOKENS) : st;
}
/* 40 tokens flushed: page 2 holds tokens 32..39 of 16, and stays in the window. */
static kvq_status setup_flushed(fixture *f) {
  kvq_status st = make_cache(f, 0);
  if (st == KVQ_OK) st = append(f, 40);
  return st == KVQ_OK ? kvq_flush(f->cache, f->sequence) : st;
}
/* The same and 4 more tokens, not yet flushed. */
static kvq_status setup_flushed_more(fixture *f) {
  kvq_status st = setup_flushed(f);
  return st == KVQ_OK ? append(f, 4) : st;
}
/* H2O (4 sinks, 32 recent, 4 heavy): 48 tokens and attention (8 of tokens 4..15 go at the next
 * step), 24 more and attention again: the next step keeps 40 of 72 tokens (the sinks, 4 heavy
 * hitters, tokens 40..71), so a page of tokens 16..39 without a heavy hitter goes whole (on main the
 * row failed where such a page, taken again, was cleared: cuda point 17). */
static kvq_status setup_h2o(fixture *f) {
  kvq_status st = make_cache(f, 1);
  if (st == KVQ_OK) st = append(f, TOKENS);
  if (st == KVQ_OK) st = attend(f);
  if (st == KVQ_OK) st = append(f, MORE);
  return st == KVQ_OK ? attend(f) : st;
}
/* 48 tokens and attention, for dequantize. */
static kvq_status setup_dequantize(fixture *f) {
  kvq_status st = setup_window(f);
  return st == KVQ_OK ? attend(f) : st;
}

/* Two layers, 40 tokens each; then 24 more in layer 0, which takes page 2 (tokens 16..47 quantized),
 * cleared in both layers. */
static kvq_status setup_two_layers(fixture *f) {
  kvq_status st = make_cache_of(f, 0, 1);
  kvq_tensor k = tokens(keys, 0, 40), v = tokens(values, 0, 40);
  for (uint32_t l = 0; l < 2 && st == KVQ_OK; l++) st = kvq_append(f->cache, f->sequence, l, &k, &v);
  k = tokens(keys, 40, MORE), v = tokens(values, 40, MORE);
  return st == KVQ_OK ? kvq_append(f->cache, f->sequence, 0, &k, &v) : st;
}

/* The calls. */
/* Layer 1's 24 tokens: its pages 1 and 2 quantized into pages the sequence holds (layer 0 took page
 * 2), whose bytes of layer 1 are zeros. */
static kvq_status call_append_layer_1(fixture *f) {
  kvq_tensor k = tokens(keys, 40, MORE), v = tokens(values, 40, MORE);
  return kvq_append(f->cache, f->sequence, 1, &k, &v);
}
/* 50 tokens onto a window [32, 48): the window moves to [80, 98), whose tokens take slots 16..31 and
 * 0..1: old tokens 32 and 33 are overwritten by a write two ring turns after them. */
static kvq_status call_append_wrap(fixture *f) { return append(f, 50); }
/* 24 tokens onto [32, 40): page 2 quantized again, whole, over what the flush wrote. */
static kvq_status call_append_24(fixture *f) { return append(f, MORE); }
/* Page 2 quantized again with 12 tokens. */
static kvq_status call_flush(fixture *f) { return kvq_flush(f->cache, f->sequence); }
/* 40 tokens: the step's evictions free whole pages, which the append takes again. */
static kvq_status call_append_40(fixture *f) { return append(f, 40); }
static kvq_status dequantize(fixture *f, int host_side) {
  const int64_t shape[3] = {DEQ_TOKENS, HKV, D};
  kvq_tensor out[2];
  for (int s = 0; s < 2; s++)
    out[s] = s == host_side ? kvq_tensor_host(f->dequantized[s], KVQ_DTYPE_F32, 3, shape)
                            : kvq_tensor_cuda(f->dequantized[s], KVQ_DTYPE_F32, 3, shape);
  return kvq_dequantize(f->cache, f->sequence, 0, 0, DEQ_TOKENS, &out[0], &out[1]);
}
static kvq_status call_dequantize_host_keys(fixture *f) { return dequantize(f, 0); }
static kvq_status call_dequantize_host_values(fixture *f) { return dequantize(f, 1); }

typedef struct scenario {
  const char *name;
  kvq_status (*setup)(fixture *);
  kvq_status (*call)(fixture *);
  int cuda_only; /* device tensors: the emulated CUDA backend's */
} scenario;

static const scenario scenarios[] = {
    {"append-wrap", setup_window, call_append_wrap, 0},
    {"append-partial-page", setup_flushed, call_append_24, 0},
    {"flush-partial-page", setup_flushed_more, call_flush, 0},
    {"append-evicted-pages", setup_h2o, call_append_40, 0},
    {"append-second-layer", setup_two_layers, call_append_layer_1, 0},
    {"dequantize-host-keys", setup_dequantize, call_dequantize_host_keys, 1},
    {"dequantize-host-values", setup_dequantize, call_dequantize_host_values, 1},
};
enum { SCENARIOS = sizeof scenarios / sizeof scenarios[0] };

static kvq_status context_on(kvq_backend_kind backend, kvq_context **ctx) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = backend;
  kvq_fault_arm(0, 0);
  return kvq_context_create(&opt, ctx);
}

/* The scenario's state, with no point armed; the outputs filled with bytes no call writes. */
static kvq_status setup(const scenario *s, fixture *f) {
  kvq_context *ctx = f->ctx;
  memset(f, 0, sizeof *f);
  memset(f->dequantized, 0x5a, sizeof f->dequantized);
  f->ctx = ctx;
  kvq_fault_arm(0, 0);
  kvq_status st = s->setup(f);
  /* the CUDA backend reads its oldest device-time span (a wait point) when its ring is full: reading
   * them all here makes every run pass the same points (tests/test_fault.c) */
  uint64_t ns = 0;
  if (st == KVQ_OK) (void)kvq_context_device_time(f->ctx, &ns);
  return st;
}

static void teardown(fixture *f) {
  kvq_cache_destroy(f->cache);
  f->cache = NULL;
}

typedef struct tally {
  uint64_t by_kind[KVQ_FAULT_KINDS], counted, failed, lost, unreached;
  uint64_t twice, undo_lost; /* points failed with the next copy after them; of those, undos that failed */
  fault_log log;
} tally;

/* How a point is failed: alone, as a lost device, or with the first copy after it failed too. */
enum { PLAIN, LOST, THEN_COPY };

/* Point k of the mode failed (`how`), with the header's checks. THEN_COPY: a second failure in what
 * the call does after its first, where the copies that put back what it overwrote are (the window,
 * pages, device outputs); the call must then return KVQ_ERROR_DEVICE_LOST, saying to destroy the
 * cache (kvq_undo_failed: after which the test destroys the cache and context), or, where the copy
 * failed was not one that put something back, leave everything as it was. */
static void fail_point(const scenario *s, fixture *f, kvq_backend_kind backend, uint64_t k, int how, tally *t) {
  const int lost = how == LOST;
  kvq_status st = setup(s, f);
  if (st != KVQ_OK) {
    failure(&t->log, "point %llu: the setup failed: %s", (unsigned long long)k, kvq_context_last_error(f->ctx));
    teardown(f);
    return;
  }
  unsigned char *before = NULL, *after = NULL;
  size_t before_size = 0, after_size = 0;
  if (saved_bytes(f->cache, &before, &before_size) != KVQ_OK)
    failure(&t->log, "point %llu: saving before the call failed", (unsigned long long)k);
  float outputs[2][DEQ_TOKENS * TOKEN_FLOATS];
  memcpy(outputs, f->dequantized, sizeof outputs);
  if (how == THEN_COPY) kvq_fault_arm_then(k, KVQ_FAULT_COPY);
  else kvq_fault_arm(k, lost);
  st = s->call(f);
  const int fired = kvq_fault_fired(), twice = kvq_fault_then_fired();
  const kvq_fault_kind kind = kvq_fault_fired_kind();
  kvq_fault_arm(0, 0);
  const char *message = kvq_context_last_error(f->ctx);
  const char *how_text = lost ? " as a lost device" : how == THEN_COPY ? " with the next copy" : "";
  const int undo_lost = twice && st == KVQ_ERROR_DEVICE_LOST; /* the cache is to be destroyed */
  t->twice += twice;
  t->undo_lost += undo_lost;
  if (!fired) {
    /* CUDA's timing events (tests/test_fault.c): the last two points may go unreached, reported */
    if (backend == KVQ_BACKEND_CUDA && k + 2 > t->counted) t->unreached++;
    else failure(&t->log, "point %llu was not reached: the call passes fewer points than counted", (unsigned long long)k);
  } else if (st == KVQ_OK) {
    failure(&t->log, "point %llu (%s) failed%s, yet the call returned KVQ_OK", (unsigned long long)k, kind_names[kind], how_text);
  } else if (!message || !message[0]) {
    failure(&t->log, "point %llu (%s) failed%s: %s without a message", (unsigned long long)k, kind_names[kind], how_text,
            kvq_status_string(st));
  } else if (lost && st != KVQ_ERROR_DEVICE_LOST) {
    failure(&t->log, "point %llu (%s) failed as a lost device: %s (%s), not KVQ_ERROR_DEVICE_LOST", (unsigned long long)k,
            kind_names[kind], kvq_status_string(st), message);
  } else if (undo_lost && !strstr(message, "destroy the cache")) {
    failure(&t->log, "point %llu (%s) failed with the next copy: KVQ_ERROR_DEVICE_LOST without saying to destroy the cache (%s)",
            (unsigned long long)k, kind_names[kind], message);
  }
  if (fired && !lost && !undo_lost) {
    if (memcmp(outputs[0], f->dequantized[0], sizeof outputs[0]) || memcmp(outputs[1], f->dequantized[1], sizeof outputs[1]))
      failure(&t->log, "point %llu (%s): the failed call wrote its %s output", (unsigned long long)k, kind_names[kind],
              memcmp(outputs[0], f->dequantized[0], sizeof outputs[0]) ? "keys" : "values");
    if (saved_bytes(f->cache, &after, &after_size) != KVQ_OK)
      failure(&t->log, "point %llu (%s): saving after the failed call failed: %s", (unsigned long long)k, kind_names[kind],
              kvq_context_last_error(f->ctx));
    else if (before && (after_size != before_size || memcmp(before, after, before_size)))
      failure(&t->log, "point %llu (%s): the failed call changed the cache (%s: %s)", (unsigned long long)k, kind_names[kind],
              kvq_status_string(st), message);
    if ((st = s->call(f)) != KVQ_OK)
      failure(&t->log, "point %llu (%s): the same call after the failure: %s (%s)", (unsigned long long)k, kind_names[kind],
              kvq_status_string(st), kvq_context_last_error(f->ctx));
  }
  free(before);
  free(after);
  teardown(f);
  if (lost || undo_lost) { /* a lost device's context is only good for destroying */
    kvq_context_destroy(f->ctx);
    f->ctx = NULL;
    check_nothing_held(&t->log, backend, k, lost, "after a lost device's context was destroyed");
    if (context_on(backend, &f->ctx) != KVQ_OK) failure(&t->log, "point %llu: a new context after a lost device", (unsigned long long)k);
  }
}

/* Runs `s` a few times (warm-up), so that what a context makes on first use and keeps exists, and
 * the CUDA backend's ring of 16 timing spans has turned (a span per call that touches the device;
 * the setups make up to five calls, and three rounds left the counted run creating the last events,
 * which the later runs then pass fewer points without), before points are counted. */
static kvq_status warm_up(const scenario *s, fixture *f) {
  kvq_status st = KVQ_OK;
  for (int round = 0; round < 5 && st == KVQ_OK; round++) {
    st = setup(s, f);
    if (st == KVQ_OK) st = s->call(f);
    teardown(f);
  }
  return st;
}

static void run_scenario(const scenario *s, kvq_backend_kind backend, tally *t) {
  fixture *f = calloc(1, sizeof *f);
  if (!f) {
    failure(&t->log, "out of memory");
    return;
  }
  kvq_status st = context_on(backend, &f->ctx);
  if (st == KVQ_OK) st = warm_up(s, f);
  if (st != KVQ_OK) failure(&t->log, "the scenario fails without a fault: %s", f->ctx ? kvq_context_last_error(f->ctx) : "no context");
  if (st == KVQ_OK) st = setup(s, f);
  kvq_fault_arm(0, 0);
  if (st == KVQ_OK) st = s->call(f);
  const uint64_t n = kvq_fault_count();
  t->counted = kvq_fault_eligible();
  uint64_t lost_points = 0;
  for (uint64_t k = 1; k <= n && k <= KVQ_FAULT_TRACE; k++) {
    t->by_kind[kvq_fault_kind_at(k)]++;
    lost_points += may_be_lost(kvq_fault_kind_at(k));
  }
  teardown(f);
  if (st != KVQ_OK) failure(&t->log, "the counting run failed: %s", f->ctx ? kvq_context_last_error(f->ctx) : "no context");
  for (uint64_t k = 1; !t->log.failures && k <= t->counted; k++) {
    fail_point(s, f, backend, k, PLAIN, t);
    t->failed += !t->unreached;
  }
  for (uint64_t k = 1; !t->log.failures && can_be_lost(backend) && f->ctx && k <= lost_points; k++) {
    t->lost++;
    fail_point(s, f, backend, k, LOST, t);
    if (f->ctx && !t->log.failures && warm_up(s, f) != KVQ_OK)
      failure(&t->log, "the scenario on a new context after a lost device: %s", kvq_context_last_error(f->ctx));
  }
  /* CUDA only: the CPU backend's copies are memcpy and no failure points */
  for (uint64_t k = 1; !t->log.failures && backend == KVQ_BACKEND_CUDA && f->ctx && k <= t->counted; k++) {
    const uint64_t undone = t->undo_lost;
    fail_point(s, f, backend, k, THEN_COPY, t);
    if (t->undo_lost > undone && f->ctx && !t->log.failures && warm_up(s, f) != KVQ_OK)
      failure(&t->log, "the scenario on a new context after a failed undo: %s", kvq_context_last_error(f->ctx));
  }
  kvq_context_destroy(f->ctx);
  f->ctx = NULL;
  check_nothing_held(&t->log, backend, 0, 0, "once the scenario's context is destroyed");
  free(f);
}

int main(void) {
  vulkan_drivers_hold();
  fill_inputs(13);
  uint32_t x = fx_fill_lcg(keys, MAX_TOKENS * TOKEN_FLOATS, 29);
  (void)fx_fill_lcg(values, MAX_TOKENS * TOKEN_FLOATS, x);
  kvq_backend_info infos[4];
  size_t count = 0;
  if (kvq_backends_list(infos, 4, &count) != KVQ_OK || count > 4) {
    printf("1..1\nnot ok 1 - kvq_backends_list\n");
    return 1;
  }
  const kvq_backend_kind backends[2] = {KVQ_BACKEND_CPU, KVQ_BACKEND_CUDA};
  const char *names[2] = {"cpu", "cuda"};
  printf("1..%d\n", 2 * SCENARIOS + 1);
  int number = 0, failed = 0;
  uint64_t points = 0, lost = 0;
  for (int b = 0; b < 2; b++) {
    const char *unavailable = NULL;
    for (size_t i = 0; i < count; i++)
      if (infos[i].kind == backends[b] && infos[i].availability != KVQ_AVAILABLE) unavailable = infos[i].reason;
    for (size_t i = 0; i < SCENARIOS; i++) {
      const scenario *s = &scenarios[i];
      number++;
      if (unavailable) {
        printf("ok %d - %s %s # SKIP %s unavailable here: %s\n", number, names[b], s->name, names[b], unavailable);
        continue;
      }
      if (s->cuda_only && backends[b] != KVQ_BACKEND_CUDA) {
        printf("ok %d - %s %s # SKIP the CPU backend has no device tensors\n", number, names[b], s->name);
        continue;
      }
      tally t = {0};
      run_scenario(s, backends[b], &t);
      points += t.failed;
      lost += t.lost;
      char kinds[300];
      const uint64_t passed = kinds_text(t.by_kind, kinds, sizeof kinds);
      failed += t.log.failures != 0;
      printf("%s %d - %s %s: %llu points (%s): %llu failed, %llu failed as a lost device, %llu not reached; %llu failed "
             "with the next copy, %llu of them in an undo (KVQ_ERROR_DEVICE_LOST)%s%s\n",
             t.log.failures ? "not ok" : "ok", number, names[b], s->name, (unsigned long long)passed, kinds,
             (unsigned long long)t.failed, (unsigned long long)t.lost, (unsigned long long)t.unreached,
             (unsigned long long)t.twice, (unsigned long long)t.undo_lost,
             t.log.failures ? ": " : "", t.log.failures ? t.log.first : "");
      fflush(stdout);
    }
  }
  number++;
  const int clean = kvq_fault_live_blocks() == 0;
  printf("%s %d - kvq holds %lld host blocks at the end (0 expected); %llu failure points failed, %llu more as a lost "
         "device\n",
         clean ? "ok" : "not ok", number, (long long)kvq_fault_live_blocks(), (unsigned long long)points,
         (unsigned long long)lost);
  return failed || !clean ? 1 : 0;
}
