// QJL keys (backends/cpu/cpu_qjl.c): sign bits of S k_in (m rows, fixed0) and S_o k_out (m_o rows,
// fixed1) with fp16 norms |k_in|, |k_out|, where k_out keeps the page's outlier channels and k_in the
// others. The outlier list is written by shaders/qjl_outliers.comp before the tokens are encoded, so
// every token of the page reads the same list. Page tokens are scored with the paper's estimator
// (KVQ_PREPARES), not by decoding.
//
// Work unit: one 32-row word of sign bits of one token, the inlier sketch's words first, then the
// outlier sketch's; the unit of a sketch's word 0 also stores its norm. Units this small keep every
// invocation far below llvmpipe's limit on loop iterations: Mesa's gallivm caps all loops of an
// invocation together (LP_MAX_TGSI_LOOP_ITERATIONS, 65535; loops here stopped after about 32K
// iterations) and a loop past the cap ends silently, which a whole token (up to 2 x 1024 rows x 256
// channels) would hit. For the same reason the score loop takes four rows per iteration and the
// decode loop 32 (an inner loop of constant trip count, which is unrolled and not counted), so that
// the quantization errors (head_dim decodes per invocation) stay below the cap as well.

// The sign words of one token: the inlier sketch's, then the outlier sketch's (none when k = 0).
uint kvq_qjl_token_words() {
  return kvq_qjl_words_per_token(pc.sketch_dim) + (pc.outliers > 0u ? kvq_qjl_words_per_token(pc.outlier_sketch_dim) : 0u);
}

uint kvq_qjl_list(uint block) { return block + kvq_qjl_outliers_offset(pc.page_size, pc.sketch_dim, pc.outlier_sketch_dim, pc.outliers); }

// Byte offsets of a sketch's sign array and norm array in a head block.
uint kvq_qjl_signs_at(uint block, bool outer) {
  return block + (outer ? kvq_qjl_signs_out_offset(pc.page_size, pc.sketch_dim) : kvq_qjl_signs_offset());
}
uint kvq_qjl_norm_at(uint block, bool outer, uint t) {
  uint P = pc.page_size, m = pc.sketch_dim, mo = pc.outlier_sketch_dim, k = pc.outliers;
  return block + (outer ? kvq_qjl_norm_out_offset(P, m, mo, k) : kvq_qjl_norm_in_offset(P, m, mo, k)) + 2u * t;
}
float kvq_qjl_norm(uint block, bool outer, uint t) { return kvq_f16_bits_to_f32(kvq_io_u16(kvq_qjl_norm_at(block, outer, t))); }

// Entry (i, c) of S (outer = false) or S_o (outer = true), and rows i..i+3 of column c.
float kvq_qjl_sketch(bool outer, uint i, uint c) {
  uint at = i * pc.head_dim + c;
  return uintBitsToFloat(outer ? fixed1[at] : fixed0[at]);
}
vec4 kvq_qjl_column4(bool outer, uint i, uint c) {
  return vec4(kvq_qjl_sketch(outer, i, c), kvq_qjl_sketch(outer, i + 1u, c), kvq_qjl_sketch(outer, i + 2u, c),
              kvq_qjl_sketch(outer, i + 3u, c));
}

// Word w (rows 32w..32w+31) of token t's sign bits of a sketch with `rows` rows.
uint kvq_qjl_sign_word(uint block, bool outer, uint rows, uint t, uint w) {
  return pages[(kvq_qjl_signs_at(block, outer) >> 2) + t * kvq_qjl_words_per_token(rows) + w];
}
// The low four bits of `bits` as +1 (set) or -1.
vec4 kvq_qjl_signs4(uint bits) { return vec4(notEqual(uvec4(bits) & uvec4(1u, 2u, 4u, 8u), uvec4(0u))) * 2.0 - 1.0; }

// ---- QUANTIZE ----------------------------------------------------------------------------------


// The page's outlier channels as a bit mask over channels.
uint kvq_qjl_mask[KVQ_MAX_HEAD_DIM / 32u];
void kvq_qjl_load_mask(uint block) {
  for (uint w = 0u; w < KVQ_MAX_HEAD_DIM / 32u; w++) kvq_qjl_mask[w] = 0u;
  for (uint j = 0u; j < pc.outliers; j++) {
    uint c = kvq_io_u8(kvq_qjl_list(block) + j);
    kvq_qjl_mask[c / 32u] |= 1u << (c % 32u);
  }
}

// Channel c of k_out (outer) or k_in of the token whose channel 0 is element x of src.
float kvq_qjl_part(bool outer, uint x, uint c) {
  bool outlier = ((kvq_qjl_mask[c / 32u] >> (c % 32u)) & 1u) != 0u;
  return outlier == outer ? KVQ_READ_ELEMENT(src, pc.input_dtype, x + c) : 0.0;
}

