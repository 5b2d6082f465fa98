/*
 * TAP test of token policies through the sentence encoder (docs/MODEL.md, "Token policies"): a
 * budget at least the sentence's tokens reproduces the embedding without a policy bit for bit; a
 * small budget keeps exactly that many tokens in each layer (the sinks, the newest page and, for
 * H2O, the candidates of largest accumulated attention), every query attends over exactly the kept
 * tokens, and the embedding is still a unit vector; a bad budget is refused with a clear status.
 * Needs the model (scripts/fetch-model.sh); reports itself skipped, visibly, without it.
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_tap.h"


static double dot(const float *a, const float *b) {
  double s = 0;
  for (int i = 0; i < KVQ_USE_EMBEDDING_DIM; i++) s += (double)a[i] * b[i];
  return s;
}

/* 35 pieces: more than the budget of 28 below (sinks 4 + recent 16 + heavy 8) */
static const char *long_sentence = "And the earth was without form, and void; and darkness was upon the face of the "
                                   "deep. And the Spirit of God moved upon the face of the waters.";

enum { MAX_T = 128 };

/* What a wrapping callback saw in each layer: the kept positions after the policy, and whether
 * layer 0's output is attention over exactly them (see check_kept_attention). */
typedef struct watch {
  kvq_use_kvq *kvq;
  uint32_t tokens[KVQ_USE_LAYERS];
  uint32_t positions[KVQ_USE_LAYERS][MAX_T];
  size_t kept[KVQ_USE_LAYERS];
  double accumulated[MAX_T]; /* layer 0: sum over queries and heads of the exact probabilities */
  double worst;              /* layer 0: worst |kvq - reference over the kept tokens| / bound */
  char error[512];
} watch;

/*
 * Layer 0's output against attention in double over the kept tokens only (exact fp32 storage),
 * per output element within the bound of kvq's own rounding (the reference's, in double, is far
 * smaller): a logit errs by at most D = gamma(d + 2) sum_c |q_c k_jc| / sqrt(d) (an fp32 dot
 * product of d terms and the scale), which moves each probability by at most a factor e^{2D}, so
 * an output by (e^{2D} - 1) sum_j p_j |v_jc|; exp, the kept-token sum, the division and the
 * weighted sum add (2 n + 8) u sum_j p_j |v_jc|, u = 2^-24, n the kept tokens. Evicted tokens
 * left in would change the output by their probability mass, orders above this bound.
 * Also sums every query's exact probabilities over all tokens: H2O's accumulated attention A_t.
 */
static void check_kept_attention(watch *w, uint32_t tokens, const float *q, const float *k, const float *v,
                                 const float *out) {
  const uint32_t heads = KVQ_USE_HEADS, d = 64;
  const size_t row = (size_t)heads * d;
  const double u = ldexp(1.0, -24), gamma = (d + 2) * u / (1 - (d + 2) * u), scale = 1 / sqrt((double)d);
  const size_t n = w->kept[0];
  memset(w->accumulated, 0, sizeof w->accumulated);
  for (uint32_t h = 0; h < heads; h++)
    for (uint32_t i = 0; i < tokens; i++) {
      const float *qi = q + i * row + (size_t)h * d;
      double logit[MAX_T], top = -INFINITY, largest = 0, all = 0, kept_sum = 0;
      for (uint32_t j = 0; j < tokens; j++) {
        const float *kj = k + j * row + (size_t)h * d;
        double s = 0, a = 0;
        for (uint32_t c = 0; c < d; c++) s += (double)qi[c] * kj[c], a += fabs((double)qi[c] * kj[c]);
        logit[j] = s * scale;
        top = fmax(top, logit[j]);
        largest = fmax(largest, a * scale);
      }
      for (uint32_t j = 0; j < tokens; j++) all += exp(logit[j] - top);
      for (uint32_t j = 0; j < tokens; j++) w->accumulated[j] += exp(logit[j] - top) / all;
      for (size_t j = 0; j < n; j++) kept_sum += exp(logit[w->positions[0][j]] - top);
      const double D = gamma * largest;
      for (uint32_t c = 0; c < d; c++) {
        double o = 0, weighted = 0;
        for (size_t j = 0; j < n; j++) {
          const double p = exp(logit[w->positions[0][j]] - top) / kept_sum, x = v[w->positions[0][j] * row + h * d + c];
          o += p * x, weighted += p * fabs(x);
        }
        const double bound = (expm1(2 * D) + (2.0 * n + 8) * u) * weighted + FLT_MIN;
        w->worst = fmax(w->worst, fabs(out[i * row + h * d + c] - o) / bound);
      }
    }
}

