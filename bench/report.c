/*
 * The results as people and programs read them: a table on stdout, JSON (--json), CSV (--csv) and
 * PNG plots through gnuplot (--plot). Every column is explained in docs/BENCH.md.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench.h"

const char *const bench_case_names[CASE_COUNT] = {"append", "fused", "scores", "wsum"};

bench_row *bench_add_row(bench_results *res) {
  if (res->count == res->capacity) {
    const size_t cap = res->capacity ? 2 * res->capacity : 64;
    bench_row *rows = realloc(res->rows, cap * sizeof *rows);
    if (!rows) return NULL;
    res->rows = rows, res->capacity = cap;
  }
  return &res->rows[res->count++];
}

static double seconds(const bench_row *r) { return r->device.count ? r->device.median : r->wall.median; }

static int same_point(const bench_row *a, const bench_row *b) {
  return a->dev == b->dev && a->kase == b->kase && a->context == b->context && a->batch == b->batch &&
         a->query_heads == b->query_heads && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim;
}

/* Speed-up over kvq's exact fp16 cache (both sides exact-f16) at the same point and case: its
 * time over this row's (appends: this row's tokens/s over its). Called once per grid point, over
 * that point's rows (main.c runs every method of a point before the next point, so they lie
 * together): the exact-f16 row of each case is found in one pass and every row looks its case up,
 * linear in the point's rows whatever the method order, where a search over all rows for every row
 * made long grids quadratic. */
void bench_fill_speedups(bench_results *res, size_t first) {
  const bench_row *fp16[CASE_COUNT] = {0};
  for (size_t i = first; i < res->count; i++) {
    const bench_row *f = &res->rows[i];
    if (!f->skipped && !strcmp(f->method, "exact-f16/exact-f16")) fp16[f->kase] = f;
  }
  for (size_t i = first; i < res->count; i++) {
    bench_row *r = &res->rows[i];
    const bench_row *f = fp16[r->kase];
    r->speedup = !r->skipped && f && same_point(r, f) && seconds(r) > 0 ? seconds(f) / seconds(r) : 0;
  }
}

void bench_print_header(FILE *f, const bench_device *d, const bench_options *o) {
  fprintf(f, "\nkvq-bench %s: backend %s, device %s\n", kvq_version(), d->backend, d->device);
  fprintf(f, "copy bandwidth %.2f GB/s (read + write, %llu MiB: %s)\n", d->copy_gbs,
          (unsigned long long)(d->copy_bytes >> 20), d->copy_how);
  if (d->read_gbs > 0) fprintf(f, "read bandwidth %.2f GB/s (%s)\n", d->read_gbs, d->read_how);
  fprintf(f, "%u warm-up + %u samples per case, %llu MiB written between samples, times: %s\n", o->warmup, o->samples,
          (unsigned long long)(d->flush_bytes >> 20),
          d->device_clock ? "device clock (kernel ms), wall clock (call ms)" : "wall clock only (no device clock)");
  fprintf(f, "%-24s %-6s %7s %5s %5s %4s %6s %-12s %9s %17s %9s %9s %8s %8s %8s %7s %6s %10s %7s\n", "keys/values", "case",
          "context", "batch", "Hq/kv", "d", "bits", "plan", "call ms", "call min..max", "kernel ms", "kernel IQR",
          "read MB", "scr W MB", "scr R MB", "GB/s", "of cp", "x fp16", "error");
}

