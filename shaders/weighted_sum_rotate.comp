#version 450
#extension GL_GOOGLE_include_directive : require
// WEIGHTED_SUM, step 2, for value methods that define KVQ_SUMS_ROTATED: output row (r, h) = its
// rotated page sum (in dst from element pc.dst_word, indexed as the output: from step 1, or from
// flash_combine.comp on the fused path) rotated back, plus its window part (in results), as the CPU
// reference adds them. Invocation: one (r, h) of a sequence (KVQ_PLAN_ROTATE).
#include "shaders/common.glsl"
#include "shaders/method.glsl"
#include "shaders/attention.glsl"

void main() {
#ifdef KVQ_SUMS_ROTATED
  uint id;
  if (!kvq_locate_invocation(KVQ_PLAN_ROTATE, id)) return;
  uint h = id % pc.query_heads, r = id / pc.query_heads;
  if (r >= kvq_seq(KVQ_SEQ_QUERY_COUNT)) return;
  uint row = ((kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h) * pc.head_dim;
  float pages[KVQ_MAX_HEAD_DIM];
  kvq_rotate_back(pc.dst_word + row, pages);
  for (uint c = 0u; c < pc.head_dim; c++) results[row + c] = floatBitsToUint(pages[c] + uintBitsToFloat(results[row + c]));
#endif
}
