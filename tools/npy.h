/*
 * A small NumPy .npy reader and writer for the kvq command-line tool.
 *
 * Supported on reading: format versions 1.0 (16-bit header length), 2.0 and 3.0 (32-bit header
 * length); dtypes '<f4' (float32) and '<f2' (float16), little-endian only; C order
 * ('fortran_order': False); rank 1..4. Everything else is rejected with a one-line reason, and no
 * input, however malformed, makes the reader crash, exit or abort.
 *
 * Written files are what numpy.save writes for the same float32 / float16 array, byte for byte:
 * format 1.0, the header dict "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", NumPy's
 * spare space for growing the first axis, then spaces and a newline so that the data starts at a
 * multiple of 64 bytes.
 */
#ifndef KVQ_TOOLS_NPY_H
#define KVQ_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>

/* Largest element count (product of the dimensions) read or written: 2^40, 4 TiB of fp32. */
#define KVQ_NPY_MAX_ELEMENTS ((int64_t)1 << 40)

/* An array read from a .npy file. */
typedef struct kvq_npy {
  float *data;      /* the elements as fp32, C order; owned by this struct: free with kvq_npy_free.
                       Never NULL after a successful read, even for an array with zero elements. */
  uint32_t rank;    /* number of dimensions, 1..4 */
  int64_t shape[4]; /* shape[0..rank-1], each >= 0; entries from shape[rank] on are 0 */
  int source_fp16;  /* 1 when the file held '<f2' (converted exactly to fp32), 0 for '<f4' */
} kvq_npy;

/*
 * Reads the .npy file at `path` into `*out`, converting '<f2' elements exactly to fp32.
 *
 * Returns 0 on success; `*out` then owns a malloc'ed buffer of shape[0] * ... * shape[rank-1]
 * floats, which the caller releases with kvq_npy_free. Returns nonzero on failure; `*out` is then
 * zeroed (nothing to free, though kvq_npy_free on it is harmless) and a one-line reason prefixed
 * by the path is written to `error` (at most error_size bytes including the terminating NUL;
 * `error` may be NULL when error_size is 0), e.g.
 *   "x.npy: dtype '<f8' not supported (need <f4 or <f2)".
 * A file with bytes after the data (fewer or more than the shape implies) is rejected.
 */
int kvq_npy_read(const char *path, kvq_npy *out, char *error, size_t error_size);

/* Frees the data of `npy` (which may be NULL) and zeroes it. Safe to call twice. */
void kvq_npy_free(kvq_npy *npy);

/*
 * Writes `data` (rank 1..4, shape[0..rank-1] each >= 0, C order) to the .npy file at `path`,
 * creating or replacing it. With as_fp16 == 0 the elements are stored as '<f4' unchanged; with
 * as_fp16 != 0 they are stored as '<f2', rounded to nearest with ties to even (kvq_f32_to_f16_bits:
 * values of magnitude >= 65520 become infinities). The header is format 1.0, laid out as
 * numpy.save lays it out, so the data starts at a multiple of 64 bytes.
 *
 * Does not take ownership of `data` or `shape`; `data` may be NULL when the array has no
 * elements. Returns 0 on success; on failure returns nonzero, writes a one-line reason prefixed by
 * the path to `error` (as for kvq_npy_read) and removes the partly written file, if any.
 */
int kvq_npy_write(const char *path, const float *data, uint32_t rank, const int64_t *shape, int as_fp16, char *error,
                  size_t error_size);

#endif /* KVQ_TOOLS_NPY_H */
