/* NumPy .npy reader and writer (tools/npy.h): round trips, NumPy's exact byte layout, header
 * variants, every rejection with its message, truncation at every length, mutated headers. */
#include <criterion/criterion.h>

#include "helpers.h"
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/halfconv.h"
#include "tools/npy.h"

/* ---- helpers ------------------------------------------------------------------------------- */

/* A fresh empty file under /tmp; the caller removes it. */
static void temp_path(char path[32]) {
  strcpy(path, "/tmp/kvq-npy-XXXXXX");
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0, "mkstemp");
  close(fd);
}

/* Replaces the file at `path` by a new one (a new file rather than a truncated one: ext4 flushes
 * files that are truncated and rewritten on close, which would make the loops below I/O-bound). */
static void write_bytes(const char *path, const void *bytes, size_t size) {
  remove(path);
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "fopen %s", path);
  cr_assert_eq(fwrite(bytes, 1, size, f), size);
  cr_assert_eq(fclose(f), 0);
}

/* A string literal's bytes, without its terminating NUL. */
#define WRITE_LITERAL(path, literal) write_bytes(path, literal, sizeof literal - 1)

/* The whole file (malloc'ed, the caller frees). */
static unsigned char *read_bytes(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "fopen %s", path);
  size_t cap = 1024, n = 0;
  unsigned char *buf = malloc(cap);
  for (;;) {
    if (n == cap) buf = realloc(buf, cap *= 2);
    size_t got = fread(buf + n, 1, cap - n, f);
    if (got == 0) break;
    n += got;
  }
  fclose(f);
  *size = n;
  return buf;
}

/* A .npy image: magic, version major.0, the header text exactly as given (no padding added), then
 * `data_size` bytes of data. */
static unsigned char *make_npy(unsigned major, const char *header, const void *data, size_t data_size, size_t *size) {
  size_t hlen = strlen(header), len_bytes = major == 1 ? 2 : 4;
  *size = 8 + len_bytes + hlen + data_size;
  unsigned char *b = malloc(*size);
  memcpy(b, "\x93NUMPY", 6);
  b[6] = (unsigned char)major;
  b[7] = 0;
  for (size_t k = 0; k < len_bytes; k++) b[8 + k] = (unsigned char)(hlen >> (8 * k) & 0xff);
  memcpy(b + 8 + len_bytes, header, hlen);
  if (data_size) memcpy(b + 8 + len_bytes + hlen, data, data_size);
  return b;
}

/* The first `n` of 0, 1, 2, ... as little-endian fp32 bytes. */
static void counting_f32(unsigned char *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = (float)i;
    uint32_t u;
    memcpy(&u, &x, 4);
    for (int k = 0; k < 4; k++) out[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
  }
}

/* A failed read: nonzero result, output zeroed, a one-line message "PATH: ..." containing `want`. */
static void expect_reject(const char *path, const char *want, const char *what) {
  kvq_npy npy;
  memset(&npy, 0xab, sizeof npy);
  char error[512];
  int rc = kvq_npy_read(path, &npy, error, sizeof error);
  cr_assert_neq(rc, 0, "%s: must be rejected", what);
  cr_assert_null(npy.data, "%s: data NULL on failure", what);
  cr_assert_eq(npy.rank, 0, "%s: output zeroed on failure", what);
  cr_assert_eq(strncmp(error, path, strlen(path)), 0, "%s: message starts with the path: %s", what, error);
  cr_assert_eq(strncmp(error + strlen(path), ": ", 2), 0, "%s: '%s'", what, error);
  cr_assert_gt(strlen(error), strlen(path) + 2, "%s: a reason", what);
  cr_assert_null(strchr(error, '\n'), "%s: one line: %s", what, error);
  if (want) cr_assert_not_null(strstr(error, want), "%s: message '%s' lacks '%s'", what, error, want);
  kvq_npy_free(&npy);
}

/* Writes `header` (format `major`) with `data_size` counting bytes and expects a rejection. */
static void reject_header(unsigned major, const char *header, size_t data_size, const char *want) {
  unsigned char data[256];
  cr_assert_leq(data_size, sizeof data);
  counting_f32(data, sizeof data / 4);
  size_t size;
  unsigned char *b = make_npy(major, header, data, data_size, &size);
  char path[32];
  temp_path(path);
  write_bytes(path, b, size);
  expect_reject(path, want, header);
  remove(path);
  free(b);
}

