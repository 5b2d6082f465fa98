/* Token-policy names and budgets shared by kvq eval and kvq demo (docs/EVAL.md, "Token policies"). */
#ifndef KVQ_COMMON_POLICY_SPEC_H
#define KVQ_COMMON_POLICY_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/kvq.h"

/* "streaming", "h2o", "qhitter" (lambda = default_lambda) or "qhitter-l<lambda>" (0 <= lambda <= 1),
 * len bytes of name: 0 with *kind and *lambda set, or -1 for anything else (nothing written). */
int kvq_parse_policy_name(const char *name, size_t len, float default_lambda, kvq_policy_kind *kind, float *lambda);

/* A policy that keeps `budget` tokens of a sequence: `sinks` first tokens and `recent` newest ones
 * always (recent must already be at least the cache's residual_window + page_size); H2O and
 * Q-Hitter keep the rest of the budget as heavy hitters (an absolute count, heavy_fraction 0), while
 * StreamingLLM, which has no heavy hitters, spends it on a longer recent window. A budget below
 * sinks + recent keeps sinks + recent (heavy 0). */
kvq_policy_config kvq_policy_for_budget(kvq_policy_kind kind, float lambda, uint32_t budget, uint32_t sinks,
                                        uint32_t recent);

#endif