void kvq_encode_unit(uint block, uint unit, uint n, uint x) {
  uint words_in = kvq_qjl_words_per_token(pc.sketch_dim);
  uint t = unit / kvq_qjl_token_words(), w = unit % kvq_qjl_token_words();
  bool outer = w >= words_in;
  if (outer) w -= words_in;
  x += t * pc.kv_heads * pc.head_dim;
  kvq_qjl_load_mask(block);
  // sketch_signs: bit = (sum over channels in order of S[i][c] * y[c], each product and sum
  // rounded on its own) > 0; a token's words are its own (layout.h), so no atomics are needed
  uint bits = 0u;
  for (uint b = 0u; b < 32u; b++) {
    precise float p = 0.0;
    for (uint c = 0u; c < pc.head_dim; c++) p = KVQ_FADD(p, KVQ_FMUL(kvq_qjl_sketch(outer, w * 32u + b, c), kvq_qjl_part(outer, x, c)));
    if (p > 0.0) bits |= 1u << b;
  }
  uint rows = outer ? pc.outlier_sketch_dim : pc.sketch_dim;
  pages[(kvq_qjl_signs_at(block, outer) >> 2) + t * kvq_qjl_words_per_token(rows) + w] = bits;
  if (w != 0u) return;
  // norm_f32: squares summed in channel order, then the root. GLSL's sqrt is not correctly rounded,
  // so the stored half may differ by 1 ulp where the fp32 root lies next to an fp16 tie.
  precise float sum = 0.0;
  for (uint c = 0u; c < pc.head_dim; c++) sum = KVQ_FADD(sum, KVQ_FMUL(kvq_qjl_part(outer, x, c), kvq_qjl_part(outer, x, c)));
  kvq_io_put_u16(kvq_qjl_norm_at(block, outer, t), kvq_f32_to_f16_bits(sqrt(sum)));
}

// ---- DEQUANTIZE --------------------------------------------------------------------------------

// qjl_decode: c_d/rows |k_part| (S^T sign(S k_part))_c for the sketch that holds channel c.
float kvq_decode(uint block, uint t, uint c) {
  bool outer = false;
  for (uint j = 0u; j < pc.outliers; j++) outer = outer || kvq_io_u8(kvq_qjl_list(block) + j) == c;
  uint rows = outer ? pc.outlier_sketch_dim : pc.sketch_dim;
  float sum = 0.0;
  for (uint w = 0u; w < rows / 32u; w++) {
    uint bits = kvq_qjl_sign_word(block, outer, rows, t, w);
    // a loop of constant trip count: unrolled, so that it adds nothing to llvmpipe's count
    for (uint b = 0u; b < 32u; b += 4u) sum += dot(kvq_qjl_signs4(bits >> b), kvq_qjl_column4(outer, 32u * w + b, c));
  }
  return uintBitsToFloat(pc.constant_bits) / float(rows) * kvq_qjl_norm(block, outer, t) * sum;
}

// ---- SCORE -------------------------------------------------------------------------------------

// One sketch's part of qjl_dot_page for token t: c_d/rows |k_part| <sign bits, S_part q_part>. As
// on the CPU, S q_in is the prepared S q (from element p of aux) minus the sum over the page's outlier
// channels c of S[i][c] q[c], since the outliers differ from page to page; S_o q_out is that sum
// over S_o alone.
float kvq_qjl_estimate(uint block, bool outer, uint t, uint q, uint p, uint list[KVQ_MAX_OUTLIERS]) {
  uint rows = outer ? pc.outlier_sketch_dim : pc.sketch_dim;
  float dot_signs = 0.0;
  for (uint i = 0u; i < rows; i += 4u) {
    uint bits = kvq_qjl_sign_word(block, outer, rows, t, i / 32u) >> (i % 32u);
    vec4 outlier_part = vec4(0.0);
    for (uint j = 0u; j < pc.outliers; j++) outlier_part += kvq_qjl_column4(outer, i, list[j]) * uintBitsToFloat(src[q + list[j]]);
    vec4 part = outer ? outlier_part
                      : vec4(uintBitsToFloat(aux[p + i]), uintBitsToFloat(aux[p + i + 1u]), uintBitsToFloat(aux[p + i + 2u]),
                             uintBitsToFloat(aux[p + i + 3u])) - outlier_part;
    dot_signs += dot(kvq_qjl_signs4(bits), part);
  }
  return uintBitsToFloat(pc.constant_bits) / float(rows) * kvq_qjl_norm(block, outer, t) * dot_signs;
}

// ---- PREPARE_QUERY and the estimator (shaders/method.glsl: KVQ_PREPARES) --------------------------

#define KVQ_PREPARES

// S q, the query's sketch (qjl_prepare), one row of S per invocation. S is shared by the kv heads.
// Summed in fp32: prepared queries only feed scores (class 3, docs/ACCURACY.md).
uint kvq_prepared_floats() { return pc.sketch_dim; }
void kvq_prepare_unit(uint q, uint h, uint i, uint out_at) {
  float sum = 0.0;
  for (uint c = 0u; c < pc.head_dim; c++) sum += kvq_qjl_sketch(false, i, c) * uintBitsToFloat(src[q + c]);
  dst[out_at + i] = floatBitsToUint(sum);
}

float kvq_score_dot(uint block, uint t, uint q, uint p) {
  uint list[KVQ_MAX_OUTLIERS];
  for (uint j = 0u; j < pc.outliers; j++) list[j] = kvq_io_u8(kvq_qjl_list(block) + j);
  float estimate = kvq_qjl_estimate(block, false, t, q, p, list);
  return pc.outliers > 0u ? estimate + kvq_qjl_estimate(block, true, t, q, p, list) : estimate;
}
