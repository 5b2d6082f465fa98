/* Fuzz target: kvq_codebooks_load_from_memory. The cache it loads into is created from the file's
 * own CONF record (when that is a valid configuration of at most FUZZ_CACHE_BYTES), so that the
 * layers match and mutations reach the CODE section's checks; checksums are rewritten first, as in
 * cache_load_sum. Property: a status and a message, never a crash; a refused load changes nothing
 * (the codebooks saved before and after are the same bytes). */
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/savefile.h"
#include "fuzz.h"

/* The cache's codebook file, malloc'ed (NULL when saving fails). */
static uint8_t *save_codebooks(kvq_cache *cache, size_t *size) {
  uint64_t bytes = 0;
  if (kvq_codebooks_save_size(cache, &bytes) != KVQ_OK) return NULL;
  uint8_t *out = malloc((size_t)bytes);
  if (out && kvq_codebooks_save_to_memory(cache, out, (size_t)bytes, size) != KVQ_OK) {
    free(out);
    return NULL;
  }
  return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  fuzz_fix_checksums(copy, size);

  /* The cache: from the CONF section right after the header, when there is a usable one. */
  kvq_context *ctx = fuzz_context();
  kvq_cache *cache = NULL;
  if (size >= KVQ_FILE_HEADER_BYTES + 16) {
    kvq_reader file = {copy, size, KVQ_FILE_HEADER_BYTES, 0}, conf;
    kvq_cache_config config;
    kvq_layer_config *layers = NULL;
    uint64_t bytes = 0;
    const uint32_t tag = kvq_get_u32(&file);
    kvq_get_u32(&file);
    const uint64_t payload = kvq_get_u64(&file);
    if (tag == KVQ_TAG_CONF && payload <= size - file.pos) {
      conf = (kvq_reader){copy + file.pos, payload, 0, 0};
      if (kvq_get_config(&conf, &config, &layers) == 0 && kvq_cache_config_check(&config, NULL, 0) == KVQ_OK &&
          kvq_cache_config_bytes(&config, &bytes) == KVQ_OK && bytes <= FUZZ_CACHE_BYTES)
        (void)kvq_cache_create(ctx, &config, &cache);
    }
    free(layers);
  }
  if (!cache) { /* nothing to load into; the framing the loaders share (kvq_file_open) is cache_load's */
    free(copy);
    return 0;
  }

  size_t before_size = 0, after_size = 0;
  uint8_t *before = save_codebooks(cache, &before_size);
  const kvq_status st = kvq_codebooks_load_from_memory(cache, copy, size);
  if (st != KVQ_OK) {
    const char *why = kvq_context_last_error(ctx);
    if (!why || !*why) fuzz_fail("status %d without a message", (int)st);
    uint8_t *after = save_codebooks(cache, &after_size);
    if (!before || !after || before_size != after_size || memcmp(before, after, before_size) != 0)
      fuzz_fail("a refused codebook file (status %d) changed the cache", (int)st);
    free(after);
  }
  free(before);
  kvq_cache_destroy(cache);
  free(copy);
  return 0;
}
