/*
 * The load limit for untrusted files (kvq_context_set_load_limit, docs/API.md): a saved file's
 * configuration can ask for far more memory than its size, and kvq_cache_load must refuse it before
 * allocating anything unless the caller raised the limit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"
#include "helpers.h"
#include "sanitizer_hooks.h"

#ifdef SANITIZER_HOOKS
#define COUNT_ALLOCATIONS 1
/* The largest single allocation while counting: enough to show that nothing of the cache's size is
 * asked for (a refused load allocates its message buffers only). */
static size_t largest;
static int counting;
static void on_malloc(const volatile void *ptr, size_t size) {
  (void)ptr;
  if (counting && size > largest) largest = size;
}
static void on_free(const volatile void *ptr) { (void)ptr; }
#endif

static uint8_t *read_golden(const char *name, size_t *size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", KVQ_SOURCE_GOLDEN_DIR, name);
  FILE *f = fopen(path, "rb");
  cr_assert(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *data = malloc(*size);
  cr_assert(data && fread(data, 1, *size, f) == *size, "cannot read %s", path);
  fclose(f);
  return data;
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Where a cache file's config record starts: after the 64-byte header and the CONF section's
 * 16-byte framing (docs/FORMAT.md). Fields: layer_count, input_dtype, page_size, residual_window,
 * max_pages, max_sequences (u32 each). */
#define CONF 80

/* The case: the 1856-byte golden reject with its config made to claim the most pages its
 * page size and window allow and 65535 sequences, checksum recomputed, so that only the limit can
 * refuse it before the cache is built. */
Test(load_limit, small_file_with_a_huge_config_is_refused_before_allocating) {
  size_t size;
  uint8_t *file = read_golden("reject-bad-format-far-position.kvq", &size);
  cr_assert_lt(size, 2048);
  const uint32_t P = get_u32(file + CONF + 8), R = get_u32(file + CONF + 12);
  const uint32_t pages = (0x7fffffffu - R - P) / P; /* max_pages * P + R + P <= 2^31 - 1 */
  put_u32(file + CONF + 16, pages);
  put_u32(file + CONF + 20, 65535);
  kvq_sha256_digest(file, size - 32, file + size - 32);

  kvq_context *ctx = th_cpu_context();
#ifdef COUNT_ALLOCATIONS
  __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
  largest = 0;
  counting = 1;
#endif
  kvq_cache *cache = (kvq_cache *)1;
  const kvq_status st = kvq_cache_load_from_memory(ctx, file, size, &cache);
#ifdef COUNT_ALLOCATIONS
  counting = 0;
#endif
  const char *why = kvq_context_last_error(ctx);
  cr_assert_eq(st, KVQ_ERROR_OUT_OF_RANGE, "%s: %s", kvq_status_string(st), why);
  cr_assert_null(cache);

  /* What it would have taken: far above the automatic limit, within the 2^46 bytes any config may
   * ask for (so that nothing but the limit refuses it at this point). */
  unsigned long long wanted = 0, limit = 0;
  const char *at_wanted = strstr(why, "allocate "), *at_limit = strstr(why, "limit of ");
  cr_assert(at_wanted && at_limit && sscanf(at_wanted + 9, "%llu", &wanted) == 1 && sscanf(at_limit + 9, "%llu", &limit) == 1,
            "message: %s", why);
  cr_assert_geq(wanted, 16ull << 30, "the crafted config asks for %llu bytes only", wanted);
  cr_assert_leq(wanted, 1ull << 46);
  cr_assert_eq(limit, KVQ_LOAD_LIMIT_FLOOR, "a %zu-byte file: the floor applies", size);
#ifdef COUNT_ALLOCATIONS
  /* 64 KiB: far below any of this cache's arrays (its free-page list alone, 4 bytes per page, is
   * hundreds of MiB); the refusal allocates the config's layer records only. */
  cr_assert_lt(largest, 64 << 10, "a refused load allocated a block of %zu bytes", largest);
  kvq_context_destroy(ctx);
  free(file);
#else
  kvq_context_destroy(ctx);
  free(file);
  cr_skip("not built with AddressSanitizer: allocations cannot be counted (the status was checked)");
#endif
}

/* Every golden cache loads under the automatic limit, under a limit of exactly what it takes, and
 * is refused one byte below; 0 restores the automatic limit. */
Test(load_limit, golden_caches_load_within_the_limit) {
  const char *names[] = {"cache-v1.kvq", "cache-policy-v1.kvq", "cache-codebooks-v1.kvq"};
  kvq_context *ctx = th_cpu_context();
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    size_t size;
    uint8_t *file = read_golden(names[i], &size);
    kvq_cache *cache = NULL;
    KVQ_CHECK(ctx, kvq_cache_load_from_memory(ctx, file, size, &cache));
    kvq_cache_config config;
    uint64_t bytes = 0;
    KVQ_CHECK(ctx, kvq_cache_get_config(cache, &config));
    KVQ_CHECK(ctx, kvq_cache_config_bytes(&config, &bytes));
    kvq_cache_destroy(cache);

    KVQ_CHECK(ctx, kvq_context_set_load_limit(ctx, bytes));
    KVQ_CHECK(ctx, kvq_cache_load_from_memory(ctx, file, size, &cache));
    kvq_cache_destroy(cache);
    KVQ_CHECK(ctx, kvq_context_set_load_limit(ctx, bytes - 1));
    cr_assert_eq(kvq_cache_load_from_memory(ctx, file, size, &cache), KVQ_ERROR_OUT_OF_RANGE, "%s", names[i]);
    cr_assert_null(cache);
    KVQ_CHECK(ctx, kvq_context_set_load_limit(ctx, 0));
    KVQ_CHECK(ctx, kvq_cache_load_from_memory(ctx, file, size, &cache));
    kvq_cache_destroy(cache);
    free(file);
  }
  cr_assert_eq(kvq_context_set_load_limit(NULL, 1), KVQ_ERROR_INVALID_ARGUMENT);
  kvq_context_destroy(ctx);
}
