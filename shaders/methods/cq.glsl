// CQ, Coupled Quantization: each group of c contiguous channels stores the b-bit index of its nearest
// centroid. The math is core/methods/cq.h, the CPU reference's too. Work unit: one channel group of
// one token. Keys are scored as on the CPU and CUDA (KVQ_PREPARES): PREPARE_QUERY writes each query
// head's lookup table <q_g, centroid j of group g> for every (group, code) (2^b x d/c floats, one
// entry per invocation), and a token's score is d/c table entries summed: one code read and one table
// read per group and head instead of c centroid reads and c products per group and head.
// Values are decoded (kvq_decode; the value pass's runs by kvq_decode_run below): a per-(group,
// code) probability histogram per split would sum 2^b codes per channel where decoding sums the
// split's tokens (64), fewer whenever 2^b > 64 (cq-c4-b8: 256), and would need one lane per (group,
// code) scanning the split's tokens.
//
// The kv head comes from the block's byte offset: every head block kvq's shaders address lies at
// (page * kv_heads + h) * head_bytes of its pool (the host refuses quantize items whose page offset
// is not a multiple of page_bytes, backends/vulkan/vk_jobs.c).
#include "core/methods/cq.h"

#define KVQ_PREPARES

// The last block's kv head, kept per invocation: the value pass decodes every token of a page from
// one block, and recomputing the head cost two integer divisions per decoded number, which llvmpipe
// runs lane by lane. Blocks are multiples of 4 bytes: 0xffffffff is never one.
uint cq_block = 0xffffffffu, cq_head = 0u;
uint kvq_cq_head(uint block) {
  if (block != cq_block) {
    cq_block = block;
    cq_head = block / (pc.head_words * 4u) % pc.kv_heads;
  }
  return cq_head;
}

void kvq_encode_unit(uint block, uint unit, uint n, uint x) {
  kvq_cq_encode_unit(block, unit, x, pc.kv_heads * pc.head_dim, pc.head_dim, pc.channels, pc.code_bits, kvq_cq_head(block));
}

float kvq_decode(uint block, uint t, uint c) {
  return kvq_cq_decode(block, t, c, pc.head_dim, pc.channels, pc.code_bits, kvq_cq_head(block));
}

// The tables of one query head: entry e = g * 2^b + j (core/config.c's kvq_prepared_floats), one per
// invocation; summed in fp32 (kvq_acc), as CUDA does: prepared queries only feed scores (class 3,
// docs/ACCURACY.md).
// Where c is a multiple of 4 and the query starts on a 16-byte boundary, the query's group and the
// centroid are read four floats a load (kvq_cq_quads: the codebooks, the same buffer as fixed1 bound
// at offset 0; a centroid of c >= 4 channels starts at a multiple of c floats, so its quads are
// aligned; the value pass's runs below read them too): llvmpipe runs each load lane by lane (docs/VULKAN.md). The same products summed in the
// same order as kvq_cq_prepare_entry: the same floats.
layout(std430, binding = KVQ_BINDING_FIXED1) readonly buffer Fixed1Quads { vec4 kvq_cq_quads[]; };
layout(std430, binding = KVQ_BINDING_SRC) readonly buffer CqSrcVec4 { vec4 kvq_cq_src4[]; };
uint kvq_prepared_floats() { return (pc.head_dim / pc.channels) << pc.code_bits; }
void kvq_prepare_unit(uint q, uint h, uint e, uint out_at) {
  uint c = pc.channels, b = pc.code_bits, g = e >> b, j = e & ((1u << b) - 1u);
  if ((q & 3u) != 0u || (c & 3u) != 0u) { // uniform (q is src_word + r d, d a multiple of 16)
    dst[out_at + e] = floatBitsToUint(kvq_cq_prepare_entry(q, g, j, pc.head_dim, c, b, h));
    return;
  }
  uint mu = (kvq_cq_centroids(h, g, pc.head_dim, c, b) + j * c) >> 2u, x0 = (q + g * c) >> 2u;
  float dot = 0.0;
  for (uint i = 0u; i < c / 4u; i++) {
    vec4 m = kvq_cq_quads[mu + i], x = kvq_cq_src4[x0 + i];
    dot += x.x * m.x;
    dot += x.y * m.y;
    dot += x.z * m.z;
    dot += x.w * m.w;
  }
  dst[out_at + e] = floatBitsToUint(dot);
}

