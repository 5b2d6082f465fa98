/* `kvq golden --check`: replays every golden file on a backend and compares in three classes. */
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/halfconv.h"
#include "core/internal.h"
#include "core/layout.h"
#include "core/quantize_math.h"
#include "core/sha256.h"
#include "golden.h"
#include "polar_ref.h"
#include "reference.h"
#include "replay.h"

#define MAX_REPORTS 12 /* failure lines printed per configuration */

typedef struct checker {
  FILE *out;
  golden_totals *t;
  const char *name;
  uint32_t reports;
  int failed;
} checker;

static void report(checker *ck, const char *format, ...) {
  ck->failed = 1;
  if (ck->reports++ >= MAX_REPORTS) {
    if (ck->reports == MAX_REPORTS + 1) fprintf(ck->out, "FAIL %s: ... (further failures not shown)\n", ck->name);
    return;
  }
  va_list args;
  va_start(args, format);
  fprintf(ck->out, "FAIL %s: ", ck->name);
  vfprintf(ck->out, format, args);
  fputc('\n', ck->out);
  va_end(args);
}

static double gamma_n(double n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

/* Distance in units in the last place between two fp16 values, on a monotone integer mapping in
 * which -0 and +0 are one step apart (their bits differ, so the difference is counted). */
static uint32_t f16_ulps(uint32_t a, uint32_t b) {
  int32_t ia = (a & 0x8000) ? -(int32_t)(a & 0x7fff) - 1 : (int32_t)a;
  int32_t ib = (b & 0x8000) ? -(int32_t)(b & 0x7fff) - 1 : (int32_t)b;
  return (uint32_t)(ia > ib ? ia - ib : ib - ia);
}

/* Bytes that must be identical and are no code (padding, side data of tokens past the valid
 * count): any difference is unexplained. */
static void exact_bytes(checker *ck, const uint8_t *g, const uint8_t *b, uint32_t from, uint32_t to, const char *what,
                        uint32_t page, uint32_t head) {
  for (uint32_t off = from; off < to; off++) {
    ck->t->code_bytes++;
    if (g[off] == b[off]) continue;
    ck->t->code_bytes_differing++, ck->t->unexplained++;
    report(ck, "class 1: %s byte %u of page %u head %u differs", what, off, page, head);
  }
}

static void side_value(checker *ck, uint32_t golden, uint32_t got, const char *what, uint32_t page, uint32_t head) {
  ck->t->side_values++;
  uint32_t ulps = f16_ulps(golden, got);
  if (ulps == 1) ck->t->side_one_ulp++;
  if (ulps > 1) {
    ck->t->side_beyond++;
    report(ck, "class 2: %s of page %u head %u is fp16 0x%04x, golden 0x%04x (%u ulps)", what, page, head, got, golden, ulps);
  }
}

/* The page's view: token inputs and matrices, for proving near-ties. */
typedef struct page_ctx {
  const kvq_side_layout *s;
  const float *tokens; /* token 0 of the page, head 0; token stride kv_heads * head_dim */
  uint32_t valid;
  const float *fixed[KVQ_SIDE_FIXED]; /* the side's fixed arrays: QJL S and S_o, PolarQuant R and tables, CQ centroids */
} page_ctx;

static const float *token(const page_ctx *pc, uint32_t t, uint32_t h) {
  return pc->tokens + ((size_t)t * pc->s->kv_heads + h) * pc->s->head_dim;
}

/* A sign bit may differ only if the projection it encodes is within rounding of zero: any fp32
 * evaluation order is within gamma(d) sum |S x| of the exact value, plus d FLT_MIN for flushed
 * subnormals. */
static int sign_near_tie(const float *row, const float *x, const uint8_t *is_out, int outlier_side, uint32_t d) {
  double p = 0, a = 0;
  for (uint32_t c = 0; c < d; c++) {
    if ((is_out[c] != 0) != outlier_side) continue;
    p += (double)row[c] * x[c];
    a += fabs((double)row[c] * x[c]);
  }
  return fabs(p) <= gamma_n(d) * a + d * FLT_MIN;
}

/* The outlier list of a head block as a channel mask; -1 unless strictly ascending below d. */
static int outlier_mask(const page_ctx *pc, const uint8_t *block, uint8_t *mask) {
  const kvq_side_layout *s = pc->s;
  memset(mask, 0, KVQ_MAX_HEAD_DIM);
  const uint8_t *list = block + kvq_qjl_outliers_offset(s->page_size, s->sketch_dim, s->outlier_sketch_dim, s->outliers);
  for (uint32_t j = 0; j < s->outliers; j++) {
    if (list[j] >= s->head_dim || (j > 0 && list[j] <= list[j - 1])) return -1;
    mask[list[j]] = 1;
  }
  return 0;
}

/* Whether two outlier sets differ only where channels tie within rounding: every channel chosen by
 * one list and not the other has a squared norm (over the page's valid tokens) within the fp32
 * summation bound of the k-th largest, so that another summation order may rank it either way. */
static int outliers_near_tie(const page_ctx *pc, uint32_t h, const uint8_t *gmask, const uint8_t *bmask) {
  const uint32_t d = pc->s->head_dim, k = pc->s->outliers;
  double norm2[KVQ_MAX_HEAD_DIM], sorted[KVQ_MAX_HEAD_DIM];
  for (uint32_t c = 0; c < d; c++) {
    norm2[c] = 0;
    for (uint32_t t = 0; t < pc->valid; t++) norm2[c] += (double)token(pc, t, h)[c] * token(pc, t, h)[c];
    sorted[c] = norm2[c];
  }
  for (uint32_t i = 0; i < k; i++) /* selection of the k largest */
    for (uint32_t j = i + 1; j < d; j++)
      if (sorted[j] > sorted[i]) {
        double x = sorted[i];
        sorted[i] = sorted[j];
        sorted[j] = x;
      }
  const double threshold = sorted[k - 1];
  for (uint32_t c = 0; c < d; c++) {
    if (gmask[c] == bmask[c]) continue;
    const double tol = 2 * gamma_n(pc->valid) * (norm2[c] > threshold ? norm2[c] : threshold) + 2 * pc->valid * FLT_MIN;
    if (bmask[c] && norm2[c] < threshold - tol) return 0; /* the backend chose a clearly smaller channel */
    if (gmask[c] && norm2[c] > threshold + tol) return 0; /* or dropped a clearly larger one */
  }
  return 1;
}

/* Checks one QJL head block: outliers, sign bits (class 1) and norms (class 2). */
static void check_qjl_head(checker *ck, const page_ctx *pc, const uint8_t *g, const uint8_t *b, uint32_t page, uint32_t h) {
  const kvq_side_layout *s = pc->s;
  const uint32_t P = s->page_size, d = s->head_dim, m = s->sketch_dim, mo = s->outlier_sketch_dim, k = s->outliers;
  const uint32_t out_at = kvq_qjl_outliers_offset(P, m, mo, k);
  uint8_t mask[KVQ_MAX_HEAD_DIM], gmask[KVQ_MAX_HEAD_DIM];
  if (outlier_mask(pc, g, gmask) != 0) {
    report(ck, "golden file: outlier list of page %u head %u is malformed", page, h);
    ck->t->errors++;
    return;
  }
  int lists_differ = 0;
  memcpy(mask, gmask, sizeof mask);
  if (pc->valid == 0) {
    exact_bytes(ck, g, b, out_at, out_at + k, "outlier list of an empty page", page, h);
  } else if (k > 0) {
    ck->t->code_bytes += k;
    if (memcmp(g + out_at, b + out_at, k) != 0) {
      lists_differ = 1;
      for (uint32_t j = 0; j < k; j++) ck->t->code_bytes_differing += g[out_at + j] != b[out_at + j];
      if (outlier_mask(pc, b, mask) != 0) {
        ck->t->unexplained++;
        report(ck, "class 1: outlier list of page %u head %u is not strictly ascending below head_dim", page, h);
        return;
      }
      if (!outliers_near_tie(pc, h, gmask, mask)) {
        ck->t->unexplained++;
        report(ck, "class 1: outlier channels of page %u head %u differ and are not a near-tie", page, h);
        return;
      }
      ck->t->near_ties++;
    }
  }
  /* sign bits: each must equal the golden bit or, where the outliers differ, the sign recomputed
   * with the backend's own outliers; otherwise only a proven near-tie passes */
  const uint32_t parts = k ? 2 : 1;
  for (uint32_t part = 0; part < parts; part++) {
    const uint32_t rows = part ? mo : m;
    const uint32_t at = part ? kvq_qjl_signs_out_offset(P, m) : kvq_qjl_signs_offset();
    const float *M = pc->fixed[part];
    exact_bytes(ck, g, b, at + pc->valid * rows / 8, at + P * rows / 8, "sign bits of a padding token", page, h);
    for (uint32_t t = 0; t < pc->valid; t++)
      for (uint32_t byte = 0; byte < rows / 8; byte++) {
        const uint32_t off = at + t * rows / 8 + byte;
        ck->t->code_bytes++;
        if (g[off] == b[off] && !lists_differ) continue;
        if (g[off] != b[off]) ck->t->code_bytes_differing++;
        for (uint32_t bit = 0; bit < 8; bit++) {
          const uint32_t i = byte * 8 + bit;
          const int got = b[off] >> bit & 1, golden = g[off] >> bit & 1;
          int expect = golden;
          if (lists_differ) {
            double p = 0;
            for (uint32_t c = 0; c < d; c++)
              if ((mask[c] != 0) == (part == 1)) p += (double)M[(size_t)i * d + c] * token(pc, t, h)[c];
            expect = p > 0;
          }
          if (got == expect) {
            if (got != golden) ck->t->implied++; /* follows from the proven outlier near-tie */
          } else if (sign_near_tie(M + (size_t)i * d, token(pc, t, h), mask, (int)part, d)) {
            ck->t->near_ties++;
          } else {
            ck->t->unexplained++;
            report(ck, "class 1: sign bit %u of token %u (page %u head %u, %s sketch) differs, projection not near 0", i, t,
                   page, h, part ? "outlier" : "inlier");
          }
        }
      }
  }
  /* norms: class 2 against golden (or the exact norm when the outliers differ); zero past valid */
  for (uint32_t part = 0; part < parts; part++) {
    const uint32_t at = part ? kvq_qjl_norm_out_offset(P, m, mo, k) : kvq_qjl_norm_in_offset(P, m, mo, k);
    for (uint32_t t = 0; t < pc->valid; t++) {
      uint32_t expect = kvq_le16(g + at + 2 * t);
      if (lists_differ) {
        double n2 = 0;
        for (uint32_t c = 0; c < d; c++)
          if ((mask[c] != 0) == (part == 1)) n2 += (double)token(pc, t, h)[c] * token(pc, t, h)[c];
        expect = kvq_f32_to_f16_bits((float)sqrt(n2));
      }
      side_value(ck, expect, kvq_le16(b + at + 2 * t), part ? "|k_out|" : "|k_in|", page, h);
    }
    exact_bytes(ck, g, b, at + 2 * pc->valid, at + 2 * P, "norm of a padding token", page, h);
  }
  exact_bytes(ck, g, b, out_at + k, s->head_bytes, "padding", page, h);
}

/* Packed code words (layout.h: codes_per_word codes of `bits` bits per little-endian u32, unused
 * top bits zero): every differing code must be at a valid position and pass `tie`, the proof that
 * the backend's code is also a correct decision for the data; codes_per_token relates code index
 * and token for the failure lines. */
typedef int (*code_tie)(void *arg, uint32_t index, uint32_t golden, uint32_t got);

static void compare_codes(checker *ck, const uint8_t *g, const uint8_t *b, uint32_t codes, uint32_t bits,
                          uint32_t valid_codes, uint32_t codes_per_token, code_tie tie, void *arg, const char *what,
                          uint32_t page, uint32_t h) {
  const uint32_t cpw = kvq_codes_per_word(bits), words = kvq_code_words(codes, bits), mask = (1u << bits) - 1u;
  for (uint32_t w = 0; w < words; w++) {
    const uint32_t gw = kvq_le32(g + 4 * w), bw = kvq_le32(b + 4 * w);
    ck->t->code_bytes += 4;
    if (gw == bw) continue;
    for (uint32_t byte = 0; byte < 4; byte++) ck->t->code_bytes_differing += (gw >> (8 * byte) & 0xff) != (bw >> (8 * byte) & 0xff);
    const uint32_t used_bits = cpw * bits;
    if (used_bits < 32 && (gw >> used_bits) != (bw >> used_bits)) {
      ck->t->unexplained++;
      report(ck, "class 1: padding bits of %s word %u (page %u head %u) differ", what, w, page, h);
    }
    for (uint32_t slot = 0; slot < cpw; slot++) {
      const uint32_t i = w * cpw + slot;
      const uint32_t gc = gw >> (slot * bits) & mask, bc = bw >> (slot * bits) & mask;
      if (gc == bc) continue;
      if (i >= valid_codes) {
        ck->t->unexplained++;
        report(ck, "class 1: a %s past the valid tokens (word %u, page %u head %u) is not zero", what, w, page, h);
      } else if (tie(arg, i, gc, bc)) {
        ck->t->near_ties++;
      } else {
        ck->t->unexplained++;
        report(ck, "class 1: %s %u of token %u (page %u head %u) is %u, golden %u, and no near-tie", what,
               i % codes_per_token, i / codes_per_token, page, h, bc, gc);
      }
    }
  }
}

/* Where the (scale, minimum) word of code (t, c) is, for the two uniform quantizers: token-wise
 * groups of channels (UNIFORM) or channel-wise groups of tokens (KIVI). */
static uint32_t param_word(const kvq_side_layout *s, uint32_t t, uint32_t c) {
  return s->method == KVQ_LAYOUT_KIVI ? (t / s->group) * s->head_dim + c : t * (s->head_dim / s->group) + c / s->group;
}

typedef struct uniform_tie_arg {
  const page_ctx *pc;
  const uint8_t *g, *b;
  uint32_t h;
} uniform_tie_arg;

/* A uniform code may differ by one step only: when the backend's parameters differ from the golden
 * ones by the ulp class 2 allows and its code follows from them, or when the value or the
 * threshold between the two codes is subnormal (flushed to zero on some GPUs). */
static int uniform_tie(void *arg, uint32_t i, uint32_t gc, uint32_t bc) {
  const uniform_tie_arg *u = arg;
  const kvq_side_layout *s = u->pc->s;
  const uint32_t d = s->head_dim, bits = s->bits, t = i / d, c = i % d;
  const uint32_t params_at = kvq_uniform_params_offset(s->page_size, d, bits);
  const uint32_t pw = kvq_le32(u->b + params_at + 4 * param_word(s, t, c));
  const float x = token(u->pc, t, u->h)[c], mn = kvq_uniform_param_min(pw), sc = kvq_uniform_param_scale(pw);
  const uint32_t lo = gc < bc ? gc : bc;
  const float between = kvq_uniform_threshold(mn, sc, lo + 1);
  const int adjacent = (gc > bc ? gc - bc : bc - gc) == 1;
  const int own = bc == kvq_uniform_code(x, mn, sc, bits) && pw != kvq_le32(u->g + params_at + 4 * param_word(s, t, c));
  const int flushed = (fabsf(x) < FLT_MIN && bc == kvq_uniform_code(0.0f, mn, sc, bits)) || fabsf(between) < FLT_MIN;
  return adjacent && (own || flushed);
}

static void check_uniform_head(checker *ck, const page_ctx *pc, const uint8_t *g, const uint8_t *b, uint32_t page,
                               uint32_t h) {
  const kvq_side_layout *s = pc->s;
  const int kivi = s->method == KVQ_LAYOUT_KIVI;
  const uint32_t P = s->page_size, d = s->head_dim, bits = s->bits, G = s->group;
  const uint32_t params_at = kvq_uniform_params_offset(P, d, bits);
  const uint32_t params = kivi ? (P / G) * d : P * (d / G);
  const uint32_t valid_params = kivi ? (pc->valid + G - 1) / G * d : pc->valid * (d / G);
  for (uint32_t p = 0; p < valid_params; p++) {
    const uint32_t off = params_at + 4 * p;
    side_value(ck, kvq_le16(g + off), kvq_le16(b + off), "scale", page, h);
    side_value(ck, kvq_le16(g + off + 2), kvq_le16(b + off + 2), "minimum", page, h);
  }
  exact_bytes(ck, g, b, params_at + 4 * valid_params, params_at + 4 * params, "parameters past the valid tokens", page, h);
  uniform_tie_arg arg = {pc, g, b, h};
  compare_codes(ck, g, b, P * d, bits, pc->valid * d, d, uniform_tie, &arg, "code of channel", page, h);
  exact_bytes(ck, g, b, params_at + params * 4, s->head_bytes, "padding", page, h);
}

/* PolarQuant: the codes of each level are decided from the rotated token y = R x (an fp32
 * evaluation lands within err of the double one, polar_ref.h). Level 1 picks the centroid with the
 * largest x cos + y sin: another code is a near-tie when, with every dot product widened by what
 * the rotation error and the two fp32 roundings can move it, it could still be the largest. Level
 * l >= 2 counts the boundaries with s_b cos^2 >= s_a sin^2: each boundary between the two codes
 * must be undecidable within the error of the squared radii (squares and l - 1 sums of inputs
 * known within err) and the two fp32 products. */
typedef struct polar_tie_arg {
  const page_ctx *pc;
  uint32_t h, level, cached; /* cached: the token whose rotation is in y, or ~0 */
  double y[KVQ_MAX_HEAD_DIM], err[KVQ_MAX_HEAD_DIM];
} polar_tie_arg;

/* Squared radius of coordinates [first, first + count) and its error bound. */
static void polar_square(const polar_tie_arg *p, uint32_t first, uint32_t count, double *s, double *e) {
  *s = *e = 0;
  double abs_sum = 0;
  for (uint32_t i = first; i < first + count; i++) {
    const double y = fabs(p->y[i]), err = p->err[i];
    *s += y * y;
    *e += 2 * y * err + err * err;
    abs_sum += (y + err) * (y + err);
  }
  *e += gamma_n(p->level + 1) * abs_sum + 2 * count * FLT_MIN;
}

/* The range of an fp32 x cos + y sin for pair a of the rotated token. */
static void pair_dot_range(const polar_tie_arg *p, uint32_t a, double c, double sn, double *lo, double *hi) {
  const double x = p->y[2 * a], y = p->y[2 * a + 1], ex = p->err[2 * a], ey = p->err[2 * a + 1];
  const double dot = x * c + y * sn;
  const double tol = ex * fabs(c) + ey * fabs(sn) + gamma_n(2) * ((fabs(x) + ex) * fabs(c) + (fabs(y) + ey) * fabs(sn)) +
                     2 * FLT_MIN;
  *lo = dot - tol;
  *hi = dot + tol;
}

static int polar_tie(void *arg, uint32_t i, uint32_t gc, uint32_t bc) {
  polar_tie_arg *p = arg;
  const kvq_side_layout *s = p->pc->s;
  const uint32_t d = s->head_dim, angles = kvq_polar_angles(d, p->level), t = i / angles, a = i % angles;
  const uint32_t K = 1u << kvq_polar_level_bits(s->level_bits, p->level);
  if (p->cached != t) {
    golden_polar_rotate(s, p->pc->fixed[0], token(p->pc, t, p->h), p->y, p->err);
    p->cached = t;
  }
  const float *table = golden_polar_table(s, p->pc->fixed[1], p->h, p->level);
  if (p->level == 1) { /* both codes' largest possible dot products must reach every smallest */
    double lo[1u << KVQ_MAX_POLAR_BITS], hi[1u << KVQ_MAX_POLAR_BITS];
    for (uint32_t j = 0; j < K; j++) pair_dot_range(p, a, table[2 * j], table[2 * j + 1], &lo[j], &hi[j]);
    for (uint32_t j = 0; j < K; j++)
      if (hi[bc] < lo[j] || hi[gc] < lo[j]) return 0;
    return 1;
  }
  const uint32_t half = 1u << (p->level - 1);
  double s_a, e_a, s_b, e_b;
  polar_square(p, 2 * a * half, half, &s_a, &e_a);
  polar_square(p, (2 * a + 1) * half, half, &s_b, &e_b);
  const float *boundaries = table + 2 * K;
  for (uint32_t j = gc < bc ? gc : bc; j < (gc > bc ? gc : bc); j++) {
    const double c2 = boundaries[2 * j], s2 = boundaries[2 * j + 1];
    const double margin = s_b * c2 - s_a * s2;
    const double tol = e_b * c2 + e_a * s2 + gamma_n(1) * ((s_b + e_b) * c2 + (s_a + e_a) * s2) + 2 * FLT_MIN;
    if (fabs(margin) > tol) return 0;
  }
  return 1;
}

static void check_polar_head(checker *ck, const page_ctx *pc, const uint8_t *g, const uint8_t *b, uint32_t page,
                             uint32_t h) {
  const kvq_side_layout *s = pc->s;
  const uint32_t P = s->page_size, d = s->head_dim, L = s->levels, blocks = d >> L;
  polar_tie_arg arg = {pc, h, 0, ~0u, {0}, {0}};
  for (uint32_t l = 1; l <= L; l++) {
    const uint32_t at = kvq_polar_level_offset(P, d, s->level_bits, l), angles = kvq_polar_angles(d, l);
    arg.level = l;
    compare_codes(ck, g + at, b + at, P * angles, kvq_polar_level_bits(s->level_bits, l), pc->valid * angles, angles,
                  polar_tie, &arg, l == 1 ? "level-1 angle" : "angle of a higher level", page, h);
  }
  const uint32_t radii = kvq_polar_radius_offset(P, d, L, s->level_bits);
  for (uint32_t k = 0; k < pc->valid * blocks; k++)
    side_value(ck, kvq_le16(g + radii + 2 * k), kvq_le16(b + radii + 2 * k), "block radius", page, h);
  exact_bytes(ck, g, b, radii + 2 * pc->valid * blocks, s->head_bytes, "radii past the valid tokens and padding", page, h);
}

/* CQ: the code of a channel group is the nearest centroid by squared distance. An fp32 distance of
 * c channels lands within gamma(c + 2) of the exact one (difference, square, c - 1 sums), so another
 * code is a near-tie when the two exact distances are within the sum of their bounds (the golden
 * code being the nearest, the other is then nearest within rounding too). */
typedef struct cq_tie_arg {
  const page_ctx *pc;
  uint32_t h;
} cq_tie_arg;

static double cq_distance(const cq_tie_arg *q, uint32_t t, uint32_t group, uint32_t code) {
  const kvq_side_layout *s = q->pc->s;
  const uint32_t c = s->channels;
  const float *x = token(q->pc, t, q->h) + group * c;
  const float *mu = q->pc->fixed[1] + ((size_t)(q->h * (s->head_dim / c) + group) << s->code_bits) * c + (size_t)code * c;
  double sum = 0;
  for (uint32_t i = 0; i < c; i++) sum += ((double)x[i] - mu[i]) * ((double)x[i] - mu[i]);
  return sum;
}

static int cq_tie(void *arg, uint32_t i, uint32_t gc, uint32_t bc) {
  const cq_tie_arg *q = arg;
  const kvq_side_layout *s = q->pc->s;
  const uint32_t groups = s->head_dim / s->channels, t = i / groups, group = i % groups;
  const double dg = cq_distance(q, t, group, gc), db = cq_distance(q, t, group, bc);
  const double g = gamma_n(s->channels + 2);
  return fabs(db - dg) <= g * (db + dg) + 2 * s->channels * FLT_MIN;
}

static void check_cq_head(checker *ck, const page_ctx *pc, const uint8_t *g, const uint8_t *b, uint32_t page, uint32_t h) {
  const kvq_side_layout *s = pc->s;
  const uint32_t groups = s->head_dim / s->channels, codes = s->page_size * groups;
  cq_tie_arg arg = {pc, h};
  compare_codes(ck, g, b, codes, s->code_bits, pc->valid * groups, groups, cq_tie, &arg, "code of channel group", page, h);
  exact_bytes(ck, g, b, kvq_code_words(codes, s->code_bits) * 4, s->head_bytes, "padding", page, h);
}

static void check_exact_head(checker *ck, const page_ctx *pc, const uint8_t *g, const uint8_t *b, uint32_t page, uint32_t h) {
  const kvq_side_layout *s = pc->s;
  const uint32_t esize = kvq_dtype_bytes(s->dtype), valid_bytes = pc->valid * s->head_dim * esize;
  for (uint32_t e = 0; e < pc->valid * s->head_dim; e++) {
    const uint8_t *ge = g + e * esize, *be = b + e * esize;
    ck->t->code_bytes += esize;
    if (memcmp(ge, be, esize) == 0) continue;
    for (uint32_t i = 0; i < esize; i++) ck->t->code_bytes_differing += ge[i] != be[i];
    /* the one allowed difference: a subnormal fp32 input flushed to (signed) zero */
    const uint32_t t = e / s->head_dim, c = e % s->head_dim;
    const int zero = esize == 4 ? (kvq_le32(be) & 0x7fffffffu) == 0 : (kvq_le16(be) & 0x7fffu) == 0;
    if (fabsf(token(pc, t, h)[c]) < FLT_MIN && zero) {
      ck->t->near_ties++;
    } else {
      ck->t->unexplained++;
      report(ck, "class 1: stored value of token %u channel %u (page %u head %u) differs", t, c, page, h);
    }
  }
  exact_bytes(ck, g, b, valid_bytes, s->head_bytes, "padding", page, h);
}

/* Checks the listed pages of one side: page j holds positions page_index[j] P .. (the inputs'
 * tokens there) and its valid tokens are the view's slots in it. Evicted tokens keep their codes
 * in a page that still holds kept ones, so every valid token is compared. */
static void check_pages(checker *ck, const kvq_side_layout *s, const uint8_t *g, const uint8_t *b, uint32_t pages,
                        uint32_t slots, const uint32_t *page_index, const float *tokens, float *const fixed[KVQ_SIDE_FIXED]) {
  for (uint32_t j = 0; j < pages; j++)
    for (uint32_t h = 0; h < s->kv_heads; h++) {
      const uint64_t at = (uint64_t)j * s->page_bytes + (uint64_t)h * s->head_bytes;
      page_ctx pc = {s, tokens + (uint64_t)page_index[j] * s->page_size * s->kv_heads * s->head_dim,
                     slots - j * s->page_size < s->page_size ? slots - j * s->page_size : s->page_size,
                     {fixed[0], fixed[1]}};
      if (s->method == KVQ_LAYOUT_QJL) check_qjl_head(ck, &pc, g + at, b + at, j, h);
      else if (s->method == KVQ_LAYOUT_UNIFORM || s->method == KVQ_LAYOUT_KIVI) check_uniform_head(ck, &pc, g + at, b + at, j, h);
      else if (s->method == KVQ_LAYOUT_POLAR) check_polar_head(ck, &pc, g + at, b + at, j, h);
      else if (s->method == KVQ_LAYOUT_CQ) check_cq_head(ck, &pc, g + at, b + at, j, h);
      else check_exact_head(ck, &pc, g + at, b + at, j, h);
    }
}

/* Class 3: values against the reference, each within its bound. Returns the worst ratio. */
static void compare_class3(checker *ck, const char *what, const float *got, const double *ref, const double *bound,
                           uint64_t n, int count) {
  for (uint64_t i = 0; i < n; i++) {
    if (count) ck->t->class3_values++;
    const double r = ref[i], g = got[i];
    if (isinf(r) && r < 0) {
      if (!(isinf(g) && g < 0)) {
        if (count) ck->t->class3_beyond++;
        report(ck, "class 3: %s[%llu] is %g, expected -inf (masked)", what, (unsigned long long)i, g);
      }
      continue;
    }
    const double diff = fabs(g - r), ratio = bound[i] > 0 ? diff / bound[i] : (diff > 0 ? INFINITY : 0);
    if (count && ratio > ck->t->class3_worst) ck->t->class3_worst = ratio;
    if (!(diff <= bound[i])) {
      if (count) ck->t->class3_beyond++;
      report(ck, "class 3: %s[%llu] = %.9g, reference %.9g, bound %.3g", what, (unsigned long long)i, g, r, bound[i]);
    }
  }
}

/* Token-policy cases: the kept positions after every append to layer 0 must be the golden ones.
 * Golden decisions all have a clear margin (write.c), so any difference is a failure; the first
 * one of a sequence is reported with its margin and the sequence is not compared further (its
 * state has diverged). */
typedef struct decision_check {
  checker *ck;
  const uint32_t *kept[GOLDEN_SEQUENCES];
  uint64_t kept_size[GOLDEN_SEQUENCES], cursor[GOLDEN_SEQUENCES], decision[GOLDEN_SEQUENCES];
  const double *margins[GOLDEN_SEQUENCES];
  uint64_t margin_count[GOLDEN_SEQUENCES];
  int diverged[GOLDEN_SEQUENCES];
} decision_check;

static int compare_decision(void *arg, kvq_cache *cache, const uint32_t ids[GOLDEN_SEQUENCES], const uint32_t *step,
                            int after) {
  decision_check *dc = arg;
  const int s = (int)step[0];
  if (!after || step[1] != 0 || step[3] == 0 || (step[3] & GOLDEN_ATTEND) || dc->diverged[s]) return 0;
  const uint64_t k = dc->decision[s]++;
  size_t count;
  if (kvq_sequence_positions(cache, ids[s], 0, NULL, 0, &count) != KVQ_OK) return -1;
  uint32_t *got = malloc(sizeof(uint32_t) * (count + 1));
  if (!got || kvq_sequence_positions(cache, ids[s], 0, got, count, &count) != KVQ_OK) {
    free(got);
    return -1;
  }
  const uint64_t at = dc->cursor[s];
  const int present = at < dc->kept_size[s] && dc->kept[s][at] <= dc->kept_size[s] - at - 1;
  const int same = present && dc->kept[s][at] == count && memcmp(dc->kept[s] + at + 1, got, sizeof(uint32_t) * count) == 0;
  dc->ck->t->decisions++;
  if (!same) {
    dc->ck->t->decisions_differing++;
    dc->diverged[s] = 1;
    report(dc->ck, "token policy: sequence %d keeps %zu tokens after decoding step %llu, the golden file %u (golden margin "
           "of that decision %.3g)", s, count, (unsigned long long)k, present ? dc->kept[s][at] : 0u,
           k < dc->margin_count[s] ? dc->margins[s][k] : NAN);
  } else {
    dc->cursor[s] = at + 1 + count;
  }
  free(got);
  return 0;
}

static void check_case(checker *ck, kvq_context *ctx, const char *path) {
  golden_file g;
  golden_inputs in;
  char error[512] = "", name[128];
  if (golden_load(&g, path, error, sizeof error) != 0) {
    report(ck, "%s", error);
    ck->t->errors++;
    return;
  }
  if (golden_inputs_parse(&g, &in, error, sizeof error) != 0) {
    report(ck, "%s: %s", path, error);
    ck->t->errors++;
    golden_free(&g);
    return;
  }
  kvq_cache *cache = NULL;
  uint32_t ids[GOLDEN_SEQUENCES];
  decision_check dc = {ck, {0}, {0}, {0}, {0}, {0}, {0}, {0}};
  const int policy = in.config.policy.kind != KVQ_POLICY_KEEP_ALL;
  for (int s = 0; s < GOLDEN_SEQUENCES && policy; s++) {
    golden_name(name, sizeof name, "kept", s, -1, -1);
    dc.kept[s] = golden_u32(golden_find(&g, name), &dc.kept_size[s]);
    golden_name(name, sizeof name, "margins", s, -1, -1);
    const golden_record *m = golden_find(&g, name);
    if (m && m->bytes % 8 == 0) dc.margins[s] = (const double *)m->data, dc.margin_count[s] = m->bytes / 8;
    if (!dc.kept[s]) {
      report(ck, "%s: token-policy case without a %s record", path, name);
      ck->t->errors++;
    }
  }
  if (golden_replay(ctx, &in, &cache, ids, policy ? compare_decision : NULL, &dc) != KVQ_OK) {
    report(ck, "replaying: %s", kvq_context_last_error(ctx));
    ck->t->errors++;
    golden_inputs_free(&in);
    golden_free(&g);
    return;
  }
  for (uint32_t l = 0; l < in.config.layer_count; l++) {
    kvq_layer_storage *ls = &cache->storage[l];
    const kvq_layer_config *L = &in.layers[l];
    for (int side = 0; side < 2; side++) {
      for (int i = 0; i < KVQ_SIDE_FIXED; i++) {
        const uint64_t floats = kvq_side_fixed_floats(&ls->side[side].layout, i);
        if (!floats) continue;
        uint8_t digest[32];
        kvq_sha256_digest(ls->fixed_host[side][i], (size_t)floats * 4, digest);
        golden_name(name, sizeof name, "matrix_sha256", (int)l, side, i);
        const golden_record *rec = golden_find(&g, name);
        ck->t->matrices++;
        if (!rec || rec->bytes != 32 || memcmp(rec->data, digest, 32) != 0) {
          ck->t->matrix_mismatches++;
          report(ck, "matrix %s: SHA-256 differs: this platform builds other random matrices", name);
        }
      }
      for (int s = 0; s < GOLDEN_SEQUENCES; s++) {
        uint32_t pages;
        kvq_cache_read_pages(cache, ids[s], l, side, NULL, &pages);
        const uint64_t pb = ls->side[side].layout.page_bytes;
        golden_name(name, sizeof name, "pages", (int)l, side, s);
        const golden_record *rec = golden_find(&g, name);
        if (!rec || rec->bytes != pages * pb) {
          report(ck, "%s: the backend holds %u pages, the golden file %llu bytes of pages", name, pages,
                 (unsigned long long)(rec ? rec->bytes : 0));
          ck->t->unexplained++;
          continue;
        }
        uint8_t *img = malloc(pages * pb + 1);
        kvq_cache_read_pages(cache, ids[s], l, side, img, &pages);
        kvq_status found;
        const kvq_sequence *seq = kvq_sequence_layer_lookup(cache, ids[s], l, "kvq golden", &found);
        kvq_layer_view view;
        kvq_layer_view_get(cache, seq, l, &view);
        const float *tokens = (side ? in.values_f32[l] : in.keys_f32[l]) + (uint64_t)in.sequences[2 * s] * L->kv_heads * L->head_dim;
        check_pages(ck, &ls->side[side].layout, rec->data, img, pages, view.slots, seq->page_index, tokens,
                    ls->fixed_host[side]);
        free(img);
      }
    }
  }
  /* class 3 */
  for (uint32_t l = 0; l < in.config.layer_count; l++) {
    kvq_layer_storage *ls = &cache->storage[l];
    const kvq_layer_config *L = &in.layers[l];
    const uint32_t hq = L->query_heads, d = L->head_dim;
    for (int s = 0; s < GOLDEN_SEQUENCES; s++) {
      uint64_t count;
      golden_name(name, sizeof name, "query_block", (int)l, s, -1);
      const uint32_t *block = golden_u32(golden_find(&g, name), &count);
      golden_name(name, sizeof name, "queries", (int)l, s, -1);
      uint64_t qcount;
      const float *q = golden_f32(golden_find(&g, name), &qcount);
      kvq_sequence_info info;
      kvq_sequence_info_get(cache, ids[s], l, &info);
      const uint32_t n = (uint32_t)info.kept_tokens;
      if (!block || count != 2 || !q || qcount != (uint64_t)block[0] * hq * d) {
        report(ck, "malformed query records for layer %u sequence %d", l, s);
        ck->t->errors++;
        continue;
      }
      const uint32_t nq = block[0];
      const kvq_mask mask = (kvq_mask)block[1];
      const uint64_t ns = (uint64_t)nq * hq * n, no = (uint64_t)nq * hq * d;
      float *logits = malloc(sizeof(float) * ns), *probs = malloc(sizeof(float) * ns), *out = malloc(sizeof(float) * no);
      if (golden_run_block(cache, ids[s], l, L, q, nq, mask, n, logits, probs, out) != KVQ_OK) {
        report(ck, "attention on layer %u sequence %d: %s", l, s, kvq_context_last_error(ctx));
        ck->t->errors++;
        free(logits), free(probs), free(out);
        continue;
      }
      ref_result r = {malloc(sizeof(double) * ns), malloc(sizeof(double) * ns), malloc(sizeof(double) * ns),
                      malloc(sizeof(double) * ns), malloc(sizeof(double) * no), malloc(sizeof(double) * no)};
      uint8_t *kimg = NULL, *vimg = NULL;
      uint32_t *kept_slot = NULL, *kept_position = NULL;
      ref_layer rl = {L, ls->side[0].layout, ls->side[1].layout,
                      {{ls->fixed_host[0][0], ls->fixed_host[0][1]}, {ls->fixed_host[1][0], ls->fixed_host[1][1]}},
                      ls->side[0].qjl_constant};
      uint32_t kp, vp;
      kvq_cache_read_pages(cache, ids[s], l, 0, NULL, &kp);
      kvq_cache_read_pages(cache, ids[s], l, 1, NULL, &vp);
      kimg = malloc(kp * ls->side[0].layout.page_bytes + 1);
      vimg = malloc(vp * ls->side[1].layout.page_bytes + 1);
      if (!kimg || !vimg || !r.logit || !r.logit_bound || !r.prob || !r.prob_bound || !r.out || !r.out_bound) {
        report(ck, "out of host memory checking layer %u sequence %d", l, s);
        ck->t->errors++;
        goto next;
      }
      kvq_cache_read_pages(cache, ids[s], l, 0, kimg, &kp);
      kvq_cache_read_pages(cache, ids[s], l, 1, vimg, &vp);
      const uint64_t first = (uint64_t)in.sequences[2 * s] * L->kv_heads * d;
      kvq_status found;
      const kvq_sequence *seq = kvq_sequence_layer_lookup(cache, ids[s], l, "kvq golden", &found);
      kvq_layer_view view;
      kvq_layer_view_get(cache, seq, l, &view);
      kept_slot = malloc(sizeof(uint32_t) * (n + 1));
      kept_position = malloc(sizeof(uint32_t) * (n + 1));
      if (!kept_slot || !kept_position) {
        report(ck, "out of host memory checking layer %u sequence %d", l, s);
        ck->t->errors++;
        goto next;
      }
      kvq_layer_view_kept(cache, seq, &view, kept_slot, kept_position);
      ref_sequence rs = {kimg, vimg, view.slots, n, kept_slot, kept_position, (uint32_t)info.tokens,
                         in.keys_f32[l] + first, in.values_f32[l] + first};
      /* the backend against the reference built from its own pages */
      if (ref_attention(&rl, &rs, q, nq, mask, &r) != 0) {
        report(ck, "out of host memory checking layer %u sequence %d", l, s);
        ck->t->errors++;
        goto next;
      }
      snprintf(name, sizeof name, "logits/%u/%d", l, s);
      compare_class3(ck, name, logits, r.logit, r.logit_bound, ns, 1);
      snprintf(name, sizeof name, "probs/%u/%d", l, s);
      compare_class3(ck, name, probs, r.prob, r.prob_bound, ns, 1);
      snprintf(name, sizeof name, "outputs/%u/%d", l, s);
      compare_class3(ck, name, out, r.out, r.out_bound, no, 1);
      /* the golden file's own results against the reference built from its pages: its integrity */
      char gname[3][64];
      snprintf(gname[0], 64, "pages/%u/0/%d", l, s);
      snprintf(gname[1], 64, "pages/%u/1/%d", l, s);
      const golden_record *gk = golden_find(&g, gname[0]), *gv = golden_find(&g, gname[1]);
      if (gk && gv && gk->bytes == kp * ls->side[0].layout.page_bytes && gv->bytes == vp * ls->side[1].layout.page_bytes) {
        rs.key_pages = gk->data;
        rs.value_pages = gv->data;
        if (ref_attention(&rl, &rs, q, nq, mask, &r) != 0) {
          report(ck, "out of host memory checking layer %u sequence %d", l, s);
          ck->t->errors++;
          goto next;
        }
        const char *kinds[3] = {"logits", "probs", "outputs"};
        const double *refs[3][2] = {{r.logit, r.logit_bound}, {r.prob, r.prob_bound}, {r.out, r.out_bound}};
        for (int kind = 0; kind < 3; kind++) {
          snprintf(name, sizeof name, "%s/%u/%d", kinds[kind], l, s);
          uint64_t gc;
          const float *gvals = golden_f32(golden_find(&g, name), &gc);
          if (!gvals || gc != (kind == 2 ? no : ns)) {
            report(ck, "golden record %s missing or of the wrong size", name);
            continue;
          }
          char label[160];
          snprintf(label, sizeof label, "golden %s", name);
          compare_class3(ck, label, gvals, refs[kind][0], refs[kind][1], gc, 0);
        }
      }
    next:
      free(kimg), free(vimg), free(kept_slot), free(kept_position);
      free(r.logit), free(r.logit_bound), free(r.prob), free(r.prob_bound), free(r.out), free(r.out_bound);
      free(logits), free(probs), free(out);
    }
  }
  kvq_cache_destroy(cache);
  golden_inputs_free(&in);
  golden_free(&g);
}

static int read_file(const char *path, uint8_t **data, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = malloc(n > 0 ? (size_t)n : 1);
  *size = n > 0 ? (size_t)n : 0;
  int ok = *data && fread(*data, 1, *size, f) == *size;
  fclose(f);
  return ok ? 0 : -1;
}

static void check_saved_files(checker *ck, kvq_context *ctx, const char *dir) {
  static const struct {
    const char *file;
    kvq_status expect;
  } files[] = {{"cache-v1.kvq", KVQ_OK},
               {"cache-policy-v1.kvq", KVQ_OK},
               {"cache-codebooks-v1.kvq", KVQ_OK},
               {"reject-truncated.kvq", KVQ_ERROR_TRUNCATED},
               {"reject-checksum.kvq", KVQ_ERROR_CHECKSUM},
               {"reject-version.kvq", KVQ_ERROR_VERSION},
               {"reject-bad-format.kvq", KVQ_ERROR_BAD_FORMAT},
               /* long streams (2^31 - 16 tokens) in a few KB: refused at once, not after 2^31 steps */
               {"reject-bad-format-far-position.kvq", KVQ_ERROR_BAD_FORMAT},
               {"reject-bad-format-huge-count.kvq", KVQ_ERROR_BAD_FORMAT}};
  ck->name = "saved files";
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, files[i].file);
    uint8_t *data = NULL;
    size_t size;
    ck->t->files_checked++;
    if (read_file(path, &data, &size) != 0) {
      free(data);
      ck->t->files_failed++;
      ck->t->errors++;
      report(ck, "cannot read %s", path);
      continue;
    }
    kvq_cache *cache = NULL;
    kvq_status st = kvq_cache_load_from_memory(ctx, data, size, &cache);
    if (st != files[i].expect) {
      ck->t->files_failed++;
      report(ck, "%s: loading gives %s (%s), expected %s", files[i].file, kvq_status_string(st), kvq_context_last_error(ctx),
             kvq_status_string(files[i].expect));
    } else if (cache) { /* a loaded cache re-saves to the very same bytes */
      uint8_t *again = malloc(size);
      size_t written = 0;
      if (kvq_cache_save_to_memory(cache, again, size, &written) != KVQ_OK || written != size ||
          memcmp(again, data, size) != 0) {
        ck->t->files_failed++;
        report(ck, "%s: re-saving the loaded cache gives other bytes", files[i].file);
      }
      free(again);
    }
    kvq_cache_destroy(cache);
    free(data);
  }
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int kvq_golden_check(const char *dir, kvq_backend_kind backend, FILE *out, golden_totals *totals) {
  golden_totals local;
  golden_totals *t = totals ? totals : &local;
  memset(t, 0, sizeof *t);
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = backend;
  kvq_context *ctx = NULL;
  kvq_status st = kvq_context_create(&opt, &ctx);
  if (st != KVQ_OK) {
    kvq_backend_info infos[4];
    size_t count = 0;
    kvq_backends_list(infos, 4, &count);
    for (size_t i = 0; i < count; i++)
      if (infos[i].kind == backend)
        fprintf(out, "kvq golden --check: the %s backend is unavailable: %s\n", infos[i].name, infos[i].reason);
    return 2;
  }
  DIR *dh = opendir(dir);
  if (!dh) {
    fprintf(out, "kvq golden --check: cannot open %s\n", dir);
    kvq_context_destroy(ctx);
    return 2;
  }
  char **paths = NULL;
  size_t count = 0;
  struct dirent *e;
  while ((e = readdir(dh))) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".kvqg") != 0) continue;
    char **grown = realloc(paths, sizeof *paths * (count + 1));
    if (!grown) break;
    paths = grown;
    paths[count] = malloc(strlen(dir) + len + 2);
    sprintf(paths[count++], "%s/%s", dir, e->d_name);
  }
  closedir(dh);
  if (count) qsort(paths, count, sizeof *paths, by_name);
  for (size_t i = 0; i < count; i++) {
    checker ck = {out, t, strrchr(paths[i], '/') + 1, 0, 0};
    check_case(&ck, ctx, paths[i]);
    t->configurations++;
    t->configurations_failed += ck.failed;
    free(paths[i]);
  }
  free(paths);
  checker files = {out, t, "saved files", 0, 0};
  check_saved_files(&files, ctx, dir);
  const char *name = ctx->backend->ops->name;
  kvq_context_destroy(ctx);
  if (count == 0) {
    fprintf(out, "kvq golden --check: no golden files (*.kvqg) in %s\n", dir);
    t->errors++;
  }
  fprintf(out, "matrices: %llu SHA-256 compared, %llu differ\n", (unsigned long long)t->matrices,
          (unsigned long long)t->matrix_mismatches);
  fprintf(out,
          "class 1 (codes): %u configurations, %llu bytes compared, %llu differ, %llu near-ties proven (%llu more codes "
          "follow from them), %llu unexplained\n",
          t->configurations, (unsigned long long)t->code_bytes, (unsigned long long)t->code_bytes_differing,
          (unsigned long long)t->near_ties, (unsigned long long)t->implied, (unsigned long long)t->unexplained);
  fprintf(out, "class 2 (side data): %u configurations, %llu values compared, %llu differ by 1 ulp, %llu by more\n",
          t->configurations, (unsigned long long)t->side_values, (unsigned long long)t->side_one_ulp,
          (unsigned long long)t->side_beyond);
  fprintf(out,
          "class 3 (scores, probabilities, outputs): %u configurations, %llu values compared, %llu beyond their bound "
          "(largest difference %.3g of its bound)\n",
          t->configurations, (unsigned long long)t->class3_values, (unsigned long long)t->class3_beyond, t->class3_worst);
  fprintf(out, "token policies: %llu decisions compared, %llu differ\n", (unsigned long long)t->decisions,
          (unsigned long long)t->decisions_differing);
  fprintf(out, "saved files: %u checked, %u failed\n", t->files_checked, t->files_failed);
  const int failed = t->configurations_failed > 0 || t->files_failed > 0 || t->matrix_mismatches > 0 || t->unexplained > 0 ||
                     t->side_beyond > 0 || t->class3_beyond > 0 || t->decisions_differing > 0;
  const int rc = t->errors ? 2 : failed ? 1 : 0;
  fprintf(out, "kvq golden --check --backend %s: %s\n", name, rc == 0 ? "PASS" : rc == 1 ? "FAIL" : "ERROR");
  return rc;
}
