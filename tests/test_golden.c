/*
 * Golden files: the CPU reference agrees with the committed files in all three classes; the
 * writer reproduces their codes; the checker proves near-ties and refuses everything else; and the
 * tool's exit status and summary lines are what users' CI relies on.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/halfconv.h"
#include "core/layout.h"
#include "core/matrix.h"
#include "core/rng.h"
#include "core/savefile.h"
#include "golden/container.h"
#include "core/internal.h"
#include "golden/golden.h"
#include "golden/polar_ref.h"
#include "helpers.h"

static void copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  cr_assert(in && out, "copy %s -> %s", from, to);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) cr_assert_eq(fwrite(buf, 1, n, out), n);
  fclose(in);
  fclose(out);
}

/* Copies the committed saved-cache files next to a modified golden file, so a check of that
 * directory fails only for what the test changed. */
static void copy_saved_files(const char *dir) {
  const char *saved[] = {"cache-v1.kvq",        "cache-policy-v1.kvq",   "cache-codebooks-v1.kvq",
                         "reject-truncated.kvq", "reject-checksum.kvq",   "reject-version.kvq",
                         "reject-bad-format.kvq", "reject-bad-format-far-position.kvq",
                         "reject-bad-format-huge-count.kvq"};
  for (size_t i = 0; i < sizeof saved / sizeof saved[0]; i++) {
    char from[1024], to[1024];
    snprintf(from, sizeof from, "%s/%s", KVQ_SOURCE_GOLDEN_DIR, saved[i]);
    snprintf(to, sizeof to, "%s/%s", dir, saved[i]);
    copy_file(from, to);
  }
}

/* Checks the CPU against a (modified) golden file alone in a directory with the committed saved
 * files, logging the checker's lines; frees g. Returns the check's exit status. */
static int check_file(golden_file *g, const char *case_name, golden_totals *t) {
  char error[512], out_path[1024], *dir = th_temp_dir("golden");
  snprintf(out_path, sizeof out_path, "%s/%s.kvqg", dir, case_name);
  cr_assert_eq(golden_save(g, out_path, error, sizeof error), 0, "%s", error);
  golden_free(g);
  copy_saved_files(dir);
  FILE *out = tmpfile();
  const int rc = kvq_golden_check(dir, KVQ_BACKEND_CPU, out, t);
  rewind(out);
  char line[512];
  while (fgets(line, sizeof line, out)) cr_log_info("%s", line);
  fclose(out);
  th_remove_dir(dir);
  free(dir);
  return rc;
}

Test(golden, cpu_agrees_with_committed_files, .timeout = 120) {
  golden_totals t;
  FILE *out = tmpfile();
  int rc = kvq_golden_check(KVQ_SOURCE_GOLDEN_DIR, KVQ_BACKEND_CPU, out, &t);
  rewind(out);
  char line[512];
  while (fgets(line, sizeof line, out)) cr_log_info("%s", line);
  fclose(out);
  cr_assert_eq(rc, 0, "kvq golden --check --backend cpu failed");
  cr_assert_eq(t.configurations, kvq_golden_case_count(), "every configuration has a committed file");
  cr_assert_gt(t.code_bytes, 100000u);
  cr_assert_eq(t.code_bytes_differing + t.unexplained + t.near_ties, 0u, "the reference reproduces its own codes");
  cr_assert_eq(t.side_one_ulp + t.side_beyond, 0u);
  cr_assert_gt(t.class3_values, 10000u);
  cr_assert_eq(t.class3_beyond, 0u);
  cr_assert_eq(t.matrix_mismatches, 0u);
  cr_assert(t.matrices >= 10);
  cr_assert_gt(t.decisions, 100u, "token-policy cases compare their kept sets");
  cr_assert_eq(t.decisions_differing, 0u);
  cr_assert_eq(t.files_checked, 9u);
  cr_assert_eq(t.files_failed, 0u);
}

/* Regenerating the files reproduces every record byte for byte, except probabilities and outputs,
 * which pass through the C library's exp() and are compared within bounds instead (class 3). */
