#version 450
#extension GL_GOOGLE_include_directive : require
// After SOFTMAX (H2O and Q-Hitter): the sum over a sequence's query rows and heads of the
// probability of slot t, into aux at accumulate_offset + t. Invocation: one slot.
#include "shaders/common.glsl"
#include "shaders/attention.glsl"

void main() {
  uint t = kvq_invocation();
  uint n = kvq_seq_tokens();
  if (t >= n) return;
  uint rows = kvq_seq(SEQ_QUERY_COUNT) * pc.query_heads, base = kvq_seq(SEQ_SCORE_OFFSET);
  float sum = 0.0;
  for (uint row = 0u; row < rows; row++) sum += uintBitsToFloat(dst[base + row * n + t]);
  aux[kvq_seq(SEQ_ACCUMULATE_OFFSET) + t] = floatBitsToUint(sum);
}
