/* The loading check that the cache targets share (tests/fuzz/fuzz_load.h). */
#include "fuzz_load.h"

/* The most a load may hold at once: the cache (at most the context's load limit, FUZZ_CACHE_BYTES,
 * as kvq_cache_config_bytes bounds what a cache holds: the config target checks that), the loader's
 * own arrays (a page-owner byte and a valid-token count of 4 bytes per page and layer, at most 5/32
 * of the limit since every page of a layer costs at least 32 bytes of pages in it), and the
 * matrices' construction in double (two d x 1024 arrays, 4 MiB at d = 256): 2 x the limit + 16 MiB
 * covers them, and is a thousandth of what a configuration the limit refuses would take. */
#define LOAD_PEAK_BYTES (2 * (int64_t)FUZZ_CACHE_BYTES + ((int64_t)16 << 20))

void fuzz_load_and_check(const uint8_t *data, size_t size, kvq_cache **keep) {
  kvq_context *ctx = fuzz_context();
  kvq_cache *cache = (kvq_cache *)1; /* must be overwritten */
  fuzz_count_start();
  const kvq_status st = kvq_cache_load_from_memory(ctx, data, size, &cache);
  const fuzz_count counted = fuzz_count_stop();
  if (counted.peak > LOAD_PEAK_BYTES)
    fuzz_fail("a load (status %d) held %lld bytes at once", (int)st, (long long)counted.peak);
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
