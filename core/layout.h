/*
 * The one definition of kvq's page layouts: sizes, offsets and bit order of every stored byte.
 * Shared by the C core and CPU backend, the CUDA kernels and the GLSL shaders (see shared_lang.h);
 * docs/FORMAT.md describes the same bytes in words with a worked example, and the golden files in
 * tests/golden/ pin them.
 *
 * General rules
 *   - A page of one (layer, K or V side) holds P tokens of all kv heads: kv head h's block starts at
 *     h * head_bytes. Each head block is a structure of arrays and is padded to KVQ_PAGE_ALIGN bytes
 *     (so GPU kernels can use 16-byte loads); padding bytes are zero.
 *   - Words are uint32 little-endian; bit fields are packed least-significant bit first; every array
 *     starts 4-byte aligned.
 *   - Tokens beyond the valid count of a partial page have all-zero codes and side data.
 */
#ifndef KVQ_CORE_LAYOUT_H
#define KVQ_CORE_LAYOUT_H

#include "shared_lang.h"

/* Method ids as stored in files and used by kernels (equal to the public kvq_method values). */
#define KVQ_LAYOUT_EXACT 0u
#define KVQ_LAYOUT_QJL 1u
#define KVQ_LAYOUT_UNIFORM 2u
#define KVQ_LAYOUT_KIVI 3u
#define KVQ_LAYOUT_POLAR 4u
#define KVQ_LAYOUT_CQ 5u

/* PolarQuant variants as stored in files and read by kernels (equal to the public kvq_rotation and
 * kvq_codebook_source values; core/config.c checks). */
#define KVQ_LAYOUT_ROTATION_DENSE 0u
#define KVQ_LAYOUT_ROTATION_HADAMARD 1u
#define KVQ_LAYOUT_CODEBOOK_OFFLINE 0u
#define KVQ_LAYOUT_CODEBOOK_ONLINE 1u

/* The fields of a side layout that every kernel reads, listed once: F(name, comment) expands to
 * the first fields of the C struct kvq_side_layout (core/config.h), to the side part of the push
 * constants (shaders/push.h) and to the host's copy of one into the other (backends/vulkan/vk_jobs.c);
 * a CUDA backend passes the same list as kernel parameters. All are 32-bit words. */
#define KVQ_SIDE_FIELDS(F)                                                                         \
  F(method)             /* KVQ_LAYOUT_* */                                                         \
  F(page_size)          /* P */                                                                    \
  F(head_dim)           /* d */                                                                    \
  F(kv_heads)           /* Hkv */                                                                  \
  F(dtype)              /* EXACT: storage dtype */                                                 \
  F(sketch_dim)         /* QJL: m */                                                               \
  F(outliers)           /* QJL: k */                                                               \
  F(outlier_sketch_dim) /* QJL: m_o */                                                             \
  F(bits)               /* UNIFORM, KIVI: b */                                                     \
  F(group)              /* UNIFORM: G channels; KIVI: Gt tokens */                                 \
  F(levels)             /* POLAR: L */                                                             \
  F(level_bits)         /* POLAR: bits of level l in bits [4(l-1), 4l) */                          \
  F(rotation)           /* POLAR: KVQ_LAYOUT_ROTATION_* */                                         \
  F(codebook)           /* POLAR: KVQ_LAYOUT_CODEBOOK_* */                                         \
  F(channels)           /* CQ: c */                                                                \
  F(code_bits)          /* CQ: b */
#define KVQ_SIDE_FIELD_COUNT 16u

/* Storage dtype ids (equal to the public kvq_dtype values). */
#define KVQ_LAYOUT_F32 0u
#define KVQ_LAYOUT_F16 1u
#define KVQ_LAYOUT_BF16 2u

#define KVQ_PAGE_ALIGN 16u

