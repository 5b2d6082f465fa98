/* NumPy .npy reader and writer (tools/npy.h). */
#include "tools/npy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <kvq/kvq.h>

enum {
  MAGIC_LEN = 6,
  ARRAY_ALIGN = 64,            /* numpy.lib.format.ARRAY_ALIGN */
  GROWTH_AXIS_MAX_DIGITS = 21, /* numpy.lib.format.GROWTH_AXIS_MAX_DIGITS */
  MAX_HEADER_LEN = 1 << 20,    /* a header dict for the dtypes read here is well under 1 KiB */
  MAX_PARSED_RANK = 32,        /* dimensions kept while parsing; larger ranks are counted only */
  CHUNK_ELEMENTS = 4096,       /* elements converted per fread / fwrite */
};

static const unsigned char npy_magic[MAGIC_LEN] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

static void set_error(char *error, size_t error_size, const char *path, const char *fmt, ...) {
  if (error == NULL || error_size == 0) return;
  int n = snprintf(error, error_size, "%s: ", path ? path : "(null)");
  if (n < 0) {
    error[0] = '\0';
    return;
  }
  if ((size_t)n >= error_size) return; /* the prefix alone filled the buffer */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error + n, error_size - (size_t)n, fmt, ap);
  va_end(ap);
}

/* ---- header dict parser ------------------------------------------------------------------------ */

typedef struct header_parser {
  const char *s;
  size_t n, i;
  int allow_long_suffix; /* versions 1.0 and 2.0: Python 2 wrote shapes like (3L, 4L) */
  /* results */
  int have_descr, have_fortran, have_shape;
  char descr[40];
  int descr_too_long;
  int fortran_order;
  uint32_t rank;
  int64_t dims[MAX_PARSED_RANK];
  /* the first error */
  char message[160];
} header_parser;

static int fail(header_parser *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->message, sizeof p->message, fmt, ap);
  va_end(ap);
  return -1;
}

/* A syntax error at the current position, naming what was expected and what was found. */
static int syntax_error(header_parser *p, const char *expected) {
  if (p->i >= p->n) return fail(p, "malformed header: expected %s at offset %zu, found the end of the header", expected, p->i);
  unsigned char c = (unsigned char)p->s[p->i];
  if (c >= 0x20 && c < 0x7f)
    return fail(p, "malformed header: expected %s at offset %zu, found '%c'", expected, p->i, (int)c);
  return fail(p, "malformed header: expected %s at offset %zu, found byte 0x%02x", expected, p->i, (unsigned)c);
}

