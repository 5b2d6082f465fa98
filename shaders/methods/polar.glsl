// PolarQuant: each token is rotated, y = R x, then every block of 2^L rotated coordinates becomes
// one fp16 radius and 2^L - 1 angle codes. The math is core/methods/polar.h, the CPU reference's
// too. Work unit: one token. As on the CPU, keys are scored in the rotated space against the
// prepared query R q, and values are summed there and rotated back once per output row; a thread
// decodes one rotated coordinate (kvq_polar_decode_coord), which gives the CPU's floats bit for bit.
// Tokens are read once into arrays (applying R per channel of every token would pass the loop
// limit, docs/VULKAN.md).
#include "core/methods/polar.h"

#define KVQ_PREPARES
#define KVQ_SUMS_ROTATED
#define KVQ_TOKEN_ERROR

// The kv head of the head block at byte `block`: core places page k of a pool at k * page_bytes, so
// head blocks sit at whole multiples of head_bytes (the quantize job refuses other page offsets when
// the tables are per head, backends/vulkan/vk_jobs.c).
uint polar_tables(uint block) {
  return kvq_polar_tables(block / (pc.head_words * 4u) % pc.kv_heads, pc.codebook, pc.levels, pc.level_bits);
}

void kvq_encode_unit(uint block, uint t, uint n, uint x) {
  kvq_polar_encode_unit(block, t, x, pc.kv_heads * pc.head_dim, pc.page_size, pc.head_dim, pc.levels, pc.level_bits,
                        pc.rotation, polar_tables(block));
}

float kvq_decode_rotated(uint block, uint t, uint i) {
  return kvq_polar_decode_coord(block, t, i, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, polar_tables(block));
}

// Channel c of the unrotated token (DEQUANTIZE).
float kvq_decode(uint block, uint t, uint c) {
  return kvq_polar_decode(block, t, c, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, pc.rotation, polar_tables(block));
}

// ||x - x^|| of token t, x^ as DEQUANTIZE returns it, x at element x of src (QUANTIZE errors).
float kvq_token_error(uint block, uint t, uint x) {
  float y[KVQ_MAX_HEAD_DIM], decoded[KVQ_MAX_HEAD_DIM];
  for (uint i = 0u; i < pc.head_dim; i++) y[i] = kvq_decode_rotated(block, t, i);
  kvq_polar_unrotate(y, pc.head_dim, pc.rotation, decoded);
  float sum = 0.0;
  for (uint c = 0u; c < pc.head_dim; c++) {
    float diff = KVQ_IN(x + c) - decoded[c];
    sum += diff * diff;
  }
  return sqrt(sum);
}

// PREPARE_QUERY: R q, exactly as the CPU reference rotates queries (pc.input_dtype is fp32 there).
uint kvq_prepared_floats() { return pc.head_dim; }
void kvq_prepare_unit(uint q, uint h, uint unit, uint out_at) {
  float y[KVQ_MAX_HEAD_DIM];
  kvq_polar_rotate(q, pc.head_dim, pc.rotation, y);
  for (uint i = 0u; i < pc.head_dim; i++) dst[out_at + i] = floatBitsToUint(y[i]);
}

// q.k for key token t: the prepared query (element p of results) against the rotated key.
float kvq_score_dot(uint block, uint t, uint q, uint p) {
  return kvq_polar_score(block, t, p, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, polar_tables(block));
}

// The weighted sum's rotated page sum (d floats at element s of dst) rotated back, into x.
void kvq_rotate_back(uint s, out float x[KVQ_MAX_HEAD_DIM]) {
  float y[KVQ_MAX_HEAD_DIM];
  for (uint i = 0u; i < pc.head_dim; i++) y[i] = uintBitsToFloat(dst[s + i]);
  kvq_polar_unrotate(y, pc.head_dim, pc.rotation, x);
}
