/*
 * A priori error bounds per compressed method (model_bounds.h). The derivations are written next to
 * each method's function; docs/MODEL.md ("Error bounds per method") sums them up.
 */
#include "model_bounds.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double u = 0x1p-24;   /* fp32 unit roundoff */
static const double u16 = 0x1p-11; /* fp16 unit roundoff (normal range) */
static const double sub16 = 0x1p-25;
static const double pi = 3.14159265358979323846; /* half the spacing of fp16 subnormals: the absolute error below 2^-14 */

double gamma_f32(double n) { return n * u / (1 - n * u); }

double qjl_lemma_eps(uint32_t m, double delta) {
  /* m eps^2 - (4/3) L eps - (4/3) L = 0 with L = log(2 / delta); the positive root */
  const double l = 4.0 / 3.0 * log(2 / delta);
  return (l + sqrt(l * l + 4.0 * m * l)) / (2.0 * m);
}

static uint32_t rd32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static uint64_t rd64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* docs/FORMAT.md, "Saved caches": a 64-byte header, then sections (u32 tag, u32 0, u64 payload
 * bytes, payload, padding to 8); MATX holds u32 count and per array u32 layer, side, index, kind,
 * ready, 0, u64 float count, 32 bytes of SHA-256, the floats. */
const float *saved_fixed_array(const uint8_t *saved, size_t size, uint32_t layer, uint32_t side, uint32_t index,
                               uint64_t *count) {
  size_t at = 64;
  while (at + 16 <= size) {
    const uint64_t bytes = rd64(saved + at + 8);
    const size_t payload = at + 16;
    if (bytes > size - payload) return NULL;
    if (!memcmp(saved + at, "MATX", 4)) {
      size_t p = payload + 4;
      const uint32_t arrays = rd32(saved + payload);
      for (uint32_t a = 0; a < arrays && p + 64 <= payload + bytes; a++) {
        const uint64_t floats = rd64(saved + p + 24);
        if (floats > (payload + bytes - p - 64) / 4) return NULL;
        if (rd32(saved + p) == layer && rd32(saved + p + 4) == side && rd32(saved + p + 8) == index) {
          *count = floats;
          return (const float *)(const void *)(saved + p + 64); /* 4-byte aligned: every field before is */
        }
        p += 64 + floats * 4;
      }
      return NULL;
    }
    at = payload + ((bytes + 7) & ~(uint64_t)7);
  }
  return NULL;
}

/* ---- exact storage ----
 * Round to nearest: |fp16(x) - x| <= 2^-11 |x| in fp16's normal range, <= 2^-25 below it; bf16 keeps
 * 8 significant bits and fp32's range: 2^-8 |x| (plus FLT_MIN for a flushed subnormal). */
static void bound_exact(kvq_dtype dtype, const float *x, size_t n, double *e) {
  for (size_t i = 0; i < n; i++) {
    const double a = fabs((double)x[i]);
    e[i] = dtype == KVQ_DTYPE_F16 ? u16 * a + sub16 : dtype == KVQ_DTYPE_BF16 ? 0x1p-8 * a + FLT_MIN : 0;
  }
}

/* ---- uniform and KIVI: one b-bit quantizer over a group of numbers with minimum mn, maximum mx ----
 * core/quantize_math.h: scale32 = fl(fl(mx - mn) fl(1/L)), L = 2^b - 1, within 3u of (mx - mn)/L;
 * scale_h = fp16(scale32), min_h = fp16(mn); codes count thresholds min_h + (j - 1/2) scale_h.
 * Inside [min_h, min_h + L scale_h] a number lands within scale_h / 2 of its decoded value; below
 * min_h it is at most |mn - min_h| away, above the top at most |mn - min_h| + L |scale - scale_h|.
 * The decoded value min_h + code scale_h is rounded twice (2u of |min_h| + code scale_h), the
 * thresholds likewise, together at most 4u max(|mn|, |mx|) and a little more for the rounded
 * scale: e <= scale_h / 2 + |mn - min_h| + L (|scale_h - scale32| + 4u scale32) + 4u max(|mn|, |mx|),
 * with scale_h <= scale32 (1 + 2^-11) + 2^-25, |scale_h - scale32| <= 2^-11 scale32 + 2^-25,
 * |mn - min_h| <= 2^-11 |mn| + 2^-25 (fp16 rounding, normal or subnormal). */
