/*
 * Deterministic double-precision math for everything that must be reproducible bit for bit on any
 * IEEE 754 machine: built only from +, -, *, / and sqrt (all correctly rounded by IEEE 754), in a
 * fixed order, never from the C library's log/exp/cos whose results differ between libraries.
 * Requires -ffp-contract=off (set for all kvq code by the build).
 */
#ifndef KVQ_CORE_DETMATH_H
#define KVQ_CORE_DETMATH_H

#include <stdint.h>

/* Natural logarithm of a positive normal double; see detmath.c for the exact evaluation order. */
double kvq_det_log(double x);

/* sqrt(pi) * Gamma((d+1)/2) / (sqrt(d) * Gamma(d/2)) for even d >= 2: the constant that makes the
 * QJL estimator exactly unbiased for sketch rows uniform on the sphere of radius sqrt(d). */
double kvq_qjl_unbiased_constant(uint32_t d);

/* sin and cos of |x| <= 2 pi by their Taylor series (30 terms, Horner from the highest term).
 * Accurate to about 1e-14 absolute, and identical on every IEEE 754 machine. */
double kvq_det_sin(double x);
double kvq_det_cos(double x);

#endif
