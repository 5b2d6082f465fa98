/*
 * A priori error bounds of kvq's compressed methods on given keys or values (tests/test_model_bounds.c
 * checks them on the real model's K/V; docs/MODEL.md, "Error bounds per method"). Each bound follows
 * from the method's arithmetic and the input numbers alone (and, for PolarQuant and CQ, the cache's
 * own codebooks), never from what kvq stored.
 */
#ifndef KVQ_TESTS_MODEL_BOUNDS_H
#define KVQ_TESTS_MODEL_BOUNDS_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/kvq.h"

/*
 * The bound of one side (keys or values) of one layer for `tokens` tokens [tokens][heads][d]:
 * group[(t * heads + h) * (d / group_size) + g] bounds ||x^ - x|| over channels g * group_size ..
 * (g + 1) * group_size - 1 of token t, head h (group_size 1: each element; d: the whole head
 * vector). For QJL keys, whose reconstruction is no approximation of the key, it bounds the logit
 * error instead: |s^ - s| <= ||q|| group / sqrt(d), with the stated probability.
 */
typedef struct side_bound {
  uint32_t group_size;
  double *group;
  int probabilistic; /* QJL: holds with probability >= 1 - 2 delta per logit (Lemma 3.5) */
  double qjl_eps;    /* QJL: Lemma 3.5's eps at the delta given */
} side_bound;

/* The fixed arrays of a layer side (PolarQuant's codebook tables, CQ's centroids), read from a saved
 * cache: floats at `data` (inside the saved bytes), `count` of them; NULL when not found. */
const float *saved_fixed_array(const uint8_t *saved, size_t size, uint32_t layer, uint32_t side, uint32_t index,
                               uint64_t *count);

/* Lemma 3.5 of QJL: the eps with m >= (4/3)(1 + eps)/eps^2 log(2/delta), solved for eps. */
double qjl_lemma_eps(uint32_t m, double delta);

/*
 * Computes the bound of `method` on x [tokens][heads][d] (pages of page_size tokens, for KIVI's
 * token groups); fixed: the side's fixed array 1 (PolarQuant's tables, CQ's centroids) or NULL;
 * qjl_delta: the per-sketch failure probability for QJL. Returns 0, or -1 (out of memory, or a
 * method or table it cannot bound) with a message.
 */
int side_bound_compute(const kvq_method_config *method, const float *x, uint32_t tokens, uint32_t heads, uint32_t d,
                       uint32_t page_size, const float *fixed, uint64_t fixed_count, double qjl_delta,
                       side_bound *out, char *error, size_t error_size);

void side_bound_free(side_bound *b);

/* gamma(n) = n u / (1 - n u), u = 2^-24: the relative error of an n-term fp32 sum in any order. */
double gamma_f32(double n);

#endif
