#version 450
#extension GL_GOOGLE_include_directive : require
// QUANTIZE, step 2: encode items [range_first, range_first + count) of the job. Item k's metadata (4 words at
// meta + 4k): element index of its first input value in src, byte offset of its page in the pool,
// valid tokens. One work unit (methods/*.glsl) of one kv head of one item per invocation, or per
// workgroup for methods that define KVQ_ENCODES_BY_WORKGROUP (PolarQuant; the host sizes the
// dispatch by shaders/work_units.h's kvq_encode_by_workgroup); units is the largest unit count of a
// head block.
#define KVQ_QUANTIZE_SHADER // the methods' encoding code (shaders/methods/polar.glsl keeps its shared memory to it)
#include "shaders/common.glsl"
#include "shaders/method.glsl"

void main() {
#ifdef KVQ_ENCODES_BY_WORKGROUP
  // Every invocation of the workgroup has the same unit, so the returns below are taken by all of
  // them or none, and the barriers in kvq_encode_unit_group stay in uniform control flow.
  uint id = kvq_invocation() / gl_WorkGroupSize.x;
#else
  uint id = kvq_invocation();
#endif
  uint units = pc.units;
  uint u = id % units, h = (id / units) % pc.kv_heads, i = id / units / pc.kv_heads;
  if (i >= pc.count || kvq_check_refused()) return;
  uint m = pc.meta + (pc.range_first + i) * 4u;
  uint n = meta[m + 2u];
  if (u >= kvq_encode_units(n)) return;
#ifdef KVQ_ENCODES_BY_WORKGROUP
  kvq_encode_unit_group(meta[m + 1u] + h * pc.head_words * 4u, u, n, meta[m] + h * pc.head_dim);
#else
  kvq_encode_unit(meta[m + 1u] + h * pc.head_words * 4u, u, n, meta[m] + h * pc.head_dim);
#endif
}