// q.k_t: the tables of the query prepared at element p of results, kvq_cq_score's sum.
float kvq_score_dot(uint block, uint t, uint q, uint p) {
  return kvq_cq_score(block, t, p, pc.head_dim, pc.channels, pc.code_bits);
}

// The fused logits (shaders/flash_logits.comp, KVQ_SCORES_HEADS): a token's codes read once for every
// head of the pass, a word at a time, and each code's entry added to each head's sum; kvq_score_dot
// re-read the token's code words and re-derived their shifts once per head, and llvmpipe runs each
// load lane by lane (docs/VULKAN.md). Each head's sum takes the same entries in the same group order
// as kvq_cq_score, from 0: the same logits. For 1-, 2-, 4- and 8-bit codes where a token's codes fill
// whole words (d/c a multiple of 32/b: cq-c4-b8's 32 groups are 8 words), so that the token's first
// code starts a word and no shift needs a division; other layouts take kvq_cq_score per head.
#define KVQ_SCORES_HEADS
void kvq_score_heads(uint block, uint t, uint p, uint heads, inout float logit[KVQ_FLASH_HEADS_PER_PASS]) {
  uint b = pc.code_bits, stride = kvq_prepared_floats();
  uint groups = pc.head_dim >> kvq_log2_pow2(pc.channels); // c: a power of two (core/config.c)
  uint per_word_log2 = 5u - kvq_log2_pow2(b);
  if ((b & (b - 1u)) != 0u || b > 8u || (groups & ((1u << per_word_log2) - 1u)) != 0u) { // uniform
    for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++) // a constant trip count: logit[g] in registers
      if (g < heads) logit[g] += kvq_cq_score(block, t, p + g * stride, pc.head_dim, pc.channels, b);
    return;
  }
  uint words = groups >> per_word_log2, w0 = (block >> 2u) + t * words, mask = (1u << b) - 1u;
  for (uint w = 0u; w < words; w++) {
    uint word = KVQ_PAGE(w0 + w), e = (w << per_word_log2) << b; // group w * 32/b's first entry
    for (uint j = 0u; j < (1u << per_word_log2); j++) {
      uint at = p + e + (word & mask);
      for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++)
        if (g < heads) logit[g] += KVQ_PREPARED(at + g * stride);
      word >>= b;
      e += 1u << b;
    }
  }
}

// A run of KVQ_DECODE_RUN channels of the value pass (KVQ_DECODES_RUN, shaders/method.glsl), for
// c >= 4 channels per group and 1-, 2-, 4- or 8-bit codes: the run covers 8 / c groups (or part of
// one where c >= 8), whose codes lie in one word (the run's first code index is a multiple of the
// groups it covers, and those take at most 16 bits), read with one load; each quad of 4 channels of
// the run is one vec4 load of its centroid. So 3 loads a run instead of a code read and a centroid
// read per channel, which llvmpipe runs lane by lane (docs/VULKAN.md). Same floats as kvq_decode: the
// same centroid elements. No branch per group or channel: llvmpipe would run each under masks.
// Other cases (c < 4, 3-bit and other widths) take the value pass's per-channel path.
#define KVQ_DECODES_RUN
bool kvq_decode_run(uvec3 token, uint c0, out float v[KVQ_DECODE_RUN]) {
  uint c = pc.channels, b = pc.code_bits; // c: a power of two (core/config.c)
  if (c < 4u || (b & (b - 1u)) != 0u || b > 8u) return false; // uniform
  uint c_log2 = kvq_log2_pow2(c), h = kvq_cq_head(token.x), g0 = c0 >> c_log2;
  uint i = token.y * (pc.head_dim >> c_log2) + g0, per_word_log2 = 5u - kvq_log2_pow2(b); // the run's first code
  uint word = KVQ_PAGE((token.x >> 2u) + (i >> per_word_log2)) >> ((i & ((1u << per_word_log2) - 1u)) * b);
  uint base = kvq_cq_centroids(h, g0, pc.head_dim, c, b), mask = (1u << b) - 1u;
  for (uint q = 0u; q < KVQ_DECODE_RUN / 4u; q++) { // constant trips: unrolled
    uint g = (4u * q) >> c_log2; // the run's group of this quad (0 where c >= 8)
    uint at = base + (((g << b) + ((word >> (g * b)) & mask)) << c_log2) + ((c0 + 4u * q) & (c - 1u));
    vec4 x = kvq_cq_quads[at >> 2u];
    for (uint j = 0u; j < 4u; j++) v[4u * q + j] = x[j];
  }
  return true;
}
