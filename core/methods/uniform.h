/*
 * UNIFORM: token-wise asymmetric b-bit codes in groups of G channels (KIVI's value scheme, used by
 * QJL for values), decided by core/quantize_math.h. Work unit: one token. The group quantizer
 * (minimum and maximum, parameter word, codes) is KIVI's too (core/methods/kivi.h), over tokens.
 * Arguments as in core/methods/exact.h; P page size, d head_dim, b bits, G group.
 */
#ifndef KVQ_CORE_METHODS_UNIFORM_H
#define KVQ_CORE_METHODS_UNIFORM_H

#include "core/layout.h"
#include "core/methods/io.h"
#include "core/quantize_math.h"

/* The parameter word of the `count` inputs x, x + step, .. (minimum and maximum in that order). */
KVQ_SHARED_FN kvq_u32 kvq_uniform_group_params(KVQ_IO_PARAM kvq_u32 x, kvq_u32 count, kvq_u32 step, kvq_u32 b) {
  kvq_f32 mn = KVQ_IN(x), mx = mn;
  for (kvq_u32 i = 1u; i < count; i++) {
    kvq_f32 v = KVQ_IN(x + i * step);
    if (v < mn) mn = v;
    if (v > mx) mx = v;
  }
  return kvq_uniform_params(mn, mx, b);
}

/* The codes of those inputs under parameter word `word`: input i gets code index first + i * code_step
 * of the packed array at word `codes`. */
KVQ_SHARED_FN void kvq_uniform_group_codes(KVQ_IO_PARAM kvq_u32 x, kvq_u32 count, kvq_u32 step, kvq_u32 word,
                                           kvq_u32 codes, kvq_u32 first, kvq_u32 code_step, kvq_u32 b) {
  kvq_f32 scale = kvq_uniform_param_scale(word), minimum = kvq_uniform_param_min(word);
  for (kvq_u32 i = 0u; i < count; i++)
    kvq_io_put_code(KVQ_IO codes, first + i * code_step, b, kvq_uniform_code(KVQ_IN(x + i * step), minimum, scale, b));
}

KVQ_SHARED_FN void kvq_uniform_encode_unit(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 x, kvq_u32 stride, kvq_u32 P,
                                           kvq_u32 d, kvq_u32 b, kvq_u32 G) {
  kvq_u32 params = (block + kvq_uniform_params_offset(P, d, b)) >> 2u;
  kvq_u32 xt = x + t * stride;
  for (kvq_u32 g = 0u; g < d / G; g++) {
    kvq_u32 word = kvq_uniform_group_params(KVQ_IO xt + g * G, G, 1u, b);
    KVQ_PAGE_SET(params + t * (d / G) + g, word);
    kvq_uniform_group_codes(KVQ_IO xt + g * G, G, 1u, word, block >> 2u, t * d + g * G, 1u, b);
  }
}

/* Decoding is split into what depends on the token only, which the fused attention computes once per
 * token, and the per-channel rest, shifts and masks only (KIVI's decoding is the same with one
 * parameter word per channel, core/methods/kivi.h):
 *   kvq_uniform_token_params  the word index of token t's first parameter word (G is a power of
 *                             two, core/config.c);
 *   kvq_uniform_decode_at     channel c of the token whose codes start at code index `first` of the
 *                             packed array at word `codes` and whose parameter words start at word
 *                             `params`, one per 2^group_log2 channels. */
KVQ_SHARED_FN kvq_u32 kvq_uniform_token_params(kvq_u32 block, kvq_u32 t, kvq_u32 P, kvq_u32 d, kvq_u32 b, kvq_u32 G) {
  return ((block + kvq_uniform_params_offset(P, d, b)) >> 2u) + t * (d >> kvq_log2_pow2(G));
}
KVQ_SHARED_FN kvq_f32 kvq_uniform_decode_at(KVQ_IO_PARAM kvq_u32 codes, kvq_u32 first, kvq_u32 params, kvq_u32 c, kvq_u32 b,
                                            kvq_u32 group_log2) {
  return kvq_uniform_read_value(KVQ_PAGE(params + (c >> group_log2)), kvq_io_code(KVQ_IO codes, first + c, b));
}

/* Channel c of token t. */
KVQ_SHARED_FN kvq_f32 kvq_uniform_decode(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 c, kvq_u32 P, kvq_u32 d,
                                         kvq_u32 b, kvq_u32 G) {
  return kvq_uniform_decode_at(KVQ_IO block >> 2u, t * d, kvq_uniform_token_params(block, t, P, d, b, G), c, b,
                               kvq_log2_pow2(G));
}

#endif /* KVQ_CORE_METHODS_UNIFORM_H */
