#include "codebook.h"

#include <math.h>
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

/* Cumulative integrals of the density w and of psi * w on a grid of GRID cells over [0, pi/2]
 * (trapezoids, summed in order), so that a bin's moments cost two lookups. */
#define GRID 65536u

typedef struct moments {
  double *m0, *m1; /* GRID + 1 values each */
  double h;
} moments;

static int moments_init(moments *m, uint32_t n) {
  m->m0 = malloc(sizeof(double) * (GRID + 1));
  m->m1 = malloc(sizeof(double) * (GRID + 1));
  if (!m->m0 || !m->m1) return -1;
  m->h = pi / 2.0 / GRID;
  double w_prev = density(0.0, n), x_prev = 0.0;
  m->m0[0] = m->m1[0] = 0.0;
  for (uint32_t i = 1; i <= GRID; i++) {
    const double x = i * m->h, w = density(x, n);
    m->m0[i] = m->m0[i - 1] + (w_prev + w) * m->h / 2.0;
    m->m1[i] = m->m1[i - 1] + (x_prev * w_prev + x * w) * m->h / 2.0;
    w_prev = w;
    x_prev = x;
  }
  return 0;
}

/* A cumulative value at x, linear between grid points. */
static double at(const double *cumulative, double h, double x) {
  const double cell = x / h;
  const uint32_t i = cell <= 0.0 ? 0 : cell >= GRID ? GRID - 1 : (uint32_t)cell;
  return cumulative[i] + (cumulative[i + 1] - cumulative[i]) * (cell - i);
}

int kvq_polar_lloyd_max(uint32_t level, uint32_t bits, double *c) {
  const uint32_t K = 1u << bits;
  if (level == 1) {
    for (uint32_t j = 0; j < K; j++) c[j] = (j + 0.5) * 2.0 * pi / K;
    return 0;
  }
  const uint32_t n = (1u << (level - 1)) - 1u;
  const double top = pi / 2.0;
  for (uint32_t j = 0; j < K; j++) c[j] = (j + 0.5) * top / K;
  moments m;
  if (moments_init(&m, n) != 0) { /* no memory: fail rather than return other tables than documented */
    free(m.m0);
    free(m.m1);
    return -1;
  }
  /* Lloyd's iteration converges linearly, slowly for many bins: stop when no centroid moves by
   * 1e-12, after at most 200000 steps. The sequence is deterministic, so is where it stops. */
  for (int iteration = 0; iteration < 200000; iteration++) {
    double lo = 0.0, moved = 0.0;
    for (uint32_t j = 0; j < K; j++) {
      const double hi = j + 1 < K ? (c[j] + c[j + 1]) / 2.0 : top;
      const double m0 = at(m.m0, m.h, hi) - at(m.m0, m.h, lo), m1 = at(m.m1, m.h, hi) - at(m.m1, m.h, lo);
      const double next = m0 > 0.0 ? m1 / m0 : (lo + hi) / 2.0;
      moved = fabs(next - c[j]) > moved ? fabs(next - c[j]) : moved;
      c[j] = next;
      lo = hi;
    }
    if (moved < 1e-12) break;
  }
  free(m.m0);
  free(m.m1);
  return 0;
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

int kvq_polar_offline_tables(uint32_t levels, uint32_t level_bits, float *tables) {
  double c[1u << KVQ_MAX_POLAR_BITS];
  for (uint32_t l = 1; l <= levels; l++) {
    const uint32_t bits = kvq_polar_level_bits(level_bits, l);
    if (kvq_polar_lloyd_max(l, bits, c) != 0) return -1;
    kvq_polar_fill_level(l, bits, c, tables + kvq_polar_table_level_offset(level_bits, l));
  }
  return 0;
}
