// QJL's key scores on the GPU (core/methods/qjl.h's estimator) in two ways that keep no per-thread
// array (no local memory), both giving what kvq_qjl_score gives within tests/cuda_emu/qjl_bound.h's
// bound:
//   kvq_cuda_qjl_score       one key, a term per sign bit, the outlier list read from the page
//                            (SCORE, score.cuh: a thread per logit); the same operations in the same
//                            order as kvq_qjl_score_part
//   the lookup tables        (the fused attention, flash.cuh: a block of 64 keys of one page segment
//                            scored against each query head of a GQA group) a sketch part's signed
//                            sum sum_i sigma_i P_i (P_i the query's part, sigma_i = +-1 the key's bit
//                            i) taken 8 bits at a time: for each group of 8 rows a table of the 256
//                            signed sums of its 8 parts, built once per (page, query head, 128 rows)
//                            in shared memory, so that a key reads one byte and adds one table entry
//                            per 8 rows instead of 8 terms.
//
// Rounding of the tables (why qjl_bound.h's bound still covers them, derived, not tuned): the bound
// takes T = sum_i sigma_i P_i, n terms, within gamma_(n-1) sum_i |P_i| of its exact value, which holds
// for any order of summation in which no term takes part in more than n - 1 roundings (Higham,
// Accuracy and Stability, 4.2: the error of a sum is at most sum_i |x_i| gamma_(t_i), t_i the
// additions term i goes through). Here a table entry is a float sum of its 8 signed parts (7
// additions: every term at most 7), and the key's sum adds its n / 8 entries one after another from
// 0 (n / 8 additions, the first exact), so no term goes through more than 7 + n / 8 roundings, which
// is at most n - 1 for every sketch dimension kvq allows (multiples of 32: 7 + 4 = 11 <= 31 at n =
// 32). The parts P_i themselves are the per-bit path's (kvq_cuda_qjl_query_part: the same operations
// as kvq_qjl_query_parts4), and the estimate from T the same product. tests/cuda_attention checks
// the fused attention's logits against the CPU within that bound on random sketches.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_QJL_LUT_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_QJL_LUT_CUH

#include <stdint.h>

#include "methods.cuh"

// Sketch rows per table build: 16 groups of 8 rows, 4 sign words of a token (one 16-byte load).
#define KVQ_QJL_LUT_ROWS 128u
#define KVQ_QJL_LUT_GROUPS (KVQ_QJL_LUT_ROWS / 8u)
// A group's 256 entries as four quarters of 64 (entry bits 7 and 6) at a stride of 65 floats, and
// the groups at a stride of 260: the 32 lanes of a warp building (group, quarter) = (lane / 4, lane
// % 4) then store to 32 different banks at each step (bank = 4 group + quarter + entry).
#define KVQ_QJL_LUT_GROUP_STRIDE 260u
#define KVQ_QJL_LUT_FLOATS (KVQ_QJL_LUT_GROUPS * KVQ_QJL_LUT_GROUP_STRIDE)
static inline __host__ __device__ unsigned kvq_cuda_qjl_lut_at(unsigned group, unsigned byte) {
  return group * KVQ_QJL_LUT_GROUP_STRIDE + byte + (byte >> 6);
}

// Row i of a sketch part of the query: the outlier channels' products summed in list order, for the
// inlier sketch (outer = 0) subtracted from the prepared S q (io->prepared, element 0 on) - the
// operations of kvq_qjl_query_parts4 for one row. io->in: the query (element 0 on); list(j): the
// page's outlier channel j < k.
template <class List>
static inline __device__ kvq_acc kvq_cuda_qjl_query_part(const kvq_io *io, unsigned outer, unsigned i, const List &list, unsigned d,
                                                         unsigned k) {
  kvq_acc part = KVQ_ACC(0.0f);
  for (unsigned j = 0; j < k; j++) {
    const unsigned c = list(j);
    part += KVQ_ACC(kvq_qjl_sketch(io, outer, i, c, d)) * KVQ_ACC(kvq_cuda_in(io, c));
  }
  return outer == 0u ? KVQ_ACC(io->prepared[i]) - part : part;
}

