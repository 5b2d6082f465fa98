/*
 * kvq demo: the Universal Sentence Encoder-lite (model/use.h) embeds N real sentences with exact
 * attention, then again with the attention of both layers computed by kvq over each compressed
 * cache; a table of what each method saves (memory per token, bits per number) and costs (cosine of
 * the embeddings to the exact ones, nearest neighbours that change, attention-score error, time),
 * and a plot of quality against bits per number. docs/EVAL.md ("kvq demo") explains the columns.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "demo_policy.h"
#include "demo_run.h"
#include "method_spec.h"
#include "model_input.h"
#include "plot.h"
#include "progress.h"

/* Every kind of method kvq has, each at a low and a high bit width where it has both; one name for
 * keys and values unless values cannot use it (QJL is for keys only). Then each token policy on
 * 4-bit storage, whose own error is small, so that the rows show what eviction costs. */
static const char *default_methods =
    "exact-f16,exact-bf16,"
    "qjl-m256-k8/uniform-b4,qjl-m256-k8/uniform-b2,"
    "uniform-b4,uniform-b2,"
    "kivi-b4/uniform-b4,kivi-b2/uniform-b2,"
    "polar-b4222,polar-b4222-hadamard-online,"
    "cq-c2-b8-i25,cq-c4-b8-i25,"
    "uniform-b4@streaming,uniform-b4@h2o,uniform-b4@qhitter";

/* 2000 sentences, the "a few thousand": about 6 minutes for the default methods on an idle
 * 2-core x86-64, estimated from the CPU time measured at 100 to 1500 sentences, and about 1 more for
 * the three policy rows (docs/EVAL.md, "kvq demo"). */
enum { DEFAULT_SENTENCES = 2000, DEFAULT_CALIBRATION = 64 };

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvq demo [--sentences N] [--methods LIST] [--backend NAME] [--plot FILE.png]\n"
          "                [--calibration C] [--budget B] [--threads T] [--quiet]\n"
          "\n"
          "The Universal Sentence Encoder-lite (scripts/fetch-model.sh fetches it) embeds the first N\n"
          "sentences of the King James Bible with exact attention, then with the attention of both\n"
          "layers computed by kvq over each method's compressed cache (every token compressed), and\n"
          "prints per method:\n"
          "  B/token     kvq's page bytes per token, both layers, keys and values (policy rows: per\n"
          "              token of the sentences, times the share of tokens kept)\n"
          "  bits        bits per stored number (side data and padding included; policy rows: likewise)\n"
          "  cos-mean, cos-worst   cosine of each sentence's embedding to its exact embedding\n"
          "  nn-same%%    sentences whose nearest neighbour among the N (by the method's embeddings)\n"
          "              is the one exact embeddings give\n"
          "  score-err   mean over tokens, heads and layers of max_j |p^_j - p_j|, kvq's attention\n"
          "              probabilities against exact ones on the same inputs\n"
          "  seconds     wall time of the row (codebook learning included)\n"
          "\n"
          "  --sentences N    sentences to embed (default %d: about 7.5 minutes on an idle 2-core machine)\n"
          "  --methods LIST   comma-separated kvq eval method names, the same for both layers (docs/EVAL.md),\n"
          "                   each optionally METHOD@POLICY: streaming, h2o, qhitter or qhitter-l<lambda>\n"
          "                   default: %s\n"
          "  --backend NAME   cpu (default), vulkan, cuda or auto\n"
          "  --plot FILE.png  quality (1 - mean cosine) against bits per number (default demo.png; \"\" for none)\n"
          "  --calibration C  sentences after the N whose K/V teach CQ and online PolarQuant their codebooks\n"
          "                   (default %d)\n"
          "  --budget B       policy rows: tokens each layer of a sentence keeps (default %d, at least 20):\n"
          "                   the 4 first and the 16 newest, the rest heavy hitters (StreamingLLM: newest)\n"
          "  --threads T      worker threads, each with its own kvq context (default: the CPUs online)\n"
          "  --quiet          no progress line on stderr\n"
          "\n"
          "A policy row attends once to score the tokens, evicts all but the budget in that layer, and\n"
          "attends again over the kept tokens (docs/MODEL.md, \"Token policies\").\n",
          DEFAULT_SENTENCES, default_methods, DEFAULT_CALIBRATION, DEMO_DEFAULT_BUDGET);
}

