/* Driving a cache from the records of a golden file (shared by writing and checking). */
#ifndef KVQ_TOOLS_GOLDEN_REPLAY_H
#define KVQ_TOOLS_GOLDEN_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "cases.h"
#include "container.h"
#include "kvq/kvq.h"

/* Everything a golden file describes, parsed. Arrays point into the golden_file records except
 * those marked owned. */
typedef struct golden_inputs {
  kvq_cache_config config;
  kvq_layer_config *layers;       /* owned */
  const uint32_t *schedule;       /* 4 per step */
  uint64_t steps;
  const uint32_t *sequences;      /* (first, length) per sequence */
  const uint8_t *keys[GOLDEN_MAX_LAYERS], *values[GOLDEN_MAX_LAYERS]; /* input dtype streams */
  float *keys_f32[GOLDEN_MAX_LAYERS], *values_f32[GOLDEN_MAX_LAYERS]; /* owned: the same as fp32 */
  const uint8_t *codebooks;       /* a codebook file (kvq_codebooks_save) loaded before appending, or NULL */
  uint64_t codebooks_bytes;
  const float *stream_queries[GOLDEN_MAX_LAYERS]; /* queries of every token (attend steps), or NULL */
} golden_inputs;

/* Parses the records; on failure writes why. */
int golden_inputs_parse(const golden_file *g, golden_inputs *in, char *error, size_t error_size);
void golden_inputs_free(golden_inputs *in);

/* Creates a cache on ctx (with the recorded policy, if any), loads the recorded codebooks if any,
 * adds the sequences and applies the schedule. ids[] receives the ids.
 * Returns KVQ_OK or the failing status (with the context's message). */
/* Called before (after = 0) and after (after = 1) every schedule step; a nonzero return stops the
 * replay with KVQ_ERROR_INTERNAL. */
typedef int (*golden_step_hook)(void *arg, kvq_cache *cache, const uint32_t ids[GOLDEN_SEQUENCES], const uint32_t *step,
                                int after);
kvq_status golden_replay(kvq_context *ctx, const golden_inputs *in, kvq_cache **cache, uint32_t ids[GOLDEN_SEQUENCES],
                         golden_step_hook hook, void *arg);

/* Runs one query block (queries [nq][Hq][d]) on a sequence of n tokens: logits and probabilities
 * [nq][Hq][n] through kvq_scores, outputs [nq][Hq][d] through kvq_attention. */
kvq_status golden_run_block(kvq_cache *cache, uint32_t id, uint32_t layer, const kvq_layer_config *L, const float *queries,
                            uint32_t nq, kvq_mask mask, uint32_t n, float *logits, float *probs, float *out);

/* Record names. */
void golden_name(char *out, size_t size, const char *what, int a, int b, int c);

#endif
