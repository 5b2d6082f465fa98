/* Differential fuzz target: a file the loader accepts must save again to the same bytes
 * (kvq_cache_save_to_memory), the format-stability promise the golden caches pin (docs/GOLDEN.md),
 * over every file the fuzzer can make the loader accept. Checksums are rewritten first, as in
 * cache_load_sum, so that accepted files are not rare. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  fuzz_fix_checksums(copy, size);
  kvq_cache *cache = NULL;
  fuzz_load_and_check(copy, size, &cache);
  if (cache) {
    uint64_t bytes = 0;
    if (kvq_cache_save_size(cache, &bytes) != KVQ_OK) fuzz_fail("save_size of a loaded cache failed");
    if (bytes != size) fuzz_fail("a loaded %zu-byte file saves to %llu bytes", size, (unsigned long long)bytes);
    uint8_t *saved = malloc(size);
    size_t written = 0;
    if (!saved) fuzz_fail("out of memory");
    if (kvq_cache_save_to_memory(cache, saved, size, &written) != KVQ_OK || written != size)
      fuzz_fail("saving a loaded cache failed: %s", kvq_context_last_error(fuzz_context()));
    for (size_t i = 0; i < size; i++)
      if (saved[i] != copy[i]) fuzz_fail("a loaded file saves differently: first at byte %zu (%02x, saved %02x)", i, copy[i], saved[i]);
    free(saved);
    kvq_cache_destroy(cache);
  }
  free(copy);
  return 0;
}
