#include "reference.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/halfconv.h"
#include "core/layout.h"
#include "core/quantize_math.h"
#include "polar_ref.h"

static const double u = 0x1p-24;

static double gamma_n(double n) { return n * u / (1 - n * u); }


/* The head block of kv head h of the page holding slot t. */
static const uint8_t *head_block(const kvq_side_layout *s, const uint8_t *pages, uint32_t t, uint32_t h) {
  return pages + (uint64_t)(t / s->page_size) * s->page_bytes + (uint64_t)h * s->head_bytes;
}

/* Value of element c of token t (page index i within its block of kv head h) for EXACT, UNIFORM,
 * KIVI and CQ, with the rounding error an fp32 decode may add; *mag: the largest magnitude a term
 * of a sum over it may have, |value| except for UNIFORM and KIVI, where it is |min| + code |scale|
 * (the terms of a sum that folds the query into the parameters, q min and (q scale) code, as the
 * Vulkan fused logits do for KIVI keys, shaders/methods/kivi_flash.glsl). */
static double decode(const ref_layer *L, int side, const uint8_t *block, uint32_t h, uint32_t i, uint32_t c, double *err,
                     double *mag) {
  const kvq_side_layout *s = side ? &L->values : &L->keys;
  const uint32_t d = s->head_dim;
  *err = 0;
  double value;
  if (s->method == KVQ_LAYOUT_EXACT) {
    const uint8_t *p = block + kvq_exact_offset(d, s->dtype, i, c);
    if (s->dtype == KVQ_LAYOUT_F32) value = kvq_bits_to_f32(kvq_le32(p));
    else value = s->dtype == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32(kvq_le16(p)) : kvq_bf16_bits_to_f32(kvq_le16(p));
    *mag = fabs(value);
    return value;
  }
  if (s->method == KVQ_LAYOUT_CQ) { /* a centroid's fp32 value, read exactly */
    const uint32_t groups = d / s->channels, code = golden_packed_code(block, i * groups + c / s->channels, s->code_bits);
    value = L->fixed[side][1][(((size_t)h * groups + c / s->channels) << s->code_bits) * s->channels +
                              (size_t)code * s->channels + c % s->channels];
    *mag = fabs(value);
    return value;
  }
  /* UNIFORM and KIVI: min + code * scale, two fp32 roundings */
  const uint32_t b = s->bits, idx = i * d + c;
  const uint32_t word = s->method == KVQ_LAYOUT_KIVI ? (i / s->group) * d + c : i * (d / s->group) + c / s->group;
  uint32_t params = kvq_le32(block + kvq_uniform_params_offset(s->page_size, d, b) + 4 * word);
  uint32_t code = golden_packed_code(block, idx, b);
  double mn = kvq_uniform_param_min(params), scale = kvq_uniform_param_scale(params);
  *err = 2 * u * (fabs(mn) + code * fabs(scale)) + 2 * FLT_MIN;
  *mag = fabs(mn) + code * fabs(scale);
  return mn + code * scale;
}

/* PolarQuant keys: logit numerators of the tokens of a page block against the rotated query qr,
 * known within qerr; a: the absolute-value computation; extra: the part of the bound that comes
 * from the rotated query's error, sum qerr |y| (1 + gamma(L)). */
static void polar_page(const ref_layer *L, const uint8_t *block, uint32_t h, uint32_t count, const double *qr,
                       const double *qerr, double *s, double *a, double *extra, double *ops) {
  const kvq_side_layout *k = &L->keys;
  double y[KVQ_MAX_HEAD_DIM];
  for (uint32_t t = 0; t < count; t++) {
    golden_polar_decode(k, L->fixed[0][1], h, block, t, y);
    s[t] = a[t] = extra[t] = 0;
    for (uint32_t c = 0; c < k->head_dim; c++) {
      s[t] += qr[c] * y[c];
      a[t] += (fabs(qr[c]) + qerr[c]) * fabs(y[c]);
      extra[t] += qerr[c] * fabs(y[c]) * (1 + gamma_n(k->levels));
    }
  }
  *ops = k->head_dim + k->levels + 4;
}

