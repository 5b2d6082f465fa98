#version 450
#extension GL_GOOGLE_include_directive : require
// QUANTIZE, step 2: encode items [range_first, range_first + count) of the job. Item k's metadata (4 words at
// meta + 4k): element index of its first input value in src, byte offset of its page in the pool,
// valid tokens. Invocation: one work unit (methods/*.glsl) of one kv head of one item; units is
// the largest unit count of a head block.
#include "shaders/common.glsl"
#include "shaders/method.glsl"

void main() {
  uint id = kvq_invocation();
  uint units = pc.units;
  uint u = id % units, h = (id / units) % pc.kv_heads, i = id / units / pc.kv_heads;
  if (i >= pc.count || kvq_check_refused()) return;
  uint m = pc.meta + (pc.range_first + i) * 4u;
  uint n = meta[m + 2u];
  if (u >= kvq_encode_units(n)) return;
  kvq_encode_unit(meta[m + 1u] + h * pc.head_words * 4u, u, n, meta[m] + h * pc.head_dim);
}
