// The dots of SCORE on the GPU: q.k for every key token of one sequence's pages and every query row,
// before SCORE's scaling and masking (not written yet: docs/CUDA.md). Page i of the sequence is pool
// slot slots[i] and holds tokens [i * page_size, ...) of the n valid ones; query row r belongs to query
// head r % query_heads (kv head that / (query_heads / kv_heads)) and its prepared query is
// prepared[r * pf, ...) (pf = kvq_cuda_prepared_floats, prepare.cuh). dots[r * n + t] = q_r . k_t,
// as the CPU's SCORE computes it before scaling (backends/cpu/cpu_attention.c):
//   QJL        the estimator from the codes (kvq_qjl_score's, as qjl_lut.cuh's kvq_cuda_qjl_score)
//   PolarQuant the rotated key against R q (kvq_polar_score)
//   CQ         the prepared tables' entries of the codes (kvq_cq_score)
//   others     the decoded key (the DEQUANTIZE floats) dotted with q
// summed in kvq_acc (float here, double on the CPU).
//
// Launch: grid (pages, rows), one block per page and query row, any block size (a thread per token),
// no dynamic shared memory.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_KEY_DOTS_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_KEY_DOTS_CUH

#include "prepare.cuh"
#include "qjl_lut.cuh"

#define KVQ_CUDA_KEY_DOTS_THREADS 128u
// At least 12 blocks of 128 threads per SM (1536 threads, 40 registers): without a minimum ptxas aims
// at 32 registers on sm_80 and spills QJL's estimator to get there.
#define KVQ_CUDA_KEY_DOTS_MIN_BLOCKS 12

// q.k of quantized key token t of the head block at byte `block` (kv head h), before scaling, for
// every method but QJL: io->in is the fp32 query row (input element 0), io->prepared its prepared
// query (element 0). The method's score function where it has one, else the decoded key dotted
// with q, in kvq_acc.
static inline __device__ kvq_acc kvq_cuda_key_dot_unsketched(const kvq_io *io, const kvq_cuda_side &s, unsigned block,
                                                             unsigned h, unsigned t) {
  const unsigned d = s.head_dim, P = s.page_size;
  switch (s.method) {
  case KVQ_LAYOUT_POLAR:
    return kvq_polar_score(io, block, t, 0u, P, d, s.levels, s.level_bits, kvq_polar_tables(h, s.codebook, s.levels, s.level_bits));
  case KVQ_LAYOUT_CQ: return kvq_cq_score(io, block, t, 0u, d, s.channels, s.code_bits);
  default: { // EXACT, UNIFORM, KIVI (the three decoders alone: fewer registers than kvq_cuda_decode_channel's switch)
    kvq_acc dot = KVQ_ACC(0.0f);
    for (unsigned c = 0; c < d; c++) {
      float k = 0.0f;
      if (s.method == KVQ_LAYOUT_EXACT) k = kvq_exact_decode(io, block, t, c, d, s.dtype);
      else if (s.method == KVQ_LAYOUT_UNIFORM) k = kvq_uniform_decode(io, block, t, c, P, d, s.bits, s.group);
      else if (s.method == KVQ_LAYOUT_KIVI) k = kvq_kivi_decode(io, block, t, c, P, d, s.bits, s.group);
      dot += KVQ_ACC(kvq_cuda_in(io, c)) * KVQ_ACC(k);
    }
    return dot;
  }
  }
}

// The same for every method, QJL's estimator too (kvq_cuda_qjl_score, qjl_lut.cuh: kvq_qjl_score's
// operations with the outlier list read from the page, no per-thread array; kvq_cuda_key_dots loads
// the list once per block instead). SCORE (score.cuh) calls it; the fused attention (flash.cuh) scores
// QJL through its lookup tables and the other methods through kvq_cuda_key_dot_unsketched.
static inline __device__ kvq_acc kvq_cuda_key_dot(const kvq_io *io, const kvq_cuda_side &s, unsigned block, unsigned h,
                                                  unsigned t) {
  if (s.method == KVQ_LAYOUT_QJL) return kvq_cuda_qjl_score(io, s, block, t);
  return kvq_cuda_key_dot_unsketched(io, s, block, h, t);
}

__global__ void __launch_bounds__(KVQ_CUDA_KEY_DOTS_THREADS, KVQ_CUDA_KEY_DOTS_MIN_BLOCKS)
    kvq_cuda_key_dots(const kvq_cuda_side s, unsigned query_heads, unsigned n, const unsigned *__restrict__ slots,
                      const unsigned *__restrict__ pages, const float *__restrict__ fixed0, const float *__restrict__ fixed1,
                      const float *__restrict__ queries, const float *__restrict__ prepared, float *__restrict__ dots) {
  const unsigned i = blockIdx.x, r = blockIdx.y, d = s.head_dim, P = s.page_size;
  const unsigned h = r % query_heads / (query_heads / s.kv_heads);
  const unsigned block = (slots[i] * s.kv_heads + h) * s.head_bytes;
  const unsigned count = n - i * P < P ? n - i * P : P;
  const float *q = queries + static_cast<size_t>(r) * d;
  // scoring only reads the pool (as dequantize.cuh); the query row is input element 0, its prepared
  // query prepared element 0
  const kvq_io io_value = {const_cast<unsigned *>(pages), q, KVQ_LAYOUT_F32, fixed0, fixed1,
                           prepared + static_cast<size_t>(r) * kvq_cuda_prepared_floats(s)};
  const kvq_io *io = &io_value;
  // QJL: the page's outlier list, loaded once for the block (kvq_qjl_load_list) rather than per thread
  KVQ_SHARED(unsigned, list, KVQ_MAX_OUTLIERS);
  if (s.method == KVQ_LAYOUT_QJL) {
    const unsigned at = kvq_qjl_list_at(block, P, s.sketch_dim, s.outlier_sketch_dim, s.outliers);
    for (unsigned j = threadIdx.x; j < KVQ_MAX_OUTLIERS; j += blockDim.x) list[j] = j < s.outliers ? kvq_io_u8(io, at + j) : 0u;
    __syncthreads(); // uniform over the block
  }
  for (unsigned t = threadIdx.x; t < count; t += blockDim.x)
    dots[static_cast<size_t>(r) * n + i * P + t] =
        s.method == KVQ_LAYOUT_QJL ? kvq_qjl_score_list(io, block, t, 0u, 0u, list, P, d, s.sketch_dim, s.outlier_sketch_dim,
                                                        s.outliers, s.qjl_constant)
                                   : kvq_cuda_key_dot_unsketched(io, s, block, h, t);
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_KEY_DOTS_CUH
