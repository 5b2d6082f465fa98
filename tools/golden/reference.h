/*
 * Class-3 reference: attention recomputed in double from page images (and the full-precision
 * window), with a bound, per element, on how far any conforming fp32 implementation may land from
 * it. docs/ACCURACY.md derives the bounds; in short, with u = 2^-24 and gamma(n) = n u / (1 - n u):
 *   logit      |s^ - s| <= gamma(n_ops) A + u |s| + n_ops FLT_MIN, A = the computation with every
 *              term replaced by its absolute value (FLT_MIN terms allow flushed subnormals);
 *   probability p^_t lies in [p_t lo_t / Z_hi, p_t hi_t / Z_lo] (1 +- 2u), hi/lo_t = exp(+-(B_t + e_t)),
 *              e_t = (3 + 2|x_t|) 2^-23 the loosest exp precision among the backends (Vulkan's),
 *              Z_hi/lo = sum_j p_j hi/lo_j (1 +- gamma(n));
 *   output     |o^_c - o_c| <= sum_t Bp_t |v_tc| + sum_t p_t e(v_tc) + gamma(n + 2) sum_t (p_t + Bp_t)|v_tc|
 *              + u |o_c|, e(v) the decode rounding of a value (2u(|min| + code scale) + 2 FLT_MIN for
 *              uniform); every bound also gets 1e-45 so that a zero bound still admits an exact zero.
 * Methods with more steps widen these by what each step can add (reference.c): PolarQuant keys the
 * error of the fp32 rotated query and of the L fp32 products of a decode, PolarQuant values the
 * rotation back (polar_ref.h), CQ values the 2^b products of the by-code sum.
 */
#ifndef KVQ_TOOLS_GOLDEN_REFERENCE_H
#define KVQ_TOOLS_GOLDEN_REFERENCE_H

#include <stdint.h>

#include "core/config.h"
#include "kvq/kvq.h"

typedef struct ref_layer {
  const kvq_layer_config *config;
  kvq_side_layout keys, values;
  const float *fixed[2][KVQ_SIDE_FIXED]; /* per side (keys, values): its fixed arrays (config.h), host copies */
  double qjl_constant;
} ref_layer;

/* One layer of a sequence as the checked cache holds it: the images of its listed pages, and its
 * kept tokens, which are the columns of every result. */
typedef struct ref_sequence {
  const uint8_t *key_pages, *value_pages; /* images of the listed pages, in page-table order */
  uint32_t slots;                  /* page token slots (page e holds slots e P .. e P + P - 1; the last may be partial) */
  uint32_t kept;                   /* kept tokens */
  const uint32_t *kept_slot;       /* per kept token: its page slot, or slots + w for window token w */
  const uint32_t *kept_position;   /* per kept token: its position (ascending) */
  uint32_t positions;              /* tokens appended: causal query i of nq sits at positions - nq + i */
  const float *keys, *values;      /* all tokens as appended, fp32 [positions][kv_heads][head_dim] */
} ref_sequence;

typedef struct ref_result { /* caller-allocated: [nq][Hq][kept] and [nq][Hq][d] */
  double *logit, *logit_bound;
  double *prob, *prob_bound;
  double *out, *out_bound;
} ref_result;

/* Returns 0, or -1 when host memory runs out. */
int ref_attention(const ref_layer *layer, const ref_sequence *seq, const float *queries, uint32_t nq, kvq_mask mask,
                  ref_result *result);

#endif
