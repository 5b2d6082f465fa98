/* Caches: building storage, the page pool, sequences and scratch buffers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "codebook.h"
#include "layout.h"
#include "detmath.h"
#include "internal.h"
#include "matrix.h"
#include "memory_limits.h"
#include "policy.h"

uint64_t kvq_ring_offset(const kvq_cache *cache, uint32_t layer, uint32_t slot) {
  const kvq_layer_config *L = &cache->layers[layer];
  return (uint64_t)slot * cache->ring_capacity * kvq_token_bytes(cache->config.input_dtype, L->kv_heads, L->head_dim);
}

static void free_storage(kvq_cache *cache) {
  kvq_backend *be = cache->ctx->backend;
  if (cache->storage) {
    for (uint32_t l = 0; l < cache->config.layer_count; l++) {
      kvq_layer_storage *st = &cache->storage[l];
      for (int s = 0; s < 2; s++) {
        for (int i = 0; i < KVQ_SIDE_FIXED; i++) {
          if (st->side[s].fixed[i]) be->ops->buffer_destroy(be, st->side[s].fixed[i]);
          free(st->fixed_host[s][i]);
        }
        if (st->pages[s]) be->ops->buffer_destroy(be, st->pages[s]);
        if (st->ring[s]) be->ops->buffer_destroy(be, st->ring[s]);
      }
    }
  }
  for (int i = 0; i < KVQ_SCRATCH_COUNT; i++)
    if (cache->scratch[i]) be->ops->buffer_destroy(be, cache->scratch[i]);
  if (cache->staging) be->ops->buffer_destroy(be, cache->staging);
  if (cache->zeros) be->ops->buffer_destroy(be, cache->zeros);
  if (cache->seqs)
    for (uint32_t i = 0; i < cache->config.max_sequences; i++) {
      free(cache->seqs[i].pages);
      free(cache->seqs[i].page_index);
      free(cache->seqs[i].alive);
      free(cache->seqs[i].layers);
      kvq_tracked_free(&cache->seqs[i].tracked);
    }
  free(cache->seqs);
  free(cache->free_pages);
  free(cache->storage);
  free(cache->layers);
}

static kvq_status create_buffer(kvq_cache *cache, uint64_t bytes, kvq_buffer **out, const char *what) {
  kvq_backend *be = cache->ctx->backend;
  kvq_status st = be->ops->buffer_create(be, bytes, out); /* zero-filled by contract */
  return st == KVQ_OK ? KVQ_OK : kvq_fail_backend(cache->ctx, st, what);
}

kvq_status kvq_upload_fixed(kvq_cache *cache) {
  kvq_backend *be = cache->ctx->backend;
  for (uint32_t l = 0; l < cache->config.layer_count; l++) {
    kvq_layer_storage *st = &cache->storage[l];
    for (int s = 0; s < 2; s++)
      for (int i = 0; i < KVQ_SIDE_FIXED; i++) {
        const uint64_t floats = kvq_side_fixed_floats(&st->side[s].layout, i);
        if (!floats) continue;
        kvq_status status = be->ops->buffer_write(be, st->side[s].fixed[i], 0, st->fixed_host[s][i], floats * sizeof(float));
        if (status != KVQ_OK) return kvq_fail_backend(cache->ctx, status, "uploading matrices and codebooks");
      }
  }
  return KVQ_OK;
}

/* Builds what the configuration alone determines: random matrices from the seed, offline
 * codebooks from the method. Learned codebooks start at zero, not ready. */
static int build_fixed(const kvq_cache_config *config, uint32_t layer, const kvq_side_layout *layout, int index,
                       float *out) {
  const uint32_t d = layout->head_dim;
  switch (kvq_side_fixed_kind(layout, index)) {
  case KVQ_FIXED_RANDOM:
    if (layout->method == KVQ_LAYOUT_POLAR) {
      if (layout->rotation == KVQ_ROTATION_DENSE)
        return kvq_build_rotation(config->seed, layer, kvq_side_fixed_purpose(layout, index), d, out);
      kvq_build_signs(config->seed, layer, kvq_side_fixed_purpose(layout, index), d, out);
      return 0;
    }
    return kvq_build_sketch(config->seed, layer, kvq_side_fixed_purpose(layout, index),
                            (uint32_t)(kvq_side_fixed_floats(layout, index) / d), d, out);
  case KVQ_FIXED_COMPUTED:
    return kvq_polar_offline_tables(layout->levels, layout->level_bits, out);
  case KVQ_FIXED_LEARNED:
  case KVQ_FIXED_NONE: break;
  }
  return 0;
}

