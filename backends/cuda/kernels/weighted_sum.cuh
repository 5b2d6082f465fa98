// WEIGHTED_SUM on the GPU (backends/backend.h, kvq_job_attention), every sequence of the batch in one
// launch, as shaders/weighted_sum.comp and shaders/weighted_sum_rotate.comp (the CPU's WEIGHTED_SUM,
// backends/cpu/cpu_attention.c, sums in double):
//
// kvq_cuda_weighted_sum: output row (r, h), channel c = sum over the sequence's slots t of p[t] v_t[c],
// p the row's probabilities (scores after SOFTMAX; slots with p = 0 add nothing), page tokens and
// window tokens summed apart in float and added last, as the CPU adds them. Value tokens: the
// method's decode (kvq_cuda_decode_channel: EXACT, UNIFORM, KIVI, CQ, QJL) or the ring's token in the
// window dtype. Output element ((query_first + r) * query_heads + h) * head_dim + c of `output`.
// PolarQuant (the plan's rotated_sums, KVQ_PLAN_ROTATE) sums pages in its rotated space: coordinate c
// of the rotated page sum (kvq_polar_decode_coord) goes to rotated[] at the same element, the window
// part to output[]; kvq_cuda_rotate then finishes the row.
// Launch (attention.cuh): kvq_cuda_weighted_sum<<<plan.units[KVQ_PLAN_WEIGHTED_SUM], KVQ_CUDA_ATTENTION_THREADS, 0>>>(
//   a, meta, value_pages, value_fixed0, value_fixed1, value_ring, probabilities, output, rotated)
//   a              side = the values' layout, query_heads, alive_words, window_dtype (scale unused)
//   value_pages    the values' page pool (32-bit words); value_fixed0/1 their fixed arrays (or null)
//   value_ring     the values' ring (window_dtype elements; may be null without windows)
//   probabilities  the scores buffer after SOFTMAX (fp32, the sequences' score_offset layout)
//   output         fp32 [rows][query_heads][head_dim]
//   rotated        fp32 of plan.scratch_bytes, indexed as output (only with rotated sums; else null)
// A block per output (r, h, c) of a sequence, c fastest; its threads take every 64th slot and meet in
// kvq_cuda_block_sum.
//
// kvq_cuda_rotate (only with rotated sums, after kvq_cuda_weighted_sum or the fused attention's
// kvq_cuda_flash_combine, flash.cuh, with rotated = scratch + plan.rotated_at): output row (r, h) = its
// rotated page sum (rotated[], head_dim floats) turned back as kvq_polar_unrotate does (the Hadamard
// butterflies run in place in rotated[], which is left overwritten), plus the window part already in
// output[], written over it.
// Launch: kvq_cuda_rotate<<<plan.units[KVQ_PLAN_ROTATE], KVQ_CUDA_ATTENTION_THREADS, 0>>>(
//   a, meta, value_fixed0, value_fixed1, rotated, output)   a thread per output row (r, h), 64 per block.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_WEIGHTED_SUM_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_WEIGHTED_SUM_CUH

#include "attention.cuh"

// Element of output row (r, h) of sequence seq, channel 0.
static inline __device__ size_t kvq_cuda_output_row(const kvq_cuda_attention &a, const unsigned *meta, unsigned seq,
                                                    unsigned r, unsigned h) {
  return (static_cast<size_t>(kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_FIRST) + r) * a.query_heads + h) * a.side.head_dim;
}

