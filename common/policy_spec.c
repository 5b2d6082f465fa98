/* Token-policy names and budgets (policy_spec.h). */
#include "policy_spec.h"

#include <stdlib.h>
#include <string.h>

int kvq_parse_policy_name(const char *name, size_t len, float default_lambda, kvq_policy_kind *kind, float *lambda) {
  char buf[32];
  if (!name || len >= sizeof buf) return -1;
  memcpy(buf, name, len);
  buf[len] = 0;
  if (!strcmp(buf, "streaming")) *kind = KVQ_POLICY_STREAMING, *lambda = 0.0f;
  else if (!strcmp(buf, "h2o")) *kind = KVQ_POLICY_H2O, *lambda = 0.0f;
  else if (!strcmp(buf, "qhitter")) *kind = KVQ_POLICY_QHITTER, *lambda = default_lambda;
  else if (!strncmp(buf, "qhitter-l", 9)) {
    char *end;
    const double value = strtod(buf + 9, &end);
    if (end == buf + 9 || *end || !(value >= 0.0 && value <= 1.0)) return -1;
    *kind = KVQ_POLICY_QHITTER, *lambda = (float)value;
  } else return -1;
  return 0;
}

kvq_policy_config kvq_policy_for_budget(kvq_policy_kind kind, float lambda, uint32_t budget, uint32_t sinks,
                                        uint32_t recent) {
  kvq_policy_config p = kvq_policy_defaults(kind);
  p.sinks = sinks;
  p.recent = recent;
  /* StreamingLLM has only sinks and a recent window: the budget beyond the sinks is all recent */
  if (kind == KVQ_POLICY_STREAMING && budget > sinks + recent) p.recent = budget - sinks;
  p.heavy = kind != KVQ_POLICY_STREAMING && budget > sinks + recent ? budget - sinks - recent : 0;
  p.heavy_fraction = 0.0f; /* an absolute count: the budget is tokens, not a share */
  p.lambda = lambda;
  return p;
}
