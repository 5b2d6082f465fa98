/*
 * EXACT: tokens stored as they are, in fp32, fp16 or bf16 (round half to even, core/halfconv.h).
 * Work unit (shaders/work_units.h): one token. Shared by the CPU reference and the shaders; see
 * core/methods/io.h for the accessors and the arguments every method header takes:
 *   block   byte offset of the head block in the pool
 *   unit    the work unit; n the head block's valid tokens
 *   x       input element of token 0, channel 0; token t starts at x + t * stride
 */
#ifndef KVQ_CORE_METHODS_EXACT_H
#define KVQ_CORE_METHODS_EXACT_H

#include "core/halfconv.h"
#include "core/layout.h"
#include "core/methods/io.h"

KVQ_SHARED_FN void kvq_exact_encode_unit(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 x, kvq_u32 stride, kvq_u32 d,
                                         kvq_u32 dtype) {
  kvq_u32 at = x + t * stride, word = (block + kvq_exact_offset(d, dtype, t, 0u)) >> 2u;
  if (dtype == KVQ_LAYOUT_F32) {
    for (kvq_u32 c = 0u; c < d; c++) KVQ_PAGE_SET(word + c, kvq_f32_to_bits(KVQ_IN(at + c)));
    return;
  }
  for (kvq_u32 c = 0u; c < d; c += 2u) { /* two 16-bit values per word (d is even): the token's own words */
    kvq_f32 lo = KVQ_IN(at + c), hi = KVQ_IN(at + c + 1u);
    if (dtype == KVQ_LAYOUT_F16) KVQ_PAGE_SET(word + c / 2u, kvq_f32_to_f16_bits(lo) | (kvq_f32_to_f16_bits(hi) << 16u));
    else KVQ_PAGE_SET(word + c / 2u, kvq_f32_to_bf16_bits(lo) | (kvq_f32_to_bf16_bits(hi) << 16u));
  }
}

/* Channel c of token t (a read: fp16 through kvq_f16_read, core/halfconv.h, the same floats). */
KVQ_SHARED_FN kvq_f32 kvq_exact_decode(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 c, kvq_u32 d, kvq_u32 dtype) {
  kvq_u32 at = block + kvq_exact_offset(d, dtype, t, c);
  if (dtype == KVQ_LAYOUT_F32) return kvq_bits_to_f32(KVQ_PAGE(at >> 2u));
  kvq_u32 h = kvq_io_u16(KVQ_IO at);
  return dtype == KVQ_LAYOUT_F16 ? kvq_f16_read(h) : kvq_bf16_bits_to_f32(h);
}

#endif /* KVQ_CORE_METHODS_EXACT_H */
