// SOFTMAX and ACCUMULATE on the GPU (backends/backend.h, kvq_job_attention), every sequence of the
// batch in one launch each, as shaders/softmax.comp and shaders/accumulate.comp (and the CPU's
// SOFTMAX, backends/cpu/cpu_attention.c, in double there).
//
// kvq_cuda_softmax: in place on scores, each row (r, h) of a sequence's n logits (masked entries
// -inf, from SCORE) becomes probabilities: exp(x - max) / sum over the row's unmasked entries, with
// expf and float sums; masked entries become exactly 0 (a row with every entry masked: all 0).
// Launch (attention.cuh): kvq_cuda_softmax<<<plan.units[KVQ_PLAN_SOFTMAX], KVQ_CUDA_ATTENTION_THREADS, 0>>>(
//   a, meta, scores)       a: query_heads (the rest unused); a block per row, its threads take every
//                          64th slot and meet in kvq_cuda_block_max / kvq_cuda_block_sum.
//
// kvq_cuda_accumulate (H2O and Q-Hitter, after SOFTMAX): the sum over a sequence's query rows and
// query heads of the probability of slot t, into accumulate[accumulate_offset + t] (fp32), for every
// slot of every sequence. Nothing else of accumulate is written.
// Launch: kvq_cuda_accumulate<<<plan.units[KVQ_PLAN_ACCUMULATE], KVQ_CUDA_ATTENTION_THREADS, 0>>>(
//   a, meta, scores, accumulate)   a: query_heads; a block per slot, its threads take every 64th row.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_SOFTMAX_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_SOFTMAX_CUH

#include "attention.cuh"

__global__ void __launch_bounds__(KVQ_CUDA_ATTENTION_THREADS)
    kvq_cuda_softmax(const kvq_cuda_attention a, const unsigned *__restrict__ meta, float *__restrict__ scores) {
  KVQ_SHARED(float, part, KVQ_CUDA_BLOCK_WARPS);
  const unsigned wg = kvq_cuda_workgroup(), seq = kvq_gpu_locate(meta, KVQ_PLAN_SOFTMAX, wg);
  if (seq == meta[KVQ_META_SEQS]) return; // uniform over the block, before any barrier
  const unsigned row = kvq_gpu_unit(meta, KVQ_PLAN_SOFTMAX, seq, wg), n = kvq_gpu_seq_tokens(meta, seq);
  if (row >= kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT) * a.query_heads) return; // uniform too
  float *x = scores + kvq_gpu_seq(meta, seq, KVQ_SEQ_SCORE_OFFSET) + static_cast<size_t>(row) * n;
  float mx = -INFINITY;
  for (unsigned t = threadIdx.x; t < n; t += KVQ_CUDA_ATTENTION_THREADS) mx = fmaxf(mx, x[t]);
  mx = kvq_cuda_block_max(mx, part);
  float sum = 0.0f;
  for (unsigned t = threadIdx.x; t < n; t += KVQ_CUDA_ATTENTION_THREADS)
    if (x[t] != -INFINITY) sum += expf(x[t] - mx);
  sum = kvq_cuda_block_sum(sum, part);
  for (unsigned t = threadIdx.x; t < n; t += KVQ_CUDA_ATTENTION_THREADS) x[t] = x[t] == -INFINITY ? 0.0f : expf(x[t] - mx) / sum;
}

__global__ void __launch_bounds__(KVQ_CUDA_ATTENTION_THREADS)
    kvq_cuda_accumulate(const kvq_cuda_attention a, const unsigned *__restrict__ meta, const float *__restrict__ scores,
                        float *__restrict__ accumulate) {
  KVQ_SHARED(float, part, KVQ_CUDA_BLOCK_WARPS);
  const unsigned wg = kvq_cuda_workgroup(), seq = kvq_gpu_locate(meta, KVQ_PLAN_ACCUMULATE, wg);
  if (seq == meta[KVQ_META_SEQS]) return; // uniform over the block
  const unsigned t = kvq_gpu_unit(meta, KVQ_PLAN_ACCUMULATE, seq, wg), n = kvq_gpu_seq_tokens(meta, seq);
  if (t >= n) return; // uniform over the block
  const unsigned rows = kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT) * a.query_heads;
  const float *p = scores + kvq_gpu_seq(meta, seq, KVQ_SEQ_SCORE_OFFSET) + t;
  float sum = 0.0f;
  for (unsigned row = threadIdx.x; row < rows; row += KVQ_CUDA_ATTENTION_THREADS) sum += p[static_cast<size_t>(row) * n];
  sum = kvq_cuda_block_sum(sum, part);
  if (threadIdx.x == 0) accumulate[kvq_gpu_seq(meta, seq, KVQ_SEQ_ACCUMULATE_OFFSET) + t] = sum;
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_SOFTMAX_CUH
