// CQ, Coupled Quantization (backends/cpu/cpu_cq.c): each group g of c contiguous channels stores the
// b-bit index of its nearest centroid (shaders/nearest.glsl) among the 2^b learned for its (kv head,
// group), fp32 in fixed1 (core/layout.h). Work unit: one channel group of one token, so that the
// 2^b-centroid search of an invocation stays within llvmpipe's loop bound (nearest.glsl).
//
// The kv head comes from the block's byte offset: every head block kvq's shaders address lies at
// (page * kv_heads + h) * head_bytes of its pool (the host refuses quantize items whose page offset
// is not a multiple of page_bytes, backends/vulkan/vk_jobs.c).
#include "shaders/nearest.glsl"


uint kvq_cq_head(uint block) { return block / (pc.head_words * 4u) % pc.kv_heads; }

// Word offset in fixed1 of centroid 0 of group g of the block's kv head.
uint kvq_cq_centroids(uint block, uint g) {
  return ((kvq_cq_head(block) * (pc.head_dim / pc.channels) + g) << pc.code_bits) * pc.channels;
}

void kvq_encode_unit(uint block, uint unit, uint n, uint x) {
  uint c = pc.channels, groups = pc.head_dim / c, t = unit / groups, g = unit % groups;
  // the group's inputs, read (and converted) once rather than once per centroid
  float p[KVQ_MAX_CQ_CHANNELS];
  uint at = x + t * pc.kv_heads * pc.head_dim + g * c;
  for (uint i = 0u; i < c; i++) p[i] = KVQ_READ_ELEMENT(src, pc.input_dtype, at + i);
  uint mu = kvq_cq_centroids(block, g), best = 0u;
  float best_d = 0.0;
  for (uint j = 0u; j < (1u << pc.code_bits); j++, mu += c) {
    precise float sum = 0.0;
    for (uint i = 0u; i < c; i += 2u) { // two dims per trip (c is 1 or even): the loop bound
      sum = kvq_distance_step(sum, p[i], uintBitsToFloat(fixed1[mu + i]));
      if (i + 1u < c) sum = kvq_distance_step(sum, p[i + 1u], uintBitsToFloat(fixed1[mu + i + 1u]));
    }
    if (kvq_nearer(j, sum, best_d)) {
      best = j;
      best_d = sum;
    }
  }
  kvq_page_put_code(block >> 2, t * groups + g, pc.code_bits, best);
}

float kvq_decode(uint block, uint t, uint c) {
  uint g = c / pc.channels, code = kvq_page_code(block >> 2, t * (pc.head_dim / pc.channels) + g, pc.code_bits);
  return uintBitsToFloat(fixed1[kvq_cq_centroids(block, g) + code * pc.channels + c % pc.channels]);
}
