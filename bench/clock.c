/*
 * Clocks and what surrounds them: statistics of repeated samples, the cold cache written between
 * samples, and the device's own copy and read bandwidth, measured in the same run as the cases so
 * that a case's GB/s can be read as a fraction of what the device can move at all.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "core/internal.h"

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Linear interpolation between order statistics (the usual "type 7" quantile). */
static double quantile(const double *sorted, unsigned n, double q) {
  const double at = q * (n - 1);
  const unsigned lo = (unsigned)at;
  return lo + 1 < n ? sorted[lo] + (at - lo) * (sorted[lo + 1] - sorted[lo]) : sorted[n - 1];
}

void bench_stats_of(double *samples, unsigned count, bench_stats *out) {
  memset(out, 0, sizeof *out);
  if (count == 0) return;
  qsort(samples, count, sizeof *samples, by_value);
  *out = (bench_stats){.median = quantile(samples, count, 0.5), .min = samples[0], .max = samples[count - 1],
                       .q1 = quantile(samples, count, 0.25), .q3 = quantile(samples, count, 0.75), .count = count};
}

/* A buffer of the backend's own memory (device memory on a GPU, host memory on the CPU backend),
 * zero-filled between samples: the writes evict what the previous sample left in the caches (L2 on
 * a GPU, the CPU's caches for the CPU backend and lavapipe, whose device memory is host memory). */
struct bench_cold {
  kvq_backend *be;
  kvq_buffer *buffer;
  uint64_t bytes;
};

int bench_cold_create(kvq_context *ctx, uint64_t bytes, bench_cold **out) {
  bench_cold *c = calloc(1, sizeof *c);
  if (!c) return 2;
  c->be = ctx->backend;
  c->bytes = bytes;
  if (c->be->ops->buffer_create(c->be, bytes, &c->buffer) != KVQ_OK) {
    free(c);
    return 2;
  }
  *out = c;
  return 0;
}

int bench_cold_flush(bench_cold *c) {
  if (c->be->ops->buffer_zero(c->be, c->buffer, 0, c->bytes) != KVQ_OK) return 2;
  return c->be->ops->finish(c->be) == KVQ_OK ? 0 : 2;
}

void bench_cold_destroy(bench_cold *c) {
  if (!c) return;
  c->be->ops->buffer_destroy(c->be, c->buffer);
  free(c);
}

/* Seconds one backend operation took: by the device clock where the backend has one (the clock is
 * read once before, which restarts its count), else by the wall clock around the operation and a
 * finish. */
typedef kvq_status (*timed_op)(kvq_backend *be, void *arg);
static double time_op(kvq_context *ctx, timed_op op, void *arg, int device_clock) {
  kvq_backend *be = ctx->backend;
  uint64_t ns = 0;
  if (device_clock) be->ops->device_time(be, &ns);
  const double t0 = bench_now();
  if (op(be, arg) != KVQ_OK || be->ops->finish(be) != KVQ_OK) return -1;
  const double wall = bench_now() - t0;
  if (device_clock && be->ops->device_time(be, &ns) == KVQ_OK && ns > 0) return ns * 1e-9;
  return wall;
}

typedef struct copy_arg {
  kvq_buffer *a, *b;
  uint64_t bytes;
  const kvq_side_desc *side; /* for the read pass */
  kvq_buffer *flags;
  uint32_t tokens;
} copy_arg;

static kvq_status do_copy(kvq_backend *be, void *arg) {
  const copy_arg *c = arg;
  return be->ops->buffer_copy(be, c->b, 0, c->a, 0, c->bytes);
}

/* The same copy by a compute kernel: kvq's CONVERT job from fp32 to fp32 over packed words (Vulkan:
 * shaders/copy_words.comp; CUDA: the convert kernel). On NVIDIA's Vulkan driver vkCmdCopyBuffer ran at
 * a fifth of CUDA's copy on the same H200 (849 against 4232 GB/s, 2026-11-27) while kernels read at
 * CUDA's speed: a copy engine's figure alone would make every Vulkan fraction of copy bandwidth 5x too
 * kind. */
static kvq_status do_kernel_copy(kvq_backend *be, void *arg) {
  const copy_arg *c = arg;
  const uint32_t row = 256, rows = (uint32_t)(c->bytes / 4 / row);
  kvq_job_convert job = {.shape = {rows, 1, row}};
  job.src = (kvq_tensor_place){.buffer = c->a, .dtype = KVQ_DTYPE_F32, .strides = {row, row, 1}};
  job.dst = (kvq_tensor_place){.buffer = c->b, .dtype = KVQ_DTYPE_F32, .strides = {row, row, 1}};
  return be->ops->convert(be, &job);
}

/* Best of 3 timed runs of op after a warm-up (page faults, clocks): seconds, or -1 when one failed. */
static double best_of_3(kvq_context *ctx, timed_op op, copy_arg *c, int device_clock) {
  double best = -1;
  for (int rep = 0; rep < 4; rep++) {
    const double t = time_op(ctx, op, c, device_clock);
    if (t <= 0) return -1;
    if (rep > 0 && (best < 0 || t < best)) best = t;
  }
  return best;
}

/* The read-only pass of GPU backends: kvq has no reduction kernel, but its token range check
 * (kvq_job_token_check, for appends of device tensors) reads every element of fp32 tokens and writes
 * one flag word only when one is out of range; over zeros it writes nothing. */
