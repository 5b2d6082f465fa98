/* The loading check that the cache targets share (tests/fuzz/fuzz_load.h). */
#include "fuzz_load.h"

void fuzz_load_and_check(const uint8_t *data, size_t size, kvq_cache **keep) {
  kvq_context *ctx = fuzz_context();
  kvq_cache *cache = (kvq_cache *)1; /* must be overwritten */
  const kvq_status st = kvq_cache_load_from_memory(ctx, data, size, &cache);
  if (keep) *keep = NULL;
  if (st == KVQ_OK) {
    if (!cache) fuzz_fail("KVQ_OK without a cache");
    kvq_memory_report report;
    if (kvq_cache_memory(cache, &report) != KVQ_OK) fuzz_fail("a loaded cache has no memory report");
    if (keep) *keep = cache;
    else kvq_cache_destroy(cache);
    return;
  }
  if (cache) fuzz_fail("status %d with a cache", (int)st);
  if (st > KVQ_ERROR_NO_CODEBOOK || st < 0) fuzz_fail("unknown status %d", (int)st);
  const char *why = kvq_context_last_error(ctx);
  if (!why || !*why) fuzz_fail("status %d without a message", (int)st);
}
