/* Fuzz target: configuration checks and kvq_cache_create on the CPU backend. The input is a config
 * record as files store it (docs/FORMAT.md; kvq_get_config), optionally followed by a policy record
 * (6 u32). Properties:
 *   - kvq_cache_config_check refuses with a message, or accepts; kvq_cache_create agrees with it;
 *   - a refused configuration, or one above the 2^46 bytes kvq_cache_create allows, is refused
 *     without allocating more than REFUSE_BYTES;
 *   - an accepted one of at most FUZZ_CACHE_BYTES is created, and the memory it holds once created
 *     is at most kvq_cache_config_bytes (the documented bound: "these never grow") plus the
 *     cache's own objects (HELD_SLACK); sizes in between are not created (they would allocate up to
 *     2^46 bytes).
 * Allocations are counted through the sanitizer allocator's hooks (the fuzz and test builds are
 * sanitized); without a sanitizer the counts are skipped. */
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/savefile.h"
#include "fuzz.h"

/* A refusal allocates at most the message and the copied layer records (196 bytes a layer in the
 * file, 4096 layers at most): 1 MiB is far above it and far below any cache. */
#define REFUSE_BYTES ((int64_t)1 << 20)
/* What a created cache holds besides kvq_cache_config_bytes: the cache object, its copy of the layer
 * configs (kvq_layer_config, 4096 at most), the per-layer storage records and the backend's buffer
 * objects, a few hundred bytes per layer: 1 MiB covers 4096 layers. */
#define HELD_SLACK ((int64_t)1 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kvq_reader r = {data, size, 0, 0};
  kvq_cache_config config;
  kvq_layer_config *layers = NULL;
  if (kvq_get_config(&r, &config, &layers) != 0) {
    free(layers);
    return 0;
  }
  if (r.size - r.pos >= 24) kvq_get_policy(&r, &config.policy);

  char why[512];
  why[0] = '\0';
  const kvq_status checked = kvq_cache_config_check(&config, why, sizeof why);
  if (checked != KVQ_OK && !why[0]) fuzz_fail("config check status %d without a message", (int)checked);
  uint64_t bytes = UINT64_MAX;
  const kvq_status sized = kvq_cache_config_bytes(&config, &bytes);
  if (sized != KVQ_OK && bytes != UINT64_MAX) fuzz_fail("config bytes failed but gave %llu", (unsigned long long)bytes);

  const int refuse = checked != KVQ_OK || sized != KVQ_OK || bytes > ((uint64_t)1 << 46);
  if (refuse || bytes <= FUZZ_CACHE_BYTES) {
    kvq_context *ctx = fuzz_context();
    kvq_cache *cache = NULL;
    fuzz_count_start();
    const kvq_status created = kvq_cache_create(ctx, &config, &cache);
    const fuzz_count counted = fuzz_count_stop();
    const int64_t held = counted.held, most = counted.peak;
    if (refuse) {
      if (created == KVQ_OK || cache) fuzz_fail("kvq_cache_create accepted a configuration the checks refuse");
      if (most > REFUSE_BYTES) fuzz_fail("a refused configuration allocated %lld bytes", (long long)most);
    } else {
      if (created != KVQ_OK || !cache)
        fuzz_fail("kvq_cache_create refused (%d) a configuration the checks accept: %s", (int)created,
                  kvq_context_last_error(ctx));
      if (held > (int64_t)bytes + HELD_SLACK)
        fuzz_fail("a cache of %llu configured bytes holds %lld", (unsigned long long)bytes, (long long)held);
    }
    kvq_cache_destroy(cache);
  }
  free(layers);
  return 0;
}
