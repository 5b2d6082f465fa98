// EXACT: tokens stored as they are, in fp32, fp16 or bf16. The math is core/methods/exact.h, the
// CPU reference's too. Work unit: one token.
#include "core/methods/exact.h"

void kvq_encode_unit(uint block, uint t, uint n, uint x) {
  kvq_exact_encode_unit(block, t, x, pc.kv_heads * pc.head_dim, pc.head_dim, pc.dtype);
}

float kvq_decode(uint block, uint t, uint c) { return kvq_exact_decode(block, t, c, pc.head_dim, pc.dtype); }

// A run of KVQ_DECODE_RUN channels, for the value pass and the fused logits' paged keys
// (KVQ_DECODES_RUN, KVQ_RUNS_ALWAYS: shaders/method.glsl): the run's 8 stored values in one 16-byte
// load (fp16, bf16) or two (fp32) instead of a load and a dtype choice per channel, which llvmpipe
// runs lane by lane (docs/VULKAN.md), and fp16 converted by the hardware (kvq_f16_read2:
// unpackHalf2x16 with the subnormals made exactly) instead of core/halfconv.h's branches and loop.
// Same floats as kvq_decode for every value an exact cache holds (all finite: core/methods/range.h
// refuses tokens that would overflow the dtype). The loads are aligned: a head block starts at a
// multiple of head_bytes (kvq_slot_block, shaders/attention.glsl), which core/layout.h pads to
// KVQ_PAGE_ALIGN = 16 bytes; the pool is bound at offset 0 (backends/vulkan/vk_dispatch.c); a run
// starts at byte (t * d + c0) * 2 or * 4 of the block, d a multiple of 16 (KVQ_HEAD_DIM_MULTIPLE)
// and c0 of 8: a multiple of 16. So every valid layout takes this path and none needs a fallback.
// The dtype's branch is uniform (a push constant).
layout(std430, binding = KVQ_BINDING_PAGES) readonly buffer PagesQuads { uvec4 kvq_exact_quads[]; };
#define KVQ_DECODES_RUN
#define KVQ_RUNS_ALWAYS
bool kvq_decode_run(uvec3 token, uint c0, out float v[KVQ_DECODE_RUN]) {
  uint at = (token.x + kvq_exact_offset(pc.head_dim, pc.dtype, token.y, c0)) >> 4u;
  uvec4 w = kvq_exact_quads[at];
  if (pc.dtype == KVQ_LAYOUT_F32) {
    uvec4 w1 = kvq_exact_quads[at + 1u];
    for (uint j = 0u; j < 4u; j++) { // constant trips: unrolled
      v[j] = uintBitsToFloat(w[j]);
      v[4u + j] = uintBitsToFloat(w1[j]);
    }
  } else if (pc.dtype == KVQ_LAYOUT_F16) {
    for (uint j = 0u; j < 4u; j++) { // channel 2j in the low half of word j (little-endian)
      vec2 x = kvq_f16_read2(w[j]);
      v[2u * j] = x.x;
      v[2u * j + 1u] = x.y;
    }
  } else { // bf16: the top 16 bits of an fp32
    for (uint j = 0u; j < 4u; j++) {
      v[2u * j] = uintBitsToFloat(w[j] << 16u);
      v[2u * j + 1u] = uintBitsToFloat(w[j] & 0xffff0000u);
    }
  }
  return true;
}
