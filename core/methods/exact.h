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
  for (kvq_u32 c = 0u; c < d; c++) {
    kvq_f32 v = KVQ_IN(x + t * stride + c);
    kvq_u32 at = block + kvq_exact_offset(d, dtype, t, c);
    if (dtype == KVQ_LAYOUT_F32) KVQ_PAGE_SET(at >> 2u, kvq_f32_to_bits(v));
    else kvq_io_put_u16(KVQ_IO at, dtype == KVQ_LAYOUT_F16 ? kvq_f32_to_f16_bits(v) : kvq_f32_to_bf16_bits(v));
  }
}

/* Channel c of token t. */
KVQ_SHARED_FN kvq_f32 kvq_exact_decode(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 c, kvq_u32 d, kvq_u32 dtype) {
  kvq_u32 at = block + kvq_exact_offset(d, dtype, t, c);
  if (dtype == KVQ_LAYOUT_F32) return kvq_bits_to_f32(KVQ_PAGE(at >> 2u));
  kvq_u32 h = kvq_io_u16(KVQ_IO at);
  return dtype == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32(h) : kvq_bf16_bits_to_f32(h);
}

#endif /* KVQ_CORE_METHODS_EXACT_H */
