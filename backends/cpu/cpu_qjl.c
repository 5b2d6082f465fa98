/*
 * QJL keys (Zandieh et al., "QJL: 1-bit quantized JL transform for KV cache quantization",
 * ../shared/papers/000; Definition 3.1 and Algorithm 1), with the outlier split of its Section 4.1
 * and the orthogonalized sketch. Per (page, kv head):
 *   O        = the k channels with the largest L2 norm over the page's tokens (ties: lower index)
 *   k_in     = k with the channels of O zeroed, k_out = k with the others zeroed
 *   stored   = sign bits of S k_in (m), sign bits of S_o k_out (m_o), |k_in|, |k_out| (fp16), O
 * Estimator of q.k (Definition 3.1, with kvq's exactly unbiased constant c_d instead of sqrt(pi/2)):
 *   c_d/m |k_in| <S q_in, sign(S k_in)> + c_d/m_o |k_out| <S_o q_out, sign(S_o k_out)>
 * where q_in, q_out are q masked like the key.
 */
#include <math.h>

#include "core/bytes.h"
#include "core/halfconv.h"
#include "core/layout.h"
#include "cpu.h"

typedef struct qjl_view {
  uint32_t P, d, m, mo, k;
} qjl_view;

static qjl_view view_of(const cpu_head *h) {
  const kvq_side_layout *s = &h->side->layout;
  return (qjl_view){s->page_size, s->head_dim, s->sketch_dim, s->outlier_sketch_dim, s->outliers};
}

static int sign_bit(const uint8_t *signs, uint32_t i) { return (signs[i / 8] >> (i % 8)) & 1; }

/* <x, sign bits>: sum over i of (bit i ? x[i] : -x[i]), bits LSB first. */
static double signed_sum(const uint8_t *bits, const double *x, uint32_t n) {
  double sum = 0.0;
  for (uint32_t byte = 0; byte < n / 8; byte++) {
    const unsigned b = bits[byte];
    const double *xb = x + 8 * byte;
    for (unsigned i = 0; i < 8; i++) sum += (b >> i & 1u) ? xb[i] : -xb[i];
  }
  return sum;
}

/* The outlier channels of a page: a mask over channels (1 = outlier). */
static void outlier_mask(const qjl_view *v, const uint8_t *block, uint8_t *is_outlier) {
  const uint8_t *list = block + kvq_qjl_outliers_offset(v->P, v->m, v->mo, v->k);
  for (uint32_t c = 0; c < v->d; c++) is_outlier[c] = 0;
  for (uint32_t j = 0; j < v->k; j++) is_outlier[list[j]] = 1;
}

/* Sign bits of S y for the rows of an m x d matrix, written LSB first: bit = 1 iff the projection,
 * summed over channels in increasing order with each product and sum rounded separately, is > 0. */
static void sketch_signs(const float *S, uint32_t rows, uint32_t d, const float *y, uint8_t *bits) {
  for (uint32_t i = 0; i < rows; i++) {
    float p = 0.0f;
    for (uint32_t c = 0; c < d; c++) p = p + S[(size_t)i * d + c] * y[c];
    if (p > 0.0f) bits[i / 8] |= (uint8_t)(1u << (i % 8));
  }
}

static float norm_f32(const float *y, uint32_t d) {
  float sum = 0.0f;
  for (uint32_t c = 0; c < d; c++) sum = sum + y[c] * y[c];
  return sqrtf(sum);
}

static void qjl_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const qjl_view v = view_of(h);
  uint8_t is_outlier[KVQ_MAX_HEAD_DIM] = {0};

  if (v.k > 0) { /* outlier channels: largest squared norm over the page's valid tokens */
    float norm2[KVQ_MAX_HEAD_DIM];
    for (uint32_t c = 0; c < v.d; c++) {
      float sum = 0.0f;
      for (uint32_t t = 0; t < n; t++) sum = sum + x[t * token_stride + c] * x[t * token_stride + c];
      norm2[c] = sum;
    }
    for (uint32_t j = 0; j < v.k; j++) {
      uint32_t best = v.d;
      for (uint32_t c = 0; c < v.d; c++)
        if (!is_outlier[c] && (best == v.d || norm2[c] > norm2[best])) best = c;
      is_outlier[best] = 1;
    }
    uint8_t *list = block + kvq_qjl_outliers_offset(v.P, v.m, v.mo, v.k);
    for (uint32_t c = 0, j = 0; c < v.d; c++)
      if (is_outlier[c]) list[j++] = (uint8_t)c;
  }

  uint8_t *signs = block + kvq_qjl_signs_offset();
  uint8_t *signs_out = block + kvq_qjl_signs_out_offset(v.P, v.m);
  uint8_t *norm_in = block + kvq_qjl_norm_in_offset(v.P, v.m, v.mo, v.k);
  uint8_t *norm_out = block + kvq_qjl_norm_out_offset(v.P, v.m, v.mo, v.k);
  for (uint32_t t = 0; t < n; t++) {
    float k_in[KVQ_MAX_HEAD_DIM], k_out[KVQ_MAX_HEAD_DIM];
    for (uint32_t c = 0; c < v.d; c++) {
      float value = x[t * token_stride + c];
      k_in[c] = is_outlier[c] ? 0.0f : value;
      k_out[c] = is_outlier[c] ? value : 0.0f;
    }
    sketch_signs(h->fixed[0], v.m, v.d, k_in, signs + (size_t)t * v.m / 8);
    uint32_t hin = kvq_f32_to_f16_bits(norm_f32(k_in, v.d));
    norm_in[2 * t] = (uint8_t)hin;
    norm_in[2 * t + 1] = (uint8_t)(hin >> 8);
    if (v.k > 0) {
      sketch_signs(h->fixed[1], v.mo, v.d, k_out, signs_out + (size_t)t * v.mo / 8);
      uint32_t hout = kvq_f32_to_f16_bits(norm_f32(k_out, v.d));
      norm_out[2 * t] = (uint8_t)hout;
      norm_out[2 * t + 1] = (uint8_t)(hout >> 8);
    }
  }
}

