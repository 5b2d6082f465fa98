/*
 * A row of `kvq eval` for one method: all tokens appended (and flushed unless --window), then the
 * evaluated queries scored and attended at once. Also what every row shares: reading method
 * specs, opening the cache, and the error columns.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "method_spec.h"

int eval_parse_layer(const char *spec, size_t len, const eval_data *x, kvq_layer_config *layer) {
  *layer = (kvq_layer_config){.query_heads = x->query_heads, .kv_heads = x->kv_heads, .head_dim = x->head_dim};
  if (kvq_parse_layer_spec(spec, len, x->head_dim, &layer->keys, &layer->values) != 0) {
    fprintf(stderr, "kvq eval: cannot read method '%.*s' (see kvq eval --help)\n", (int)len, spec);
    return -1;
  }
  return 0;
}

int eval_open_cache(kvq_context *ctx, const eval_options *o, const eval_data *x, const kvq_layer_config *layer,
                    const kvq_policy_config *policy, eval_row *row, kvq_cache **cache, uint32_t *seq) {
  const uint32_t n = x->tokens, P = o->page_size;
  kvq_cache_config config = {.layer_count = 1, .layers = layer, .input_dtype = x->dtype, .page_size = P,
                             .residual_window = o->window, .max_pages = (n + P - 1) / P + 1, .max_sequences = 1,
                             .seed = o->seed, .policy = *policy};
  char why[512];
  if (kvq_cache_config_check(&config, why, sizeof why) != KVQ_OK) {
    fprintf(stderr, "kvq eval: %s: %s\n", row->spec, why);
    return -1;
  }
  /* learned codebooks come from the first tokens (the prefill), as PolarQuant's online mode does */
  const uint32_t cal = o->calibration ? o->calibration : (n > o->last ? n - o->last : n);
  int64_t shape[3] = {cal, x->kv_heads, x->head_dim};
  kvq_tensor kc = x->k_held_out ? kvq_tensor_host(x->k_held_out, KVQ_DTYPE_F32, 3, shape)
                                : kvq_tensor_host(x->k_input, x->dtype, 3, shape);
  kvq_tensor vc = x->v_held_out ? kvq_tensor_host(x->v_held_out, KVQ_DTYPE_F32, 3, shape)
                                : kvq_tensor_host(x->v_input, x->dtype, 3, shape);
  row->calibration = kvq_method_learns(&layer->keys) || kvq_method_learns(&layer->values) ? cal : 0;
  kvq_status st;
  if (row->calibration) {
    char phase[64];
    snprintf(phase, sizeof phase, "learning codebooks (k-means on %u tokens)", cal);
    progress_phase(o->progress, phase, 0, 0);
  }
  if ((st = kvq_cache_create(ctx, &config, cache)) != KVQ_OK ||
      (row->calibration && (st = kvq_codebooks_learn(*cache, 0, &kc, &vc, NULL)) != KVQ_OK) ||
      (st = kvq_sequence_add(*cache, seq)) != KVQ_OK) {
    fprintf(stderr, "kvq eval: %s: %s: %s\n", row->spec, kvq_status_string(st), kvq_context_last_error(ctx));
    kvq_cache_destroy(*cache);
    *cache = NULL;
    return -1;
  }
  kvq_layer_bits_per_number(layer, P, &row->key_bits, &row->value_bits);
  row->bits = (row->key_bits + row->value_bits) / 2;
  kvq_memory_report mem;
  kvq_cache_memory(*cache, &mem);
  row->fixed_bytes = mem.fixed_bytes;
  return 0;
}

/* |topk(a) & topk(b)| / k over the first n entries; ties broken towards the lower index. */
static double topk_overlap(const double *a, const float *b, uint32_t n, uint32_t k, uint32_t *ia, uint32_t *ib,
                           uint8_t *mark) {
  for (uint32_t j = 0; j < n; j++) ia[j] = ib[j] = j, mark[j] = 0;
  for (uint32_t r = 0; r < k; r++) { /* partial selection sort: k is 5% of n */
    uint32_t best_a = r, best_b = r;
    for (uint32_t j = r + 1; j < n; j++) {
      if (a[ia[j]] > a[ia[best_a]] || (a[ia[j]] == a[ia[best_a]] && ia[j] < ia[best_a])) best_a = j;
      if (b[ib[j]] > b[ib[best_b]] || (b[ib[j]] == b[ib[best_b]] && ib[j] < ib[best_b])) best_b = j;
    }
    uint32_t t = ia[r];
    ia[r] = ia[best_a], ia[best_a] = t;
    t = ib[r];
    ib[r] = ib[best_b], ib[best_b] = t;
    mark[ia[r]] |= 1;
  }
  uint32_t both = 0;
  for (uint32_t r = 0; r < k; r++) both += mark[ib[r]] & 1;
  return (double)both / k;
}

int eval_metrics_init(eval_metrics *m, uint32_t tokens) {
  memset(m, 0, sizeof *m);
  m->ia = malloc(sizeof(uint32_t) * tokens);
  m->ib = malloc(sizeof(uint32_t) * tokens);
  m->mark = malloc(tokens);
  return m->ia && m->ib && m->mark ? 0 : -1;
}