/* Logit numerators (before 1/sqrt(d)) of one query head against the tokens of one page block:
 * value, absolute-value computation and operation count. */
static int qjl_page(const ref_layer *L, const uint8_t *block, uint32_t count, const float *q, double *s, double *a,
                    double *ops) {
  const kvq_side_layout *k = &L->keys;
  const uint32_t P = k->page_size, d = k->head_dim, m = k->sketch_dim, mo = k->outlier_sketch_dim, no = k->outliers;
  uint8_t outlier[KVQ_MAX_HEAD_DIM] = {0};
  const uint8_t *list = block + kvq_qjl_outliers_offset(P, m, mo, no);
  for (uint32_t j = 0; j < no; j++) outlier[list[j]] = 1;
  double *in = malloc(sizeof(double) * (m + mo));
  if (!in) return -1;
  double *out = in + m, in_abs = 0, out_abs = 0;
  for (uint32_t i = 0; i < m; i++) {
    in[i] = 0;
    for (uint32_t c = 0; c < d; c++) {
      double term = (double)L->fixed[0][0][(size_t)i * d + c] * q[c];
      if (!outlier[c]) in[i] += term;
      in_abs += fabs(term);
    }
  }
  for (uint32_t i = 0; i < mo; i++) {
    out[i] = 0;
    for (uint32_t j = 0; j < no; j++) {
      double term = (double)L->fixed[0][1][(size_t)i * d + list[j]] * q[list[j]];
      out[i] += term;
      out_abs += fabs(term);
    }
  }
  const double c_d = L->qjl_constant;
  for (uint32_t t = 0; t < count; t++) {
    const uint8_t *bits = block + kvq_qjl_signs_offset() + (size_t)t * m / 8;
    const uint8_t *bits_o = block + kvq_qjl_signs_out_offset(P, m) + (size_t)t * mo / 8;
    double n_in = kvq_f16_bits_to_f32(kvq_le16(block + kvq_qjl_norm_in_offset(P, m, mo, no) + 2 * t));
    double n_out = no ? kvq_f16_bits_to_f32(kvq_le16(block + kvq_qjl_norm_out_offset(P, m, mo, no) + 2 * t)) : 0;
    double dot_in = 0, dot_out = 0;
    for (uint32_t i = 0; i < m; i++) dot_in += (bits[i / 8] >> (i % 8) & 1) ? in[i] : -in[i];
    for (uint32_t i = 0; i < mo; i++) dot_out += (bits_o[i / 8] >> (i % 8) & 1) ? out[i] : -out[i];
    s[t] = c_d / m * n_in * dot_in + (no ? c_d / mo * n_out * dot_out : 0);
    /* in_abs covers every channel, so it also bounds S q - (outlier part) evaluated in two steps */
    a[t] = c_d / m * n_in * 2 * in_abs + (no ? c_d / mo * n_out * out_abs : 0);
  }
  *ops = d + (m > mo ? m : mo) + 8;
  free(in);
  return 0;
}

/* Logits of one query head against the kept tokens, with their bounds. A page's scores are
 * computed for all its valid slots at once and read for its kept tokens. */
