/*
 * The scalar decisions that produce stored codes, written once for C, CUDA and GLSL (shared_lang.h)
 * so that every backend computes bit-identical codes and side data. Only +, -, * (each rounded on its
 * own), comparisons and integer operations decide a code; no division, sqrt or exp.
 */
#ifndef KVQ_CORE_QUANTIZE_MATH_H
#define KVQ_CORE_QUANTIZE_MATH_H

#include "halfconv.h"
#include "shared_lang.h"

/* ---- Uniform (token-wise asymmetric) quantization of one group ---------------------------------
 * Given the group's minimum mn and maximum mx (fp32):
 *   scale_f32 = (mx - mn) * inv_levels(b)       inv_levels = fp32(1 / (2^b - 1)), exact bits below
 *   min_h = fp16(mn), scale_h = fp16(scale_f32)  (round half to even; both stored)
 * The code of x is the number of thresholds t_j = min_h + (j - 0.5) * scale_h, j = 1 .. 2^b - 1,
 * with t_j <= x (0 when scale_h == 0, which includes constant groups). Decoding: min_h + code * scale_h.
 * ------------------------------------------------------------------------------------------- */

KVQ_SHARED_FN kvq_u32 kvq_uniform_levels(kvq_u32 bits) { return (1u << bits) - 1u; }

KVQ_SHARED_FN kvq_f32 kvq_uniform_inv_levels(kvq_u32 bits) {
  kvq_u32 u = 0x3f800000u;           /* 1/1 */
  if (bits == 2u) u = 0x3eaaaaabu;   /* fp32(1/3) */
  if (bits == 3u) u = 0x3e124925u;   /* fp32(1/7) */
  if (bits == 4u) u = 0x3d888889u;   /* fp32(1/15) */
  if (bits == 8u) u = 0x3b808081u;   /* fp32(1/255) */
  return kvq_bits_to_f32(u);
}

/* The stored parameter word of a group: fp16 scale in bits 0..15, fp16 minimum in bits 16..31. */
KVQ_SHARED_FN kvq_u32 kvq_uniform_params(kvq_f32 mn, kvq_f32 mx, kvq_u32 bits) {
  KVQ_PRECISE kvq_f32 range = KVQ_FSUB(mx, mn);
  KVQ_PRECISE kvq_f32 scale = KVQ_FMUL(range, kvq_uniform_inv_levels(bits));
  return kvq_f32_to_f16_bits(scale) | (kvq_f32_to_f16_bits(mn) << 16);
}

KVQ_SHARED_FN kvq_f32 kvq_uniform_param_scale(kvq_u32 params) { return kvq_f16_bits_to_f32(params & 0xffffu); }
KVQ_SHARED_FN kvq_f32 kvq_uniform_param_min(kvq_u32 params) { return kvq_f16_bits_to_f32(params >> 16); }

KVQ_SHARED_FN kvq_f32 kvq_uniform_threshold(kvq_f32 min_h, kvq_f32 scale_h, kvq_u32 j) {
  KVQ_PRECISE kvq_f32 step = KVQ_FMUL(KVQ_F32(j) - 0.5f, scale_h); /* j - 0.5 is exact */
  KVQ_PRECISE kvq_f32 t = KVQ_FADD(min_h, step);
  return t;
}

/* The thresholds are non-decreasing in j, so a binary search returns exactly the count. */
KVQ_SHARED_FN kvq_u32 kvq_uniform_code(kvq_f32 x, kvq_f32 min_h, kvq_f32 scale_h, kvq_u32 bits) {
  if (scale_h == 0.0f) return 0u;
  kvq_u32 lo = 0u;
  kvq_u32 hi = kvq_uniform_levels(bits);
  while (lo < hi) {
    kvq_u32 mid = (lo + hi + 1u) / 2u;
    if (kvq_uniform_threshold(min_h, scale_h, mid) <= x) lo = mid;
    else hi = mid - 1u;
  }
  return lo;
}

KVQ_SHARED_FN kvq_f32 kvq_uniform_value(kvq_f32 min_h, kvq_f32 scale_h, kvq_u32 code) {
  KVQ_PRECISE kvq_f32 step = KVQ_FMUL(KVQ_F32(code), scale_h);
  KVQ_PRECISE kvq_f32 v = KVQ_FADD(min_h, step);
  return v;
}

/* The decoded value of `code` under parameter word `params`, for decoding only: kvq_uniform_value
 * with the fp16 fields read by kvq_f16_read (halfconv.h: the same floats for every stored word; GLSL
 * both halves at once, kvq_f16_read2). */
