#include "th_configs.h"

#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

kvq_method_config th_qjl(uint32_t m, uint32_t k, uint32_t m_o) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_QJL, 128);
  c.qjl = (kvq_qjl_config){m, k, m_o};
  return c;
}

kvq_method_config th_uniform(uint32_t bits, uint32_t group) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_UNIFORM, 128);
  c.uniform = (kvq_uniform_config){bits, group};
  return c;
}

kvq_method_config th_kivi(uint32_t bits, uint32_t group_tokens) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_KIVI, 128);
  c.kivi = (kvq_kivi_config){bits, group_tokens};
  return c;
}

kvq_method_config th_cq(uint32_t channels, uint32_t bits) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_CQ, 128);
  c.cq.channels = channels;
  c.cq.bits = bits;
  return c;
}

kvq_method_config th_polar(kvq_rotation rotation) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_POLAR, 128);
  c.polar.levels = 3;
  c.polar.bits[0] = 3, c.polar.bits[1] = 2, c.polar.bits[2] = 2;
  c.polar.rotation = rotation;
  c.polar.codebook = KVQ_CODEBOOK_OFFLINE;
  return c;
}

kvq_method_config th_exact(kvq_dtype dtype) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_EXACT, 128);
  c.exact.dtype = dtype;
  return c;
}

kvq_layer_config th_layer(uint32_t hq, uint32_t hkv, uint32_t d, kvq_method_config keys, kvq_method_config values) {
  return (kvq_layer_config){.query_heads = hq, .kv_heads = hkv, .head_dim = d, .keys = keys, .values = values};
}

void th_remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      remove(path);
    }
  closedir(d);
  rmdir(dir);
}
