// UNIFORM: token-wise asymmetric b-bit codes in groups of G channels. The math is
// core/methods/uniform.h, the CPU reference's too. Work unit: one token.
#include "core/methods/uniform.h"

void kvq_encode_unit(uint block, uint t, uint n, uint x) {
  kvq_uniform_encode_unit(block, t, x, pc.kv_heads * pc.head_dim, pc.page_size, pc.head_dim, pc.bits, pc.group);
}

float kvq_decode(uint block, uint t, uint c) {
  return kvq_uniform_decode(block, t, c, pc.page_size, pc.head_dim, pc.bits, pc.group);
}

// The fused attention's per-token split of kvq_decode (shaders/method.glsl): the token's first code
// index and parameter word, then per channel shifts, masks and the hardware fp16 conversion.
#define KVQ_DECODES_BY_TOKEN
uvec3 kvq_token(uint block, uint t) {
  return uvec3(block >> 2u, t * pc.head_dim, kvq_uniform_token_params(block, t, pc.page_size, pc.head_dim, pc.bits, pc.group));
}
float kvq_decode_token(uvec3 token, uint c) {
  return kvq_uniform_decode_at(token.x, token.y, token.z, c, pc.bits, kvq_log2_pow2(pc.group));
}

// A token's G channels of a group share one parameter word: the fused scoring converts it once per
// group (KVQ_DECODES_AFFINE, shaders/method.glsl). Same floats as kvq_decode_token.
#define KVQ_DECODES_AFFINE
uint kvq_affine_run() { return pc.group; }
vec2 kvq_affine_params(uvec3 token, uint c) { return kvq_uniform_read_params(KVQ_PAGE(token.z + (c >> kvq_log2_pow2(pc.group)))); }
float kvq_affine_decode(vec2 scale_min, uvec3 token, uint c) {
  return kvq_uniform_value(scale_min.y, scale_min.x, kvq_io_code(token.x, token.y + c, pc.bits));
}
