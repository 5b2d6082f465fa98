/* Storing an fp32 value in a kvq dtype's little-endian bytes (round half to even). */
#ifndef KVQ_TOOLS_GOLDEN_HALFCONV_UTIL_H
#define KVQ_TOOLS_GOLDEN_HALFCONV_UTIL_H

#include <stdint.h>
#include <string.h>

#include "core/halfconv.h"
#include "kvq/kvq.h"

static inline void golden_store(kvq_dtype dtype, uint8_t *out, float x) {
  uint32_t u = dtype == KVQ_DTYPE_F32   ? kvq_f32_to_bits(x)
               : dtype == KVQ_DTYPE_F16 ? kvq_f32_to_f16_bits(x)
                                        : kvq_f32_to_bf16_bits(x);
  out[0] = (uint8_t)u;
  out[1] = (uint8_t)(u >> 8);
  if (dtype == KVQ_DTYPE_F32) {
    out[2] = (uint8_t)(u >> 16);
    out[3] = (uint8_t)(u >> 24);
  }
}

#endif
