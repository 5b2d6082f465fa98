#include "polar_ref.h"

#include <float.h>
#include <math.h>

#include "core/bytes.h"
#include "core/halfconv.h"
#include "core/layout.h"
#include "core/quantize_math.h"

static double gamma_n(double n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

static uint32_t log2_of(uint32_t d) {
  uint32_t k = 0;
  while ((1u << k) < d) k++;
  return k;
}

/* operations in one fp32 evaluation of an entry of R x */
static double rotation_ops(const kvq_side_layout *s) {
  return s->rotation == KVQ_ROTATION_DENSE ? s->head_dim + 1.0 : log2_of(s->head_dim) + 2.0;
}

double golden_polar_entry(const kvq_side_layout *s, const float *R, uint32_t i, uint32_t c) {
  const uint32_t d = s->head_dim;
  if (s->rotation == KVQ_ROTATION_DENSE) return R[(size_t)i * d + c];
  const double h = __builtin_popcount(i & c) & 1 ? -1.0 : 1.0;
  return R[c] * h * kvq_hadamard_scale(d);
}

void golden_polar_rotate(const kvq_side_layout *s, const float *R, const float *x, double *y, double *err) {
  const uint32_t d = s->head_dim;
  const double g = gamma_n(rotation_ops(s));
  for (uint32_t i = 0; i < d; i++) {
    double sum = 0, abs_sum = 0;
    for (uint32_t c = 0; c < d; c++) {
      const double term = golden_polar_entry(s, R, i, c) * x[c];
      sum += term;
      abs_sum += fabs(term);
    }
    y[i] = sum;
    err[i] = g * abs_sum + rotation_ops(s) * FLT_MIN;
  }
}

void golden_polar_unrotate(const kvq_side_layout *s, const float *R, const double *y, const double *y_bound, double *x,
                           double *bound) {
  const uint32_t d = s->head_dim;
  const double g = gamma_n(rotation_ops(s));
  for (uint32_t c = 0; c < d; c++) {
    double sum = 0, b = 0;
    for (uint32_t i = 0; i < d; i++) {
      const double r = golden_polar_entry(s, R, i, c);
      sum += r * y[i];
      b += fabs(r) * (y_bound[i] + g * (fabs(y[i]) + y_bound[i]));
    }
    x[c] = sum;
    bound[c] = b + rotation_ops(s) * FLT_MIN;
  }
}

const float *golden_polar_table(const kvq_side_layout *s, const float *tables, uint32_t h, uint32_t level) {
  const uint32_t table = s->codebook == KVQ_CODEBOOK_ONLINE ? h : 0;
  return tables + (size_t)table * kvq_polar_table_floats(s->levels, s->level_bits) +
         kvq_polar_table_level_offset(s->level_bits, level);
}

uint32_t golden_packed_code(const uint8_t *words, uint32_t index, uint32_t bits) {
  const uint32_t cpw = kvq_codes_per_word(bits);
  return kvq_le32(words + 4 * (index / cpw)) >> ((index % cpw) * bits) & ((1u << bits) - 1u);
}

void golden_polar_decode(const kvq_side_layout *s, const float *tables, uint32_t h, const uint8_t *block, uint32_t t,
                         double *y) {
  const uint32_t P = s->page_size, d = s->head_dim, L = s->levels, blocks = d >> L;
  const uint8_t *radii = block + kvq_polar_radius_offset(P, d, L, s->level_bits);
  double r[KVQ_MAX_HEAD_DIM], split[KVQ_MAX_HEAD_DIM];
  for (uint32_t k = 0; k < blocks; k++) {
    const uint8_t *p = radii + 2 * (t * blocks + k);
    r[k] = kvq_f16_bits_to_f32((uint32_t)p[0] | (uint32_t)p[1] << 8);
  }
  for (uint32_t l = L; l >= 1; l--) {
    const uint32_t b = kvq_polar_level_bits(s->level_bits, l), angles = kvq_polar_angles(d, l);
    const float *table = golden_polar_table(s, tables, h, l);
    const uint8_t *codes = block + kvq_polar_level_offset(P, d, s->level_bits, l);
    for (uint32_t a = 0; a < angles; a++) {
      const uint32_t code = golden_packed_code(codes, t * angles + a, b);
      split[2 * a] = r[a] * table[2 * code];
      split[2 * a + 1] = r[a] * table[2 * code + 1];
    }
    for (uint32_t a = 0; a < 2 * angles; a++) r[a] = split[a];
  }
  for (uint32_t c = 0; c < d; c++) y[c] = r[c];
}