/* Ranges every layout relies on (validated at cache creation). */
#define KVQ_MIN_PAGE_SIZE 16u
#define KVQ_MAX_PAGE_SIZE 256u
#define KVQ_HEAD_DIM_MULTIPLE 16u
#define KVQ_MAX_HEAD_DIM 256u
#define KVQ_SKETCH_MULTIPLE 32u
#define KVQ_MAX_SKETCH_DIM 1024u
#define KVQ_MAX_OUTLIERS 32u
#define KVQ_MAX_UNIFORM_BITS 8u
#define KVQ_MIN_UNIFORM_GROUP 4u
#define KVQ_MAX_POLAR_LEVELS 8u
#define KVQ_MAX_POLAR_BITS 8u
#define KVQ_MAX_CQ_BITS 12u
#define KVQ_MAX_CQ_CHANNELS 16u

/* Largest head block any layout can produce: the QJL block at the maxima (bytes). */
#define KVQ_MAX_HEAD_BYTES                                                                         \
  (KVQ_MAX_PAGE_SIZE * KVQ_MAX_SKETCH_DIM / 8u * 2u + KVQ_MAX_PAGE_SIZE * 4u + KVQ_MAX_OUTLIERS + \
   KVQ_PAGE_ALIGN)
#ifndef KVQ_LANG_GLSL /* GLSL has no static assertions; C and CUDA check for all three */
KVQ_STATIC_ASSERT(KVQ_MAX_HEAD_BYTES < 0x10000000u, "head blocks must stay far below 2^32 bytes");
KVQ_STATIC_ASSERT(KVQ_MIN_PAGE_SIZE % 2u == 0u, "fp16 arrays of P entries must fill whole words");
KVQ_STATIC_ASSERT(KVQ_MIN_PAGE_SIZE * KVQ_HEAD_DIM_MULTIPLE % 32u == 0u,
                  "1-bit uniform codes of a page must fill whole words");
KVQ_STATIC_ASSERT(KVQ_SKETCH_MULTIPLE == 32u, "a token's sign bits fill whole words");
#endif

KVQ_SHARED_FN kvq_u32 kvq_align_up(kvq_u32 n, kvq_u32 alignment) {
  return (n + alignment - 1u) / alignment * alignment;
}

/* ---- EXACT: the P x d values of the head, token-major, in the storage dtype ----------------- */

KVQ_SHARED_FN kvq_u32 kvq_dtype_bytes(kvq_u32 dtype) { return dtype == KVQ_LAYOUT_F32 ? 4u : 2u; }

/* Byte offset of value (token t, channel c). fp16/bf16 values are 16-bit little-endian halves. */
KVQ_SHARED_FN kvq_u32 kvq_exact_offset(kvq_u32 d, kvq_u32 dtype, kvq_u32 t, kvq_u32 c) {
  return (t * d + c) * kvq_dtype_bytes(dtype);
}
KVQ_SHARED_FN kvq_u32 kvq_exact_head_bytes(kvq_u32 P, kvq_u32 d, kvq_u32 dtype) {
  return kvq_align_up(P * d * kvq_dtype_bytes(dtype), KVQ_PAGE_ALIGN);
}

/* ---- QJL keys ----------------------------------------------------------------------------------
 * [signs]      P x m bits: token t's bit i (sign of row i of S . k_in, 1 iff > 0) is bit (i % 32)
 *              of word t * m/32 + i / 32.
 * [signs_out]  P x m_o bits, the same for S_o . k_out (absent when k = 0).
 * [norm_in]    P fp16: |k_in| of token t at byte 2t of the array.
 * [norm_out]   P fp16: |k_out| (absent when k = 0).
 * [outliers]   k uint8 channel indices, ascending, zero-padded to a multiple of 4 (absent when k = 0).
 * ------------------------------------------------------------------------------------------- */

