/*
 * Checked size arithmetic, for every size that public-call arguments decide (configurations, tensor
 * shapes, token and query counts). Saturating: a result that does not fit 64 bits is KVQ_SIZE_OVERFLOW
 * (UINT64_MAX), and every operation with an overflowed operand stays overflowed, so a chain of them
 * needs one check at its end. No size kvq can allocate comes near UINT64_MAX, so "at least the limit"
 * is the whole test callers need.
 */
#ifndef KVQ_CORE_CHECKED_H
#define KVQ_CORE_CHECKED_H

#include <stddef.h>
#include <stdint.h>

#define KVQ_SIZE_OVERFLOW UINT64_MAX

/* a * b, or KVQ_SIZE_OVERFLOW. */
static inline uint64_t kvq_size_mul(uint64_t a, uint64_t b) {
  if (a == KVQ_SIZE_OVERFLOW || b == KVQ_SIZE_OVERFLOW) return KVQ_SIZE_OVERFLOW;
  if (a != 0 && b > KVQ_SIZE_OVERFLOW / a) return KVQ_SIZE_OVERFLOW;
  return a * b;
}

/* a + b, or KVQ_SIZE_OVERFLOW. */
static inline uint64_t kvq_size_add(uint64_t a, uint64_t b) {
  return a > KVQ_SIZE_OVERFLOW - b ? KVQ_SIZE_OVERFLOW : a + b;
}

/* a * b * c, or KVQ_SIZE_OVERFLOW. */
static inline uint64_t kvq_size_mul3(uint64_t a, uint64_t b, uint64_t c) { return kvq_size_mul(kvq_size_mul(a, b), c); }

/* a * b + c, or KVQ_SIZE_OVERFLOW. */
static inline uint64_t kvq_size_mul_add(uint64_t a, uint64_t b, uint64_t c) { return kvq_size_add(kvq_size_mul(a, b), c); }

/* Whether `bytes` can be passed to malloc on this host (size_t may be narrower than 64 bits). */
static inline int kvq_size_fits_host(uint64_t bytes) { return bytes != KVQ_SIZE_OVERFLOW && bytes <= (uint64_t)SIZE_MAX; }

#endif /* KVQ_CORE_CHECKED_H */
