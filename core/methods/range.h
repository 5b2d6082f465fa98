/*
 * The per-method range checks of appended tokens, written once for C, CUDA and GLSL (shared_lang.h):
 * whether a (token, kv head) vector of finite elements is one the side's method can store (EXACT:
 * representable in its fp16 / bf16 storage; QJL: |k| within fp16 range, for its stored norms;
 * UNIFORM: every group's fp16 minimum and scale finite; KIVI: |x| <= 32752; PolarQuant: |x| within
 * its fp16 radii; CQ: anything). Used by core/token_check.c (host tokens, with a message naming what
 * failed), shaders/token_check.comp (Vulkan) and backends/cuda/kernels/token_check.cuh (CUDA), so
 * that the three decide the same, operation for operation, each fp32 operation rounded on its own.
 * The norms' square root is kvq_sqrt: correctly rounded in C and CUDA, possibly 1 ulp off in GLSL
 * (shared_lang.h), so on Vulkan a norm within an ulp of a limit may be judged differently.
 *
 * Elements are read with KVQ_IN(i) (element i of the input, as fp32) and functions take KVQ_IO_PARAM
 * first, as in core/methods/io.h; only those two accessors (and KVQ_IO) need be defined.
 */
#ifndef KVQ_CORE_METHODS_RANGE_H
#define KVQ_CORE_METHODS_RANGE_H

#include "core/halfconv.h"
#include "core/layout.h"
#include "core/quantize_math.h"
#include "core/shared_lang.h"

#if !defined(KVQ_IN) || !defined(KVQ_IO)
#error "core/methods/range.h: define KVQ_IO_PARAM, KVQ_IO and KVQ_IN before including it"
#endif

/* Whether fp16 bits are Inf or NaN (all exponent bits set). */
KVQ_SHARED_FN kvq_u32 kvq_range_f16_inf(kvq_u32 bits) { return (bits & 0x7c00u) == 0x7c00u ? 1u : 0u; }

/* EXACT: x overflows the storage dtype (KVQ_LAYOUT_F16 or BF16; fp32 stores any finite x). */
KVQ_SHARED_FN kvq_u32 kvq_range_exact_fails(kvq_f32 x, kvq_u32 dtype) {
  if (dtype == KVQ_LAYOUT_F16) return kvq_range_f16_inf(kvq_f32_to_f16_bits(x));
  if (dtype == KVQ_LAYOUT_BF16) return (kvq_f32_to_bf16_bits(x) & 0x7f80u) == 0x7f80u ? 1u : 0u;
  return 0u;
}

/* The sum of squares of elements [base, base + d) in channel order, each product and sum rounded. */
KVQ_SHARED_FN kvq_f32 kvq_range_square_sum(KVQ_IO_PARAM kvq_u32 base, kvq_u32 d) {
  KVQ_PRECISE kvq_f32 sum = 0.0f;
  for (kvq_u32 c = 0u; c < d; c++) {
    kvq_f32 x = KVQ_IN(base + c);
    sum = KVQ_FADD(sum, KVQ_FMUL(x, x));
  }
  return sum;
}

/* QJL: the norm sqrt(sum) is beyond fp16. |k_in| and |k_out| never exceed |k| computed the same way
 * (sums of fewer non-negative terms in the same order, monotone rounding), so |k| covers both. */
KVQ_SHARED_FN kvq_u32 kvq_range_qjl_fails(kvq_f32 square_sum) { return kvq_range_f16_inf(kvq_f32_to_f16_bits(kvq_sqrt(square_sum))); }

/* UNIFORM: a group spanning [mn, mx] has an fp16 minimum or scale that overflows. */
KVQ_SHARED_FN kvq_u32 kvq_range_uniform_fails(kvq_f32 mn, kvq_f32 mx, kvq_u32 bits) {
  kvq_u32 params = kvq_uniform_params(mn, mx, bits);
  return (kvq_range_f16_inf(params) != 0u || kvq_range_f16_inf(params >> 16u) != 0u) ? 1u : 0u;
}

/* KIVI: a channel's scale spans several tokens, so every value is bounded: with |x| <= 32752 no
 * group can reach an fp16 minimum or scale beyond 65504. */
KVQ_SHARED_FN kvq_u32 kvq_range_kivi_fails(kvq_f32 x) { return (x > 32752.0f || x < -32752.0f) ? 1u : 0u; }

/* PolarQuant: block radii are fp16 and the rotation preserves the norm up to fp32 rounding (d 2^-24
 * relative, well inside the margin of 65440 against 65504). */
KVQ_SHARED_FN kvq_u32 kvq_range_polar_fails(kvq_f32 square_sum) { return kvq_sqrt(square_sum) > 65440.0f ? 1u : 0u; }

/* The minimum and maximum of group g (channels [g G, (g + 1) G)) of the vector at `base`: UNIFORM's. */
KVQ_SHARED_FN kvq_f32 kvq_range_group_min(KVQ_IO_PARAM kvq_u32 base, kvq_u32 g, kvq_u32 group) {
  kvq_f32 mn = KVQ_IN(base + g * group);
  for (kvq_u32 c = 1u; c < group; c++) {
    kvq_f32 x = KVQ_IN(base + g * group + c);
    mn = x < mn ? x : mn;
  }
  return mn;
}
KVQ_SHARED_FN kvq_f32 kvq_range_group_max(KVQ_IO_PARAM kvq_u32 base, kvq_u32 g, kvq_u32 group) {
  kvq_f32 mx = KVQ_IN(base + g * group);
  for (kvq_u32 c = 1u; c < group; c++) {
    kvq_f32 x = KVQ_IN(base + g * group + c);
    mx = x > mx ? x : mx;
  }
  return mx;
}

/* 1 when the vector of d finite elements at `base` is one the method (KVQ_LAYOUT_*) cannot store;
 * dtype, group and bits are the side's (core/layout.h). */
KVQ_SHARED_FN kvq_u32 kvq_range_vector_fails(KVQ_IO_PARAM kvq_u32 base, kvq_u32 method, kvq_u32 d, kvq_u32 dtype,
                                             kvq_u32 group, kvq_u32 bits) {
  if (method == KVQ_LAYOUT_EXACT) {
    for (kvq_u32 c = 0u; c < d && dtype != KVQ_LAYOUT_F32; c++)
      if (kvq_range_exact_fails(KVQ_IN(base + c), dtype) != 0u) return 1u;
    return 0u;
  }
  if (method == KVQ_LAYOUT_QJL) return kvq_range_qjl_fails(kvq_range_square_sum(KVQ_IO base, d));
  if (method == KVQ_LAYOUT_UNIFORM) {
    for (kvq_u32 g = 0u; g < d / group; g++)
      if (kvq_range_uniform_fails(kvq_range_group_min(KVQ_IO base, g, group), kvq_range_group_max(KVQ_IO base, g, group), bits) != 0u)
        return 1u;
    return 0u;
  }
  if (method == KVQ_LAYOUT_KIVI) {
    for (kvq_u32 c = 0u; c < d; c++)
      if (kvq_range_kivi_fails(KVQ_IN(base + c)) != 0u) return 1u;
    return 0u;
  }
  if (method == KVQ_LAYOUT_POLAR) return kvq_range_polar_fails(kvq_range_square_sum(KVQ_IO base, d));
  return 0u; /* CQ: no side data, any finite value has a nearest centroid */
}

#endif /* KVQ_CORE_METHODS_RANGE_H */
