#version 450
#extension GL_GOOGLE_include_directive : require
// QUANTIZE, QJL with outliers, between zeroing and encoding: the outlier list of one kv head of one
// item's page (backends/cpu/cpu_qjl.c, qjl_encode): the k channels with the largest sum over the
// valid tokens of x*x (fp32, each product and sum rounded on its own, tokens in order), ties to the
// lower channel, listed ascending as uint8 and zero-padded to whole words. It runs apart because
// every token's encoding needs the list of its whole page. Items as in shaders/quantize.comp.
// Workgroup: one kv head of one item; its invocations sum the channels (up to 256 tokens each,
// so that no invocation nears llvmpipe's limit on loop iterations), the first one picks the list.
#include "shaders/common.glsl"

shared float norm2[KVQ_MAX_HEAD_DIM];

void main() {
  uint group = kvq_invocation() / gl_WorkGroupSize.x, lane = gl_LocalInvocationID.x;
  uint d = pc.head_dim, h = group % pc.kv_heads, i = group / pc.kv_heads;
  if (i >= pc.count) return; // the whole workgroup: it works on one item
  uint m = pc.meta + (pc.first + i) * 4u;
  uint n = meta[m + 2u], x = meta[m] + h * d, stride = pc.kv_heads * d;
  for (uint c = lane; c < d; c += gl_WorkGroupSize.x) {
    precise float sum = 0.0;
    for (uint t = 0u; t < n; t++) {
      float v = KVQ_READ_ELEMENT(src, pc.input_dtype, x + t * stride + c);
      sum = KVQ_FADD(sum, KVQ_FMUL(v, v));
    }
    norm2[c] = sum;
  }
  memoryBarrierShared();
  barrier();
  if (lane != 0u) return;
  uint chosen[KVQ_MAX_HEAD_DIM / 32u];
  for (uint w = 0u; w < KVQ_MAX_HEAD_DIM / 32u; w++) chosen[w] = 0u;
  for (uint j = 0u; j < pc.outliers; j++) {
    uint best = d;
    for (uint c = 0u; c < d; c++)
      if (((chosen[c / 32u] >> (c % 32u)) & 1u) == 0u && (best == d || norm2[c] > norm2[best])) best = c;
    chosen[best / 32u] |= 1u << (best % 32u);
  }
  uint block = meta[m + 1u] + h * pc.head_words * 4u;
  uint list = (block + kvq_qjl_outliers_offset(pc.page_size, pc.sketch_dim, pc.outlier_sketch_dim, pc.outliers)) >> 2;
  uint word = 0u, j = 0u;
  for (uint c = 0u; c < d; c++) {
    if (((chosen[c / 32u] >> (c % 32u)) & 1u) == 0u) continue;
    word |= c << (8u * (j % 4u));
    j++;
    if (j % 4u == 0u) {
      pages[list + j / 4u - 1u] = word;
      word = 0u;
    }
  }
  if (j % 4u != 0u) pages[list + j / 4u] = word;
}
