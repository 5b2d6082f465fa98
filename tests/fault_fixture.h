/*
 * What the two fault-injection tests share (tests/test_fault.c: `fault_injection`,
 * tests/test_fault_more.c: `fault_injection_contexts`; docs/RELIABILITY.md, "Fault injection"): the
 * sizes of their small cache and its inputs, the caches they make, the saved bytes they compare, the
 * calls both run with host tensors (save, load, learning), the names of the failure kinds and which
 * of them a lost device fails, the emulated CUDA device's objects, the failure log behind their TAP
 * lines, and a Vulkan device made as a runtime would. Built with the tests against the
 * fault-injection variant of the library (tests/meson.build); one thread (the fault counter counts on
 * the calling thread's order).
 */
#ifndef KVQ_TESTS_FAULT_FIXTURE_H
#define KVQ_TESTS_FAULT_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "core/fault.h"
#include "kvq/kvq.h"

/* Small sizes: every point of a scenario runs the whole setup again, and the emulated CUDA backend
 * runs a CPU thread per CUDA thread. 48 tokens in pages of 16 with a window of 16: quantized pages, a
 * full-precision window, and (H2O, 4 sinks, 16 + 16 recent, 4 heavy) 12 candidates of which 8 go;
 * then 24 more. */
enum { HQ = 2, HKV = 1, D = 32, PAGE = 16, WINDOW = 16, TOKENS = 48, MORE = 24, NQ = 2 };
enum { KV_FLOATS = (TOKENS + MORE) * HKV * D, Q_FLOATS = NQ * HQ * D, MAX_FAILURES_SHOWN = 12 };

/* The inputs, in [-1, 1) from a linear congruential generator started at `seed` (each test has its
 * own seed, as before the fixture was shared). */
extern float keys_in[KV_FLOATS], values_in[KV_FLOATS], queries_in[Q_FLOATS];
void fill_inputs(uint32_t seed);

/* The caches of the scenarios: `base` (QJL keys, 2-bit uniform values, H2O) for everything but
 * learning, `learned` (CQ keys: codebooks to learn, 4 channels of 4 bits) for kvq_codebooks_learn;
 * and, for the cold rows of the other methods (tests/test_fault_more.c), `polar_kivi` (PolarQuant
 * keys with its defaults, dense rotation and offline codebooks; 2-bit KIVI values) and `exact`
 * (fp16 keys, bf16 values), both with base's H2O. `layer` receives the layer the configuration points
 * at. */
typedef enum which_cache { BASE, LEARNED, POLAR_KIVI, EXACT } which_cache;
kvq_cache_config cache_config(which_cache which, kvq_layer_config *layer);

/* The calls both tests run with host tensors: save into a buffer of the saved size (then freed),
 * load from `file` (the cache made, then destroyed; *fired_before_destroy says whether the armed
 * point had failed before kvq_cache_destroy, which returns nothing, ran), learn layer 0's codebooks
 * from the first TOKENS keys. */
kvq_status fault_save(kvq_cache *cache);
kvq_status fault_load(kvq_context *ctx, const unsigned char *file, size_t size, int *fired_before_destroy);
kvq_status fault_learn(kvq_cache *cache);

/* A scenario's teardown: the cache destroyed, the file freed, both set to NULL. */
void release(kvq_cache **cache, unsigned char **file);

/* The cache's saved bytes into *bytes (malloc'd; the caller frees it whatever the status), with no point
 * armed. */
kvq_status saved_bytes(kvq_cache *cache, unsigned char **bytes, size_t *size);

/* The kinds' names (index KVQ_FAULT_KINDS: "none failed"). */
extern const char *const kind_names[KVQ_FAULT_KINDS + 1];

/* Whether a point of `kind` is failed as a lost device: submissions and waits are where a device
 * reports its loss (a failed wait always is one: the work may still be running). */
int may_be_lost(kvq_fault_kind kind);

