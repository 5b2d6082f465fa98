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
uint kvq_prepared_floats() { return pc.sketch_dim; }
void kvq_prepare_unit(uint q, uint h, uint i, uint out_at) {
  dst[out_at + i] = floatBitsToUint(kvq_qjl_prepare_row(q, i, pc.head_dim));
}

float kvq_score_dot(uint block, uint t, uint q, uint p) {
  return kvq_qjl_score(block, t, q, p, pc.page_size, pc.head_dim, pc.sketch_dim, pc.outlier_sketch_dim, pc.outliers,
                       uintBitsToFloat(pc.constant_bits));
}
