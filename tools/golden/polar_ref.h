/*
 * PolarQuant in double for the golden checker and reference: the rotation as an explicit matrix,
 * with the bound on how far any fp32 evaluation of it may land, and the decoding of a token.
 */
#ifndef KVQ_TOOLS_GOLDEN_POLAR_REF_H
#define KVQ_TOOLS_GOLDEN_POLAR_REF_H

#include <stdint.h>

#include "core/config.h"

/* Entry (i, c) of the side's rotation R (y = R x): the dense matrix, or for the Hadamard form
 * signs[c] * (-1)^popcount(i & c) * kvq_hadamard_scale(d). `R` is the side's fixed array 0. */
double golden_polar_entry(const kvq_side_layout *s, const float *R, uint32_t i, uint32_t c);

/* y = R x in double, and err[i] bounding |fl32(R x)_i - y_i| for any summation order:
 * gamma(n) sum_c |R_ic x_c| + n FLT_MIN, n = d + 1 for the dense matrix and log2 d + 2 for the
 * Hadamard butterflies and the scale. */
void golden_polar_rotate(const kvq_side_layout *s, const float *R, const float *x, double *y, double *err);

/* x = R^T y in double, and bound[c] on an fp32 evaluation from a y known within y_bound:
 * sum_i |R_ic| (y_bound_i + gamma(n) (|y_i| + y_bound_i)) + n FLT_MIN. */
void golden_polar_unrotate(const kvq_side_layout *s, const float *R, const double *y, const double *y_bound, double *x,
                           double *bound);

/* Token t of a head block of kv head h in the rotated space, decoded in double from its codes and
 * fp16 radius with the side's tables (fixed array 1). An fp32 decode multiplies L + 1 factors, so
 * it lands within gamma(L) |y_c| of this. */
void golden_polar_decode(const kvq_side_layout *s, const float *tables, uint32_t h, const uint8_t *block, uint32_t t,
                         double *y);

/* The tables of a level for kv head h: 2^b (cos, sin) centroids, then 2^b - 1 (cos^2, sin^2)
 * boundaries (level >= 2). */
const float *golden_polar_table(const kvq_side_layout *s, const float *tables, uint32_t h, uint32_t level);

/* Code a of token t at a level, read from its packed words. */
uint32_t golden_packed_code(const uint8_t *words, uint32_t index, uint32_t bits);

#endif
