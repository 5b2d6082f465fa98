/* Limits checked before allocation (core/memory_limits.h). */
#include "memory_limits.h"

#include <unistd.h>

#include "checked.h"
#include "internal.h"

uint64_t kvq_pool_bytes(const kvq_side_layout *side, uint32_t max_pages) { return kvq_size_mul(side->page_bytes, max_pages); }

uint64_t kvq_ring_bytes(const kvq_cache_config *config, const kvq_layer_config *layer) {
  const uint64_t ring_capacity = (uint64_t)config->residual_window + config->page_size;
  return kvq_size_mul3(config->max_sequences, ring_capacity,
                       kvq_token_bytes(config->input_dtype, layer->kv_heads, layer->head_dim));
}

uint32_t kvq_staging_pages(const kvq_cache_config *config) {
  return config->max_pages < KVQ_STAGING_PAGES ? config->max_pages : KVQ_STAGING_PAGES;
}

uint64_t kvq_staging_bytes(const kvq_cache_config *config) {
  uint64_t token_bytes = 0; /* the widest layer's */
  for (uint32_t l = 0; l < config->layer_count; l++) {
    const uint64_t tb = kvq_token_bytes(config->input_dtype, config->layers[l].kv_heads, config->layers[l].head_dim);
    token_bytes = tb > token_bytes ? tb : token_bytes;
  }
  return kvq_size_mul3(kvq_staging_pages(config), config->page_size, token_bytes);
}

uint64_t kvq_host_memory_bytes(void) {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return kvq_size_mul((uint64_t)pages, (uint64_t)page);
#endif
  return 0;
}

/* One buffer of the cache: within the largest buffer, and added to the total. */
static kvq_status add_buffer(kvq_context *ctx, uint64_t bytes, const char *what, uint32_t layer, uint64_t *total) {
  const kvq_backend *be = ctx->backend;
  if (bytes == KVQ_SIZE_OVERFLOW || (be->max_buffer_bytes && bytes > be->max_buffer_bytes))
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE,
                    "kvq_cache_create: %s of layer %u would take %s%llu bytes in one buffer; the %s backend's largest is %llu bytes",
                    what, layer, bytes == KVQ_SIZE_OVERFLOW ? "more than " : "", (unsigned long long)bytes, be->ops->name,
                    (unsigned long long)be->max_buffer_bytes);
  *total = kvq_size_add(*total, bytes);
  return KVQ_OK;
}

kvq_status kvq_cache_fits_backend(kvq_context *ctx, const kvq_cache_config *config) {
  const kvq_backend *be = ctx->backend;
  uint64_t total = 0;
  kvq_status st = KVQ_OK;
  for (uint32_t l = 0; l < config->layer_count && st == KVQ_OK; l++) {
    const kvq_layer_config *L = &config->layers[l];
    const kvq_method_config *methods[2] = {&L->keys, &L->values};
    for (int s = 0; s < 2 && st == KVQ_OK; s++) {
      kvq_side_layout side;
      kvq_side_layout_init(&side, methods[s], config->page_size, L->head_dim, L->kv_heads);
      for (int i = 0; i < KVQ_SIDE_FIXED && st == KVQ_OK; i++)
        st = add_buffer(ctx, kvq_size_mul(kvq_side_fixed_floats(&side, i), sizeof(float)), "the matrices and codebooks", l, &total);
      if (st == KVQ_OK) st = add_buffer(ctx, kvq_pool_bytes(&side, config->max_pages), "the page pool", l, &total);
      if (st == KVQ_OK) st = add_buffer(ctx, kvq_ring_bytes(config, L), "the full-precision windows", l, &total);
    }
  }
  if (st == KVQ_OK) st = add_buffer(ctx, kvq_staging_bytes(config), "the staging memory", 0, &total);
  if (st != KVQ_OK) return st;
  if (total == KVQ_SIZE_OVERFLOW || (be->memory_bytes && total > be->memory_bytes))
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE,
                    "kvq_cache_create: the cache's buffers would take %s%llu bytes; the %s backend's memory is %llu bytes",
                    total == KVQ_SIZE_OVERFLOW ? "more than " : "", (unsigned long long)total, be->ops->name,
                    (unsigned long long)be->memory_bytes);
  return KVQ_OK;
}

kvq_status kvq_call_fits(kvq_context *ctx, uint64_t bytes, const char *who) {
  const kvq_backend *be = ctx->backend;
  const uint64_t host = ctx->host_memory_bytes;
  const char *limit = NULL;
  uint64_t limit_bytes = 0;
  if (!kvq_size_fits_host(bytes)) limit = "what this host can address", limit_bytes = (uint64_t)SIZE_MAX;
  else if (host && bytes > host) limit = "this host's memory", limit_bytes = host;
  else if (be->memory_bytes && bytes > be->memory_bytes) limit = "the backend's memory", limit_bytes = be->memory_bytes;
  if (!limit) return KVQ_OK;
  return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE, "%s: the call would need %s%llu bytes of working memory, beyond %s (%llu bytes)",
                  who, bytes == KVQ_SIZE_OVERFLOW ? "more than " : "", (unsigned long long)bytes, limit,
                  (unsigned long long)limit_bytes);
}
