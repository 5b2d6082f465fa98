/*
 * `kvq eval` rows under a token policy (docs/EVAL.md, "Token policies"): a method as SPEC@POLICY
 * runs the way a server decodes: the prefill (every position but the evaluated ones) appended and
 * attended at once, then the evaluated positions one token at a time, each appended and attended,
 * the policy evicting at every step. Every query is measured at its own step against exact
 * attention over all tokens, so the error columns include what eviction loses. Two more columns:
 * the tokens kept at the end, and how much of what H2O keeps on the exact keys (with the same
 * budget) the row keeps, outside the sinks and the recent window: the attention-shift measure of
 * the Q-Hitter paper. And the exact attention's mass on the kept tokens: with exact keys and
 * values the row's output is the kept tokens' share of the exact output, renormalized, so
 * o^ - o = (1 - mass) (o_kept - o_evicted): the mass lost times how far the evicted tokens' values
 * lie from the kept ones' (docs/EVAL.md, "Token policies").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "policy_spec.h"

kvq_policy_config eval_policy(const eval_options *o, kvq_policy_kind kind, float lambda) {
  const uint32_t minimum = o->window + o->page_size; /* the window is never evicted */
  return kvq_policy_for_budget(kind, lambda, o->budget, o->sinks, o->recent > minimum ? o->recent : minimum);
}

/* "streaming", "h2o", "qhitter" or "qhitter-l<lambda>". */
static int parse_policy(const char *name, size_t len, const eval_options *o, kvq_policy_config *p) {
  kvq_policy_kind kind;
  float lambda;
  if (kvq_parse_policy_name(name, len, o->lambda, &kind, &lambda) != 0) return -1;
  *p = eval_policy(o, kind, lambda);
  return 0;
}

/* Probabilities of query position `at` (all heads) over the kept tokens up to it, in double,
 * added to acc[t]; exact keys. */
static void exact_attend(const eval_data *x, uint32_t at, const uint8_t *kept, double *acc, double *logit) {
  const uint32_t hq = x->query_heads, d = x->head_dim, group = hq / x->kv_heads;
  const double scale = 1.0 / sqrt((double)d);
  for (uint32_t h = 0; h < hq; h++) {
    const float *q = x->q + ((size_t)at * hq + h) * d;
    double max = -INFINITY, z = 0;
    for (uint32_t t = 0; t <= at; t++) {
      if (!kept[t]) continue;
      const float *k = x->k + ((size_t)t * x->kv_heads + h / group) * d;
      double dot = 0;
      for (uint32_t c = 0; c < d; c++) dot += (double)q[c] * k[c];
      logit[t] = dot * scale;
      max = logit[t] > max ? logit[t] : max;
    }
    for (uint32_t t = 0; t <= at; t++)
      if (kept[t]) z += exp(logit[t] - max);
    for (uint32_t t = 0; t <= at; t++)
      if (kept[t]) acc[t] += exp(logit[t] - max) / z;
  }
}

typedef struct ranked {
  double score;
  uint32_t position;
} ranked;

static int by_score(const void *a, const void *b) { /* best first; equal scores keep the older token */
  const ranked *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return x->position < y->position ? -1 : 1;
}

/* H2O on the exact keys with the row's budget, the way kvq runs it (kvq.h, "Token policies"): the
 * decision before each decoding step's append, then the step's attention. */
static int exact_h2o(const eval_options *o, const eval_data *x, eval_reference *ref) {
  const uint32_t n = x->tokens, first = n - o->last;
  const kvq_policy_config p = eval_policy(o, KVQ_POLICY_H2O, 0.0f);
  uint8_t *kept = calloc(n, 1);
  double *acc = calloc(n, sizeof(double)), *logit = malloc(sizeof(double) * n);
  ranked *r = malloc(sizeof(ranked) * n);
  ref->h2o_kept = malloc(sizeof(uint32_t) * n);
  if (!kept || !acc || !logit || !r || !ref->h2o_kept) {
    free(kept), free(acc), free(logit), free(r);
    return -1;
  }
  for (uint32_t t = 0; t < first; t++) kept[t] = 1;
  for (uint32_t t = 0; t < first; t++) exact_attend(x, t, kept, acc, logit); /* the prefill's causal block */
  for (uint32_t t = first; t < n; t++) {
    const uint32_t last = t > p.recent ? t - p.recent : 0;
    uint32_t count = 0;
    for (uint32_t j = p.sinks; j < last; j++)
      if (kept[j]) r[count++] = (ranked){acc[j], j};
    if (count > p.heavy) {
      qsort(r, count, sizeof *r, by_score);
      for (uint32_t k = p.heavy; k < count; k++) kept[r[k].position] = 0;
    }
    kept[t] = 1;
    exact_attend(x, t, kept, acc, logit);
  }
  ref->h2o_count = 0;
  for (uint32_t t = 0; t < n; t++)
    if (kept[t]) ref->h2o_kept[ref->h2o_count++] = t;
  ref->h2o_ready = 1;
  free(kept), free(acc), free(logit), free(r);
  return 0;
}