/* Reads an image written from `header` and `data_size` counting bytes and checks the shape. */
static void accept_header(unsigned major, const char *header, size_t data_size, uint32_t rank, const int64_t *shape,
                          int fp16) {
  unsigned char data[256];
  cr_assert_leq(data_size, sizeof data);
  counting_f32(data, sizeof data / 4);
  size_t size;
  unsigned char *b = make_npy(major, header, data, data_size, &size);
  char path[32];
  temp_path(path);
  write_bytes(path, b, size);
  kvq_npy npy;
  char error[512] = "";
  cr_assert_eq(kvq_npy_read(path, &npy, error, sizeof error), 0, "%s: %s", header, error);
  cr_assert_eq(npy.rank, rank, "%s", header);
  int64_t count = 1;
  for (uint32_t d = 0; d < 4; d++) {
    cr_assert_eq(npy.shape[d], d < rank ? shape[d] : 0, "%s: dim %u", header, d);
    if (d < rank) count *= shape[d];
  }
  cr_assert_eq(npy.source_fp16, fp16, "%s", header);
  if (!fp16)
    for (int64_t i = 0; i < count; i++) cr_assert_eq(npy.data[i], (float)i, "%s: element %lld", header, (long long)i);
  kvq_npy_free(&npy);
  cr_assert_null(npy.data);
  remove(path);
  free(b);
}

