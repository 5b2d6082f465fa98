/*
 * Random matrices built on the host in double precision and rounded once to fp32, reproducibly
 * (rng.h, detmath.h): every backend receives the same bytes, and golden files carry their SHA-256.
 */
#ifndef KVQ_CORE_MATRIX_H
#define KVQ_CORE_MATRIX_H

#include <stdint.h>

/*
 * Householder QR of the n x b column-major matrix `a` (n >= b; destroyed). Writes the n x b factor
 * Q (column-major) with orthonormal columns, signs fixed so that diag(R) > 0, i.e. the unique QR
 * with a positive diagonal. `work` holds at least n * b + 2 * b doubles. See matrix.c for the order.
 */
void kvq_householder_q(double *a, uint32_t n, uint32_t b, double *q, double *work);

/*
 * The rows x d sketch matrix of stream (seed, layer, purpose), row-major fp32 into `out`:
 * rows are built in blocks of d (the last block may be shorter); for each block of b rows, a d x b
 * matrix G is filled column by column with consecutive Gaussian draws (column i of G becomes row i of
 * the block), Q is its QR factor with diag(R) > 0, and row i = (float)(sqrt(d) * Q[:, i]).
 * Every block is therefore a set of orthogonal rows of norm sqrt(d), each uniform on that sphere.
 * Returns 0, or -1 when memory for the work arrays cannot be allocated.
 */
int kvq_build_sketch(uint64_t seed, uint32_t layer, uint32_t purpose, uint32_t rows, uint32_t d, float *out);

/* A d x d random orthogonal matrix of stream (seed, layer, purpose): the sketch construction above
 * with rows = d and row i = (float)Q[:, i] (orthonormal rows). Returns 0 or -1 (no memory). */
int kvq_build_rotation(uint64_t seed, uint32_t layer, uint32_t purpose, uint32_t d, float *out);

/* d random signs of stream (seed, layer, purpose): +1.0f or -1.0f, -1 when bit 0 of word i is 1. */
void kvq_build_signs(uint64_t seed, uint32_t layer, uint32_t purpose, uint32_t d, float *out);

#endif
