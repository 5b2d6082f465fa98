#version 450
#extension GL_GOOGLE_include_directive : require
// QUANTIZE, step 1: zero the pages of the job's items (padding and tokens past the valid count are
// zero, and encoders OR codes into zeroed words). Invocation: one word of one item's page.
#include "shaders/common.glsl"

void main() {
  uint id = kvq_invocation();
  uint page_words = pc.kv_heads * pc.head_words;
  uint i = id / page_words;
  if (i >= pc.count || kvq_check_refused()) return;
  pages[(meta[pc.meta + (pc.range_first + i) * 4u + 1u] >> 2) + id % page_words] = 0u;
}