kvq_status kvq_cache_build(kvq_context *ctx, const kvq_cache_config *config, kvq_cache **out) {
  /* a cache the backend cannot hold is refused before anything is allocated (created or loaded) */
  const kvq_status fits = kvq_cache_fits_backend(ctx, config);
  if (fits != KVQ_OK) return fits;
  kvq_cache *cache = calloc(1, sizeof *cache);
  if (!cache) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_create: out of host memory");
  cache->ctx = ctx;
  cache->config = *config;
  const uint32_t L = config->layer_count, P = config->page_size;
  cache->ring_capacity = config->residual_window + P;
  cache->alive_words = (P + 31) / 32;
  if (config->policy.kind != KVQ_POLICY_KEEP_ALL && config->policy.recent == 0)
    cache->config.policy.recent = config->residual_window + P; /* the documented minimum */
  cache->layers = malloc(sizeof *cache->layers * L);
  cache->storage = calloc(L, sizeof *cache->storage);
  cache->free_pages = malloc(sizeof *cache->free_pages * config->max_pages);
  cache->seqs = calloc(config->max_sequences, sizeof *cache->seqs);
  kvq_status st = KVQ_OK;
  if (!cache->layers || !cache->storage || !cache->free_pages || !cache->seqs) {
    st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_create: out of host memory");
    goto fail;
  }
  memcpy(cache->layers, config->layers, sizeof *cache->layers * L);
  cache->config.layers = cache->layers;
  for (uint32_t i = 0; i < config->max_sequences; i++) {
    cache->seqs[i].layers = calloc(L, sizeof(kvq_seq_layer));
    if (!cache->seqs[i].layers) {
      st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_create: out of host memory");
      goto fail;
    }
  }
  /* Free pages pop from the end: slot 0 is handed out first. */
  for (uint32_t i = 0; i < config->max_pages; i++) cache->free_pages[i] = config->max_pages - 1 - i;
  cache->free_count = config->max_pages;

  for (uint32_t l = 0; l < L; l++) {
    const kvq_layer_config *lc = &cache->layers[l];
    kvq_layer_storage *ls = &cache->storage[l];
    ls->config = *lc;
    const kvq_method_config *methods[2] = {&lc->keys, &lc->values};
    for (int s = 0; s < 2; s++) {
      kvq_side_desc *side = &ls->side[s];
      kvq_side_layout_init(&side->layout, methods[s], P, lc->head_dim, lc->kv_heads);
      side->qjl_constant = kvq_qjl_unbiased_constant(lc->head_dim);
      if (!ctx->backend->ops->supports(ctx->backend, KVQ_JOB_QUANTIZE, s == 0 ? &side->layout : NULL,
                                       s == 1 ? &side->layout : NULL)) {
        st = kvq_fail(ctx, KVQ_ERROR_UNSUPPORTED, "layers[%u].%s: the %s backend does not support method %s", l,
                      s == 0 ? "keys" : "values", ctx->backend->ops->name, kvq_method_name(methods[s]->method));
        goto fail;
      }
      for (int i = 0; i < KVQ_SIDE_FIXED; i++) {
        const uint64_t floats = kvq_side_fixed_floats(&side->layout, i);
        if (!floats) continue;
        ls->fixed_host[s][i] = calloc((size_t)floats, sizeof(float));
        if (!ls->fixed_host[s][i]) {
          st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_create: out of host memory for matrices and codebooks");
          goto fail;
        }
        if (build_fixed(config, l, &side->layout, i, ls->fixed_host[s][i]) != 0) {
          st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_create: out of host memory building matrices");
          goto fail;
        }
        st = create_buffer(cache, floats * sizeof(float), &side->fixed[i], "allocating matrices and codebooks");
        if (st) goto fail;
      }
      ls->learned[s] = !kvq_side_needs_learning(&side->layout);
      st = create_buffer(cache, kvq_pool_bytes(&side->layout, config->max_pages), &ls->pages[s], "allocating the page pool");
      if (st) goto fail;
      st = create_buffer(cache, kvq_ring_bytes(config, lc), &ls->ring[s], "allocating the full-precision windows");
      if (st) goto fail;
    }
  }
  /* Staging for appends: a bounded number of pages per job, allocated now so appends never
   * allocate device memory. */
  cache->staging_pages = kvq_staging_pages(config);
  st = create_buffer(cache, kvq_staging_bytes(config), &cache->staging, "allocating staging memory");
  if (st) goto fail;
  ctx->live_caches++;
  *out = cache;
  return KVQ_OK;
fail:
  free_storage(cache);
  free(cache);
  return st;
}

