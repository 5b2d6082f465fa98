/*
 * PolarQuant (Han, Kacham, Karbasi, Mirrokni, Zandieh: "PolarQuant: quantizing KV caches with polar
 * transformation", ../shared/papers/001 and ../shared/design/polarquant-math.md):
 *   1. precondition x <- R x (a random orthogonal matrix, or a randomized Hadamard transform);
 *   2. recursive polar transform over blocks of 2^L coordinates: level 1 angles of coordinate pairs
 *      in [0, 2 pi), level l >= 2 angles atan(r_right / r_left) in [0, pi/2], one radius per block;
 *   3. each angle quantized with its level's codebook, the radius kept in fp16.
 * Decisions follow core/quantize_math.h (nearest centroid by dot product at level 1, boundary
 * comparisons of squared radii above), so no atan2, sqrt or division decides a code. Keys are scored
 * against the rotated query; values are summed in the rotated space and rotated back once.
 */
#include <math.h>

#include "core/fwht.h"
#include "core/halfconv.h"
#include "core/layout.h"
#include "core/quantize_math.h"
#include "cpu_io.h"

static void kvq_cpu_put_code(uint8_t *codes, uint32_t i, uint32_t bits, uint32_t code) {
  const kvq_io io = {.page = codes};
  kvq_io_put_code(&io, 0, i, bits, code);
}
static uint32_t kvq_cpu_code(const uint8_t *codes, uint32_t i, uint32_t bits) {
  const kvq_io io = {.page = (uint8_t *)codes};
  return kvq_io_code(&io, 0, i, bits);
}

KVQ_DEFINE_FWHT(fwht_f32, float)

/* The codebook tables of the block's kv head (one shared table for offline codebooks). */
static const float *level_table(const cpu_head *h, uint32_t level) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t table = s->codebook == KVQ_CODEBOOK_ONLINE ? h->kv_head : 0;
  return h->fixed[1] + (size_t)table * kvq_polar_table_floats(s->levels, s->level_bits) +
         kvq_polar_table_level_offset(s->level_bits, level);
}

/* y = R x, in the order of core/quantize_math.h. */
static void rotate(const cpu_head *h, const float *x, float *y) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t d = s->head_dim;
  const float *R = h->fixed[0];
  if (s->rotation == KVQ_ROTATION_DENSE) {
    for (uint32_t i = 0; i < d; i++) {
      float p = 0.0f;
      for (uint32_t c = 0; c < d; c++) p = p + R[(size_t)i * d + c] * x[c];
      y[i] = p;
    }
    return;
  }
  for (uint32_t c = 0; c < d; c++) y[c] = R[c] * x[c]; /* the signs: exact */
  fwht_f32(y, d);
  const float scale = kvq_hadamard_scale(d);
  for (uint32_t c = 0; c < d; c++) y[c] = y[c] * scale;
}

/* x = R^T y: the transpose of the dense matrix, or signs * H y / sqrt(d) (H is symmetric). */
static void polar_unrotate(const cpu_head *h, const float *y, float *x) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t d = s->head_dim;
  const float *R = h->fixed[0];
  if (s->rotation == KVQ_ROTATION_DENSE) {
    for (uint32_t c = 0; c < d; c++) {
      double sum = 0.0;
      for (uint32_t i = 0; i < d; i++) sum += (double)R[(size_t)i * d + c] * y[i];
      x[c] = (float)sum;
    }
    return;
  }
  float z[KVQ_MAX_HEAD_DIM];
  for (uint32_t c = 0; c < d; c++) z[c] = y[c];
  fwht_f32(z, d);
  const float scale = kvq_hadamard_scale(d);
  for (uint32_t c = 0; c < d; c++) x[c] = R[c] * (z[c] * scale);
}

