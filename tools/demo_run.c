/* A row of kvq demo (demo_run.h): threads over the sentences, kvq or the reference for attention. */
#include "demo_run.h"

#include "demo_policy.h"
#include "method_spec.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct shared {
  const kvq_use_model *model;
  const demo_sentences *sentences;
  const char *method;
  kvq_backend_kind backend;
  uint32_t max_tokens;
  const void *codebooks; /* saved by the first worker's cache, loaded by the others */
  size_t codebooks_size;
  volatile uint32_t *done;
  float *embeddings;
  uint32_t next; /* the next sentence to take */
  pthread_mutex_t lock;
} shared;

typedef struct worker {
  shared *sh;
  kvq_use_kvq *state; /* NULL for the reference */
  double score_sum;
  uint64_t score_count;
  float *probabilities;
  size_t probabilities_capacity;
  uint64_t kept, tokens; /* over sentences and layers: the tokens attention covered, of those appended */
  int failed;
  char error[1024];
} worker;

/* kvq's attention, then its attention probabilities on the same queries against exact ones (under
 * a policy over the kept tokens: an evicted token's probability counts as 0). */
static kvq_status scored_attention(void *user, uint32_t layer, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                                   const float *q, const float *k, const float *v, float *out) {
  worker *w = user;
  kvq_status status = kvq_use_kvq_attention(w->state, layer, tokens, heads, head_dim, q, k, v, out);
  if (status != KVQ_OK) return status;
  const size_t n = (size_t)tokens * heads * tokens;
  if (n > w->probabilities_capacity) {
    float *grown = realloc(w->probabilities, n * sizeof *grown);
    if (!grown) return KVQ_ERROR_OUT_OF_MEMORY;
    w->probabilities = grown;
    w->probabilities_capacity = n;
  }
  uint32_t sequence, positions[128]; /* tokens <= kvq_use_max_tokens (128) */
  size_t kept;
  if ((status = kvq_use_kvq_sequence(w->state, &sequence)) != KVQ_OK ||
      (status = kvq_sequence_positions(kvq_use_kvq_cache(w->state), sequence, layer, positions, 128, &kept)) != KVQ_OK)
    return status;
  w->kept += kept, w->tokens += tokens;
  const int64_t q_shape[3] = {tokens, heads, head_dim}, s_shape[3] = {tokens, heads, (int64_t)kept};
  kvq_tensor queries = kvq_tensor_host((void *)(uintptr_t)q, KVQ_DTYPE_F32, 3, q_shape);
  kvq_tensor scores = kvq_tensor_host(w->probabilities, KVQ_DTYPE_F32, 3, s_shape);
  status = kvq_scores(kvq_use_kvq_cache(w->state), sequence, layer, &queries, KVQ_MASK_NONE, KVQ_SCORES_PROBABILITIES,
                      &scores);
  if (status != KVQ_OK) return status;
  const double scale = 1.0 / sqrt((double)head_dim);
  double logits[128]; /* tokens <= kvq_use_max_tokens (128) */
  for (uint32_t t = 0; t < tokens; t++)
    for (uint32_t h = 0; h < heads; h++) {
      const float *qi = q + ((size_t)t * heads + h) * head_dim;
      double top = -INFINITY, sum = 0, worst = 0;
      for (uint32_t j = 0; j < tokens; j++) {
        const float *kj = k + ((size_t)j * heads + h) * head_dim;
        double dot = 0;
        for (uint32_t c = 0; c < head_dim; c++) dot += (double)qi[c] * kj[c];
        logits[j] = dot * scale;
        if (logits[j] > top) top = logits[j];
      }
      for (uint32_t j = 0; j < tokens; j++) sum += (logits[j] = exp(logits[j] - top));
      const float *row = w->probabilities + ((size_t)t * heads + h) * kept;
      for (uint32_t j = 0, c = 0; j < tokens; j++) {
        const double got = c < kept && positions[c] == j ? row[c++] : 0.0;
        worst = fmax(worst, fabs(got - logits[j] / sum));
      }
      w->score_sum += worst;
      w->score_count++;
    }
  return KVQ_OK;
}

