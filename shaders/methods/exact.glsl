// EXACT: tokens stored as they are, in fp32, fp16 or bf16. The math is core/methods/exact.h, the
// CPU reference's too. Work unit: one token.
#include "core/methods/exact.h"

void kvq_encode_unit(uint block, uint t, uint n, uint x) {
  kvq_exact_encode_unit(block, t, x, pc.kv_heads * pc.head_dim, pc.head_dim, pc.dtype);
}

float kvq_decode(uint block, uint t, uint c) { return kvq_exact_decode(block, t, c, pc.head_dim, pc.dtype); }
