/*
 * kvq on several threads at once: the functions kvq.h documents as thread-safe (kvq_backends_list,
 * kvq_context_create) called concurrently, and contexts used independently, one per thread.
 *
 * tests/meson.build builds this file twice: into the ordinary (sanitized) suite as `threads`, and
 * with ThreadSanitizer against a ThreadSanitizer build of the library as `threads_tsan`, where any
 * data race ends the run with a report. Every thread runs the same small attention, whose result
 * must equal, bit for bit, what the main thread computed alone on a backend of the same kind.
 *
 * A plain program printing TAP, not Criterion: Criterion's runner cannot start under ThreadSanitizer
 * (it maps its shared arena at a fixed address, inside ThreadSanitizer's shadow memory: "Could not
 * initialize inheritable arena"). Everything runs in one process, in the order of `cases`.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvq/kvq.h"
#include "fixture_inputs.h"

enum { THREADS = 6, ROUNDS = 2, HQ = 4, HKV = 2, D = 32, TOKENS = 80, NQ = 2, KINDS = 4 };
enum { KV_FLOATS = TOKENS * HKV * D, Q_FLOATS = NQ * HQ * D };

/* The attention's inputs (pseudo-random in [-1, 1), filled before any worker starts) and, per backend
 * kind, the output the main thread computed alone (`have`: whether that kind is available here). */
static float keys_in[KV_FLOATS], values_in[KV_FLOATS], queries_in[Q_FLOATS];
static float reference[KINDS][Q_FLOATS];
static int have[KINDS];
static kvq_backend_info listed[KINDS]; /* kvq_backends_list on the main thread */
static size_t listed_count;

/* A failure message, first one wins (`why` of a test case or a worker's record). */
static void say(char *why, size_t why_size, const char *format, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t why_size, const char *format, ...) {
  if (why[0]) return;
  va_list ap;
  va_start(ap, format);
  vsnprintf(why, why_size, format, ap);
  va_end(ap);
}

static void fill_inputs(void) {
  uint32_t x = 12345;
  x = fx_fill_lcg(keys_in, KV_FLOATS, x);
  x = fx_fill_lcg(values_in, KV_FLOATS, x);
  (void)fx_fill_lcg(queries_in, Q_FLOATS, x);
}

/* A small cache on `ctx` (QJL keys, 2-bit uniform values, pages of 16, a window of 32) holding
 * TOKENS tokens, and causal attention of NQ queries over it into `out`. */
static kvq_status attend(kvq_context *ctx, float out[Q_FLOATS], char *why, size_t why_size) {
  kvq_layer_config layer = {.query_heads = HQ, .kv_heads = HKV, .head_dim = D,
                            .keys = kvq_method_defaults(KVQ_METHOD_QJL, D),
                            .values = kvq_method_defaults(KVQ_METHOD_UNIFORM, D)};
  kvq_cache_config config = {.layer_count = 1, .layers = &layer, .input_dtype = KVQ_DTYPE_F32, .page_size = 16,
                             .residual_window = 32, .max_pages = 16, .max_sequences = 2, .seed = 7};
  int64_t kv_shape[3] = {TOKENS, HKV, D}, q_shape[3] = {NQ, HQ, D};
  kvq_tensor keys = kvq_tensor_host(keys_in, KVQ_DTYPE_F32, 3, kv_shape);
  kvq_tensor values = kvq_tensor_host(values_in, KVQ_DTYPE_F32, 3, kv_shape);
  kvq_attention_request request = {.mask = KVQ_MASK_CAUSAL,
                                   .queries = kvq_tensor_host(queries_in, KVQ_DTYPE_F32, 3, q_shape),
                                   .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, q_shape)};
  kvq_cache *cache = NULL;
  kvq_status st = kvq_cache_create(ctx, &config, &cache);
  if (st == KVQ_OK) st = kvq_sequence_add(cache, &request.sequence);
  if (st == KVQ_OK) st = kvq_append(cache, request.sequence, 0, &keys, &values);
  if (st == KVQ_OK) st = kvq_attention(cache, 0, &request, 1);
  if (st != KVQ_OK) say(why, why_size, "%s: %s", kvq_status_string(st), kvq_context_last_error(ctx));
  kvq_cache_destroy(cache);
  return st;
}

/* A context on `kind` (AUTO: NULL options, as most callers pass). */
static kvq_status context_on(kvq_backend_kind kind, kvq_context **ctx) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = kind;
  return kvq_context_create(kind == KVQ_BACKEND_AUTO ? NULL : &opt, ctx);
}