static kvq_status do_read(kvq_backend *be, void *arg) {
  const copy_arg *c = arg;
  const kvq_job_token_check job = {.side = c->side, .dtype = KVQ_DTYPE_F32, .src = c->a, .count = c->tokens,
                                   .flags = c->flags};
  return be->ops->check_tokens(be, &job);
}

/* The CPU backend's buffers are host memory it does not expose: its copy is buffer_copy (memmove)
 * like the others, and its read pass a sum over a host array of the same size, here. */
static double host_read(uint64_t bytes) {
  const size_t n = (size_t)(bytes / sizeof(double));
  double *x = malloc(n * sizeof *x), best = -1;
  if (!x) return -1;
  memset(x, 0, n * sizeof *x);
  volatile double sink = 0;
  for (int rep = 0; rep < 3; rep++) {
    const double t0 = bench_now();
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0; /* four chains: the adds are not the bottleneck */
    for (size_t i = 0; i + 4 <= n; i += 4) s0 += x[i], s1 += x[i + 1], s2 += x[i + 2], s3 += x[i + 3];
    sink = s0 + s1 + s2 + s3;
    const double t = bench_now() - t0;
    if (best < 0 || t < best) best = t;
  }
  (void)sink;
  free(x);
  return best;
}

int bench_measure_copy(kvq_context *ctx, bench_device *dev) {
  kvq_backend *be = ctx->backend;
  copy_arg c = {.bytes = dev->copy_bytes};
  dev->copy_gbs = dev->read_gbs = dev->copy_engine_gbs = dev->copy_kernel_gbs = -1;
  /* named before anything can fail: the header and the JSON print them after a failure too */
  const char *engine = dev->kind == KVQ_BACKEND_VULKAN ? "vkCmdCopyBuffer"
                       : dev->kind == KVQ_BACKEND_CUDA ? "cudaMemcpyAsync"
                                                       : "memmove between two host buffers";
  const char *clock = dev->kind == KVQ_BACKEND_CPU ? "wall clock" : dev->kind == KVQ_BACKEND_CUDA ? "device clock (events)" : "device clock";
  snprintf(dev->copy_how, sizeof dev->copy_how, "%s, %s, best of 3", engine, clock);
  dev->read_how = "not measured";
  if (be->ops->buffer_create(be, c.bytes, &c.a) != KVQ_OK || be->ops->buffer_create(be, c.bytes, &c.b) != KVQ_OK) {
    if (c.a) be->ops->buffer_destroy(be, c.a);
    return 2;
  }
  double best = best_of_3(ctx, do_copy, &c, dev->device_clock);
  if (best > 0) dev->copy_engine_gbs = dev->copy_gbs = 2.0 * c.bytes / best / 1e9;
  if (be->ops->convert && c.bytes / 4 / 256 > 0) {
    const uint64_t whole = c.bytes;
    /* rows of 256 words; where the device is the host (lavapipe, the CUDA emulator) 8 MiB at most:
     * there the copy engine's figure is a host memcpy anyway, and in CI's sanitized build lavapipe
     * ran this kernel at 0.02 GB/s (page faults and TLB shootdowns in the kernel: 27 s for 64 MiB) */
    const uint64_t cap = dev->gpu ? whole : (uint64_t)8 << 20;
    c.bytes = (whole < cap ? whole : cap) / 1024 * 1024;
    best = best_of_3(ctx, do_kernel_copy, &c, dev->device_clock);
    if (best > 0) dev->copy_kernel_gbs = 2.0 * c.bytes / best / 1e9;
    char size[32] = "";
    if (c.bytes != whole) snprintf(size, sizeof size, " over %llu MiB", (unsigned long long)(c.bytes >> 20));
    c.bytes = whole;
    if (dev->copy_kernel_gbs > dev->copy_gbs) dev->copy_gbs = dev->copy_kernel_gbs;
    snprintf(dev->copy_how, sizeof dev->copy_how,
             "the better of %s (%.2f GB/s) and kvq's copy kernel, the fp32 CONVERT job (%.2f GB/s%s), %s, best of 3 each",
             engine, dev->copy_engine_gbs, dev->copy_kernel_gbs, size, clock);
  }
  if (be->ops->check_tokens) {
    /* an exact fp16 side of head_dim 16, one kv head: one invocation per 64-byte vector, the
     * smallest kvq's layouts allow, so that neighbouring invocations read neighbouring bytes */
    kvq_side_desc side = {0};
    const kvq_method_config exact = kvq_method_defaults(KVQ_METHOD_EXACT, 16);
    kvq_side_layout_init(&side.layout, &exact, 16, 16, 1);
    c.side = &side;
    c.tokens = (uint32_t)(c.bytes / 64);
    if (be->ops->buffer_create(be, 16, &c.flags) == KVQ_OK) {
      best = -1;
      for (int rep = 0; rep < 4; rep++) {
        const double t = time_op(ctx, do_read, &c, dev->device_clock);
        if (t <= 0) break;
        if (rep > 0 && (best < 0 || t < best)) best = t;
      }
      if (best > 0) dev->read_gbs = (double)c.tokens * 64 / best / 1e9;
      be->ops->buffer_destroy(be, c.flags);
    }
    dev->read_how = "the token range check job (reads every fp32 element, writes nothing over zeros), device clock, best of 3";
  } else {
    const double t = host_read(c.bytes);
    if (t > 0) dev->read_gbs = c.bytes / t / 1e9;
    dev->read_how = "a sum over a host array (4 chains of adds), wall clock, best of 3";
  }
  be->ops->buffer_destroy(be, c.a);
  be->ops->buffer_destroy(be, c.b);
  return 0;
}
