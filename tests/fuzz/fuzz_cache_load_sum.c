/* Fuzz target: kvq_cache_load_from_memory after the input's file size and checksums are rewritten
 * (fuzz_fix_checksums), so that mutations reach the content checks of every section: CONF, MATX,
 * SEQS, PLCY, PAGE and WIND. Property as cache_load's. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  fuzz_fix_checksums(copy, size);
  fuzz_load_and_check(copy, size, NULL);
  free(copy);
  return 0;
}