static double quantizer_bound(double mn, double mx, uint32_t bits) {
  const double levels = (double)((1u << bits) - 1u);
  const double scale = (mx - mn) / levels * (1 + 3 * u);
  const double scale_h = scale * (1 + u16) + sub16;
  const double d_scale = u16 * scale + sub16, d_min = u16 * fabs(mn) + sub16;
  return scale_h / 2 + d_min + levels * (d_scale + 4 * u * scale) + 4 * u * fmax(fabs(mn), fabs(mx));
}

/* uniform: per token, groups of G consecutive channels */
static void bound_uniform(const kvq_uniform_config *c, const float *x, uint32_t tokens, uint32_t heads, uint32_t d,
                          double *e) {
  for (size_t row = 0; row < (size_t)tokens * heads; row++)
    for (uint32_t g = 0; g < d; g += c->group_size) {
      double mn = INFINITY, mx = -INFINITY;
      for (uint32_t i = g; i < g + c->group_size; i++) mn = fmin(mn, x[row * d + i]), mx = fmax(mx, x[row * d + i]);
      const double b = quantizer_bound(mn, mx, c->bits);
      for (uint32_t i = g; i < g + c->group_size; i++) e[row * d + i] = b;
    }
}

/* KIVI: per channel, groups of Gt tokens of a page (0: the whole page); a flushed page's partial
 * group uses its valid tokens only (core/methods/kivi.h) */
static void bound_kivi(const kvq_kivi_config *c, const float *x, uint32_t tokens, uint32_t heads, uint32_t d,
                       uint32_t page_size, double *e) {
  const uint32_t gt = c->group_tokens ? c->group_tokens : page_size;
  for (uint32_t t0 = 0; t0 < tokens; t0 += gt) {
    const uint32_t t1 = t0 + gt < tokens ? t0 + gt : tokens;
    for (uint32_t h = 0; h < heads; h++)
      for (uint32_t ch = 0; ch < d; ch++) {
        double mn = INFINITY, mx = -INFINITY;
        for (uint32_t t = t0; t < t1; t++) {
          const double v = x[((size_t)t * heads + h) * d + ch];
          mn = fmin(mn, v), mx = fmax(mx, v);
        }
        const double b = quantizer_bound(mn, mx, c->bits);
        for (uint32_t t = t0; t < t1; t++) e[((size_t)t * heads + h) * d + ch] = b;
      }
  }
}

/* ---- PolarQuant ----
 * The rotated head vector y = R x (R orthogonal) splits into blocks of 2^L coordinates; a block is
 * its radius r and a tree of angles: level 1 the angle of each coordinate pair in [0, 2 pi), level
 * l >= 2 the angle psi of each pair of subtree norms (rho cos psi, rho sin psi) in [0, pi/2]. Moving
 * one angle by delta moves its pair by 2 rho sin(delta / 2) <= rho delta; the pairs of one level
 * are orthogonal parts of the block and their rho^2 sum to r^2, so replacing every angle of level l
 * by its code's centroid moves the block by at most r delta_l, delta_l the level's largest angle
 * error, whatever the other levels hold. Level by level (triangle inequality):
 *   ||y^_b - y_b|| <= |r_h - r| + r_h sum_l delta_l,  |r_h - r| <= (2^-11 + gamma(2^L + 2)) r + 2^-25
 * (fp16 radius of an fp32 square root of 2^L squares). Over the blocks, by Cauchy-Schwarz, and
 * since R is orthogonal: ||x^ - x|| <= ||x|| (sum_l delta_l (1 + 2^-11 + gamma) + 2^-11 + gamma)
 * plus the fp32 roundings of the rotation both ways and of the L products of a decode:
 * 2 sqrt(d) gamma(d + 2L + 8) ||x|| (each rotated coordinate within gamma(d + 1) sum_c |R_ic x_c|
 * <= gamma ||x||), and the stored unit pairs' deviation from norm 1 (at most 1e-6 each, what
 * loading enforces: L 1e-6 ||x||). delta_l from the side's tables: level 1 codes are the nearest
 * centroid on the circle (half the largest circular gap); level >= 2 codes are the bin between
 * stored boundaries (the largest distance of a centroid to its bin's ends, 0 and pi/2 outside). This
 * is a worst case (every angle off by its level's largest error, all in one direction): loose, by
 * about sqrt of the number of angles against the typical error. */
