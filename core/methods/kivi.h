/*
 * KIVI keys (Liu et al., 2024): channel-wise asymmetric b-bit codes; for each channel, the tokens of
 * a group of Gt consecutive tokens of the page share UNIFORM's quantizer (core/methods/uniform.h).
 * Partial groups of a flushed page use their valid tokens only. Work unit: one channel of one token
 * group, unit = group * d + channel. Arguments as in core/methods/exact.h.
 */
#ifndef KVQ_CORE_METHODS_KIVI_H
#define KVQ_CORE_METHODS_KIVI_H

#include "core/layout.h"
#include "core/methods/uniform.h"

KVQ_SHARED_FN void kvq_kivi_encode_unit(KVQ_IO_PARAM kvq_u32 block, kvq_u32 unit, kvq_u32 n, kvq_u32 x, kvq_u32 stride,
                                        kvq_u32 P, kvq_u32 d, kvq_u32 b, kvq_u32 Gt) {
  kvq_u32 c = unit % d, t0 = unit / d * Gt;
  kvq_u32 t1 = n - t0 < Gt ? n : t0 + Gt; /* the group's valid tokens */
  kvq_u32 at = x + t0 * stride + c;
  kvq_u32 word = kvq_uniform_group_params(KVQ_IO at, t1 - t0, stride, b);
  KVQ_PAGE_SET(((block + kvq_kivi_params_offset(P, d, b)) >> 2u) + (t0 / Gt) * d + c, word);
  kvq_uniform_group_codes(KVQ_IO at, t1 - t0, stride, word, block >> 2u, t0 * d + c, d, b);
}

/* The word index of the parameter words of token t's token group, one per channel (Gt is a power
 * of two, core/config.c); channel c is then kvq_uniform_decode_at(.., params, c, b, 0) (uniform.h). */
KVQ_SHARED_FN kvq_u32 kvq_kivi_token_params(kvq_u32 block, kvq_u32 t, kvq_u32 P, kvq_u32 d, kvq_u32 b, kvq_u32 Gt) {
  return ((block + kvq_kivi_params_offset(P, d, b)) >> 2u) + (t >> kvq_log2_pow2(Gt)) * d;
}

/* Channel c of token t. */
KVQ_SHARED_FN kvq_f32 kvq_kivi_decode(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 c, kvq_u32 P, kvq_u32 d, kvq_u32 b,
                                      kvq_u32 Gt) {
  return kvq_uniform_decode_at(KVQ_IO block >> 2u, t * d, kvq_kivi_token_params(block, t, P, d, b, Gt), c, b, 0u);
}

/* Scoring a query q against the keys of one token group without decoding them (issue 11): channel c
 * of each token t of the group decodes to min_c + code_tc scale_c with the group's (scale_c, min_c),
 * so
 *   q . k_t = sum_c q_c min_c + sum_c (q_c scale_c) code_tc,
 * where the first sum (the bias) and the folded query q_c scale_c are the same for every token of
 * the group: a scorer computes them once per group (kvq_kivi_fold_bias over the channels in order,
 * kvq_kivi_fold_scale per channel, `params` the channel's parameter word, kvq_kivi_token_params + c)
 * and then per token only sums codes (kvq_kivi_code_at) times folded query. The floats are rounded
 * in another order than kvq_kivi_decode's values dotted with q, so the logits differ from the
 * unfused SCORE's in the last bits; docs/ACCURACY.md's KIVI bound covers both orders (its A sums
 * |q_c| (|min_c| + code scale_c), the size of the folded terms). Not used for encoding. */
#if defined(KVQ_LANG_GLSL)
float kvq_kivi_fold_scale(float q, uint params) { return q * kvq_uniform_read_params(params).x; }
float kvq_kivi_fold_bias(float bias, float q, uint params) { return bias + q * kvq_uniform_read_params(params).y; }
#else
KVQ_SHARED_FN kvq_f32 kvq_kivi_fold_scale(kvq_f32 q, kvq_u32 params) { return q * kvq_f16_read(params & 0xffffu); }
KVQ_SHARED_FN kvq_f32 kvq_kivi_fold_bias(kvq_f32 bias, kvq_f32 q, kvq_u32 params) {
  return bias + q * kvq_f16_read(params >> 16);
}
#endif

/* Code j (0-based, j < 32 / b) of a code word already shifted to its run: codes are token-major,
 * so consecutive channels of a token lie in consecutive b-bit fields of a word (core/methods/io.h),
 * and one 32-bit word holds the codes of 32 / b consecutive channels for b = 1, 2, 4. As a float,
 * the factor of the folded query. */
KVQ_SHARED_FN kvq_f32 kvq_kivi_code_at(kvq_u32 word, kvq_u32 j, kvq_u32 b) {
  return KVQ_F32((word >> (j * b)) & ((1u << b) - 1u));
}

#endif /* KVQ_CORE_METHODS_KIVI_H */