KVQ_SHARED_FN kvq_u32 kvq_qjl_words_per_token(kvq_u32 m) { return m / 32u; }
KVQ_SHARED_FN kvq_u32 kvq_qjl_signs_offset(void) { return 0u; }
KVQ_SHARED_FN kvq_u32 kvq_qjl_signs_out_offset(kvq_u32 P, kvq_u32 m) { return P * m / 8u; }
KVQ_SHARED_FN kvq_u32 kvq_qjl_norm_in_offset(kvq_u32 P, kvq_u32 m, kvq_u32 m_o, kvq_u32 k) {
  return P * m / 8u + (k > 0u ? P * m_o / 8u : 0u);
}
KVQ_SHARED_FN kvq_u32 kvq_qjl_norm_out_offset(kvq_u32 P, kvq_u32 m, kvq_u32 m_o, kvq_u32 k) {
  return kvq_qjl_norm_in_offset(P, m, m_o, k) + P * 2u;
}
KVQ_SHARED_FN kvq_u32 kvq_qjl_outliers_offset(kvq_u32 P, kvq_u32 m, kvq_u32 m_o, kvq_u32 k) {
  return kvq_qjl_norm_out_offset(P, m, m_o, k) + (k > 0u ? P * 2u : 0u);
}
KVQ_SHARED_FN kvq_u32 kvq_qjl_head_bytes(kvq_u32 P, kvq_u32 m, kvq_u32 m_o, kvq_u32 k) {
  return kvq_align_up(kvq_qjl_outliers_offset(P, m, m_o, k) + kvq_align_up(k, 4u), KVQ_PAGE_ALIGN);
}

/* ---- UNIFORM (token-wise asymmetric, b bits, groups of G channels) ------------------------------
 * [codes]   the P*d codes in token-major order i = t*d + c, floor(32/b) codes per word: code i is
 *           bits [(i % cpw) * b, (i % cpw) * b + b) of word i / cpw. For b = 3 that is 10 codes per
 *           word and 2 zero bits on top; the last word's unused codes are zero.
 * [params]  P * d/G words: word t*(d/G) + g holds the fp16 scale in bits 0..15 and the fp16 minimum
 *           in bits 16..31 of token t's group g. Value = min + code * scale.
 * ------------------------------------------------------------------------------------------- */

KVQ_SHARED_FN kvq_u32 kvq_uniform_codes_per_word(kvq_u32 b) { return 32u / b; }
KVQ_SHARED_FN kvq_u32 kvq_uniform_code_words(kvq_u32 P, kvq_u32 d, kvq_u32 b) {
  kvq_u32 cpw = kvq_uniform_codes_per_word(b);
  return (P * d + cpw - 1u) / cpw;
}
KVQ_SHARED_FN kvq_u32 kvq_uniform_params_offset(kvq_u32 P, kvq_u32 d, kvq_u32 b) {
  return kvq_uniform_code_words(P, d, b) * 4u;
}
KVQ_SHARED_FN kvq_u32 kvq_uniform_head_bytes(kvq_u32 P, kvq_u32 d, kvq_u32 b, kvq_u32 G) {
  return kvq_align_up(kvq_uniform_params_offset(P, d, b) + P * (d / G) * 4u, KVQ_PAGE_ALIGN);
}

/* ---- Packed codes of any width ------------------------------------------------------------
 * n codes of b bits, floor(32/b) per word, code i in bits [(i % cpw) b, (i % cpw) b + b) of word
 * i / cpw; unused bits and codes are zero. UNIFORM, KIVI, PolarQuant and CQ all pack this way. */

KVQ_SHARED_FN kvq_u32 kvq_codes_per_word(kvq_u32 b) { return 32u / b; }
KVQ_SHARED_FN kvq_u32 kvq_code_words(kvq_u32 n, kvq_u32 b) {
  return (n + kvq_codes_per_word(b) - 1u) / kvq_codes_per_word(b);
}

/* ---- KIVI (channel-wise asymmetric over groups of Gt tokens) -----------------------------------
 * [codes]   the P*d codes token-major (i = t*d + c), packed as above.
 * [params]  (P/Gt) * d words: word g*d + c holds the fp16 scale (bits 0..15) and minimum (16..31) of
 *           channel c over tokens [g*Gt, (g+1)*Gt). The quantizer is UNIFORM's (quantize_math.h).
 * ------------------------------------------------------------------------------------------- */

