/*
 * kvq-bench: append throughput and decode attention (fused, scoring alone, weighted sum alone) of
 * every method and the exact caches, over grids of context, batch, GQA and head_dim, on every
 * backend available, with the device's copy bandwidth measured in the same run. This file reads the
 * command line and walks the grid; docs/BENCH.md explains the output.
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "core/internal.h"
#include "method_spec.h"

/* The methods of issue 11's benchmark: the three exact caches, the cuBLAS fp16 baseline (CUDA
 * only) and every compressed method at the settings the targets name (QJL with and without outliers,
 * KIVI-2, PolarQuant 4,2,2,2 and 2,2,2,2 with 2-bit values, CQ at 2 bits). The exact fp16 cache comes
 * first: every speed-up is against it. */
/* Seconds between rewrites of the JSON and CSV during a run (and once at its end). */
#define WRITE_EVERY_S 5.0

static const char *const default_methods[] = {
    "exact-f16/exact-f16",    BENCH_CUBLAS_METHOD,     "exact-bf16/exact-bf16", "exact-f32/exact-f32", "qjl-m256-k8/uniform-b2",
    "qjl-m256-k0/uniform-b2", "uniform-b4/uniform-b4", "kivi-b2/uniform-b2",   "polar-b4222",
    "polar-b2222/uniform-b2", "cq-c4-b8"};

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvq-bench [--quick] [--backend all|cpu|vulkan|cuda[,...]] [--methods K/V,...]\n"
          "                 [--contexts N,...] [--batch N,...] [--gqa N,...] [--head-dim N,...] [--kv-heads N]\n"
          "                 [--page-size N] [--cases append,fused,scores,wsum] [--warmup N] [--samples N]\n"
          "                 [--max-tokens N] [--time-limit S] [--flush-mb N] [--copy-mb N] [--check-bound X]\n"
          "                 [--keep-going] [--json FILE] [--csv FILE] [--plot DIR]\n"
          "Sizes take k and M (1k = 1024 tokens). Without --quick: the standard run, meant for a GPU (contexts\n"
          "1k..1M, batch 1 and 8, GQA 4, head_dim 128, 8 kv heads); --quick: seconds on the CPU and lavapipe.\n"
          "Options override --quick's values wherever they stand. docs/BENCH.md explains every column.\n");
}

static int bad(const char *flag, const char *value, const char *what) {
  fprintf(stderr, "kvq-bench: %s %s: %s (see --help)\n", flag, value ? value : "(missing)", what);
  return 2;
}

/* A positive count with an optional k (x1024) or M (x1048576) suffix. */
static int parse_count(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  if (!s || !isdigit((unsigned char)*s)) return -1;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10), scale = 1;
  if (errno == ERANGE) return -1;
  if (*end == 'k' || *end == 'K') scale = 1024, end++;
  else if (*end == 'M' || *end == 'm') scale = 1024 * 1024, end++;
  /* compared before the multiplication: a wrapped product would pass as a small count */
  if (*end || v == 0 || v > max / scale) return -1;
  v *= scale;
  *out = v;
  return 0;
}

static int parse_list(const char *flag, const char *s, uint64_t max, uint32_t *out, unsigned *n) {
  char buf[512];
  if (!s || strlen(s) >= sizeof buf) return bad(flag, s, "a comma-separated list of positive numbers");
  snprintf(buf, sizeof buf, "%s", s);
  *n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    uint64_t v;
    if (*n == BENCH_MAX_GRID) return bad(flag, s, "at most 16 values");
    if (parse_count(t, max, &v) != 0) return bad(flag, s, "a comma-separated list of positive numbers");
    out[(*n)++] = (uint32_t)v;
  }
  return *n ? 0 : bad(flag, s, "a comma-separated list of positive numbers");
}

static void set_quick(bench_options *o) {
  /* small enough that every method runs on the CPU reference and on lavapipe in seconds, large
   * enough for several pages per sequence and a GQA group */
  o->quick = 1;
  o->grid.contexts[0] = 256, o->grid.n_contexts = 1;
  o->grid.batches[0] = 2, o->grid.n_batches = 1;
  o->grid.gqas[0] = 4, o->grid.n_gqas = 1;
  o->grid.head_dims[0] = 64, o->grid.n_head_dims = 1;
  o->kv_heads = 2;
  o->warmup = 1, o->samples = 3;
}

