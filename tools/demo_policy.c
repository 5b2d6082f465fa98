/* Token-policy rows of kvq demo (demo_policy.h). */
#include "demo_policy.h"

#include <stdio.h>
#include <string.h>

#include "policy_spec.h"
#include "use.h"

int demo_policy_parse(const char *name, size_t len, uint32_t budget, char *method, size_t method_size,
                      kvq_policy_config *policy, char *error, size_t error_size) {
  const char *at = memchr(name, '@', len);
  const size_t method_len = at ? (size_t)(at - name) : len;
  if (method_len == 0 || method_len >= method_size) {
    snprintf(error, error_size, "\"%.*s\": an empty or too long method name", (int)len, name);
    return -1;
  }
  memcpy(method, name, method_len);
  method[method_len] = 0;
  *policy = (kvq_policy_config){0};
  if (!at) return 0;
  kvq_policy_kind kind;
  float lambda;
  const size_t policy_len = len - method_len - 1;
  if (kvq_parse_policy_name(at + 1, policy_len, kvq_policy_defaults(KVQ_POLICY_QHITTER).lambda, &kind, &lambda) != 0) {
    snprintf(error, error_size, "\"%.*s\": not a policy kvq demo knows (streaming, h2o, qhitter or qhitter-l<lambda>)",
             (int)policy_len, at + 1);
    return -1;
  }
  char message[256];
  if (kvq_use_kvq_policy(kind, lambda, budget, policy, message, sizeof message) != KVQ_OK) {
    snprintf(error, error_size, "%.*s: %s", (int)len, name, message);
    return -1;
  }
  return 0;
}
