/* The kvq tool as a user runs it: info, eval (synthetic and .npy data, table and JSON), usage errors. */
#include <criterion/criterion.h>

#include "helpers.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvq/kvq.h"
#include "npy.h"

static char output[1 << 17];

static int run(const char *args) {
  char command[4096];
  snprintf(command, sizeof command, "%s %s 2>&1", KVQ_TOOL_PATH, args);
  FILE *p = popen(command, "r");
  cr_assert_not_null(p);
  size_t n = fread(output, 1, sizeof output - 1, p);
  output[n] = 0;
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(tool, info_lists_every_backend_with_a_reason) {
  cr_assert_eq(run("info"), 0, "%s", output);
  cr_assert_not_null(strstr(output, "kvq 0."), "%s", output);
  cr_assert_not_null(strstr(output, "cpu     available"), "%s", output);
  kvq_backend_info infos[4];
  size_t count;
  cr_assert_eq(kvq_backends_list(infos, 4, &count), KVQ_OK);
  cr_assert_eq(count, 3u);
  for (size_t i = 0; i < count; i++) {
    char line[300];
    if (infos[i].availability == KVQ_AVAILABLE) continue;
    cr_assert_neq(infos[i].reason[0], 0, "%s: unavailable without a reason", infos[i].name);
    snprintf(line, sizeof line, "%s unavailable: %s", infos[i].name, infos[i].reason);
    cr_assert(strstr(output, infos[i].name) && strstr(output, infos[i].reason), "missing '%s' in:\n%s", line, output);
  }
}

/* The line of `kvq info` that starts with `name` (in output), copied into line. */
static void info_line(const char *name, char *line, size_t size) {
  const char *at = strstr(output, name);
  cr_assert_not_null(at, "no %s line in:\n%s", name, output);
  size_t n = strcspn(at, "\n");
  cr_assert_lt(n, size);
  memcpy(line, at, n);
  line[n] = 0;
}

/* The CUDA line as built: without KVQ_CUDA_EMULATOR the real backend (unavailable with
 * cudaGetDeviceCount's reason where no driver or device is, as on the CI machines) or "not built";
 * with KVQ_CUDA_EMULATOR=1 the emulator, named as such, and never the automatic choice. */
Test(tool, info_names_the_cuda_backend_as_built) {
  char plain[512], emulated[512], auto_plain[512], auto_emulated[512];
  cr_assert_eq(run("info"), 0, "%s", output);
  info_line("  cuda ", plain, sizeof plain);
  info_line("default (auto)", auto_plain, sizeof auto_plain);
  cr_assert_null(strstr(plain, "emulator on the CPU"), "%s", plain);
#ifdef KVQ_HAVE_CUDA
  cr_assert(strstr(plain, "cuda    available: ") || strstr(plain, "cuda    unavailable: cuda: cudaGetDeviceCount failed: ") ||
                strstr(plain, "cuda    unavailable: cuda: the CUDA runtime reports no device"),
            "%s", plain);
#else
  cr_assert_not_null(strstr(plain, "cuda    unavailable: this kvq was built without the cuda backend"), "%s", plain);
#endif
  char command[4096];
  snprintf(command, sizeof command, "KVQ_CUDA_EMULATOR=1 %s info 2>&1", KVQ_TOOL_PATH);
  FILE *p = popen(command, "r");
  cr_assert_not_null(p);
  size_t n = fread(output, 1, sizeof output - 1, p);
  output[n] = 0;
  cr_assert_eq(pclose(p), 0, "%s", output);
  info_line("  cuda ", emulated, sizeof emulated);
  info_line("default (auto)", auto_emulated, sizeof auto_emulated);
#ifdef KVQ_HAVE_CUDA_EMULATOR
  cr_assert_str_eq(emulated, "  cuda    available: kvq CUDA emulator on the CPU (tests only, not a GPU)");
#else
  cr_assert_not_null(strstr(emulated, "KVQ_CUDA_EMULATOR=1, but this kvq was built without the CUDA emulator"), "%s", emulated);
#endif
  cr_assert_str_eq(auto_emulated, auto_plain);
}

/* Runs eval and returns the JSON number after "key" for method row `row` (0-based; -1: the first
 * anywhere, e.g. in "data"). */
static double json_number(const char *json, int row, const char *key) {
  const char *p = json;
  for (int r = 0; r <= row; r++) {
    p = strstr(p, "{\"method\"");
    cr_assert_not_null(p, "row %d missing in:\n%s", row, json);
    if (r < row) p++;
  }
  char needle[64];
  snprintf(needle, sizeof needle, "\"%s\": ", key);
  const char *at = strstr(p, needle);
  cr_assert_not_null(at, "%s missing", key);
  return strtod(at + strlen(needle), NULL);
}

Test(tool, eval_table_and_json, .timeout = 120) {
  const char *small = "eval --quiet --tokens 300 --heads 4 --kv-heads 2 --head-dim 64 --last 16 "
                      "--methods exact-f32/exact-f32,qjl-m256-k4/uniform-b4,uniform-b2-g16/uniform-b2-g16";
  char args[512];
  cr_assert_eq(run(small), 0, "%s", output);
  const char *columns[] = {"k-bits", "v-bits", "ip-err", "score-mean", "score-max", "output-err", "top5%",
                           "qjl-m256-k4/uniform-b4"};
  for (int i = 0; i < 8; i++) cr_assert_not_null(strstr(output, columns[i]), "missing %s in:\n%s", columns[i], output);
  snprintf(args, sizeof args, "%s --json", small);
  cr_assert_eq(run(args), 0, "%s", output);
  /* exact fp32 storage: only double-vs-float rounding separates it from the reference */
  cr_assert_lt(json_number(output, 0, "inner_product_error"), 1e-6);
  cr_assert_lt(json_number(output, 0, "output_error"), 1e-5);
  cr_assert_eq(json_number(output, 0, "topk_overlap"), 1.0);
  cr_assert_eq(json_number(output, 0, "bits"), 32.0);
  /* compressed rows: sizes from the layouts, errors clearly above exact's and below 1 */
  const double qjl_bits = json_number(output, 1, "key_bits");
  cr_assert(qjl_bits > 2 && qjl_bits < 12, "%g", qjl_bits);
  cr_assert_eq(json_number(output, 1, "value_bits"), 5.0);
  for (int r = 1; r < 3; r++) {
    double ip = json_number(output, r, "inner_product_error");
    cr_assert(ip > 1e-3 && ip < 1.0, "row %d: inner-product error %g", r, ip);
    double overlap = json_number(output, r, "topk_overlap");
    cr_assert(overlap > 0.2 && overlap <= 1.0, "row %d: top-k overlap %g", r, overlap);
  }
}

/* Every method of issue 3 appears, with its layout's bits; learned codebooks come from the
 * calibration tokens, and more calibration data cannot make CQ's in-distribution error much worse
 * (k-means on a superset of the points; 1.5x allows for k-means++'s random start). */
Test(tool, eval_polar_cq_kivi_rows, .timeout = 120) {
  const char *common = "eval --quiet --json --tokens 256 --heads 2 --kv-heads 1 --head-dim 64 --last 8 "
                       "--methods kivi-b2/uniform-b2,polar-b4222,polar-b2222-hadamard-online,cq-c4-b8,cq-c2-b4/cq-c8-b8";
  char args[512];
  snprintf(args, sizeof args, "%s --calibration 32", common);
  cr_assert_eq(run(args), 0, "%s", output);
  const double few = json_number(output, 3, "output_error");
  cr_assert_eq(json_number(output, 3, "calibration_tokens"), 32.0);
  cr_assert_eq(run(common), 0, "%s", output);
  const double bits[5][2] = {{3.0, 3.0}, {3.875, 3.875}, {2.875, 2.875}, {2.0, 2.0}, {2.0, 1.0}};
  for (int r = 0; r < 5; r++) {
    cr_assert_eq(json_number(output, r, "key_bits"), bits[r][0], "row %d", r);
    cr_assert_eq(json_number(output, r, "value_bits"), bits[r][1], "row %d", r);
    const double err = json_number(output, r, "output_error");
    cr_assert(err > 1e-4 && err < 3.0, "row %d: output error %g", r, err);
  }
  cr_assert_eq(json_number(output, 0, "calibration_tokens"), 0.0, "KIVI learns nothing");
  cr_assert_eq(json_number(output, 3, "calibration_tokens"), 248.0, "the prefill: all but the 8 queries");
  cr_assert_lt(json_number(output, 3, "output_error"), 1.5 * few, "more calibration data");
  cr_assert_eq(run("eval --quiet --tokens 64 --calibration 65 --methods cq-c4-b8"), 2, "%s", output);
}

/* Token-policy rows: exact fp32 storage under H2O keeps exactly what H2O on the exact keys keeps
 * (overlap 1: the same decisions, from probabilities that differ by float rounding only, far from
 * ties on this data), a quantized method keeps less of it, Q-Hitter with lambda 1 is H2O, and every policy row keeps the
 * budget plus the step's new token. */
Test(tool, eval_policy_rows, .timeout = 120) {
  const char *args = "eval --quiet --json --tokens 400 --heads 4 --kv-heads 2 --head-dim 64 --last 24 --budget 80 "
                     "--recent 40 --methods exact-f32@h2o,uniform-b2@h2o,uniform-b2@qhitter-l1,uniform-b2@streaming,"
                     "uniform-b2@qhitter,uniform-b2";
  cr_assert_eq(run(args), 0, "%s", output);
  cr_assert_eq(json_number(output, 0, "h2o_overlap"), 1.0, "exact storage keeps exactly H2O's set");
  const double quantized = json_number(output, 1, "h2o_overlap");
  cr_assert(quantized < 1.0 && quantized > 0.2, "2-bit keys shift the kept set (overlap %g)", quantized);
  cr_assert_eq(json_number(output, 2, "h2o_overlap"), quantized, "lambda 1 selects as H2O");
  cr_assert_eq(json_number(output, 2, "output_error"), json_number(output, 1, "output_error"));
  for (int r = 0; r < 5; r++) cr_assert_eq(json_number(output, r, "kept_tokens"), 81.0, "row %d", r);
  /* the exact attention's mass on the kept tokens: a share, below 1 once tokens are evicted, and the
   * same for the same kept set (lambda 1 and H2O) */
  for (int r = 0; r < 5; r++) {
    const double mass = json_number(output, r, "kept_mass");
    cr_assert(mass > 0.0 && mass < 1.0, "row %d: kept mass %g", r, mass);
  }
  cr_assert_eq(json_number(output, 2, "kept_mass"), json_number(output, 1, "kept_mass"));
  cr_assert_not_null(strstr(output, "\"budget\": 80"), "%s", output);
  /* evicting 80% of the tokens costs accuracy: more output error than the same method keeping all */
  cr_assert_gt(json_number(output, 1, "output_error"), json_number(output, 5, "output_error"));
  cr_assert_eq(run("eval --quiet --methods uniform-b2@lru"), 2, "%s", output);
  cr_assert_eq(run("eval --quiet --mask none --methods uniform-b2@h2o"), 2, "%s", output);
  cr_assert_eq(run("eval --quiet --lambda 2 --methods uniform-b2@qhitter"), 2, "%s", output);
}

/* The same numbers from .npy files as from the synthetic generator they were written from. */
Test(tool, eval_npy_inputs_match_synthetic, .timeout = 120) {
  const uint32_t n = 200, hq = 4, hkv = 1, d = 32;
  float *k = malloc(sizeof(float) * n * hkv * d), *v = malloc(sizeof(float) * n * hkv * d), *q = malloc(sizeof(float) * n * hq * d);
  kvq_synth_config sc = kvq_synth_defaults(n, hkv, hq, d, 7);
  kvq_synth_generate(&sc, k, v, q);
  char dir[] = "/tmp/kvq-eval-XXXXXX", kp[64], vp[64], qp[64], error[256];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(kp, sizeof kp, "%s/k.npy", dir);
  snprintf(vp, sizeof vp, "%s/v.npy", dir);
  snprintf(qp, sizeof qp, "%s/q.npy", dir);
  const int64_t kv_shape[3] = {n, hkv, d}, q_shape[3] = {n, hq, d};
  cr_assert_eq(kvq_npy_write(kp, k, 3, kv_shape, 0, error, sizeof error), 0, "%s", error);
  cr_assert_eq(kvq_npy_write(vp, v, 3, kv_shape, 0, error, sizeof error), 0, "%s", error);
  cr_assert_eq(kvq_npy_write(qp, q, 3, q_shape, 0, error, sizeof error), 0, "%s", error);
  char args[1024];
  const char *common = "eval --quiet --json --last 10 --methods qjl-m64-k2/uniform-b2-g16";
  snprintf(args, sizeof args, "%s --tokens %u --heads %u --kv-heads %u --head-dim %u --seed 7", common, n, hq, hkv, d);
  cr_assert_eq(run(args), 0, "%s", output);
  char *synthetic = strdup(strstr(output, "\"methods\""));
  snprintf(args, sizeof args, "%s --seed 7 --keys %s --values %s --queries %s", common, kp, vp, qp);
  cr_assert_eq(run(args), 0, "%s", output);
  cr_assert_str_eq(strstr(output, "\"methods\""), synthetic);
  free(synthetic);
  /* mismatched shapes are refused with a message */
  snprintf(args, sizeof args, "eval --quiet --keys %s --values %s --queries %s", kp, qp, qp);
  cr_assert_eq(run(args), 2, "%s", output);
  cr_assert_not_null(strstr(output, "shapes disagree"), "%s", output);
  remove(kp), remove(vp), remove(qp), rmdir(dir);
  free(k), free(v), free(q);
}

Test(tool, usage_errors_exit_2) {
  const char *bad[] = {"", "frobnicate", "eval --methods qjl-x9/uniform-b2", "eval --methods qjl-m33-k0/uniform-b2",
                       "eval --tokens abc", "eval --mask sideways", "eval --keys only.npy", "info extra",
                       "eval --methods polar-b9", "eval --methods polar-b42-twisted", "eval --methods cq-c4-x8"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = run(bad[i]);
    cr_assert_eq(rc, 2, "'kvq %s' exited %d:\n%s", bad[i], rc, output);
    cr_assert_neq(output[0], 0, "'kvq %s' says nothing", bad[i]);
  }
  cr_assert_eq(run("--help"), 0);
  cr_assert_eq(run("eval --help"), 0);
  cr_assert_eq(run("golden --help"), 0);
}

/* kvq-bench runs a tiny grid on the CPU and prints its table; its figures are measurements, not
 * checked here (tests/bench_quick.py checks the quick mode's JSON and CSV on every backend). */
Test(tool, bench_runs, .timeout = 120) {
#ifdef KVQ_BENCH_PATH
  char command[1024];
  snprintf(command, sizeof command,
           "%s --backend cpu --contexts 64 --batch 2 --gqa 2 --kv-heads 1 --head-dim 16 --page-size 16 --warmup 1 "
           "--samples 1 --copy-mb 8 --flush-mb 8 --methods exact-f16/exact-f16,qjl-m32-k1/uniform-b2 2>&1",
           KVQ_BENCH_PATH);
  FILE *p = popen(command, "r");
  cr_assert_not_null(p);
  size_t n = fread(output, 1, sizeof output - 1, p);
  output[n] = 0;
  cr_assert_eq(pclose(p), 0, "%s", output);
  const char *keys[] = {"copy bandwidth", "call ms", "kernel ms", "GB/s", "of cp", "x fp16", "qjl-m32-k1/uniform-b2",
                        "append", "fused", "scores", "wsum"};
  for (int i = 0; i < 11; i++) cr_assert_not_null(strstr(output, keys[i]), "missing %s in:\n%s", keys[i], output);
#else
  cr_skip_test("kvq-bench is not built (-Dbench=disabled)");
#endif
}

/* Runs kvq with stdout and stderr in separate buffers (stderr a file: not a terminal). */
static char errors[1 << 16];
static int run_split(const char *args) {
  char path[] = "/tmp/kvq-stderr-XXXXXX", command[4096];
  const int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  snprintf(command, sizeof command, "%s %s 2>%s", KVQ_TOOL_PATH, args, path);
  FILE *p = popen(command, "r");
  cr_assert_not_null(p);
  size_t n = fread(output, 1, sizeof output - 1, p);
  output[n] = 0;
  const int status = pclose(p);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  n = fread(errors, 1, sizeof errors - 1, f);
  errors[n] = 0;
  fclose(f);
  remove(path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Progress on stderr when it is a log: whole lines naming each row and phase (the codebook
 * learning of a CQ row, the decoding steps of a policy row), none with --quiet, and stdout holds
 * only the result either way. */
Test(tool, eval_progress_lines, .timeout = 120) {
  const char *args = "eval --json --tokens 200 --heads 2 --kv-heads 1 --head-dim 32 --last 8 --budget 60 --recent 40 "
                     "--methods cq-c4-b4,uniform-b2@h2o";
  cr_assert_eq(run_split(args), 0, "%s%s", output, errors);
  const char *lines[] = {"[1/2] cq-c4-b4: learning codebooks (k-means on 192 tokens)\n",
                         "[1/2] cq-c4-b4: scoring and attending\n", "[2/2] uniform-b2@h2o: decoding\n",
                         "[2/2] uniform-b2@h2o: decoding 50% (4/8)\n"};
  for (int i = 0; i < 4; i++) cr_assert_not_null(strstr(errors, lines[i]), "missing '%s' in:\n%s", lines[i], errors);
  cr_assert_null(strchr(errors, '\r'), "a log gets whole lines, not redraws:\n%s", errors);
  cr_assert_eq(output[0], '{', "%s", output);
  char quiet[512];
  snprintf(quiet, sizeof quiet, "%s --quiet", args);
  cr_assert_eq(run_split(quiet), 0, "%s%s", output, errors);
  cr_assert_str_eq(errors, "");
}

/* Queries that already carry 1/sqrt(d) (eval_check.c): kvq eval warns (their attention is nearly
 * uniform), and --queries-scaled undoes it exactly. d = 64: dividing by sqrt(d) = 8 and multiplying
 * back are exact in float, so the numbers equal those of the unscaled files bit for bit. The
 * synthetic model's median logit deviation at d = 64 is 4.7 (no warning), 0.59 scaled twice. */
Test(tool, eval_queries_scaled_twice, .timeout = 120) {
  const uint32_t n = 300, hq = 4, hkv = 1, d = 64;
  float *k = malloc(sizeof(float) * n * hkv * d), *v = malloc(sizeof(float) * n * hkv * d), *q = malloc(sizeof(float) * n * hq * d);
  kvq_synth_config sc = kvq_synth_defaults(n, hkv, hq, d, 7);
  kvq_synth_generate(&sc, k, v, q);
  char dir[] = "/tmp/kvq-scaled-XXXXXX", kp[64], vp[64], qp[64], sp[64], error[256];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(kp, sizeof kp, "%s/k.npy", dir);
  snprintf(vp, sizeof vp, "%s/v.npy", dir);
  snprintf(qp, sizeof qp, "%s/q.npy", dir);
  snprintf(sp, sizeof sp, "%s/qs.npy", dir);
  const int64_t kv_shape[3] = {n, hkv, d}, q_shape[3] = {n, hq, d};
  cr_assert_eq(kvq_npy_write(kp, k, 3, kv_shape, 0, error, sizeof error), 0, "%s", error);
  cr_assert_eq(kvq_npy_write(vp, v, 3, kv_shape, 0, error, sizeof error), 0, "%s", error);
  cr_assert_eq(kvq_npy_write(qp, q, 3, q_shape, 0, error, sizeof error), 0, "%s", error);
  for (uint32_t i = 0; i < n * hq * d; i++) q[i] /= 8.0f;
  cr_assert_eq(kvq_npy_write(sp, q, 3, q_shape, 0, error, sizeof error), 0, "%s", error);
  char args[1024];
  const char *common = "eval --quiet --json --last 10 --methods kivi-b2/uniform-b2";
  snprintf(args, sizeof args, "%s --keys %s --values %s --queries %s", common, kp, vp, qp);
  cr_assert_eq(run_split(args), 0, "%s", errors);
  cr_assert_null(strstr(errors, "warning"), "%s", errors);
  const double spread = json_number(output, -1, "logit_std_median");
  cr_assert(spread > 2.0, "the synthetic model's attention picks tokens: %g", spread);
  char *plain = strdup(strstr(output, "\"methods\""));
  snprintf(args, sizeof args, "%s --keys %s --values %s --queries %s", common, kp, vp, sp);
  cr_assert_eq(run_split(args), 0, "%s", errors);
  cr_assert_not_null(strstr(errors, "warning: the attention is nearly uniform"), "%s", errors);
  cr_assert_not_null(strstr(errors, "--queries-scaled"), "%s", errors);
  /* the logits shrink by exactly 8; the JSON's 6 decimals round each figure by 5e-7 at most */
  cr_assert_float_eq(json_number(output, -1, "logit_std_median"), spread / 8, 1e-6);
  cr_assert_str_neq(strstr(output, "\"methods\""), plain, "flat attention changes every error column");
  snprintf(args, sizeof args, "%s --queries-scaled --keys %s --values %s --queries %s", common, kp, vp, sp);
  cr_assert_eq(run_split(args), 0, "%s", errors);
  cr_assert_str_eq(errors, "");
  cr_assert_not_null(strstr(output, "\"queries_scaled\": true"), "%s", output);
  cr_assert_str_eq(strstr(output, "\"methods\""), plain);
  free(plain);
  remove(kp), remove(vp), remove(qp), remove(sp), rmdir(dir);
  free(k), free(v), free(q);
}

/* --plot: a PNG of output error against bits per number, one point per row, its data next to it
 * (one line per row after the comment); without gnuplot, a message and exit status 1. */
Test(tool, eval_plot, .timeout = 120) {
  char dir[] = "/tmp/kvq-evalplot-XXXXXX", png[64], dat[64], gp[64], args[512];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(png, sizeof png, "%s/eval.png", dir);
  snprintf(dat, sizeof dat, "%s/eval.dat", dir);
  snprintf(gp, sizeof gp, "%s/eval.gp", dir);
  snprintf(args, sizeof args, "eval --quiet --tokens 200 --heads 2 --kv-heads 1 --head-dim 32 --last 8 "
                              "--methods exact-f16,kivi-b2/uniform-b2 --plot %s", png);
  if (access("/usr/bin/gnuplot", X_OK) != 0) {
    cr_assert_eq(run_split(args), 1, "%s", errors);
    cr_assert_not_null(strstr(errors, "gnuplot-nox"), "%s", errors);
    cr_skip_test("gnuplot is not installed (Debian's gnuplot-nox): only its message was checked");
  }
  cr_assert_eq(run_split(args), 0, "%s", errors);
  cr_assert_not_null(strstr(output, "plot: "), "%s", output);
  th_assert_png(png);
  FILE *f = fopen(dat, "r");
  cr_assert_not_null(f);
  char line[256];
  int lines = 0;
  while (fgets(line, sizeof line, f)) lines += line[0] != '#';
  fclose(f);
  cr_assert_eq(lines, 2);
  remove(png), remove(dat), remove(gp), rmdir(dir);
}
