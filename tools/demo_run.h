/*
 * One row of `kvq demo`: every sentence embedded by the sentence encoder (model/use.h) with its
 * attention computed either by the plain C reference (method NULL) or by kvq with one method, on
 * several threads (each with its own kvq context and cache, as docs/API.md asks: a context is
 * single-threaded), plus the layers' attention-score error against exact attention on the same
 * inputs.
 */
#ifndef KVQ_TOOLS_DEMO_RUN_H
#define KVQ_TOOLS_DEMO_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "use.h"

typedef struct demo_sentences {
  int32_t **ids;  /* count token id arrays (kvq_use_tokenize), borrowed */
  size_t *counts;
  uint32_t count;
} demo_sentences;

/* Calibration K/V per layer ([tokens][4][head_dim] fp32, borrowed), for methods that learn codebooks. */
typedef struct demo_calibration {
  const float *keys[KVQ_USE_LAYERS], *values[KVQ_USE_LAYERS];
  uint32_t tokens[KVQ_USE_LAYERS];
} demo_calibration;

typedef struct demo_row {
  float *embeddings;         /* [count][KVQ_USE_EMBEDDING_DIM], owned (demo_row_free) */
  double bytes_per_token;    /* kvq's pages, both layers, keys and values (0 for the reference); a
                                policy's rows: times kept_share */
  double bits_per_number;    /* keys and values, side data and padding included; times kept_share */
  double kept_share;         /* of the tokens appended, those attention covered (1 without a policy) */
  double score_error;        /* mean over (token, head, layer) of max_j |p^_j - p_j| */
  double seconds;            /* wall time of the row, codebook learning included */
  double learn_seconds;      /* of which learning codebooks */
} demo_row;

/*
 * Embeds every sentence. `row_name`: NULL for the plain C reference, else a kvq eval method name
 * applied to both layers, or METHOD@POLICY with the policy keeping `budget` tokens of each layer of
 * a sentence (demo_policy.h). `threads` workers (>= 1). *done is advanced (atomically) sentence by
 * sentence so that another thread can show progress. Returns 0, or -1 with a message in `error`
 * and *row empty.
 */
int demo_run(const kvq_use_model *model, const demo_sentences *sentences, const char *row_name, uint32_t budget,
             kvq_backend_kind backend, const demo_calibration *calibration, uint32_t threads,
             volatile uint32_t *done, demo_row *row, char *error, size_t error_size);

void demo_row_free(demo_row *row);

#endif
