// Build-time check that the headers shared by C, CUDA and GLSL compile as CUDA (core/meson.build),
// for every architecture kvq targets, warnings as errors. The accessors of core/methods/io.h are
// defined here as the CUDA backend will define them: a struct of device pointers, 32-bit page words.
#include "core/halfconv.h"
#include "core/layout.h"
#include "core/quantize_math.h"
#include "core/gpu_plan.h"

struct kvq_io {
  unsigned *page;
  const float *in, *fixed0, *fixed1, *prepared;
};
#define KVQ_IO_PARAM const kvq_io *io,
#define KVQ_IO io,
#define KVQ_IN(i) (io->in[(i)])
#define KVQ_PAGE(w) (io->page[(w)])
#define KVQ_PAGE_SET(w, v) (io->page[(w)] = (v))
#if defined(__CUDA_ARCH__)
#define KVQ_PAGE_OR(w, v) atomicOr(&io->page[(w)], (v))
#else
#define KVQ_PAGE_OR(w, v) (io->page[(w)] |= (v))
#endif
#define KVQ_FIXED0(i) (io->fixed0[(i)])
#define KVQ_FIXED1(i) (io->fixed1[(i)])
#define KVQ_PREPARED(i) (io->prepared[(i)])

#include "core/methods/exact.h"
#include "core/methods/uniform.h"
#include "core/methods/kivi.h"
#include "core/methods/cq.h"
#include "core/methods/qjl.h"
#include "core/methods/polar.h"

__global__ void kvq_shared_check(unsigned *data, const float *floats) {
  const kvq_io io_value = {data + 64, floats, floats + 1024, floats + 2048, floats + 4096};
  const kvq_io *io = &io_value;
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
  acc += kvq_f32_to_bits(kvq_sqrt(x) + kvq_distance_step(x, x, x)) + kvq_nearer(data[1], x, x);
  acc += kvq_io_u8(io, data[2]) + kvq_io_u16(io, data[2]) + kvq_io_code(io, data[3], data[4], data[8]);
  kvq_io_put_u16(io, data[2], acc);
  kvq_io_put_code(io, data[3], data[4], data[8], acc);
  // every method function (core/methods/)
  kvq_exact_encode_unit(io, data[0], data[1], data[2], data[3], data[4], data[5]);
  acc += kvq_f32_to_bits(kvq_exact_decode(io, data[0], data[1], data[2], data[3], data[4]));
  kvq_uniform_encode_unit(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7]);
  acc += kvq_f32_to_bits(kvq_uniform_decode(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6]));
  kvq_kivi_encode_unit(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], data[8]);
  acc += kvq_f32_to_bits(kvq_kivi_decode(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6]));
  kvq_cq_encode_unit(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7]);
  acc += kvq_f32_to_bits(kvq_cq_decode(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6]));
  acc += kvq_f32_to_bits(kvq_cq_prepare_entry(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6]));
  acc += kvq_f32_to_bits(kvq_cq_score(io, data[0], data[1], data[2], data[3], data[4], data[5]));
  acc += kvq_cq_decode_group(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6]);
  // QJL
  float norm2[KVQ_MAX_HEAD_DIM];
  unsigned chosen[KVQ_MAX_HEAD_DIM / 32u], list[KVQ_MAX_OUTLIERS];
  for (unsigned c = 0u; c < KVQ_MAX_HEAD_DIM; c++) norm2[c] = kvq_qjl_channel_norm2(io, data[0], data[1], data[2], c);
  kvq_qjl_choose_outliers(norm2, data[1], data[2], chosen);
  kvq_qjl_put_outliers(io, data[0], chosen, data[1], data[2], data[3], data[4], data[5]);
  kvq_qjl_load_list(io, data[0], data[1], data[2], data[3], data[4], list);
  acc += kvq_qjl_is_outlier(io, data[0], data[1], data[2], data[3], data[4], data[5]);
  kvq_qjl_encode_unit(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], data[8]);
  acc += kvq_f32_to_bits(kvq_qjl_decode(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], x));
  acc += kvq_f32_to_bits(kvq_qjl_prepare_row(io, data[0], data[1], data[2]));
  acc += kvq_f32_to_bits(kvq_qjl_score(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], data[8], x));
  kvq_acc parts[KVQ_MAX_SKETCH_DIM], parts4[4];
  kvq_qjl_query_parts4(io, data[0], data[1], data[2], data[3], list, data[4], data[5], parts4);
  parts[0] = parts4[0];
  acc += kvq_f32_to_bits(kvq_qjl_estimate(x, data[1], x, kvq_qjl_signed_dot(io, data[0], data[1], data[2], parts, data[3], data[4], data[5])));
  // PolarQuant
  float y[KVQ_MAX_HEAD_DIM], z[KVQ_MAX_HEAD_DIM];
  unsigned tables = kvq_polar_tables(data[0], data[1], data[2], data[3]);
  kvq_polar_rotate(io, data[0], data[1], data[2], y);
  kvq_polar_butterflies(y, data[1]);
  kvq_polar_unrotate(io, y, data[1], data[2], z);
  acc += kvq_polar_nearest(io, x, x, data[3], data[4]) + kvq_polar_boundaries_passed(io, x, x, data[3], data[4]);
  acc += kvq_polar_level_table(tables, data[1], data[2]) + kvq_polar_parity(data[3]);
  kvq_polar_encode_unit(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], data[8], tables);
  kvq_polar_decode_token(io, data[0], data[1], data[2], data[3], data[4], data[5], tables, z);
  acc += kvq_f32_to_bits(kvq_polar_decode_coord(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], tables));
  acc += kvq_f32_to_bits(kvq_polar_decode(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7], tables));
  acc += kvq_f32_to_bits(kvq_polar_dot(io, data[0], z, data[1]) + kvq_polar_score(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], tables));
  float run[KVQ_POLAR_RUN];
  kvq_polar_decode_run(io, data[0], data[1], data[2], data[3], data[4], data[5], data[6], tables, run);
  acc += kvq_polar_run_codes(io, data[0], data[1], data[2], data[3]) + kvq_f32_to_bits(run[0]);
  data[10] = acc;
}
