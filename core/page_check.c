#include "page_check.h"

#include <stdio.h>

#include "halfconv.h"
#include "layout.h"
#include "quantize_math.h"

static uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t rd32(const uint8_t *p) { return rd16(p) | rd16(p + 2) << 16; }
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
  for (uint32_t j = 0; j < k; j++)
    if (b[out_at + j] >= s->head_dim || (j > 0 && b[out_at + j] <= b[out_at + j - 1]))
      return fail(why, size, "outlier channels not strictly ascending below head_dim", h);
  if (valid == 0 && k > 0 && !zeros(b, out_at, out_at + k)) return fail(why, size, "outlier list of an empty page", h);
  if (!zeros(b, out_at + k, s->head_bytes)) return fail(why, size, "nonzero padding", h);
  if (!zeros(b, valid * m / 8, P * m / 8)) return fail(why, size, "sign bits of tokens past the valid count", h);
  const uint32_t parts = k ? 2 : 1;
  for (uint32_t part = 0; part < parts; part++) {
    const uint32_t norms = part ? kvq_qjl_norm_out_offset(P, m, mo, k) : kvq_qjl_norm_in_offset(P, m, mo, k);
    if (part && !zeros(b, kvq_qjl_signs_out_offset(P, m) + valid * mo / 8, kvq_qjl_signs_out_offset(P, m) + P * mo / 8))
      return fail(why, size, "outlier sign bits of tokens past the valid count", h);
    for (uint32_t t = 0; t < P; t++) {
      const uint32_t n = rd16(b + norms + 2 * t);
      if (t >= valid ? n != 0 : (!f16_finite(n) || (n & 0x8000u)))
        return fail(why, size, t >= valid ? "norm of a token past the valid count" : "norm not finite or negative", h);
    }
  }
  return 0;
}

static int check_uniform(const kvq_side_layout *s, const uint8_t *b, uint32_t valid, uint32_t h, char *why, size_t size) {
  const uint32_t P = s->page_size, d = s->head_dim, bits = s->bits, G = s->group, cpw = kvq_uniform_codes_per_word(bits);
  const uint32_t words = kvq_uniform_code_words(P, d, bits), params = kvq_uniform_params_offset(P, d, bits);
  for (uint32_t w = 0; w < words; w++) {
    uint32_t word = rd32(b + 4 * w), allowed = 0; /* bits of valid codes */
    for (uint32_t slot = 0; slot < cpw; slot++)
      if (w * cpw + slot < valid * d) allowed |= kvq_uniform_levels(bits) << (slot * bits);
    if (word & ~allowed) return fail(why, size, "code bits past the valid tokens or in padding", h);
  }
  for (uint32_t t = 0; t < P; t++)
    for (uint32_t g = 0; g < d / G; g++) {
      const uint32_t p = rd32(b + params + 4 * (t * (d / G) + g));
      if (t >= valid ? p != 0 : (!f16_finite(p) || !f16_finite(p >> 16) || (p & 0x8000u)))
        return fail(why, size, t >= valid ? "parameters of a token past the valid count" : "scale or minimum not finite, or a negative scale", h);
    }
  if (!zeros(b, params + P * (d / G) * 4, s->head_bytes)) return fail(why, size, "nonzero padding", h);
  return 0;
}

static int check_exact(const kvq_side_layout *s, const uint8_t *b, uint32_t valid, uint32_t h, char *why, size_t size) {
  const uint32_t e = kvq_dtype_bytes(s->dtype), used = s->page_size * s->head_dim * e;
  for (uint32_t i = 0; i < valid * s->head_dim; i++) {
    const uint8_t *p = b + i * e;
    int finite = s->dtype == KVQ_LAYOUT_F32    ? (rd32(p) & 0x7f800000u) != 0x7f800000u
                 : s->dtype == KVQ_LAYOUT_F16 ? f16_finite(rd16(p))
                                              : (rd16(p) & 0x7f80u) != 0x7f80u;
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
    int rc = s->method == KVQ_LAYOUT_QJL       ? check_qjl(s, b, valid, h, why, size)
             : s->method == KVQ_LAYOUT_UNIFORM ? check_uniform(s, b, valid, h, why, size)
                                               : check_exact(s, b, valid, h, why, size);
    if (rc) return rc;
  }
  return 0;
}