void bench_print_row(FILE *f, const bench_row *r) {
  char hq[16], range[40], iqr[24], speed[16], err[16];
  snprintf(hq, sizeof hq, "%u/%u", r->query_heads, r->kv_heads);
  if (r->skipped) {
    fprintf(f, "%-24s %-6s %7u %5u %5s %4u %6.3f skipped: %s\n", r->method, bench_case_names[r->kase], r->context,
            r->batch, hq, r->head_dim, r->bits, r->note);
    return;
  }
  snprintf(range, sizeof range, "%.3f..%.3f", r->wall.min * 1e3, r->wall.max * 1e3);
  if (r->device.count) snprintf(iqr, sizeof iqr, "%.3f", (r->device.q3 - r->device.q1) * 1e3);
  else snprintf(iqr, sizeof iqr, "-");
  if (r->kase == CASE_APPEND) snprintf(speed, sizeof speed, "%.0f t/s", r->tokens_per_s);
  else if (r->speedup > 0) snprintf(speed, sizeof speed, "%.2f", r->speedup);
  else snprintf(speed, sizeof speed, "-");
  if (r->error >= 0) snprintf(err, sizeof err, "%.4f", r->error);
  else snprintf(err, sizeof err, "-");
  fprintf(f, "%-24s %-6s %7u %5u %5s %4u %6.3f %-12s %9.3f %17s %9.3f %9s %8.2f %8.2f %8.2f %7.3f %6.4f %10s %7s\n", r->method,
          bench_case_names[r->kase], r->context, r->batch, hq, r->head_dim, r->bits, r->plan, r->wall.median * 1e3,
          range, r->device.count ? r->device.median * 1e3 : -1.0, iqr, r->read_bytes / 1e6, r->scratch_write / 1e6,
          r->scratch_read / 1e6, r->gbs, r->of_copy, speed, err);
}

/* JSON strings: kvq's own names and device strings, escaped all the same. */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

/* JSON has no infinity or NaN: they are written as null. */
static void json_number(FILE *f, double x) {
  if (isfinite(x)) fprintf(f, "%.6g", x);
  else fputs("null", f);
}

static void json_stats(FILE *f, const char *name, const bench_stats *s) {
  fprintf(f, "\"%s\": ", name);
  if (!s->count) {
    fputs("null", f);
    return;
  }
  fprintf(f, "{\"median_ms\": ");
  json_number(f, s->median * 1e3);
  fprintf(f, ", \"min_ms\": ");
  json_number(f, s->min * 1e3);
  fprintf(f, ", \"max_ms\": ");
  json_number(f, s->max * 1e3);
  fprintf(f, ", \"q1_ms\": ");
  json_number(f, s->q1 * 1e3);
  fprintf(f, ", \"q3_ms\": ");
  json_number(f, s->q3 * 1e3);
  fprintf(f, ", \"samples\": %u}", s->count);
}

/* The host's processor and its current clock, where /proc says (Linux). */
static void host_cpu(char *model, size_t size, double *mhz) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  snprintf(model, size, "unknown");
  *mhz = -1;
  while (f && fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (!colon) continue;
    char *value = colon + 1 + (colon[1] == ' ');
    value[strcspn(value, "\n")] = 0;
    if (!strncmp(line, "model name", 10) && !strcmp(model, "unknown")) snprintf(model, size, "%s", value);
    if (!strncmp(line, "cpu MHz", 7) && *mhz < 0) *mhz = atof(value);
  }
  if (f) fclose(f);
}

/* The GPU driver, where the system says without asking the backend: NVIDIA's kernel module writes its
 * version to /proc; other drivers (Mesa's lavapipe among them) are named only by the device string. */
static void driver_of(const bench_device *d, char *out, size_t size) {
  snprintf(out, size, "%s", d->kind == KVQ_BACKEND_CPU ? "none (host)" : "not readable (see the device string)");
  if (d->kind == KVQ_BACKEND_CPU) return;
  FILE *f = fopen("/proc/driver/nvidia/version", "r");
  char line[256];
  if (f && fgets(line, sizeof line, f) && strstr(d->device, "llvmpipe") == NULL) {
    line[strcspn(line, "\n")] = 0;
    snprintf(out, size, "%s", line);
  }
  if (f) fclose(f);
}

/* An output file, opened for writing, and the host's processor that both files record. */
static FILE *open_output(const char *path, char *cpu, size_t size, double *mhz) {
  FILE *f = fopen(path, "w");
  if (!f) fprintf(stderr, "kvq-bench: cannot write %s: %s\n", path, strerror(errno));
  else host_cpu(cpu, size, mhz);
  return f;
}