Test(golden, writer_reproduces_committed_records, .timeout = 120) {
  char *dir = th_temp_dir("golden");
  FILE *log = tmpfile();
  cr_assert_eq(kvq_golden_write(dir, log), 0);
  fclose(log);
  for (uint32_t i = 0; i < kvq_golden_case_count(); i++) {
    char a[1024], b[1024], error[512];
    snprintf(a, sizeof a, "%s/%s.kvqg", KVQ_SOURCE_GOLDEN_DIR, kvq_golden_case_name(i));
    snprintf(b, sizeof b, "%s/%s.kvqg", dir, kvq_golden_case_name(i));
    golden_file ga, gb;
    cr_assert_eq(golden_load(&ga, a, error, sizeof error), 0, "%s", error);
    cr_assert_eq(golden_load(&gb, b, error, sizeof error), 0, "%s", error);
    cr_assert_eq(ga.count, gb.count, "%s: record count", a);
    for (size_t r = 0; r < ga.count; r++) {
      const golden_record *x = &ga.records[r], *y = golden_find(&gb, x->name);
      cr_assert_not_null(y, "%s: record %s not written any more", a, x->name);
      if (!strncmp(x->name, "probs/", 6) || !strncmp(x->name, "outputs/", 8)) continue;
      cr_assert(x->bytes == y->bytes && memcmp(x->data, y->data, x->bytes) == 0,
                "%s: record %s differs: a layout, encoder or generator changed (regenerate the files on purpose, "
                "with the reason in the commit)", a, x->name);
    }
    golden_free(&ga);
    golden_free(&gb);
  }
  th_remove_dir(dir);
  free(dir);
}

static golden_record *find_mut(golden_file *g, const char *name) { return (golden_record *)golden_find(g, name); }

static void drop_results(golden_file *g) {
  static const char *prefixes[] = {"matrix_sha256/", "pages/", "logits/", "probs/", "outputs/", "kept/", "margins/"};
  size_t kept = 0;
  for (size_t i = 0; i < g->count; i++) {
    int drop = 0;
    for (int p = 0; p < 7; p++) drop |= !strncmp(g->records[i].name, prefixes[p], strlen(prefixes[p]));
    if (drop) {
      free(g->records[i].name);
      free(g->records[i].data);
    } else {
      g->records[kept++] = g->records[i];
    }
  }
  g->count = kept;
}

/* A committed golden file with only its inputs (results dropped, to be recorded again). */
static void load_inputs(const char *case_name, golden_file *g) {
  char path[1024], error[512];
  snprintf(path, sizeof path, "%s/%s.kvqg", KVQ_SOURCE_GOLDEN_DIR, case_name);
  cr_assert_eq(golden_load(g, path, error, sizeof error), 0, "%s", error);
  drop_results(g);
}

/*
 * A golden file whose codes differ from what the CPU produces, in known ways:
 *   - key token 0 is made orthogonal to sketch row 0 (in double, then rounded to fp32), so the sign
 *     of its projection is a rounding accident: flipping that bit must count as a proven near-tie;
 *   - a bit of token 1 whose projection is far from 0 is flipped: unexplained;
 *   - |k_in| of token 2 moves by 1 fp16 ulp (accepted, counted) and of token 3 by 3 ulps (refused).
 */
