/* Method names shared by kvq eval and kvq-bench. */
#include "method_spec.h"

#include <stdlib.h>
#include <string.h>

static int parse_u32(const char *s, uint32_t *out) {
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (!*s || *end || v > 0xffffffffUL) return -1;
  *out = (uint32_t)v;
  return 0;
}

/* Parses one side's spec ("qjl-m256-k8", "uniform-b4-g32", "exact-f16"). */
int kvq_parse_method_spec(const char *spec, size_t len, uint32_t d, int values, kvq_method_config *m) {
  char buf[64];
  if (len >= sizeof buf) return -1;
  memcpy(buf, spec, len);
  buf[len] = 0;
  if (!strncmp(buf, "exact-", 6)) {
    *m = kvq_method_defaults(KVQ_METHOD_EXACT, d);
    if (!strcmp(buf + 6, "f16")) m->exact.dtype = KVQ_DTYPE_F16;
    else if (!strcmp(buf + 6, "bf16")) m->exact.dtype = KVQ_DTYPE_BF16;
    else if (!strcmp(buf + 6, "f32")) m->exact.dtype = KVQ_DTYPE_F32;
    else return -1;
    return 0;
  }
  /* split at '-' in place; no strtok: callers may be inside a strtok loop of their own */
  char *parts[16];
  uint32_t count = 0, next = 1;
  parts[count++] = buf;
  for (char *c = buf; *c && count < 16; c++)
    if (*c == '-') *c = 0, parts[count++] = c + 1;
  char *part = parts[0];
  /* numeric parameters: "<letter><number>" parts, the letters per method */
  const char *letters = NULL;
  uint32_t *fields[3] = {NULL, NULL, NULL};
  if (!strcmp(part, "qjl") && !values) {
    *m = kvq_method_defaults(KVQ_METHOD_QJL, d);
    letters = "mko", fields[0] = &m->qjl.sketch_dim, fields[1] = &m->qjl.outlier_count, fields[2] = &m->qjl.outlier_sketch_dim;
  } else if (!strcmp(part, "kivi")) {
    *m = kvq_method_defaults(KVQ_METHOD_KIVI, d);
    letters = "bt", fields[0] = &m->kivi.bits, fields[1] = &m->kivi.group_tokens;
  } else if (!strcmp(part, "cq")) {
    *m = kvq_method_defaults(KVQ_METHOD_CQ, d);
    letters = "cbi", fields[0] = &m->cq.channels, fields[1] = &m->cq.bits, fields[2] = &m->cq.iterations;
  } else if (!strcmp(part, "uniform")) {
    *m = kvq_method_defaults(KVQ_METHOD_UNIFORM, d);
    letters = "bg", fields[0] = &m->uniform.bits, fields[1] = &m->uniform.group_size;
  } else if (!strcmp(part, "polar")) { /* polar-b4222-hadamard-online: one digit of bits per level */
    *m = kvq_method_defaults(KVQ_METHOD_POLAR, d);
    while (next < count && (part = parts[next++])) {
      if (!strcmp(part, "hadamard")) m->polar.rotation = KVQ_ROTATION_HADAMARD;
      else if (!strcmp(part, "dense")) m->polar.rotation = KVQ_ROTATION_DENSE;
      else if (!strcmp(part, "online")) m->polar.codebook = KVQ_CODEBOOK_ONLINE;
      else if (!strcmp(part, "offline")) m->polar.codebook = KVQ_CODEBOOK_OFFLINE;
      else if (part[0] == 'b' && part[1] && strlen(part + 1) <= KVQ_POLAR_MAX_LEVELS) {
        m->polar.levels = (uint32_t)strlen(part + 1);
        for (uint32_t l = 0; l < m->polar.levels; l++) {
          if (part[1 + l] < '1' || part[1 + l] > '8') return -1;
          m->polar.bits[l] = (uint32_t)(part[1 + l] - '0');
        }
      } else return -1;
    }
    return 0;
  } else {
    return -1;
  }
  while (next < count && (part = parts[next++])) {
    const char *letter = part[0] ? strchr(letters, part[0]) : NULL;
    if (!letter || parse_u32(part + 1, fields[letter - letters]) != 0) return -1;
  }
  return 0;
}

int kvq_parse_layer_spec(const char *spec, size_t len, uint32_t d, kvq_method_config *keys, kvq_method_config *values) {
  const char *slash = memchr(spec, '/', len);
  const size_t key_len = slash ? (size_t)(slash - spec) : len; /* no slash: the same method for both */
  const char *value_spec = slash ? slash + 1 : spec;
  return kvq_parse_method_spec(spec, key_len, d, 0, keys) == 0 &&
                 kvq_parse_method_spec(value_spec, len - (size_t)(value_spec - spec), d, 1, values) == 0
             ? 0
             : -1;
}

int kvq_method_learns(const kvq_method_config *m) {
  return m->method == KVQ_METHOD_CQ || (m->method == KVQ_METHOD_POLAR && m->polar.codebook == KVQ_CODEBOOK_ONLINE);
}
