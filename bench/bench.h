/*
 * kvq-bench's pieces (docs/BENCH.md): options and grids (main.c), clocks, statistics, the cold cache
 * and the copy bandwidth (clock.c), the cases themselves (cases.c), the checks of their results
 * (check.c) and the table, JSON, CSV and plots (report.c).
 *
 * The bench links kvq's internal library: the public API has no device copy, no way to time the
 * scoring or the weighted sum alone and no view of the attention plan's scratch, and a benchmark
 * that cannot see them cannot say where the time goes (core/internal.h, KVQ_BENCH_JOBS_*).
 */
#ifndef KVQ_BENCH_BENCH_H
#define KVQ_BENCH_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvq/kvq.h"

#define BENCH_MAX_GRID 16
#define BENCH_MAX_METHODS 32
/* The method name of the cuBLAS fp16 baseline (CUDA only: bench/cublas_baseline.h). */
#define BENCH_CUBLAS_METHOD "cublas-f16"

/* The cases of one (method, grid point). */
typedef enum bench_case {
  CASE_APPEND = 0, /* quantizing: tokens appended and flushed */
  CASE_FUSED,      /* decode attention as kvq_attention runs it (the fused job where the backend has one) */
  CASE_SCORES,     /* query preparation and scoring alone */
  CASE_WSUM,       /* the weighted sum of values alone, over probabilities already in scratch */
  CASE_COUNT
} bench_case;

extern const char *const bench_case_names[CASE_COUNT];

typedef struct bench_grid {
  uint32_t contexts[BENCH_MAX_GRID], batches[BENCH_MAX_GRID], gqas[BENCH_MAX_GRID], head_dims[BENCH_MAX_GRID];
  unsigned n_contexts, n_batches, n_gqas, n_head_dims;
} bench_grid;

typedef struct bench_options {
  bench_grid grid;
  uint32_t kv_heads, page_size, warmup, samples;
  uint64_t max_tokens;                  /* batch x context above it is skipped (append time) */
  const char *methods[BENCH_MAX_METHODS];
  unsigned n_methods;
  int cases[CASE_COUNT];                /* which cases run */
  kvq_backend_kind backends[3];
  unsigned n_backends;
  int quick;
  const char *json, *csv, *plot;
  uint64_t flush_bytes;                 /* 0: chosen per device (clock.c) */
  uint64_t copy_bytes;                  /* 0: chosen per device */
  double check_bound;                   /* relative error of an output against attention over the cache's tokens */
  int keep_going;                        /* a method that fails at a point: its rows marked failed, the run goes on */
  double time_limit;                    /* seconds: points not started by then are skipped rows (0: none) */
  double started;                       /* bench_now() at the start */
} bench_options;

/* Repeated samples of one quantity, in seconds. */
typedef struct bench_stats {
  double median, min, max, q1, q3;
  unsigned count;
} bench_stats;

/* What one backend is and what it can copy. */
typedef struct bench_device {
  kvq_backend_kind kind;
  const char *backend;    /* "cpu", "vulkan", "cuda" */
  char device[256];       /* kvq_backend_info.device */
  int gpu;                /* a real GPU (not the CPU backend, not lavapipe): GiB-sized copies, 256 MiB flushes */
  int device_clock;       /* the backend has kvq_context_device_time */
  uint64_t copy_bytes;    /* buffer size of the bandwidth figures */
  double copy_gbs;        /* device-to-device copy: bytes read plus bytes written per second / 1e9, the
                           * better of the two below (the reference of every "of cp" figure) */
  double copy_engine_gbs; /* the backend's buffer copy (vkCmdCopyBuffer, cudaMemcpyAsync, memmove); <0: none */
  double copy_kernel_gbs; /* kvq's own copy kernel (the CONVERT job, fp32 to fp32); <0: none */
  double read_gbs;        /* read-only pass over copy_bytes / second / 1e9 (<0: not measured) */
  char copy_how[256];     /* what was measured, in words (both copies, with their figures) */
  const char *read_how;   /* how the read pass was measured, in words */
  uint64_t flush_bytes;   /* written between samples to push the cases' data out of the caches */
} bench_device;