static uint64_t lcg(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

/* Values covering signs, zeros, subnormals, huge, Inf and NaN. */
static float sample_value(size_t i) {
  static const float specials[] = {0.0f, -0.0f, 1.0f, -2.5f, 1e-40f, -3e-8f, 6e-5f, 65504.0f, 65520.0f, 3.4e38f,
                                   1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0.1f, -1e-3f};
  const size_t ns = sizeof specials / sizeof specials[0];
  if (i < ns) return specials[i];
  if (i == ns) return INFINITY;
  if (i == ns + 1) return -INFINITY;
  if (i == ns + 2) return NAN;
  return (float)sin((double)i * 0.7) * (float)(1 << (i % 9));
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ---- round trips ---------------------------------------------------------------------------- */

static const int64_t round_trip_shapes[4][4] = {{37, 0, 0, 0}, {3, 5, 0, 0}, {2, 3, 4, 0}, {2, 1, 3, 5}};

/* One round trip of the sample values in a given rank, stored as fp32 or fp16: the written file's
 * bytes and data offset, and what reading it back gave. */
typedef struct round_trip {
  float *x;
  size_t count, size, data_offset;
  unsigned char *bytes;
  kvq_npy npy;
  char path[32];
} round_trip;

/* Writes, checks the data offset (a multiple of 64) and the file size, reads back, checks the rank,
 * the source dtype and the shape. */
static void round_trip_run(round_trip *rt, uint32_t rank, int fp16) {
  const int64_t *shape = round_trip_shapes[rank - 1];
  rt->count = 1;
  for (uint32_t d = 0; d < rank; d++) rt->count *= (size_t)shape[d];
  rt->x = malloc(rt->count * sizeof *rt->x);
  for (size_t i = 0; i < rt->count; i++) rt->x[i] = sample_value(i);
  char error[256] = "";
  temp_path(rt->path);
  cr_assert_eq(kvq_npy_write(rt->path, rt->x, rank, shape, fp16, error, sizeof error), 0, "rank %u: %s", rank, error);
  rt->bytes = read_bytes(rt->path, &rt->size);
  rt->data_offset = 10 + ((size_t)rt->bytes[8] | (size_t)rt->bytes[9] << 8);
  cr_assert_eq(rt->data_offset % 64, 0, "rank %u: data at %zu, a multiple of 64", rank, rt->data_offset);
  cr_assert_eq(rt->size, rt->data_offset + (fp16 ? 2 : 4) * rt->count, "rank %u: file size", rank);
  cr_assert_eq(kvq_npy_read(rt->path, &rt->npy, error, sizeof error), 0, "rank %u: %s", rank, error);
  cr_assert_eq(rt->npy.rank, rank);
  cr_assert_eq(rt->npy.source_fp16, fp16);
  for (uint32_t d = 0; d < 4; d++) cr_assert_eq(rt->npy.shape[d], d < rank ? shape[d] : 0, "rank %u dim %u", rank, d);
}

static void round_trip_end(round_trip *rt) {
  free(rt->bytes);
  kvq_npy_free(&rt->npy);
  remove(rt->path);
  free(rt->x);
}

Test(npy, round_trip_f32_ranks_1_to_4) {
  for (uint32_t rank = 1; rank <= 4; rank++) {
    round_trip rt;
    round_trip_run(&rt, rank, 0);
    cr_assert_eq(rt.bytes[rt.data_offset - 1], '\n');
    for (size_t i = 0; i < rt.count; i++)
      cr_assert(same_bits(rt.npy.data[i], rt.x[i]), "rank %u element %zu: %a vs %a", rank, i, (double)rt.npy.data[i],
                (double)rt.x[i]);
    kvq_npy_free(&rt.npy);
    round_trip_end(&rt); /* the second kvq_npy_free is harmless */
  }
}

Test(npy, round_trip_f16_ranks_1_to_4_rounds_half_to_even) {
  for (uint32_t rank = 1; rank <= 4; rank++) {
    round_trip rt;
    round_trip_run(&rt, rank, 1);
    const float *x = rt.x;
    const kvq_npy npy = rt.npy;
    cr_assert_not_null(strstr((const char *)rt.bytes + 10, "'descr': '<f2'"));
    for (size_t i = 0; i < rt.count; i++) {
      uint32_t h = (uint32_t)rt.bytes[rt.data_offset + 2 * i] | (uint32_t)rt.bytes[rt.data_offset + 2 * i + 1] << 8;
      cr_assert_eq(h, kvq_f32_to_f16_bits(x[i]), "rank %u element %zu: stored little-endian fp16", rank, i);
    }
    for (size_t i = 0; i < rt.count; i++) {
      float want = kvq_round_f16(x[i]);
      if (isnan(want)) cr_assert(isnan(npy.data[i]), "element %zu NaN", i);
      else cr_assert(same_bits(npy.data[i], want), "rank %u element %zu: %a vs %a", rank, i, (double)npy.data[i], (double)want);
    }
    /* Ties round to even, overflow to Inf, below half the smallest subnormal to zero. */
    if (rank == 1) {
      cr_assert_eq(npy.data[10], 1.0f, "1 + 2^-11 is a tie: rounds to even 1.0");
      cr_assert_eq(npy.data[11], 1.0f + 0x1p-9f, "1 + 3*2^-11 is a tie: rounds to even 1 + 2^-9");
      cr_assert_eq(npy.data[7], 65504.0f);
      cr_assert(isinf(npy.data[8]) && npy.data[8] > 0, "65520 rounds to Inf");
      cr_assert(same_bits(npy.data[4], 0.0f), "1e-40 becomes +0");
    }
    round_trip_end(&rt);
  }
}

Test(npy, every_f16_value_reads_exactly) {
  static unsigned char data[65536 * 2];
  for (uint32_t h = 0; h < 65536; h++) {
    data[2 * h] = (unsigned char)(h & 0xff);
    data[2 * h + 1] = (unsigned char)(h >> 8);
  }
  const char *header = "{'descr': '<f2', 'fortran_order': False, 'shape': (256, 256), }          \n";
  size_t size;
  unsigned char *b = make_npy(1, header, data, sizeof data, &size);
  char path[32], error[256] = "";
  temp_path(path);
  write_bytes(path, b, size);
  kvq_npy npy;
  cr_assert_eq(kvq_npy_read(path, &npy, error, sizeof error), 0, "%s", error);
  cr_assert_eq(npy.rank, 2);
  cr_assert_eq(npy.source_fp16, 1);
  for (uint32_t h = 0; h < 65536; h++)
    cr_assert(same_bits(npy.data[h], kvq_f16_bits_to_f32(h)), "0x%04x", h);
  kvq_npy_free(&npy);
  remove(path);
  free(b);
}

Test(npy, zero_element_arrays) {
  const int64_t shape[2] = {0, 3};
  char path[32], error[256] = "";
  temp_path(path);
  cr_assert_eq(kvq_npy_write(path, NULL, 2, shape, 0, error, sizeof error), 0, "%s", error);
  kvq_npy npy;
  cr_assert_eq(kvq_npy_read(path, &npy, error, sizeof error), 0, "%s", error);
  cr_assert_eq(npy.rank, 2);
  cr_assert_eq(npy.shape[0], 0);
  cr_assert_eq(npy.shape[1], 3);
  cr_assert_not_null(npy.data, "data is never NULL after a successful read");
  kvq_npy_free(&npy);
  remove(path);
}

/* ---- NumPy's exact byte layout ------------------------------------------------------------- */

/* What numpy.save writes: magic, version 1.0, u16 header length, the dict (sorted keys, ", " after
 * each value), 21 - len(str(shape[0])) spare spaces, then spaces up to byte 127 and a '\n', so
 * the data starts at byte 128. Built here by hand, independently of the writer. */
static size_t numpy_image(const char *dict, const unsigned char *data, size_t data_size, size_t data_start,
                          unsigned char *out) {
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  out[8] = (unsigned char)((data_start - 10) & 0xff);
  out[9] = (unsigned char)((data_start - 10) >> 8);
  memset(out + 10, ' ', data_start - 10);
  memcpy(out + 10, dict, strlen(dict));
  out[data_start - 1] = '\n';
  if (data_size) memcpy(out + data_start, data, data_size);
  return data_start + data_size;
}

static void expect_file_bytes(const char *path, const unsigned char *want, size_t want_size) {
  size_t size;
  unsigned char *got = read_bytes(path, &size);
  cr_assert_eq(size, want_size, "file size %zu, expected %zu", size, want_size);
  for (size_t i = 0; i < size; i++)
    cr_assert_eq(got[i], want[i], "byte %zu: 0x%02x, expected 0x%02x ('%c')", i, got[i], want[i],
                 want[i] >= 0x20 && want[i] < 0x7f ? want[i] : '?');
  free(got);
}

Test(npy, writes_numpy_bytes_exactly_f32) {
  const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  cr_assert_eq(strlen(dict), 59);
  /* 10 + 59 + 20 spare + '\n' = 90 -> padded to 128: header length 118 = 0x76. */
  unsigned char data[24], want[256];
  counting_f32(data, 6);
  size_t want_size = numpy_image(dict, data, sizeof data, 128, want);
  cr_assert_eq(want[8], 0x76);
  cr_assert_eq(want[9], 0x00);
  cr_assert_eq(want[10 + 59 + 20], ' ');
  cr_assert_eq(want[128 + 4], 0x00); /* 1.0f = 0x3f800000, little-endian */
  cr_assert_eq(want[128 + 7], 0x3f);

  const float x[6] = {0, 1, 2, 3, 4, 5};
  const int64_t shape[2] = {2, 3};
  char path[32], error[256] = "";
  temp_path(path);
  cr_assert_eq(kvq_npy_write(path, x, 2, shape, 0, error, sizeof error), 0, "%s", error);
  expect_file_bytes(path, want, want_size);

  kvq_npy npy;
  cr_assert_eq(kvq_npy_read(path, &npy, error, sizeof error), 0, "%s", error);
  cr_assert_eq(npy.rank, 2);
  cr_assert_eq(npy.shape[0], 2);
  cr_assert_eq(npy.shape[1], 3);
  for (int i = 0; i < 6; i++) cr_assert_eq(npy.data[i], x[i]);
  kvq_npy_free(&npy);
  remove(path);
}

Test(npy, writes_numpy_bytes_exactly_f16_rank_1) {
  const char *dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }";
  unsigned char data[10], want[256];
  const float x[5] = {1.0f, -2.0f, 0.5f, 65504.0f, 1.0f + 0x1p-11f};
  const uint16_t h[5] = {0x3c00, 0xc000, 0x3800, 0x7bff, 0x3c00};
  for (int i = 0; i < 5; i++) {
    data[2 * i] = (unsigned char)(h[i] & 0xff);
    data[2 * i + 1] = (unsigned char)(h[i] >> 8);
  }
  size_t want_size = numpy_image(dict, data, sizeof data, 128, want);
  const int64_t shape[1] = {5};
  char path[32], error[256] = "";
  temp_path(path);
  cr_assert_eq(kvq_npy_write(path, x, 1, shape, 1, error, sizeof error), 0, "%s", error);
  expect_file_bytes(path, want, want_size);
  remove(path);
}

Test(npy, writes_numpy_bytes_exactly_when_already_aligned) {
  /* 10 + 117 + 1 = 128 is already aligned: NumPy's padlen = 64 - 0 adds a full 64 spaces. */
  const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 999999999999, 999999999999, 99999999999), }";
  cr_assert_eq(strlen(dict) + 20, 117);
  unsigned char want[256];
  size_t want_size = numpy_image(dict, NULL, 0, 192, want);
  const int64_t shape[4] = {0, 999999999999, 999999999999, 99999999999};
  char path[32], error[256] = "";
  temp_path(path);
  cr_assert_eq(kvq_npy_write(path, NULL, 4, shape, 0, error, sizeof error), 0, "%s", error);
  expect_file_bytes(path, want, want_size);
  kvq_npy npy;
  cr_assert_eq(kvq_npy_read(path, &npy, error, sizeof error), 0, "%s", error);
  cr_assert_eq(npy.rank, 4);
  cr_assert_eq(npy.shape[3], 99999999999);
  kvq_npy_free(&npy);
  remove(path);
}

