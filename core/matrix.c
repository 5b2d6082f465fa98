#include "matrix.h"

#include <math.h>
#include <stdlib.h>

#include "rng.h"

/*
 * Order of operations (it decides the bits, so it is part of the format):
 *   for j = 0 .. b-1:
 *     norm   = sqrt(sum_{i=j}^{n-1} a[i][j]^2)                        (sum in increasing i)
 *     alpha  = a[j][j] >= 0 ? -norm : norm                            (R[j][j] = alpha)
 *     v      = a[j..n-1][j] with v[0] = a[j][j] - alpha
 *     tau    = 2 / sum_i v[i]^2   (0 if that sum is 0)               (H_j = I - tau v v^T)
 *     for c = j+1 .. b-1: w = sum_i v[i] a[j+i][c]; s = tau * w; a[j+i][c] = a[j+i][c] - s * v[i]
 *   Q = first b columns of I_n; for j = b-1 down to 0 apply H_j the same way to every column of Q;
 *   then negate column j of Q wherever alpha_j < 0, so that diag(R) > 0.
 */
/* col[from..n) -= tau (v . col) v: one Householder reflector, in the documented order. */
static void apply_reflector(const double *v, double tau, uint32_t from, uint32_t n, double *col) {
  double w = 0.0;
  for (uint32_t i = from; i < n; i++) w = w + v[i] * col[i];
  double s = tau * w;
  for (uint32_t i = from; i < n; i++) col[i] = col[i] - s * v[i];
}

void kvq_householder_q(double *a, uint32_t n, uint32_t b, double *q, double *work) {
  double *vs = work;        /* v_j stored in column j of an n x b array, rows j..n-1 */
  double *taus = work + (size_t)n * b;
  double *alpha = taus + b;
  for (uint32_t j = 0; j < b; j++) {
    double *col = a + (size_t)j * n;
    double sum = 0.0;
    for (uint32_t i = j; i < n; i++) sum = sum + col[i] * col[i];
    double norm = sqrt(sum);
    double al = col[j] >= 0.0 ? -norm : norm;
    alpha[j] = al;
    double *v = vs + (size_t)j * n;
    double vv = 0.0;
    for (uint32_t i = j; i < n; i++) {
      v[i] = i == j ? col[j] - al : col[i];
      vv = vv + v[i] * v[i];
    }
    double tau = vv > 0.0 ? 2.0 / vv : 0.0;
    taus[j] = tau;
    for (uint32_t c = j + 1; c < b; c++) apply_reflector(v, tau, j, n, a + (size_t)c * n);
  }
  for (uint32_t c = 0; c < b; c++)
    for (uint32_t i = 0; i < n; i++) q[(size_t)c * n + i] = i == c ? 1.0 : 0.0;
  for (uint32_t jj = b; jj-- > 0;)
    for (uint32_t c = 0; c < b; c++) apply_reflector(vs + (size_t)jj * n, taus[jj], jj, n, q + (size_t)c * n);
  for (uint32_t c = 0; c < b; c++)
    if (alpha[c] < 0.0)
      for (uint32_t i = 0; i < n; i++) q[(size_t)c * n + i] = -q[(size_t)c * n + i];
}

/* Blocks of d orthogonal rows from QR of Gaussian blocks, each row scaled by `scale`. */
static int build_orthogonal(uint64_t seed, uint32_t layer, uint32_t purpose, uint32_t rows, uint32_t d, double scale,
                            float *out) {
  size_t nd = (size_t)d * d;
  double *g = malloc(nd * sizeof *g);
  double *q = malloc(nd * sizeof *q);
  double *work = malloc((nd + 2 * (size_t)d) * sizeof *work);
  if (!g || !q || !work) {
    free(g);
    free(q);
    free(work);
    return -1;
  }
  kvq_rng rng;
  kvq_rng_init(&rng, seed, layer, purpose);
  for (uint32_t first = 0; first < rows; first += d) {
    uint32_t b = rows - first < d ? rows - first : d;
    for (size_t i = 0; i < (size_t)d * b; i++) g[i] = kvq_rng_gaussian(&rng);
    kvq_householder_q(g, d, b, q, work);
    for (uint32_t r = 0; r < b; r++)
      for (uint32_t c = 0; c < d; c++) out[(size_t)(first + r) * d + c] = (float)(scale * q[(size_t)r * d + c]);
  }
  free(g);
  free(q);
  free(work);
  return 0;
}

int kvq_build_sketch(uint64_t seed, uint32_t layer, uint32_t purpose, uint32_t rows, uint32_t d, float *out) {
  return build_orthogonal(seed, layer, purpose, rows, d, sqrt((double)d), out);
}

int kvq_build_rotation(uint64_t seed, uint32_t layer, uint32_t purpose, uint32_t d, float *out) {
  return build_orthogonal(seed, layer, purpose, d, d, 1.0, out);
}

void kvq_build_signs(uint64_t seed, uint32_t layer, uint32_t purpose, uint32_t d, float *out) {
  kvq_rng rng;
  kvq_rng_init(&rng, seed, layer, purpose);
  for (uint32_t i = 0; i < d; i++) out[i] = (kvq_rng_u32(&rng) & 1u) ? -1.0f : 1.0f;
}
