// Build-time check that the headers shared by C, CUDA and GLSL compile as CUDA (core/meson.build).
#include "halfconv.h"
#include "layout.h"
#include "quantize_math.h"
#include "gpu_plan.h"

__global__ void kvq_shared_check(unsigned *data) {
  unsigned acc = kvq_exact_head_bytes(data[0], data[1], data[2]) + kvq_qjl_head_bytes(data[0], data[1], data[2], data[3]) +
                 kvq_uniform_head_bytes(data[0], data[1], data[2], data[3]);
  float x = kvq_bits_to_f32(data[5]);
  unsigned params = kvq_uniform_params(x, x + 1.0f, data[8]);
  acc += kvq_uniform_code(x, kvq_uniform_param_min(params), kvq_uniform_param_scale(params), data[8]);
  acc += kvq_f32_to_f16_bits(x) + kvq_f32_to_bf16_bits(x) + kvq_f32_to_bits(kvq_round_f16(x));
  acc += kvq_f32_to_bits(kvq_hadamard_scale(data[1]) + kvq_polar_pair_dot(x, x, x, x) + kvq_polar_pair_square(x, x));
  acc += kvq_polar_past(x, x, x, x) + kvq_polar_head_bytes(data[0], data[1], data[2], data[3]) +
         kvq_kivi_head_bytes(data[0], data[1], data[2], data[3]) + kvq_cq_head_bytes(data[0], data[1], data[2], data[3]);
  acc += kvq_flash_out_at(data[0], data[1], data[2], data[3], data[4], data[5]) + kvq_flash_passes(data[6]) +
         kvq_flash_sum_at(data[0], data[1], data[2], data[3]) + kvq_flash_prob_at(data[0], data[1], data[2]);
  data[10] = acc;
}