__global__ void __launch_bounds__(KVQ_CUDA_ATTENTION_THREADS)
    kvq_cuda_weighted_sum(const kvq_cuda_attention a, const unsigned *__restrict__ meta, const unsigned *__restrict__ pages,
                          const float *__restrict__ fixed0, const float *__restrict__ fixed1, const void *__restrict__ ring,
                          const float *__restrict__ probabilities, float *__restrict__ output, float *__restrict__ rotated) {
  KVQ_SHARED(float, part, KVQ_CUDA_BLOCK_WARPS);
  const kvq_cuda_side &s = a.side;
  const unsigned wg = kvq_cuda_workgroup(), seq = kvq_gpu_locate(meta, KVQ_PLAN_WEIGHTED_SUM, wg);
  if (seq == meta[KVQ_META_SEQS]) return; // uniform over the block, before any barrier
  const unsigned id = kvq_gpu_unit(meta, KVQ_PLAN_WEIGHTED_SUM, seq, wg), d = s.head_dim, H = a.query_heads, P = s.page_size;
  const unsigned c = id % d, h = id / d % H, r = id / d / H;
  if (r >= kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT)) return; // uniform too
  const unsigned n = kvq_gpu_seq_tokens(meta, seq), quantized = kvq_gpu_seq(meta, seq, KVQ_SEQ_QUANTIZED);
  const unsigned kvh = kvq_cuda_kv_head(a, h);
  const float *p = probabilities + kvq_gpu_seq(meta, seq, KVQ_SEQ_SCORE_OFFSET) + (static_cast<size_t>(r) * H + h) * n;
  // decoding only reads the pool (as dequantize.cuh)
  const kvq_io io_value = {const_cast<unsigned *>(pages), nullptr, KVQ_LAYOUT_F32, fixed0, fixed1, nullptr};
  const kvq_io *io = &io_value;
  const bool polar = s.method == KVQ_LAYOUT_POLAR;
  const unsigned tables = polar ? kvq_polar_tables(kvh, s.codebook, s.levels, s.level_bits) : 0u;
  float paged = 0.0f, window = 0.0f;
  for (unsigned t = threadIdx.x; t < quantized; t += KVQ_CUDA_ATTENTION_THREADS) {
    const float w = p[t];
    if (w == 0.0f) continue;
    const unsigned block = kvq_cuda_slot_block(a, meta, seq, t, kvh);
    paged += w * (polar ? kvq_polar_decode_coord(io, block, t % P, c, P, d, s.levels, s.level_bits, tables)
                        : kvq_cuda_decode_channel(io, s, block, kvh, t % P, c));
  }
  for (unsigned t = quantized + threadIdx.x; t < n; t += KVQ_CUDA_ATTENTION_THREADS) {
    const float w = p[t];
    if (w != 0.0f) window += w * kvq_cuda_window_value(a, meta, ring, seq, t, kvh, c);
  }
  paged = kvq_cuda_block_sum(paged, part);
  window = kvq_cuda_block_sum(window, part);
  if (threadIdx.x != 0) return;
  const size_t o = kvq_cuda_output_row(a, meta, seq, r, h) + c;
  if (polar) {
    rotated[o] = paged; // coordinate c of the rotated page sum: kvq_cuda_rotate finishes the row
    output[o] = window;
  } else {
    output[o] = paged + window;
  }
}

__global__ void __launch_bounds__(KVQ_CUDA_ATTENTION_THREADS)
    kvq_cuda_rotate(const kvq_cuda_attention a, const unsigned *__restrict__ meta, const float *__restrict__ fixed0,
                    const float *__restrict__ fixed1, float *__restrict__ rotated, float *__restrict__ output) {
  const unsigned wg = kvq_cuda_workgroup(), seq = kvq_gpu_locate(meta, KVQ_PLAN_ROTATE, wg);
  if (seq == meta[KVQ_META_SEQS]) return; // no barrier in this kernel
  const unsigned id = kvq_gpu_unit(meta, KVQ_PLAN_ROTATE, seq, wg) * KVQ_CUDA_ATTENTION_THREADS + threadIdx.x;
  const unsigned h = id % a.query_heads, r = id / a.query_heads, d = a.side.head_dim;
  if (r >= kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT)) return;
  const size_t o = kvq_cuda_output_row(a, meta, seq, r, h);
  const kvq_io io_value = {nullptr, nullptr, KVQ_LAYOUT_F32, fixed0, fixed1, nullptr};
  // kvq_polar_unrotate's floats with the row's own rotated sum as its scratch (no per-thread arrays):
  // the Hadamard butterflies in place there, then every coordinate
  float *const y = rotated + o;
  if (a.side.rotation != KVQ_LAYOUT_ROTATION_DENSE) kvq_polar_butterflies(y, d);
  for (unsigned c = 0; c < d; c++) output[o + c] = kvq_polar_unrotate_coord(&io_value, y, d, a.side.rotation, c) + output[o + c];
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_WEIGHTED_SUM_CUH
