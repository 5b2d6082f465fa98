/*
 * TAP test of model/ (docs/MODEL.md): the Universal Sentence Encoder-lite forward pass reproduces
 * the reference cosines, the tokenizer gives the ids read off vocab.json by hand, attention
 * through kvq with exact fp32 storage matches the plain C attention within a derived bound, and
 * missing or corrupt model files give a clear status. Needs the model (scripts/fetch-model.sh);
 * reports itself skipped, visibly, without it.
 */
#include <float.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_tap.h"


static double cosine(const float *a, const float *b) {
  double s = 0, na = 0, nb = 0;
  for (int i = 0; i < KVQ_USE_EMBEDDING_DIM; i++) s += (double)a[i] * b[i], na += (double)a[i] * a[i], nb += (double)b[i] * b[i];
  return s / sqrt(na * nb);
}

/* ---- reference cosines ---- */

static void test_cosines(const kvq_use_model *m) {
  /* The figures, from an independent implementation, printed to 3 decimals: rounding alone
   * is within 5e-4, and this forward pass's fp32 error is far below 1e-4 (sums of at most 1536
   * products: gamma(1536) ~ 1e-4 relative per dot product at worst, orders less in practice, and
   * LayerNorm rescales each layer). 1e-3 is the tolerance and covers both. */
  static const struct { const char *a, *b; double cosine; } pairs[] = {
      {"How old are you?", "What is your age?", 0.846},
      {"How old are you?", "The stock market fell sharply today.", 0.095},
      {"I like my phone", "My phone is great", 0.857},
      {"I like my phone", "Dogs are loyal animals", 0.154},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    float ea[KVQ_USE_EMBEDDING_DIM], eb[KVQ_USE_EMBEDDING_DIM];
    char message[512];
    kvq_status sa = kvq_use_embed(m, pairs[i].a, kvq_use_attention_exact, NULL, ea, message, sizeof message);
    kvq_status sb = sa == KVQ_OK ? kvq_use_embed(m, pairs[i].b, kvq_use_attention_exact, NULL, eb, message, sizeof message) : sa;
    double c = sb == KVQ_OK ? cosine(ea, eb) : NAN;
    check(sb == KVQ_OK && fabs(c - pairs[i].cosine) <= 1e-3, "cosine(\"%s\", \"%s\") = %.4f, reference %.3f %s", pairs[i].a,
          pairs[i].b, c, pairs[i].cosine, sb == KVQ_OK ? "" : message);
  }
}

/* ---- tokenizer ---- */

