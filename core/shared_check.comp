#version 450
// Build-time check that the headers shared by C, CUDA and GLSL compile as GLSL (core/meson.build),
// with the accessors of core/methods/io.h defined over plain buffers (shaders/common.glsl defines
// them over kvq's bindings).
#extension GL_GOOGLE_include_directive : require
#include "layout.h"
#include "halfconv.h"
#include "quantize_math.h"
#include "gpu_plan.h"

layout(local_size_x = 1) in;
layout(std430, binding = 0) buffer Data { uint data[]; };
layout(std430, binding = 1) buffer Pages { uint pages[]; };
layout(std430, binding = 2) readonly buffer Floats { float floats[]; };

#define KVQ_IO_PARAM
#define KVQ_IO
#define KVQ_IN(i) floats[(i)]
#define KVQ_PAGE(w) pages[(w)]
#define KVQ_PAGE_SET(w, v) pages[(w)] = (v)
#define KVQ_PAGE_OR(w, v) atomicOr(pages[(w)], (v))
#define KVQ_FIXED0(i) floats[1024u + (i)]
#define KVQ_FIXED1(i) floats[2048u + (i)]
#define KVQ_PREPARED(i) floats[4096u + (i)]
#include "core/methods/exact.h"
#include "core/methods/uniform.h"
#include "core/methods/kivi.h"
#include "core/methods/cq.h"
#include "core/methods/qjl.h"
#include "core/methods/polar.h"