static void skip_space(header_parser *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static int peek(const header_parser *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

/* A Python string literal in single or double quotes, without escapes; at most out_size - 1
 * characters are kept (*too_long set when more were there). */
static int parse_string(header_parser *p, char *out, size_t out_size, int *too_long) {
  int quote = peek(p);
  if (quote != '\'' && quote != '"') return syntax_error(p, "a quoted string");
  size_t start = p->i;
  p->i++;
  size_t len = 0;
  *too_long = 0;
  for (;;) {
    int c = peek(p);
    if (c < 0 || c == '\n') {
      p->i = start;
      return fail(p, "malformed header: unterminated string at offset %zu", start);
    }
    if (c == '\\') return fail(p, "malformed header: escape sequences in strings are not supported (offset %zu)", p->i);
    if (c < 0x20 || c >= 0x7f) return syntax_error(p, "a printable ASCII character in a string");
    p->i++;
    if (c == quote) break;
    if (len + 1 < out_size) out[len++] = (char)c;
    else *too_long = 1;
  }
  out[len] = '\0';
  return 0;
}

static int parse_bool(header_parser *p, int *value) {
  size_t start = p->i;
  while (p->i < p->n && ((p->s[p->i] >= 'a' && p->s[p->i] <= 'z') || (p->s[p->i] >= 'A' && p->s[p->i] <= 'Z'))) p->i++;
  size_t len = p->i - start;
  if (len == 4 && memcmp(p->s + start, "True", 4) == 0) *value = 1;
  else if (len == 5 && memcmp(p->s + start, "False", 5) == 0) *value = 0;
  else {
    p->i = start;
    return fail(p, "malformed header: 'fortran_order' must be True or False (offset %zu)", start);
  }
  return 0;
}

/* A dimension: a decimal integer (an optional 'L' suffix in format 1.0 / 2.0 files). Negative and
 * absurdly large values are rejected here, with the value in the message. */
static int parse_dim(header_parser *p, int64_t *value) {
  size_t start = p->i;
  int negative = 0;
  if (peek(p) == '-') {
    negative = 1;
    p->i++;
    skip_space(p);
  }
  int c = peek(p);
  if (c < '0' || c > '9') return syntax_error(p, "a dimension (a non-negative integer)");
  uint64_t v = 0;
  int overflow = 0;
  while ((c = peek(p)) >= '0' && c <= '9') {
    if (v > (UINT64_MAX - 9u) / 10u) overflow = 1;
    else v = v * 10u + (uint64_t)(c - '0');
    p->i++;
  }
  if (p->allow_long_suffix && (peek(p) == 'L' || peek(p) == 'l')) p->i++;
  c = peek(p);
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.')
    return syntax_error(p, "',' or ')' after a dimension");
  int len = (int)(p->i - start > 40 ? 40 : p->i - start);
  if (negative) return fail(p, "negative dimension %.*s in 'shape'", len, p->s + start);
  if (overflow || v > (uint64_t)KVQ_NPY_MAX_ELEMENTS)
    return fail(p, "dimension %.*s in 'shape' is absurdly large (limit 2^40 elements)", len, p->s + start);
  *value = (int64_t)v;
  return 0;
}

/* A Python tuple of integers: (), (5,), (2, 3, 4), (2, 3, 4,). (5) is an int, not a tuple. */
static int parse_shape(header_parser *p) {
  if (peek(p) == '[') return fail(p, "malformed header: 'shape' must be a tuple, not a list");
  if (peek(p) != '(') return syntax_error(p, "'(' starting the 'shape' tuple");
  p->i++;
  p->rank = 0;
  skip_space(p);
  if (peek(p) == ')') {
    p->i++;
    return 0;
  }
  int saw_comma = 0;
  for (;;) {
    int64_t dim = 0;
    if (parse_dim(p, &dim)) return -1;
    if (p->rank < MAX_PARSED_RANK) p->dims[p->rank] = dim;
    if (p->rank < UINT32_MAX) p->rank++;
    skip_space(p);
    if (peek(p) == ',') {
      saw_comma = 1;
      p->i++;
      skip_space(p);
      if (peek(p) == ')') break;
      continue;
    }
    if (peek(p) == ')') break;
    return syntax_error(p, "',' or ')' in the 'shape' tuple");
  }
  p->i++; /* ')' */
  if (!saw_comma) return fail(p, "malformed header: 'shape' (%" PRId64 ") is not a tuple (a 1-tuple is written (%" PRId64 ",))", p->dims[0], p->dims[0]);
  return 0;
}

/* The header dict: {'descr': ..., 'fortran_order': ..., 'shape': ...}, keys in any order,
 * whitespace anywhere between tokens, an optional trailing comma; then only whitespace. */
static int parse_header(header_parser *p) {
  skip_space(p);
  if (peek(p) != '{') return syntax_error(p, "'{' starting the header dict");
  p->i++;
  for (;;) {
    skip_space(p);
    if (peek(p) == '}') break;
    char key[24];
    int too_long;
    size_t key_at = p->i;
    if (parse_string(p, key, sizeof key, &too_long)) return -1;
    int *have;
    if (!too_long && strcmp(key, "descr") == 0) have = &p->have_descr;
    else if (!too_long && strcmp(key, "fortran_order") == 0) have = &p->have_fortran;
    else if (!too_long && strcmp(key, "shape") == 0) have = &p->have_shape;
    else return fail(p, "unknown header key '%s%s' (expected 'descr', 'fortran_order' and 'shape')", key, too_long ? "..." : "");
    if (*have) return fail(p, "duplicate header key '%s' (offset %zu)", key, key_at);
    *have = 1;
    skip_space(p);
    if (peek(p) != ':') return syntax_error(p, "':' after a key");
    p->i++;
    skip_space(p);
    if (have == &p->have_descr) {
      if (peek(p) == '[' || peek(p) == '(')
        return fail(p, "structured dtypes not supported ('descr' is a list; need '<f4' or '<f2')");
      if (parse_string(p, p->descr, sizeof p->descr, &p->descr_too_long)) return -1;
    } else if (have == &p->have_fortran) {
      if (parse_bool(p, &p->fortran_order)) return -1;
    } else if (parse_shape(p)) {
      return -1;
    }
    skip_space(p);
    if (peek(p) == ',') {
      p->i++;
      continue;
    }
    if (peek(p) == '}') break;
    return syntax_error(p, "',' or '}' after a value");
  }
  p->i++; /* '}' */
  skip_space(p);
  if (p->i != p->n) return syntax_error(p, "only spaces and a newline after the header dict");
  if (!p->have_descr) return fail(p, "header lacks the key 'descr'");
  if (!p->have_fortran) return fail(p, "header lacks the key 'fortran_order'");
  if (!p->have_shape) return fail(p, "header lacks the key 'shape'");
  return 0;
}

/* "(2, 3)" for the first min(rank, 4) dimensions. */
static void format_shape(char *out, size_t size, const int64_t *dims, uint32_t rank) {
  size_t at = 0;
  out[0] = '\0';
  for (uint32_t d = 0; d < rank && d < 4 && at < size; d++) {
    int n = snprintf(out + at, size - at, "%s%" PRId64, d ? ", " : "(", dims[d]);
    if (n < 0) return;
    at += (size_t)n;
  }
  if (at < size) snprintf(out + at, size - at, rank == 1 ? ",)" : ")");
}

/* Element count of a validated shape (dims each in [0, KVQ_NPY_MAX_ELEMENTS]), or -1 when the
 * product exceeds KVQ_NPY_MAX_ELEMENTS. Never overflows. */
static int64_t element_count(const int64_t *dims, uint32_t rank) {
  int64_t count = 1;
  for (uint32_t d = 0; d < rank; d++)
    if (dims[d] == 0) return 0;
  for (uint32_t d = 0; d < rank; d++) {
    if (count > KVQ_NPY_MAX_ELEMENTS / dims[d]) return -1;
    count *= dims[d];
  }
  return count;
}

/* ---- reader --------------------------------------------------------------------------------- */

static uint32_t load_u32_le(const unsigned char *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Reads exactly `size` bytes; returns the number read (short on EOF or error). */
static size_t read_full(FILE *f, void *buf, size_t size) { return size ? fread(buf, 1, size, f) : 0; }

int kvq_npy_read(const char *path, kvq_npy *out, char *error, size_t error_size) {
  if (error && error_size) error[0] = '\0';
  if (out) memset(out, 0, sizeof *out);
  if (path == NULL || out == NULL) {
    set_error(error, error_size, path, "kvq_npy_read: NULL %s", path == NULL ? "path" : "output");
    return -1;
  }
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    set_error(error, error_size, path, "cannot open: %s", strerror(errno));
    return -1;
  }
  int rc = -1;
  char *header = NULL;
  float *data = NULL;
  struct stat st;
  int size_known = 0;
  uint64_t file_size = 0;
  if (fstat(fileno(f), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      set_error(error, error_size, path, "is a directory, not a .npy file");
      goto done;
    }
    if (S_ISREG(st.st_mode) && st.st_size >= 0) {
      size_known = 1;
      file_size = (uint64_t)st.st_size;
    }
  }

  /* Magic, version, header length. */
  unsigned char prefix[12];
  size_t got = read_full(f, prefix, MAGIC_LEN + 2);
  if (got >= 1 && memcmp(prefix, npy_magic, got < MAGIC_LEN ? got : MAGIC_LEN) != 0) {
    set_error(error, error_size, path, "not a .npy file (no \\x93NUMPY magic at the start)");
    goto done;
  }
  if (got < MAGIC_LEN + 2) {
    if (ferror(f)) set_error(error, error_size, path, "read error: %s", strerror(errno));
    else set_error(error, error_size, path, "truncated: %zu bytes, too short for the .npy magic and version", got);
    goto done;
  }
  unsigned major = prefix[6], minor = prefix[7];
  size_t length_bytes;
  if (major == 1 && minor == 0) length_bytes = 2;
  else if ((major == 2 || major == 3) && minor == 0) length_bytes = 4;
  else {
    set_error(error, error_size, path, "unsupported .npy format version %u.%u (need 1.0, 2.0 or 3.0)", major, minor);
    goto done;
  }
  got = read_full(f, prefix + 8, length_bytes);
  if (got < length_bytes) {
    if (ferror(f)) set_error(error, error_size, path, "read error: %s", strerror(errno));
    else set_error(error, error_size, path, "truncated in the header length field");
    goto done;
  }
  uint32_t header_len = length_bytes == 2 ? (uint32_t)prefix[8] | (uint32_t)prefix[9] << 8 : load_u32_le(prefix + 8);
  if (header_len > MAX_HEADER_LEN) {
    set_error(error, error_size, path, "header length %" PRIu32 " is absurd (limit %d bytes)", header_len, MAX_HEADER_LEN);
    goto done;
  }
  uint64_t data_offset = MAGIC_LEN + 2 + length_bytes + (uint64_t)header_len;
  header = malloc(header_len ? header_len : 1);
  if (header == NULL) {
    set_error(error, error_size, path, "out of memory for a %" PRIu32 "-byte header", header_len);
    goto done;
  }
  got = read_full(f, header, header_len);
  if (got < header_len) {
    if (ferror(f)) set_error(error, error_size, path, "read error: %s", strerror(errno));
    else
      set_error(error, error_size, path, "truncated header: %" PRIu32 " bytes announced, %zu present", header_len, got);
    goto done;
  }

  /* The dict. */
  header_parser p;
  memset(&p, 0, sizeof p);
  p.s = header;
  p.n = header_len;
  p.allow_long_suffix = major <= 2;
  if (parse_header(&p)) {
    set_error(error, error_size, path, "%s", p.message);
    goto done;
  }
  int fp16;
  if (!p.descr_too_long && strcmp(p.descr, "<f4") == 0) fp16 = 0;
  else if (!p.descr_too_long && strcmp(p.descr, "<f2") == 0) fp16 = 1;
  else if (!p.descr_too_long && (strcmp(p.descr, ">f4") == 0 || strcmp(p.descr, ">f2") == 0)) {
    set_error(error, error_size, path, "dtype '%s' is big-endian, not supported (need little-endian <f4 or <f2)", p.descr);
    goto done;
  } else {
    set_error(error, error_size, path, "dtype '%s%s' not supported (need <f4 or <f2)", p.descr, p.descr_too_long ? "..." : "");
    goto done;
  }
  if (p.fortran_order) {
    set_error(error, error_size, path, "fortran_order True not supported (need C order: fortran_order False)");
    goto done;
  }
  if (p.rank == 0) {
    set_error(error, error_size, path, "rank 0 (shape ()) not supported (need rank 1..4)");
    goto done;
  }
  if (p.rank > 4) {
    set_error(error, error_size, path, "rank %" PRIu32 " not supported (need rank 1..4)", p.rank);
    goto done;
  }
  char shape_text[128];
  format_shape(shape_text, sizeof shape_text, p.dims, p.rank);
  int64_t count = element_count(p.dims, p.rank);
  if (count < 0 || (uint64_t)count > SIZE_MAX / sizeof(float)) {
    set_error(error, error_size, path, "shape %s has more than 2^40 elements (the element count overflows)", shape_text);
    goto done;
  }
  const size_t item = fp16 ? 2 : 4;
  const uint64_t data_bytes = (uint64_t)count * item;
  const char *dtype = fp16 ? "<f2" : "<f4";
  if (size_known) {
    uint64_t present = file_size > data_offset ? file_size - data_offset : 0;
    if (present < data_bytes) {
      set_error(error, error_size, path,
                "truncated data: shape %s of %s needs %" PRIu64 " bytes after the header, the file has %" PRIu64,
                shape_text, dtype, data_bytes, present);
      goto done;
    }
    if (present > data_bytes) {
      set_error(error, error_size, path,
                "%" PRIu64 " unexpected bytes after the data (shape %s of %s is %" PRIu64 " bytes)",
                present - data_bytes, shape_text, dtype, data_bytes);
      goto done;
    }
  }

  /* The data, converted chunk by chunk; bytes are decoded little-endian whatever the host. */
  data = malloc(count ? (size_t)count * sizeof(float) : sizeof(float));
  if (data == NULL) {
    set_error(error, error_size, path, "out of memory for shape %s (%" PRId64 " elements)", shape_text, count);
    goto done;
  }
  unsigned char chunk[CHUNK_ELEMENTS * 4];
  for (int64_t done_elems = 0; done_elems < count;) {
    size_t n = (size_t)(count - done_elems < CHUNK_ELEMENTS ? count - done_elems : CHUNK_ELEMENTS);
    got = read_full(f, chunk, n * item);
    if (got < n * item) {
      if (ferror(f)) set_error(error, error_size, path, "read error: %s", strerror(errno));
      else
        set_error(error, error_size, path,
                  "truncated data: shape %s of %s needs %" PRIu64 " bytes after the header, the file has %" PRIu64,
                  shape_text, dtype, data_bytes, (uint64_t)done_elems * item + got);
      goto done;
    }
    float *dst = data + done_elems;
    if (fp16) {
      uint16_t half[CHUNK_ELEMENTS];
      for (size_t k = 0; k < n; k++) half[k] = (uint16_t)(chunk[2 * k] | chunk[2 * k + 1] << 8);
      kvq_convert(half, KVQ_DTYPE_F16, dst, KVQ_DTYPE_F32, n);
    } else {
      for (size_t k = 0; k < n; k++) {
        const uint32_t bits = load_u32_le(chunk + 4 * k);
        memcpy(&dst[k], &bits, 4);
      }
    }
    done_elems += (int64_t)n;
  }
  if (!size_known && fgetc(f) != EOF) {
    set_error(error, error_size, path, "unexpected bytes after the data (shape %s of %s is %" PRIu64 " bytes)",
              shape_text, dtype, data_bytes);
    goto done;
  }

  out->data = data;
  data = NULL;
  out->rank = p.rank;
  for (uint32_t d = 0; d < p.rank; d++) out->shape[d] = p.dims[d];
  out->source_fp16 = fp16;
  rc = 0;
done:
  free(data);
  free(header);
  fclose(f);
  return rc;
}

void kvq_npy_free(kvq_npy *npy) {
  if (npy == NULL) return;
  free(npy->data);
  memset(npy, 0, sizeof *npy);
}

/* ---- writer --------------------------------------------------------------------------------- */

int kvq_npy_write(const char *path, const float *data, uint32_t rank, const int64_t *shape, int as_fp16, char *error,
                  size_t error_size) {
  if (error && error_size) error[0] = '\0';
  if (path == NULL) {
    set_error(error, error_size, path, "kvq_npy_write: NULL path");
    return -1;
  }
  if (rank < 1 || rank > 4) {
    set_error(error, error_size, path, "cannot write rank %" PRIu32 " (need rank 1..4)", rank);
    return -1;
  }
  if (shape == NULL) {
    set_error(error, error_size, path, "kvq_npy_write: NULL shape");
    return -1;
  }
  for (uint32_t d = 0; d < rank; d++) {
    if (shape[d] < 0) {
      set_error(error, error_size, path, "cannot write negative dimension %" PRId64, shape[d]);
      return -1;
    }
    if (shape[d] > KVQ_NPY_MAX_ELEMENTS) {
      set_error(error, error_size, path, "cannot write dimension %" PRId64 " (limit 2^40 elements)", shape[d]);
      return -1;
    }
  }
  char shape_text[128];
  format_shape(shape_text, sizeof shape_text, shape, rank);
  int64_t count = element_count(shape, rank);
  if (count < 0) {
    set_error(error, error_size, path, "cannot write shape %s: more than 2^40 elements", shape_text);
    return -1;
  }
  if (count > 0 && data == NULL) {
    set_error(error, error_size, path, "kvq_npy_write: NULL data for shape %s", shape_text);
    return -1;
  }

  /* The header, exactly as numpy.lib.format._write_array_header builds it: the dict with its keys
   * sorted and a ", " after each value, spare spaces to let the first axis grow to 21 digits, then
   * spaces and a '\n' up to the next multiple of ARRAY_ALIGN (a full ARRAY_ALIGN when already
   * aligned: NumPy's padlen is never 0). */
  char header[512];
  size_t len = 0;
  int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                   as_fp16 ? "<f2" : "<f4", shape_text);
  if (n < 0 || (size_t)n >= sizeof header) {
    set_error(error, error_size, path, "internal error formatting the header");
    return -1;
  }
  len = (size_t)n;
  char first[24];
  int first_digits = snprintf(first, sizeof first, "%" PRId64, shape[0]);
  for (int k = first_digits; k < GROWTH_AXIS_MAX_DIGITS; k++) header[len++] = ' ';
  size_t hlen = len + 1;
  size_t padlen = ARRAY_ALIGN - (MAGIC_LEN + 2 + 2 + hlen) % ARRAY_ALIGN;
  for (size_t k = 0; k < padlen; k++) header[len++] = ' ';
  header[len++] = '\n';
  unsigned char prefix[10];
  memcpy(prefix, npy_magic, MAGIC_LEN);
  prefix[6] = 1;
  prefix[7] = 0;
  prefix[8] = (unsigned char)(len & 0xff);
  prefix[9] = (unsigned char)(len >> 8);

  FILE *f = fopen(path, "wb");
  if (f == NULL) {
    set_error(error, error_size, path, "cannot create: %s", strerror(errno));
    return -1;
  }
  /* Only a regular file is removed after a failure (never a device such as /dev/full). */
  struct stat st;
  int regular = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
  int ok = fwrite(prefix, 1, sizeof prefix, f) == sizeof prefix && fwrite(header, 1, len, f) == len;
  unsigned char chunk[CHUNK_ELEMENTS * 4];
  for (int64_t done_elems = 0; ok && done_elems < count;) {
    size_t m = (size_t)(count - done_elems < CHUNK_ELEMENTS ? count - done_elems : CHUNK_ELEMENTS);
    const float *src = data + done_elems;
    size_t bytes;
    if (as_fp16) {
      uint16_t half[CHUNK_ELEMENTS];
      kvq_convert(src, KVQ_DTYPE_F32, half, KVQ_DTYPE_F16, m);
      for (size_t k = 0; k < m; k++) {
        uint32_t h = half[k];
        chunk[2 * k] = (unsigned char)(h & 0xff);
        chunk[2 * k + 1] = (unsigned char)(h >> 8 & 0xff);
      }
      bytes = 2 * m;
    } else {
      for (size_t k = 0; k < m; k++) {
        uint32_t u;
        memcpy(&u, &src[k], 4);
        chunk[4 * k] = (unsigned char)(u & 0xff);
        chunk[4 * k + 1] = (unsigned char)(u >> 8 & 0xff);
        chunk[4 * k + 2] = (unsigned char)(u >> 16 & 0xff);
        chunk[4 * k + 3] = (unsigned char)(u >> 24);
      }
      bytes = 4 * m;
    }
    ok = fwrite(chunk, 1, bytes, f) == bytes;
    done_elems += (int64_t)m;
  }
  int saved_errno = errno;
  if (ok && fflush(f) != 0) {
    ok = 0;
    saved_errno = errno;
  }
  if (fclose(f) != 0 && ok) {
    ok = 0;
    saved_errno = errno;
  }
  if (!ok) {
    set_error(error, error_size, path, "write failed: %s", strerror(saved_errno));
    if (regular) remove(path);
    return -1;
  }
  return 0;
}
