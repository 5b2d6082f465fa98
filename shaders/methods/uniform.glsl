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

// A run of KVQ_DECODE_RUN channels of the value pass (KVQ_DECODES_RUN, shaders/method.glsl): with
// 1-, 2- or 4-bit codes a run's codes start a whole run into a word (the run starts at code index
// t * d + c0, a multiple of 8) and fill part of one word, so they are read with one load instead of
// one per channel; the run lies in one group where groups are at least a run. Same floats as
// kvq_affine_decode. 8-bit codes (a run fills two words: a second load under a branch on the width,
// which llvmpipe would run for every width), 3-bit codes (10 per word, runs straddle words) and
// smaller groups take the value pass's other paths.
#define KVQ_DECODES_RUN
bool kvq_decode_run(uvec3 token, uint c0, out float v[KVQ_DECODE_RUN]) {
  uint b = pc.bits;
  if ((b & (b - 1u)) != 0u || b > 4u || pc.group < KVQ_DECODE_RUN) return false; // uniform
  vec2 scale_min = kvq_affine_params(token, c0);
  uint i = token.y + c0, per_word_log2 = 5u - kvq_log2_pow2(b);
  uint word = KVQ_PAGE(token.x + (i >> per_word_log2)) >> ((i & ((1u << per_word_log2) - 1u)) * b), mask = (1u << b) - 1u;
  for (uint j = 0u; j < KVQ_DECODE_RUN; j++) // constant trips: unrolled; the run's 8 b bits lie in the word
    v[j] = kvq_uniform_value(scale_min.y, scale_min.x, (word >> (j * b)) & mask);
  return true;
}