/* What the main thread sees alone: the backend list, and the attention on every available kind. */
static int compute_references(char *why, size_t why_size) {
  fill_inputs();
  if (kvq_backends_list(listed, KINDS, &listed_count) != KVQ_OK || listed_count < 2 || listed_count > KINDS) {
    say(why, why_size, "kvq_backends_list failed on the main thread");
    return 0;
  }
  for (size_t i = 0; i < listed_count; i++) {
    if (listed[i].availability != KVQ_AVAILABLE) {
      printf("# %s: unavailable here (%s)\n", listed[i].name, listed[i].reason);
      continue;
    }
    const kvq_backend_kind kind = listed[i].kind;
    kvq_context *ctx = NULL;
    if (context_on(kind, &ctx) != KVQ_OK) say(why, why_size, "no context on %s, which is listed as available", listed[i].name);
    else if (attend(ctx, reference[kind], why, why_size) != KVQ_OK) say(why, why_size, "attention on %s", listed[i].name);
    else have[kind] = 1;
    kvq_context_destroy(ctx);
    printf("# %s: %s\n", listed[i].name, listed[i].device);
  }
  return !why[0];
}

typedef struct worker {
  pthread_t thread;
  char failure[512]; /* the first thing that went wrong; empty if nothing did */
} worker;

/* The attention on `ctx`, against the reference of the context's backend. */
static void attend_and_compare(worker *w, kvq_context *ctx, const char *what) {
  float out[Q_FLOATS];
  char why[400] = "";
  const int kind = (int)kvq_context_backend(ctx);
  if (attend(ctx, out, why, sizeof why) != KVQ_OK)
    say(w->failure, sizeof w->failure, "%s: attention: %s", what, why);
  else if (kind <= KVQ_BACKEND_AUTO || kind >= KINDS || !have[kind])
    say(w->failure, sizeof w->failure, "%s: ran on backend %d, which the main thread did not have", what, kind);
  else if (memcmp(out, reference[kind], sizeof out))
    say(w->failure, sizeof w->failure, "%s: the output differs from the main thread's", what);
}

/* The backend list agrees with the main thread's (a race could garble it). */
static void list_and_compare(worker *w) {
  kvq_backend_info infos[KINDS];
  size_t count = 0;
  if (kvq_backends_list(infos, KINDS, &count) != KVQ_OK || count != listed_count) {
    say(w->failure, sizeof w->failure, "kvq_backends_list");
    return;
  }
  for (size_t i = 0; i < count; i++)
    if (infos[i].kind != listed[i].kind || infos[i].availability != listed[i].availability ||
        strcmp(infos[i].device, listed[i].device) || strcmp(infos[i].reason, listed[i].reason))
      say(w->failure, sizeof w->failure, "kvq_backends_list: %s differs from the main thread's list (%s / %s)",
          listed[i].name, infos[i].device, infos[i].reason);
}

/* The thread-safe entry points, over and over: list, create on the default and on every available
 * backend by name, attend, destroy. */
static void *create_everywhere(void *arg) {
  worker *w = arg;
  for (int round = 0; round < ROUNDS && !w->failure[0]; round++) {
    list_and_compare(w);
    for (int kind = KVQ_BACKEND_AUTO; kind < KINDS; kind++) {
      if (kind != KVQ_BACKEND_AUTO && !have[kind]) continue;
      kvq_context *ctx = NULL;
      const kvq_status st = context_on((kvq_backend_kind)kind, &ctx);
      if (st != KVQ_OK) say(w->failure, sizeof w->failure, "kvq_context_create(backend %d): %s", kind, kvq_status_string(st));
      else attend_and_compare(w, ctx, kind == KVQ_BACKEND_AUTO ? "default context" : "named backend");
      kvq_context_destroy(ctx);
    }
  }
  return NULL;
}

/* One CPU context per thread, used for several caches in turn. */
static void *own_cpu_context(void *arg) {
  worker *w = arg;
  kvq_context *ctx = NULL;
  if (context_on(KVQ_BACKEND_CPU, &ctx) != KVQ_OK) {
    say(w->failure, sizeof w->failure, "kvq_context_create(cpu)");
    return NULL;
  }
  for (int round = 0; round < ROUNDS && !w->failure[0]; round++) attend_and_compare(w, ctx, "own cpu context");
  kvq_context_destroy(ctx);
  return NULL;
}

/* THREADS workers running `body` at once; the first failure of any becomes the test's. */
static int run_workers(void *(*body)(void *), char *why, size_t why_size) {
  worker workers[THREADS];
  memset(workers, 0, sizeof workers);
  int started = 0;
  while (started < THREADS && pthread_create(&workers[started].thread, NULL, body, &workers[started]) == 0) started++;
  for (int i = 0; i < started; i++) pthread_join(workers[i].thread, NULL);
  if (started < THREADS) say(why, why_size, "pthread_create failed after %d threads", started);
  for (int i = 0; i < started; i++)
    if (workers[i].failure[0]) say(why, why_size, "thread %d: %s", i, workers[i].failure);
  return !why[0];
}