/* ---- header variants that must be accepted ------------------------------------------------- */

Test(npy, header_variants) {
  const int64_t s3[1] = {3}, s23[2] = {2, 3}, s234[3] = {2, 3, 4}, s1111[4] = {1, 1, 1, 1};
  /* Older NumPy: no spare space, 16-byte alignment. */
  accept_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }     \n", 12, 1, s3, 0);
  /* Keys in any order, other spacing, double quotes, no trailing comma, tabs, CR LF. */
  accept_header(1, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}", 24, 2, s23, 0);
  accept_header(1, "{ \"fortran_order\" :False,\t\"shape\":(2,3,4),\"descr\":\"<f4\" ,}\r\n", 96, 3, s234, 0);
  accept_header(1, "  {'descr':'<f4','fortran_order':False,'shape':( 2 , 3 , )}", 24, 2, s23, 0);
  accept_header(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (1, 1, 1, 1), }\n", 2, 4, s1111, 1);
  /* Python 2 longs in format 1.0 and 2.0. */
  accept_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }\n", 24, 2, s23, 0);
  accept_header(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3L,), }\n", 12, 1, s3, 0);
}

Test(npy, format_versions_2_and_3) {
  const int64_t s23[2] = {2, 3};
  char header[300];
  /* As numpy.save(..., version=(2, 0)) pads: 12 prefix bytes, data at a multiple of 64. */
  const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  memset(header, ' ', 128 - 12);
  memcpy(header, dict, strlen(dict));
  header[128 - 12 - 1] = '\n';
  header[128 - 12] = '\0';
  accept_header(2, header, 24, 2, s23, 0);
  accept_header(3, header, 24, 2, s23, 0);
  /* The length field really is 32-bit: a header longer than 65535 bytes. */
  size_t big = 70000;
  char *long_header = malloc(big + 1);
  memset(long_header, ' ', big);
  memcpy(long_header, dict, strlen(dict));
  long_header[big - 1] = '\n';
  long_header[big] = '\0';
  size_t size;
  unsigned char data[24];
  counting_f32(data, 6);
  unsigned char *b = make_npy(2, long_header, data, sizeof data, &size);
  cr_assert_eq(b[10], (big >> 16) & 0xff);
  char path[32], error[256] = "";
  temp_path(path);
  write_bytes(path, b, size);
  kvq_npy npy;
  cr_assert_eq(kvq_npy_read(path, &npy, error, sizeof error), 0, "%s", error);
  cr_assert_eq(npy.rank, 2);
  cr_assert_eq(npy.data[5], 5.0f);
  kvq_npy_free(&npy);
  remove(path);
  free(b);
  free(long_header);
}

