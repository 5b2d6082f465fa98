#version 450
#extension GL_GOOGLE_include_directive : require
// Fused decode attention with the H2O / Q-Hitter sums, after pass 3 (flash_combine.comp), which
// read the split sums this overwrites: per (row, head), the row's maximum M over its split maxima
// m_s and its sum L = sum_s e^(m_s - M) l_s (as the combine forms its normalizer), then each split
// sum l_s replaced by the split's factor f_s = e^(m_s - M) / L (0 for a split without a visible
// token), so that p_t f_s is slot t's probability (core/gpu_plan.h) for accumulate_flash. One
// workgroup per row (KVQ_PLAN_SOFTMAX's units); its invocations take every 64th split (a long
// sequence has more splits than one invocation could loop over, docs/VULKAN.md), and each writes
// only the splits it read.
#include "shaders/common.glsl"
#include "shaders/attention.glsl"
#include "shaders/flash.glsl"

void main() {
  uint row_head;
  if (!kvq_locate(KVQ_PLAN_SOFTMAX, row_head)) return; // uniform over the workgroup
  uint n = kvq_seq_tokens(), rows = kvq_seq(KVQ_SEQ_QUERY_COUNT);
  if (n == 0u || row_head >= rows * pc.query_heads) return; // uniform over the workgroup
  uint lane = gl_LocalInvocationID.x, splits = kvq_flash_splits(n);
  const float minus_inf = uintBitsToFloat(0xff800000u);
  float M = minus_inf;
  for (uint s = lane; s < splits; s += KVQ_GPU_GROUP_SIZE) M = max(M, uintBitsToFloat(dst[kvq_flash_max(rows, n, row_head, s)]));
  M = kvq_workgroup_max(M);
  float L = 0.0;
  for (uint s = lane; s < splits; s += KVQ_GPU_GROUP_SIZE) {
    float m = uintBitsToFloat(dst[kvq_flash_max(rows, n, row_head, s)]);
    if (m != minus_inf) L += exp(m - M) * uintBitsToFloat(dst[kvq_flash_sum(rows, n, row_head, s)]);
  }
  L = kvq_workgroup_sum(L);
  for (uint s = lane; s < splits; s += KVQ_GPU_GROUP_SIZE) {
    float m = uintBitsToFloat(dst[kvq_flash_max(rows, n, row_head, s)]);
    dst[kvq_flash_sum(rows, n, row_head, s)] = floatBitsToUint(m == minus_inf ? 0.0 : exp(m - M) / L);
  }
}
