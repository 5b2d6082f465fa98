#include "detmath.h"

#include <math.h>
#include <string.h>

/*
 * ln(x) = e * ln(2) + ln(f), with x = f * 2^e, f in [sqrt(1/2), sqrt(2)) found from the bits;
 * ln(f) = 2 atanh(z), z = (f - 1) / (f + 1), |z| <= 0.1716, by the series
 * 2 z (1 + z^2/3 + z^4/5 + ... + z^26/27) evaluated by Horner from the highest term down.
 * The truncation error is below 1e-20 relative; what matters more is that every step is an IEEE
 * operation in a fixed order, so the result is identical on every conforming machine.
 */
double kvq_det_log(double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  int64_t e = (int64_t)((bits >> 52) & 0x7ff) - 1023;
  bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull; /* f in [1, 2) */
  double f;
  memcpy(&f, &bits, sizeof f);
  if (f > 1.4142135623730951) { /* move f into [sqrt(1/2), sqrt(2)): exact halving */
    f = f * 0.5;
    e = e + 1;
  }
  double z = (f - 1.0) / (f + 1.0);
  double z2 = z * z;
  double series = 1.0 / 27.0;
  for (int k = 12; k >= 0; k--) series = series * z2 + 1.0 / (double)(2 * k + 1);
  const double ln2_hi = 0x1.62e42fee00000p-1; /* ln 2 split so that e * ln2_hi is exact */
  const double ln2_lo = 0x1.a39ef35793c76p-33;
  double ed = (double)e;
  return ed * ln2_hi + (ed * ln2_lo + 2.0 * z * series);
}

double kvq_qjl_unbiased_constant(uint32_t d) {
  /* Gamma((d+1)/2) / Gamma(d/2) = sqrt(pi)/2 * prod_{j = 2, 4, ..., d-2} (j + 1) / j for even d. */
  const double pi = 3.14159265358979323846;
  double ratio = sqrt(pi) / 2.0;
  for (uint32_t j = 2; j + 2 <= d; j += 2) ratio = ratio * (double)(j + 1) / (double)j;
  return sqrt(pi) * ratio / sqrt((double)d);
}

/* sin x = x (1 - x^2/(2*3) (1 - x^2/(4*5) (1 - ...))), the nesting evaluated from k = 30 down. */
double kvq_det_sin(double x) {
  const double x2 = x * x;
  double t = 1.0;
  for (int k = 30; k >= 1; k--) t = 1.0 - x2 / ((double)(2 * k) * (double)(2 * k + 1)) * t;
  return x * t;
}

/* cos x = 1 - x^2/(1*2) (1 - x^2/(3*4) (1 - ...)), likewise. */
double kvq_det_cos(double x) {
  const double x2 = x * x;
  double t = 1.0;
  for (int k = 30; k >= 1; k--) t = 1.0 - x2 / ((double)(2 * k - 1) * (double)(2 * k)) * t;
  return t;
}