static int polar_deltas(const kvq_polar_config *c, const float *table, double *delta) {
  size_t at = 0;
  for (uint32_t l = 0; l < c->levels; l++) {
    const uint32_t k = 1u << c->bits[l];
    double psi[256], worst = 0;
    for (uint32_t j = 0; j < k; j++) {
      psi[j] = atan2(table[at + 2 * j + 1], table[at + 2 * j]);
      if (l == 0 && psi[j] < 0) psi[j] += 2 * pi;
    }
    if (l == 0) {
      for (uint32_t j = 0; j < k; j++) {
        const double next = j + 1 < k ? psi[j + 1] : psi[0] + 2 * pi;
        if (next < psi[j]) return -1; /* not ascending */
        worst = fmax(worst, (next - psi[j]) / 2);
      }
    } else {
      double lo = 0;
      for (uint32_t j = 0; j < k; j++) {
        const float *b = table + at + 2 * k + 2 * j; /* (cos^2 beta_j, sin^2 beta_j) */
        const double hi = j + 1 < k ? atan2(sqrt(b[1]), sqrt(b[0])) : pi / 2;
        worst = fmax(worst, fmax(fabs(psi[j] - lo), fabs(hi - psi[j])));
        lo = hi;
      }
    }
    delta[l] = worst;
    at += 4 * (size_t)k;
  }
  return 0;
}

static int bound_polar(const kvq_polar_config *c, const float *x, uint32_t tokens, uint32_t heads, uint32_t d,
                       const float *tables, uint64_t count, double *e) {
  size_t per_set = 0;
  for (uint32_t l = 0; l < c->levels; l++) per_set += 4 * ((size_t)1 << c->bits[l]);
  const int per_head = c->codebook == KVQ_CODEBOOK_ONLINE;
  if (!tables || count != (per_head ? heads : 1) * per_set) return -1;
  const double g_r = gamma_f32((1u << c->levels) + 2), rounding = 2 * sqrt((double)d) * gamma_f32(d + 2.0 * c->levels + 8);
  for (uint32_t h = 0; h < heads; h++) {
    double delta[KVQ_POLAR_MAX_LEVELS], sum = 0;
    if (polar_deltas(c, tables + (per_head ? h * per_set : 0), delta) != 0) return -1;
    for (uint32_t l = 0; l < c->levels; l++) sum += delta[l];
    const double factor = sum * (1 + u16 + g_r) + u16 + g_r + c->levels * 1e-6 + rounding;
    for (uint32_t t = 0; t < tokens; t++) {
      const float *v = x + ((size_t)t * heads + h) * d;
      double norm = 0;
      for (uint32_t i = 0; i < d; i++) norm += (double)v[i] * v[i];
      e[(size_t)t * heads + h] = factor * sqrt(norm) + sqrt(d / (double)(1u << c->levels)) * sub16;
    }
  }
  return 0;
}

/* ---- CQ ----
 * Each group of c channels is coded with the centroid of the smallest squared distance computed in
 * fp32 (within gamma(c + 2) of the exact one, plus c FLT_MIN for flushed subnormals), so the chosen
 * centroid's squared distance is at most min_j D_j (1 + gamma) / (1 - gamma) + 2 c FLT_MIN; a
 * centroid decodes exactly. The bound is the distortion of the learned codebook on this token:
 * tight, not a worst case. */
static int bound_cq(const kvq_cq_config *c, const float *x, uint32_t tokens, uint32_t heads, uint32_t d,
                    const float *centroids, uint64_t count, double *e) {
  const uint32_t groups = d / c->channels, k = 1u << c->bits;
  if (!centroids || count != (uint64_t)heads * groups * k * c->channels) return -1;
  const double g = gamma_f32(c->channels + 2);
  for (uint32_t t = 0; t < tokens; t++)
    for (uint32_t h = 0; h < heads; h++)
      for (uint32_t gr = 0; gr < groups; gr++) {
        const float *v = x + ((size_t)t * heads + h) * d + (size_t)gr * c->channels;
        const float *book = centroids + ((size_t)h * groups + gr) * k * c->channels;
        double best = INFINITY;
        for (uint32_t j = 0; j < k; j++) {
          double dist = 0;
          for (uint32_t i = 0; i < c->channels; i++) {
            const double diff = (double)v[i] - book[(size_t)j * c->channels + i];
            dist += diff * diff;
          }
          best = fmin(best, dist);
        }
        e[((size_t)t * heads + h) * groups + gr] = sqrt(best * (1 + g) / (1 - g) + 2 * c->channels * FLT_MIN);
      }
  return 0;
}

