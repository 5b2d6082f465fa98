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

#endif /* KVQ_CORE_METHODS_KIVI_H */