KVQ_SHARED_FN kvq_u32 kvq_kivi_params_offset(kvq_u32 P, kvq_u32 d, kvq_u32 b) { return kvq_code_words(P * d, b) * 4u; }
KVQ_SHARED_FN kvq_u32 kvq_kivi_head_bytes(kvq_u32 P, kvq_u32 d, kvq_u32 b, kvq_u32 Gt) {
  return kvq_align_up(kvq_kivi_params_offset(P, d, b) + (P / Gt) * d * 4u, KVQ_PAGE_ALIGN);
}

/* ---- PolarQuant (L levels over blocks of 2^L rotated coordinates) ------------------------------
 * Level l (1..L) has d >> l angles per token; their bit widths are packed 4 bits per level in one
 * word (level l in bits [4(l-1), 4l)).
 * [level 1 codes] .. [level L codes]  each the P * (d >> l) codes of the level, token-major
 *                                     (i = t * (d >> l) + a), packed as above
 * [radii]                             P * (d >> L) fp16 block radii, token-major
 * Codebook tables (fixed data, fp32): per level, 2^b centroid (cos, sin) pairs, then 2^b boundary
 * pairs: level 1 unused (its codes are nearest centroids by dot product), levels >= 2 hold
 * (cos^2, sin^2) of the 2^b - 1 boundaries between consecutive centroids, the last pair zero.
 * ------------------------------------------------------------------------------------------- */

KVQ_SHARED_FN kvq_u32 kvq_polar_level_bits(kvq_u32 packed, kvq_u32 level) { return (packed >> (4u * (level - 1u))) & 15u; }
KVQ_SHARED_FN kvq_u32 kvq_polar_angles(kvq_u32 d, kvq_u32 level) { return d >> level; }
KVQ_SHARED_FN kvq_u32 kvq_polar_level_offset(kvq_u32 P, kvq_u32 d, kvq_u32 packed, kvq_u32 level) {
  kvq_u32 offset = 0u;
  for (kvq_u32 l = 1u; l < level; l++)
    offset = offset + kvq_code_words(P * kvq_polar_angles(d, l), kvq_polar_level_bits(packed, l)) * 4u;
  return offset;
}
KVQ_SHARED_FN kvq_u32 kvq_polar_radius_offset(kvq_u32 P, kvq_u32 d, kvq_u32 L, kvq_u32 packed) {
  return kvq_polar_level_offset(P, d, packed, L + 1u);
}
KVQ_SHARED_FN kvq_u32 kvq_polar_head_bytes(kvq_u32 P, kvq_u32 d, kvq_u32 L, kvq_u32 packed) {
  return kvq_align_up(kvq_polar_radius_offset(P, d, L, packed) + P * (d >> L) * 2u, KVQ_PAGE_ALIGN);
}
KVQ_SHARED_FN kvq_u32 kvq_polar_table_level_offset(kvq_u32 packed, kvq_u32 level) {
  kvq_u32 offset = 0u;
  for (kvq_u32 l = 1u; l < level; l++) offset = offset + (4u << kvq_polar_level_bits(packed, l));
  return offset;
}
KVQ_SHARED_FN kvq_u32 kvq_polar_table_floats(kvq_u32 L, kvq_u32 packed) { return kvq_polar_table_level_offset(packed, L + 1u); }

/* ---- CQ (Coupled Quantization: c channels, one b-bit code) -------------------------------------
 * [codes]  the P * d/c codes token-major (i = t * (d/c) + g), packed as above.
 * Codebooks (fixed data, fp32): per kv head, per channel group g, 2^b centroids of c floats:
 * centroid j of group g of head h at ((h * (d/c) + g) * 2^b + j) * c.
 * ------------------------------------------------------------------------------------------- */

KVQ_SHARED_FN kvq_u32 kvq_cq_head_bytes(kvq_u32 P, kvq_u32 d, kvq_u32 c, kvq_u32 b) {
  return kvq_align_up(kvq_code_words(P * (d / c), b) * 4u, KVQ_PAGE_ALIGN);
}

#endif /* KVQ_CORE_LAYOUT_H */