static void set_standard(bench_options *o) {
  static const uint32_t contexts[] = {1024, 4096, 16384, 65536, 262144, 1048576};
  memset(o, 0, sizeof *o);
  for (unsigned i = 0; i < 6; i++) o->grid.contexts[i] = contexts[i];
  o->grid.n_contexts = 6;
  o->grid.batches[0] = 1, o->grid.batches[1] = 8, o->grid.n_batches = 2;
  o->grid.gqas[0] = 4, o->grid.n_gqas = 1;
  o->grid.head_dims[0] = 128, o->grid.n_head_dims = 1;
  o->kv_heads = 8;
  o->page_size = 32;
  o->warmup = 2, o->samples = 10;
  o->max_tokens = (uint64_t)2 << 20; /* appends of 2M tokens per point: minutes at most on a GPU */
  o->check_bound = 2e-3; /* relative to attention over the dequantized tokens (bench/cases.c) */
  for (unsigned i = 0; i < sizeof default_methods / sizeof *default_methods; i++) o->methods[i] = default_methods[i];
  o->n_methods = sizeof default_methods / sizeof *default_methods;
  for (int c = 0; c < CASE_COUNT; c++) o->cases[c] = 1;
}

static int parse_backends(const char *s, bench_options *o) {
  char buf[64];
  if (!s || strlen(s) >= sizeof buf) return bad("--backend", s, "all, cpu, vulkan, cuda or a comma-separated list");
  snprintf(buf, sizeof buf, "%s", s);
  o->n_backends = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    kvq_backend_kind k;
    if (!strcmp(t, "all")) {
      o->n_backends = 0; /* every backend available, chosen at run time */
      return 0;
    } else if (!strcmp(t, "cpu")) k = KVQ_BACKEND_CPU;
    else if (!strcmp(t, "vulkan")) k = KVQ_BACKEND_VULKAN;
    else if (!strcmp(t, "cuda")) k = KVQ_BACKEND_CUDA;
    else return bad("--backend", s, "all, cpu, vulkan, cuda or a comma-separated list");
    if (o->n_backends < 3) o->backends[o->n_backends++] = k;
  }
  return 0;
}