static void test_tokenizer(const kvq_use_model *m) {
  /* Expected ids read off vocab.json (id = index in the list), with the scores that decide:
   *  "How old are you?": ▁How 728, ▁old 446, ▁are 31, ▁you 19, ? 54 (each a whole piece).
   *  "The stock market fell sharply today.": no "▁sharply"; ▁sharp (5344, -10.697) + ly (56, -6.117)
   *    = -16.81 beats e.g. ▁sh + ar + p + ly = -30.2.
   *  "The cat sat on the mat.": no "▁mat"; ▁ma (688, -8.613) + t (17, -4.776) = -13.39 beats
   *    ▁m (889, -8.867) + at (313, -7.845) = -16.71.
   *  "  I   like\tmy phone  ": whitespace runs are one word break, the ends are trimmed: as
   *    "I like my phone" = ▁I 16, ▁like 60, ▁my 69, ▁phone 825.
   *  "I like 漢": 漢 is no piece, nor is "▁漢": ▁ (30) then the unknown piece 0. */
  static const struct { const char *text; int32_t ids[10]; size_t count; } cases[] = {
      {"How old are you?", {728, 446, 31, 19, 54}, 5},
      {"The stock market fell sharply today.", {34, 801, 617, 3262, 5344, 56, 784, 6}, 8},
      {"The cat sat on the mat.", {34, 1163, 3757, 25, 9, 688, 17, 6}, 8},
      {"  I   like\tmy phone  ", {16, 60, 69, 825}, 4},
      {"I like \xe6\xbc\xa2", {16, 60, 30, 0}, 4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int32_t ids[64];
    size_t count = 0;
    kvq_status status = kvq_use_tokenize(m, cases[i].text, ids, 64, &count);
    int same = status == KVQ_OK && count == cases[i].count && !memcmp(ids, cases[i].ids, count * sizeof *ids);
    check(same, "tokenize \"%s\" (%zu pieces)", cases[i].text, count);
    if (!same) {
      printf("# got:");
      for (size_t j = 0; j < count && j < 64; j++) printf(" %d", ids[j]);
      printf("\n");
    }
  }
  size_t count = 0;
  check(kvq_use_tokenize(m, "bad \xff utf-8", NULL, 0, &count) == KVQ_ERROR_INVALID_ARGUMENT,
        "invalid UTF-8 is KVQ_ERROR_INVALID_ARGUMENT");
  int32_t one;
  check(kvq_use_tokenize(m, "How old are you?", &one, 1, &count) == KVQ_ERROR_BUFFER_TOO_SMALL && count == 5,
        "a short buffer is KVQ_ERROR_BUFFER_TOO_SMALL with the count");
}

/* ---- exact attention through kvq ---- */

typedef struct compare {
  kvq_use_kvq *kvq;
  double worst;   /* the largest |kvq - plain| / bound seen */
  int failed;
  char error[600];
} compare;

/*
 * Runs kvq's attention and the plain one on the same q, k, v and keeps the worst ratio of their
 * difference to this bound, per output element (docs/ACCURACY.md's attention bound with exact
 * storage, both sides' errors counted):
 *   logits: each side errs by at most gamma(d + 2) sum_c |q_c k_c| / sqrt(d) (fp32 dot products of d
 *   terms and the scale; the plain side's double sums err far less), so their difference is at most
 *   D = 2 gamma(d + 2) max_j sum_c |q_c k_jc| / sqrt(d);
 *   a logit error D changes each probability by at most a factor e^{2D}, so an output by
 *   (e^{2D} - 1) sum_j p_j |v_jc|; the softmax's own rounding (exp, the n-term sum, the division,
 *   the n-term weighted sum) adds (2n + 8) u sum_j p_j |v_jc| per side, u = 2^-24.
 * Continues with kvq's output, so the forward pass goes on through kvq.
 */
static kvq_status compare_attention(void *user, uint32_t layer, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                                    const float *q, const float *k, const float *v, float *out) {
  compare *c = user;
  if (tokens > 128) { /* the arrays below hold the model's most tokens */
    snprintf(c->error, sizeof c->error, "%u tokens: more than this test's 128", tokens);
    return KVQ_ERROR_OUT_OF_RANGE;
  }
  const size_t n = (size_t)tokens * heads * head_dim;
  float *plain = malloc(n * sizeof *plain);
  if (!plain) return KVQ_ERROR_OUT_OF_MEMORY;
  kvq_status status = kvq_use_attention_exact(NULL, layer, tokens, heads, head_dim, q, k, v, plain);
  if (status == KVQ_OK) status = kvq_use_kvq_attention(c->kvq, layer, tokens, heads, head_dim, q, k, v, out);
  if (status != KVQ_OK) {
    snprintf(c->error, sizeof c->error, "%s", kvq_use_kvq_last_error(c->kvq));
    free(plain);
    return status;
  }
  const double u = ldexp(1.0, -24), gamma = (head_dim + 2) * u / (1 - (head_dim + 2) * u);
  const size_t row = (size_t)heads * head_dim;
  for (uint32_t h = 0; h < heads; h++) {
    for (uint32_t i = 0; i < tokens; i++) {
      const float *qi = q + i * row + (size_t)h * head_dim;
      double largest_abs = 0, logit[128], top = -INFINITY;
      for (uint32_t j = 0; j < tokens; j++) {
        const float *kj = k + j * row + (size_t)h * head_dim;
        double abs_sum = 0, s = 0;
        for (uint32_t d = 0; d < head_dim; d++) abs_sum += fabs((double)qi[d] * kj[d]), s += (double)qi[d] * kj[d];
        logit[j] = s / sqrt((double)head_dim);
        if (logit[j] > top) top = logit[j];
        if (abs_sum > largest_abs) largest_abs = abs_sum;
      }
      const double D = 2 * gamma * largest_abs / sqrt((double)head_dim);
      double p[128], sum = 0;
      for (uint32_t j = 0; j < tokens; j++) sum += p[j] = exp(logit[j] - top);
      for (uint32_t d = 0; d < head_dim; d++) {
        double weighted = 0;
        for (uint32_t j = 0; j < tokens; j++) weighted += p[j] / sum * fabs(v[j * row + (size_t)h * head_dim + d]);
        const double bound = (expm1(2 * D) + 2 * (2.0 * tokens + 8) * u) * weighted + FLT_MIN;
        const size_t at = i * row + (size_t)h * head_dim + d;
        const double ratio = fabs((double)out[at] - plain[at]) / bound;
        if (ratio > c->worst) c->worst = ratio;
      }
    }
  }
  free(plain);
  return KVQ_OK;
}

static void test_kvq_exact(const kvq_use_model *m) {
  kvq_use_kvq_options options = {.backend = KVQ_BACKEND_CPU, .methods = {"exact-f32", "exact-f32"}, .seed = 1};
  compare c = {0};
  char message[512];
  kvq_status status = kvq_use_kvq_create(&options, kvq_use_max_tokens(m), &c.kvq, message, sizeof message);
  check(status == KVQ_OK, "a kvq cache for both layers (head_dim 64 and 128, exact fp32) %s", message);
  if (status != KVQ_OK) return;
  static const char *sentences[] = {"How old are you?", "The stock market fell sharply today.",
                                    "In the beginning God created the heaven and the earth."};
  for (size_t i = 0; i < 3; i++) {
    float via_kvq[KVQ_USE_EMBEDDING_DIM], plain[KVQ_USE_EMBEDDING_DIM];
    c.worst = 0;
    status = kvq_use_embed(m, sentences[i], compare_attention, &c, via_kvq, message, sizeof message);
    kvq_status plain_status = kvq_use_embed(m, sentences[i], kvq_use_attention_exact, NULL, plain, message, sizeof message);
    check(status == KVQ_OK && plain_status == KVQ_OK && c.worst <= 1.0,
          "\"%s\": kvq's exact attention within the derived bound in both layers (worst %.3g of it) %s", sentences[i],
          c.worst, c.error);
    printf("# embedding through kvq vs plain: cosine %.9f\n", status == KVQ_OK ? cosine(via_kvq, plain) : NAN);
  }
  kvq_use_kvq_options bad = {.backend = KVQ_BACKEND_CPU, .methods = {"nonsense-b9", "exact-f32"}};
  kvq_use_kvq *none = NULL;
  check(kvq_use_kvq_create(&bad, 128, &none, message, sizeof message) == KVQ_ERROR_INVALID_ARGUMENT && !none,
        "an unknown method name is refused: %s", message);
  kvq_use_kvq_destroy(c.kvq);
}

/* ---- Q/K/V of a layer, and compressed methods end to end ---- */

typedef struct recording {
  uint32_t layer;
  float out[5 * 4 * 128];
} recording;

/* Keeps the attention output the forward pass got for one layer. */
static kvq_status record_attention(void *user, uint32_t layer, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                                   const float *q, const float *k, const float *v, float *out) {
  recording *r = user;
  kvq_status status = kvq_use_attention_exact(NULL, layer, tokens, heads, head_dim, q, k, v, out);
  if (status == KVQ_OK && layer == r->layer) memcpy(r->out, out, (size_t)tokens * heads * head_dim * sizeof *out);
  return status;
}

static void test_capture(const kvq_use_model *m) {
  /* "How old are you?" is 5 pieces (test_tokenizer); layer 0 has head_dim 64, layer 1 128 */
  static const int32_t ids[5] = {728, 446, 31, 19, 54};
  static float q[5 * 4 * 128], k[5 * 4 * 128], v[5 * 4 * 128], out[5 * 4 * 128];
  for (uint32_t layer = 0; layer < KVQ_USE_LAYERS; layer++) {
    uint32_t tokens = 0, head_dim = 0;
    char message[512];
    kvq_status status = kvq_use_layer_qkv(m, ids, 5, layer, q, k, v, sizeof q / sizeof q[0], &tokens, &head_dim, message,
                                          sizeof message);
    /* the captured tensors are the layer's inputs: the reference attention on them gives, bit for
     * bit, the output the forward pass got in that layer */
    recording r = {.layer = layer};
    float embedding[KVQ_USE_EMBEDDING_DIM];
    int same = status == KVQ_OK && tokens == 5 && head_dim == (layer ? 128u : 64u) &&
               kvq_use_embed_ids(m, ids, 5, record_attention, &r, embedding, message, sizeof message) == KVQ_OK &&
               kvq_use_attention_exact(NULL, layer, tokens, 4, head_dim, q, k, v, out) == KVQ_OK &&
               !memcmp(out, r.out, (size_t)tokens * 4 * head_dim * sizeof *out);
    check(same, "kvq_use_layer_qkv: layer %u's Q, K, V (%u tokens, head_dim %u) are the ones its attention got %s", layer,
          tokens, head_dim, message);
  }
  uint32_t tokens = 0, head_dim = 0;
  check(kvq_use_layer_qkv(m, ids, 5, 1, q, k, v, 5 * 4 * 128 - 1, &tokens, &head_dim, NULL, 0) ==
            KVQ_ERROR_BUFFER_TOO_SMALL && tokens == 5 && head_dim == 128,
        "kvq_use_layer_qkv: buffers one float short are KVQ_ERROR_BUFFER_TOO_SMALL with the sizes");
}

static void test_compressed(const kvq_use_model *m) {
  /* Compressed methods run end to end through both layers and still give a unit vector; how close
   * it stays to the exact embedding is the demo's measurement (printed here, not checked). */
  static const char *specs[] = {"uniform-b4-g32", "qjl-m128-k4/uniform-b2-g32", "kivi-b2/uniform-b2-g32"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    kvq_use_kvq_options options = {.backend = KVQ_BACKEND_CPU, .methods = {specs[i], specs[i]}, .seed = 7};
    kvq_use_kvq *kvq = NULL;
    char message[512];
    float compressed[KVQ_USE_EMBEDDING_DIM], exact[KVQ_USE_EMBEDDING_DIM];
    kvq_status status = kvq_use_kvq_create(&options, kvq_use_max_tokens(m), &kvq, message, sizeof message);
    const char *text = "In the beginning God created the heaven and the earth.";
    if (status == KVQ_OK) status = kvq_use_embed(m, text, kvq_use_kvq_attention, kvq, compressed, message, sizeof message);
    if (status == KVQ_OK) status = kvq_use_embed(m, text, kvq_use_attention_exact, NULL, exact, message, sizeof message);
    double norm = 0;
    for (int c = 0; c < KVQ_USE_EMBEDDING_DIM; c++) norm += (double)compressed[c] * compressed[c];
    /* unit length up to the fp32 rounding of 512 squares and a square root: far below 1e-5 */
    check(status == KVQ_OK && fabs(norm - 1) < 1e-5, "%s in both layers: a unit embedding %s %s", specs[i], message,
          kvq ? kvq_use_kvq_last_error(kvq) : "");
    if (status == KVQ_OK) printf("# %s: cosine to the exact embedding %.4f\n", specs[i], cosine(compressed, exact));
    kvq_use_kvq_destroy(kvq);
  }
}

/* ---- missing and corrupt files ---- */

static int copy_file(const char *from, const char *to, long keep /* bytes, -1: all */) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  int ok = in && out;
  char buf[65536];
  long done = 0;
  size_t n;
  while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) {
    if (keep >= 0 && done + (long)n > keep) n = (size_t)(keep - done);
    if (fwrite(buf, 1, n, out) != n) ok = 0;
    done += (long)n;
    if (keep >= 0 && done >= keep) break;
  }
  if (in) fclose(in);
  if (out) fclose(out);
  return ok;
}

