/*
 * `kvq eval` (docs/EVAL.md): the options, the data, one row per method (eval_row.c) or per method
 * under a token policy (eval_policy.c), and the exact reference every row is measured against.
 */
#ifndef KVQ_TOOLS_EVAL_H
#define KVQ_TOOLS_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/kvq.h"
#include "progress.h"

typedef struct eval_options {
  const char *keys, *values, *queries; /* .npy paths, all or none */
  uint32_t tokens, query_heads, kv_heads, head_dim, last;
  uint32_t page_size, window;
  uint32_t calibration; /* tokens the codebooks are learned from (the first ones); 0: all but the queries */
  int in_sample;        /* synthetic data: learn from the evaluated tokens instead of other tokens of the model */
  uint32_t budget;      /* token policies: tokens kept; 0: a fifth of the tokens */
  uint32_t sinks, recent;
  float lambda;
  uint64_t seed;
  kvq_mask mask;
  kvq_backend_kind backend;
  const char *methods; /* comma-separated specs, NULL for the default set */
  int json, quiet;
  const char *plot;   /* --plot FILE.png: output error against bits per number, or NULL */
  int queries_scaled; /* --queries-scaled: the queries carry 1/sqrt(d) already; multiply by sqrt(d) */
  progress *progress; /* stderr progress line (progress.h); NULL with --quiet */
} eval_options;

typedef struct eval_data {
  float *k, *v, *q; /* [tokens][kv_heads][d], [tokens][kv_heads][d], [tokens][query_heads][d] */
  void *k_input, *v_input; /* k and v in the input dtype (fp16 files stay fp16 in the cache) */
  float *k_held_out, *v_held_out; /* --held-out: calibration keys and values from another draw, or NULL */
  uint32_t tokens, query_heads, kv_heads, head_dim;
  kvq_dtype dtype;
  const char *source;
  double logit_std, entropy_ratio; /* of the exact attention (eval_logit_spread) */
} eval_data;

/* Exact attention in double for the evaluated queries (the last `last` positions): logits s and
 * probabilities p [last][hq][tokens], outputs o [last][hq][d]; and, for the policy rows, the kept
 * set of H2O run on the exact keys with the same budget (computed on first use). */
typedef struct eval_reference {
  double *s, *p, *o;
  uint32_t *h2o_kept, h2o_count;
  int h2o_ready;
} eval_reference;

typedef struct eval_row {
  char spec[96];
  double key_bits, value_bits, bits;
  uint64_t fixed_bytes, window_tokens;
  uint32_t calibration; /* tokens its codebooks were learned from; 0: none learned */
  double ip_error, score_error_mean, score_error_max, output_error, topk_overlap;
  int has_policy;
  uint32_t kept;        /* policy rows: tokens kept at the end */
  double h2o_overlap;   /* policy rows: overlap with exact H2O's kept set (outside sinks and recent) */
  double kept_mass;     /* policy rows: mean over queries of the exact attention's mass on the kept tokens */
} eval_row;

/* The budget split of a policy row (docs/EVAL.md): sinks, recent window and heavy hitters. */
kvq_policy_config eval_policy(const eval_options *o, kvq_policy_kind kind, float lambda);

/* Reads "KEYS/VALUES" (or one spec for both) into a layer config; -1 with a message on stderr. */
int eval_parse_layer(const char *spec, size_t len, const eval_data *x, kvq_layer_config *layer);

/* Creates the row's cache (with a policy or KEEP_ALL), learns its codebooks from the calibration
 * tokens if it needs any, adds the sequence, and fills the row's size columns. */
int eval_open_cache(kvq_context *ctx, const eval_options *o, const eval_data *x, const kvq_layer_config *layer,
                    const kvq_policy_config *policy, eval_row *row, kvq_cache **cache, uint32_t *seq);

/* Running sums of the error columns over evaluated query rows. */
typedef struct eval_metrics {
  double ip_num, ip_den, score_sum, score_max, out_sum, topk_sum;
  uint64_t rows;
  uint32_t *ia, *ib; /* scratch of `tokens` entries */
  uint8_t *mark;
} eval_metrics;
int eval_metrics_init(eval_metrics *m, uint32_t tokens);
/* One query row (one position, one head) over its `visible` tokens: kvq's logits (NaN where the
 * token was evicted: no estimate) and probabilities (0 there), its output, and the references. */
void eval_metrics_add(eval_metrics *m, const float *logits, const float *probs, const double *s_ref, const double *p_ref,
                      uint32_t visible, const float *out, const double *o_ref, uint32_t d);
void eval_metrics_finish(eval_metrics *m, eval_row *row);

/* One row: a method (all tokens appended, flushed unless there is a window, then the queries). */
int eval_run_row(kvq_context *ctx, const eval_options *o, const eval_data *x, const char *spec, size_t len,
                 const eval_reference *ref, eval_row *row);
/* One row of a method under a token policy ("SPEC@POLICY"): the prefill, then decoding the last
 * positions one token at a time, each query measured at its step. */
int eval_run_policy_row(kvq_context *ctx, const eval_options *o, const eval_data *x, const char *spec, size_t len,
                        eval_reference *ref, eval_row *row);

/* Inputs whose queries already carry the model's 1/sqrt(head_dim) (eval_check.c): the median over
 * the evaluated queries of the exact logits' standard deviation, below which kvq eval warns, and
 * the mean entropy of their attention as a share of log(visible tokens) (1: uniform). */
#define EVAL_FLAT_LOGIT_STD 1.0
int eval_logit_spread(const eval_options *o, const eval_data *x, const eval_reference *ref, double *median_std,
                      double *entropy_ratio);
/* Multiplies every query by sqrt(head_dim) (--queries-scaled). */
void eval_scale_queries(eval_data *x);

#endif