/* ---- rejections ---------------------------------------------------------------------------- */

Test(npy, rejects_unsupported_dtypes_with_the_reason) {
  /* The exact message for the common case. */
  unsigned char data[48];
  counting_f32(data, 12);
  size_t size;
  unsigned char *b = make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }\n", data, 48, &size);
  char path[32], error[256], want[300];
  temp_path(path);
  write_bytes(path, b, size);
  kvq_npy npy;
  cr_assert_neq(kvq_npy_read(path, &npy, error, sizeof error), 0);
  snprintf(want, sizeof want, "%s: dtype '<f8' not supported (need <f4 or <f2)", path);
  cr_assert_str_eq(error, want);
  remove(path);
  free(b);

  reject_header(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }\n", 24, "dtype '>f4' is big-endian");
  reject_header(1, "{'descr': '>f2', 'fortran_order': False, 'shape': (6,), }\n", 12, "big-endian");
  reject_header(1, "{'descr': '|f2', 'fortran_order': False, 'shape': (6,), }\n", 12, "dtype '|f2' not supported");
  reject_header(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (6,), }\n", 24, "dtype '<i4' not supported");
  reject_header(1, "{'descr': 'float32', 'fortran_order': False, 'shape': (6,), }\n", 24, "dtype 'float32' not supported");
  reject_header(1, "{'descr': '', 'fortran_order': False, 'shape': (6,), }\n", 24, "dtype '' not supported");
  reject_header(1, "{'descr': '<f4<f4<f4<f4<f4<f4<f4<f4<f4<f4<f4<f4<f4<f4', 'fortran_order': False, 'shape': (6,), }\n",
                24, "not supported (need <f4 or <f2)");
  reject_header(1, "{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (6,), }\n", 24, "structured dtypes");
}

Test(npy, rejects_fortran_order_and_bad_ranks) {
  reject_header(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", 24, "fortran_order True not supported");
  reject_header(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }\n", 24, "must be True or False");
  reject_header(1, "{'descr': '<f4', 'fortran_order': false, 'shape': (2, 3), }\n", 24, "must be True or False");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }\n", 4, "rank 0 (shape ()) not supported");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1), }\n", 4, "rank 5 not supported");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1), }\n",
                4, "rank 40 not supported");
}

Test(npy, rejects_negative_and_absurd_dims_and_overflow) {
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }\n", 4, "negative dimension -1");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }\n", 24, "negative dimension -3");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999999,), }\n", 4,
                "dimension 99999999999999999999999999 in 'shape' is absurdly large");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551616,), }\n", 4, "absurdly large");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627777,), }\n", 4,
                "dimension 1099511627777 in 'shape' is absurdly large");
  /* Each dimension plausible, the product not: would overflow 64 bits without the check. */
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }\n", 4,
                "shape (1099511627776, 1099511627776) has more than 2^40 elements");
  reject_header(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296, 2), }\n", 4,
                "more than 2^40 elements");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048577), }\n", 4,
                "more than 2^40 elements");
  /* Exactly 2^40 elements passes the count check and then fails on the (missing) data. */
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576), }\n", 4,
                "truncated data: shape (1048576, 1048576) of <f4 needs 4398046511104 bytes after the header, the file has 4");
}

Test(npy, rejects_truncated_and_oversized_data) {
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 20,
                "truncated data: shape (2, 3) of <f4 needs 24 bytes after the header, the file has 20");
  reject_header(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (7,), }\n", 13,
                "truncated data: shape (7,) of <f2 needs 14 bytes after the header, the file has 13");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 0, "the file has 0");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 25,
                "1 unexpected bytes after the data (shape (2, 3) of <f4 is 24 bytes)");
}