static kvq_status create_call(kvq_context *ctx, const kvq_cache_config *config, kvq_cache **out) {
  if (!out) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_create: out is NULL");
  kvq_status st = kvq_config_validate(config, ctx->error, sizeof ctx->error);
  if (st != KVQ_OK) return st;
  uint64_t bytes = UINT64_MAX;
  st = kvq_cache_config_bytes(config, &bytes);
  if (st != KVQ_OK || bytes > KVQ_MAX_CACHE_BYTES)
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE,
                    "kvq_cache_create: the cache would need %s%llu bytes, beyond the 2^46 bytes kvq accepts",
                    st != KVQ_OK ? "more than " : "", (unsigned long long)bytes);
  kvq_clear_error(ctx);
  kvq_cache *cache = NULL;
  if ((st = kvq_cache_build(ctx, config, &cache)) != KVQ_OK) return st;
  if ((st = kvq_upload_fixed(cache)) != KVQ_OK) {
    kvq_cache_destroy(cache);
    return st;
  }
  *out = cache;
  return KVQ_OK;
}

kvq_status kvq_cache_create(kvq_context *ctx, const kvq_cache_config *config, kvq_cache **out) {
  if (out) *out = NULL;
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_call_begin_parts(ctx); /* the uploads of matrices and codebooks: one submission */
  return kvq_call_end_waiting(ctx, create_call(ctx, config, out));
}

void kvq_cache_destroy(kvq_cache *cache) {
  if (!cache) return;
  kvq_context *ctx = cache->ctx;
  free_storage(cache);
  free(cache);
  ctx->live_caches--;
  kvq_context_release(ctx);
}

kvq_status kvq_cache_get_config(const kvq_cache *cache, kvq_cache_config *config) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!config) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_get_config: config is NULL");
  *config = cache->config;
  return KVQ_OK;
}

kvq_status kvq_scratch(kvq_cache *cache, int kind, uint64_t bytes, kvq_buffer **out) {
  if (bytes == 0) bytes = 16;
  if (cache->scratch_size[kind] < bytes) {
    kvq_backend *be = cache->ctx->backend;
    kvq_buffer *fresh = NULL;
    /* some headroom so growing sizes do not reallocate each call (checked: the backend refuses a
     * saturated size) */
    uint64_t grown = kvq_size_add(bytes, bytes / 4);
    kvq_status st = be->ops->buffer_create(be, grown, &fresh);
    if (st != KVQ_OK) return kvq_fail_backend(cache->ctx, st, "allocating scratch memory");
    if (cache->scratch[kind]) be->ops->buffer_destroy(be, cache->scratch[kind]);
    cache->scratch[kind] = fresh;
    cache->scratch_size[kind] = grown;
  }
  *out = cache->scratch[kind];
  return KVQ_OK;
}

/* ---- Sequences --------------------------------------------------------------------------------- */

uint32_t kvq_sequence_slot(const kvq_cache *cache, const kvq_sequence *seq) { return (uint32_t)(seq - cache->seqs); }

kvq_sequence *kvq_sequence_lookup(const kvq_cache *cache, uint32_t id, const char *who, kvq_status *status) {
  uint32_t slot = id & 0xffffu, generation = id >> 16;
  if (slot >= cache->config.max_sequences || !cache->seqs[slot].live || cache->seqs[slot].generation != generation) {
    *status = kvq_fail(cache->ctx, KVQ_ERROR_NOT_FOUND, "%s: sequence %u is not a live sequence of this cache", who, id);
    return NULL;
  }
  *status = KVQ_OK;
  return &cache->seqs[slot];
}

