/* A target that breaks on purpose, to show that the replay tests fail when an input crashes
 * (tests/fuzz/replay_fails.sh): the input "property" breaks a checked property (fuzz_fail), the input
 * "overflow" reads one byte past a heap buffer (UBSan's object-size check or ASan reports it),
 * anything else passes. Never fuzzed. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 8 && memcmp(data, "property", 8) == 0) fuzz_fail("the planted input broke a property");
  if (size == 8 && memcmp(data, "overflow", 8) == 0) {
    uint8_t *copy = malloc(size);
    memcpy(copy, data, size);
    volatile size_t end = size; /* hidden from the compiler, which would refuse the constant index */
    volatile uint8_t past = copy[end]; /* one byte past the end */
    (void)past;
    free(copy);
  }
  return 0;
}