/* |K & K_h2o| / |K_h2o| over the kept positions outside the sinks and H2O's recent window. */
static double overlap(const eval_options *o, const eval_data *x, const eval_reference *ref, const uint32_t *kept,
                      size_t count) {
  const kvq_policy_config p = eval_policy(o, KVQ_POLICY_H2O, 0.0f);
  const uint32_t n = x->tokens, last = n > p.recent ? n - p.recent : 0;
  uint8_t *mark = calloc(n, 1);
  if (!mark) return NAN;
  for (size_t i = 0; i < count; i++) mark[kept[i]] = 1;
  uint32_t both = 0, reference = 0;
  for (uint32_t i = 0; i < ref->h2o_count; i++) {
    const uint32_t t = ref->h2o_kept[i];
    if (t < p.sinks || t >= last) continue;
    reference++;
    both += mark[t];
  }
  free(mark);
  return reference ? (double)both / reference : 1.0;
}

int eval_run_policy_row(kvq_context *ctx, const eval_options *o, const eval_data *x, const char *spec, size_t len,
                        eval_reference *ref, eval_row *row) {
  memset(row, 0, sizeof *row);
  snprintf(row->spec, sizeof row->spec, "%.*s", (int)len, spec);
  row->has_policy = 1;
  const char *at = memchr(spec, '@', len);
  kvq_policy_config policy;
  if (!at || parse_policy(at + 1, len - (size_t)(at - spec) - 1, o, &policy) != 0) {
    fprintf(stderr, "kvq eval: cannot read the policy of '%s' (streaming, h2o, qhitter or qhitter-l<lambda>)\n", row->spec);
    return -1;
  }
  if (o->mask != KVQ_MASK_CAUSAL) {
    fprintf(stderr, "kvq eval: %s: token policies decode, so their rows need the causal mask\n", row->spec);
    return -1;
  }
  if (!ref->h2o_ready) progress_phase(o->progress, "H2O on the exact keys (the h2o-ovl reference)", 0, 0);
  if (!ref->h2o_ready && exact_h2o(o, x, ref) != 0) {
    fprintf(stderr, "kvq eval: out of memory\n");
    return -1;
  }
  kvq_layer_config layer;
  kvq_cache *cache = NULL;
  uint32_t seq;
  if (eval_parse_layer(spec, (size_t)(at - spec), x, &layer) != 0 ||
      eval_open_cache(ctx, o, x, &layer, &policy, row, &cache, &seq) != 0)
    return -1;
  const uint32_t n = x->tokens, hq = x->query_heads, hkv = x->kv_heads, d = x->head_dim, first = n - o->last;
  const size_t esize = x->dtype == KVQ_DTYPE_F32 ? 4 : 2;
  int rc = -1;
  float *prefill_out = malloc(sizeof(float) * (first ? first : 1) * hq * d), *out = malloc(sizeof(float) * hq * d);
  float *scores = malloc(sizeof(float) * hq * n), *logits = malloc(sizeof(float) * hq * n), *probs = malloc(sizeof(float) * hq * n);
  uint32_t *kept = malloc(sizeof(uint32_t) * n);
  eval_metrics m = {0};
  if (!prefill_out || !out || !scores || !logits || !probs || !kept || eval_metrics_init(&m, n) != 0) {
    fprintf(stderr, "kvq eval: out of memory\n");
    goto done;
  }
  kvq_status st = KVQ_OK;
  double mass = 0; /* exact attention on the kept tokens, summed over queries */
  progress_phase(o->progress, "prefill", 0, 0);
  if (first) { /* the prefill, appended and attended at once (the policy learns from its attention) */
    int64_t kshape[3] = {first, hkv, d}, qshape[3] = {first, hq, d};
    kvq_tensor kt = kvq_tensor_host(x->k_input, x->dtype, 3, kshape), vt = kvq_tensor_host(x->v_input, x->dtype, 3, kshape);
    kvq_attention_request req = {seq, KVQ_MASK_CAUSAL, kvq_tensor_host(x->q, KVQ_DTYPE_F32, 3, qshape),
                                 kvq_tensor_host(prefill_out, KVQ_DTYPE_F32, 3, qshape)};
    if ((st = kvq_append(cache, seq, 0, &kt, &vt)) == KVQ_OK) st = kvq_attention(cache, 0, &req, 1);
  }
  for (uint32_t i = 0; i < o->last && st == KVQ_OK; i++) { /* decoding: the policy runs before each append */
    const uint32_t t = first + i;
    progress_phase(o->progress, "decoding", i, o->last);
    int64_t kshape[3] = {1, hkv, d}, qshape[3] = {1, hq, d};
    kvq_tensor kt = kvq_tensor_host((uint8_t *)x->k_input + (size_t)t * hkv * d * esize, x->dtype, 3, kshape);
    kvq_tensor vt = kvq_tensor_host((uint8_t *)x->v_input + (size_t)t * hkv * d * esize, x->dtype, 3, kshape);
    kvq_tensor qt = kvq_tensor_host(x->q + (size_t)t * hq * d, KVQ_DTYPE_F32, 3, qshape);
    kvq_attention_request req = {seq, KVQ_MASK_CAUSAL, qt, kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape)};
    size_t count = 0;
    if ((st = kvq_append(cache, seq, 0, &kt, &vt)) != KVQ_OK || (st = kvq_attention(cache, 0, &req, 1)) != KVQ_OK ||
        (st = kvq_sequence_positions(cache, seq, 0, kept, n, &count)) != KVQ_OK)
      break;
    int64_t sshape[3] = {1, hq, (int64_t)count};
    kvq_tensor lt = kvq_tensor_host(scores, KVQ_DTYPE_F32, 3, sshape);
    if ((st = kvq_scores(cache, seq, 0, &qt, KVQ_MASK_CAUSAL, KVQ_SCORES_LOGITS, &lt)) != KVQ_OK) break;
    for (uint32_t h = 0; h < hq; h++) { /* spread over all positions: evicted ones have no logit, probability 0 */
      float *l = logits + (size_t)h * n, *p = probs + (size_t)h * n;
      for (uint32_t j = 0; j <= t; j++) l[j] = NAN, p[j] = 0.0f;
      double max = -INFINITY, z = 0;
      for (size_t j = 0; j < count; j++) max = scores[h * count + j] > max ? scores[h * count + j] : max;
      for (size_t j = 0; j < count; j++) z += exp(scores[h * count + j] - max);
      for (size_t j = 0; j < count; j++) {
        l[kept[j]] = scores[h * count + j];
        p[kept[j]] = (float)(exp(scores[h * count + j] - max) / z);
      }
      const size_t r = (size_t)i * hq + h;
      for (size_t j = 0; j < count; j++) mass += ref->p[r * n + kept[j]];
      eval_metrics_add(&m, l, p, ref->s + r * n, ref->p + r * n, t + 1, out + (size_t)h * d, ref->o + r * d, d);
    }
    row->kept = (uint32_t)count;
    row->h2o_overlap = overlap(o, x, ref, kept, count);
  }
  if (st != KVQ_OK) {
    fprintf(stderr, "kvq eval: %s: %s: %s\n", row->spec, kvq_status_string(st), kvq_context_last_error(ctx));
    goto done;
  }
  row->kept_mass = mass / ((double)o->last * hq);
  kvq_sequence_info info;
  kvq_sequence_info_get(cache, seq, 0, &info);
  row->window_tokens = info.tokens - info.quantized_tokens;
  rc = 0;
done:
  eval_metrics_finish(&m, row);
  kvq_cache_destroy(cache);
  free(prefill_out), free(out), free(scores), free(logits), free(probs), free(kept);
  return rc;
}
