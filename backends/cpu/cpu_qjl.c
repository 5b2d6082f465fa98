/*
 * QJL keys (Zandieh et al., "QJL: 1-bit quantized JL transform for KV cache quantization",
 * ../shared/papers/000), with the outlier split of its Section 4.1 and the orthogonalized sketch.
 * The math (outlier choice, sign words, norms, reconstruction, the estimator) is core/methods/qjl.h;
 * this file loops over its units. Scores take the query parts of a page once (kvq_qjl_query_parts4)
 * and then every token's signed sums.
 */
#include "core/layout.h"
#include "cpu_io.h"
#include "core/methods/qjl.h"
#include "shaders/work_units.h"

static void qjl_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t P = s->page_size, d = s->head_dim, m = s->sketch_dim, mo = s->outlier_sketch_dim, k = s->outliers;
  const kvq_io io = kvq_cpu_io(h, block, x, NULL);
  if (k > 0) { /* the outlier list first: every token's units read it */
    float norm2[KVQ_MAX_HEAD_DIM];
    uint32_t chosen[KVQ_MAX_HEAD_DIM / 32];
    for (uint32_t c = 0; c < d; c++) norm2[c] = kvq_qjl_channel_norm2(&io, 0, (uint32_t)token_stride, n, c);
    kvq_qjl_choose_outliers(norm2, d, k, chosen);
    kvq_qjl_put_outliers(&io, 0, chosen, d, P, m, mo, k);
  }
  const uint32_t units = kvq_encode_units_of(KVQ_LAYOUT_QJL, n, d, 0, m, k, mo, 0);
  for (uint32_t u = 0; u < units; u++) kvq_qjl_encode_unit(&io, 0, u, 0, (uint32_t)token_stride, P, d, m, mo, k);
}

/* S q, the query's sketch (Algorithm 1, line 6), for the whole query. */
static void qjl_prepare(const cpu_head *h, const float *q, float *prepared) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, NULL, q, NULL);
  for (uint32_t i = 0; i < s->sketch_dim; i++) prepared[i] = kvq_qjl_prepare_row(&io, 0, i, s->head_dim);
}

static void qjl_dot_page(const cpu_head *h, const uint8_t *block, uint32_t n, const float *q, const float *prepared,
                         double *dots) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t P = s->page_size, d = s->head_dim, m = s->sketch_dim, mo = s->outlier_sketch_dim, k = s->outliers;
  const kvq_io io = kvq_cpu_io(h, block, q, prepared);
  uint32_t list[KVQ_MAX_OUTLIERS];
  kvq_qjl_load_list(&io, 0, P, m, mo, k, list);
  double sq_in[KVQ_MAX_SKETCH_DIM], sq_out[KVQ_MAX_SKETCH_DIM];
  for (uint32_t i = 0; i < m; i += 4) kvq_qjl_query_parts4(&io, 0, i, 0, 0, list, d, k, sq_in + i);
  for (uint32_t i = 0; i < (k > 0 ? mo : 0); i += 4) kvq_qjl_query_parts4(&io, 1, i, 0, 0, list, d, k, sq_out + i);
  const double c_d = h->side->qjl_constant;
  for (uint32_t t = 0; t < n; t++) {
    double estimate = kvq_qjl_estimate(c_d, m, kvq_qjl_norm(&io, 0, 0, t, P, m, mo, k), kvq_qjl_signed_dot(&io, 0, 0, t, sq_in, P, m, mo));
    if (k > 0)
      estimate += kvq_qjl_estimate(c_d, mo, kvq_qjl_norm(&io, 0, 1, t, P, m, mo, k), kvq_qjl_signed_dot(&io, 0, 1, t, sq_out, P, m, mo));
    dots[t] = estimate;
  }
}

static void qjl_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, NULL, NULL);
  for (uint32_t c = 0; c < s->head_dim; c++)
    out[c] = kvq_qjl_decode(&io, 0, t, c, s->page_size, s->head_dim, s->sketch_dim, s->outlier_sketch_dim, s->outliers,
                            h->side->qjl_constant);
}

const cpu_method kvq_cpu_qjl = {
    .encode = qjl_encode, .decode = qjl_decode, .prepare = qjl_prepare, .dot_page = qjl_dot_page};