static kvq_status watch_attention(void *user, uint32_t layer, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                                  const float *q, const float *k, const float *v, float *out) {
  watch *w = user;
  kvq_status status = kvq_use_kvq_attention(w->kvq, layer, tokens, heads, head_dim, q, k, v, out);
  uint32_t sequence = 0;
  if (status == KVQ_OK) status = kvq_use_kvq_sequence(w->kvq, &sequence);
  if (status == KVQ_OK)
    status = kvq_sequence_positions(kvq_use_kvq_cache(w->kvq), sequence, layer, w->positions[layer], MAX_T,
                                    &w->kept[layer]);
  if (status != KVQ_OK) {
    snprintf(w->error, sizeof w->error, "%s", kvq_use_kvq_last_error(w->kvq));
    return status;
  }
  w->tokens[layer] = tokens;
  if (layer == 0) check_kept_attention(w, tokens, q, k, v, out);
  return KVQ_OK;
}

/* The embedding of `text` through kvq with `method` in both layers and `policy`; 0 on success. */
static int embed(const kvq_use_model *m, const char *text, const char *method, kvq_policy_config policy, watch *w,
                 float *embedding) {
  kvq_use_kvq_options options = {.backend = KVQ_BACKEND_CPU, .methods = {method, method}, .policy = policy, .seed = 7};
  char message[512];
  memset(w, 0, sizeof *w);
  kvq_status status = kvq_use_kvq_create(&options, kvq_use_max_tokens(m), &w->kvq, message, sizeof message);
  if (status == KVQ_OK) status = kvq_use_embed(m, text, watch_attention, w, embedding, message, sizeof message);
  if (status != KVQ_OK) printf("# %s: %s: %s %s\n", method, kvq_status_string(status), message, w->error);
  kvq_use_kvq_destroy(w->kvq);
  w->kvq = NULL;
  return status == KVQ_OK ? 0 : -1;
}

static const char *names[] = {"keep-all", "streaming", "h2o", "qhitter"};

/* ---- a budget of every token: the same embedding as no policy ---- */

static void test_ample_budget(const kvq_use_model *m) {
  /* The policy's sequence holds the layer's tokens quantized as without a policy (the same seed,
   * layer and page positions), nothing is evicted, and the second attention is the same
   * computation as the only one without a policy: the same floats. QJL's random sketches included. */
  static const char *methods[] = {"uniform-b4-g32", "qjl-m128-k4/uniform-b2-g32"};
  for (size_t i = 0; i < 2; i++) {
    float plain[KVQ_USE_EMBEDDING_DIM];
    watch w;
    if (embed(m, long_sentence, methods[i], (kvq_policy_config){0}, &w, plain) != 0) {
      check(0, "%s without a policy", methods[i]);
      continue;
    }
    for (kvq_policy_kind kind = KVQ_POLICY_STREAMING; kind <= KVQ_POLICY_QHITTER; kind++) {
      kvq_policy_config policy;
      float got[KVQ_USE_EMBEDDING_DIM];
      const int ok = kvq_use_kvq_policy(kind, 0.5f, kvq_use_max_tokens(m), &policy, NULL, 0) == KVQ_OK &&
                     embed(m, long_sentence, methods[i], policy, &w, got) == 0;
      check(ok && w.kept[0] == w.tokens[0] && w.kept[1] == w.tokens[1] && !memcmp(got, plain, sizeof got),
            "%s@%s, budget %u >= the sentence's %u tokens: keeps %zu and %zu, the embedding without a policy bit for "
            "bit",
            methods[i], names[kind], kvq_use_max_tokens(m), w.tokens[0], w.kept[0], w.kept[1]);
    }
  }
}