Test(golden, near_ties_are_proven_and_nothing_else_is, .timeout = 120) {
  const char *case_name = "qjl-d128-m256-k0-u3-f32-gqa1";
  char error[512] = "";
  golden_file g;
  load_inputs(case_name, &g);
  const uint32_t d = 128, m = 256, P = 16;
  float *S = malloc(sizeof(float) * m * d);
  cr_assert_eq(kvq_build_sketch(5, 0, KVQ_PURPOSE_QJL_SKETCH, m, d, S), 0); /* the case's seed is 5 */
  golden_record *keys = find_mut(&g, "keys/0");
  float *k0 = (float *)keys->data; /* sequence 0 starts at stream token 0; one kv head */
  double dot = 0, norm2 = 0;
  for (uint32_t c = 0; c < d; c++) {
    dot += (double)S[c] * k0[c];
    norm2 += (double)S[c] * S[c];
  }
  for (uint32_t c = 0; c < d; c++) k0[c] = (float)(k0[c] - dot / norm2 * S[c]);
  kvq_context *ctx = NULL;
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_CPU;
  cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_OK);
  cr_assert_eq(kvq_golden_record_results(&g, ctx, NULL, error, sizeof error), 0, "%s", error);
  kvq_context_destroy(ctx);
  /* choose a bit of token 1 with a large projection */
  const float *k1 = k0 + d;
  uint32_t far = 0;
  for (uint32_t i = 0; i < m; i++) {
    double p = 0;
    for (uint32_t c = 0; c < d; c++) p += (double)S[(size_t)i * d + c] * k1[c];
    if (fabs(p) > 5.0) {
      far = i;
      break;
    }
  }
  golden_record *pages = find_mut(&g, "pages/0/0/0");
  uint8_t *block = pages->data;
  block[kvq_qjl_signs_offset() + 0] ^= 1;                              /* token 0, bit 0 */
  block[kvq_qjl_signs_offset() + m / 8 + far / 8] ^= (uint8_t)(1u << (far % 8)); /* token 1, bit `far` */
  const uint32_t norms = kvq_qjl_norm_in_offset(P, m, 0, 0);
  block[norms + 2 * 2] += 1; /* |k_in| of token 2: +1 ulp */
  block[norms + 2 * 3] += 3; /* |k_in| of token 3: +3 ulps */
  golden_totals t;
  const int rc = check_file(&g, case_name, &t);
  cr_assert_eq(rc, 1, "the check must fail");
  cr_assert_eq(t.near_ties, 1u, "the orthogonal token's bit is a proven near-tie (got %llu)", (unsigned long long)t.near_ties);
  cr_assert_eq(t.unexplained, 1u, "the far bit is unexplained (got %llu)", (unsigned long long)t.unexplained);
  cr_assert_eq(t.code_bytes_differing, 2u);
  cr_assert_eq(t.side_one_ulp, 1u);
  cr_assert_eq(t.side_beyond, 1u);
  free(S);
}

