#version 450
#extension GL_GOOGLE_include_directive : require
// After SOFTMAX (H2O and Q-Hitter): the sum over a sequence's query rows and heads of the
// probability of slot t, into results at accumulate_offset + t. One workgroup per slot of every sequence
// (KVQ_PLAN_ACCUMULATE); its invocations
// take every 64th row (a prefill can have more rows than the loop limit allows one invocation,
// docs/VULKAN.md).
#include "shaders/common.glsl"
#include "shaders/attention.glsl"
#include "shaders/reduce.glsl"

void main() {
  uint t;
  if (!kvq_locate(KVQ_PLAN_ACCUMULATE, t)) return; // uniform over the workgroup
  uint n = kvq_seq_tokens();
  if (t >= n) return; // uniform over the workgroup
  uint rows = kvq_seq(KVQ_SEQ_QUERY_COUNT) * pc.query_heads, base = kvq_seq(KVQ_SEQ_SCORE_OFFSET);
  float sum = 0.0;
  for (uint row = gl_LocalInvocationID.x; row < rows; row += KVQ_GPU_GROUP_SIZE) sum += uintBitsToFloat(dst[base + row * n + t]);
  sum = kvq_workgroup_sum(sum);
  if (gl_LocalInvocationID.x == 0u) results[kvq_seq(KVQ_SEQ_ACCUMULATE_OFFSET) + t] = floatBitsToUint(sum);
}
