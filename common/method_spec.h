/* Method names shared by kvq eval, kvq-bench and model/ (docs/EVAL.md, "Method names"). */
#ifndef KVQ_COMMON_METHOD_SPEC_H
#define KVQ_COMMON_METHOD_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/kvq.h"

/* One side's spec ("qjl-m256-k8", "uniform-b4-g32", "polar-b4222-hadamard", "cq-c4-b8") at a
 * head_dim; `values` refuses the key-only QJL. Returns 0, or -1 for a name it cannot read (the
 * parameters are validated later, by kvq_cache_config_check). */
int kvq_parse_method_spec(const char *spec, size_t len, uint32_t d, int values, kvq_method_config *m);

/* "KEYS/VALUES", or one spec for both: 0 or -1. */
int kvq_parse_layer_spec(const char *spec, size_t len, uint32_t d, kvq_method_config *keys, kvq_method_config *values);

/* Whether a method needs learned codebooks (CQ, online PolarQuant). */
int kvq_method_learns(const kvq_method_config *m);

#endif