/* The tool, as users' CI runs it: exit status and summary lines. */
static int run_tool(const char *args, char *output, size_t size) {
  char command[2048];
  snprintf(command, sizeof command, "%s %s 2>&1", KVQ_TOOL_PATH, args);
  FILE *p = popen(command, "r");
  cr_assert_not_null(p);
  size_t n = fread(output, 1, size - 1, p);
  output[n] = 0;
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(golden, tool_exit_status_and_summary, .timeout = 120) {
  static char output[65536];
  char args[1024];
  snprintf(args, sizeof args, "golden --check --backend cpu --dir %s", KVQ_SOURCE_GOLDEN_DIR);
  cr_assert_eq(run_tool(args, output, sizeof output), 0, "%s", output);
  const char *lines[] = {"matrices: ", "class 1 (codes): ", "class 2 (side data): ",
                         "class 3 (scores, probabilities, outputs): ", "saved files: ", "--backend cpu: PASS"};
  for (int i = 0; i < 6; i++) cr_assert_not_null(strstr(output, lines[i]), "missing '%s' in:\n%s", lines[i], output);
  char *empty = th_temp_dir("golden");
  snprintf(args, sizeof args, "golden --check --dir %s", empty);
  cr_assert_eq(run_tool(args, output, sizeof output), 2, "no files is an error, not a pass:\n%s", output);
  th_remove_dir(empty);
  snprintf(args, sizeof args, "golden --check --dir %s", empty);
  cr_assert_eq(run_tool(args, output, sizeof output), 2, "a directory that is not there is an error:\n%s", output);
  free(empty);
  /* Without --dir, the build tree's kvq checks its own source tree's files (the README's command). */
  cr_assert_eq(run_tool("golden --check --backend cpu", output, sizeof output), 0, "%s", output);
  snprintf(args, sizeof args, "golden --check --backend cuda --dir %s", KVQ_SOURCE_GOLDEN_DIR);
  kvq_backend_info infos[4];
  size_t count;
  kvq_backends_list(infos, 4, &count);
  if (infos[2].availability != KVQ_AVAILABLE) {
    cr_assert_eq(run_tool(args, output, sizeof output), 2, "%s", output);
    cr_assert_not_null(strstr(output, "unavailable"), "%s", output);
  }
  cr_assert_eq(run_tool("golden --check --write", output, sizeof output), 2, "%s", output);
  cr_assert_eq(run_tool("golden --frobnicate", output, sizeof output), 2, "%s", output);
  cr_assert_eq(run_tool("golden --check --backend tpu", output, sizeof output), 2, "%s", output);
}


/* Checks the CPU against one committed golden file with one byte of one record changed. */
static int check_with_changed_byte(const char *case_name, const char *record, size_t offset, uint8_t flip,
                                   golden_totals *t) {
  char path[1024], error[512];
  snprintf(path, sizeof path, "%s/%s.kvqg", KVQ_SOURCE_GOLDEN_DIR, case_name);
  golden_file g;
  cr_assert_eq(golden_load(&g, path, error, sizeof error), 0, "%s", error);
  golden_record *r = find_mut(&g, record);
  cr_assert(r && offset < r->bytes, "%s: record %s has %llu bytes", case_name, record, r ? (unsigned long long)r->bytes : 0ull);
  r->data[offset] ^= flip;
  return check_file(&g, case_name, t);
}

/* Every kind of byte of a page is compared: padding, codes and side data of tokens past the valid
 * count, unused code bits. One changed byte anywhere must fail the check as unexplained. Offsets
 * follow docs/FORMAT.md for the last, partial page of sequence 1 (flushed at its end). */
Test(golden, every_kind_of_byte_is_compared, .timeout = 120) {
  struct {
    const char *case_name, *record;
    size_t offset;
    uint8_t flip;
    const char *what;
  } changes[] = {
      /* QJL keys, d 64, m 128, k 4, m_o 64, P 16; sequence 1 has 33 tokens: page 2 holds 1 */
      {"qjl-d64-m128-k4-u1-f16-gqa4-window", "pages/0/0/1", 2 * 464 + 5 * 16, 0x01, "sign bits of a padding token"},
      {"qjl-d64-m128-k4-u1-f16-gqa4-window", "pages/0/0/1", 2 * 464 + 384 + 6, 0x01, "|k_in| of a padding token"},
      {"qjl-d64-m128-k4-u1-f16-gqa4-window", "pages/0/0/1", 2 * 464 + 455, 0x40, "block padding"},
      /* uniform 3-bit values, d 128, G 32, P 16; sequence 1 has 27 tokens: page 1 holds 11 */
      {"qjl-d128-m256-k0-u3-f32-gqa1", "pages/0/1/1", 1088 + 3, 0x80, "the unused top bits of a 3-bit code word"},
      {"qjl-d128-m256-k0-u3-f32-gqa1", "pages/0/1/1", 1088 + 612, 0x07, "a code of a padding token"},
      {"qjl-d128-m256-k0-u3-f32-gqa1", "pages/0/1/1", 1088 + 820 + 4 * 13 * 4, 0x01, "the scale of a padding token"},
      {"qjl-d128-m256-k0-u3-f32-gqa1", "pages/0/1/1", 1088 + 1080, 0x02, "block padding"},
      /* a sign bit of a valid token with a clear projection */
      {"qjl-d128-m256-k0-u3-f32-gqa1", "pages/0/0/0", 7, 0x10, "a sign bit of a valid token"},
      /* a uniform code of a valid token moved by two steps */
      {"qjl-d128-m256-k0-u3-f32-gqa1", "pages/0/1/0", 0, 0x02, "a 3-bit code two steps away"},
      /* PolarQuant 4,2,2,2, d 128, P 16: head block 992 bytes (level codes at 0, 512, 640, 704, radii at
       * 736); sequence 1 has 30 tokens, flushed: page 1 holds 14 */
      {"polar-4222-dense-d128-f16-gqa4-window", "pages/0/0/1", 992 + 15 * 32 + 1, 0x01, "a level-1 code of a padding token"},
      {"polar-4222-dense-d128-f16-gqa4-window", "pages/0/1/1", 992 + 736 + 2 * 15 * 8, 0x01, "a radius of a padding token"},
      {"polar-4222-dense-d128-f16-gqa4-window", "pages/0/1/1", 992 + 704 + 2, 0x03, "a level-4 code two steps away"},
      /* CQ 4c6b keys, d 128, P 16: 103 code words (5 codes each, bits 30-31 unused), head block 416
       * bytes; sequence 1 has 40 tokens, flushed: page 2 holds 8 */
      {"cq-4c6b-keys-1c3b-values-d128-f16-gqa4-window", "pages/0/0/1", 2 * 416 + 205, 0x01, "a CQ code of a padding token"},
      {"cq-4c6b-keys-1c3b-values-d128-f16-gqa4-window", "pages/0/0/1", 2 * 416 + 3, 0x80, "the unused top bits of a 6-bit code word"},
      {"cq-4c6b-keys-1c3b-values-d128-f16-gqa4-window", "pages/0/0/1", 2 * 416 + 414, 0x01, "block padding"},
  };
  for (size_t i = 0; i < sizeof changes / sizeof changes[0]; i++) {
    golden_totals t;
    int rc = check_with_changed_byte(changes[i].case_name, changes[i].record, changes[i].offset, changes[i].flip, &t);
    cr_assert_eq(rc, 1, "%s: the check must fail", changes[i].what);
    cr_assert_geq(t.unexplained, 1u, "%s: must be unexplained", changes[i].what);
    cr_assert_eq(t.near_ties, 0u, "%s: no near-tie may be claimed", changes[i].what);
  }
}

/* Sets packed code `index` (layout.h packing) of a code array to `code`. */
static void set_code(uint8_t *words, uint32_t index, uint32_t bits, uint32_t code) {
  const uint32_t cpw = kvq_codes_per_word(bits), shift = (index % cpw) * bits;
  uint8_t *p = words + 4 * (index / cpw);
  uint32_t w = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  w = (w & ~(((1u << bits) - 1u) << shift)) | code << shift;
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(w >> (8 * i));
}

static double cq_dist(const float *x, const float *mu, uint32_t c) {
  double s = 0;
  for (uint32_t i = 0; i < c; i++) s += ((double)x[i] - mu[i]) * ((double)x[i] - mu[i]);
  return s;
}

/* Learning 256 centroids from fewer points repeats some (core/learn.c): the nearest-centroid rule
 * then keeps the first of equal copies. */
static int same(const float *mu, uint32_t a, uint32_t b, uint32_t c) { return memcmp(mu + a * c, mu + b * c, 4 * c) == 0; }
static uint32_t first_copy(const float *mu, uint32_t j, uint32_t c) {
  uint32_t i = 0;
  while (!same(mu, i, j, c)) i++;
  return i;
}

/*
 * The near-tie provers of PolarQuant and CQ accept true ties and nothing else. In the fp32 case with
 * online PolarQuant keys (Hadamard, L 3, 3 bits at level 1) and CQ 8c8b values:
 *   - key token 0 is rebuilt so that its first rotated pair lies on the bisector of two level-1
 *     centroids (x = R^T y in double, rounded to fp32): its golden code is set to the centroid the
 *     CPU did not pick, which must be a proven near-tie;
 *   - value token 1's first channel group is set to the midpoint of two centroids (the pair whose
 *     rounding to fp32 moves the distances least): the same;
 *   - key token 2's first code and value token 3's first code are set to the farthest centroid:
 *     unexplained.
 */
Test(golden, polar_and_cq_near_ties_are_proven, .timeout = 120) {
  const char *case_name = "polar-online-322-hadamard-keys-cq-8c8b-values-d64-f32-gqa2";
  char error[512] = "";
  golden_file g;
  load_inputs(case_name, &g);
  kvq_context *ctx = NULL;
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_CPU;
  cr_assert_eq(kvq_context_create(&opt, &ctx), KVQ_OK);
  kvq_cache *cache = NULL;
  cr_assert_eq(kvq_golden_record_results(&g, ctx, &cache, error, sizeof error), 0, "%s", error);
  drop_results(&g);
  const kvq_layer_storage *ls = &cache->storage[0];
  const kvq_side_layout *ks = &ls->side[0].layout, *vs = &ls->side[1].layout;
  const uint32_t d = 64, hkv = 2, K1 = 8, c = 8, K = 256;
  cr_assert(ks->method == KVQ_LAYOUT_POLAR && vs->method == KVQ_LAYOUT_CQ && vs->channels == c && vs->code_bits == 8);
  float *keys = (float *)find_mut(&g, "keys/0")->data, *values = (float *)find_mut(&g, "values/0")->data;
  /* key token 0, head 0: the first pair on the bisector of its two best centroids */
  const float *table1 = golden_polar_table(ks, ls->fixed_host[0][1], 0, 1);
  double y[64], err[64];
  golden_polar_rotate(ks, ls->fixed_host[0][0], keys, y, err);
  uint32_t best = 0, second = 1;
  for (uint32_t j = 0; j < K1; j++) {
    const double dot = y[0] * table1[2 * j] + y[1] * table1[2 * j + 1];
    if (dot > y[0] * table1[2 * best] + y[1] * table1[2 * best + 1]) second = best, best = j;
    else if (j != best && (second == best || dot > y[0] * table1[2 * second] + y[1] * table1[2 * second + 1])) second = j;
  }
  const double r = hypot(y[0], y[1]);
  double bx = (double)table1[2 * best] + table1[2 * second], by = (double)table1[2 * best + 1] + table1[2 * second + 1];
  const double bn = hypot(bx, by);
  y[0] = r * bx / bn, y[1] = r * by / bn;
  for (uint32_t col = 0; col < d; col++) { /* x = R^T y */
    double x = 0;
    for (uint32_t i = 0; i < d; i++) x += golden_polar_entry(ks, ls->fixed_host[0][0], i, col) * y[i];
    keys[col] = (float)x;
  }
  /* value token 1, head 0, group 0: the midpoint of a centroid pair that are its two nearest, the
   * pair least disturbed by rounding */
  const float *mu = ls->fixed_host[1][1]; /* head 0, group 0 */
  float *v1 = values + (size_t)1 * hkv * d;
  uint32_t pa = 0, pb = 1;
  double best_ratio = INFINITY;
  for (uint32_t a = 0; a < K; a++)
    for (uint32_t b = a + 1; b < K; b++) {
      if (first_copy(mu, a, c) != a || first_copy(mu, b, c) != b || same(mu, a, b, c)) continue;
      float mid[8];
      for (uint32_t i = 0; i < c; i++) mid[i] = (float)(((double)mu[a * c + i] + mu[b * c + i]) / 2);
      const double da = cq_dist(mid, mu + a * c, c), db = cq_dist(mid, mu + b * c, c);
      int nearest = da > 0;
      for (uint32_t j = 0; j < K && nearest; j++) /* a and b must be the two nearest, clearly */
        nearest = first_copy(mu, j, c) == a || first_copy(mu, j, c) == b || cq_dist(mid, mu + j * c, c) > 1.001 * (da > db ? da : db);
      if (nearest && fabs(da - db) / (da + db) < best_ratio) best_ratio = fabs(da - db) / (da + db), pa = a, pb = b;
    }
  cr_assert_lt(best_ratio, 0x1p-24, "some centroid pair must have a midpoint within rounding (best %g)", best_ratio);
  for (uint32_t i = 0; i < c; i++) v1[i] = (float)(((double)mu[pa * c + i] + mu[pb * c + i]) / 2);
  cr_assert_eq(kvq_golden_record_results(&g, ctx, NULL, error, sizeof error), 0, "%s", error);
  kvq_context_destroy(ctx);
  /* the golden file now says what a backend deciding the other way would write */
  uint8_t *kpage = find_mut(&g, "pages/0/0/0")->data, *vpage = find_mut(&g, "pages/0/1/0")->data;
  const uint32_t angles1 = d / 2, groups = d / c;
  const uint32_t k0 = golden_packed_code(kpage, 0, 3), v1c = golden_packed_code(vpage, 1 * groups, 8);
  cr_assert(k0 == best || k0 == second, "the CPU picks one of the two tied centroids (%u)", k0);
  cr_assert(v1c == pa || v1c == pb, "the CPU picks one of the two tied centroids (%u)", v1c);
  set_code(kpage, 0, 3, k0 == best ? second : best);
  set_code(vpage, 1 * groups, 8, v1c == pa ? pb : pa);
  const uint32_t k2 = golden_packed_code(kpage, 2 * angles1, 3);
  set_code(kpage, 2 * angles1, 3, (k2 + K1 / 2) % K1); /* the opposite centroid */
  const float *v3 = values + (size_t)3 * hkv * d;
  uint32_t far = 0;
  for (uint32_t j = 1; j < K; j++)
    if (cq_dist(v3, mu + j * c, c) > cq_dist(v3, mu + far * c, c)) far = j;
  set_code(vpage, 3 * groups, 8, far);
  kvq_cache_destroy(cache); /* mu points into it */
  golden_totals t;
  const int rc = check_file(&g, case_name, &t);
  cr_assert_eq(rc, 1, "the check must fail");
  cr_assert_eq(t.near_ties, 2u, "the two tied codes are proven near-ties (got %llu)", (unsigned long long)t.near_ties);
  cr_assert_eq(t.unexplained, 2u, "the two far codes are unexplained (got %llu)", (unsigned long long)t.unexplained);
}

/* Token-policy cases: a kept set that differs from the golden one after any decoding step fails
 * the check (golden decisions all have clear margins, write.c), counted once per sequence. */
Test(golden, a_different_kept_set_fails, .timeout = 120) {
  golden_totals t;
  /* the first decision with evictions in sequence 0 lies past the prefill's steps; flip a position
   * of the last recorded kept set (its first entry after the count) */
  char path[1024], error[512];
  const char *case_name = "h2o-u2-keys-u2-values-d64-f16-gqa4-stream";
  snprintf(path, sizeof path, "%s/%s.kvqg", KVQ_SOURCE_GOLDEN_DIR, case_name);
  golden_file g;
  cr_assert_eq(golden_load(&g, path, error, sizeof error), 0, "%s", error);
  uint64_t n;
  const uint32_t *kept = golden_u32(golden_find(&g, "kept/0"), &n);
  cr_assert_not_null(kept);
  uint64_t at = 0, last = 0;
  while (at < n) last = at, at += 1 + kept[at];
  cr_assert_lt(kept[last], 150u, "the policy evicted tokens by the end (%u kept)", kept[last]);
  golden_free(&g);
  const int rc = check_with_changed_byte(case_name, "kept/0", 4 * (last + 2), 0x01, &t);
  cr_assert_eq(rc, 1, "the check must fail");
  cr_assert_eq(t.decisions_differing, 1u, "one sequence diverges (%llu)", (unsigned long long)t.decisions_differing);
  cr_assert_eq(t.unexplained, 0u, "codes are not affected");
}

/* ---- Loading work is bounded by the file and the configuration -------------------------------- */

static uint8_t *read_committed(const char *file, size_t *size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", KVQ_SOURCE_GOLDEN_DIR, file);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s", path);
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *data = malloc(*size);
  cr_assert(data && fread(data, 1, *size, f) == *size, "%s", path);
  fclose(f);
  return data;
}

