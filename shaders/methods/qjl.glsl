// QJL keys: sign bits of S k_in (m rows, fixed0) and S_o k_out (m_o rows, fixed1) with fp16 norms,
// where k_out keeps the page's outlier channels and k_in the others. The math is
// core/methods/qjl.h, the CPU reference's too. The outlier list is written by
// shaders/qjl_outliers.comp before the tokens are encoded, so every token of the page reads the same
// list. Page tokens are scored with the paper's estimator (KVQ_PREPARES), not by decoding.
//
// Work unit: one 32-row word of sign bits of one token (core/methods/qjl.h), small for the loop
// limit (docs/VULKAN.md).
#include "core/methods/qjl.h"

#define KVQ_PREPARES

void kvq_encode_unit(uint block, uint unit, uint n, uint x) {
  kvq_qjl_encode_unit(block, unit, x, pc.kv_heads * pc.head_dim, pc.page_size, pc.head_dim, pc.sketch_dim,
                      pc.outlier_sketch_dim, pc.outliers);
}

float kvq_decode(uint block, uint t, uint c) {
  return kvq_qjl_decode(block, t, c, pc.page_size, pc.head_dim, pc.sketch_dim, pc.outlier_sketch_dim, pc.outliers,
                        uintBitsToFloat(pc.constant_bits));
}

// S q, one row of S per invocation; S is shared by the kv heads. Summed in fp32: prepared queries
// only feed scores (class 3, docs/ACCURACY.md).
// The row and the query are read four floats a load where the query starts on a 16-byte boundary
// (PREPARE_QUERY's queries are fp32; a row of S starts at i d floats, d a multiple of 16): llvmpipe
// runs each load lane by lane (docs/VULKAN.md), and kvq_qjl_prepare_row's d scalar loads of S and
// d of the query (each through KVQ_IN's choice of dtype) per row were most of the prepare pass
// (docs/BENCH.md, "Table-scored methods: loads of the prepare pass"). The same products summed in
// the same order as kvq_qjl_prepare_row: the same floats.
layout(std430, binding = KVQ_BINDING_FIXED0) readonly buffer QjlFixed0Vec4 { vec4 kvq_qjl_s4[]; };
layout(std430, binding = KVQ_BINDING_SRC) readonly buffer QjlSrcVec4 { vec4 kvq_qjl_src4[]; };
uint kvq_prepared_floats() { return pc.sketch_dim; }
void kvq_prepare_unit(uint q, uint h, uint i, uint out_at) {
  uint d = pc.head_dim;
  if ((q & 3u) != 0u) { // uniform: q is src_word + r d
    dst[out_at + i] = floatBitsToUint(kvq_qjl_prepare_row(q, i, d));
    return;
  }
  float sum = 0.0;
  for (uint c4 = 0u; c4 < d / 4u; c4++) {
    vec4 s = kvq_qjl_s4[i * (d / 4u) + c4], x = kvq_qjl_src4[q / 4u + c4];
    sum += s.x * x.x;
    sum += s.y * x.y;
    sum += s.z * x.z;
    sum += s.w * x.w;
  }
  dst[out_at + i] = floatBitsToUint(sum);
}

float kvq_score_dot(uint block, uint t, uint q, uint p) {
  return kvq_qjl_score(block, t, q, p, pc.page_size, pc.head_dim, pc.sketch_dim, pc.outlier_sketch_dim, pc.outliers,
                       uintBitsToFloat(pc.constant_bits));
}
