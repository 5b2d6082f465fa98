/* Fuzz target: kvq_cache_load_from_memory on raw bytes. Every header, framing and checksum branch
 * (docs/FORMAT.md, "What loading enforces"); a mutation rarely passes the SHA-256, so the content
 * checks are cache_load_sum's. Property: a status, never a crash, a leak or an out-of-bounds access;
 * a cache exactly when KVQ_OK, a message when refused. */
#include "fuzz.h"
#include "fuzz_load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_load_and_check(data, size, NULL);
  return 0;
}