Test(npy, rejects_malformed_headers) {
  reject_header(1, "{'descr': '<f4', 'fortran_order': False}\n", 24, "header lacks the key 'shape'");
  reject_header(1, "{'shape': (6,), 'fortran_order': False}\n", 24, "header lacks the key 'descr'");
  reject_header(1, "{'descr': '<f4', 'shape': (6,)}\n", 24, "header lacks the key 'fortran_order'");
  reject_header(1, "{}\n", 24, "header lacks the key");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'extra': 1}\n", 24, "unknown header key 'extra'");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'descr': '<f4'}\n", 24,
                "duplicate header key 'descr'");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6), }\n", 24, "'shape' (6) is not a tuple");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [6], }\n", 24, "'shape' must be a tuple");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,,), }\n", 24, "malformed header");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }\n", 24, "malformed header");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6.0,), }\n", 24, "malformed header");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0x6,), }\n", 24, "malformed header");
  reject_header(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (6L,), }\n", 24, "malformed header");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), } x\n", 24,
                "expected only spaces and a newline after the header dict");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }\x7f\n", 24, "found byte 0x7f");
  reject_header(1, "{'descr': '<f4' 'fortran_order': False, 'shape': (6,), }\n", 24, "expected ',' or '}'");
  reject_header(1, "{'descr' '<f4', 'fortran_order': False, 'shape': (6,), }\n", 24, "expected ':'");
  reject_header(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (6,), }\n", 24, "malformed header");
  reject_header(1, "{'descr': '<f4\n", 24, "unterminated string");
  reject_header(1, "{'de\\scr': '<f4', 'fortran_order': False, 'shape': (6,), }\n", 24, "escape sequences");
  reject_header(1, "{descr: '<f4', 'fortran_order': False, 'shape': (6,), }\n", 24, "expected a quoted string");
  reject_header(1, "('descr', '<f4')\n", 24, "expected '{'");
  reject_header(1, "", 24, "found the end of the header");
  reject_header(1, "\n", 24, "malformed header");
  reject_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,),\n", 24, "found the end of the header");
}

Test(npy, rejects_bad_files) {
  char path[32];
  temp_path(path);
  WRITE_LITERAL(path, "");
  expect_reject(path, "truncated: 0 bytes", "empty file");
  WRITE_LITERAL(path, "\x93NUMPY\x01");
  expect_reject(path, "truncated: 7 bytes", "magic only");
  WRITE_LITERAL(path, "PK\x03\x04 this is a zip");
  expect_reject(path, "not a .npy file", "zip");
  WRITE_LITERAL(path, "\x93NUMPZ\x01\x00\x10\x00");
  expect_reject(path, "not a .npy file", "bad magic");
  WRITE_LITERAL(path, "\x93NUMPY\x04\x00\x10\x00\x00\x00");
  expect_reject(path, "unsupported .npy format version 4.0 (need 1.0, 2.0 or 3.0)", "version 4");
  WRITE_LITERAL(path, "\x93NUMPY\x01\x01\x10\x00");
  expect_reject(path, "unsupported .npy format version 1.1", "version 1.1");
  WRITE_LITERAL(path, "\x93NUMPY\x01\x00\x10");
  expect_reject(path, "truncated in the header length field", "half a length");
  WRITE_LITERAL(path, "\x93NUMPY\x02\x00\xff\xff\xff\xff{}");
  expect_reject(path, "header length 4294967295 is absurd", "4 GiB header");
  WRITE_LITERAL(path, "\x93NUMPY\x01\x00\x76\x00{'descr'");
  expect_reject(path, "truncated header: 118 bytes announced, 8 present", "short header");
  /* A NUL in the padding (where a C string would end). */
  unsigned char with_nul[10 + 64 + 24];
  const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }";
  memcpy(with_nul, "\x93NUMPY\x01\x00\x40\x00", 10);
  memset(with_nul + 10, ' ', 64);
  memcpy(with_nul + 10, dict, strlen(dict));
  with_nul[10 + 62] = '\0';
  with_nul[10 + 63] = '\n';
  counting_f32(with_nul + 74, 6);
  write_bytes(path, with_nul, sizeof with_nul);
  expect_reject(path, "found byte 0x00", "NUL in the header");
  with_nul[10 + 62] = ' ';
  write_bytes(path, with_nul, sizeof with_nul);
  kvq_npy npy;
  char error[256];
  cr_assert_eq(kvq_npy_read(path, &npy, error, sizeof error), 0, "the same file without the NUL: %s", error);
  kvq_npy_free(&npy);
  remove(path);
  expect_reject(path, "cannot open", "missing file");
  expect_reject("/tmp", "is a directory", "directory");
}

Test(npy, error_buffer_edge_cases) {
  kvq_npy npy;
  /* No buffer at all, a tiny one, and NULL arguments: no crash, and a NUL-terminated prefix. */
  cr_assert_neq(kvq_npy_read("/nonexistent-kvq/x.npy", &npy, NULL, 0), 0);
  char tiny[8];
  memset(tiny, 'x', sizeof tiny);
  cr_assert_neq(kvq_npy_read("/nonexistent-kvq/x.npy", &npy, tiny, sizeof tiny), 0);
  cr_assert_eq(tiny[7], '\0');
  cr_assert_eq(strncmp(tiny, "/nonexi", 7), 0);
  char error[256];
  cr_assert_neq(kvq_npy_read(NULL, &npy, error, sizeof error), 0);
  cr_assert_neq(kvq_npy_read("/tmp/x.npy", NULL, error, sizeof error), 0);
  cr_assert_neq(kvq_npy_write(NULL, NULL, 1, (const int64_t[]){0}, 0, error, sizeof error), 0);
  kvq_npy_free(NULL);
}