static void *work(void *arg) {
  worker *w = arg;
  shared *sh = w->sh;
  for (;;) {
    pthread_mutex_lock(&sh->lock);
    const uint32_t s = sh->next++;
    pthread_mutex_unlock(&sh->lock);
    if (s >= sh->sentences->count) break;
    char message[512];
    kvq_status status =
        w->state ? kvq_use_embed_ids(sh->model, sh->sentences->ids[s], sh->sentences->counts[s], scored_attention, w,
                                     sh->embeddings + (size_t)s * KVQ_USE_EMBEDDING_DIM, message, sizeof message)
                 : kvq_use_embed_ids(sh->model, sh->sentences->ids[s], sh->sentences->counts[s],
                                     kvq_use_attention_exact, NULL, sh->embeddings + (size_t)s * KVQ_USE_EMBEDDING_DIM,
                                     message, sizeof message);
    if (status != KVQ_OK) {
      snprintf(w->error, sizeof w->error, "sentence %u: %s: %s %s", s + 1, kvq_status_string(status), message,
               w->state ? kvq_use_kvq_last_error(w->state) : "");
      w->failed = 1;
      break;
    }
    __atomic_add_fetch(sh->done, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Learns the codebooks of every layer whose method needs them, from the calibration K/V. */
static int learn(kvq_use_kvq *state, const demo_calibration *cal, char *error, size_t size) {
  for (uint32_t l = 0; l < KVQ_USE_LAYERS; l++) {
    const int64_t shape[3] = {cal->tokens[l], KVQ_USE_HEADS, l == 0 ? 64 : 128};
    kvq_tensor keys = kvq_tensor_host((void *)(uintptr_t)cal->keys[l], KVQ_DTYPE_F32, 3, shape);
    kvq_tensor values = kvq_tensor_host((void *)(uintptr_t)cal->values[l], KVQ_DTYPE_F32, 3, shape);
    kvq_status status = kvq_codebooks_learn(kvq_use_kvq_cache(state), l, &keys, &values, NULL);
    if (status != KVQ_OK) {
      snprintf(error, size, "learning layer %u's codebooks: %s", l, kvq_status_string(status));
      return -1;
    }
  }
  return 0;
}

int demo_run(const kvq_use_model *model, const demo_sentences *sentences, const char *row_name, uint32_t budget,
             kvq_backend_kind backend, const demo_calibration *calibration, uint32_t threads, volatile uint32_t *done,
             demo_row *row, char *error, size_t size) {
  *row = (demo_row){0};
  if (size) error[0] = 0;
  char name[128];
  kvq_policy_config policy = {0};
  if (row_name && demo_policy_parse(row_name, strlen(row_name), budget, name, sizeof name, &policy, error, size) != 0)
    return -1;
  const char *method = row_name ? name : NULL;
  int learns = 0; /* does either layer's method learn codebooks? */
  for (uint32_t l = 0; method && l < KVQ_USE_LAYERS; l++) {
    kvq_method_config keys, values;
    if (kvq_parse_layer_spec(method, strlen(method), l == 0 ? 64 : 128, &keys, &values) == 0)
      learns |= kvq_method_learns(&keys) || kvq_method_learns(&values);
  }
  if (threads == 0) threads = 1;
  if (threads > sentences->count) threads = sentences->count ? sentences->count : 1;
  const double start = now();
  shared sh = {.model = model, .sentences = sentences, .method = method, .backend = backend,
               .max_tokens = kvq_use_max_tokens(model), .done = done};
  sh.embeddings = malloc((size_t)sentences->count * KVQ_USE_EMBEDDING_DIM * sizeof(float));
  worker *workers = calloc(threads, sizeof *workers);
  pthread_t *ids = calloc(threads, sizeof *ids);
  void *saved = NULL;
  int failed = 0;
  if (!sh.embeddings || !workers || !ids) {
    snprintf(error, size, "out of memory");
    failed = 1;
  }
  pthread_mutex_init(&sh.lock, NULL);
  for (uint32_t t = 0; t < threads && !failed && method; t++) {
    workers[t].sh = &sh;
    kvq_use_kvq_options options = {.backend = backend, .methods = {method, method}, .policy = policy, .seed = 1};
    char message[512];
    if (kvq_use_kvq_create(&options, sh.max_tokens, &workers[t].state, message, sizeof message) != KVQ_OK) {
      snprintf(error, size, "%s", message);
      failed = 1;
      break;
    }
    kvq_cache *cache = kvq_use_kvq_cache(workers[t].state);
    uint64_t fixed_size = 0;
    if (t == 0 && learns) {
      /* the method learns codebooks: once, then every other worker loads the same ones */
      const double learn_start = now();
      if (learn(workers[t].state, calibration, error, size) != 0 ||
          kvq_codebooks_save_size(cache, &fixed_size) != KVQ_OK || !(saved = malloc(fixed_size)) ||
          kvq_codebooks_save_to_memory(cache, saved, fixed_size, &sh.codebooks_size) != KVQ_OK) {
        if (!error[0]) snprintf(error, size, "saving the learned codebooks failed");
        failed = 1;
      }
      row->learn_seconds = now() - learn_start;
    } else if (t > 0 && saved && kvq_codebooks_load_from_memory(cache, saved, sh.codebooks_size) != KVQ_OK) {
      snprintf(error, size, "loading the learned codebooks failed");
      failed = 1;
    }
  }
  for (uint32_t t = 0; t < threads && !failed && !method; t++) workers[t].sh = &sh;
  uint32_t started = 0;
  for (; started < threads && !failed; started++)
    if (pthread_create(&ids[started], NULL, work, &workers[started]) != 0) {
      snprintf(error, size, "cannot start a thread");
      pthread_mutex_lock(&sh.lock);
      sh.next = sentences->count; /* the started workers stop */
      pthread_mutex_unlock(&sh.lock);
      failed = 1;
      break;
    }
  for (uint32_t t = 0; t < started; t++) pthread_join(ids[t], NULL);
  double score_sum = 0;
  uint64_t score_count = 0, kept = 0, appended = 0;
  for (uint32_t t = 0; t < threads && workers; t++) {
    if (workers[t].failed && !failed) {
      snprintf(error, size, "%s", workers[t].error);
      failed = 1;
    }
    score_sum += workers[t].score_sum;
    score_count += workers[t].score_count;
    kept += workers[t].kept, appended += workers[t].tokens;
  }
  if (!failed && method) {
    kvq_memory_report report;
    kvq_cache_memory(kvq_use_kvq_cache(workers[0].state), &report);
    /* per token of the sentences: a policy's rows count the kept tokens only */
    row->kept_share = appended ? (double)kept / appended : 1.0;
    row->bytes_per_token = (double)report.page_bytes / 16.0 * row->kept_share; /* model/attention_kvq.c's pages of 16 */
    row->bits_per_number = report.bits_per_number * row->kept_share;
  }
  for (uint32_t t = 0; t < threads && workers; t++) {
    kvq_use_kvq_destroy(workers[t].state);
    free(workers[t].probabilities);
  }
  pthread_mutex_destroy(&sh.lock);
  free(saved);
  free(workers);
  free(ids);
  if (failed) {
    free(sh.embeddings);
    *row = (demo_row){0};
    return -1;
  }
  row->embeddings = sh.embeddings;
  row->score_error = score_count ? score_sum / score_count : 0;
  row->seconds = now() - start;
  return 0;
}

void demo_row_free(demo_row *row) {
  free(row->embeddings);
  *row = (demo_row){0};
}