/* kvq_backends_list and kvq_context_create are documented thread-safe: on THREADS threads at once,
 * with the default options and with every available backend named (Vulkan: kvq's own instance and
 * device per context; lavapipe in CI). */
static int list_and_create_contexts_concurrently(char *why, size_t why_size) {
  return run_workers(create_everywhere, why, why_size);
}

/* Different contexts are independent: one CPU context per thread, each creating caches and attending. */
static int cpu_contexts_work_independently(char *why, size_t why_size) {
  return run_workers(own_cpu_context, why, why_size);
}

#ifdef KVQ_HAVE_VULKAN
#include <volk.h>

/* The pointers volk keeps for the whole process (its loader, instance and device functions). */
typedef struct volk_globals {
  PFN_vkGetInstanceProcAddr get_instance_proc_addr;
  PFN_vkCreateInstance create_instance;
  PFN_vkEnumeratePhysicalDevices enumerate_physical_devices;
  PFN_vkGetPhysicalDeviceProperties get_properties;
  PFN_vkCreateDevice create_device;
  PFN_vkGetDeviceProcAddr get_device_proc_addr;
  PFN_vkQueueSubmit queue_submit;
  VkInstance instance;
  VkDevice device;
} volk_globals;

static volk_globals volk_now(void) {
  return (volk_globals){vkGetInstanceProcAddr, vkCreateInstance, vkEnumeratePhysicalDevices, vkGetPhysicalDeviceProperties,
                        vkCreateDevice, vkGetDeviceProcAddr, vkQueueSubmit, volkGetLoadedInstance(), volkGetLoadedDevice()};
}

static volk_globals volk_at_start; /* before the first kvq call */

/* kvq keeps its Vulkan functions per backend, never in volk's process-wide pointers, which another
 * thread's context (or the application's own volk) may be rewriting at the same moment. This program
 * links kvq's copy of volk statically and never sets those pointers itself, so it can see that kvq
 * neither sets nor needs them: after every context above, on every backend and thread, they are
 * still unset. */
static int vulkan_contexts_leave_volks_globals_alone(char *why, size_t why_size) {
  if (!have[KVQ_BACKEND_VULKAN]) {
    say(why, why_size, "SKIP the Vulkan backend is unavailable here");
    return 1;
  }
  static const volk_globals unset;
  const volk_globals now = volk_now();
  if (memcmp(&volk_at_start, &unset, sizeof unset)) say(why, why_size, "volk's pointers were set before kvq ran");
  else if (memcmp(&now, &unset, sizeof unset)) say(why, why_size, "kvq set volk's global function pointers");
  return !why[0];
}
#else
static int vulkan_contexts_leave_volks_globals_alone(char *why, size_t why_size) {
  say(why, why_size, "SKIP this kvq was built without the Vulkan backend");
  return 1;
}
#endif

typedef struct test_case {
  const char *name;
  int (*run)(char *why, size_t why_size); /* 1: passed (or skipped: why starts with "SKIP ") */
} test_case;

static const test_case cases[] = {
    {"list_and_create_contexts_concurrently", list_and_create_contexts_concurrently},
    {"cpu_contexts_work_independently", cpu_contexts_work_independently},
    {"vulkan_contexts_leave_volks_globals_alone", vulkan_contexts_leave_volks_globals_alone}, /* after the others */
};

int main(void) {
  const int count = (int)(sizeof cases / sizeof cases[0]);
#ifdef KVQ_HAVE_VULKAN
  volk_at_start = volk_now();
#endif
  printf("1..%d\n", count);
  char setup[512] = "";
  const int ready = compute_references(setup, sizeof setup);
  int failed = 0;
  for (int i = 0; i < count; i++) {
    char why[1024] = "";
    const int passed = ready && cases[i].run(why, sizeof why);
    failed += !passed;
    if (!ready) printf("not ok %d - threads::%s # the main thread alone failed: %s\n", i + 1, cases[i].name, setup);
    else if (!strncmp(why, "SKIP ", 5)) printf("ok %d - threads::%s # SKIP %s\n", i + 1, cases[i].name, why + 5);
    else printf("%s %d - threads::%s%s%s\n", passed ? "ok" : "not ok", i + 1, cases[i].name, why[0] ? ": " : "", why);
    fflush(stdout);
  }
  return failed ? 1 : 0;
}