static void expect_write_fails(const char *path, const float *data, uint32_t rank, const int64_t *shape,
                               const char *want) {
  char error[256] = "";
  cr_assert_neq(kvq_npy_write(path, data, rank, shape, 0, error, sizeof error), 0, "%s", want);
  cr_assert_not_null(strstr(error, want), "message '%s' lacks '%s'", error, want);
  cr_assert_eq(strncmp(error, path, strlen(path)), 0, "%s", error);
}

Test(npy, writer_rejections) {
  const float x[4] = {1, 2, 3, 4};
  const int64_t ok[5] = {1, 1, 1, 1, 4}, neg[2] = {2, -2}, huge[1] = {(int64_t)1 << 41},
                big[2] = {(int64_t)1 << 30, (int64_t)1 << 30};
  char path[32];
  temp_path(path);
  remove(path);
  expect_write_fails(path, x, 0, ok, "cannot write rank 0 (need rank 1..4)");
  expect_write_fails(path, x, 5, ok, "cannot write rank 5 (need rank 1..4)");
  expect_write_fails(path, x, 2, neg, "cannot write negative dimension -2");
  expect_write_fails(path, x, 1, huge, "cannot write dimension 2199023255552");
  expect_write_fails(path, x, 2, big, "cannot write shape (1073741824, 1073741824): more than 2^40 elements");
  expect_write_fails(path, NULL, 1, ok + 4, "NULL data");
  expect_write_fails(path, x, 1, NULL, "NULL shape");
  cr_assert_neq(access(path, F_OK), 0, "nothing created by a rejected write");
  expect_write_fails("/nonexistent-kvq/x.npy", x, 1, ok + 4, "cannot create");
  expect_write_fails("/tmp", x, 1, ok + 4, "cannot create");
  struct stat before, after;
  if (access("/dev/full", W_OK) == 0 && stat("/dev/full", &before) == 0 && S_ISCHR(before.st_mode)) {
    expect_write_fails("/dev/full", x, 1, ok + 4, "write failed");
    cr_assert_eq(stat("/dev/full", &after), 0, "a device is never removed after a failed write");
  }
}

/* ---- truncation and mutation ---------------------------------------------------------------- */

/* Reads `path` expecting either a consistent success or a clean failure; returns 1 on success. */
static int check_any_outcome(const char *path, const char *what) {
  /* Plain checks with one assertion each on failure: Criterion reports every passing assertion,
   * which would dominate the run time over thousands of inputs. */
  kvq_npy npy;
  char error[512] = "";
  if (kvq_npy_read(path, &npy, error, sizeof error) == 0) {
    if (npy.rank < 1 || npy.rank > 4 || npy.data == NULL) cr_assert_fail("%s: accepted with rank %u", what, npy.rank);
    int64_t count = 1;
    for (uint32_t d = 0; d < npy.rank; d++) {
      if (npy.shape[d] < 0) cr_assert_fail("%s: negative dimension accepted", what);
      count *= npy.shape[d];
    }
    volatile float sink = 0; /* touch every element: the buffer really has them */
    for (int64_t i = 0; i < count; i++) sink += npy.data[i];
    (void)sink;
    kvq_npy_free(&npy);
    return 1;
  }
  if (npy.data != NULL) cr_assert_fail("%s: data not NULL after a failure", what);
  if (strlen(error) <= strlen(path) + 2 || strncmp(error, path, strlen(path)) != 0)
    cr_assert_fail("%s: no reason: '%s'", what, error);
  if (strchr(error, '\n') != NULL) cr_assert_fail("%s: not one line: %s", what, error);
  return 0;
}

static void truncate_everywhere(const unsigned char *full, size_t size) {
  char path[32];
  temp_path(path);
  write_bytes(path, full, size);
  cr_assert_eq(check_any_outcome(path, "the full file"), 1);
  for (size_t len = 0; len < size; len++) {
    char what[96];
    snprintf(what, sizeof what, "truncated to %zu of %zu bytes", len, size);
    write_bytes(path, full, len);
    if (check_any_outcome(path, what)) cr_assert_fail("%s: accepted", what);
  }
  remove(path);
}

Test(npy, truncated_at_every_length_fails_cleanly) {
  const float x[6] = {1, 2, 3, 4, 5, 6};
  const int64_t shape[2] = {2, 3};
  char path[32], error[256] = "";
  temp_path(path);
  for (int fp16 = 0; fp16 <= 1; fp16++) {
    cr_assert_eq(kvq_npy_write(path, x, 2, shape, fp16, error, sizeof error), 0, "%s", error);
    size_t size;
    unsigned char *full = read_bytes(path, &size);
    cr_assert_eq(size, 128 + (fp16 ? 12u : 24u));
    truncate_everywhere(full, size);
    free(full);
  }
  remove(path);
  /* A format 2.0 file too. */
  unsigned char data[24];
  counting_f32(data, 6);
  size_t size;
  unsigned char *b = make_npy(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }\n", data, 24, &size);
  truncate_everywhere(b, size);
  free(b);
}

