/*
 * What the cases' results are checked against, so that the bench cannot report the speed of wrong
 * work: the fp32 attention of the same query over the same tokens, computed here in double
 * precision. The bound is loose (docs/BENCH.md): it catches outputs of the wrong sequence, stale or
 * zero outputs and NaNs, not accuracy, which `kvq eval` measures.
 */
#include <math.h>
#include <stdlib.h>

#include "bench.h"

int bench_synth(const bench_point *p, uint32_t chunk, float **k, float **v, float **q) {
  const size_t kv = (size_t)chunk * p->kv_heads * p->head_dim;
  *k = malloc(sizeof(float) * kv);
  *v = malloc(sizeof(float) * kv);
  *q = malloc(sizeof(float) * p->query_heads * p->head_dim);
  /* keys and values of `chunk` tokens (repeated up to the context by cases.c); the query is the
   * last of a short draw of the same model, the decode step's query */
  kvq_synth_config sc = kvq_synth_defaults(chunk, p->kv_heads, p->query_heads, p->head_dim, 1);
  kvq_synth_config sq = kvq_synth_defaults(16, p->kv_heads, p->query_heads, p->head_dim, 2);
  float *queries = malloc(sizeof(float) * 16 * p->query_heads * p->head_dim);
  int rc = *k && *v && *q && queries && kvq_synth_generate(&sc, *k, *v, NULL) == KVQ_OK &&
                   kvq_synth_generate(&sq, NULL, NULL, queries) == KVQ_OK
               ? 0
               : 2;
  if (rc == 0)
    for (size_t i = 0; i < (size_t)p->query_heads * p->head_dim; i++) (*q)[i] = queries[15 * p->query_heads * p->head_dim + i];
  free(queries);
  return rc;
}

void bench_reference(const float *k, const float *v, uint32_t chunk, const float *q, const bench_point *p, float *out) {
  const uint32_t group = p->query_heads / p->kv_heads, d = p->head_dim;
  double *logit = malloc(sizeof(double) * chunk), *acc = malloc(sizeof(double) * d);
  if (!logit || !acc) {
    for (size_t i = 0; i < (size_t)p->query_heads * d; i++) out[i] = NAN; /* fails every check, loudly */
    free(logit), free(acc);
    return;
  }
  /* token t is chunk row t % chunk: every full repetition of the chunk adds the same terms, so the
   * sums over the chunk are weighted by how often each row occurs */
  const uint32_t reps = p->context / chunk, extra = p->context % chunk;
  for (uint32_t h = 0; h < p->query_heads; h++) {
    const uint32_t kvh = h / group;
    const float *qh = q + (size_t)h * d;
    double max = -INFINITY, sum = 0;
    for (uint32_t t = 0; t < chunk && t < p->context; t++) {
      const float *kt = k + ((size_t)t * p->kv_heads + kvh) * d;
      double dot = 0;
      for (uint32_t c = 0; c < d; c++) dot += (double)qh[c] * kt[c];
      logit[t] = dot / sqrt((double)d);
      if (logit[t] > max) max = logit[t];
    }
    for (uint32_t c = 0; c < d; c++) acc[c] = 0;
    for (uint32_t t = 0; t < chunk && t < p->context; t++) {
      const double w = exp(logit[t] - max) * (reps + (t < extra));
      const float *vt = v + ((size_t)t * p->kv_heads + kvh) * d;
      sum += w;
      for (uint32_t c = 0; c < d; c++) acc[c] += w * vt[c];
    }
    for (uint32_t c = 0; c < d; c++) out[(size_t)h * d + c] = (float)(acc[c] / sum);
  }
  free(logit), free(acc);
}

double bench_relative_error(const float *out, const float *ref, size_t n) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(out[i])) return INFINITY;
    err += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
    norm += (double)ref[i] * ref[i];
  }
  return norm > 0 ? sqrt(err / norm) : sqrt(err);
}

double bench_worst_error(const float *out, const float *ref, size_t per, uint32_t batch) {
  double worst = 0;
  for (uint32_t s = 0; s < batch; s++) {
    const double e = bench_relative_error(out + (size_t)s * per, ref, per);
    /* a NaN (a NaN reference) is the worst and stays: `e > worst` alone would let the next finite
     * error replace it and pass the check */
    if (isnan(e)) return e;
    if (e > worst) worst = e;
  }
  return worst;
}