/* ---- a small budget evicts ---- */

typedef struct candidate {
  double score;
  uint32_t position;
} candidate;

static int by_score(const void *a, const void *b) { /* best first; equal scores keep the older token */
  const candidate *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return x->position < y->position ? -1 : 1;
}

/* Whether layer 0 kept the sinks, the newest `recent` and the `heavy` candidates of largest A_t
 * (computed in double here). *margin: the gap between the last kept and the first evicted
 * candidate's A_t; kvq sums fp32 probabilities, so a gap within its rounding is a near tie that
 * either side may break. */
static int kept_as_h2o(const watch *w, uint32_t sinks, uint32_t recent, uint32_t heavy, double *margin) {
  const uint32_t T = w->tokens[0];
  candidate c[MAX_T];
  uint32_t count = 0;
  for (uint32_t t = sinks; t + recent < T; t++) c[count++] = (candidate){w->accumulated[t], t};
  qsort(c, count, sizeof *c, by_score);
  *margin = heavy > 0 && heavy < count ? c[heavy - 1].score - c[heavy].score : INFINITY;
  unsigned char want[MAX_T] = {0};
  for (uint32_t t = 0; t < T; t++) want[t] = t < sinks || t + recent >= T;
  for (uint32_t i = 0; i < heavy && i < count; i++) want[c[i].position] = 1;
  size_t wanted = 0;
  for (uint32_t t = 0; t < T; t++) wanted += want[t];
  if (wanted != w->kept[0]) return 0;
  for (size_t i = 0; i < w->kept[0]; i++)
    if (!want[w->positions[0][i]]) return 0;
  return 1;
}

static void test_small_budget(const kvq_use_model *m) {
  float exact[KVQ_USE_EMBEDDING_DIM];
  char message[512];
  if (kvq_use_embed(m, long_sentence, kvq_use_attention_exact, NULL, exact, message, sizeof message) != KVQ_OK) {
    check(0, "the exact embedding: %s", message);
    return;
  }
  const uint32_t budget = 28; /* sinks 4 + recent 16 + 8 heavy hitters (StreamingLLM: recent 24) */
  static const char *methods[] = {"exact-f32", "uniform-b4-g32"};
  for (size_t i = 0; i < 2; i++)
    for (kvq_policy_kind kind = KVQ_POLICY_STREAMING; kind <= KVQ_POLICY_QHITTER; kind++) {
      kvq_policy_config policy;
      float got[KVQ_USE_EMBEDDING_DIM];
      watch w;
      if (kvq_use_kvq_policy(kind, 0.5f, budget, &policy, message, sizeof message) != KVQ_OK ||
          embed(m, long_sentence, methods[i], policy, &w, got) != 0) {
        check(0, "%s@%s with a budget of %u: %s", methods[i], names[kind], budget, message);
        continue;
      }
      check(w.tokens[0] > budget && w.kept[0] == budget && w.kept[1] == budget,
            "%s@%s: %u tokens, budget %u: layer 0 keeps %zu, layer 1 %zu", methods[i], names[kind], w.tokens[0],
            budget, w.kept[0], w.kept[1]);
      /* exact storage: kvq's output is attention over the kept tokens only (bound above) */
      if (!strcmp(methods[i], "exact-f32"))
        check(w.worst <= 1.0, "%s@%s: layer 0's output is every query's attention over the %zu kept tokens (worst %.3g "
              "of the derived bound)", methods[i], names[kind], w.kept[0], w.worst);
      /* which tokens: StreamingLLM the sinks and its recent window; H2O (and Q-Hitter on exact
       * storage, where every quantization error is 0 and it selects as H2O) the sinks, the newest
       * page and the heavy hitters by A_t. Q-Hitter on uniform storage weighs errors in: not checked. */
      if (kind == KVQ_POLICY_STREAMING || !strcmp(methods[i], "exact-f32")) {
        double margin;
        const int same = kept_as_h2o(&w, policy.sinks, policy.recent, policy.heavy, &margin);
        /* kvq's A_t is a sum of 35 x 4 fp32 probabilities, each within ~1e-6 of the double
         * one here (the bound above): 1e-3 is far above their difference */
        if (margin > 1e-3)
          check(same, "%s@%s keeps the sinks, the newest %u and the %u candidates of largest accumulated attention "
                "(A_t margin %.3g)", methods[i], names[kind], policy.recent, policy.heavy, margin);
        else
          printf("ok %d # SKIP %s@%s: the last kept and first evicted candidates are %.2g apart in A_t, a near tie\n",
                 ++test_number, methods[i], names[kind], margin);
      }
      const double norm = sqrt(dot(got, got)), cosine = dot(got, exact) / norm;
      /* No bound on the cosine can be derived: evicting changes attention by the evicted tokens'
       * probability mass, which the rest of the model (LayerNorm, FFN, tanh) transforms nonlinearly.
       * What holds whatever was evicted: a unit vector (fp32 rounding of 512 squares and a square
       * root, far below 1e-5), so a finite cosine within [-1, 1] up to that rounding. */
      check(fabs(norm - 1) < 1e-5 && isfinite(cosine) && fabs(cosine) <= 1 + 1e-5,
            "%s@%s, budget %u: a unit embedding, cosine to the exact one %.4f", methods[i], names[kind], budget,
            cosine);
    }
}

