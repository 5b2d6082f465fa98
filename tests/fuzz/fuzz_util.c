/* What the fuzz targets share (tests/fuzz/fuzz.h). */
#include "fuzz.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/savefile.h"
#include "core/sha256.h"
#include "tests/sanitizer_hooks.h"

kvq_context *fuzz_context(void) {
  static kvq_context *ctx;
  if (ctx) return ctx;
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_CPU;
  if (kvq_context_create(&opt, &ctx) != KVQ_OK || kvq_context_set_load_limit(ctx, FUZZ_CACHE_BYTES) != KVQ_OK)
    fuzz_fail("cannot create a CPU context");
  return ctx;
}

void fuzz_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("fuzz target: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* MATX / CODE records (docs/FORMAT.md): u32 count, then per array 6 u32, u64 float count, 32 bytes
 * SHA-256, the floats. */
static void fix_fixed_arrays(uint8_t *data, uint64_t at, uint64_t end) {
  kvq_reader r = {data, end, at, 0};
  const uint32_t count = kvq_get_u32(&r);
  for (uint32_t k = 0; k < count && !r.short_read; k++) {
    kvq_get_bytes(&r, 24);
    const uint64_t floats = kvq_get_u64(&r);
    const uint64_t sha_at = r.pos;
    kvq_get_bytes(&r, 32);
    if (r.short_read || floats > (r.size - r.pos) / 4) return;
    kvq_sha256_digest(data + r.pos, (size_t)floats * 4, data + sha_at);
    r.pos += floats * 4;
  }
}

void fuzz_fix_checksums(uint8_t *data, size_t size) {
  if (size < KVQ_FILE_HEADER_BYTES + 32) return;
  put_u64(data + 16, size);
  const uint64_t body_end = size - 32;
  kvq_reader file = {data, body_end, KVQ_FILE_HEADER_BYTES, 0};
  while (!file.short_read && file.pos + 16 <= body_end) {
    const uint32_t tag = kvq_get_u32(&file);
    kvq_get_u32(&file);
    const uint64_t payload = kvq_get_u64(&file);
    if (payload > body_end - file.pos) break;
    if (tag == KVQ_TAG_MATX || tag == KVQ_TAG_CODE) fix_fixed_arrays(data, file.pos, file.pos + payload);
    const uint64_t padded = payload + (8 - payload % 8) % 8;
    if (padded > body_end - file.pos) break;
    file.pos += padded;
  }
  kvq_sha256_digest(data, (size_t)body_end, data + body_end);
}

#ifdef SANITIZER_HOOKS
static int64_t live, peak;
static int counting;
static void on_malloc(const volatile void *ptr, size_t size) {
  (void)ptr;
  if (!counting) return;
  live += (int64_t)size;
  if (live > peak) peak = live;
}
static void on_free(const volatile void *ptr) {
  if (counting && ptr) live -= (int64_t)__sanitizer_get_allocated_size(ptr);
}
void fuzz_count_start(void) {
  static int installed;
  if (!installed) installed = 1, __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
  live = peak = 0;
  counting = 1;
}
fuzz_count fuzz_count_stop(void) {
  counting = 0;
  return (fuzz_count){live, peak};
}
#else
void fuzz_count_start(void) {}
fuzz_count fuzz_count_stop(void) { return (fuzz_count){0, 0}; }
#endif
