/*
 * Limits checked before allocation: the buffers a cache configuration makes and the working memory
 * a call needs, against what the context's backend can hold (kvq_backend.memory_bytes and
 * max_buffer_bytes) and what the host has. A request beyond them is refused with
 * KVQ_ERROR_OUT_OF_RANGE and a message naming the limit, before anything is allocated, instead of an
 * allocation that fails part way (or, under AddressSanitizer, aborts the process).
 */
#ifndef KVQ_CORE_MEMORY_LIMITS_H
#define KVQ_CORE_MEMORY_LIMITS_H

#include <stdint.h>

#include "config.h"
#include "kvq/kvq.h"

/* The sizes of a cache's buffers (core/cache.c creates exactly these), with checked arithmetic:
 * KVQ_SIZE_OVERFLOW when they do not fit 64 bits. */
uint64_t kvq_pool_bytes(const kvq_side_layout *side, uint32_t max_pages);
uint64_t kvq_ring_bytes(const kvq_cache_config *config, const kvq_layer_config *layer);
uint64_t kvq_staging_bytes(const kvq_cache_config *config);
uint32_t kvq_staging_pages(const kvq_cache_config *config);

/* The host's physical memory in bytes (0 when the system does not say). */
uint64_t kvq_host_memory_bytes(void);

/* Whether a cache of this (validated) configuration fits the context's backend: every buffer at most
 * max_buffer_bytes and all of them at most memory_bytes. KVQ_OK, or KVQ_ERROR_OUT_OF_RANGE with the
 * context's message saying which buffer or total is too large. Allocates nothing. */
kvq_status kvq_cache_fits_backend(kvq_context *ctx, const kvq_cache_config *config);

/* Whether a call (`who`, the public function) may take `bytes` of working memory (host copies of
 * its tensors, or device scratch of the same size): at most the host's memory, the backend's memory
 * and what malloc can be asked for. KVQ_ERROR_OUT_OF_RANGE otherwise. `bytes` may be
 * KVQ_SIZE_OVERFLOW (core/checked.h). */
kvq_status kvq_call_fits(kvq_context *ctx, uint64_t bytes, const char *who);

#endif /* KVQ_CORE_MEMORY_LIMITS_H */
