/* Defaults, configuration checks and memory accounting: what a configuration costs, exactly. */
#include <string.h>

#include "checked.h"
#include "internal.h"
#include "memory_limits.h"

kvq_method_config kvq_method_defaults(kvq_method method, uint32_t head_dim) {
  kvq_method_config m;
  memset(&m, 0, sizeof m);
  m.method = method;
  m.exact.dtype = KVQ_DTYPE_F16;
  /* QJL: the official code's m = 256, k = 8, m_o = 256 at head_dim 128, scaled with head_dim. */
  m.qjl.sketch_dim = 2 * head_dim;
  m.qjl.outlier_count = head_dim / 16;
  m.qjl.outlier_sketch_dim = 2 * head_dim;
  /* Uniform: 2 bits in groups of 32 channels, the value scheme of QJL and KIVI; 16 where 32 does
   * not divide head_dim (every valid head_dim is a multiple of 16). */
  m.uniform.bits = 2;
  m.uniform.group_size = head_dim % 32 == 0 ? 32 : 16;
  /* KIVI: 2 bits, each channel's scale over the whole page. */
  m.kivi.bits = 2;
  m.kivi.group_tokens = 0;
  /* PolarQuant: the paper's L = 4 with 4, 2, 2, 2 bits (3.875 bits per number); fewer levels where
   * 16 does not divide head_dim (every valid head_dim is a multiple of 16, so 4 always fits). */
  m.polar.levels = 4;
  m.polar.bits[0] = 4;
  m.polar.bits[1] = m.polar.bits[2] = m.polar.bits[3] = 2;
  m.polar.rotation = KVQ_ROTATION_DENSE;
  m.polar.codebook = KVQ_CODEBOOK_OFFLINE;
  /* CQ: 4 channels per 8-bit code (2 bits per number), 100 Lloyd iterations. */
  m.cq.channels = 4;
  m.cq.bits = 8;
  m.cq.iterations = 100;
  return m;
}

kvq_status kvq_cache_config_check(const kvq_cache_config *config, char *message, size_t message_size) {
  if (message && message_size) message[0] = 0;
  return kvq_config_validate(config, message, message_size);
}

static void layer_sides(const kvq_layer_config *L, uint32_t P, kvq_side_layout *keys, kvq_side_layout *values) {
  kvq_side_layout_init(keys, &L->keys, P, L->head_dim, L->kv_heads);
  kvq_side_layout_init(values, &L->values, P, L->head_dim, L->kv_heads);
}

static uint64_t matrix_bytes(const kvq_side_layout *s) {
  uint64_t bytes = 0;
  for (int i = 0; i < KVQ_SIDE_FIXED; i++) bytes = kvq_size_add(bytes, kvq_size_mul(kvq_side_fixed_floats(s, i), 4));
  return bytes;
}

kvq_status kvq_cache_config_bytes(const kvq_cache_config *c, uint64_t *bytes) {
  kvq_status st = kvq_config_validate(c, NULL, 0);
  if (st != KVQ_OK) return st;
  if (!bytes) return KVQ_ERROR_INVALID_ARGUMENT;
  /* Every term is bounded by the validated ranges, but their sum and products can pass 2^64 for
   * absurd configurations: accumulated with checked arithmetic (core/checked.h), and such a cache is
   * reported as out of range. The device terms are the sizes core/cache.c allocates. */
  /* host bookkeeping: the free list, page tables (at most twice the pages they hold plus 64 per
   * slot: tables grow by doubling and are released above 64 entries when a sequence is freed) */
  uint64_t total = kvq_size_mul(c->max_pages, 3 * sizeof(uint32_t));
  total = kvq_size_mul_add(c->max_sequences,
                           kvq_size_add(sizeof(kvq_sequence) + 64 * sizeof(uint32_t), kvq_size_mul(c->layer_count, sizeof(kvq_seq_layer))),
                           total);
  for (uint32_t l = 0; l < c->layer_count; l++) {
    kvq_side_layout k, v;
    layer_sides(&c->layers[l], c->page_size, &k, &v);
    total = kvq_size_add(total, kvq_size_add(kvq_pool_bytes(&k, c->max_pages), kvq_pool_bytes(&v, c->max_pages)));
    total = kvq_size_mul_add(2, kvq_ring_bytes(c, &c->layers[l]), total);
    total = kvq_size_mul_add(2, kvq_size_add(matrix_bytes(&k), matrix_bytes(&v)), total); /* device copy and host copy */
  }
  total = kvq_size_add(total, kvq_staging_bytes(c));
  *bytes = total;
  return total == KVQ_SIZE_OVERFLOW ? KVQ_ERROR_OUT_OF_RANGE : KVQ_OK;
}

