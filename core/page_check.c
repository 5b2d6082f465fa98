#include "page_check.h"

#include <stdio.h>

#include "bytes.h"
#include "halfconv.h"
#include "layout.h"
#include "quantize_math.h"

static int f16_finite(uint32_t h) { return (h & 0x7c00u) != 0x7c00u; }

static int zeros(const uint8_t *p, uint32_t from, uint32_t to) {
  for (uint32_t i = from; i < to; i++)
    if (p[i]) return 0;
  return 1;
}

static int fail(char *why, size_t size, const char *what, uint32_t head) {
  snprintf(why, size, "kv head %u: %s", head, what);
  return -1;
}

static int check_qjl(const kvq_side_layout *s, const uint8_t *b, uint32_t valid, uint32_t h, char *why, size_t size) {
  const uint32_t P = s->page_size, m = s->sketch_dim, mo = s->outlier_sketch_dim, k = s->outliers;
  const uint32_t out_at = kvq_qjl_outliers_offset(P, m, mo, k);
  /* A page that holds no token of this layer yet (pages are taken for all layers at once) keeps a
   * zero outlier list; a page with tokens lists k distinct channels in ascending order. */
  if (valid == 0 && k > 0 && !zeros(b, out_at, out_at + k)) return fail(why, size, "outlier list of an empty page", h);
  for (uint32_t j = 0; j < k && valid > 0; j++)
    if (b[out_at + j] >= s->head_dim || (j > 0 && b[out_at + j] <= b[out_at + j - 1]))
      return fail(why, size, "outlier channels not strictly ascending below head_dim", h);
  if (!zeros(b, out_at + k, s->head_bytes)) return fail(why, size, "nonzero padding", h);
  if (!zeros(b, valid * m / 8, P * m / 8)) return fail(why, size, "sign bits of tokens past the valid count", h);
  const uint32_t parts = k ? 2 : 1;
  for (uint32_t part = 0; part < parts; part++) {
    const uint32_t norms = part ? kvq_qjl_norm_out_offset(P, m, mo, k) : kvq_qjl_norm_in_offset(P, m, mo, k);
    if (part && !zeros(b, kvq_qjl_signs_out_offset(P, m) + valid * mo / 8, kvq_qjl_signs_out_offset(P, m) + P * mo / 8))
      return fail(why, size, "outlier sign bits of tokens past the valid count", h);
    for (uint32_t t = 0; t < P; t++) {
      const uint32_t n = kvq_le16(b + norms + 2 * t);
      if (t >= valid ? n != 0 : (!f16_finite(n) || (n & 0x8000u)))
        return fail(why, size, t >= valid ? "norm of a token past the valid count" : "norm not finite or negative", h);
    }
  }
  return 0;
}

/* Packed codes (layout.h): only the bits of the first `valid_codes` codes may be set; the unused
 * top bits of each word and the codes past them are zero. */
static int packed_codes_ok(const uint8_t *b, uint32_t codes, uint32_t bits, uint32_t valid_codes) {
  const uint32_t cpw = kvq_codes_per_word(bits), words = kvq_code_words(codes, bits);
  for (uint32_t w = 0; w < words; w++) {
    uint32_t allowed = 0;
    for (uint32_t slot = 0; slot < cpw; slot++)
      if (w * cpw + slot < valid_codes) allowed |= ((1u << bits) - 1u) << (slot * bits);
    if (kvq_le32(b + 4 * w) & ~allowed) return 0;
  }
  return 1;
}

/* A (scale, minimum) word of the uniform quantizers: finite, scale not negative; zero when unused. */
static int params_ok(uint32_t p, int used) { return used ? f16_finite(p) && f16_finite(p >> 16) && !(p & 0x8000u) : p == 0; }

static int check_uniform(const kvq_side_layout *s, const uint8_t *b, uint32_t valid, uint32_t h, char *why, size_t size) {
  const uint32_t P = s->page_size, d = s->head_dim, bits = s->bits, G = s->group;
  const uint32_t params = kvq_uniform_params_offset(P, d, bits);
  if (!packed_codes_ok(b, P * d, bits, valid * d)) return fail(why, size, "code bits past the valid tokens or in padding", h);
  for (uint32_t t = 0; t < P; t++)
    for (uint32_t g = 0; g < d / G; g++)
      if (!params_ok(kvq_le32(b + params + 4 * (t * (d / G) + g)), t < valid))
        return fail(why, size, t >= valid ? "parameters of a token past the valid count" : "scale or minimum not finite, or a negative scale", h);
  if (!zeros(b, params + P * (d / G) * 4, s->head_bytes)) return fail(why, size, "nonzero padding", h);
  return 0;
}

