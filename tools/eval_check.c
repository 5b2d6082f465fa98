/*
 * Do the queries already carry the model's 1/sqrt(head_dim)? kvq applies 1/sqrt(head_dim) itself
 * (as attention does), so queries dumped after the model scaled them are scaled twice: every logit
 * shrinks by sqrt(d) (8x at d = 64, 11x at d = 128), attention turns nearly uniform, and every method
 * looks far better than it is (a uniform average hides which tokens a method gets wrong).
 *
 * The symptom kvq eval looks for is in the exact reference: the spread of each query's logits over
 * its visible tokens. With logits of standard deviation sigma over n tokens, softmax's entropy falls
 * short of log n by about sigma^2 / 2 nats (the second-order term of log E[exp(s)] for small sigma),
 * so the attention's effective number of tokens, exp(entropy), is at least n exp(-sigma^2 / 2). At
 * sigma < 1 that is more than 60% of the context: the query averages rather than picks. A trained
 * head can do that now and then, but when the typical (median) query does, the likelier cause is a
 * second 1/sqrt(d). Hence the rule: warn when the median over queries of the logits' standard
 * deviation is below 1 (EVAL_FLAT_LOGIT_STD), and name --queries-scaled, which multiplies the
 * queries by sqrt(d) before anything is computed. It is a warning, not a correction: a model whose
 * attention really is that flat gets the warning too. Calibrated against the synthetic model, whose
 * median sigma is 3.2 at d = 128 and 4.7 at d = 64 (0.28 and 0.59 when scaled twice, both caught);
 * at d <= 32 the second scaling shrinks the logits by 5.7x at most and the rule can miss it.
 */
#include <math.h>
#include <stdlib.h>

#include "eval.h"

static int by_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int eval_logit_spread(const eval_options *o, const eval_data *x, const eval_reference *ref, double *median_std,
                      double *entropy_ratio) {
  const uint32_t n = x->tokens, rows = o->last * x->query_heads;
  double *stds = malloc(sizeof(double) * rows);
  if (!stds) return -1;
  double ratio_sum = 0;
  uint32_t ratio_rows = 0;
  for (uint32_t r = 0; r < rows; r++) {
    const uint32_t visible = o->mask == KVQ_MASK_CAUSAL ? n - o->last + r / x->query_heads + 1 : n;
    const double *s = ref->s + (size_t)r * n, *p = ref->p + (size_t)r * n;
    double mean = 0, var = 0, entropy = 0;
    for (uint32_t t = 0; t < visible; t++) mean += s[t];
    mean /= visible;
    for (uint32_t t = 0; t < visible; t++) var += (s[t] - mean) * (s[t] - mean);
    stds[r] = sqrt(var / visible);
    for (uint32_t t = 0; t < visible; t++)
      if (p[t] > 0) entropy -= p[t] * log(p[t]);
    if (visible > 1) ratio_sum += entropy / log((double)visible), ratio_rows++;
  }
  qsort(stds, rows, sizeof *stds, by_double);
  *median_std = rows % 2 ? stds[rows / 2] : (stds[rows / 2 - 1] + stds[rows / 2]) / 2;
  *entropy_ratio = ratio_rows ? ratio_sum / ratio_rows : 0;
  free(stds);
  return 0;
}

void eval_scale_queries(eval_data *x) {
  const float scale = (float)sqrt((double)x->head_dim);
  const size_t count = (size_t)x->tokens * x->query_heads * x->head_dim;
  for (size_t i = 0; i < count; i++) x->q[i] *= scale;
}