static int parse_args(int argc, char **argv, bench_options *o, char **methods_buf) {
  set_standard(o);
  for (int i = 1; i < argc; i++) /* --quick first: the options after it refine its grid wherever they stand */
    if (!strcmp(argv[i], "--quick")) set_quick(o);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint64_t n;
    if (!strcmp(a, "--quick")) continue;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    }
    int takes_value = 1, rc = 0;
    if (!strcmp(a, "--keep-going")) {
      o->keep_going = 1;
      continue;
    }
    if (!strcmp(a, "--contexts")) rc = parse_list(a, v, 0x7fffffffu, o->grid.contexts, &o->grid.n_contexts);
    else if (!strcmp(a, "--batch")) rc = parse_list(a, v, 65534, o->grid.batches, &o->grid.n_batches);
    else if (!strcmp(a, "--gqa")) rc = parse_list(a, v, 65536, o->grid.gqas, &o->grid.n_gqas);
    else if (!strcmp(a, "--head-dim")) rc = parse_list(a, v, 256, o->grid.head_dims, &o->grid.n_head_dims);
    else if (!strcmp(a, "--kv-heads") || !strcmp(a, "--page-size") || !strcmp(a, "--warmup") || !strcmp(a, "--samples") ||
             !strcmp(a, "--max-tokens") || !strcmp(a, "--flush-mb") || !strcmp(a, "--copy-mb")) {
      /* --samples: at most the 256 that cases.c keeps per case (more would be run and reported as
       * asked but not counted); --kv-heads: kvq's own limit (core/config.c) */
      const uint64_t max = !strcmp(a, "--max-tokens") ? UINT64_MAX / 2 : !strcmp(a, "--samples") ? 256
                           : !strcmp(a, "--kv-heads") ? 1024 : 1u << 20;
      if (parse_count(v, max, &n) != 0) return bad(a, v, "a positive number (k and M suffixes allowed) within its limit");
      if (!strcmp(a, "--kv-heads")) o->kv_heads = (uint32_t)n;
      else if (!strcmp(a, "--page-size")) o->page_size = (uint32_t)n;
      else if (!strcmp(a, "--warmup")) o->warmup = (uint32_t)n;
      else if (!strcmp(a, "--samples")) o->samples = (uint32_t)n;
      else if (!strcmp(a, "--max-tokens")) o->max_tokens = n;
      else if (!strcmp(a, "--flush-mb")) o->flush_bytes = n << 20;
      else o->copy_bytes = n << 20;
    } else if (!strcmp(a, "--time-limit")) {
      char *end;
      o->time_limit = v ? strtod(v, &end) : 0;
      if (!v || *end || !(o->time_limit > 0)) return bad(a, v, "a positive number of seconds");
    } else if (!strcmp(a, "--check-bound")) {
      char *end;
      o->check_bound = v ? strtod(v, &end) : 0;
      if (!v || *end || !(o->check_bound > 0)) return bad(a, v, "a positive relative error");
    } else if (!strcmp(a, "--methods")) {
      if (!v || !*v) return bad(a, v, "a comma-separated list of KEYS/VALUES methods");
      free(*methods_buf);
      *methods_buf = strdup(v);
      o->n_methods = 0;
      for (char *save = NULL, *t = strtok_r(*methods_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_methods == BENCH_MAX_METHODS) return bad(a, v, "at most 32 methods");
        o->methods[o->n_methods++] = t;
      }
      if (!o->n_methods) return bad(a, v, "a comma-separated list of KEYS/VALUES methods");
    } else if (!strcmp(a, "--cases")) {
      char buf[128];
      if (!v || strlen(v) >= sizeof buf) return bad(a, v, "a list of append, fused, scores, wsum");
      snprintf(buf, sizeof buf, "%s", v);
      for (int c = 0; c < CASE_COUNT; c++) o->cases[c] = 0;
      for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int c = 0;
        while (c < CASE_COUNT && strcmp(t, bench_case_names[c])) c++;
        if (c == CASE_COUNT) return bad(a, v, "a list of append, fused, scores, wsum");
        o->cases[c] = 1;
      }
    } else if (!strcmp(a, "--backend")) rc = parse_backends(v, o);
    else if (!strcmp(a, "--json") || !strcmp(a, "--csv") || !strcmp(a, "--plot")) {
      if (!v || !*v || v[0] == '-') return bad(a, v, !strcmp(a, "--plot") ? "a directory" : "a file name");
      if (!strcmp(a, "--json")) o->json = v;
      else if (!strcmp(a, "--csv")) o->csv = v;
      else o->plot = v;
    } else {
      fprintf(stderr, "kvq-bench: unknown option '%s' (see --help)\n", a);
      return 2;
    }
    if (rc) return rc;
    i += takes_value;
  }
  /* query heads are kv heads x GQA, a 32-bit product kvq bounds at 65536 (core/config.c): checked
   * here, where a wrapped product would reach kvq as a small, wrong head count */
  for (unsigned i = 0; i < o->grid.n_gqas; i++)
    if ((uint64_t)o->kv_heads * o->grid.gqas[i] > 65536) return bad("--gqa", "", "kv heads x GQA above 65536 query heads");
  for (unsigned i = 0; i < o->grid.n_head_dims; i++)
    if (o->grid.head_dims[i] % 16 || o->grid.head_dims[i] < 16)
      return bad("--head-dim", "", "head_dim must be a multiple of 16 from 16 to 256");
  /* method names are read before anything runs: a typo must not cost a long run's first hour */
  for (unsigned m = 0; m < o->n_methods; m++) {
    kvq_method_config keys, values;
    if (!strcmp(o->methods[m], BENCH_CUBLAS_METHOD)) continue;
    if (kvq_parse_layer_spec(o->methods[m], strlen(o->methods[m]), o->grid.head_dims[0], &keys, &values) != 0)
      return bad("--methods", o->methods[m], "not a method name of kvq eval (docs/EVAL.md)");
  }
  return 0;
}

/* --keep-going, after a method's run failed at a point (wrong output, a failed call; the message is
 * above): the row of the case that failed, the last one the run added (cases.c adds a case's row as it
 * starts it), is no result and becomes a skipped row saying so; the cases it did not reach get skipped
 * rows too, so that the table shows every case. Rows of cases that passed keep their figures. */
static int mark_failed(bench_results *res, size_t first, const bench_options *o, const bench_device *dev,
                       const bench_point *p, const char *method) {
  if (res->count > first && !res->rows[res->count - 1].skipped) {
    bench_row *r = &res->rows[res->count - 1];
    r->skipped = 1;
    snprintf(r->note, sizeof r->note, "FAILED: the message above; --keep-going went on");
  }
  const size_t added = res->count;
  for (int c = 0; c < CASE_COUNT; c++) {
    int seen = !o->cases[c];
    for (size_t i = first; i < added && !seen; i++) seen = res->rows[i].kase == (bench_case)c;
    if (seen) continue;
    bench_row *r = bench_add_row(res);
    if (!r) return 2;
    *r = (bench_row){.dev = dev, .method = method, .kase = (bench_case)c, .context = p->context, .batch = p->batch,
                     .query_heads = p->query_heads, .kv_heads = p->kv_heads, .head_dim = p->head_dim,
                     .bits = added > first ? res->rows[first].bits : 0, .skipped = 1, .error = -1, .check = "-",
                     .plan = "-"};
    snprintf(r->note, sizeof r->note, "not run: an earlier step of this method failed here");
  }
  return 0;
}

