/* The loading check that the cache targets share (tests/fuzz/fuzz_load.c). */
#ifndef KVQ_TESTS_FUZZ_LOAD_H
#define KVQ_TESTS_FUZZ_LOAD_H

#include "fuzz.h"

/* Loads `data` on fuzz_context() and checks the call's contract: a cache exactly when KVQ_OK, a
 * known status and a message when refused. With keep, the loaded cache is returned there (NULL when
 * refused); without, it is destroyed. */
void fuzz_load_and_check(const uint8_t *data, size_t size, kvq_cache **keep);

#endif
