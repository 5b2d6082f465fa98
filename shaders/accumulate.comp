#version 450
#extension GL_GOOGLE_include_directive : require
// The H2O and Q-Hitter sums: the sum over a sequence's query rows and heads of the probability of
// slot t, into results at accumulate_offset + t. One workgroup per slot of every sequence
// (KVQ_PLAN_ACCUMULATE); its invocations take every 64th row (a prefill can have more rows than the
// loop limit allows one invocation, docs/VULKAN.md), rows in the same order in both variants:
//   - after SOFTMAX (the unfused path): the probabilities in dst at score_offset, [rows][heads][n];
//   - KVQ_FLASH_SCRATCH, accumulate_flash (the fused path, after flash_normalize.comp): the
//     probability p_t f_s from the flash scratch in dst (core/gpu_plan.h), p_t relative to its
//     split's maximum and f_s the split's factor, one product per row before the sum.
#include "shaders/common.glsl"
#include "shaders/attention.glsl"
#ifdef KVQ_FLASH_SCRATCH
#include "shaders/flash.glsl"
#else
#include "shaders/reduce.glsl"
#endif

void main() {
  uint t;
  if (!kvq_locate(KVQ_PLAN_ACCUMULATE, t)) return; // uniform over the workgroup
  uint n = kvq_seq_tokens();
  if (t >= n) return; // uniform over the workgroup
  uint query_rows = kvq_seq(KVQ_SEQ_QUERY_COUNT), rows = query_rows * pc.query_heads;
  float sum = 0.0;
#ifdef KVQ_FLASH_SCRATCH
  uint split = t / KVQ_FLASH_SPLIT;
  for (uint row = gl_LocalInvocationID.x; row < rows; row += KVQ_GPU_GROUP_SIZE)
    sum += uintBitsToFloat(dst[kvq_flash_prob(n, row, t)]) * uintBitsToFloat(dst[kvq_flash_sum(query_rows, n, row, split)]);
#else
  uint base = kvq_seq(KVQ_SEQ_SCORE_OFFSET);
  for (uint row = gl_LocalInvocationID.x; row < rows; row += KVQ_GPU_GROUP_SIZE) sum += uintBitsToFloat(dst[base + row * n + t]);
#endif
  sum = kvq_workgroup_sum(sum);
  if (gl_LocalInvocationID.x == 0u) results[kvq_seq(KVQ_SEQ_ACCUMULATE_OFFSET) + t] = floatBitsToUint(sum);
}