static const char *files[] = {"model.json", "vocab.json", "group1-shard1of7", "group1-shard2of7", "group1-shard3of7",
                              "group1-shard4of7", "group1-shard5of7", "group1-shard6of7", "group1-shard7of7"};

/* A copy of the model in a temporary folder, links to the real files (so corrupting one copies it). */
static int make_copy(const char *model_dir, char *dir) {
  strcpy(dir, "/tmp/kvq-model-test-XXXXXX");
  if (!mkdtemp(dir)) return 0;
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char from[4200], to[4300];
    snprintf(from, sizeof from, "%s/%s", model_dir, files[i]);
    snprintf(to, sizeof to, "%s/%s", dir, files[i]);
    if (symlink(from, to) != 0) return 0;
  }
  return 1;
}

static void remove_copy(const char *dir) {
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
  }
  rmdir(dir);
}

/* Replaces one file of the copy: the original's first `keep` bytes, or text with one edit. */
static int replace(const char *model_dir, const char *dir, const char *file, long keep, const char *find,
                   const char *with) {
  char from[4200], to[4300];
  snprintf(from, sizeof from, "%s/%s", model_dir, file);
  snprintf(to, sizeof to, "%s/%s", dir, file);
  unlink(to);
  if (!find) return copy_file(from, to, keep);
  FILE *in = fopen(from, "rb");
  if (!in) return 0;
  fseek(in, 0, SEEK_END);
  long size = ftell(in);
  fseek(in, 0, SEEK_SET);
  char *text = malloc((size_t)size + 1);
  int ok = text && fread(text, 1, (size_t)size, in) == (size_t)size;
  fclose(in);
  if (!ok) {
    free(text);
    return 0;
  }
  text[size] = 0;
  char *at = strstr(text, find);
  FILE *out = fopen(to, "wb");
  ok = at && out;
  if (ok) {
    fwrite(text, 1, (size_t)(at - text), out);
    fputs(with, out);
    fputs(at + strlen(find), out);
  }
  if (out) fclose(out);
  free(text);
  return ok;
}

