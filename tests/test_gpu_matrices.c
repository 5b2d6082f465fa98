/*
 * The GPU suite's two matrices on kvq's emulated CUDA backend, in a build of the library other than
 * the test build's (docs/CUDA.md): the committed golden matrix and the odd-size matrix
 * (tests/gpu_odd_sizes.c), held to the same totals as tests/test_gpu.c holds them. tests/meson.build
 * links this program twice, KVQ_MATRICES_BUILD naming the build:
 *   - `gpu_cuda_emulated_tsan`: against a ThreadSanitizer build of the library (whose emulator then
 *     orders the threads of a block only at __syncthreads and __syncwarp) and of the golden checker,
 *     run with halt_on_error=1: any data race the kernels have on these shapes ends the run with exit
 *     status 66;
 *   - `gpu_cuda_emulated_plain`: against a build without sanitizers, optimized (-O2), as a runtime
 *     embeds kvq: what the optimizer makes of the emulated kernels must give the same bytes.
 *
 * A plain TAP program, not Criterion: Criterion's runner cannot start under ThreadSanitizer (see
 * tests/test_threads.c). Arguments name the cases to run (golden, odd); none: both.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "golden/cases.h"
#include "golden/golden.h"
#include "gpu_odd_sizes.h"
#include "th_configs.h"
#include "kvq/kvq.h"

#ifndef KVQ_MATRICES_BUILD
#error "tests/meson.build names the build this program is linked against"
#endif

static char why[512]; /* the first failed check of the running case */

static void fail_if(int bad, const char *format, ...) __attribute__((format(printf, 2, 3)));
static void fail_if(int bad, const char *format, ...) {
  if (!bad || why[0]) return;
  va_list ap;
  va_start(ap, format);
  vsnprintf(why, sizeof why, format, ap);
  va_end(ap);
}

/* The checker's lines as TAP comments (the configurations that failed are named there). */
static void print_log(FILE *out) {
  rewind(out);
  char line[512];
  while (fgets(line, sizeof line, out)) printf("# %s", line);
  fclose(out);
}

static void golden_matrix(void) {
  golden_totals t;
  FILE *out = tmpfile();
  fail_if(!out, "tmpfile failed");
  if (!out) return;
  const int rc = kvq_golden_check(KVQ_SOURCE_GOLDEN_DIR, KVQ_BACKEND_CUDA, out, &t);
  print_log(out);
  fail_if(rc != 0, "kvq golden --check on the emulated CUDA backend returned %d (the log above says where)", rc);
  fail_if(t.configurations != kvq_golden_case_count(), "%u configurations checked, the matrix has %u", t.configurations,
          kvq_golden_case_count());
  fail_if(t.code_bytes <= 100000u, "only %llu code bytes compared", (unsigned long long)t.code_bytes);
  fail_if(t.unexplained != 0, "%llu unexplained code bytes", (unsigned long long)t.unexplained);
  fail_if(t.side_beyond != 0, "%llu side values beyond 1 ulp", (unsigned long long)t.side_beyond);
  fail_if(t.class3_values <= 10000u, "only %llu class-3 values compared", (unsigned long long)t.class3_values);
  fail_if(t.class3_beyond != 0, "%llu class-3 values beyond their bounds", (unsigned long long)t.class3_beyond);
  fail_if(t.decisions_differing != 0, "%llu token-policy decisions differ", (unsigned long long)t.decisions_differing);
  fail_if(t.files_failed != 0, "%u saved files failed", t.files_failed);
}