int bench_write_json(const char *path, const bench_results *res, const bench_options *o) {
  char cpu[256];
  double mhz;
  FILE *f = open_output(path, cpu, sizeof cpu, &mhz);
  if (!f) return 2;
  fprintf(f, "{\n  \"kvq_version\": ");
  json_string(f, kvq_version());
  fprintf(f, ",\n  \"mode\": \"%s\",\n  \"host_cpu\": ", o->quick ? "quick" : "standard");
  json_string(f, cpu);
  fprintf(f, ",\n  \"host_cpu_mhz\": ");
  json_number(f, mhz);
  fprintf(f, ",\n  \"warmup\": %u,\n  \"samples\": %u,\n  \"page_size\": %u,\n  \"devices\": [", o->warmup, o->samples,
          o->page_size);
  for (unsigned i = 0; i < res->n_devices; i++) {
    const bench_device *d = &res->devices[i];
    fprintf(f, "%s\n    {\"backend\": ", i ? "," : "");
    json_string(f, d->backend);
    fprintf(f, ", \"device\": ");
    json_string(f, d->device);
    char driver[256];
    driver_of(d, driver, sizeof driver);
    fprintf(f, ", \"driver\": ");
    json_string(f, driver);
    fprintf(f, ", \"gpu\": %s, \"device_clock\": %s, \"copy_bytes\": %llu, \"copy_gb_per_s\": ", d->gpu ? "true" : "false",
            d->device_clock ? "true" : "false", (unsigned long long)d->copy_bytes);
    json_number(f, d->copy_gbs > 0 ? d->copy_gbs : NAN); /* -1: the copy failed or was not timed */
    fprintf(f, ", \"copy_engine_gb_per_s\": ");
    json_number(f, d->copy_engine_gbs > 0 ? d->copy_engine_gbs : NAN);
    fprintf(f, ", \"copy_kernel_gb_per_s\": ");
    json_number(f, d->copy_kernel_gbs > 0 ? d->copy_kernel_gbs : NAN); /* null: no copy kernel (CPU backend) */
    fprintf(f, ", \"read_gb_per_s\": ");
    json_number(f, d->read_gbs > 0 ? d->read_gbs : NAN);
    fprintf(f, ", \"copy_how\": ");
    json_string(f, d->copy_how);
    fprintf(f, ", \"read_how\": ");
    json_string(f, d->read_how);
    fprintf(f, ", \"flush_bytes\": %llu}", (unsigned long long)d->flush_bytes);
  }
  fprintf(f, "\n  ],\n  \"rows\": [");
  for (size_t i = 0; i < res->count; i++) {
    const bench_row *r = &res->rows[i];
    fprintf(f, "%s\n    {\"backend\": ", i ? "," : "");
    json_string(f, r->dev->backend);
    fprintf(f, ", \"method\": ");
    json_string(f, r->method);
    fprintf(f, ", \"case\": \"%s\", \"context\": %u, \"batch\": %u, \"query_heads\": %u, \"kv_heads\": %u, "
               "\"head_dim\": %u, \"bits\": ",
            bench_case_names[r->kase], r->context, r->batch, r->query_heads, r->kv_heads, r->head_dim);
    json_number(f, r->bits);
    if (r->skipped) {
      fprintf(f, ", \"skipped\": ");
      json_string(f, r->note);
      fputc('}', f);
      continue;
    }
    fprintf(f, ", \"plan\": ");
    json_string(f, r->plan);
    fprintf(f, ", ");
    json_stats(f, "call", &r->wall);
    fprintf(f, ", ");
    json_stats(f, "kernel", &r->device);
    fprintf(f, ", \"read_bytes\": %llu, \"scratch_write_bytes\": %llu, \"scratch_read_bytes\": %llu, \"gb_per_s\": ",
            (unsigned long long)r->read_bytes, (unsigned long long)r->scratch_write, (unsigned long long)r->scratch_read);
    json_number(f, r->gbs);
    fprintf(f, ", \"fraction_of_copy\": ");
    json_number(f, r->of_copy >= 0 ? r->of_copy : NAN); /* -1: no copy bandwidth was measured */
    fprintf(f, ", \"speedup_over_fp16\": ");
    json_number(f, r->speedup > 0 ? r->speedup : NAN);
    fprintf(f, ", \"tokens_per_s\": ");
    json_number(f, r->kase == CASE_APPEND ? r->tokens_per_s : NAN);
    fprintf(f, ", \"relative_error\": ");
    json_number(f, r->error >= 0 ? r->error : NAN);
    fprintf(f, ", \"checked_against\": ");
    json_string(f, r->check);
    fputc('}', f);
  }
  fprintf(f, "\n  ]\n}\n");
  return fclose(f) == 0 ? 0 : 2;
}

