// CQ, Coupled Quantization: each group of c contiguous channels stores the b-bit index of its nearest
// centroid. The math is core/methods/cq.h, the CPU reference's too. Work unit: one channel group of
// one token. Keys are scored by decoding here (no KVQ_PREPARES): the lookup tables of the CPU's
// scoring (kvq_cq_prepare_entry, kvq_cq_score) would need 2^b x d/c floats per query.
//
// The kv head comes from the block's byte offset: every head block kvq's shaders address lies at
// (page * kv_heads + h) * head_bytes of its pool (the host refuses quantize items whose page offset
// is not a multiple of page_bytes, backends/vulkan/vk_jobs.c).
#include "core/methods/cq.h"

uint kvq_cq_head(uint block) { return block / (pc.head_words * 4u) % pc.kv_heads; }

void kvq_encode_unit(uint block, uint unit, uint n, uint x) {
  kvq_cq_encode_unit(block, unit, x, pc.kv_heads * pc.head_dim, pc.head_dim, pc.channels, pc.code_bits, kvq_cq_head(block));
}

float kvq_decode(uint block, uint t, uint c) {
  return kvq_cq_decode(block, t, c, pc.head_dim, pc.channels, pc.code_bits, kvq_cq_head(block));
}
