#version 450
#extension GL_GOOGLE_include_directive : require
// PREPARE_QUERY for key methods that define KVQ_PREPARES: fp32 query rows [rows][query_heads][d]
// from element src_word of src -> kvq_prepared_floats() floats per row from element dst_word of dst.
// Row r belongs to query head r % query_heads. Invocation: one of kvq_prepare_units() of one row.
#include "shaders/common.glsl"
#include "shaders/method.glsl"

void main() {
#ifdef KVQ_PREPARES
  uint id = kvq_invocation(), units = kvq_prepare_units();
  uint r = id / units;
  if (r >= pc.count) return;
  uint kv_head = r % pc.query_heads / (pc.query_heads / pc.kv_heads);
  kvq_prepare_unit(pc.src_word + r * pc.head_dim, kv_head, id % units, pc.dst_word + r * kvq_prepared_floats());
#endif
}
