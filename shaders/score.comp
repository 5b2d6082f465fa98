#version 450
#extension GL_GOOGLE_include_directive : require
// SCORE for every sequence of the batch: logit of query row r, query head h against slot t, scaled, or -inf where
// masked, into dst at score_offset + (r * query_heads + h) * n + t. Queries: src fp32
// [rows][query_heads][d]; prepared queries (KVQ_PREPARES): results, [rows][query_heads][prepared floats].
// Invocation: one (r, h, t) of its sequence, t fastest (KVQ_PLAN_SCORE).
#include "shaders/common.glsl"
#include "shaders/method.glsl"
#include "shaders/attention.glsl"

void main() {
  uint id;
  if (!kvq_locate_invocation(KVQ_PLAN_SCORE, id)) return;
  uint n = kvq_seq_tokens();
  if (n == 0u) return;
  uint t = id % n, h = (id / n) % pc.query_heads, r = id / n / pc.query_heads;
  if (r >= kvq_seq(KVQ_SEQ_QUERY_COUNT)) return;
  uint out_index = kvq_seq(KVQ_SEQ_SCORE_OFFSET) + (r * pc.query_heads + h) * n + t;
  if (!kvq_visible(r, t)) {
    dst[out_index] = 0xff800000u; // -inf
    return;
  }
  uint kvh = h / (pc.query_heads / pc.kv_heads), d = pc.head_dim;
  uint row = (kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h, q = row * d;
  float dot = 0.0;
  if (t < kvq_seq(KVQ_SEQ_QUANTIZED)) {
    uint block = kvq_slot_block(t, kvh);
#ifdef KVQ_PREPARES
    dot = kvq_score_dot(block, t % pc.page_size, q, row * kvq_prepared_floats());
#else
    for (uint c = 0u; c < d; c++) dot += uintBitsToFloat(src[q + c]) * kvq_decode(block, t % pc.page_size, c);
#endif
  } else {
    for (uint c = 0u; c < d; c++) dot += uintBitsToFloat(src[q + c]) * kvq_window_value(t, kvh, c);
  }
  dst[out_index] = floatBitsToUint(dot * uintBitsToFloat(pc.scale_bits));
}