static int parse_u32(const char *s, uint32_t *out) {
  char *end;
  unsigned long v = s ? strtoul(s, &end, 10) : 0;
  if (!s || !*s || *end || v > UINT32_MAX || s[0] == '-') return -1;
  *out = (uint32_t)v;
  return 0;
}

/* The dot product of two embeddings in double, in four partial sums so that the products overlap
 * instead of waiting on one chain of additions. Symmetric: a * b == b * a in IEEE arithmetic. */
static double pair_dot(const float *a, const float *b) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (uint32_t c = 0; c < KVQ_USE_EMBEDDING_DIM; c += 4) {
    s0 += (double)a[c] * b[c];
    s1 += (double)a[c + 1] * b[c + 1];
    s2 += (double)a[c + 2] * b[c + 2];
    s3 += (double)a[c + 3] * b[c + 3];
  }
  return (s0 + s1) + (s2 + s3);
}

/* For each sentence, the index of the most similar other sentence (largest dot product of unit
 * embeddings; ties go to the lower index). Each pair's dot product is computed once and offered to
 * both sentences, and every sentence sees its candidates in increasing index order, so ties still
 * go to the lower one; at N = 2000 that halves 4 million dot products per row of the table. */
static void nearest(const float *e, uint32_t n, uint32_t *out) {
  const size_t dim = KVQ_USE_EMBEDDING_DIM;
  double *best = malloc((n ? n : 1) * sizeof *best);
  for (uint32_t i = 0; i < n; i++) {
    if (best) best[i] = -INFINITY;
    out[i] = 0;
  }
  for (uint32_t i = 0; i < n; i++) {
    if (!best) { /* no memory for the pair loop: every pair twice, the same result */
      double top = -INFINITY;
      for (uint32_t j = 0; j < n; j++) {
        const double dot = j == i ? -INFINITY : pair_dot(e + i * dim, e + j * dim);
        if (dot > top) top = dot, out[i] = j;
      }
      continue;
    }
    for (uint32_t j = i + 1; j < n; j++) {
      const double dot = pair_dot(e + i * dim, e + j * dim);
      if (dot > best[i]) best[i] = dot, out[i] = j;
      if (dot > best[j]) best[j] = dot, out[j] = i;
    }
  }
  free(best);
}

typedef struct job {
  const kvq_use_model *model;
  const demo_sentences *sentences;
  const char *method;
  uint32_t budget;
  kvq_backend_kind backend;
  const demo_calibration *calibration;
  uint32_t threads;
  volatile uint32_t done;
  volatile int finished;
  demo_row row;
  int status;
  char error[1024];
} job;