/* ---- QJL keys (logit error only) ----
 * Lemma 3.5 of the QJL paper: with m >= (4/3)(1 + eps)/eps^2 log(2/delta) sketch rows,
 * |est - <q, k>| <= eps ||q|| ||k|| with probability >= 1 - delta, for each of the two sketches (the
 * inlier channels with m rows, the outlier channels with m_o rows); both hold with probability
 * >= 1 - 2 delta, and eps ||q_in|| ||k_in|| + eps_o ||q_out|| ||k_out|| <= max(eps, eps_o) ||q|| ||k||
 * (Cauchy-Schwarz over the two parts). The lemma is stated for i.i.d. Gaussian rows and the
 * sqrt(pi/2) constant; kvq's rows are orthogonalized blocks and its constant c_d is the exactly
 * unbiased one: tests/test_qjl.c checks the lemma's rate on kvq's own sketches. The norms are fp16
 * (2^-11 of each part's estimate, itself at most (1 + eps) ||q_part|| ||k_part||), and the fp32
 * estimate errs by at most gamma(d + max(m, m_o) + 8) A with A <= 4 c_d sqrt(d) ||q|| ||k||
 * (docs/ACCURACY.md's QJL row; rows of norm sqrt(d), c_d < sqrt(pi / 2)). */
static void bound_qjl(const kvq_qjl_config *c, const float *x, uint32_t tokens, uint32_t heads, uint32_t d,
                      double delta, double *e, double *eps_out) {
  const uint32_t m = c->sketch_dim, mo = c->outlier_count ? c->outlier_sketch_dim : c->sketch_dim;
  const double eps = fmax(qjl_lemma_eps(m, delta), qjl_lemma_eps(mo, delta));
  const double rounding = gamma_f32(d + (m > mo ? m : mo) + 8.0) * 4 * sqrt(pi / 2) * sqrt((double)d);
  *eps_out = eps;
  for (size_t row = 0; row < (size_t)tokens * heads; row++) {
    double norm = 0;
    for (uint32_t i = 0; i < d; i++) norm += (double)x[row * d + i] * x[row * d + i];
    e[row] = (eps + u16 * (1 + eps) + rounding) * sqrt(norm);
  }
}

int side_bound_compute(const kvq_method_config *method, const float *x, uint32_t tokens, uint32_t heads, uint32_t d,
                       uint32_t page_size, const float *fixed, uint64_t fixed_count, double qjl_delta,
                       side_bound *out, char *error, size_t error_size) {
  *out = (side_bound){0};
  switch (method->method) {
  case KVQ_METHOD_EXACT: case KVQ_METHOD_UNIFORM: case KVQ_METHOD_KIVI: out->group_size = 1; break;
  case KVQ_METHOD_CQ: out->group_size = method->cq.channels; break;
  case KVQ_METHOD_POLAR: case KVQ_METHOD_QJL: out->group_size = d; break;
  default: snprintf(error, error_size, "no bound for method %d", (int)method->method); return -1;
  }
  out->group = malloc((size_t)tokens * heads * (d / out->group_size) * sizeof *out->group);
  if (!out->group) {
    snprintf(error, error_size, "out of memory");
    return -1;
  }
  int status = 0;
  switch (method->method) {
  case KVQ_METHOD_EXACT: bound_exact(method->exact.dtype, x, (size_t)tokens * heads * d, out->group); break;
  case KVQ_METHOD_UNIFORM: bound_uniform(&method->uniform, x, tokens, heads, d, out->group); break;
  case KVQ_METHOD_KIVI: bound_kivi(&method->kivi, x, tokens, heads, d, page_size, out->group); break;
  case KVQ_METHOD_POLAR: status = bound_polar(&method->polar, x, tokens, heads, d, fixed, fixed_count, out->group); break;
  case KVQ_METHOD_CQ: status = bound_cq(&method->cq, x, tokens, heads, d, fixed, fixed_count, out->group); break;
  default:
    bound_qjl(&method->qjl, x, tokens, heads, d, qjl_delta, out->group, &out->qjl_eps);
    out->probabilistic = 1;
    break;
  }
  if (status != 0) {
    snprintf(error, error_size, "the saved cache's tables do not have the size or order the method implies");
    side_bound_free(out);
  }
  return status;
}

void side_bound_free(side_bound *b) {
  free(b->group);
  b->group = NULL;
}