static void polar_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t P = s->page_size, d = s->head_dim, L = s->levels;
  uint8_t *radii = block + kvq_polar_radius_offset(P, d, L, s->level_bits);
  float y[KVQ_MAX_HEAD_DIM], sq[KVQ_MAX_HEAD_DIM], next[KVQ_MAX_HEAD_DIM];
  for (uint32_t t = 0; t < n; t++) {
    rotate(h, x + t * token_stride, y);
    for (uint32_t l = 1; l <= L; l++) {
      const uint32_t b = kvq_polar_level_bits(s->level_bits, l), K = 1u << b;
      const uint32_t angles = kvq_polar_angles(d, l);
      const float *table = level_table(h, l);
      uint8_t *codes = block + kvq_polar_level_offset(P, d, s->level_bits, l);
      for (uint32_t a = 0; a < angles; a++) {
        uint32_t code = 0;
        if (l == 1) { /* the nearest centroid on the circle: the largest dot product */
          const float px = y[2 * a], py = y[2 * a + 1];
          float best = kvq_polar_pair_dot(px, py, table[0], table[1]);
          for (uint32_t j = 1; j < K; j++) {
            const float dot = kvq_polar_pair_dot(px, py, table[2 * j], table[2 * j + 1]);
            if (dot > best) best = dot, code = j;
          }
          next[a] = kvq_polar_pair_square(px, py);
        } else { /* the boundaries this angle is at or past */
          const float s_a = sq[2 * a], s_b = sq[2 * a + 1];
          const float *boundaries = table + 2 * K;
          for (uint32_t j = 0; j + 1 < K; j++) code += kvq_polar_past(s_a, s_b, boundaries[2 * j], boundaries[2 * j + 1]);
          next[a] = s_a + s_b;
        }
        const uint32_t i = t * angles + a;
        kvq_cpu_put_code(codes, i, b, code);
      }
      for (uint32_t a = 0; a < angles; a++) sq[a] = next[a];
    }
    for (uint32_t blk = 0; blk < (d >> L); blk++) {
      const uint32_t r = kvq_f32_to_f16_bits(sqrtf(sq[blk])), at = 2 * (t * (d >> L) + blk);
      radii[at] = (uint8_t)r;
      radii[at + 1] = (uint8_t)(r >> 8);
    }
  }
}

/* Token t in the rotated space: from each block radius down, every level splits a sub-block's
 * radius into (r cos, r sin) of its code's centroid. */
static void polar_decode_rotated(const cpu_head *h, const uint8_t *block, uint32_t t, float *y) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t P = s->page_size, d = s->head_dim, L = s->levels;
  const uint8_t *radii = block + kvq_polar_radius_offset(P, d, L, s->level_bits);
  float r[KVQ_MAX_HEAD_DIM], split[KVQ_MAX_HEAD_DIM];
  for (uint32_t blk = 0; blk < (d >> L); blk++) {
    const uint32_t at = 2 * (t * (d >> L) + blk);
    r[blk] = kvq_f16_bits_to_f32((uint32_t)radii[at] | (uint32_t)radii[at + 1] << 8);
  }
  for (uint32_t l = L; l >= 1; l--) {
    const uint32_t b = kvq_polar_level_bits(s->level_bits, l), angles = kvq_polar_angles(d, l);
    const float *table = level_table(h, l);
    const uint8_t *codes = block + kvq_polar_level_offset(P, d, s->level_bits, l);
    for (uint32_t a = 0; a < angles; a++) {
      const uint32_t i = t * angles + a;
      const uint32_t code = kvq_cpu_code(codes, i, b);
      split[2 * a] = r[a] * table[2 * code];
      split[2 * a + 1] = r[a] * table[2 * code + 1];
    }
    for (uint32_t a = 0; a < 2 * angles; a++) r[a] = split[a];
  }
  for (uint32_t c = 0; c < d; c++) y[c] = r[c];
}

/* decode gives the rotated vector: the generic attention paths unrotate once per output row */
static void polar_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  polar_decode_rotated(h, block, t, out);
}

static void polar_prepare(const cpu_head *h, const float *q, float *prepared) { rotate(h, q, prepared); }

static void polar_dot_page(const cpu_head *h, const uint8_t *block, uint32_t n, const float *q, const float *prepared,
                           double *dots) {
  (void)q;
  const uint32_t d = h->side->layout.head_dim;
  float key[KVQ_MAX_HEAD_DIM];
  for (uint32_t t = 0; t < n; t++) {
    polar_decode_rotated(h, block, t, key);
    double dot = 0.0;
    for (uint32_t c = 0; c < d; c++) dot += (double)prepared[c] * key[c];
    dots[t] = dot;
  }
}

const cpu_method kvq_cpu_polar = {.encode = polar_encode,
                                  .decode = polar_decode,
                                  .prepare = polar_prepare,
                                  .dot_page = polar_dot_page,
                                  .unrotate = polar_unrotate};
