#version 450
#extension GL_GOOGLE_include_directive : require
// Fused decode attention, pass 3 of 3 (shaders/flash.glsl): the splits of each (row, head) rescaled
// to the row's maximum and summed: o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s, into results fp32
// [rows][query_heads][d]. A workgroup takes a unit of KVQ_PLAN_COMBINE, 64 outputs (row, head,
// channel) of a sequence, with KVQ_FLASH_COMBINE_GROUPS groups of 64 invocations (core/gpu_plan.h):
// invocation (group g, lane i) takes output i's splits g, g + G, ..., and the groups' partial
// maxima and sums meet in shared memory, added in group order (as the CUDA combine).
// With KVQ_PUSH_ROTATED (values summed in a rotated space) the split outputs are rotated page sums
// and their window parts lie apart (kvq_flash_window): the combine is linear, so it combines each
// with the same weights, the rotated page sum into dst from element pc.dst_word (indexed as the
// output) and the window part into results, and weighted_sum_rotate.comp turns the row back and adds.
#define KVQ_LOCAL_SIZE (KVQ_FLASH_COMBINE_GROUPS * KVQ_GPU_GROUP_SIZE)
#include "shaders/common.glsl"
#include "shaders/attention.glsl"
#include "shaders/flash.glsl"

shared float part_max[KVQ_LOCAL_SIZE], part_sum[KVQ_LOCAL_SIZE], part_out[KVQ_LOCAL_SIZE], part_window[KVQ_LOCAL_SIZE];

void main() {
  uint unit;
  if (!kvq_locate(KVQ_PLAN_COMBINE, unit)) return; // uniform over the workgroup, before any barrier
  uint lane = gl_LocalInvocationID.x % KVQ_GPU_GROUP_SIZE, group = gl_LocalInvocationID.x / KVQ_GPU_GROUP_SIZE;
  uint id = unit * KVQ_GPU_GROUP_SIZE + lane;
  uint d = pc.head_dim, n = kvq_seq_tokens(), rows = kvq_seq(KVQ_SEQ_QUERY_COUNT);
  uint c = id % d, row_head = id / d;
  bool rotated = (pc.flags & KVQ_PUSH_ROTATED) != 0u;
  bool live = row_head < rows * pc.query_heads; // not a return: the barriers below are the workgroup's
  uint splits = live ? kvq_flash_splits(n) : 0u;
  const float minus_inf = uintBitsToFloat(0xff800000u);
  float M = minus_inf;
  for (uint s = group; s < splits; s += KVQ_FLASH_COMBINE_GROUPS) M = max(M, uintBitsToFloat(dst[kvq_flash_max(rows, n, row_head, s)]));
  part_max[gl_LocalInvocationID.x] = M;
  barrier();
  for (uint g = 0u; g < KVQ_FLASH_COMBINE_GROUPS; g++) M = max(M, part_max[g * KVQ_GPU_GROUP_SIZE + lane]);
  float sum = 0.0, out_c = 0.0, window_c = 0.0;
  // Each split's entries are loaded before the test that may skip them, so that the loads of
  // consecutive splits overlap (the values a skipped split loaded are not used).
  for (uint s = group; s < splits; s += KVQ_FLASH_COMBINE_GROUPS) {
    float m = uintBitsToFloat(dst[kvq_flash_max(rows, n, row_head, s)]);
    float l = uintBitsToFloat(dst[kvq_flash_sum(rows, n, row_head, s)]);
    float o_c = uintBitsToFloat(dst[kvq_flash_out(rows, n, row_head, s, c)]);
    float ow_c = rotated ? uintBitsToFloat(dst[kvq_flash_window(rows, n, row_head, s, c)]) : 0.0;
    if (m == minus_inf) continue; // a split without a visible token
    float w = exp(m - M);
    sum += w * l;
    out_c += w * o_c;
    if (rotated) window_c += w * ow_c;
  }
  part_sum[gl_LocalInvocationID.x] = sum;
  part_out[gl_LocalInvocationID.x] = out_c;
  part_window[gl_LocalInvocationID.x] = window_c;
  barrier();
  if (group != 0u || !live) return;
  uint r = row_head / pc.query_heads, h = row_head % pc.query_heads;
  uint o = ((kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h) * d + c;
  if (n == 0u) {
    // no token: weighted_sum_rotate.comp still adds this row's rotated sum, which must be 0
    if (rotated) dst[pc.dst_word + o] = results[o] = 0u;
    return;
  }
  for (uint g = 1u; g < KVQ_FLASH_COMBINE_GROUPS; g++) {
    sum += part_sum[g * KVQ_GPU_GROUP_SIZE + lane];
    out_c += part_out[g * KVQ_GPU_GROUP_SIZE + lane];
    window_c += part_window[g * KVQ_GPU_GROUP_SIZE + lane];
  }
  if (rotated) {
    dst[pc.dst_word + o] = floatBitsToUint(out_c / sum);
    results[o] = floatBitsToUint(window_c / sum);
  } else {
    results[o] = floatBitsToUint(out_c / sum);
  }
}
