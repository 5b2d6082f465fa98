#version 450
// Build-time check that the headers shared by C, CUDA and GLSL compile as GLSL (core/meson.build).
#extension GL_GOOGLE_include_directive : require
#include "layout.h"
#include "halfconv.h"
#include "quantize_math.h"
#include "gpu_plan.h"

layout(local_size_x = 1) in;
layout(std430, binding = 0) buffer Data { uint data[]; };

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
  data[10] = acc;
}