/* Loads a saved cache and bounds the loader's work (core/internal.h, kvq_load_work) by the file's
 * size and its configuration (the CONF section, read here as the loader reads it):
 *   - every record, page number or mask the loader reads takes at least 4 bytes of the file:
 *     at most size / 4 steps;
 *   - every pass of the policy checks over a sequence's positions visits the positions of its
 *     page-table entries (at most max_pages * P over all sequences: entries own distinct pages) and
 *     those past its pages (fewer than R + P, the window): at most
 *     KVQ_POLICY_POSITION_PASSES * (max_pages * P + max_sequences * (R + P)) steps;
 *   - statistics are reserved only for records the file holds: at most size / 20 entries
 *     (STATISTICS_RECORD_BYTES).
 * For the long streams below (4 pages of 16, R = 0, one sequence, 2 to 3 KB) that is at most 1146
 * steps and 149 entries, where a loader that walks positions takes 2^31 steps and one that trusts
 * the count reserves 2^31 entries (40 GiB). */
static kvq_cache *load_bounded(kvq_context *ctx, const uint8_t *data, size_t size, kvq_status want, const char *what) {
  kvq_reader r = {data, size, KVQ_FILE_HEADER_BYTES + 16, 0};
  kvq_cache_config config;
  kvq_layer_config *layers;
  cr_assert_eq(kvq_get_config(&r, &config, &layers), 0, "%s: the config record", what);
  free(layers);
  const uint64_t P = config.page_size, window = (uint64_t)config.residual_window + P;
  const uint64_t steps = size / 4 + KVQ_POLICY_POSITION_PASSES * (config.max_pages * P + config.max_sequences * window);
  const uint64_t reserved = size / KVQ_STATISTICS_RECORD_BYTES;
  kvq_cache *cache = NULL;
  const kvq_status st = kvq_cache_load_from_memory(ctx, data, size, &cache);
  cr_log_info("%s: %s, %llu steps (bound %llu), %llu statistics reserved (bound %llu)", what, kvq_status_string(st),
              (unsigned long long)ctx->load_work.steps, (unsigned long long)steps,
              (unsigned long long)ctx->load_work.reserved, (unsigned long long)reserved);
  cr_assert_eq(st, want, "%s: %s (%s), expected %s", what, kvq_status_string(st), kvq_context_last_error(ctx),
               kvq_status_string(want));
  cr_assert_leq(ctx->load_work.steps, steps, "%s: %llu loader steps, bound %llu", what,
                (unsigned long long)ctx->load_work.steps, (unsigned long long)steps);
  cr_assert_leq(ctx->load_work.reserved, reserved, "%s: %llu statistics reserved, bound %llu", what,
                (unsigned long long)ctx->load_work.reserved, (unsigned long long)reserved);
  return cache;
}