// q.k_t by the estimator, a term per bit, for key token t of the head block at byte `block`: io as
// kvq_cuda_key_dot's. kvq_qjl_score's operations in its order, the outlier list read from the page
// where kvq_qjl_score copies it into an array.
static inline __device__ kvq_acc kvq_cuda_qjl_score(const kvq_io *io, const kvq_cuda_side &s, unsigned block, unsigned t) {
  const unsigned P = s.page_size, d = s.head_dim, m = s.sketch_dim, mo = s.outlier_sketch_dim, k = s.outliers;
  const unsigned at = kvq_qjl_list_at(block, P, m, mo, k);
  const auto list = [io, at](unsigned j) { return kvq_io_u8(io, at + j); };
  kvq_acc estimate = KVQ_ACC(0.0f);
  for (unsigned outer = 0; outer < (k > 0u ? 2u : 1u); outer++) {
    const unsigned rows = outer != 0u ? mo : m;
    kvq_acc sum = KVQ_ACC(0.0f);
    for (unsigned w = 0; w < rows / 32u; w++) {
      const unsigned bits = KVQ_PAGE(kvq_qjl_sign_word_at(block, outer, t, w, P, m, mo));
      for (unsigned b = 0; b < 32u; b++) {
        const kvq_acc part = kvq_cuda_qjl_query_part(io, outer, 32u * w + b, list, d, k);
        sum += ((bits >> b) & 1u) != 0u ? part : -part;
      }
    }
    const kvq_acc e = kvq_qjl_estimate(s.qjl_constant, rows, kvq_qjl_norm(io, block, outer, t, P, m, mo, k), sum);
    estimate = outer == 0u ? e : estimate + e;
  }
  return estimate;
}

// Entries v | (0 .. 2^(B+1) - 1) of one group's table: acc (the signed sum of the parts of the
// entry's bits above B) plus -+p[B], ..., -+p[0], bit by bit. One source for every bit (a template
// over the bit, so that p is indexed by constants and stays in registers).
template <int B>
static inline __device__ void kvq_cuda_qjl_lut_fill(float *group, unsigned v, float acc, const float (&p)[8]) {
  if constexpr (B < 0) {
    group[v + (v >> 6)] = acc;
  } else {
    kvq_cuda_qjl_lut_fill<B - 1>(group, v, acc - p[B], p);
    kvq_cuda_qjl_lut_fill<B - 1>(group, v | (1u << B), acc + p[B], p);
  }
}

// Builds the tables of `groups` (<= KVQ_QJL_LUT_GROUPS) groups of 8 rows from parts[0, 8 groups):
// called by every thread of a 64-thread block (lane = threadIdx.x), parts complete in shared memory;
// the caller syncs before reading `lut`. Entry v of group g: sum over b = 7 .. 0 of (bit b of v ?
// parts[8g + b] : -parts[8g + b]), 7 roundings.
static inline __device__ void kvq_cuda_qjl_lut_build(const float *parts, unsigned groups, float *lut) {
  const unsigned lane = threadIdx.x, g = lane / 4u, quarter = lane % 4u;
  if (g >= groups) return;
  float p[8];
  for (unsigned b = 0; b < 8u; b++) p[b] = parts[8u * g + b];
  float acc = (quarter & 2u) != 0u ? p[7] : -p[7];
  acc = (quarter & 1u) != 0u ? acc + p[6] : acc - p[6];
  kvq_cuda_qjl_lut_fill<5>(lut + g * KVQ_QJL_LUT_GROUP_STRIDE, quarter << 6, acc, p);
}

// sum plus the entries of a token's `groups` groups (of 8 rows: byte g % 4 of words[g / 4]), in
// group order, one addition each (a loop of constant trip count: words stays in registers).
static inline __device__ float kvq_cuda_qjl_lut_sum(const float *lut, unsigned groups, const unsigned (&words)[4], float sum) {
  KVQ_UNROLL
  for (unsigned g = 0; g < KVQ_QJL_LUT_GROUPS; g++)
    if (g < groups) sum += lut[kvq_cuda_qjl_lut_at(g, (words[g / 4u] >> (8u * (g % 4u))) & 0xffu)];
  return sum;
}

// Words w .. w + 3 of the page (those below `end`, the rest 0): one 16-byte load where aligned.
static inline __device__ void kvq_cuda_load_words4(const unsigned *page, unsigned w, unsigned end, unsigned (&out)[4]) {
#if defined(__CUDA_ARCH__)
  if (w + 4u <= end && (reinterpret_cast<uintptr_t>(page + w) & 15u) == 0u) {
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(page + w));
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    return;
  }
#endif
  for (unsigned i = 0; i < 4u; i++) out[i] = w + i < end ? page[w + i] : 0u;
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_QJL_LUT_CUH
