/*
 * Token-policy rows of `kvq demo` (docs/EVAL.md, "kvq demo"): a row named METHOD@POLICY runs the
 * method with the policy keeping a budget of tokens in each layer of every sentence (model/use.h,
 * kvq_use_kvq_policy; docs/MODEL.md, "Token policies").
 */
#ifndef KVQ_TOOLS_DEMO_POLICY_H
#define KVQ_TOOLS_DEMO_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/kvq.h"

/* Tokens each layer of a sentence keeps under a policy, unless --budget says otherwise. The least
 * budget, 20 (4 sinks and the 16 newest), leaves H2O and Q-Hitter no heavy hitter, so that they
 * would keep what StreamingLLM keeps; 24 gives them 4, and keeps 68% of the tokens of the demo's
 * 400 verses (docs/EVAL.md, "kvq demo"). */
#define DEMO_DEFAULT_BUDGET 24

/*
 * Splits a row name, len bytes of `name`, into its method (copied NUL-terminated to `method`,
 * `method_size` bytes) and its policy for `budget` tokens: "METHOD@streaming", "@h2o", "@qhitter"
 * (lambda 0.5) or "@qhitter-l<lambda>"; a name without '@' has no policy (KEEP_ALL). Returns 0, or
 * -1 with the reason in `error` (an unknown policy, a budget kvq_use_kvq_policy refuses, a method
 * part that is empty or too long).
 */
int demo_policy_parse(const char *name, size_t len, uint32_t budget, char *method, size_t method_size,
                      kvq_policy_config *policy, char *error, size_t error_size);

#endif
