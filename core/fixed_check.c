#include "fixed_check.h"

#include <math.h>
#include <stdio.h>

#include "codebook.h"
#include "layout.h"

/* cos and sin are each rounded once from double to fp32: cos^2 + sin^2 lies within 4 * 2^-24 of 1
 * (with room for the products' own rounding), and so does a boundary's cos^2 + sin^2. */
#define UNIT_TOLERANCE 1e-6

static int unit(double c, double s) { return fabs(c * c + s * s - 1.0) <= UNIT_TOLERANCE; }

/* Learned angles are fp32 (core/learn.c), so an angle at pi/2 is fp32(pi/2), 4.4e-8 past it: its cos
 * is -4.4e-8. Angles lie within half an fp32 ulp of [0, pi/2] (ulp(pi/2) = 2^-23), so cos and sin
 * of a level >= 2 centroid are at least -sin(2^-24) > -2^-24. */
#define PAST_RIGHT_ANGLE (-0x1p-24f)

static int learned_level_ok(const float *t, uint32_t level, uint32_t K) {
  for (uint32_t j = 0; j < K; j++) {
    const float c = t[2 * j], s = t[2 * j + 1];
    if (!unit(c, s)) return 0;
    if (level >= 2 && (c < PAST_RIGHT_ANGLE || s < PAST_RIGHT_ANGLE)) return 0; /* angles in [0, pi/2] */
    if (level >= 2 && j > 0 && c > t[2 * (j - 1)]) return 0;                     /* ascending angles */
  }
  const float *b = t + 2 * K;
  for (uint32_t j = 0; j < K; j++) {
    const int used = level >= 2 && j + 1 < K;
    if (!used && (b[2 * j] != 0.0f || b[2 * j + 1] != 0.0f)) return 0;
    if (used && (b[2 * j] < 0.0f || b[2 * j + 1] < 0.0f || fabs((double)b[2 * j] + b[2 * j + 1] - 1.0) > UNIT_TOLERANCE)) return 0;
  }
  return 1;
}

int kvq_fixed_check(const kvq_side_layout *s, int index, const float *data, int ready, char *why, size_t size) {
  const kvq_fixed_kind kind = kvq_side_fixed_kind(s, index);
  const uint64_t floats = kvq_side_fixed_floats(s, index);
  if (kind == KVQ_FIXED_LEARNED && !ready) {
    for (uint64_t i = 0; i < floats; i++)
      if (data[i] != 0.0f) {
        snprintf(why, size, "codebooks not learned yet hold data");
        return -1;
      }
    return 0;
  }
  if (s->method != KVQ_LAYOUT_POLAR || kind != KVQ_FIXED_LEARNED) return 0;
  const uint32_t table_floats = kvq_polar_table_floats(s->levels, s->level_bits);
  for (uint64_t set = 0; set < floats / table_floats; set++)
    for (uint32_t l = 1; l <= s->levels; l++)
      if (!learned_level_ok(data + set * table_floats + kvq_polar_table_level_offset(s->level_bits, l), l,
                            1u << kvq_polar_level_bits(s->level_bits, l))) {
        snprintf(why, size, "learned codebook tables of kv head %llu, level %u are not unit centroids with their boundaries",
                 (unsigned long long)set, l);
        return -1;
      }
  return 0;
}