/* One sequence of 2^31 - 16 tokens in about 2 KB (tools/golden/write.c): the committed files that
 * must be refused, as the writer makes them, and their loadable twins, all within the bound. */
Test(golden, long_streams_load_in_bounded_work, .timeout = 120) {
  kvq_context *ctx = th_cpu_context();
  const struct {
    golden_long_stream which;
    const char *file; /* committed, or NULL: a file that loads */
    uint32_t pages, kept;
  } streams[] = {
      {GOLDEN_LONG_FAR_POSITION, "reject-bad-format-far-position.kvq", 0, 0},
      {GOLDEN_LONG_HUGE_COUNT, "reject-bad-format-huge-count.kvq", 0, 0},
      {GOLDEN_LONG_WITHOUT_SINKS, NULL, 1, 16}, /* the last page */
      {GOLDEN_LONG_WITH_SINKS, NULL, 2, 20},    /* the 4 sinks and the last page */
  };
  for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++) {
    size_t size;
    uint8_t *data = kvq_golden_long_stream(streams[i].which, &size);
    cr_assert_not_null(data);
    if (streams[i].file) {
      size_t committed_size;
      uint8_t *committed = read_committed(streams[i].file, &committed_size);
      cr_assert(committed_size == size && memcmp(committed, data, size) == 0,
                "%s: the writer makes other bytes than the committed file", streams[i].file);
      free(committed);
      cr_assert_null(load_bounded(ctx, data, size, KVQ_ERROR_BAD_FORMAT, streams[i].file));
    } else {
      char what[64];
      snprintf(what, sizeof what, "the long stream with %u pages", streams[i].pages);
      kvq_cache *cache = load_bounded(ctx, data, size, KVQ_OK, what);
      kvq_sequence_info info;
      KVQ_CHECK(ctx, kvq_sequence_info_get(cache, 1u << 16, 0, &info));
      cr_assert(info.tokens == 0x7ffffff0u && info.pages == streams[i].pages && info.kept_tokens == streams[i].kept,
                "%s: %llu tokens, %u pages, %llu kept", what, (unsigned long long)info.tokens, info.pages,
                (unsigned long long)info.kept_tokens);
      uint8_t *again = malloc(size);
      size_t written = 0;
      KVQ_CHECK(ctx, kvq_cache_save_to_memory(cache, again, size, &written));
      cr_assert(written == size && memcmp(again, data, size) == 0, "%s: re-saves to the same bytes", what);
      free(again);
      kvq_cache_destroy(cache);
    }
    free(data);
  }
  kvq_context_destroy(ctx);
}