/* One row of the results. */
typedef struct bench_row {
  const bench_device *dev;
  const char *method;
  bench_case kase;
  uint32_t context, batch, query_heads, kv_heads, head_dim;
  double bits;
  int skipped;                  /* the row did not run: `note` says why */
  char note[256];
  const char *plan;             /* "fused", "unfused", "score", "weighted sum", "quantize" */
  bench_stats wall, device;     /* per call; device.count 0 when the backend has no clock */
  uint64_t read_bytes;          /* what the jobs must read: compressed pages and window (or fp32 input, append) */
  uint64_t scratch_write, scratch_read; /* estimated from the GPU attention plan (core/gpu_plan.h) */
  double gbs;                   /* read_bytes / time (device time where there is one) */
  double of_copy;               /* gbs / the device's copy bandwidth (bytes read + written per second) */
  double speedup;               /* the exact fp16 cache's time / this time, same case and point; 0: none */
  double tokens_per_s;          /* append */
  double error;                 /* relative L2 error of the output against the reference; <0: not checked */
  const char *check;            /* what the result was checked against */
} bench_row;

typedef struct bench_results {
  bench_row *rows;
  size_t count, capacity;
  bench_device devices[3];
  unsigned n_devices;
} bench_results;

/* clock.c */
double bench_now(void);
void bench_stats_of(double *samples, unsigned count, bench_stats *out);
typedef struct bench_cold bench_cold;
/* The cold cache: `bytes` written between samples (a device buffer of the context's backend). */
int bench_cold_create(kvq_context *ctx, uint64_t bytes, bench_cold **out);
int bench_cold_flush(bench_cold *cold);
void bench_cold_destroy(bench_cold *cold);
/* Copy and read bandwidth of the context's device into dev (copy_bytes, copy_gbs, read_gbs, *_how). */
int bench_measure_copy(kvq_context *ctx, bench_device *dev);

/* cases.c: every case of one method at one grid point, rows appended to results. Returns 0, or 2 on
 * a failure that is kvq's (the run then fails: a benchmark of wrong work is worthless). */
typedef struct bench_point {
  uint32_t context, batch, query_heads, kv_heads, head_dim;
} bench_point;
int bench_run_method(kvq_context *ctx, const bench_options *o, const bench_device *dev, bench_cold *cold,
                     const bench_point *p, const char *method, bench_results *res);

/* check.c */
/* The fp32 attention of one query [Hq][d] over `context` tokens that repeat the synthetic chunk
 * [chunk][Hkv][d] (what cases.c appends): out [Hq][d]. */
void bench_reference(const float *k, const float *v, uint32_t chunk, const float *q, const bench_point *p, float *out);
/* Relative L2 error of out against ref (n floats); a non-finite out gives +infinity. */
double bench_relative_error(const float *out, const float *ref, size_t n);
/* The worst relative error of `batch` outputs of `per` floats each against one reference (every
 * sequence of a point runs the same query over the same tokens); NaN when any is NaN. */
double bench_worst_error(const float *out, const float *ref, size_t per, uint32_t batch);
/* The synthetic data a point's cases run on: keys and values of `chunk` tokens and one query. */
int bench_synth(const bench_point *p, uint32_t chunk, float **k, float **v, float **q);

/* report.c */
bench_row *bench_add_row(bench_results *res);
/* The speed-ups of the rows from `first` on: one grid point's, every method of it finished. */
void bench_fill_speedups(bench_results *res, size_t first);
void bench_print_header(FILE *f, const bench_device *dev, const bench_options *o);
void bench_print_row(FILE *f, const bench_row *r);
int bench_write_json(const char *path, const bench_results *res, const bench_options *o);
int bench_write_csv(const char *path, const bench_results *res);
int bench_write_plots(const char *dir, const bench_results *res);

#endif