void main() {
  uint acc = kvq_exact_head_bytes(data[0], data[1], data[2]) + kvq_exact_offset(data[1], data[2], data[3], data[4]);
  acc += kvq_qjl_head_bytes(data[0], data[1], data[2], data[3]) + kvq_qjl_signs_offset() +
         kvq_qjl_words_per_token(data[1]);
  acc += kvq_uniform_head_bytes(data[0], data[1], data[2], data[3]) + kvq_uniform_code_words(data[0], data[1], data[2]);
  float x = uintBitsToFloat(data[5]);
  acc += kvq_f32_to_f16_bits(x) + kvq_f32_to_bf16_bits(x);
  acc += floatBitsToUint(kvq_f16_bits_to_f32(data[6]) + kvq_bf16_bits_to_f32(data[7]) + kvq_round_f16(x));
  uint params = kvq_uniform_params(x, x + 1.0f, data[8]);
  acc += kvq_uniform_code(x, kvq_uniform_param_min(params), kvq_uniform_param_scale(params), data[8]);
  acc += floatBitsToUint(kvq_uniform_value(x, x, data[9]));
  acc += floatBitsToUint(kvq_hadamard_scale(data[1]) + kvq_polar_pair_dot(x, x, x, x) + kvq_polar_pair_square(x, x));
  acc += kvq_polar_past(x, x, x, x) + kvq_polar_head_bytes(data[0], data[1], data[2], data[3]) +
         kvq_kivi_head_bytes(data[0], data[1], data[2], data[3]) + kvq_cq_head_bytes(data[0], data[1], data[2], data[3]) +
         kvq_polar_table_floats(data[2], data[3]);
  acc += kvq_flash_out_at(data[0], data[1], data[2], data[3], data[4], data[5]) + kvq_flash_passes(data[6]) +
         kvq_flash_sum_at(data[0], data[1], data[2], data[3]) + kvq_flash_prob_at(data[0], data[1], data[2]);
  acc += floatBitsToUint(kvq_sqrt(x) + kvq_distance_step(x, x, x)) + kvq_nearer(data[1], x, x);
  acc += kvq_io_u8(data[2]) + kvq_io_u16(data[2]) + kvq_io_code(data[3], data[4], data[8]);
  kvq_io_put_u16(data[2], acc);
  kvq_io_put_code(data[3], data[4], data[8], acc);
  // every method function (core/methods/)
  kvq_exact_encode_unit(data[0], data[1], data[2], data[3], data[4], data[5]);
  acc += floatBitsToUint(kvq_exact_decode(data[0], data[1], data[2], data[3], data[4]));
  kvq_uniform_encode_unit(data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7]);
  acc += floatBitsToUint(kvq_uniform_decode(data[0], data[1], data[2], data[3], data[4], data[5], data[6]));
  kvq_kivi_encode_unit(data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], data[8]);
  acc += floatBitsToUint(kvq_kivi_decode(data[0], data[1], data[2], data[3], data[4], data[5], data[6]));
  kvq_cq_encode_unit(data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7]);
  acc += floatBitsToUint(kvq_cq_decode(data[0], data[1], data[2], data[3], data[4], data[5], data[6]));
  acc += floatBitsToUint(kvq_cq_prepare_entry(data[0], data[1], data[2], data[3], data[4], data[5], data[6]));
  acc += floatBitsToUint(kvq_cq_score(data[0], data[1], data[2], data[3], data[4], data[5]));
  acc += kvq_cq_decode_group(data[0], data[1], data[2], data[3], data[4], data[5], data[6]);
  // QJL
  float norm2[KVQ_MAX_HEAD_DIM];
  uint chosen[KVQ_MAX_HEAD_DIM / 32u], list[KVQ_MAX_OUTLIERS];
  for (uint c = 0u; c < KVQ_MAX_HEAD_DIM; c++) norm2[c] = kvq_qjl_channel_norm2(data[0], data[1], data[2], c);
  kvq_qjl_choose_outliers(norm2, data[1], data[2], chosen);
  kvq_qjl_put_outliers(data[0], chosen, data[1], data[2], data[3], data[4], data[5]);
  kvq_qjl_load_list(data[0], data[1], data[2], data[3], data[4], list);
  acc += kvq_qjl_is_outlier(data[0], data[1], data[2], data[3], data[4], data[5]);
  kvq_qjl_encode_unit(data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], data[8]);
  acc += floatBitsToUint(kvq_qjl_decode(data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], x));
  acc += floatBitsToUint(kvq_qjl_prepare_row(data[0], data[1], data[2]));
  acc += floatBitsToUint(kvq_qjl_score(data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], data[8], x));
  kvq_acc parts[KVQ_MAX_SKETCH_DIM], parts4[4];
  kvq_qjl_query_parts4(data[0], data[1], data[2], data[3], list, data[4], data[5], parts4);
  parts[0] = parts4[0];
  acc += floatBitsToUint(kvq_qjl_estimate(x, data[1], x, kvq_qjl_signed_dot(data[0], data[1], data[2], parts, data[3], data[4], data[5])));
  // PolarQuant
  float y[KVQ_MAX_HEAD_DIM], z[KVQ_MAX_HEAD_DIM];
  uint tables = kvq_polar_tables(data[0], data[1], data[2], data[3]);
  kvq_polar_rotate(data[0], data[1], data[2], y);
  kvq_polar_butterflies(y, data[1]);
  kvq_polar_unrotate(y, data[1], data[2], z);
  acc += kvq_polar_nearest(x, x, data[3], data[4]) + kvq_polar_boundaries_passed(x, x, data[3], data[4]);
  acc += kvq_polar_level_table(tables, data[1], data[2]) + kvq_polar_parity(data[3]);
  kvq_polar_encode_unit(data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], data[8], tables);
  kvq_polar_decode_token(data[0], data[1], data[2], data[3], data[4], data[5], tables, z);
  acc += floatBitsToUint(kvq_polar_decode_coord(data[0], data[1], data[2], data[3], data[4], data[5], data[6], tables));
  acc += floatBitsToUint(kvq_polar_decode(data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], tables));
  acc += floatBitsToUint(kvq_polar_dot(data[0], z, data[1]) + kvq_polar_score(data[0], data[1], data[2], data[3], data[4], data[5], data[6], tables));
  float run[KVQ_POLAR_RUN];
  kvq_polar_decode_run(data[0], data[1], data[2], data[3], data[4], data[5], data[6], tables, run);
  acc += kvq_polar_run_codes(data[0], data[1], data[2], data[3]) + floatBitsToUint(run[0]);
  data[10] = acc;
}
