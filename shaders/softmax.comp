#version 450
#extension GL_GOOGLE_include_directive : require
// SOFTMAX for every sequence of the batch, in place on dst: each row of n logits (masked entries -inf) becomes
// probabilities (masked entries 0). One workgroup per row (query row and query head,
// KVQ_PLAN_SOFTMAX); its
// invocations take every 64th token and meet in shaders/reduce.glsl.
#include "shaders/common.glsl"
#include "shaders/attention.glsl"
#include "shaders/reduce.glsl"

void main() {
  uint row;
  if (!kvq_locate(KVQ_PLAN_SOFTMAX, row) || row >= kvq_seq(KVQ_SEQ_QUERY_COUNT) * pc.query_heads) return; // uniform over the workgroup
  uint lane = gl_LocalInvocationID.x, n = kvq_seq_tokens();
  uint base = kvq_seq(KVQ_SEQ_SCORE_OFFSET) + row * n;
  const float minus_inf = uintBitsToFloat(0xff800000u);
  float mx = minus_inf;
  for (uint t = lane; t < n; t += KVQ_GPU_GROUP_SIZE) mx = max(mx, uintBitsToFloat(dst[base + t]));
  mx = kvq_workgroup_max(mx);
  float sum = 0.0;
  for (uint t = lane; t < n; t += KVQ_GPU_GROUP_SIZE) {
    float x = uintBitsToFloat(dst[base + t]);
    if (x != minus_inf) sum += exp(x - mx);
  }
  sum = kvq_workgroup_sum(sum);
  for (uint t = lane; t < n; t += KVQ_GPU_GROUP_SIZE) {
    float x = uintBitsToFloat(dst[base + t]);
    dst[base + t] = floatBitsToUint(x == minus_inf ? 0.0 : exp(x - mx) / sum);
  }
}
