// UNIFORM: token-wise asymmetric b-bit codes in groups of G channels. The math is
// core/methods/uniform.h, the CPU reference's too. Work unit: one token.
#include "core/methods/uniform.h"

void kvq_encode_unit(uint block, uint t, uint n, uint x) {
  kvq_uniform_encode_unit(block, t, x, pc.kv_heads * pc.head_dim, pc.page_size, pc.head_dim, pc.bits, pc.group);
}

float kvq_decode(uint block, uint t, uint c) {
  return kvq_uniform_decode(block, t, c, pc.page_size, pc.head_dim, pc.bits, pc.group);
}