/* CSV fields: numbers as they are; text quoted, with quotes doubled (RFC 4180). */
static void csv_text(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

int bench_write_csv(const char *path, const bench_results *res) {
  char cpu[256], drivers[3][256];
  double mhz;
  FILE *f = open_output(path, cpu, sizeof cpu, &mhz);
  if (!f) return 2;
  /* once per device, not per line: the file is rewritten every few seconds of a long run */
  for (unsigned d = 0; d < res->n_devices && d < 3; d++) driver_of(&res->devices[d], drivers[d], sizeof drivers[d]);
  fprintf(f, "kvq_version,backend,device,driver,host_cpu,host_cpu_mhz,copy_gb_per_s,method,case,context,batch,query_heads,"
             "kv_heads,head_dim,bits,plan,call_median_ms,call_min_ms,call_max_ms,kernel_median_ms,kernel_q1_ms,"
             "kernel_q3_ms,read_bytes,scratch_write_bytes,scratch_read_bytes,gb_per_s,fraction_of_copy,"
             "speedup_over_fp16,tokens_per_s,relative_error,skipped\n");
  for (size_t i = 0; i < res->count; i++) {
    const bench_row *r = &res->rows[i];
    csv_text(f, kvq_version());
    fputc(',', f);
    csv_text(f, r->dev->backend);
    fputc(',', f);
    csv_text(f, r->dev->device);
    fputc(',', f);
    csv_text(f, drivers[r->dev - res->devices]);
    fputc(',', f);
    csv_text(f, cpu);
    fprintf(f, ",%.0f,%.4f,", mhz, r->dev->copy_gbs);
    csv_text(f, r->method);
    fprintf(f, ",%s,%u,%u,%u,%u,%u,%.4f,", bench_case_names[r->kase], r->context, r->batch, r->query_heads, r->kv_heads,
            r->head_dim, r->bits);
    if (r->skipped) {
      fprintf(f, ",,,,,,,,,,,,,,,");
      csv_text(f, r->note);
      fputc('\n', f);
      continue;
    }
    csv_text(f, r->plan);
    fprintf(f, ",%.6f,%.6f,%.6f,", r->wall.median * 1e3, r->wall.min * 1e3, r->wall.max * 1e3);
    if (r->device.count)
      fprintf(f, "%.6f,%.6f,%.6f,", r->device.median * 1e3, r->device.q1 * 1e3, r->device.q3 * 1e3);
    else
      fprintf(f, ",,,");
    fprintf(f, "%llu,%llu,%llu,%.6f,", (unsigned long long)r->read_bytes, (unsigned long long)r->scratch_write,
            (unsigned long long)r->scratch_read, r->gbs);
    if (r->of_copy >= 0) fprintf(f, "%.6f", r->of_copy); /* empty, as in the JSON's null, without a copy bandwidth */
    fputc(',', f);
    if (r->speedup > 0) fprintf(f, "%.4f", r->speedup);
    fputc(',', f);
    if (r->kase == CASE_APPEND) fprintf(f, "%.1f", r->tokens_per_s);
    fputc(',', f);
    if (r->error >= 0 && isfinite(r->error)) fprintf(f, "%.6f", r->error);
    fprintf(f, ",\n");
  }
  return fclose(f) == 0 ? 0 : 2;
}

/* ---- Plots ---------------------------------------------------------------------------------- */

/* A file name from a method or device name: letters, digits and '-' kept, anything else '_'. */
static void file_name(char *out, size_t size, const char *s) {
  size_t n = 0;
  for (; *s && n + 1 < size; s++)
    out[n++] = (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '-' ? *s : '_';
  out[n] = 0;
}

static int have_gnuplot(void) {
  FILE *p = popen("command -v gnuplot >/dev/null 2>&1 && echo yes", "r");
  char buf[8] = {0};
  if (!p) return 0;
  const int yes = fgets(buf, sizeof buf, p) && !strncmp(buf, "yes", 3);
  pclose(p);
  return yes;
}

/* Per backend and fused decode attention: GB/s, and the fraction of the copy bandwidth, against
 * context length, one line per method (batch, heads and head_dim: the first of each grid; the data
 * files hold only those rows). */
int bench_write_plots(const char *dir, const bench_results *res) {
  if (!have_gnuplot()) {
    fprintf(stderr, "kvq-bench: gnuplot is not installed (Debian: apt-get install gnuplot-nox): no plots written to %s; "
                    "the table, JSON and CSV are complete\n", dir);
    return 0;
  }
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "kvq-bench: cannot create %s: %s\n", dir, strerror(errno));
    return 2;
  }
  int rc = 0;
  for (unsigned d = 0; d < res->n_devices && rc == 0; d++) {
    const bench_device *dev = &res->devices[d];
    const bench_row *first = NULL;
    for (size_t i = 0; i < res->count && !first; i++)
      if (res->rows[i].dev == dev && res->rows[i].kase == CASE_FUSED && !res->rows[i].skipped) first = &res->rows[i];
    if (!first) continue;
    char script_path[1024], data_path[1024], name[64];
    snprintf(script_path, sizeof script_path, "%s/%s.gp", dir, dev->backend);
    FILE *gp = fopen(script_path, "w");
    if (!gp) return 2;
    fprintf(gp, "set terminal pngcairo size 1000,620 noenhanced\nset logscale x 2\nset grid\nset key outside right\n"
                "set xlabel 'context (tokens)'\n");
    const char *methods[BENCH_MAX_METHODS * 4];
    unsigned n_methods = 0;
    for (size_t i = 0; i < res->count; i++) {
      const bench_row *r = &res->rows[i];
      if (r->dev != dev || r->kase != CASE_FUSED || r->skipped) continue;
      unsigned m = 0;
      while (m < n_methods && strcmp(methods[m], r->method)) m++;
      if (m == n_methods && n_methods < sizeof methods / sizeof *methods) methods[n_methods++] = r->method;
    }
    for (int what = 0; what < 2; what++) {
      fprintf(gp, "set output '%s/%s-%s.png'\nset ylabel '%s'\nset title '%s, %s: fused decode, batch %u, %u/%u heads, d %u'\nplot ",
              dir, dev->backend, what ? "fraction-of-copy" : "gbps", what ? "fraction of copy bandwidth" : "GB/s read",
              dev->backend, dev->device, first->batch, first->query_heads, first->kv_heads, first->head_dim);
      for (unsigned m = 0; m < n_methods; m++) {
        file_name(name, sizeof name, methods[m]);
        snprintf(data_path, sizeof data_path, "%s/%s-%s.dat", dir, dev->backend, name);
        fprintf(gp, "%s'%s' using 1:%d with linespoints title '%s'", m ? ", " : "", data_path, what ? 3 : 2, methods[m]);
      }
      fprintf(gp, "\n");
    }
    fclose(gp);
    for (unsigned m = 0; m < n_methods; m++) {
      file_name(name, sizeof name, methods[m]);
      snprintf(data_path, sizeof data_path, "%s/%s-%s.dat", dir, dev->backend, name);
      FILE *dat = fopen(data_path, "w");
      if (!dat) return 2;
      fprintf(dat, "# context GB/s fraction_of_copy (%s, %s)\n", dev->backend, methods[m]);
      for (size_t i = 0; i < res->count; i++) {
        const bench_row *r = &res->rows[i];
        if (r->dev == dev && r->kase == CASE_FUSED && !r->skipped && !strcmp(r->method, methods[m]) &&
            r->batch == first->batch && r->query_heads == first->query_heads && r->head_dim == first->head_dim)
          fprintf(dat, "%u %.6g %.6g\n", r->context, r->gbs, r->of_copy);
      }
      fclose(dat);
    }
    char command[1100];
    snprintf(command, sizeof command, "gnuplot '%s'", script_path);
    if (system(command) != 0) {
      /* plots are a view of the JSON and CSV, which are complete: a broken gnuplot fails no run */
      fprintf(stderr, "kvq-bench: gnuplot failed on %s: no plots for %s\n", script_path, dev->backend);
    }
  }
  return rc;
}
