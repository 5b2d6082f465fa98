#version 450
#extension GL_GOOGLE_include_directive : require
// WEIGHTED_SUM for every sequence of the batch: output row (r, h), channel c = sum over slots t of p[t] * v_t[c],
// with probabilities in src (the scores after SOFTMAX) and the output in results fp32
// [rows][query_heads][d]. Page tokens and window tokens are summed apart and added last, as the
// CPU reference does; value methods that define KVQ_SUMS_ROTATED leave coordinate c of the page sum
// in their rotated space in dst and the window part in results, for weighted_sum_rotate.comp.
// One workgroup per (r, h, c) of a sequence (KVQ_PLAN_WEIGHTED_SUM); its invocations take every
// 64th token.
#include "shaders/common.glsl"
#include "shaders/method.glsl"
#include "shaders/attention.glsl"
#include "shaders/reduce.glsl"

void main() {
  uint id;
  if (!kvq_locate(KVQ_PLAN_WEIGHTED_SUM, id)) return; // uniform over the workgroup
  uint d = pc.head_dim;
  uint c = id % d, h = (id / d) % pc.query_heads, r = id / d / pc.query_heads;
  if (r >= kvq_seq(KVQ_SEQ_QUERY_COUNT)) return; // uniform over the workgroup
  uint lane = gl_LocalInvocationID.x, n = kvq_seq_tokens(), quantized = kvq_seq(KVQ_SEQ_QUANTIZED);
  uint kvh = h / (pc.query_heads / pc.kv_heads);
  uint p = kvq_seq(KVQ_SEQ_SCORE_OFFSET) + (r * pc.query_heads + h) * n;
  float paged = 0.0, window = 0.0;
  for (uint t = lane; t < quantized; t += KVQ_GPU_GROUP_SIZE) {
    float w = uintBitsToFloat(src[p + t]);
#ifdef KVQ_SUMS_ROTATED
    if (w != 0.0) paged += w * kvq_decode_rotated(kvq_slot_block(t, kvh), t % pc.page_size, c);
#else
    if (w != 0.0) paged += w * kvq_decode(kvq_slot_block(t, kvh), t % pc.page_size, c);
#endif
  }
  for (uint t = quantized + lane; t < n; t += KVQ_GPU_GROUP_SIZE) {
    float w = uintBitsToFloat(src[p + t]);
    if (w != 0.0) window += w * kvq_window_value(t, kvh, c);
  }
  paged = kvq_workgroup_sum(paged);
  window = kvq_workgroup_sum(window);
  if (lane != 0u) return;
  uint o = ((kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h) * d + c;
#ifdef KVQ_SUMS_ROTATED
  dst[o] = floatBitsToUint(paged); // coordinate c of the rotated sum: weighted_sum_rotate.comp finishes
  results[o] = floatBitsToUint(window);
#else
  results[o] = floatBitsToUint(paged + window);
#endif
}
