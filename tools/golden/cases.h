/* The golden configuration matrix and how each case is driven (shared by write and check). */
#ifndef KVQ_TOOLS_GOLDEN_CASES_H
#define KVQ_TOOLS_GOLDEN_CASES_H

#include <stdint.h>

#include "kvq/kvq.h"

#define GOLDEN_MAX_LAYERS 2
#define GOLDEN_SEQUENCES 2

typedef struct golden_case {
  const char *name;
  kvq_dtype input;
  uint32_t page_size, window, layer_count;
  kvq_layer_config layers[GOLDEN_MAX_LAYERS];
  uint32_t lengths[GOLDEN_SEQUENCES];
  uint64_t seed;
  /* Token-policy cases: the policy, and the prefill appended at once before decoding token by
   * token with attention (prefill 0: the append-only schedule below). */
  kvq_policy_config policy;
  uint32_t prefill;
} golden_case;

/* A schedule step (sequence, layer, first, count): count tokens from position first appended to
 * the layer; count 0: the sequence is flushed; count GOLDEN_ATTEND | rows: the queries of positions
 * [first, first + rows) attend in the layer (causal), from the stream_queries record. */
#define GOLDEN_ATTEND 0x80000000u

const golden_case *golden_case_get(uint32_t index);
uint32_t golden_case_total(void);

/* The schedule of a case (steps as above). Without a prefill: appends in chunks and flushes.
 * With one: each sequence appends its prefill to every layer and attends to it, then decodes one
 * token at a time (append and attend, layer by layer), the sequences taking turns. */
uint32_t *golden_schedule(const golden_case *c, uint32_t *steps);

#endif
