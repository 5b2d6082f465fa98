/*
 * What kvq's fuzz targets share (docs/RELIABILITY.md, "Fuzzing"). Each target is one file that
 * defines LLVMFuzzerTestOneInput; it is linked either with libFuzzer (scripts/fuzz.sh, clang) or
 * with tests/fuzz/replay.c (the ordinary test build, any compiler), which feeds it every corpus
 * file. A target reports a broken property with fuzz_fail, which aborts: libFuzzer saves the input,
 * the replay test fails.
 */
#ifndef KVQ_TESTS_FUZZ_H
#define KVQ_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/kvq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The most memory a cache built by a target may take (kvq_context_set_load_limit, and the size up to
 * which the config target creates caches): small enough that libFuzzer's -malloc_limit_mb=1024 and
 * a 2-core machine are never at risk, large enough for every golden cache (the largest takes a few
 * MiB). */
#define FUZZ_CACHE_BYTES ((uint64_t)64 << 20)

/* One CPU context for the life of the process, its load limit FUZZ_CACHE_BYTES. Aborts if it
 * cannot be created (the fuzzer could test nothing). */
kvq_context *fuzz_context(void);

/* Rewrites, in a copy of a cache or codebook file, what a mutation breaks before the content
 * checks are reached: the header's file size (set to `size`), the SHA-256 of every fixed array of
 * the MATX or CODE section, and the trailer's SHA-256. Walks the sections as far as their framing
 * allows and leaves everything else as it is. */
void fuzz_fix_checksums(uint8_t *data, size_t size);

/* What the process allocated between fuzz_count_start and fuzz_count_stop, counted through the
 * sanitizer allocator's hooks (tests/sanitizer_hooks.h): the bytes still held at the stop and the
 * most held at once. Both 0 in builds without AddressSanitizer, where nothing is counted. */
typedef struct {
  int64_t held, peak;
} fuzz_count;
void fuzz_count_start(void);
fuzz_count fuzz_count_stop(void);

/* Aborts with a message: a property the target checks does not hold. */
_Noreturn void fuzz_fail(const char *fmt, ...);

#endif
