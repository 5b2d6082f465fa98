// Decoding keys and values of the fused attention (flash.cuh) by runs of channels: what the channels
// of a run share (the token's address, its code word, its parameter words) read once, the stored
// values in 16-byte loads, fp16 converted by the hardware (kvq_f16_read, core/halfconv.h), instead
// of kvq_cuda_decode_channel's addressing, loads and method switch per channel. The floats are
// kvq_cuda_decode_channel's, bit for bit: the same shared functions of core/methods/*.h turn the
// same stored bits into values (kvq_uniform_read_value, kvq_kivi_code_at's field), only the loads
// are gathered. So every sum over them is the same as before in the same order.
//
// Runs exist for EXACT (every dtype) and for UNIFORM and KIVI with 1, 2, 4 or 8 bits, where a run of
// 8 channels of a token lies in one code word (two at 8 bits): d is a multiple of 16
// (KVQ_HEAD_DIM_MULTIPLE) and a run starts at a multiple of 8, so its 8 b bits start at a multiple
// of 8 b within the token-major packed codes (core/layout.h). 3-bit codes straddle words: those
// layouts, QJL, PolarQuant and CQ decode per channel (kvq_cuda_decodes_runs false).
#ifndef KVQ_BACKENDS_CUDA_KERNELS_RUNS_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_RUNS_CUH

#include <stdint.h>

#include "methods.cuh"

#define KVQ_CUDA_RUN 8u

// Words w .. w + 3 of the pool: one 16-byte load where they are 16-byte aligned (every head block
// is, core/layout.h's KVQ_PAGE_ALIGN, and the pool is a cudaMalloc'd buffer), else four.
static inline __device__ void kvq_cuda_load_quad(const unsigned *page, unsigned w, unsigned (&out)[4]) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(page + w) & 15u) == 0u) {
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(page + w));
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    return;
  }
#endif
  for (unsigned i = 0; i < 4u; i++) out[i] = page[w + i];
}

static inline __host__ __device__ bool kvq_cuda_decodes_runs(const kvq_cuda_side &s) {
  if (s.method == KVQ_LAYOUT_EXACT) return true;
  return (s.method == KVQ_LAYOUT_UNIFORM || s.method == KVQ_LAYOUT_KIVI) && s.bits != 3u;
}

// Channels c0 .. c0 + 7 (c0 a multiple of 8) of token t of the head block at byte `block`, where
// kvq_cuda_decodes_runs(s): v[j] = kvq_cuda_decode_channel(io, s, block, h, t, c0 + j).
static inline __device__ void kvq_cuda_decode_run(const kvq_io *io, const kvq_cuda_side &s, unsigned block, unsigned t, unsigned c0,
                                                  float (&v)[KVQ_CUDA_RUN]) {
  const unsigned d = s.head_dim, P = s.page_size;
  if (s.method == KVQ_LAYOUT_EXACT) {
    unsigned w[4];
    const unsigned at = (block + kvq_exact_offset(d, s.dtype, t, c0)) >> 2u;
    kvq_cuda_load_quad(io->page, at, w);
    if (s.dtype == KVQ_LAYOUT_F32) {
      unsigned w1[4];
      kvq_cuda_load_quad(io->page, at + 4u, w1);
      KVQ_UNROLL
      for (unsigned j = 0; j < 4u; j++) v[j] = kvq_bits_to_f32(w[j]), v[4u + j] = kvq_bits_to_f32(w1[j]);
    } else if (s.dtype == KVQ_LAYOUT_F16) {
      KVQ_UNROLL
      for (unsigned j = 0; j < 4u; j++) v[2u * j] = kvq_f16_read(w[j] & 0xffffu), v[2u * j + 1u] = kvq_f16_read(w[j] >> 16);
    } else {
      KVQ_UNROLL
      for (unsigned j = 0; j < 4u; j++) v[2u * j] = kvq_bf16_bits_to_f32(w[j]), v[2u * j + 1u] = kvq_bf16_bits_to_f32(w[j] >> 16);
    }
    return;
  }
  // UNIFORM / KIVI: the run's codes from bit (t d + c0) b of the packed array at the block's start
  const unsigned b = s.bits, first = (t * d + c0) * b, word = (block >> 2u) + (first >> 5u);
  const unsigned lo = io->page[word] >> (first & 31u), hi = b == 8u ? io->page[word + 1u] : 0u;
  if (s.method == KVQ_LAYOUT_UNIFORM) { // a parameter word per 2^group_log2 >= 4 channels
    const unsigned glog2 = kvq_log2_pow2(s.group), params = kvq_uniform_token_params(block, t, P, d, b, s.group);
    unsigned pw = io->page[params + (c0 >> glog2)];
    KVQ_UNROLL
    for (unsigned j = 0; j < KVQ_CUDA_RUN; j++) {
      if (j != 0u && ((c0 + j) & (s.group - 1u)) == 0u) pw = io->page[params + ((c0 + j) >> glog2)];
      const unsigned code = static_cast<unsigned>(kvq_kivi_code_at(j < 4u || b != 8u ? lo : hi, j < 4u || b != 8u ? j : j - 4u, b));
      v[j] = kvq_uniform_read_value(pw, code);
    }
  } else { // KIVI: a parameter word per channel of the token's group
    const unsigned params = kvq_kivi_token_params(block, t, P, d, b, s.group) + c0;
    KVQ_UNROLL
    for (unsigned j = 0; j < KVQ_CUDA_RUN; j++) {
      const unsigned code = static_cast<unsigned>(kvq_kivi_code_at(j < 4u || b != 8u ? lo : hi, j < 4u || b != 8u ? j : j - 4u, b));
      v[j] = kvq_uniform_read_value(io->page[params + j], code);
    }
  }
}