/* KIVI: a group of Gt tokens has parameters per channel when it holds a valid token. */
static int check_kivi(const kvq_side_layout *s, const uint8_t *b, uint32_t valid, uint32_t h, char *why, size_t size) {
  const uint32_t P = s->page_size, d = s->head_dim, bits = s->bits, Gt = s->group;
  const uint32_t params = kvq_kivi_params_offset(P, d, bits);
  if (!packed_codes_ok(b, P * d, bits, valid * d)) return fail(why, size, "code bits past the valid tokens or in padding", h);
  for (uint32_t g = 0; g < P / Gt; g++)
    for (uint32_t c = 0; c < d; c++)
      if (!params_ok(kvq_le32(b + params + 4 * (g * d + c)), g * Gt < valid))
        return fail(why, size, g * Gt >= valid ? "parameters of a group past the valid tokens" : "scale or minimum not finite, or a negative scale", h);
  if (!zeros(b, params + (P / Gt) * d * 4, s->head_bytes)) return fail(why, size, "nonzero padding", h);
  return 0;
}

/* PolarQuant: every level's codes, then the block radii (finite, not negative; zero past valid). */
static int check_polar(const kvq_side_layout *s, const uint8_t *b, uint32_t valid, uint32_t h, char *why, size_t size) {
  const uint32_t P = s->page_size, d = s->head_dim, L = s->levels, blocks = d >> L;
  for (uint32_t l = 1; l <= L; l++) {
    const uint32_t angles = kvq_polar_angles(d, l);
    if (!packed_codes_ok(b + kvq_polar_level_offset(P, d, s->level_bits, l), P * angles,
                         kvq_polar_level_bits(s->level_bits, l), valid * angles))
      return fail(why, size, "angle code bits past the valid tokens or in padding", h);
  }
  const uint32_t radii = kvq_polar_radius_offset(P, d, L, s->level_bits);
  for (uint32_t k = 0; k < P * blocks; k++) {
    const uint32_t r = kvq_le16(b + radii + 2 * k);
    if (k < valid * blocks ? !f16_finite(r) || (r & 0x8000u) : r != 0)
      return fail(why, size, k < valid * blocks ? "a block radius not finite or negative" : "a radius past the valid tokens", h);
  }
  if (!zeros(b, radii + P * blocks * 2, s->head_bytes)) return fail(why, size, "nonzero padding", h);
  return 0;
}

/* CQ: codes only (any b-bit value names a centroid). */
static int check_cq(const kvq_side_layout *s, const uint8_t *b, uint32_t valid, uint32_t h, char *why, size_t size) {
  const uint32_t groups = s->head_dim / s->channels, codes = s->page_size * groups;
  if (!packed_codes_ok(b, codes, s->code_bits, valid * groups)) return fail(why, size, "code bits past the valid tokens or in padding", h);
  if (!zeros(b, kvq_code_words(codes, s->code_bits) * 4, s->head_bytes)) return fail(why, size, "nonzero padding", h);
  return 0;
}

static int check_exact(const kvq_side_layout *s, const uint8_t *b, uint32_t valid, uint32_t h, char *why, size_t size) {
  const uint32_t e = kvq_dtype_bytes(s->dtype), used = s->page_size * s->head_dim * e;
  for (uint32_t i = 0; i < valid * s->head_dim; i++) {
    const uint8_t *p = b + i * e;
    int finite = s->dtype == KVQ_LAYOUT_F32    ? (kvq_le32(p) & 0x7f800000u) != 0x7f800000u
                 : s->dtype == KVQ_LAYOUT_F16 ? f16_finite(kvq_le16(p))
                                              : (kvq_le16(p) & 0x7f80u) != 0x7f80u;
    if (!finite) return fail(why, size, "a stored value is not finite", h);
  }
  if (!zeros(b, valid * s->head_dim * e, used) || !zeros(b, used, s->head_bytes))
    return fail(why, size, "values past the valid tokens or padding not zero", h);
  return 0;
}

int kvq_page_image_check(const kvq_side_layout *s, const uint8_t *image, uint32_t valid, char *why, size_t size) {
  if (valid > s->page_size) {
    snprintf(why, size, "%u valid tokens in a page of %u", valid, s->page_size);
    return -1;
  }
  for (uint32_t h = 0; h < s->kv_heads; h++) {
    const uint8_t *b = image + (uint64_t)h * s->head_bytes;
    int rc;
    switch (s->method) {
    case KVQ_LAYOUT_EXACT: rc = check_exact(s, b, valid, h, why, size); break;
    case KVQ_LAYOUT_QJL: rc = check_qjl(s, b, valid, h, why, size); break;
    case KVQ_LAYOUT_UNIFORM: rc = check_uniform(s, b, valid, h, why, size); break;
    case KVQ_LAYOUT_KIVI: rc = check_kivi(s, b, valid, h, why, size); break;
    case KVQ_LAYOUT_POLAR: rc = check_polar(s, b, valid, h, why, size); break;
    case KVQ_LAYOUT_CQ: rc = check_cq(s, b, valid, h, why, size); break;
    default: /* a layout this checker does not know must not be trusted */
      snprintf(why, size, "unknown layout method %u", s->method);
      return -1;
    }
    if (rc) return rc;
  }
  return 0;
}