/* Whether a context on `backend` may be failed as a lost device here: Vulkan; CUDA only on the
 * emulated backend (KVQ_HAVE_CUDA_EMULATOR), whose device the test can reset. The CUDA backend keeps a
 * lost device's memory on purpose (a runtime's context may own it, backends/cuda/host/memory.cuh); a
 * runtime recovers it with cudaDeviceReset, and so does device_reset. */
int can_be_lost(kvq_backend_kind backend);

/* The emulated CUDA device's allocations and events that exist now (0 on the other backends, and
 * without the emulator), and its reset (cudaDeviceReset: frees them all), for after a lost device's
 * context is destroyed, when no context is left on it. */
size_t device_objects(kvq_backend_kind backend);
void device_reset(kvq_backend_kind backend);

/* The failures of one row: the first is kept for its TAP line, the first MAX_FAILURES_SHOWN are
 * printed as TAP comments. */
typedef struct fault_log {
  int failures;
  char first[600];
} fault_log;
void failure(fault_log *log, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* After a context on `backend` is gone (point k, or 0 after a scenario; `when` says when, for the
 * message): kvq holds no host block, and the emulated CUDA device no object, once a lost device's
 * (which the backend keeps) are freed by resetting the device, as a runtime would. */
void check_nothing_held(fault_log *log, kvq_backend_kind backend, uint64_t k, int lost, const char *when);

/* For a row's TAP line: " (N in kvq_cache_destroy, reported by the context's next call)" when N
 * points failed as a lost device were in kvq_cache_destroy (which returns nothing), else "". */
void in_destroy_text(uint64_t n, char *out, size_t size);

/* "host alloc 3, copy 2, ..." for a row's points by kind, into `out`; returns the points in all. */
uint64_t kinds_text(const uint64_t by_kind[KVQ_FAULT_KINDS], char *out, size_t size);

/* A defect a fault test found and that is not fixed yet: its row's TAP line says `not ok ... # TODO`
 * (docs/RELIABILITY.md, "Fault injection"). A test's list ends with an entry whose row is NULL. */
typedef struct known_defect {
  const char *row, *scenario, *why;
} known_defect;

/* Why row `row`, scenario `scenario` is a known defect of `list`, or NULL where it is not one. */
const char *known_defect_of(const known_defect *list, const char *row, const char *scenario);

/* Keeps the Vulkan drivers loaded until the process exits (fault_fixture.c says why); call first in
 * main. Without a Vulkan loader or device it does nothing. */
void vulkan_drivers_hold(void);

/* A Vulkan instance and device made as a runtime would (volk; tests/test_vulkan.c has the same with
 * assertions): the first physical device, one compute queue. Fills `device` for
 * kvq_context_options.vulkan and returns NULL, or returns what failed (then runtime_device_stop
 * destroys what was made). The runtime's own Vulkan calls are not failure points (only kvq's are).
 * Without KVQ_HAVE_VULKAN it makes nothing and says so. */
const char *runtime_device_start(kvq_vulkan_device *device);
/* Destroys what runtime_device_start made and clears `device`. */
void runtime_device_stop(kvq_vulkan_device *device);

/* A runtime's buffer: host-visible, coherent and mapped, so that a test can fill and compare it. */
typedef struct runtime_buffer {
  uint64_t buffer, memory; /* VkBuffer, VkDeviceMemory */
  void *mapped;
  size_t bytes;
} runtime_buffer;
#ifdef KVQ_HAVE_VULKAN
/* Makes `count` such buffers on the runtime's device (storage and transfer use), buffer b of sizes[b]
 * bytes, holding inputs[b] for b < outputs_from and 0x5a bytes from there on (outputs the failed
 * calls must leave as they were). Returns NULL, or what failed (runtime_buffers_free then frees what
 * was made). */
const char *runtime_buffers_make(const kvq_vulkan_device *device, int count, const size_t *sizes,
                                 const float *const *inputs, int outputs_from, runtime_buffer *buffers);
/* Frees what runtime_buffers_make made (before runtime_device_stop) and clears `buffers`. */
void runtime_buffers_free(const kvq_vulkan_device *device, int count, runtime_buffer *buffers);
#endif

#endif /* KVQ_TESTS_FAULT_FIXTURE_H */
