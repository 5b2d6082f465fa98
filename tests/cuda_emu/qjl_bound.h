// A derived bound on how far the GPU's QJL key estimate (float, kvq_acc) may lie from the CPU's
// (double), shared by the tests that check it: tests/cuda_kernels (SCORE's key dots) and
// tests/cuda_attention (SCORE's QJL page logits, the fused attention's). Header-only C++; include it
// after a kernel header that brings backends/cuda/kernels/methods.cuh.
//
// QJL's estimator (core/methods/qjl.h, kvq_qjl_score; the CPU's qjl_dot_page: the same functions, the
// same order, in double). Both sides get the same floats: the query q, the prepared S q (p_r, the
// CPU's), S and S_o, the page's outlier list O (k channels), sign bits sigma_r = +-1 and fp16 norms
// (exact floats). For one sketch part with n rows (n = m for the inliers, m_o for the outliers), in
// exact arithmetic:
//   A_r = sum_{c in O} S[r][c] q_c                        (the outlier channels' products, in list order)
//   P_r = p_r - A_r (inliers) or A_r (outliers)           (kvq_qjl_query_parts4)
//   T   = sum_r sigma_r P_r                               (the signed sum, rows in order)
//   E   = ((C / n) |k_part|) T                            (kvq_qjl_estimate; C the CPU's double c_d)
//   X   = E_in + E_out                                    (E_out only when k > 0)
// With u = 2^-24 (float) or 2^-53 (double), gamma_j = j u / (1 - j u), and no underflow (Higham,
// Accuracy and Stability, 3.1 and Lemma 3.3: gamma_a + gamma_b + gamma_a gamma_b <= gamma_(a+b)):
//   - A_r, a sum of k products (an FMA each on a GPU, or a product and an add): |err| <= gamma_k M_r,
//     M_r = sum_{c in O} |S[r][c] q_c|;
//   - P_r = p_r - A_r rounds once more: |err| <= gamma_k M_r + u (|p_r| + (1 + gamma_k) M_r)
//     <= gamma_(k+1) R_r, with R_r = |p_r| + M_r (inliers) or M_r (outliers), and |P_r| <= R_r;
//   - T, n signed terms summed from 0 (n - 1 roundings): |err| <= sum_r gamma_(k+1) R_r +
//     gamma_(n-1) (1 + gamma_(k+1)) sum_r R_r <= gamma_(n+k) W, W = sum_r R_r, and |T| <= W;
//   - E: c_d rounded to float (the kernel's, not the CPU's double: 1 rounding on the GPU only), / n,
//     * |k|, * T: at most 4 roundings, |err| <= K (gamma_(n+k) W + gamma_4 (1 + gamma_(n+k)) W) <=
//     gamma_(n+k+4) K W, K = C |k_part| / n;
//   - X = E_in + E_out rounds once: |err| <= sum over the parts of gamma_(n+k+5) K W (the same bound
//     holds for k = 0, where there is one part and no addition).
// So the GPU's float result is within sum_parts gamma_(n+k+5) K W of X, the CPU's double result within
// sum_parts gamma'_(n+k+5) K W (gamma' with 2^-53), and the CPU's result rounded to float (the
// fixture's dots) within u |x| <= u (1 + gamma'_(n+k+5)) sum_parts K W more:
//   |gpu - cpu| <= sum_parts (gamma_(n+k+5) + gamma'_(n+k+5) + u (1 + gamma'_(n+k+5))) K W.
// K uses the fixture's float c_d (|C| <= c_d_float (1 + 2u)); W and K are evaluated in double from
// the same floats, each a sum of fewer than 2^11 non-negative terms (relative error below 2^-40), so
// the bound is evaluated times (1 + 2^-40). It is a worst case (every rounding at its largest, in the
// same direction): the differences seen are far below it, and a kernel that drops one row's term,
// or the outlier part, is off by about K |P_r| or |E_out|, far above it.
//
// qjl_dot_terms returns the three sums the bounds are made of, so that each test adds the roundings
// of its own (qjl_terms_dot_bound: the key dot as above; SCORE multiplies by scale, below).
#ifndef KVQ_TESTS_CUDA_EMU_QJL_BOUND_H
#define KVQ_TESTS_CUDA_EMU_QJL_BOUND_H

#include <cmath>

