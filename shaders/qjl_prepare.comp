#version 450
#extension GL_GOOGLE_include_directive : require
// PREPARE_QUERY for QJL keys (backends/cpu/cpu_qjl.c, qjl_prepare): S q of every query row, the m
// floats the score shader's estimator starts from. Queries: src fp32 [rows][d] from element
// offset0; prepared: dst [rows][m] from element offset1. S (fixed0) is the same for every kv head.
// Summed in fp32: prepared queries only feed scores (class 3, docs/ACCURACY.md).
// Invocation: one row i of S for one query row.
#include "shaders/common.glsl"

void main() {
  uint id = kvq_invocation();
  uint d = pc.head_dim, m = pc.sketch_dim;
  uint i = id % m, r = id / m;
  if (r >= pc.count) return;
  float sum = 0.0;
  for (uint c = 0u; c < d; c++) sum += uintBitsToFloat(fixed0[i * d + c]) * uintBitsToFloat(src[pc.offset0 + r * d + c]);
  dst[pc.offset1 + r * m + i] = floatBitsToUint(sum);
}