/* S q, the query's sketch (Algorithm 1, line 6), for the whole query. Per page, the score job
 * removes the outlier channels: S q_in = S q - sum over outliers c of S[:, c] q_c. */
static void qjl_prepare(const cpu_head *h, const float *q, float *prepared) {
  const qjl_view v = view_of(h);
  for (uint32_t i = 0; i < v.m; i++) {
    double sum = 0.0;
    for (uint32_t c = 0; c < v.d; c++) sum += (double)h->fixed[0][(size_t)i * v.d + c] * q[c];
    prepared[i] = (float)sum;
  }
}

static void qjl_dot_page(const cpu_head *h, const uint8_t *block, uint32_t n, const float *q, const float *prepared,
                         double *dots) {
  const qjl_view v = view_of(h);
  const float *S = h->fixed[0], *So = h->fixed[1];
  const uint8_t *list = block + kvq_qjl_outliers_offset(v.P, v.m, v.mo, v.k);
  double sq_in[KVQ_MAX_SKETCH_DIM], sq_out[KVQ_MAX_SKETCH_DIM];
  for (uint32_t i = 0; i < v.m; i++) {
    double outlier_part = 0.0;
    for (uint32_t j = 0; j < v.k; j++) outlier_part += (double)S[(size_t)i * v.d + list[j]] * q[list[j]];
    sq_in[i] = (double)prepared[i] - outlier_part;
  }
  for (uint32_t i = 0; i < v.mo; i++) {
    double sum = 0.0;
    for (uint32_t j = 0; j < v.k; j++) sum += (double)So[(size_t)i * v.d + list[j]] * q[list[j]];
    sq_out[i] = sum;
  }
  const double c_d = h->side->qjl_constant;
  const uint8_t *signs = block + kvq_qjl_signs_offset();
  const uint8_t *signs_out = block + kvq_qjl_signs_out_offset(v.P, v.m);
  const uint8_t *norm_in = block + kvq_qjl_norm_in_offset(v.P, v.m, v.mo, v.k);
  const uint8_t *norm_out = block + kvq_qjl_norm_out_offset(v.P, v.m, v.mo, v.k);
  for (uint32_t t = 0; t < n; t++) {
    double dot_in = signed_sum(signs + (size_t)t * v.m / 8, sq_in, v.m);
    double estimate = c_d / v.m * kvq_f16_bits_to_f32(kvq_le16(norm_in + 2 * t)) * dot_in;
    if (v.k > 0) {
      double dot_out = signed_sum(signs_out + (size_t)t * v.mo / 8, sq_out, v.mo);
      estimate += c_d / v.mo * kvq_f16_bits_to_f32(kvq_le16(norm_out + 2 * t)) * dot_out;
    }
    dots[t] = estimate;
  }
}

/* The unbiased reconstruction whose inner product with any q is the estimator above:
 * k^ = mask_in(c_d/m |k_in| S^T sign(S k_in)) + mask_out(c_d/m_o |k_out| S_o^T sign(S_o k_out)). */
static void qjl_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const qjl_view v = view_of(h);
  uint8_t is_outlier[KVQ_MAX_HEAD_DIM];
  outlier_mask(&v, block, is_outlier);
  const uint8_t *bits = block + kvq_qjl_signs_offset() + (size_t)t * v.m / 8;
  const uint8_t *bits_out = block + kvq_qjl_signs_out_offset(v.P, v.m) + (size_t)t * v.mo / 8;
  double n_in = kvq_f16_bits_to_f32(kvq_le16(block + kvq_qjl_norm_in_offset(v.P, v.m, v.mo, v.k) + 2 * t));
  double n_out = v.k ? kvq_f16_bits_to_f32(kvq_le16(block + kvq_qjl_norm_out_offset(v.P, v.m, v.mo, v.k) + 2 * t)) : 0;
  const double c_d = h->side->qjl_constant;
  for (uint32_t c = 0; c < v.d; c++) {
    double sum = 0.0;
    if (is_outlier[c]) {
      for (uint32_t i = 0; i < v.mo; i++) sum += (sign_bit(bits_out, i) ? 1.0 : -1.0) * h->fixed[1][(size_t)i * v.d + c];
      out[c] = (float)(c_d / v.mo * n_out * sum);
    } else {
      for (uint32_t i = 0; i < v.m; i++) sum += (sign_bit(bits, i) ? 1.0 : -1.0) * h->fixed[0][(size_t)i * v.d + c];
      out[c] = (float)(c_d / v.m * n_in * sum);
    }
  }
}

const cpu_method kvq_cpu_qjl = {
    .encode = qjl_encode, .decode = qjl_decode, .prepare = qjl_prepare, .dot_page = qjl_dot_page};