static int ref_logits(const ref_layer *L, const ref_sequence *seq, const float *q, uint32_t kvh, double *logit,
                      double *lb, double *s, double *a, double *extra) {
  const uint32_t d = L->config->head_dim, hkv = L->config->kv_heads, P = L->keys.page_size;
  const double inv_sqrt_d = 1.0 / sqrt((double)d);
  double qr[KVQ_MAX_HEAD_DIM], qerr[KVQ_MAX_HEAD_DIM], ops = 0;
  if (L->keys.method == KVQ_LAYOUT_POLAR) golden_polar_rotate(&L->keys, L->fixed[0][0], q, qr, qerr);
  uint32_t scored_page = UINT32_MAX;
  for (uint32_t j = 0; j < seq->kept; j++) {
    const uint32_t t = seq->kept_slot[j];
    double sj, aj, ej, opsj;
    if (t < seq->slots) {
      const uint32_t page = t / P;
      if (page != scored_page) {
        const uint32_t count = seq->slots - page * P < P ? seq->slots - page * P : P;
        const uint8_t *block = head_block(&L->keys, seq->key_pages, t, kvh);
        for (uint32_t i = 0; i < count; i++) extra[i] = 0;
        if (L->keys.method == KVQ_LAYOUT_QJL) {
          if (qjl_page(L, block, count, q, s, a, &ops) != 0) return -1;
        } else if (L->keys.method == KVQ_LAYOUT_POLAR) {
          polar_page(L, block, kvh, count, qr, qerr, s, a, extra, &ops);
        } else {
          for (uint32_t i = 0; i < count; i++) {
            s[i] = a[i] = 0;
            for (uint32_t c = 0; c < d; c++) {
              double err, mag, k = decode(L, 0, block, kvh, i, c, &err, &mag);
              s[i] += q[c] * k;
              /* KIVI: a fused logit may sum q min and (q scale) code, each term as large as mag;
               * mag + err >= |k| + err, so the bound of decoding first is covered too */
              a[i] += fabs(q[c]) * ((L->keys.method == KVQ_LAYOUT_KIVI ? mag : fabs(k)) + err);
            }
          }
          ops = d + 4;
        }
        scored_page = page;
      }
      sj = s[t % P], aj = a[t % P], ej = extra[t % P], opsj = ops;
    } else { /* window tokens: exact inputs */
      const float *k = seq->keys + ((size_t)seq->kept_position[j] * hkv + kvh) * d;
      sj = aj = ej = 0;
      for (uint32_t c = 0; c < d; c++) {
        sj += (double)q[c] * k[c];
        aj += fabs((double)q[c] * k[c]);
      }
      opsj = d + 2;
    }
    logit[j] = sj * inv_sqrt_d;
    lb[j] = (gamma_n(opsj) * aj + ej) * inv_sqrt_d + u * fabs(logit[j]) + opsj * FLT_MIN;
  }
  return 0;
}

/* Probabilities of one query head over its visible tokens, with bounds. */
static void ref_probabilities(const double *logit, const double *lb, uint32_t visible, uint32_t n, double *p, double *pb,
                              double *hi, double *lo) {
  double max = -INFINITY, z = 0;
  for (uint32_t t = 0; t < visible; t++) max = logit[t] > max ? logit[t] : max;
  for (uint32_t t = 0; t < visible; t++) z += exp(logit[t] - max);
  double z_hi = 0, z_lo = 0;
  for (uint32_t t = 0; t < visible; t++) {
    p[t] = exp(logit[t] - max) / z;
    double e_t = (3 + 2 * fabs(logit[t] - max)) * 0x1p-23;
    hi[t] = exp(lb[t] + e_t);
    lo[t] = exp(-(lb[t] + e_t));
    z_hi += p[t] * hi[t];
    z_lo += p[t] * lo[t];
  }
  z_hi *= 1 + gamma_n(visible);
  z_lo *= 1 - gamma_n(visible);
  for (uint32_t t = 0; t < visible; t++) {
    double up = p[t] * hi[t] / z_lo * (1 + 2 * u) - p[t], down = p[t] - p[t] * lo[t] / z_hi * (1 - 2 * u);
    pb[t] = (up > down ? up : down) + 1e-45;
  }
  for (uint32_t t = visible; t < n; t++) p[t] = pb[t] = 0;
}

/* Output of one query head with bounds. Quantized PolarQuant values are summed in the rotated
 * space and rotated back once; CQ values are summed by code (2^b more products per channel). */
