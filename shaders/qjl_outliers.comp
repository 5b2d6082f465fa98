#version 450
#extension GL_GOOGLE_include_directive : require
// QUANTIZE, QJL with outliers, between zeroing and encoding: the outlier list of one kv head of one
// item's page, chosen as the CPU reference chooses it (core/methods/qjl.h: kvq_qjl_channel_norm2,
// kvq_qjl_choose_outliers, kvq_qjl_put_outliers). It runs apart because
// every token's encoding needs the list of its whole page. Items as in shaders/quantize.comp.
// Workgroup: one kv head of one item; its invocations sum the channels (up to 256 tokens each,
// for the loop limit, docs/VULKAN.md), the first one picks the list.
#include "shaders/common.glsl"
#include "core/methods/qjl.h"

shared float norm2[KVQ_MAX_HEAD_DIM];

void main() {
  uint group = kvq_invocation() / gl_WorkGroupSize.x, lane = gl_LocalInvocationID.x;
  uint d = pc.head_dim, h = group % pc.kv_heads, i = group / pc.kv_heads;
  if (i >= pc.count || kvq_check_refused()) return; // the whole workgroup: it works on one item
  uint m = pc.meta + (pc.range_first + i) * 4u;
  uint n = meta[m + 2u], x = meta[m] + h * d, stride = pc.kv_heads * d;
  for (uint c = lane; c < d; c += gl_WorkGroupSize.x) norm2[c] = kvq_qjl_channel_norm2(x, stride, n, c);
  memoryBarrierShared();
  barrier();
  if (lane != 0u) return;
  uint chosen[KVQ_MAX_HEAD_DIM / 32u];
  kvq_qjl_choose_outliers(norm2, d, pc.outliers, chosen);
  kvq_qjl_put_outliers(meta[m + 1u] + h * pc.head_words * 4u, chosen, d, pc.page_size, pc.sketch_dim,
                       pc.outlier_sketch_dim, pc.outliers);
}