static void expect_failure(const char *dir, kvq_status expected, const char *needle, const char *what) {
  kvq_use_model *m = (kvq_use_model *)&m; /* must become NULL */
  char message[1024];
  kvq_status status = kvq_use_load(dir, &m, message, sizeof message);
  check(status == expected && m == NULL && strstr(message, needle) != NULL, "%s: %s (\"%s\")", what,
        kvq_status_string(status), message);
  if (status == KVQ_OK) kvq_use_free(m);
}

static void test_bad_files(const char *model_dir) {
  char dir[64];
  if (!make_copy(model_dir, dir)) {
    check(0, "cannot make a copy of the model in /tmp");
    return;
  }
  kvq_use_model *m = NULL;
  char message[1024];
  check(kvq_use_load(dir, &m, message, sizeof message) == KVQ_OK, "the copy loads %s", message);
  kvq_use_free(m);

  char path[4200];
  snprintf(path, sizeof path, "%s/group1-shard3of7", dir);
  unlink(path);
  expect_failure(dir, KVQ_ERROR_IO, "group1-shard3of7", "a missing shard");
  replace(model_dir, dir, "group1-shard3of7", -1, NULL, NULL);

  replace(model_dir, dir, "group1-shard7of7", 1000000, NULL, NULL);
  expect_failure(dir, KVQ_ERROR_TRUNCATED, "truncated", "a truncated shard");
  replace(model_dir, dir, "group1-shard7of7", -1, NULL, NULL);

  replace(model_dir, dir, "model.json", -1, "\"weightsManifest\"", "\"weightsManifest\" }} ,");
  expect_failure(dir, KVQ_ERROR_BAD_FORMAT, "not valid JSON", "bad JSON in model.json");

  /* the embedding table's dimensions swapped in the manifest (as the package lays it out): the same
   * byte count, the wrong shape */
  replace(model_dir, dir, "model.json", -1, "8002,\n            256\n", "256,\n            8002\n");
  expect_failure(dir, KVQ_ERROR_BAD_FORMAT, "module/Embeddings_en has shape", "a weight of the wrong shape");
  replace(model_dir, dir, "model.json", -1, NULL, NULL);

  replace(model_dir, dir, "vocab.json", 5000, NULL, NULL);
  expect_failure(dir, KVQ_ERROR_BAD_FORMAT, "vocab.json", "a truncated vocab.json");
  remove_copy(dir);

  expect_failure("/nonexistent/kvq-model", KVQ_ERROR_IO, "fetch-model.sh", "a missing model folder");
}

int main(void) {
  char dir[4096];
  int exit_code;
  kvq_use_model *m = model_tap_load(dir, sizeof dir, &exit_code);
  if (!m) return exit_code;
  test_cosines(m);
  test_tokenizer(m);
  test_kvq_exact(m);
  test_capture(m);
  test_compressed(m);
  kvq_use_free(m);
  test_bad_files(dir);
  return model_tap_finish();
}