static void ref_output(const ref_layer *L, const ref_sequence *seq, uint32_t kvh, const double *p, const double *pb,
                       uint32_t visible, double *o, double *ob) {
  const kvq_side_layout *vs = &L->values;
  const uint32_t d = L->config->head_dim, hkv = L->config->kv_heads, P = vs->page_size;
  const int polar = vs->method == KVQ_LAYOUT_POLAR;
  const double extra_ops = vs->method == KVQ_LAYOUT_CQ ? (double)(1u << vs->code_bits) : 0;
  double weight[KVQ_MAX_HEAD_DIM], acc[KVQ_MAX_HEAD_DIM], acc_b[KVQ_MAX_HEAD_DIM], acc_w[KVQ_MAX_HEAD_DIM];
  double y[KVQ_MAX_HEAD_DIM], x[KVQ_MAX_HEAD_DIM], xb[KVQ_MAX_HEAD_DIM];
  for (uint32_t c = 0; c < d; c++) o[c] = ob[c] = weight[c] = acc[c] = acc_b[c] = acc_w[c] = 0;
  uint32_t rotated = 0;
  for (uint32_t j = 0; j < visible; j++) {
    const uint32_t t = seq->kept_slot[j]; /* p and pb are per kept token j */
    if (t < seq->slots && polar) {
      golden_polar_decode(vs, L->fixed[1][1], kvh, head_block(vs, seq->value_pages, t, kvh), t % P, y);
      for (uint32_t c = 0; c < d; c++) {
        acc[c] += p[j] * y[c];
        acc_b[c] += pb[j] * fabs(y[c]) + p[j] * gamma_n(vs->levels) * fabs(y[c]);
        acc_w[c] += (p[j] + pb[j]) * fabs(y[c]);
      }
      rotated++;
      continue;
    }
    for (uint32_t c = 0; c < d; c++) {
      double err = 0, mag, v;
      if (t < seq->slots) v = decode(L, 1, head_block(vs, seq->value_pages, t, kvh), kvh, t % P, c, &err, &mag);
      else v = seq->values[((size_t)seq->kept_position[j] * hkv + kvh) * d + c];
      o[c] += p[j] * v;
      ob[c] += pb[j] * fabs(v) + p[j] * err;
      weight[c] += (p[j] + pb[j]) * fabs(v);
    }
  }
  if (rotated) {
    for (uint32_t c = 0; c < d; c++) acc_b[c] += gamma_n(rotated + 2) * acc_w[c];
    golden_polar_unrotate(vs, L->fixed[1][0], acc, acc_b, x, xb);
    for (uint32_t c = 0; c < d; c++) o[c] += x[c], ob[c] += xb[c], weight[c] += fabs(x[c]) + xb[c];
  }
  for (uint32_t c = 0; c < d; c++) ob[c] += gamma_n(visible + extra_ops + 2) * weight[c] + u * fabs(o[c]) + 1e-45;
}

int ref_attention(const ref_layer *L, const ref_sequence *seq, const float *queries, uint32_t nq, kvq_mask mask,
                  ref_result *r) {
  const kvq_layer_config *cfg = L->config;
  const uint32_t d = cfg->head_dim, hq = cfg->query_heads, hkv = cfg->kv_heads, group = hq / hkv;
  const uint32_t n = seq->kept, P = L->keys.page_size;
  double *s = malloc(sizeof(double) * P), *a = malloc(sizeof(double) * P), *extra = malloc(sizeof(double) * P);
  double *hi = malloc(sizeof(double) * (n ? n : 1)), *lo = malloc(sizeof(double) * (n ? n : 1));
  int rc = s && a && extra && hi && lo ? 0 : -1;
  for (uint32_t qi = 0; qi < nq && rc == 0; qi++)
    for (uint32_t h = 0; h < hq && rc == 0; h++) {
      const size_t row = (size_t)qi * hq + h;
      const uint32_t kvh = h / group;
      uint32_t visible = n; /* kept positions ascend: the visible ones are a prefix */
      if (mask == KVQ_MASK_CAUSAL)
        for (visible = 0; visible < n && seq->kept_position[visible] <= seq->positions - nq + qi;) visible++;
      double *logit = r->logit + row * n, *lb = r->logit_bound + row * n;
      rc = ref_logits(L, seq, queries + row * d, kvh, logit, lb, s, a, extra);
      for (uint32_t t = visible; t < n; t++) {
        logit[t] = -INFINITY;
        lb[t] = 0;
      }
      ref_probabilities(logit, lb, visible, n, r->prob + row * n, r->prob_bound + row * n, hi, lo);
      ref_output(L, seq, kvh, r->prob + row * n, r->prob_bound + row * n, visible, r->out + row * d, r->out_bound + row * d);
    }
  free(s);
  free(a);
  free(extra);
  free(hi);
  free(lo);
  return rc;
}