void eval_metrics_add(eval_metrics *m, const float *logits, const float *probs, const double *s_ref, const double *p_ref,
                      uint32_t visible, const float *out, const double *o_ref, uint32_t d) {
  double worst = 0, on = 0, od = 0;
  for (uint32_t t = 0; t < visible; t++) {
    if (!isnan(logits[t])) { /* an evicted token has no estimate to compare */
      m->ip_num += (logits[t] - s_ref[t]) * (logits[t] - s_ref[t]);
      m->ip_den += s_ref[t] * s_ref[t];
    }
    const double diff = fabs(probs[t] - p_ref[t]);
    worst = diff > worst ? diff : worst;
  }
  m->score_sum += worst;
  m->score_max = worst > m->score_max ? worst : m->score_max;
  for (uint32_t c = 0; c < d; c++) {
    on += (out[c] - o_ref[c]) * (out[c] - o_ref[c]);
    od += o_ref[c] * o_ref[c];
  }
  m->out_sum += od > 0 ? sqrt(on / od) : sqrt(on);
  const uint32_t k = visible / 20 > 1 ? visible / 20 : 1;
  m->topk_sum += topk_overlap(p_ref, probs, visible, k, m->ia, m->ib, m->mark);
  m->rows++;
}

void eval_metrics_finish(eval_metrics *m, eval_row *row) {
  row->ip_error = m->ip_den > 0 ? sqrt(m->ip_num / m->ip_den) : 0;
  row->score_error_mean = m->rows ? m->score_sum / m->rows : 0;
  row->score_error_max = m->score_max;
  row->output_error = m->rows ? m->out_sum / m->rows : 0;
  row->topk_overlap = m->rows ? m->topk_sum / m->rows : 0;
  free(m->ia), free(m->ib), free(m->mark);
  m->ia = m->ib = NULL, m->mark = NULL;
}

int eval_run_row(kvq_context *ctx, const eval_options *o, const eval_data *x, const char *spec, size_t len,
                 const eval_reference *ref, eval_row *row) {
  memset(row, 0, sizeof *row);
  snprintf(row->spec, sizeof row->spec, "%.*s", (int)len, spec);
  kvq_layer_config layer;
  const kvq_policy_config keep_all = {0};
  kvq_cache *cache = NULL;
  uint32_t seq;
  if (eval_parse_layer(spec, len, x, &layer) != 0 || eval_open_cache(ctx, o, x, &layer, &keep_all, row, &cache, &seq) != 0)
    return -1;
  const uint32_t n = x->tokens, hq = x->query_heads, hkv = x->kv_heads, d = x->head_dim;
  int rc = -1;
  float *logits = malloc(sizeof(float) * o->last * hq * n), *probs = malloc(sizeof(float) * o->last * hq * n);
  float *out = malloc(sizeof(float) * o->last * hq * d);
  eval_metrics m = {0};
  if (!logits || !probs || !out || eval_metrics_init(&m, n) != 0) {
    fprintf(stderr, "kvq eval: out of memory\n");
    goto done;
  }
  int64_t kshape[3] = {n, hkv, d}, qshape[3] = {o->last, hq, d}, sshape[3] = {o->last, hq, n};
  kvq_tensor kt = kvq_tensor_host(x->k_input, x->dtype, 3, kshape), vt = kvq_tensor_host(x->v_input, x->dtype, 3, kshape);
  kvq_tensor qt = kvq_tensor_host(x->q + (size_t)(n - o->last) * hq * d, KVQ_DTYPE_F32, 3, qshape);
  kvq_tensor lt = kvq_tensor_host(logits, KVQ_DTYPE_F32, 3, sshape);
  kvq_attention_request req = {seq, o->mask, qt, kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape)};
  kvq_status st;
  progress_phase(o->progress, "appending and quantizing", 0, 0);
  /* without a window every token is quantized; with one, the newest stay in full precision */
  if ((st = kvq_append(cache, seq, 0, &kt, &vt)) == KVQ_OK && o->window == 0) st = kvq_flush(cache, seq);
  if (st == KVQ_OK) {
    progress_phase(o->progress, "scoring and attending", 0, 0);
    st = kvq_scores(cache, seq, 0, &qt, o->mask, KVQ_SCORES_LOGITS, &lt);
  }
  if (st == KVQ_OK) st = kvq_attention(cache, 0, &req, 1);
  if (st != KVQ_OK) {
    fprintf(stderr, "kvq eval: %s: %s: %s\n", row->spec, kvq_status_string(st), kvq_context_last_error(ctx));
    goto done;
  }
  kvq_sequence_info info;
  kvq_sequence_info_get(cache, seq, 0, &info);
  row->window_tokens = info.tokens - info.quantized_tokens;
  /* probabilities from the returned logits: the same softmax the library applies, without a
   * second scoring pass */
  for (uint64_t r = 0; r < (uint64_t)o->last * hq; r++) {
    const uint32_t visible = o->mask == KVQ_MASK_CAUSAL ? n - o->last + (uint32_t)(r / hq) + 1 : n;
    const float *s = logits + (size_t)r * n;
    float *p = probs + (size_t)r * n;
    double max = -INFINITY, z = 0;
    for (uint32_t t = 0; t < visible; t++) max = s[t] > max ? s[t] : max;
    for (uint32_t t = 0; t < visible; t++) z += exp(s[t] - max);
    for (uint32_t t = 0; t < n; t++) p[t] = t < visible ? (float)(exp(s[t] - max) / z) : 0.0f;
    eval_metrics_add(&m, s, p, ref->s + (size_t)r * n, ref->p + (size_t)r * n, visible, out + (size_t)r * d,
                     ref->o + (size_t)r * d, d);
  }
  eval_metrics_finish(&m, row);
  rc = 0;
done:
  if (rc != 0) eval_metrics_finish(&m, row);
  kvq_cache_destroy(cache);
  free(logits), free(probs), free(out);
  return rc;
}