kvq_sequence *kvq_sequence_layer_lookup(const kvq_cache *cache, uint32_t id, uint32_t layer, const char *who,
                                        kvq_status *status) {
  kvq_sequence *seq = kvq_sequence_lookup(cache, id, who, status);
  if (seq && layer >= cache->config.layer_count) {
    *status = kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_RANGE, "%s: layer %u, the cache has %u layers", who, layer,
                       cache->config.layer_count);
    return NULL;
  }
  return seq;
}

kvq_status kvq_sequence_add(kvq_cache *cache, uint32_t *id) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!id) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_sequence_add: id is NULL");
  for (uint32_t slot = 0; slot < cache->config.max_sequences; slot++) {
    kvq_sequence *seq = &cache->seqs[slot];
    if (seq->live) continue;
    seq->generation = (uint16_t)(seq->generation == 0xffff ? 1 : seq->generation + 1);
    seq->live = 1;
    seq->page_count = 0;
    seq->page_end = 0;
    seq->uid = 0; /* a new name for packed attention metadata (core/gpu_meta.c) */
    seq->pt_dirty_from = 0;
    seq->pt_masks_from = UINT32_MAX, seq->pt_masks_to = 0;
    seq->tracked.count = seq->tracked.end = 0;
    memset(seq->layers, 0, sizeof(kvq_seq_layer) * cache->config.layer_count);
    cache->live_sequences++;
    *id = (uint32_t)seq->generation << 16 | slot;
    return KVQ_OK;
  }
  return kvq_fail(cache->ctx, KVQ_ERROR_CAPACITY, "kvq_sequence_add: all %u sequence slots are live",
                  cache->config.max_sequences);
}

kvq_status kvq_sequence_free(kvq_cache *cache, uint32_t id) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_status st;
  kvq_sequence *seq = kvq_sequence_lookup(cache, id, "kvq_sequence_free", &st);
  if (!seq) return st;
  for (uint32_t j = seq->page_count; j-- > 0;) cache->free_pages[cache->free_count++] = seq->pages[j];
  seq->page_count = 0;
  seq->live = 0;
  seq->uid = 0;
  if (seq->page_capacity > 64) { /* a long sequence's table is not kept for the slot's next owner */
    free(seq->pages);
    free(seq->page_index);
    free(seq->alive);
    seq->pages = seq->page_index = seq->alive = NULL;
    seq->page_capacity = 0;
  }
  if (seq->tracked.capacity > 4096) kvq_tracked_free(&seq->tracked);
  seq->tracked.count = seq->tracked.end = 0;
  cache->live_sequences--;
  return KVQ_OK;
}

kvq_status kvq_sequence_info_get(const kvq_cache *cache, uint32_t id, uint32_t layer, kvq_sequence_info *info) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_status st;
  const kvq_sequence *seq = kvq_sequence_layer_lookup(cache, id, layer, "kvq_sequence_info_get", &st);
  if (!seq) return st;
  if (!info) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_sequence_info_get: info is NULL");
  kvq_layer_view view;
  kvq_layer_view_get(cache, seq, layer, &view);
  info->tokens = seq->layers[layer].tokens;
  info->quantized_tokens = seq->layers[layer].quantized;
  info->pages = seq->page_count;
  info->kept_tokens = view.kept;
  return KVQ_OK;
}

kvq_status kvq_sequence_positions(const kvq_cache *cache, uint32_t id, uint32_t layer, uint32_t *positions,
                                  size_t capacity, size_t *count) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_status st;
  const kvq_sequence *seq = kvq_sequence_layer_lookup(cache, id, layer, "kvq_sequence_positions", &st);
  if (!seq) return st;
  if (!count) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_sequence_positions: count is NULL");
  kvq_layer_view view;
  kvq_layer_view_get(cache, seq, layer, &view);
  /* a failing call writes nothing, *count included (kvq.h); positions == NULL asks for the count */
  if (positions && capacity < view.kept)
    return kvq_fail(cache->ctx, KVQ_ERROR_CAPACITY, "kvq_sequence_positions: %u kept tokens, room for %zu", view.kept,
                    capacity);
  if (positions) kvq_layer_view_kept(cache, seq, &view, NULL, positions);
  *count = view.kept;
  return KVQ_OK;
}