/* A context per backend asked for (or every available one): its device, clock and bandwidth. */
static int open_device(kvq_backend_kind kind, int explicit, const bench_options *o, kvq_context **ctx, bench_device *dev) {
  kvq_backend_info infos[8];
  size_t count = 0;
  kvq_backends_list(infos, 8, &count);
  const kvq_backend_info *info = NULL;
  for (size_t i = 0; i < count && i < 8; i++)
    if (infos[i].kind == kind) info = &infos[i];
  if (!info || info->availability != KVQ_AVAILABLE) {
    fprintf(stderr, "kvq-bench: backend %s unavailable: %s\n",
            kind == KVQ_BACKEND_CPU ? "cpu" : kind == KVQ_BACKEND_VULKAN ? "vulkan" : "cuda", info ? info->reason : "unknown");
    return explicit ? 2 : 1;
  }
  kvq_context_options copt = kvq_context_options_default();
  copt.backend = kind;
  if (kvq_context_create(&copt, ctx) != KVQ_OK) {
    fprintf(stderr, "kvq-bench: backend %s: cannot create a context\n", info->name);
    return explicit ? 2 : 1;
  }
  memset(dev, 0, sizeof *dev);
  dev->kind = kind;
  dev->backend = kind == KVQ_BACKEND_CPU ? "cpu" : kind == KVQ_BACKEND_VULKAN ? "vulkan" : "cuda";
  snprintf(dev->device, sizeof dev->device, "%s", (*ctx)->backend->device[0] ? (*ctx)->backend->device : info->device);
  uint64_t ns;
  dev->device_clock = kvq_context_device_time(*ctx, &ns) == KVQ_OK;
  /* lavapipe's device memory is host memory and its "kernels" run on the CPU: it is sized like the
   * CPU, as is kvq's CUDA emulator (KVQ_CUDA_EMULATOR=1, tests only), whose copy kernel of 1 GiB
   * would take a minute */
  dev->gpu = kind != KVQ_BACKEND_CPU && !strstr(dev->device, "llvmpipe") && !strstr(dev->device, "emulator");
  dev->copy_bytes = o->copy_bytes ? o->copy_bytes : dev->gpu ? (uint64_t)1 << 30 : o->quick ? (uint64_t)64 << 20 : (uint64_t)256 << 20;
  /* >= 4x an H100's or H200's 50 MiB L2 on a GPU; > 100 MB through the host's caches elsewhere */
  dev->flush_bytes = o->flush_bytes ? o->flush_bytes : dev->gpu ? (uint64_t)256 << 20 : (uint64_t)128 << 20;
  /* each is one buffer, so at most the device's largest (lavapipe's maxStorageBufferRange is 128 MiB,
   * below the 256 MiB copy above): cut to it, saying so, rather than failing the run */
  const uint64_t largest = (*ctx)->backend->max_buffer_bytes & ~(((uint64_t)1 << 20) - 1);
  uint64_t *sizes[2] = {&dev->copy_bytes, &dev->flush_bytes};
  for (int i = 0; i < 2; i++)
    if (largest && *sizes[i] > largest) {
      fprintf(stderr, "kvq-bench: %s: the %s buffer cut from %llu to %llu MiB, this device's largest buffer\n",
              dev->backend, i ? "cold-cache" : "copy", (unsigned long long)(*sizes[i] >> 20),
              (unsigned long long)(largest >> 20));
      *sizes[i] = largest;
    }
  return 0;
}

