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
} golden_case;

const golden_case *golden_case_get(uint32_t index);
uint32_t golden_case_total(void);

/* The append schedule: (sequence, layer, first, count) steps; count 0 = flush the sequence. */
uint32_t *golden_schedule(const golden_case *c, uint32_t *steps);

#endif
