#version 450
#extension GL_GOOGLE_include_directive : require
// QUANTIZE, step 3 (Q-Hitter only): ||x - x^||_2 of every valid token and kv head, x^ as DEQUANTIZE
// returns it, into dst as fp32 [item][page_size][kv_heads]. Summed in fp32: policy decisions need not
// agree with the CPU reference at near-ties (backends/backend.h). Invocation: one token of one head.
#include "shaders/common.glsl"
#include "shaders/method.glsl"

void main() {
  uint id = kvq_invocation();
  uint t = id % pc.page_size, h = (id / pc.page_size) % pc.kv_heads, i = id / pc.page_size / pc.kv_heads;
  if (i >= pc.count || kvq_check_refused()) return;
  uint k = pc.range_first + i, m = pc.meta + k * 4u;
  if (t >= meta[m + 2u]) return;
  uint x = meta[m] + h * pc.head_dim + t * pc.kv_heads * pc.head_dim;
  uint block = meta[m + 1u] + h * pc.head_words * 4u;
#ifdef KVQ_TOKEN_ERROR
  float norm = kvq_token_error(block, t, x);
#else
  float sum = 0.0;
  for (uint c = 0u; c < pc.head_dim; c++) {
    float diff = KVQ_READ_ELEMENT(src, pc.input_dtype, x + c) - kvq_decode(block, t, c);
    sum += diff * diff;
  }
  float norm = sqrt(sum);
#endif
  dst[(k * pc.page_size + t) * pc.kv_heads + h] = floatBitsToUint(norm);
}