/* ---- bad budgets ---- */

static void test_bad_budget(const kvq_use_model *m) {
  kvq_policy_config policy = {.kind = KVQ_POLICY_H2O, .heavy = 77}, before = policy;
  char message[512];
  check(kvq_use_kvq_policy(KVQ_POLICY_H2O, 0.5f, 19, &policy, message, sizeof message) == KVQ_ERROR_OUT_OF_RANGE &&
            !memcmp(&policy, &before, sizeof policy) && strstr(message, "budget of 19"),
        "a budget of 19, below the 4 sinks and 16 newest every policy keeps: out of range, nothing written (%s)",
        message);
  check(kvq_use_kvq_policy(KVQ_POLICY_STREAMING, 0.5f, 0x80000000u, &policy, message, sizeof message) ==
            KVQ_ERROR_OUT_OF_RANGE && !memcmp(&policy, &before, sizeof policy),
        "a budget of 2^31: out of range (%s)", message);
  check(kvq_use_kvq_policy(KVQ_POLICY_QHITTER, 1.5f, 32, &policy, message, sizeof message) == KVQ_ERROR_OUT_OF_RANGE &&
            strstr(message, "lambda"),
        "Q-Hitter with lambda 1.5: out of range (%s)", message);
  check(kvq_use_kvq_policy((kvq_policy_kind)9, 0.5f, 32, &policy, message, sizeof message) ==
            KVQ_ERROR_INVALID_ARGUMENT,
        "an unknown policy kind: invalid argument");
  check(kvq_use_kvq_policy(KVQ_POLICY_H2O, 0.5f, 20, &policy, NULL, 0) == KVQ_OK && policy.sinks == 4 &&
            policy.recent == 16 && policy.heavy == 0 && policy.heavy_fraction == 0.0f,
        "the least budget, 20: sinks 4, recent 16, no heavy hitters");
  /* a policy kvq refuses (a recent window shorter than a page) reaches the caller with kvq's message */
  kvq_use_kvq_options options = {.backend = KVQ_BACKEND_CPU, .methods = {"exact-f32", "exact-f32"},
                                 .policy = {.kind = KVQ_POLICY_STREAMING, .sinks = 4, .recent = 8}};
  kvq_use_kvq *kvq = (kvq_use_kvq *)(uintptr_t)1; /* must become NULL */
  check(kvq_use_kvq_create(&options, kvq_use_max_tokens(m), &kvq, message, sizeof message) == KVQ_ERROR_OUT_OF_RANGE &&
            !kvq && strstr(message, "recent"),
        "a policy whose recent window is shorter than a page: kvq's refusal (%s)", message);
}

int main(void) {
  char dir[4096];
  int exit_code;
  kvq_use_model *m = model_tap_load(dir, sizeof dir, &exit_code);
  if (!m) return exit_code;
  test_bad_budget(m);
  test_ample_budget(m);
  test_small_budget(m);
  kvq_use_free(m);
  return model_tap_finish();
}
