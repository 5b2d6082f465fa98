/* Fuzz target: the kvq tool's .npy reader (tools/npy.c), which takes a path: each input is written
 * to one temporary file per process. Properties: no crash, leak or out-of-bounds access; a refused
 * file gives a reason; an accepted one has rank 1..4, a buffer of exactly the shape's elements (all
 * read here, so that ASan checks its size), and writing it back and reading that again gives the
 * same shape and bits (NaNs compared as NaNs: fp16 signalling NaNs come back quiet). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "tools/npy.h"

static char path[128], path2[128];

static void remove_files(void) {
  if (path[0]) unlink(path);
  if (path2[0]) unlink(path2);
}

static void make_paths(void) {
  if (path[0]) return;
  const char *dir = getenv("TMPDIR");
  snprintf(path, sizeof path, "%.40s/kvq-fuzz-npy-%ld.npy", dir && strlen(dir) < 40 ? dir : "/tmp", (long)getpid());
  snprintf(path2, sizeof path2, "%.40s/kvq-fuzz-npy-%ld-2.npy", dir && strlen(dir) < 40 ? dir : "/tmp", (long)getpid());
  atexit(remove_files);
}

static int same_bits(float a, float b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  return memcmp(&a, &b, sizeof a) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  make_paths();
  FILE *f = fopen(path, "wb");
  if (!f) fuzz_fail("cannot write %s", path);
  if ((size && fwrite(data, 1, size, f) != size) | (fclose(f) != 0)) fuzz_fail("cannot write %s", path);

  kvq_npy a, b;
  char why[256];
  if (kvq_npy_read(path, &a, why, sizeof why) != 0) {
    if (!why[0]) fuzz_fail("a refused .npy without a reason");
    if (a.data) fuzz_fail("a refused .npy left data");
    return 0;
  }
  if (!a.data || a.rank < 1 || a.rank > 4) fuzz_fail("accepted with rank %u or no data", a.rank);
  uint64_t n = 1;
  for (uint32_t i = 0; i < a.rank; i++) {
    if (a.shape[i] < 0) fuzz_fail("negative dimension");
    n *= (uint64_t)a.shape[i];
  }
  if (n * (a.source_fp16 ? 2u : 4u) > size) fuzz_fail("%llu elements from a %zu-byte file", (unsigned long long)n, size);
  volatile float sink = 0;
  for (uint64_t i = 0; i < n; i++) sink += a.data[i];
  (void)sink;

  if (kvq_npy_write(path2, a.data, a.rank, a.shape, a.source_fp16, why, sizeof why) != 0) fuzz_fail("write back: %s", why);
  if (kvq_npy_read(path2, &b, why, sizeof why) != 0) fuzz_fail("read back: %s", why);
  if (b.rank != a.rank || b.source_fp16 != a.source_fp16 || memcmp(b.shape, a.shape, sizeof a.shape) != 0)
    fuzz_fail("read back with another shape");
  for (uint64_t i = 0; i < n; i++)
    if (!same_bits(a.data[i], b.data[i])) fuzz_fail("element %llu differs after a round trip", (unsigned long long)i);
  kvq_npy_free(&a);
  kvq_npy_free(&b);
  return 0;
}
