// KIVI: channel-wise asymmetric b-bit codes over groups of Gt tokens, with UNIFORM's quantizer. The
// math is core/methods/kivi.h, the CPU reference's too. Work unit: one channel of one token group.
#include "core/methods/kivi.h"

void kvq_encode_unit(uint block, uint unit, uint n, uint x) {
  kvq_kivi_encode_unit(block, unit, n, x, pc.kv_heads * pc.head_dim, pc.page_size, pc.head_dim, pc.bits, pc.group);
}

float kvq_decode(uint block, uint t, uint c) {
  return kvq_kivi_decode(block, t, c, pc.page_size, pc.head_dim, pc.bits, pc.group);
}

// The fused attention's per-token split of kvq_decode (shaders/method.glsl): the token's first code
// index and its token group's parameter words (one per channel), then per channel UNIFORM's decoding.
#define KVQ_DECODES_BY_TOKEN
uvec3 kvq_token(uint block, uint t) {
  return uvec3(block >> 2u, t * pc.head_dim, kvq_kivi_token_params(block, t, pc.page_size, pc.head_dim, pc.bits, pc.group));
}
float kvq_decode_token(uvec3 token, uint c) { return kvq_uniform_decode_at(token.x, token.y, token.z, c, pc.bits, 0u); }
