#version 450
#extension GL_GOOGLE_include_directive : require
// Fused decode attention, pass 3 of 3 (shaders/flash.glsl): the splits of each (row, head) rescaled
// to the row's maximum and summed: o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s, into results fp32
// [rows][query_heads][d]. Invocation: one (row, head, channel) of a sequence (KVQ_PLAN_COMBINE).
// With KVQ_PUSH_ROTATED (values summed in a rotated space) the split outputs are rotated page sums
// and their window parts lie apart (kvq_flash_window): the combine is linear, so it combines each
// with the same weights, the rotated page sum into dst from element pc.dst_word (indexed as the
// output) and the window part into results, and weighted_sum_rotate.comp turns the row back and adds.
#include "shaders/common.glsl"
#include "shaders/attention.glsl"
#include "shaders/flash.glsl"

void main() {
  uint id;
  if (!kvq_locate_invocation(KVQ_PLAN_COMBINE, id)) return;
  uint d = pc.head_dim, n = kvq_seq_tokens(), rows = kvq_seq(KVQ_SEQ_QUERY_COUNT);
  uint c = id % d, row_head = id / d;
  bool rotated = (pc.flags & KVQ_PUSH_ROTATED) != 0u;
  if (row_head >= rows * pc.query_heads) return;
  uint r = row_head / pc.query_heads, h = row_head % pc.query_heads;
  uint o = ((kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h) * d + c;
  if (n == 0u) {
    // no token: weighted_sum_rotate.comp still adds this row's rotated sum, which must be 0
    if (rotated) dst[pc.dst_word + o] = results[o] = 0u;
    return;
  }
  const float minus_inf = uintBitsToFloat(0xff800000u);
  float M = minus_inf;
  for (uint s = 0u; s < kvq_flash_splits(n); s++) M = max(M, uintBitsToFloat(dst[kvq_flash_max(rows, n, row_head, s)]));
  float sum = 0.0, out_c = 0.0, window_c = 0.0;
  // Latency-bound on a GPU (every split's entries, one after another: 4096 splits at 256k tokens), so
  // each split's entries are loaded before the test that may skip them, which lets the compiler
  // overlap the loads of consecutive splits; the values a skipped split loaded are not used, and the
  // sums are added in split order as before (the same bits). The CUDA combine does the same.
  for (uint s = 0u; s < kvq_flash_splits(n); s++) {
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
  if (rotated) {
    dst[pc.dst_word + o] = floatBitsToUint(out_c / sum);
    results[o] = floatBitsToUint(window_c / sum);
  } else {
    results[o] = floatBitsToUint(out_c / sum);
  }
}