Test(npy, mutated_headers_never_crash) {
  const float x[6] = {1, 2, 3, 4, 5, 6};
  const int64_t shape[2] = {2, 3};
  char path[32], error[256] = "";
  temp_path(path);
  cr_assert_eq(kvq_npy_write(path, x, 2, shape, 0, error, sizeof error), 0, "%s", error);
  size_t size;
  unsigned char *full = read_bytes(path, &size);
  unsigned char *buf = malloc(size + 64);
  /* Characters that make near-valid headers likely, plus arbitrary bytes. */
  static const char alphabet[] = "{}()[],:'\" \n0123456789-LTrueFalsdscrhpo<>|f248_.";
  uint64_t s = 12345;
  int accepted = 0;
  for (int iter = 0; iter < 12000; iter++) {
    memcpy(buf, full, size);
    size_t n = size;
    int edits = 1 + (int)(lcg(&s) % 4);
    for (int e = 0; e < edits; e++) {
      size_t at = (size_t)(lcg(&s) % 130); /* mostly the prefix and header */
      if (at >= n) at = n - 1;
      uint64_t kind = lcg(&s) % 4;
      unsigned char c = kind == 0 ? (unsigned char)lcg(&s) : (unsigned char)alphabet[lcg(&s) % (sizeof alphabet - 1)];
      if (kind <= 1) buf[at] = c;
      else if (kind == 2 && n < size + 60) { /* insert */
        memmove(buf + at + 1, buf + at, n - at);
        buf[at] = c;
        n++;
      } else if (n > 1) { /* delete */
        memmove(buf + at, buf + at + 1, n - at - 1);
        n--;
      }
    }
    /* Keep the length field consistent half of the time, so the dict parser sees the mutations. */
    if (iter % 2 == 0 && n >= 10 && n >= size - 24) {
      size_t hlen = n - 10 - 24;
      buf[8] = (unsigned char)(hlen & 0xff);
      buf[9] = (unsigned char)(hlen >> 8);
    }
    write_bytes(path, buf, n);
    char what[32];
    snprintf(what, sizeof what, "mutation %d", iter);
    accepted += check_any_outcome(path, what);
  }
  /* Random garbage after a valid prefix, with random announced lengths. */
  for (int iter = 0; iter < 3000; iter++) {
    size_t n = 10 + (size_t)(lcg(&s) % 200);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)(1 + lcg(&s) % 3);
    buf[7] = 0;
    for (size_t k = 8; k < n; k++) buf[k] = iter % 2 ? (unsigned char)lcg(&s) : (unsigned char)alphabet[lcg(&s) % (sizeof alphabet - 1)];
    if (iter % 3 == 0) {
      buf[8] = (unsigned char)((n - 10) & 0xff);
      buf[9] = 0;
    }
    write_bytes(path, buf, n);
    char what[32];
    snprintf(what, sizeof what, "garbage %d", iter);
    check_any_outcome(path, what);
  }
  cr_assert_gt(accepted, 0, "some mutations (in the padding) stay valid");
  free(buf);
  free(full);
  remove(path);
}

/* ---- non-seekable input -------------------------------------------------------------------- */

/* Reads `bytes` through a FIFO, where the file size is unknown in advance. */
static int read_through_fifo(const unsigned char *bytes, size_t size, kvq_npy *npy, char *error, size_t error_size) {
  char dir[] = "/tmp/kvq-npy-fifo-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/pipe.npy", dir);
  cr_assert_eq(mkfifo(path, 0600), 0);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    signal(SIGPIPE, SIG_DFL);
    FILE *f = fopen(path, "wb");
    if (f) {
      fwrite(bytes, 1, size, f);
      fclose(f);
    }
    _exit(0);
  }
  int rc = kvq_npy_read(path, npy, error, error_size);
  int status;
  waitpid(child, &status, 0);
  remove(path);
  rmdir(dir);
  return rc;
}

Test(npy, reads_from_a_pipe) {
  unsigned char data[28];
  counting_f32(data, 7);
  size_t size;
  unsigned char *b = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", data, 28, &size);
  kvq_npy npy;
  char error[256] = "";
  cr_assert_eq(read_through_fifo(b, size - 4, &npy, error, sizeof error), 0, "%s", error);
  cr_assert_eq(npy.data[5], 5.0f);
  kvq_npy_free(&npy);
  cr_assert_neq(read_through_fifo(b, size - 5, &npy, error, sizeof error), 0);
  cr_assert_not_null(strstr(error, "truncated data: shape (2, 3) of <f4 needs 24 bytes after the header, the file has 23"), "%s", error);
  cr_assert_null(npy.data);
  cr_assert_neq(read_through_fifo(b, size, &npy, error, sizeof error), 0);
  cr_assert_not_null(strstr(error, "unexpected bytes after the data"), "%s", error);
  cr_assert_null(npy.data);
  free(b);
}