int main(int argc, char **argv) {
  bench_options o;
  char *methods_buf = NULL;
  int rc = parse_args(argc, argv, &o, &methods_buf);
  if (rc) return rc;
  const int all = o.n_backends == 0;
  if (all) {
    o.backends[0] = KVQ_BACKEND_CPU, o.backends[1] = KVQ_BACKEND_VULKAN, o.backends[2] = KVQ_BACKEND_CUDA;
    o.n_backends = 3;
  }
  bench_results res = {0};
  o.started = bench_now();
  const size_t total = (size_t)o.n_backends * o.n_methods * o.grid.n_contexts * o.grid.n_batches * o.grid.n_gqas *
                       o.grid.n_head_dims;
  size_t done = 0;
  unsigned failures = 0; /* method runs that failed under --keep-going */
  double written = o.started;
  const int tty = isatty(2);
  for (unsigned b = 0; b < o.n_backends && rc == 0; b++) {
    kvq_context *ctx = NULL;
    bench_device *dev = &res.devices[res.n_devices];
    const int opened = open_device(o.backends[b], !all, &o, &ctx, dev);
    if (opened == 1) {
      done += total / o.n_backends;
      continue;
    }
    if (opened) {
      rc = 2;
      break;
    }
    res.n_devices++;
    bench_cold *cold = NULL;
    fprintf(stderr, "kvq-bench: %s (%s): measuring copy bandwidth over %llu MiB\n", dev->backend, dev->device,
            (unsigned long long)(dev->copy_bytes >> 20));
    if (bench_measure_copy(ctx, dev) != 0 || bench_cold_create(ctx, dev->flush_bytes, &cold) != 0) {
      fprintf(stderr, "kvq-bench: %s: cannot allocate the copy buffers (2 x %llu MiB) or the cold-cache buffer (%llu "
              "MiB) on this device\n", dev->backend, (unsigned long long)(dev->copy_bytes >> 20),
              (unsigned long long)(dev->flush_bytes >> 20));
      rc = 2;
    }
    for (unsigned hd = 0; hd < o.grid.n_head_dims && rc == 0; hd++)
      for (unsigned g = 0; g < o.grid.n_gqas && rc == 0; g++)
        for (unsigned bt = 0; bt < o.grid.n_batches && rc == 0; bt++)
          for (unsigned c = 0; c < o.grid.n_contexts && rc == 0; c++) {
            const bench_point p = {.context = o.grid.contexts[c], .batch = o.grid.batches[bt],
                                   .query_heads = o.kv_heads * o.grid.gqas[g], .kv_heads = o.kv_heads,
                                   .head_dim = o.grid.head_dims[hd]};
            const size_t point_first = res.count; /* this point's rows: every method's, together */
            for (unsigned m = 0; m < o.n_methods && rc == 0; m++) {
              fprintf(stderr, "%s[%zu/%zu] %s %s context %u batch %u gqa %u d %u%s", tty ? "\r\033[K" : "", ++done, total,
                      dev->backend, o.methods[m], p.context, p.batch, o.grid.gqas[g], p.head_dim, tty ? "" : "\n");
              const size_t method_first = res.count;
              rc = bench_run_method(ctx, &o, dev, cold, &p, o.methods[m], &res);
              if (rc != 0 && o.keep_going) { /* its rows are no result; the run goes on, exits 2 at its end */
                failures++;
                rc = mark_failed(&res, method_first, &o, dev, &p, o.methods[m]);
              }
              /* the point's speed-ups once all its methods ran (whichever order --methods gave), a
               * failed run's partial point included: the files below and at the end show them */
              if (rc != 0 || m + 1 == o.n_methods) bench_fill_speedups(&res, point_first);
              /* the files every few seconds, not after every point (each write is the whole file:
               * per point, a long grid's cost grew with the square of its rows); a run cut short by a
               * time limit (scripts/gpu-check.sh) still leaves what it measured until then */
              if (bench_now() - written >= WRITE_EVERY_S) {
                if (o.json) bench_write_json(o.json, &res, &o);
                if (o.csv) bench_write_csv(o.csv, &res);
                written = bench_now();
              }
            }
          }
    if (tty) fprintf(stderr, "\n");
    bench_cold_destroy(cold);
    kvq_context_destroy(ctx);
  }
  if (rc == 0 && failures) {
    fprintf(stderr, "kvq-bench: %u method run%s failed (--keep-going went on; each failure is above, its rows are "
            "marked failed)\n", failures, failures == 1 ? "" : "s");
    rc = 2;
  }
  if (rc == 0 && res.n_devices == 0) {
    fprintf(stderr, "kvq-bench: no backend available\n");
    rc = 2;
  }
  for (unsigned d = 0; d < res.n_devices; d++) {
    bench_print_header(stdout, &res.devices[d], &o);
    for (size_t i = 0; i < res.count; i++)
      if (res.rows[i].dev == &res.devices[d]) bench_print_row(stdout, &res.rows[i]);
  }
  /* the files are written even after a failure: they hold what ran, and the failure is the exit status */
  if (o.json && bench_write_json(o.json, &res, &o) != 0) rc = 2;
  if (o.csv && bench_write_csv(o.csv, &res) != 0) rc = 2;
  if (o.plot && res.count && bench_write_plots(o.plot, &res) != 0) rc = 2;
  free(res.rows);
  free(methods_buf);
  return rc;
}
