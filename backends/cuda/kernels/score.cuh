// SCORE on the GPU (backends/backend.h, kvq_job_attention), every sequence of the batch in one launch:
// the logit of query row r, query head h against slot t of each sequence, scaled, or -inf where the
// slot is masked (a dead token, or one in the row's future under the causal mask: core/gpu_attention.h,
// kvq_gpu_visible), into scores[score_offset + (r * query_heads + h) * n + t] (n = the sequence's
// quantized + window slots). As shaders/score.comp and the CPU's SCORE (backends/cpu/cpu_attention.c):
//   quantized slots  the method's q.k (kvq_cuda_key_dot, key_dots.cuh: QJL's estimator, PolarQuant
//                    against R q, CQ's lookup tables, the decoded key for EXACT, UNIFORM, KIVI)
//   window slots     q dotted with the ring's token (the window dtype converted exactly)
// summed in kvq_acc (float), then times scale (one float product). Nothing else of scores is written.
//
// Launch (attention.cuh): kvq_cuda_score<<<plan.units[KVQ_PLAN_SCORE], KVQ_CUDA_ATTENTION_THREADS, 0>>>(
//   a, meta, key_pages, key_fixed0, key_fixed1, key_ring, queries, prepared, scores)
//   a           kvq_cuda_attention: side = the keys' layout, query_heads, alive_words, window_dtype, scale
//   meta        the job's metadata words (kvq_gpu_pack_attention)
//   key_pages   the keys' page pool, 32-bit words; key_fixed0/1 the keys' fixed fp32 arrays (or null)
//   key_ring    the keys' ring, elements of window_dtype (may be null when no sequence has a window)
//   queries     fp32 [rows][query_heads][head_dim]
//   prepared    fp32 [rows][query_heads][kvq_cuda_prepared_floats(keys)]: PREPARE_QUERY's output for
//               QJL, PolarQuant and CQ keys; null for the others
//   scores      fp32, written as above
// A thread per logit (r, h, t) of its sequence, t fastest (KVQ_PLAN_SCORE: 64 logits per block).
#ifndef KVQ_BACKENDS_CUDA_KERNELS_SCORE_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_SCORE_CUH

#include "attention.cuh"
#include "key_dots.cuh"

__global__ void __launch_bounds__(KVQ_CUDA_ATTENTION_THREADS)
    kvq_cuda_score(const kvq_cuda_attention a, const unsigned *__restrict__ meta, const unsigned *__restrict__ pages,
                   const float *__restrict__ fixed0, const float *__restrict__ fixed1, const void *__restrict__ ring,
                   const float *__restrict__ queries, const float *__restrict__ prepared, float *__restrict__ scores) {
  const unsigned wg = kvq_cuda_workgroup(), seq = kvq_gpu_locate(meta, KVQ_PLAN_SCORE, wg);
  if (seq == meta[KVQ_META_SEQS]) return; // past the batch's last unit (no barrier in this kernel)
  const unsigned id = kvq_gpu_unit(meta, KVQ_PLAN_SCORE, seq, wg) * KVQ_CUDA_ATTENTION_THREADS + threadIdx.x;
  const unsigned n = kvq_gpu_seq_tokens(meta, seq), H = a.query_heads, d = a.side.head_dim, P = a.side.page_size;
  if (n == 0) return;
  const unsigned t = id % n, h = id / n % H, r = id / n / H;
  if (r >= kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT)) return; // the last block's spare threads
  float *out = scores + kvq_gpu_seq(meta, seq, KVQ_SEQ_SCORE_OFFSET) + (static_cast<size_t>(r) * H + h) * n + t;
  if (kvq_gpu_visible(meta, seq, r, t, P, a.alive_words) == 0u) {
    *out = -INFINITY;
    return;
  }
  const unsigned kvh = kvq_cuda_kv_head(a, h);
  const size_t row = static_cast<size_t>(kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_FIRST) + r) * H + h;
  const float *q = queries + row * d;
  kvq_acc dot = KVQ_ACC(0.0f);
  if (t < kvq_gpu_seq(meta, seq, KVQ_SEQ_QUANTIZED)) {
    // scoring only reads the pool (as key_dots.cuh): the query row is input element 0
    const kvq_io io_value = {const_cast<unsigned *>(pages), q, KVQ_LAYOUT_F32, fixed0, fixed1,
                             prepared ? prepared + row * kvq_cuda_prepared_floats(a.side) : nullptr};
    dot = kvq_cuda_key_dot(&io_value, a.side, kvq_cuda_slot_block(a, meta, seq, t, kvh), kvh, t % P);
  } else {
    for (unsigned c = 0; c < d; c++) dot += KVQ_ACC(q[c]) * KVQ_ACC(kvq_cuda_window_value(a, meta, ring, seq, t, kvh, c));
  }
  *out = static_cast<float>(dot) * a.scale;
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_SCORE_CUH
