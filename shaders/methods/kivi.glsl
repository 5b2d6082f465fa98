// KIVI: channel-wise asymmetric b-bit codes over groups of Gt tokens, with UNIFORM's quantizer. The
// math is core/methods/kivi.h, the CPU reference's too. Work unit: one channel of one token group.
#include "core/methods/kivi.h"

void kvq_encode_unit(uint block, uint unit, uint n, uint x) {
  kvq_kivi_encode_unit(block, unit, n, x, pc.kv_heads * pc.head_dim, pc.page_size, pc.head_dim, pc.bits, pc.group);
}

float kvq_decode(uint block, uint t, uint c) {
  return kvq_kivi_decode(block, t, c, pc.page_size, pc.head_dim, pc.bits, pc.group);
}