struct qjl_terms {
  double in_float;  // sum_parts gamma_(n+k+5) K W: the GPU's float estimate from the exact X
  double in_double; // sum_parts gamma'_(n+k+5) K W: the CPU's double estimate from the exact X
  double magnitude; // sum_parts K W, at least |X|
};

static inline double qjl_gamma(double n, double u) { return n * u / (1.0 - n * u); }

// The terms for key token t of the head block at byte `block` (io: the pool and the side's fixed
// arrays), query row q (fp32, head_dim) and its prepared S q p (the CPU's). Evaluated in double from
// the same floats (each a sum of fewer than 2^11 non-negative terms, relative error below 2^-40:
// every term is times 1 + 2^-40).
static inline qjl_terms qjl_dot_terms(const kvq_io *io, const kvq_cuda_side &s, const float *q, const float *p, unsigned block,
                                      unsigned t) {
  const unsigned P = s.page_size, d = s.head_dim, m = s.sketch_dim, mo = s.outlier_sketch_dim, k = s.outliers;
  const double u = std::ldexp(1.0, -24), ud = std::ldexp(1.0, -53), slack = 1.0 + std::ldexp(1.0, -40);
  const double c_d = std::fabs(static_cast<double>(s.qjl_constant)) * (1.0 + 2.0 * u);
  unsigned list[KVQ_MAX_OUTLIERS];
  kvq_qjl_load_list(io, block, P, m, mo, k, list);
  qjl_terms terms = {0.0, 0.0, 0.0};
  for (unsigned outer = 0; outer < (k > 0 ? 2u : 1u); outer++) {
    const unsigned n = outer ? mo : m;
    double W = 0.0;
    for (unsigned r = 0; r < n; r++) {
      double R = outer ? 0.0 : std::fabs(static_cast<double>(p[r]));
      for (unsigned j = 0; j < k; j++) R += std::fabs(static_cast<double>(kvq_qjl_sketch(io, outer, r, list[j], d)) * q[list[j]]);
      W += R;
    }
    const double KW = c_d / n * kvq_qjl_norm(io, block, outer, t, P, m, mo, k) * W * slack;
    const double j = n + k + 5.0;
    terms.in_float += qjl_gamma(j, u) * KW;
    terms.in_double += qjl_gamma(j, ud) * KW;
    terms.magnitude += KW;
  }
  return terms;
}

// The key dot (tests/cuda_kernels): the GPU's float estimate against the CPU's double estimate
// rounded to float (u |x_cpu| <= u (magnitude + in_double) more):
//   |gpu - cpu| <= in_float + in_double + u (magnitude + in_double)
//               = sum_parts (gamma_(n+k+5) + gamma'_(n+k+5) + u (1 + gamma'_(n+k+5))) K W.
static inline double qjl_terms_dot_bound(const qjl_terms &e) {
  const double u = std::ldexp(1.0, -24);
  return e.in_float + e.in_double + u * (e.magnitude + e.in_double);
}

// SCORE's page logit (tests/cuda_attention), logit = scale * dot. The GPU rounds its float estimate
// X_g times the float scale s once to float: fl(s X_g) = s X_g (1 + d1), |d1| <= u. The CPU
// (backends/cpu/cpu_attention.c) multiplies its double estimate X_c by s in double, then rounds to
// float: s X_c (1 + e1)(1 + d2), |e1| <= 2^-53, |d2| <= u. So
//   gpu - cpu = s (X_g - X_c) + s X_g d1 - s X_c ((1 + e1)(1 + d2) - 1),
//   |gpu - cpu| <= s (in_float + in_double) + u s (magnitude + in_float)
//                  + (u + 2^-53 + u 2^-53) s (magnitude + in_double),
// with |X_g - X_c| <= in_float + in_double, |X_g| <= magnitude + in_float, |X_c| <= magnitude +
// in_double (|X| <= magnitude: |T| <= W).
static inline double qjl_terms_logit_bound(const qjl_terms &e, double scale) {
  const double u = std::ldexp(1.0, -24), ud = std::ldexp(1.0, -53), s = std::fabs(scale);
  return s * (e.in_float + e.in_double) + u * s * (e.magnitude + e.in_float) + (u + ud + u * ud) * s * (e.magnitude + e.in_double);
}

#endif // KVQ_TESTS_CUDA_EMU_QJL_BOUND_H
