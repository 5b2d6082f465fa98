/*
 * fp32 <-> fp16 / bf16 conversions by integer operations, round-half-to-even, shared by C, CUDA
 * and GLSL (see shared_lang.h). Every backend converts with these exact functions, so stored
 * half-precision side data and exact fp16/bf16 caches are bit-identical everywhere.
 *
 * Semantics (IEEE 754 binary16 / bfloat16):
 *   - finite values round to nearest, ties to even; values >= 65520 in magnitude become fp16 Inf;
 *   - subnormal results are produced exactly (no flush to zero); -0 stays -0;
 *   - Inf stays Inf; NaN stays a quiet NaN with the same sign and the top payload bits.
 */
#ifndef KVQ_CORE_HALFCONV_H
#define KVQ_CORE_HALFCONV_H

#include "shared_lang.h"

/* fp32 -> fp16 bits (in the low 16 bits of the result). */
KVQ_SHARED_FN kvq_u32 kvq_f32_to_f16_bits(kvq_f32 value) {
  kvq_u32 u = kvq_f32_to_bits(value);
  kvq_u32 sign = (u >> 16) & 0x8000u;
  kvq_u32 a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) { /* Inf or NaN */
    if (a == 0x7f800000u) return sign | 0x7c00u;
    return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
  }
  if (a >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520: rounds to Inf */
  if (a >= 0x38800000u) {                       /* fp16 normal range: >= 2^-14 */
    kvq_u32 m = a - 0x38000000u;                /* rebias exponent 127 -> 15 */
    m = m + 0xfffu + ((m >> 13) & 1u);          /* round half to even at bit 13 */
    return sign | (m >> 13);
  }
  if (a < 0x33000000u) return sign; /* below 2^-25: rounds to (signed) zero */
  {                                 /* fp16 subnormal: value = q * 2^-24 */
    kvq_u32 e = a >> 23;
    kvq_u32 mant = (a & 0x7fffffu) | 0x800000u;
    kvq_u32 shift = 126u - e; /* 14..24 */
    kvq_u32 q = mant >> shift;
    kvq_u32 rem = mant & ((1u << shift) - 1u);
    kvq_u32 halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u) != 0u)) q = q + 1u;
    return sign | q;
  }
}

/* fp16 bits (low 16 bits) -> fp32, exact. */
KVQ_SHARED_FN kvq_f32 kvq_f16_bits_to_f32(kvq_u32 h) {
  kvq_u32 sign = (h & 0x8000u) << 16;
  kvq_u32 e = (h >> 10) & 0x1fu;
  kvq_u32 m = h & 0x3ffu;
  if (e == 0x1fu) return kvq_bits_to_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0u) {
    if (m == 0u) return kvq_bits_to_f32(sign);
    e = 113u; /* normalize a subnormal */
    while ((m & 0x400u) == 0u) {
      m = m << 1;
      e = e - 1u;
    }
    return kvq_bits_to_f32(sign | (e << 23) | ((m & 0x3ffu) << 13));
  }
  return kvq_bits_to_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* fp16 bits (low 16 bits) -> fp32 for values that are only read, never where a stored code is
 * decided: UNIFORM's and KIVI's scales and minimums when scoring and summing, and the exact fp16
 * cache's keys and values in the fused passes (shaders/methods/exact.glsl; docs/ACCURACY.md: the
 * bit-exact rules bind encoding). GLSL uses the hardware conversion (unpackHalf2x16: one instruction
 * on GPUs, against kvq_f16_bits_to_f32's branches and subnormal loop), which is exact for every
 * normal fp16 value and for zeros (each is an fp32 normal or zero); Vulkan lets a device flush fp16
 * subnormal inputs to zero (shaderDenormPreserveFloat16 is optional), so those, exponent field 0, are
 * made here exactly as mantissa * 2^-24 (an integer below 1024 times a power of two: no rounding).
 * Inf and NaN convert to Inf and NaN as the spec says, but side data never holds them (the range
 * checks of core/methods/range.h refuse tokens whose minimum or scale would overflow), and neither do
 * exact fp16 caches (core/methods/range.h refuses tokens that would overflow the dtype). So it returns
 * the same floats as kvq_f16_bits_to_f32 for every stored scale and minimum. CUDA device code uses
 * the hardware conversion too (cvt.f32.f16: one instruction, exact for every fp16 value, subnormals
 * included, as PTX defines it); C and the CUDA emulator call kvq_f16_bits_to_f32. */
#if defined(KVQ_LANG_GLSL)
/* GLSL reads both fp16 halves of a word at once (x: the low half, y: the high one), as side data
 * stores them in pairs: one unpackHalf2x16, with the exact subnormals selected, not branched to (a
 * divergent branch costs both its sides on lavapipe). */
vec2 kvq_f16_read2(uint word) {
  uvec2 h = uvec2(word & 0xffffu, word >> 16);
  vec2 subnormal = vec2(h & 0x3ffu) * 5.9604644775390625e-8; /* 2^-24 */
  subnormal = mix(subnormal, -subnormal, notEqual(h & 0x8000u, uvec2(0u)));
  return mix(unpackHalf2x16(word), subnormal, equal(h & 0x7c00u, uvec2(0u)));
}
float kvq_f16_read(uint h) { return kvq_f16_read2(h & 0xffffu).x; }
#elif defined(__CUDA_ARCH__)
KVQ_SHARED_FN kvq_f32 kvq_f16_read(kvq_u32 h) {
  kvq_f32 f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h & 0xffffu)));
  return f;
}
#else
KVQ_SHARED_FN kvq_f32 kvq_f16_read(kvq_u32 h) { return kvq_f16_bits_to_f32(h); }
#endif

/* fp32 -> bf16 bits (low 16 bits). */
KVQ_SHARED_FN kvq_u32 kvq_f32_to_bf16_bits(kvq_f32 value) {
  kvq_u32 u = kvq_f32_to_bits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u; /* quiet NaN */
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* bf16 bits (low 16 bits) -> fp32, exact. */
KVQ_SHARED_FN kvq_f32 kvq_bf16_bits_to_f32(kvq_u32 b) { return kvq_bits_to_f32((b & 0xffffu) << 16); }

/* fp32 rounded through fp16 and back: the value a reader of the stored fp16 sees. */
KVQ_SHARED_FN kvq_f32 kvq_round_f16(kvq_f32 value) { return kvq_f16_bits_to_f32(kvq_f32_to_f16_bits(value)); }

#endif /* KVQ_CORE_HALFCONV_H */