kvq_status kvq_layer_bits_per_number(const kvq_layer_config *layer, uint32_t page_size, double *key_bits,
                                     double *value_bits) {
  if (!layer || !key_bits || !value_bits) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_cache_config probe = {.layer_count = 1, .layers = layer, .input_dtype = KVQ_DTYPE_F32, .page_size = page_size,
                            .residual_window = 0, .max_pages = 1, .max_sequences = 1};
  kvq_status st = kvq_config_validate(&probe, NULL, 0);
  if (st != KVQ_OK) return st;
  kvq_side_layout k, v;
  layer_sides(layer, page_size, &k, &v);
  const double numbers = (double)page_size * layer->kv_heads * layer->head_dim;
  *key_bits = (double)k.page_bytes * 8.0 / numbers;
  *value_bits = (double)v.page_bytes * 8.0 / numbers;
  return KVQ_OK;
}

kvq_status kvq_cache_memory(const kvq_cache *cache, kvq_memory_report *r) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!r) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_memory: report is NULL");
  memset(r, 0, sizeof *r);
  const kvq_cache_config *c = &cache->config;
  r->pages_total = c->max_pages;
  r->pages_used = c->max_pages - cache->free_count;
  r->sequences_total = c->max_sequences;
  r->sequences_used = cache->live_sequences;
  double key_bits = 0, value_bits = 0, numbers = 0;
  for (uint32_t l = 0; l < c->layer_count; l++) {
    const kvq_layer_storage *ls = &cache->storage[l];
    const uint64_t token_bytes = kvq_token_bytes(c->input_dtype, ls->config.kv_heads, ls->config.head_dim);
    r->page_bytes += ls->side[0].layout.page_bytes + ls->side[1].layout.page_bytes;
    r->window_bytes_total += 2 * (uint64_t)c->max_sequences * cache->ring_capacity * token_bytes;
    for (uint32_t s = 0; s < c->max_sequences; s++)
      if (cache->seqs[s].live)
        r->window_bytes_used += 2 * (uint64_t)(cache->seqs[s].layers[l].tokens - cache->seqs[s].layers[l].ring_start) * token_bytes;
    r->fixed_bytes += matrix_bytes(&ls->side[0].layout) + matrix_bytes(&ls->side[1].layout);
    key_bits += ls->side[0].layout.page_bytes * 8.0;
    value_bits += ls->side[1].layout.page_bytes * 8.0;
    numbers += (double)c->page_size * ls->config.kv_heads * ls->config.head_dim;
  }
  for (int i = 0; i < KVQ_SCRATCH_COUNT; i++) r->scratch_bytes += cache->scratch_size[i];
  r->staging_bytes = (uint64_t)cache->staging_pages * c->page_size;
  {
    uint64_t max_token_bytes = 0;
    for (uint32_t l = 0; l < c->layer_count; l++) {
      uint64_t tb = kvq_token_bytes(c->input_dtype, cache->layers[l].kv_heads, cache->layers[l].head_dim);
      max_token_bytes = tb > max_token_bytes ? tb : max_token_bytes;
    }
    r->staging_bytes *= max_token_bytes;
  }
  r->pages_bytes_total = r->page_bytes * c->max_pages;
  r->pages_bytes_used = r->page_bytes * r->pages_used;
  r->key_bits_per_number = key_bits / numbers;
  r->value_bits_per_number = value_bits / numbers;
  r->bits_per_number = (key_bits + value_bits) / (2 * numbers);
  return KVQ_OK;
}