static void *run_job(void *arg) {
  job *j = arg;
  j->status = demo_run(j->model, j->sentences, j->method, j->budget, j->backend, j->calibration, j->threads,
                       &j->done, &j->row, j->error, sizeof j->error);
  __atomic_store_n(&j->finished, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Runs one row on a thread while this one shows its progress. */
static int run_row(job *j, progress *p) {
  pthread_t thread;
  if (pthread_create(&thread, NULL, run_job, j) != 0) {
    snprintf(j->error, sizeof j->error, "cannot start a thread");
    return -1;
  }
  const struct timespec tick = {0, 200000000};
  while (!__atomic_load_n(&j->finished, __ATOMIC_ACQUIRE)) {
    const uint32_t done = __atomic_load_n(&j->done, __ATOMIC_RELAXED);
    progress_phase(p, done ? "embedding sentences" : "learning codebooks or starting", done,
                   done ? j->sentences->count : 0);
    nanosleep(&tick, NULL);
  }
  pthread_join(thread, NULL);
  return j->status;
}

/* K/V of the calibration sentences, per layer, concatenated (the exact forward pass). */
static int calibrate(const kvq_use_model *model, const demo_sentences *cal, float *keys[KVQ_USE_LAYERS],
                     float *values[KVQ_USE_LAYERS], demo_calibration *out, char *error, size_t size) {
  size_t total = 0;
  for (uint32_t s = 0; s < cal->count; s++) total += cal->counts[s] < 128 ? cal->counts[s] : 128;
  const size_t capacity = (size_t)128 * KVQ_USE_HEADS * 128;
  float *q = malloc(capacity * sizeof *q), *k = malloc(capacity * sizeof *k), *v = malloc(capacity * sizeof *v);
  int failed = !q || !k || !v;
  for (uint32_t l = 0; l < KVQ_USE_LAYERS && !failed; l++) {
    const size_t row = (size_t)KVQ_USE_HEADS * (l == 0 ? 64 : 128);
    keys[l] = malloc((total ? total : 1) * row * sizeof(float));
    values[l] = malloc((total ? total : 1) * row * sizeof(float));
    if (!keys[l] || !values[l]) {
      failed = 1;
      break;
    }
    uint32_t at = 0;
    for (uint32_t s = 0; s < cal->count && !failed; s++) {
      uint32_t tokens, head_dim;
      char message[512];
      if (kvq_use_layer_qkv(model, cal->ids[s], cal->counts[s], l, q, k, v, capacity, &tokens, &head_dim, message,
                            sizeof message) != KVQ_OK) {
        snprintf(error, size, "calibration sentence %u: %s", s + 1, message);
        failed = 1;
        break;
      }
      memcpy(keys[l] + at * row, k, tokens * row * sizeof(float));
      memcpy(values[l] + at * row, v, tokens * row * sizeof(float));
      at += tokens;
    }
    out->keys[l] = keys[l];
    out->values[l] = values[l];
    out->tokens[l] = at;
  }
  free(q);
  free(k);
  free(v);
  if (failed && !error[0]) snprintf(error, size, "out of memory");
  return failed ? -1 : 0;
}

typedef struct result {
  char name[128];
  demo_row row;
  double cos_mean, cos_worst, nn_same;
} result;

int kvq_cmd_demo(int argc, char **argv) {
  uint32_t sentences_wanted = DEFAULT_SENTENCES, calibration_wanted = DEFAULT_CALIBRATION, threads = 0;
  uint32_t budget = DEMO_DEFAULT_BUDGET;
  const char *methods = default_methods, *plot_path = "demo.png";
  kvq_backend_kind backend = KVQ_BACKEND_CPU;
  int quiet = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--quiet")) {
      quiet = 1;
      continue;
    }
    int bad = !value;
    if (!strcmp(a, "--sentences")) bad = bad || parse_u32(value, &sentences_wanted) || sentences_wanted < 2;
    else if (!strcmp(a, "--calibration")) bad = bad || parse_u32(value, &calibration_wanted) || calibration_wanted < 1;
    else if (!strcmp(a, "--budget")) bad = bad || parse_u32(value, &budget);
    else if (!strcmp(a, "--threads")) bad = bad || parse_u32(value, &threads) || threads < 1 || threads > 256;
    else if (!strcmp(a, "--methods")) methods = value;
    else if (!strcmp(a, "--plot")) plot_path = value;
    else if (!strcmp(a, "--backend")) bad = bad || kvq_parse_backend(value, &backend) != 0;
    else {
      fprintf(stderr, "kvq demo: unknown option '%s'\n\n", a);
      usage(stderr);
      return 2;
    }
    if (bad) {
      fprintf(stderr, "kvq demo: %s needs a valid value (kvq demo --help)\n", a);
      return 2;
    }
    i++;
  }
  if (threads == 0) {
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cpus > 0 ? (uint32_t)(cpus < 64 ? cpus : 64) : 1;
  }
  /* every row name is checked, its method at both head_dims and its policy with the budget, before
   * anything runs */
  for (const char *at = methods;;) {
    const size_t len = strcspn(at, ",");
    kvq_method_config keys, values;
    kvq_policy_config policy;
    char method[128], why[512];
    if (demo_policy_parse(at, len, budget, method, sizeof method, &policy, why, sizeof why) != 0) {
      fprintf(stderr, "kvq demo: --methods: %s (--budget: kvq demo --help)\n", why);
      return 2;
    }
    for (uint32_t d = 64; d <= 128; d *= 2)
      if (kvq_parse_layer_spec(method, strlen(method), d, &keys, &values) != 0) {
        fprintf(stderr, "kvq demo: \"%.*s\" in --methods is not a method name kvq demo runs (docs/EVAL.md, \"Method "
                "names\")\n", (int)len, at);
        return 2;
      }
    if (!at[len]) break;
    at += len + 1;
  }
  char error[2048] = "";
  kvq_use_model *model = NULL;
  if (model_input_load(&model, error, sizeof error) != 0) {
    fprintf(stderr, "kvq demo: %s\n", error);
    return 2;
  }
  corpus text;
  if (model_input_sentences(NULL, sentences_wanted + calibration_wanted, &text, error, sizeof error) != 0) {
    fprintf(stderr, "kvq demo: %s\n", error);
    kvq_use_free(model);
    return 2;
  }
  int status = 1;
  const uint32_t total = text.count;
  int32_t **ids = calloc(total ? total : 1, sizeof *ids);
  size_t *counts = calloc(total ? total : 1, sizeof *counts);
  result *results = NULL;
  uint32_t *exact_nn = NULL, *method_nn = NULL, rows = 0;
  float *cal_keys[KVQ_USE_LAYERS] = {0}, *cal_values[KVQ_USE_LAYERS] = {0};
  progress *p = NULL;
  demo_row exact = {0};
  if (!ids || !counts) goto done;
  for (uint32_t s = 0; s < total; s++) {
    kvq_use_tokenize(model, text.sentences[s], NULL, 0, &counts[s]);
    if (counts[s] == 0 || !(ids[s] = malloc(counts[s] * sizeof **ids)) ||
        kvq_use_tokenize(model, text.sentences[s], ids[s], counts[s], &counts[s]) != KVQ_OK) {
      fprintf(stderr, "kvq demo: sentence %u cannot be tokenized: %s\n", s + 1, text.sentences[s]);
      goto done;
    }
  }
  if (total < sentences_wanted + 1) {
    fprintf(stderr, "kvq demo: only %u sentences for %u and calibration\n", total, sentences_wanted);
    goto done;
  }
  const demo_sentences measured = {ids, counts, sentences_wanted};
  const demo_sentences calibration_set = {ids + sentences_wanted, counts + sentences_wanted, total - sentences_wanted};
  size_t tokens = 0;
  for (uint32_t s = 0; s < measured.count; s++) tokens += counts[s] < 128 ? counts[s] : 128;
  /* SentencePiece normalizes text to NFKC first, model/tokenizer.c does not: NFKC leaves ASCII as it
   * is, so the table says whether the text holds anything else (UTF-8 lead bytes >= 0x80) */
  size_t non_ascii = 0, text_bytes = 0;
  for (uint32_t s = 0; s < total; s++)
    for (const unsigned char *c = (const unsigned char *)text.sentences[s]; *c; c++, text_bytes++)
      non_ascii += *c >= 0xc0; /* one per character: its UTF-8 lead byte (continuation bytes are 0x80-0xbf) */
  /* the rows: the reference, then each method */
  uint32_t method_count = 1;
  for (const char *c = methods; *c; c++) method_count += *c == ',';
  results = calloc(method_count, sizeof *results);
  exact_nn = calloc(sentences_wanted, sizeof *exact_nn);
  method_nn = calloc(sentences_wanted, sizeof *method_nn);
  if (!results || !exact_nn || !method_nn) goto done;
  p = progress_start(stderr, -1, method_count + 1, quiet);
  demo_calibration calibration = {0};
  progress_row(p, 0, "exact reference", 15);
  job reference = {.model = model, .sentences = &measured, .method = NULL, .backend = backend, .threads = threads};
  if (run_row(&reference, p) != 0) {
    progress_finish(p);
    p = NULL;
    fprintf(stderr, "kvq demo: exact reference: %s\n", reference.error);
    goto done;
  }
  exact = reference.row;
  nearest(exact.embeddings, sentences_wanted, exact_nn);
  int need_calibration = 0;
  const char *at = methods;
  for (uint32_t m = 0; m < method_count; m++) {
    const size_t len = strcspn(at, ",");
    if (len == 0 || len >= sizeof results[m].name) {
      progress_finish(p);
      p = NULL;
      fprintf(stderr, "kvq demo: an empty or too long method name in --methods\n");
      goto done;
    }
    memcpy(results[m].name, at, len);
    results[m].name[len] = 0;
    at += len + (at[len] == ',');
    if (strstr(results[m].name, "cq-") || strstr(results[m].name, "-online")) need_calibration = 1;
    progress_row(p, m + 1, results[m].name, len);
    if (need_calibration && !calibration.tokens[0] &&
        calibrate(model, &calibration_set, cal_keys, cal_values, &calibration, error, sizeof error) != 0) {
      progress_finish(p);
      p = NULL;
      fprintf(stderr, "kvq demo: %s\n", error);
      goto done;
    }
    job j = {.model = model, .sentences = &measured, .method = results[m].name, .budget = budget, .backend = backend,
             .calibration = &calibration, .threads = threads};
    if (run_row(&j, p) != 0) {
      progress_finish(p);
      p = NULL;
      fprintf(stderr, "kvq demo: %s: %s\n", results[m].name, j.error);
      goto done;
    }
    results[m].row = j.row;
    rows = m + 1;
    double sum = 0, worst = INFINITY;
    for (uint32_t s = 0; s < sentences_wanted; s++) {
      double dot = 0;
      for (uint32_t c = 0; c < KVQ_USE_EMBEDDING_DIM; c++)
        dot += (double)exact.embeddings[(size_t)s * KVQ_USE_EMBEDDING_DIM + c] *
               j.row.embeddings[(size_t)s * KVQ_USE_EMBEDDING_DIM + c];
      sum += dot;
      worst = fmin(worst, dot);
    }
    nearest(j.row.embeddings, sentences_wanted, method_nn);
    uint32_t same = 0;
    for (uint32_t s = 0; s < sentences_wanted; s++) same += method_nn[s] == exact_nn[s];
    results[m].cos_mean = sum / sentences_wanted;
    results[m].cos_worst = worst;
    results[m].nn_same = 100.0 * same / sentences_wanted;
  }
  progress_finish(p);
  p = NULL;
  printf("kvq demo: Universal Sentence Encoder-lite, %u sentences of the King James Bible (%zu tokens), "
         "attention of both layers through kvq (%s backend, every token compressed, %u threads)\n"
         "exact reference (plain C, fp32): %.1f s; exact fp32 cache: 6144 B/token\n\n",
         sentences_wanted, tokens, backend == KVQ_BACKEND_CPU ? "cpu" : backend == KVQ_BACKEND_VULKAN ? "vulkan"
                                                                   : backend == KVQ_BACKEND_CUDA ? "cuda" : "auto",
         threads, exact.seconds);
  printf("%-30s %8s %6s %9s %9s %8s %9s %8s\n", "method", "B/token", "bits", "cos-mean", "cos-worst", "nn-same%",
         "score-err", "seconds");
  for (uint32_t m = 0; m < rows; m++) {
    const result *r = &results[m];
    printf("%-30s %8.1f %6.3f %9.6f %9.6f %8.1f %9.5f %8.1f\n", r->name, r->row.bytes_per_token,
           r->row.bits_per_number, r->cos_mean, r->cos_worst, r->nn_same, r->row.score_error, r->row.seconds);
  }
  int policy_rows = 0;
  for (uint32_t m = 0; m < rows; m++)
    if (strchr(results[m].name, '@')) {
      if (!policy_rows++)
        printf("\nPolicy rows keep %u tokens of each layer of a sentence (4 first, 16 newest, the rest heavy hitters;\n"
               "StreamingLLM: newest), all of a shorter one; B/token and bits count the kept tokens only:\n",
               budget);
      printf("  %-30s %5.1f%% of the tokens kept\n", results[m].name, 100.0 * results[m].row.kept_share);
    }
  if (non_ascii == 0)
    printf("Text: %zu bytes, all ASCII, which SentencePiece's NFKC normalization leaves unchanged (docs/MODEL.md).\n",
           text_bytes);
  else
    printf("Text: %zu non-ASCII characters, tokenized without SentencePiece's NFKC normalization (docs/MODEL.md).\n",
           non_ascii);
  fflush(stdout);
  status = 0;
  if (plot_path && *plot_path) {
    plot_point *points = calloc(rows ? rows : 1, sizeof *points);
    if (!points) goto done;
    for (uint32_t m = 0; m < rows; m++)
      points[m] = (plot_point){results[m].name, results[m].row.bits_per_number, 1.0 - results[m].cos_mean};
    const plot_spec spec = {.title = "kvq demo: sentence embeddings through compressed attention",
                            .x_label = "bits per number (keys and values)",
                            .y_label = "1 - mean cosine to the exact embedding",
                            .log_y = 1};
    if (plot_png(plot_path, &spec, points, rows, error, sizeof error) != 0) {
      fprintf(stderr, "kvq demo: plot: %s\n", error);
      status = 1;
    } else {
      printf("plot: %s\n", plot_path);
    }
    free(points);
  }
done:
  progress_finish(p);
  for (uint32_t m = 0; results && m < rows; m++) demo_row_free(&results[m].row);
  demo_row_free(&exact);
  for (uint32_t l = 0; l < KVQ_USE_LAYERS; l++) {
    free(cal_keys[l]);
    free(cal_values[l]);
  }
  for (uint32_t s = 0; ids && s < total; s++) free(ids[s]);
  free(ids);
  free(counts);
  free(results);
  free(exact_nn);
  free(method_nn);
  corpus_free(&text);
  kvq_use_free(model);
  return status;
}
