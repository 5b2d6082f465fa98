#version 450
#extension GL_GOOGLE_include_directive : require
// DEQUANTIZE: pages meta[meta + i] (slots) -> dst[dst_word + ((i*P + t)*kv_heads + h)*d + c] fp32.
// Invocation: one channel of one token of one kv head of one page.
#include "shaders/common.glsl"
#include "shaders/method.glsl"

void main() {
  uint id = kvq_invocation();
  uint d = pc.head_dim, P = pc.page_size;
  uint c = id % d, h = (id / d) % pc.kv_heads, t = (id / d / pc.kv_heads) % P, i = id / d / pc.kv_heads / P;
  if (i >= pc.count) return;
  uint block = (meta[pc.meta + i] * pc.kv_heads + h) * pc.head_words * 4u;
  dst[pc.dst_word + ((i * P + t) * pc.kv_heads + h) * d + c] = floatBitsToUint(kvq_decode(block, t, c));
}
