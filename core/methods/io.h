/*
 * How the shared method headers (core/methods/<method>.h) reach their buffers. They are written in the
 * common subset of C, CUDA and GLSL (core/shared_lang.h), which has no pointers, so every buffer is
 * reached through accessor macros that each language defines before including them:
 *
 *   KVQ_IO_PARAM        the first parameter of every function that touches a buffer, with its comma:
 *                       C and CUDA `const kvq_io *io,` (a struct of base pointers), GLSL nothing
 *                       (the buffers are globals)
 *   KVQ_IO              the argument that passes it on: `io,` or nothing
 *   KVQ_IN(i)           element i of the input, as fp32 (tokens being encoded; the query prepared)
 *   KVQ_PAGE(w)         32-bit word w of the page pool (little-endian in memory)
 *   KVQ_PAGE_SET(w, v)  store word w; only for a word that one work unit owns entirely
 *   KVQ_PAGE_OR(w, v)   OR v into word w: neighbouring work units share words of packed codes, so
 *                       this is atomicOr wherever units run in parallel (GLSL, CUDA device code)
 *   KVQ_FIXED0(i), KVQ_FIXED1(i)  element i of the side's fixed fp32 arrays (matrices, codebooks)
 *   KVQ_PREPARED(i)     element i of the prepared query (fp32)
 *
 * C: backends/cpu/cpu_io.h; GLSL: shaders/common.glsl; CUDA: core/shared_check.cu (compile only,
 * until the CUDA backend). Offsets: a head block is addressed by the byte offset of its first byte in
 * the pool (always a multiple of 4), inputs by element indices. Pages are zeroed before encoding.
 */
#ifndef KVQ_CORE_METHODS_IO_H
#define KVQ_CORE_METHODS_IO_H

#include "core/shared_lang.h"

#if !defined(KVQ_IN) || !defined(KVQ_PAGE) || !defined(KVQ_PAGE_SET) || !defined(KVQ_PAGE_OR) || !defined(KVQ_FIXED0) || \
    !defined(KVQ_FIXED1) || !defined(KVQ_PREPARED)
#error "core/methods/io.h: define the accessors (KVQ_IO_PARAM, KVQ_IO, KVQ_IN, KVQ_PAGE...) before including it"
#endif

/* Packed codes (core/layout.h): code i of `bits` bits of the array starting at word `base`. Decoding
 * loops call this per number: for bits of 1, 2, 4 or 8 the 32 / bits codes per word are a power of
 * two too, so word and slot come from a shift and a mask; other widths (3, PolarQuant's and CQ's
 * odd ones) divide (kvq_io_code_place, which kvq_polar_run_codes shares). The branch is uniform: bits is
 * a layout parameter. */
KVQ_SHARED_FN void kvq_io_code_place(kvq_u32 i, kvq_u32 bits, KVQ_OUT kvq_u32 place[3]) {
  /* place: the word code i lies in, its slot there, the codes a word holds */
  if ((bits & (bits - 1u)) == 0u) {
    kvq_u32 per_word_log2 = 5u - kvq_log2_pow2(bits);
    place[0] = i >> per_word_log2;
    place[1] = i & ((1u << per_word_log2) - 1u);
    place[2] = 1u << per_word_log2;
  } else {
    place[2] = 32u / bits;
    place[0] = i / place[2];
    place[1] = i - place[0] * place[2];
  }
}
KVQ_SHARED_FN kvq_u32 kvq_io_code(KVQ_IO_PARAM kvq_u32 base, kvq_u32 i, kvq_u32 bits) {
  kvq_u32 place[3];
  kvq_io_code_place(i, bits, place);
  return (KVQ_PAGE(base + place[0]) >> (place[1] * bits)) & ((1u << bits) - 1u);
}
KVQ_SHARED_FN void kvq_io_put_code(KVQ_IO_PARAM kvq_u32 base, kvq_u32 i, kvq_u32 bits, kvq_u32 code) {
  kvq_u32 cpw = 32u / bits;
  KVQ_PAGE_OR(base + i / cpw, code << ((i % cpw) * bits));
}

/* The 16-bit and 8-bit fields at byte offset `byte` of the pool. */
KVQ_SHARED_FN kvq_u32 kvq_io_u16(KVQ_IO_PARAM kvq_u32 byte) { return (KVQ_PAGE(byte >> 2u) >> ((byte & 2u) * 8u)) & 0xffffu; }
KVQ_SHARED_FN kvq_u32 kvq_io_u8(KVQ_IO_PARAM kvq_u32 byte) { return (KVQ_PAGE(byte >> 2u) >> ((byte & 3u) * 8u)) & 0xffu; }
KVQ_SHARED_FN void kvq_io_put_u16(KVQ_IO_PARAM kvq_u32 byte, kvq_u32 value) {
  KVQ_PAGE_OR(byte >> 2u, (value & 0xffffu) << ((byte & 2u) * 8u));
}

#endif /* KVQ_CORE_METHODS_IO_H */