#if defined(KVQ_LANG_GLSL)
vec2 kvq_uniform_read_params(uint params) { return kvq_f16_read2(params); } /* (scale, minimum) */
float kvq_uniform_read_value(uint params, uint code) {
  vec2 scale_min = kvq_uniform_read_params(params);
  return kvq_uniform_value(scale_min.y, scale_min.x, code);
}
#else
KVQ_SHARED_FN kvq_f32 kvq_uniform_read_value(kvq_u32 params, kvq_u32 code) {
  return kvq_uniform_value(kvq_f16_read(params >> 16), kvq_f16_read(params & 0xffffu), code);
}
#endif

/* ---- PolarQuant ---------------------------------------------------------------------------
 * Rotation: dense y_i = sum_c R[i][c] x_c (c increasing, product then sum), or Hadamard: z = signs * x,
 * the in-place Walsh-Hadamard butterflies (for len = 1, 2, .. d/2: for each block of 2 len, for j
 * in its first half: a = z[j], b = z[j + len]; z[j] = a + b; z[j + len] = a - b), then
 * y = z * kvq_hadamard_scale(d), the fp32 value of 1/sqrt(d) given by its bits below.
 * Level 1 code of a pair (x, y): the centroid j maximizing x cos_j + y sin_j (each product rounded,
 * then the sum; strictly greater wins, so ties keep the lower index).
 * Level l >= 2 code: with squared radii s_a (first half) and s_b (second half) of the sub-block, the
 * number of boundaries j with s_b * cos^2(beta_j) >= s_a * sin^2(beta_j). Squared radii: level 1
 * x*x + y*y, level l the sum of its two halves'. The block radius sqrt(s_L) is stored in fp16.
 * ------------------------------------------------------------------------------------------- */

KVQ_SHARED_FN kvq_f32 kvq_hadamard_scale(kvq_u32 d) {
  kvq_u32 u = 0x3e800000u;           /* 1/sqrt(16) */
  if (d == 32u) u = 0x3e3504f3u;     /* fp32(1/sqrt(32)) */
  if (d == 64u) u = 0x3e000000u;
  if (d == 128u) u = 0x3db504f3u;    /* fp32(1/sqrt(128)) */
  if (d == 256u) u = 0x3d800000u;
  return kvq_bits_to_f32(u);
}

KVQ_SHARED_FN kvq_f32 kvq_polar_pair_dot(kvq_f32 x, kvq_f32 y, kvq_f32 c, kvq_f32 s) {
  KVQ_PRECISE kvq_f32 a = KVQ_FMUL(x, c);
  KVQ_PRECISE kvq_f32 b = KVQ_FMUL(y, s);
  KVQ_PRECISE kvq_f32 dot = KVQ_FADD(a, b);
  return dot;
}

KVQ_SHARED_FN kvq_f32 kvq_polar_pair_square(kvq_f32 x, kvq_f32 y) {
  KVQ_PRECISE kvq_f32 a = KVQ_FMUL(x, x);
  KVQ_PRECISE kvq_f32 b = KVQ_FMUL(y, y);
  KVQ_PRECISE kvq_f32 s = KVQ_FADD(a, b);
  return s;
}

/* Whether the angle atan(sqrt(s_b / s_a)) is at or past a boundary with (cos^2, sin^2) = (c2, s2). */
KVQ_SHARED_FN kvq_u32 kvq_polar_past(kvq_f32 s_a, kvq_f32 s_b, kvq_f32 c2, kvq_f32 s2) {
  KVQ_PRECISE kvq_f32 lhs = KVQ_FMUL(s_b, c2);
  KVQ_PRECISE kvq_f32 rhs = KVQ_FMUL(s_a, s2);
  return lhs >= rhs ? 1u : 0u;
}

/* ---- Nearest centroid (CQ's codes, k-means assignments) ----------------------------------------
 * The squared distance of a point to a centroid is summed over the dims in order, each difference,
 * square and sum rounded on its own; centroid j becomes the best when it is the first or its sum is
 * strictly smaller (ties keep the lower index). Codes learned (KMEANS_ASSIGN) and codes stored (CQ's
 * QUANTIZE) are decided by these two functions alike on every backend.
 * ------------------------------------------------------------------------------------------- */

/* sum + (x - mu)^2, each operation rounded on its own. */
KVQ_SHARED_FN kvq_f32 kvq_distance_step(kvq_f32 sum, kvq_f32 x, kvq_f32 mu) {
  KVQ_PRECISE kvq_f32 diff = KVQ_FSUB(x, mu);
  KVQ_PRECISE kvq_f32 square = KVQ_FMUL(diff, diff);
  KVQ_PRECISE kvq_f32 next = KVQ_FADD(sum, square);
  return next;
}

/* Whether centroid j, at squared distance `sum`, replaces the best so far (at `best_d`): 1 or 0. */
KVQ_SHARED_FN kvq_u32 kvq_nearer(kvq_u32 j, kvq_f32 sum, kvq_f32 best_d) { return (j == 0u || sum < best_d) ? 1u : 0u; }

#endif /* KVQ_CORE_QUANTIZE_MATH_H */
