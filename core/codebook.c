#include "codebook.h"

#include <stdlib.h>

#include "detmath.h"
#include "layout.h"

static const double pi = 3.14159265358979323846;

/* sin(2 psi)^n by repeated squaring, in a fixed order. */
static double density(double psi, uint32_t n) {
  double s = kvq_det_sin(2.0 * psi), result = 1.0;
  while (n) {
    if (n & 1u) result = result * s;
    s = s * s;
    n >>= 1;
  }
  return result;
}

/* Simpson's rule with `panels` (even) panels: the integral of psi^moment * density over [a, b]. */
static double integrate(double a, double b, uint32_t n, int moment, uint32_t panels) {
  const double h = (b - a) / panels;
  double sum = 0.0;
  for (uint32_t i = 0; i <= panels; i++) {
    const double x = a + i * h;
    const double w = (i == 0 || i == panels) ? 1.0 : (i % 2 ? 4.0 : 2.0);
    sum = sum + w * (moment ? x : 1.0) * density(x, n);
  }
  return sum * h / 3.0;
}

void kvq_polar_lloyd_max(uint32_t level, uint32_t bits, double *c) {
  const uint32_t K = 1u << bits;
  if (level == 1) {
    for (uint32_t j = 0; j < K; j++) c[j] = (j + 0.5) * 2.0 * pi / K;
    return;
  }
  const uint32_t n = (1u << (level - 1)) - 1u;
  const double top = pi / 2.0;
  for (uint32_t j = 0; j < K; j++) c[j] = (j + 0.5) * top / K;
  for (int iteration = 0; iteration < 200; iteration++) {
    double lo = 0.0;
    for (uint32_t j = 0; j < K; j++) {
      const double hi = j + 1 < K ? (c[j] + c[j + 1]) / 2.0 : top;
      const double m0 = integrate(lo, hi, n, 0, 64), m1 = integrate(lo, hi, n, 1, 64);
      c[j] = m0 > 0.0 ? m1 / m0 : (lo + hi) / 2.0;
      lo = hi;
    }
  }
}

void kvq_polar_fill_level(uint32_t level, uint32_t bits, const double *c, float *table) {
  const uint32_t K = 1u << bits;
  for (uint32_t j = 0; j < K; j++) {
    table[2 * j] = (float)kvq_det_cos(c[j]);
    table[2 * j + 1] = (float)kvq_det_sin(c[j]);
  }
  float *boundaries = table + 2 * K;
  for (uint32_t j = 0; j < 2 * K; j++) boundaries[j] = 0.0f;
  if (level == 1) return;
  for (uint32_t j = 0; j + 1 < K; j++) {
    const double beta = (c[j] + c[j + 1]) / 2.0, cb = kvq_det_cos(beta), sb = kvq_det_sin(beta);
    boundaries[2 * j] = (float)(cb * cb);
    boundaries[2 * j + 1] = (float)(sb * sb);
  }
}

void kvq_polar_offline_tables(uint32_t levels, uint32_t level_bits, float *tables) {
  double c[1u << KVQ_MAX_POLAR_BITS];
  for (uint32_t l = 1; l <= levels; l++) {
    const uint32_t bits = kvq_polar_level_bits(level_bits, l);
    kvq_polar_lloyd_max(l, bits, c);
    kvq_polar_fill_level(l, bits, c, tables + kvq_polar_table_level_offset(level_bits, l));
  }
}