static void odd_sizes(void) {
  static char names[GPU_ODD_SIZE_MAX][GPU_ODD_SIZE_NAME];
  golden_case cases[GPU_ODD_SIZE_MAX];
  const uint32_t count = gpu_odd_size_cases(cases, names);
  char dir[] = "/tmp/kvq-gpu-matrices-XXXXXX";
  fail_if(!mkdtemp(dir), "mkdtemp(%s) failed", dir);
  if (why[0]) return;
  FILE *log = tmpfile();
  for (uint32_t i = 0; i < count && log; i++)
    fail_if(kvq_golden_write_case(&cases[i], dir, log) != 0, "writing %s failed", cases[i].name);
  if (log) fclose(log);
  golden_totals t;
  FILE *out = tmpfile();
  if (!why[0] && out) {
    kvq_golden_check(dir, KVQ_BACKEND_CUDA, out, &t); /* no saved files here: those are counted failed */
    print_log(out);
    fail_if(t.configurations != count, "%u configurations checked of %u", t.configurations, count);
    fail_if(t.configurations_failed != 0, "%u configurations failed (named in the log above)", t.configurations_failed);
    fail_if(t.code_bytes <= 10000u, "only %llu code bytes compared", (unsigned long long)t.code_bytes);
    fail_if(t.code_bytes_differing != t.near_ties + t.implied, "%llu code bytes differ, %llu are proven near-ties",
            (unsigned long long)t.code_bytes_differing, (unsigned long long)(t.near_ties + t.implied));
    fail_if(t.unexplained != 0, "%llu unexplained code bytes", (unsigned long long)t.unexplained);
    fail_if(t.side_beyond != 0, "%llu side values beyond 1 ulp", (unsigned long long)t.side_beyond);
    fail_if(t.class3_values <= 1000u, "only %llu class-3 values compared", (unsigned long long)t.class3_values);
    fail_if(t.class3_beyond != 0, "%llu class-3 values beyond their bounds", (unsigned long long)t.class3_beyond);
  } else {
    fail_if(!out, "tmpfile failed");
  }
  th_remove_dir(dir);
}

/* The reason the emulated CUDA backend is unavailable, or NULL when it is available. */
static const char *unavailable(void) {
  static kvq_backend_info infos[8];
  size_t count = 0;
  if (kvq_backends_list(infos, 8, &count) != KVQ_OK) return "kvq_backends_list failed";
  for (size_t i = 0; i < count; i++)
    if (infos[i].kind == KVQ_BACKEND_CUDA) return infos[i].availability == KVQ_AVAILABLE ? NULL : infos[i].reason;
  return "no CUDA backend listed";
}

int main(int argc, char **argv) {
  static const struct {
    const char *name, *title;
    void (*run)(void);
  } cases[] = {
      {"golden", "the golden matrix agrees on the emulated CUDA backend, " KVQ_MATRICES_BUILD, golden_matrix},
      {"odd", "the odd-size matrix agrees on the emulated CUDA backend, " KVQ_MATRICES_BUILD, odd_sizes},
  };
  const int n = (int)(sizeof cases / sizeof cases[0]);
  int chosen[2], count = 0;
  for (int i = 0; i < n; i++) {
    chosen[i] = argc == 1;
    for (int a = 1; a < argc; a++) chosen[i] |= !strcmp(argv[a], cases[i].name);
    count += chosen[i];
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("1..%d\n", count);
  const char *skip = unavailable();
  int failed = 0, number = 0;
  for (int i = 0; i < n; i++) {
    if (!chosen[i]) continue;
    ++number;
    if (skip) {
      printf("ok %d - %s # SKIP the CUDA backend is unavailable here: %s\n", number, cases[i].title, skip);
      continue;
    }
    why[0] = 0;
    /* Wall and CPU time of each matrix, for docs/CUDA.md's "Test time" (CI machines are shared). */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const clock_t c0 = clock();
    cases[i].run();
    const clock_t c1 = clock();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("# %s: %.1f s wall, %.1f s CPU\n", cases[i].name, (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9,
           (double)(c1 - c0) / CLOCKS_PER_SEC);
    if (why[0]) {
      failed = 1;
      printf("not ok %d - %s: %s\n", number, cases[i].title, why);
    } else {
      printf("ok %d - %s\n", number, cases[i].title);
    }
  }
  return failed;
}
