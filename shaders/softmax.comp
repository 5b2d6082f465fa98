#version 450
#extension GL_GOOGLE_include_directive : require
// SOFTMAX for one sequence, in place on dst: each row of n logits (masked entries -inf) becomes
// probabilities (masked entries 0). Invocation: one row (query row and query head).
#include "shaders/common.glsl"
#include "shaders/attention.glsl"

void main() {
  uint row = kvq_invocation();
  if (row >= kvq_seq(SEQ_QUERY_COUNT) * pc.query_heads) return;
  uint n = kvq_seq_tokens();
  uint base = kvq_seq(SEQ_SCORE_OFFSET) + row * n;
  const float minus_inf = uintBitsToFloat(0xff800000u);
  float mx = minus_inf;
  for (uint t = 0u; t < n; t++) mx = max(mx, uintBitsToFloat(dst[base + t]));
  float sum = 0.0;
  for (uint t = 0u; t < n; t++) {
    float x = uintBitsToFloat(dst[base + t]);
    if (x != minus_inf) sum += exp(x - mx);
  }
  for (uint t = 0u; t < n; t++) {
    float x = uintBitsToFloat(dst[base + t]);
    dst[base + t] = floatBitsToUint(x == minus_inf ? 0.0 : exp(x - mx) / sum);
  }
}
