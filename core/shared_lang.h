/*
 * The common subset of C11, CUDA C++ and GLSL 4.50 that kvq's shared headers (layout.h, halfconv.h,
 * quantize_math.h, methods/<method>.h) are written in, so that one definition of every layout,
 * conversion and method's math serves the CPU reference, the CUDA kernels and the Vulkan shaders.
 * The method headers reach buffers through the accessors of methods/io.h.
 *
 * Arithmetic that decides a stored code goes through KVQ_FMUL/KVQ_FADD/KVQ_FSUB into variables
 * declared KVQ_PRECISE: each operation is then rounded on its own in every language (no FMA).
 *
 * Rules for code under this header: only 32-bit unsigned integers (kvq_u32) and floats, no pointers,
 * no structs, casts through KVQ_U32()/KVQ_F32(), functions declared with KVQ_SHARED_FN, literals with
 * a `u` (integers) or `f` (floats: C would otherwise compute in double) suffix. Compiled as GLSL by the build (glslangValidator), so a violation fails the build.
 *
 * Arrays are passed as array parameters (`kvq_f32 y[KVQ_MAX_HEAD_DIM]`): C and CUDA pass a pointer,
 * GLSL a copy, so a function that writes one declares it KVQ_OUT (written only) or KVQ_INOUT.
 *
 * kvq_acc is the type sums of class-3 results (scores, decoded values, unrotations) accumulate in:
 * double in C, so that the CPU reference stays as close to exact as the codes allow, float on GPUs.
 * Convert to it with KVQ_ACC().
 *
 * kvq_sqrt is the one square root: sqrtf in C (correctly rounded, IEEE 754), __fsqrt_rn in CUDA
 * device code (correctly rounded), GLSL's sqrt, which the Vulkan spec does not require to be
 * correctly rounded (it may be 1 ulp off; lavapipe and most GPUs are, on some inputs). So nothing
 * decided by comparing against a sqrt result may be a stored code; a stored value rounded from one
 * (QJL's norms, PolarQuant's radii: fp16 of an fp32 root) may differ by 1 fp16 ulp on the Vulkan
 * backend where the root lies next to an fp16 tie, which docs/ACCURACY.md classes as bounded.
 */
#ifndef KVQ_CORE_SHARED_LANG_H
#define KVQ_CORE_SHARED_LANG_H

#if defined(GL_SPIRV) || defined(VULKAN) || defined(GL_core_profile)
/* GLSL */
#define KVQ_LANG_GLSL 1
#define kvq_u32 uint
#define kvq_f32 float
#define KVQ_U32(x) uint(x)
#define KVQ_F32(x) float(x)
#define KVQ_SHARED_FN

#define kvq_f32_to_bits(f) floatBitsToUint(f)
#define kvq_bits_to_f32(u) uintBitsToFloat(u)
/* `precise` forbids contraction and reordering of the expressions computing the variable. */
#define KVQ_PRECISE precise
#define KVQ_FMUL(a, b) ((a) * (b))
#define KVQ_FADD(a, b) ((a) + (b))
#define KVQ_FSUB(a, b) ((a) - (b))
#define kvq_sqrt(x) sqrt(x)
#define kvq_acc float
#define KVQ_ACC(x) float(x)
#define KVQ_OUT out
#define KVQ_INOUT inout

#else
/* C11 or CUDA C++ */
#include <math.h>
#include <stdint.h>
#include <string.h>
#define KVQ_OUT
#define KVQ_INOUT
typedef uint32_t kvq_u32;
typedef float kvq_f32;
#define KVQ_U32(x) ((kvq_u32)(x))
#define KVQ_F32(x) ((kvq_f32)(x))
#define KVQ_PRECISE
/* CUDA: nvcc, and the host C++ compiler building a kernel against kvq's emulation of CUDA
 * (backends/cuda/emu/cuda_emu.h), so that emulated kernels accumulate in float as the GPU does. */
#if defined(__CUDACC__) || defined(KVQ_CUDA_EMU)
#define KVQ_LANG_CUDA 1
#if defined(__CUDA_ARCH__)
/* nvcc contracts a*b+c into FMA by default; the _rn intrinsics are never contracted. */
#define KVQ_FMUL(a, b) __fmul_rn((a), (b))
#define KVQ_FADD(a, b) __fadd_rn((a), (b))
#define KVQ_FSUB(a, b) __fsub_rn((a), (b))
#else /* host side of a .cu file, or the emulator: built with -ffp-contract=off like all kvq C code */
#define KVQ_FMUL(a, b) ((a) * (b))
#define KVQ_FADD(a, b) ((a) + (b))
#define KVQ_FSUB(a, b) ((a) - (b))
#endif
#define KVQ_SHARED_FN static inline __host__ __device__
#define KVQ_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define kvq_acc float
#define KVQ_ACC(x) ((float)(x))
KVQ_SHARED_FN float kvq_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return sqrtf(x);
#endif
}
#else
#define KVQ_LANG_C 1
/* C code is built with -ffp-contract=off, so plain operators are rounded one at a time. */
#define KVQ_FMUL(a, b) ((a) * (b))
#define KVQ_FADD(a, b) ((a) + (b))
#define KVQ_FSUB(a, b) ((a) - (b))
#define KVQ_SHARED_FN static inline
#define KVQ_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
typedef double kvq_acc;
#define KVQ_ACC(x) ((double)(x))
KVQ_SHARED_FN float kvq_sqrt(float x) { return sqrtf(x); }
#endif
KVQ_SHARED_FN kvq_u32 kvq_f32_to_bits(kvq_f32 f) {
  kvq_u32 u;
  memcpy(&u, &f, sizeof u);
  return u;
}
KVQ_SHARED_FN kvq_f32 kvq_bits_to_f32(kvq_u32 u) {
  kvq_f32 f;
  memcpy(&f, &u, sizeof f);
  return f;
}
#endif

/* log2 of a power of two x (a layout parameter that core/config.c validates as one: page size,
 * UNIFORM group, KIVI token group, bits of 1, 2, 4 or 8), so that the decoding loops shift and mask
 * instead of dividing by a runtime value (a per-lane scalar division on lavapipe, tens of
 * instructions on GPUs). GLSL has findLSB, CUDA device code __ffs; C (and the CUDA emulator) tests
 * the bit's position with five masks, the same answer without compiler builtins. */
#if defined(KVQ_LANG_GLSL)
#define kvq_log2_pow2(x) KVQ_U32(findLSB(x))
#elif defined(__CUDA_ARCH__)
#define kvq_log2_pow2(x) KVQ_U32(__ffs((int)(x)) - 1)
#else
KVQ_SHARED_FN kvq_u32 kvq_log2_pow2(kvq_u32 x) {
  return ((x & 0xaaaaaaaau) != 0u ? 1u : 0u) | ((x & 0xccccccccu) != 0u ? 2u : 0u) | ((x & 0xf0f0f0f0u) != 0u ? 4u : 0u) |
         ((x & 0xff00ff00u) != 0u ? 8u : 0u) | ((x & 0xffff0000u) != 0u ? 16u : 0u);
}
#endif

#endif /* KVQ_CORE_SHARED_LANG_H */
