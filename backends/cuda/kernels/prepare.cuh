// PREPARE_QUERY on the GPU (backends/backend.h's kvq_job_prepare): fp32 query rows [rows][head_dim],
// row r of query head r % query_heads (kv head that / (query_heads / kv_heads)) -> prepared[rows][pf],
// pf = kvq_cuda_prepared_floats(s) (core/config.c's kvq_prepared_floats), as the CPU's kvq_cpu_prepare
// and shaders/prepare.comp compute them with the shared functions of core/methods/*.h:
//   QJL        S q, one row of S per thread (kvq_qjl_prepare_row; S is shared by the kv heads)
//   PolarQuant R q (kvq_polar_rotate, fp32: the CPU's floats bit for bit), the block's threads sharing
//              its rows, or the Hadamard form's coordinates and butterflies, in `prepared` itself
//              (kvq_cuda_polar_rotate)
//   CQ         the lookup tables <q_g, centroid j of group g> of the row's kv head, one entry per
//              thread (kvq_cq_prepare_entry)
// QJL's and CQ's sums are in kvq_acc: float here, double on the CPU (core/shared_lang.h), so they
// agree within a float dot product's rounding (tests/cuda_kernels states the bound).
//
// Launch: grid (rows), one block per query row, any block size, no dynamic shared memory. Methods that
// prepare nothing (pf 0) write nothing.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_PREPARE_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_PREPARE_CUH

#include "methods.cuh"

#define KVQ_CUDA_PREPARE_THREADS 128u

static inline __host__ __device__ unsigned kvq_cuda_prepared_floats(const kvq_cuda_side &s) {
  switch (s.method) {
  case KVQ_LAYOUT_QJL: return s.sketch_dim;
  case KVQ_LAYOUT_POLAR: return s.head_dim;
  case KVQ_LAYOUT_CQ: return (s.head_dim / s.channels) << s.code_bits;
  default: return 0u;
  }
}

__global__ void __launch_bounds__(KVQ_CUDA_PREPARE_THREADS)
    kvq_cuda_prepare(const kvq_cuda_side s, unsigned query_heads, const float *__restrict__ queries,
                     const float *__restrict__ fixed0, const float *__restrict__ fixed1, float *__restrict__ prepared) {
  const unsigned r = blockIdx.x, d = s.head_dim, pf = kvq_cuda_prepared_floats(s);
  const unsigned h = r % query_heads / (query_heads / s.kv_heads);
  // the query row is input element 0 (kvq_cq_prepare_entry reads it there)
  const kvq_io io_value = {nullptr, queries + static_cast<size_t>(r) * d, KVQ_LAYOUT_F32, fixed0, fixed1, nullptr};
  const kvq_io *io = &io_value;
  float *out = prepared + static_cast<size_t>(r) * pf;
  switch (s.method) {
  case KVQ_LAYOUT_QJL:
    for (unsigned i = threadIdx.x; i < pf; i += blockDim.x) out[i] = kvq_qjl_prepare_row(io, 0u, i, d);
    break;
  case KVQ_LAYOUT_POLAR:
    kvq_cuda_polar_rotate(io, 0u, d, s.rotation, out); // every thread: its barriers are uniform over the block
    break;
  case KVQ_LAYOUT_CQ:
    for (unsigned e = threadIdx.x; e < pf; e += blockDim.x)
      out[e] = kvq_cq_prepare_entry(io, 0u, e >> s.code_bits, e & ((1u << s.code_bits) - 1u), d, s.channels, s.code_bits, h);
    break;
  default: break;
  }
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_PREPARE_CUH