// Channels c and c + 1 (c even) of token t, where kvq_cuda_decodes_runs(s): v0, v1 =
// kvq_cuda_decode_channel(io, s, block, h, t, c) and (.., c + 1). For the value pass, where a thread
// sums a channel pair: the pair's two fp16 / bf16 values are one word, its two codes one field of
// 2 b bits of one word (2 b <= 16, starting at a multiple of 2 b), and UNIFORM's pair shares its
// parameter word (G >= 4, c even).
static inline __device__ void kvq_cuda_decode_pair(const kvq_io *io, const kvq_cuda_side &s, unsigned block, unsigned t, unsigned c,
                                                   float &v0, float &v1) {
  const unsigned d = s.head_dim, P = s.page_size;
  if (s.method == KVQ_LAYOUT_EXACT) {
    const unsigned at = (block + kvq_exact_offset(d, s.dtype, t, c)) >> 2u, w = io->page[at];
    if (s.dtype == KVQ_LAYOUT_F32) v0 = kvq_bits_to_f32(w), v1 = kvq_bits_to_f32(io->page[at + 1u]);
    else if (s.dtype == KVQ_LAYOUT_F16) v0 = kvq_f16_read(w & 0xffffu), v1 = kvq_f16_read(w >> 16);
    else v0 = kvq_bf16_bits_to_f32(w), v1 = kvq_bf16_bits_to_f32(w >> 16);
    return;
  }
  const unsigned b = s.bits, first = (t * d + c) * b, codes = io->page[(block >> 2u) + (first >> 5u)] >> (first & 31u);
  const unsigned code0 = static_cast<unsigned>(kvq_kivi_code_at(codes, 0u, b)), code1 = static_cast<unsigned>(kvq_kivi_code_at(codes, 1u, b));
  if (s.method == KVQ_LAYOUT_UNIFORM) {
    const unsigned pw = io->page[kvq_uniform_token_params(block, t, P, d, b, s.group) + (c >> kvq_log2_pow2(s.group))];
    v0 = kvq_uniform_read_value(pw, code0), v1 = kvq_uniform_read_value(pw, code1);
  } else {
    const unsigned params = kvq_kivi_token_params(block, t, P, d, b, s.group) + c;
    v0 = kvq_uniform_read_value(io->page[params], code0), v1 = kvq_uniform_read_value(io->page[params + 1u], code1);
  }
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_RUNS_CUH
