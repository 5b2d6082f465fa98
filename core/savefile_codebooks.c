/*
 * Codebook files (docs/FORMAT.md, "Codebook files"): the header of a cache file with magic
 * "KVQCODEB", version 1, flags 0 and two sections, CONF (the cache's config record, to check
 * compatibility) and CODE (the learned codebooks as a fixed-array section), then the SHA-256.
 * Loading changes the cache only when every codebook in the file is good.
 */
#include "savefile.h"

#include <stdlib.h>
#include <string.h>

#include "layout.h"

#define KVQ_CODEBOOK_MAGIC "KVQCODEB"

/* Header as for caches (magic KVQCODEB, version 1, two sections), CONF (the cache's config record,
 * to check compatibility), CODE (the learned codebooks, put_fixed with learned_only), SHA-256. */
static kvq_status write_codebooks(kvq_cache *cache, kvq_writer *w) {
  const uint64_t file_bytes_at = kvq_file_begin(w, KVQ_CODEBOOK_MAGIC, 0, 2);
  uint64_t at = kvq_section_begin(w, KVQ_TAG_CONF);
  kvq_put_config(w, &cache->config);
  kvq_section_end(w, at);
  at = kvq_section_begin(w, KVQ_TAG_CODE);
  kvq_put_fixed(w, cache, 1);
  kvq_section_end(w, at);
  kvq_file_end(w, file_bytes_at);
  return KVQ_OK;
}

kvq_status kvq_codebooks_save_size(kvq_cache *cache, uint64_t *bytes) {
  return kvq_file_save_size(cache, write_codebooks, bytes, "kvq_codebooks_save_size");
}

kvq_status kvq_codebooks_save_to_memory(kvq_cache *cache, void *buffer, size_t capacity, size_t *written) {
  return kvq_file_save_to_memory(cache, write_codebooks, buffer, capacity, written, "kvq_codebooks_save_to_memory");
}

kvq_status kvq_codebooks_save(kvq_cache *cache, const char *path) {
  return kvq_file_save(cache, write_codebooks, path, "kvq_codebooks_save");
}

/* Whether a file's layer config learns the same codebooks as the cache's: same method, shape and,
 * for PolarQuant, the same rotation (its angles were measured after it), hence the same seed. */
static int same_codebooks(const kvq_cache_config *file, const kvq_cache *cache, uint32_t l, int s) {
  const kvq_layer_config *a = &file->layers[l];
  kvq_side_layout x, y;
  kvq_side_layout_init(&x, s ? &a->values : &a->keys, cache->config.page_size, a->head_dim, a->kv_heads);
  y = cache->storage[l].side[s].layout;
  if (kvq_side_needs_learning(&x) != kvq_side_needs_learning(&y)) return 0;
  if (!kvq_side_needs_learning(&y)) return 1;
  if (x.method != y.method || x.head_dim != y.head_dim || x.kv_heads != y.kv_heads ||
      kvq_side_fixed_floats(&x, 1) != kvq_side_fixed_floats(&y, 1) || x.level_bits != y.level_bits ||
      x.levels != y.levels || x.channels != y.channels || x.code_bits != y.code_bits)
    return 0;
  return y.method != KVQ_LAYOUT_POLAR || (x.rotation == y.rotation && file->seed == cache->config.seed);
}

/* Whether a layer may take a side's codebooks from a file (`fresh`: their floats, NULL when the side
 * learns none; `ready`: the file's learned flag). A layer holding tokens keeps its codebooks: its
 * tokens were coded with them, so only the very same floats, learned, may be loaded. The flag counts
 * as much as the floats: codebooks learned from all-zero data are all zeros, like codebooks not
 * learned, and un-learning a busy layer would refuse every later append and make its save a file
 * kvq_cache_load refuses. */
static kvq_status busy_layer_keeps_codebooks(kvq_cache *cache, uint32_t l, int s, const float *fresh, int ready) {
  int busy = 0;
  for (uint32_t i = 0; i < cache->config.max_sequences; i++) busy |= cache->seqs[i].live && cache->seqs[i].layers[l].tokens > 0;
  if (!busy || !fresh) return KVQ_OK;
  const char *side = s ? "value" : "key";
  if (!ready)
    return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT,
                    "kvq_codebooks_load: layer %u holds tokens, and the file's %s codebooks are not learned; free those "
                    "sequences first", l, side);
  const kvq_layer_storage *ls = &cache->storage[l];
  if (!ls->learned[s] || memcmp(fresh, ls->fixed_host[s][1], kvq_side_fixed_floats(&ls->side[s].layout, 1) * 4))
    return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT,
                    "kvq_codebooks_load: layer %u holds tokens coded with other %s codebooks; free those sequences first",
                    l, side);
  return KVQ_OK;
}

static kvq_status codebooks_load_call(kvq_cache *cache, const void *buffer, size_t size) {
  kvq_context *ctx = cache->ctx;
  if (!buffer) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_load: buffer is NULL");
  ctx->load_work = (kvq_load_work){0, 0};
  uint32_t flags, sections;
  kvq_reader file, r;
  kvq_status st = kvq_file_open(ctx, buffer, size, KVQ_CODEBOOK_MAGIC, "codebook", "kvq_codebooks_load", &flags, &sections,
                                &file);
  if (st != KVQ_OK) return st;
  if (flags != 0 || sections != 2) return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: unknown flags or sections");
  kvq_cache_config config;
  kvq_layer_config *layers = NULL;
  if (!kvq_next_section(&file, KVQ_TAG_CONF, &r) || kvq_get_config(&r, &config, &layers) != 0 || !kvq_section_finished(&r)) {
    free(layers);
    return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: malformed config section");
  }
  /* same_codebooks() derives page layouts from the file's methods, which divide by and shift with
   * their parameters (cq.channels 0, polar.levels beyond bits[]): only a config kvq could have
   * written may get that far, as when loading caches */
  char why[512];
  if (kvq_config_validate(&config, why, sizeof why) != KVQ_OK) {
    free(layers);
    return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: invalid config: %s", why);
  }
  const uint32_t L = cache->config.layer_count;
  if (config.layer_count != L) st = kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_load: the file is for %u layers, the cache has %u",
                                             config.layer_count, L);
  for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
    for (int s = 0; s < 2 && st == KVQ_OK; s++)
      if (!same_codebooks(&config, cache, l, s))
        st = kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT,
                      "kvq_codebooks_load: layer %u's %s codebooks have another shape or rotation than this cache's", l,
                      s ? "value" : "key");
  free(layers);
  if (st != KVQ_OK) return st;
  /* read into fresh arrays; change the cache only when all of them are good */
  float **dest = calloc((size_t)L * 2 * KVQ_SIDE_FIXED, sizeof(float *));
  int *ready = calloc((size_t)L * 2, sizeof(int));
  if (!dest || !ready) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_load: out of host memory");
  for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
    for (int s = 0; s < 2 && st == KVQ_OK; s++) {
      const kvq_side_layout *layout = &cache->storage[l].side[s].layout;
      if (kvq_side_fixed_kind(layout, 1) != KVQ_FIXED_LEARNED) continue;
      dest[(l * 2 + s) * KVQ_SIDE_FIXED + 1] = malloc(sizeof(float) * kvq_side_fixed_floats(layout, 1));
      if (!dest[(l * 2 + s) * KVQ_SIDE_FIXED + 1]) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_load: out of host memory");
    }
  if (st == KVQ_OK && !kvq_next_section(&file, KVQ_TAG_CODE, &r)) st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: expected the codebook section");
  if (st == KVQ_OK) st = kvq_get_fixed(ctx, cache, &r, 1, dest, ready, "kvq_codebooks_load");
  if (st == KVQ_OK && file.pos != file.size) st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: bytes after the last section");
  for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
    for (int s = 0; s < 2 && st == KVQ_OK; s++)
      st = busy_layer_keeps_codebooks(cache, l, s, dest[(l * 2 + s) * KVQ_SIDE_FIXED + 1], ready[l * 2 + s]);
  kvq_backend *be = ctx->backend;
  for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
    for (int s = 0; s < 2 && st == KVQ_OK; s++) {
      const float *fresh = dest[(l * 2 + s) * KVQ_SIDE_FIXED + 1];
      if (!fresh) continue;
      const uint64_t floats = kvq_side_fixed_floats(&cache->storage[l].side[s].layout, 1);
      st = be->ops->buffer_write(be, cache->storage[l].side[s].fixed[1], 0, fresh, floats * 4);
      if (st != KVQ_OK) st = kvq_fail_backend(ctx, st, "uploading codebooks");
    }
  /* every upload done before the host copies and flags say so: a failed call, whose recorded uploads
   * are dropped (kvq_call_end), changes nothing */
  if (st == KVQ_OK) st = kvq_call_settle(ctx, 1, "kvq_codebooks_load: uploading codebooks");
  for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
    for (int s = 0; s < 2; s++) {
      const float *fresh = dest[(l * 2 + s) * KVQ_SIDE_FIXED + 1];
      if (!fresh) continue;
      memcpy(cache->storage[l].fixed_host[s][1], fresh, kvq_side_fixed_floats(&cache->storage[l].side[s].layout, 1) * 4);
      cache->storage[l].learned[s] = ready[l * 2 + s];
    }
  for (size_t i = 0; dest && i < (size_t)L * 2 * KVQ_SIDE_FIXED; i++) free(dest[i]);
  free(dest);
  free(ready);
  if (st == KVQ_OK) kvq_clear_error(ctx);
  return st;
}

kvq_status kvq_codebooks_load_from_memory(kvq_cache *cache, const void *buffer, size_t size) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_call_begin(cache->ctx); /* the codebooks' uploads: one submission */
  return kvq_call_end_waiting(cache->ctx, codebooks_load_call(cache, buffer, size));
}

kvq_status kvq_codebooks_load(kvq_cache *cache, const char *path) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!path || !*path) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_load: path is empty");
  uint8_t *data = NULL;
  size_t size = 0;
  kvq_status st = kvq_file_read(cache->ctx, path, &data, &size, "kvq_codebooks_load");
  if (st == KVQ_OK) st = kvq_codebooks_load_from_memory(cache, data, size);
  free(data);
  return st;
}