// What every kvq CUDA kernel that touches pages shares: the CUDA definition of the accessors of the
// shared method headers (core/methods/io.h), the side layout as a kernel parameter, and one switch
// over the six methods for encoding a work unit and decoding a token. The math is core/methods/*.h
// (the CPU reference's and the Vulkan shaders' too); the work units are shaders/work_units.h's.
//
// Buffers, as on the GPU: the page pool as 32-bit little-endian words (byte offsets of head blocks
// are multiples of 4, so 32-bit offsets address pools up to 4 GiB, as on Vulkan), inputs as fp32,
// fp16 or bf16 elements (converted with core/halfconv.h, as the CPU converts them), fixed arrays fp32.
// Page words that neighbouring work units share are ORed with atomicOr, on the GPU and in the
// emulator (backends/cuda/emu/cuda_emu.h), never with a plain read-modify-write.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_METHODS_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_METHODS_CUH

#include "backends/cuda/kernel_lang.cuh"

#include "core/halfconv.h"
#include "core/layout.h"
#include "core/quantize_math.h"

// The side's layout (core/layout.h's KVQ_SIDE_FIELDS, in that order), then what the kernels derive
// from it: the bytes of one kv head's block of a page, and QJL's estimator constant c_d.
#define KVQ_CUDA_SIDE_MEMBER(name) unsigned name;
struct kvq_cuda_side {
  KVQ_SIDE_FIELDS(KVQ_CUDA_SIDE_MEMBER)
  unsigned head_bytes;
  float qjl_constant;
};

// The buffers one call of a method function reaches (core/methods/io.h).
struct kvq_io {
  unsigned *page;                // the page pool, 32-bit words
  const void *in;                // the input elements, in in_dtype (KVQ_LAYOUT_F32 / F16 / BF16)
  unsigned in_dtype;
  const float *fixed0, *fixed1;  // the side's fixed arrays (matrices, codebooks), or null
  const float *prepared;         // the prepared query (scoring; null here)
};

// Element i of the input as fp32: exact for fp32, the exact widening of fp16 and bf16.
static inline __host__ __device__ float kvq_cuda_in(const kvq_io *io, unsigned i) {
  if (io->in_dtype == KVQ_LAYOUT_F32) return static_cast<const float *>(io->in)[i];
  const unsigned bits = static_cast<const unsigned short *>(io->in)[i];
  return io->in_dtype == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32(bits) : kvq_bf16_bits_to_f32(bits);
}

#define KVQ_IO_PARAM const kvq_io *io,
#define KVQ_IO io,
#define KVQ_IN(i) kvq_cuda_in(io, (i))
#define KVQ_PAGE(w) (io->page[(w)])
#define KVQ_PAGE_SET(w, v) (io->page[(w)] = (v))
#if defined(__CUDA_ARCH__) || defined(KVQ_CUDA_EMU)
#define KVQ_PAGE_OR(w, v) atomicOr(&io->page[(w)], (v))
#else // host code of a .cu file never encodes: this only keeps the host pass of nvcc compiling
#define KVQ_PAGE_OR(w, v) (io->page[(w)] |= (v))
#endif
#define KVQ_FIXED0(i) (io->fixed0[(i)])
#define KVQ_FIXED1(i) (io->fixed1[(i)])
#define KVQ_PREPARED(i) (io->prepared[(i)])

#include "core/methods/cq.h"
#include "core/methods/exact.h"
#include "core/methods/kivi.h"
#include "core/methods/polar.h"
#include "core/methods/qjl.h"
#include "core/methods/uniform.h"
#include "shaders/work_units.h"

// Work units of a head block of n valid tokens (shaders/work_units.h).
static inline __host__ __device__ unsigned kvq_cuda_encode_units(const kvq_cuda_side &s, unsigned n) {
  return kvq_encode_units_of(s.method, n, s.head_dim, s.group, s.sketch_dim, s.outliers, s.outlier_sketch_dim, s.channels);
}

// Encode work unit `unit` of the zeroed head block at byte `block` (kv head h) holding n valid tokens;
// token t, channel c of the input is element x + t * kv_heads * head_dim + c. QJL: `mask` is the
// page's outlier channels as a bit mask (shared memory, kvq_qjl_choose_outliers; zero without
// outliers), the list stored already. PolarQuant is encoded by the whole block a token at a time
// (kvq_cuda_polar_encode), not here.
static inline __device__ void kvq_cuda_encode_unit(const kvq_io *io, const kvq_cuda_side &s, unsigned block, unsigned h,
                                                   unsigned unit, unsigned n, unsigned x, unsigned *mask) {
  const unsigned stride = s.kv_heads * s.head_dim, P = s.page_size, d = s.head_dim;
  switch (s.method) {
  case KVQ_LAYOUT_EXACT: kvq_exact_encode_unit(io, block, unit, x, stride, d, s.dtype); break;
  case KVQ_LAYOUT_QJL:
    kvq_qjl_encode_word(io, block, unit, x, stride, P, d, s.sketch_dim, s.outlier_sketch_dim, s.outliers, mask);
    break;
  case KVQ_LAYOUT_UNIFORM: kvq_uniform_encode_unit(io, block, unit, x, stride, P, d, s.bits, s.group); break;
  case KVQ_LAYOUT_KIVI: kvq_kivi_encode_unit(io, block, unit, n, x, stride, P, d, s.bits, s.group); break;
  case KVQ_LAYOUT_CQ: kvq_cq_encode_unit(io, block, unit, x, stride, d, s.channels, s.code_bits, h); break;
  default: break;
  }
}

// Channel c of token t of a head block, for every method that decodes channel by channel (all but
// PolarQuant, which decodes in its rotated space: kvq_cuda_decode_token).
static inline __device__ float kvq_cuda_decode_channel(const kvq_io *io, const kvq_cuda_side &s, unsigned block, unsigned h,
                                                       unsigned t, unsigned c) {
  const unsigned P = s.page_size, d = s.head_dim;
  switch (s.method) {
  case KVQ_LAYOUT_EXACT: return kvq_exact_decode(io, block, t, c, d, s.dtype);
  case KVQ_LAYOUT_QJL: return kvq_qjl_decode(io, block, t, c, P, d, s.sketch_dim, s.outlier_sketch_dim, s.outliers, s.qjl_constant);
  case KVQ_LAYOUT_UNIFORM: return kvq_uniform_decode(io, block, t, c, P, d, s.bits, s.group);
  case KVQ_LAYOUT_KIVI: return kvq_kivi_decode(io, block, t, c, P, d, s.bits, s.group);
  case KVQ_LAYOUT_CQ: return kvq_cq_decode(io, block, t, c, d, s.channels, s.code_bits, h);
  }
  return 0.0f;
}

// Dynamic shared memory of a kernel that decodes tokens with kvq_cuda_decode_token (y and out), or
// encodes PolarQuant tokens with kvq_cuda_polar_encode (v and w): two arrays of head_dim floats.
static inline __host__ __device__ unsigned kvq_cuda_decode_shared_bytes(const kvq_cuda_side &s) { return 2u * s.head_dim * 4u; }

// PolarQuant's Hadamard butterflies (kvq_polar_butterflies' stages in order) on z[0, d) in shared or
// global memory, by every thread of the block: the butterflies of one stage touch disjoint entries,
// so the threads share them, with a barrier after each stage.
static inline __device__ void kvq_cuda_polar_butterflies(float *z, unsigned d) {
  for (unsigned len = 1; len < d; len <<= 1) {
    for (unsigned k = threadIdx.x; k < d / 2u; k += blockDim.x) {
      const unsigned j = kvq_polar_butterfly_at(len, k);
      const float a = z[j], b = z[j + len];
      z[j] = KVQ_FADD(a, b);
      z[j + len] = KVQ_FSUB(a, b);
    }
    __syncthreads();
  }
}

// y[0, d) = R x for the input at element x (kvq_polar_rotate's floats, bit for bit), by every thread
// of the block; y in shared or global memory, complete for every thread on return.
static inline __device__ void kvq_cuda_polar_rotate(const kvq_io *io, unsigned x, unsigned d, unsigned rotation, float *y) {
  if (rotation == KVQ_LAYOUT_ROTATION_DENSE) {
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) y[i] = kvq_polar_rotate_row(io, x, i, d);
  } else {
    for (unsigned c = threadIdx.x; c < d; c += blockDim.x) y[c] = kvq_polar_sign_in(io, x, c);
    __syncthreads();
    kvq_cuda_polar_butterflies(y, d);
    const float scale = kvq_hadamard_scale(d);
    for (unsigned c = threadIdx.x; c < d; c += blockDim.x) y[c] = KVQ_FMUL(y[c], scale);
  }
  __syncthreads();
}

// PolarQuant's QUANTIZE of the n tokens of the zeroed head block at byte `block` (kv head h), by every
// thread of the block, a token at a time (kvq_polar_encode_unit's codes and radii): the rotated token
// in v, then each level's angles in parallel from one buffer into the other (v and w: shared memory of
// head_dim floats each), then the radii.
static inline __device__ void kvq_cuda_polar_encode(const kvq_io *io, const kvq_cuda_side &s, unsigned block, unsigned h,
                                                    unsigned n, unsigned x, float *v, float *w) {
  const unsigned stride = s.kv_heads * s.head_dim, P = s.page_size, d = s.head_dim, L = s.levels, bits = s.level_bits;
  const unsigned tables = kvq_polar_tables(h, s.codebook, L, bits);
  for (unsigned t = 0; t < n; t++) {
    kvq_cuda_polar_rotate(io, x + t * stride, d, s.rotation, v);
    float *from = v, *to = w;
    for (unsigned l = 1; l <= L; l++) {
      for (unsigned a = threadIdx.x; a < kvq_polar_angles(d, l); a += blockDim.x)
        to[a] = kvq_polar_encode_angle(io, block, t, l, a, from[2u * a], from[2u * a + 1u], P, d, bits, tables);
      __syncthreads();
      float *const swap = from;
      from = to;
      to = swap;
    }
    for (unsigned k = threadIdx.x; k < (d >> L); k += blockDim.x) kvq_polar_put_radius(io, block, t, k, from[k], P, d, L, bits);
    __syncthreads(); // v and w are rewritten by the next token
  }
}

// Token t of the head block at byte `block` (kv head h), as DEQUANTIZE returns it, into out[0, d):
// called by every thread of the block (it holds __syncthreads), the threads share the channels.
// PolarQuant decodes the rotated coordinates into y[0, d) (kvq_polar_decode_coord: the CPU's
// kvq_polar_decode_token floats, bit for bit), and the threads rotate them back as the CPU's
// kvq_polar_unrotate does (the Hadamard butterflies in place on y: y is overwritten).
// out and y: shared memory of head_dim floats each.
static inline __device__ void kvq_cuda_decode_token(const kvq_io *io, const kvq_cuda_side &s, unsigned block, unsigned h,
                                                    unsigned t, float *y, float *out) {
  const unsigned P = s.page_size, d = s.head_dim;
  const unsigned tables = kvq_polar_tables(h, s.codebook, s.levels, s.level_bits);
  for (unsigned c = threadIdx.x; c < d; c += blockDim.x) {
    if (s.method == KVQ_LAYOUT_POLAR) y[c] = kvq_polar_decode_coord(io, block, t, c, P, d, s.levels, s.level_bits, tables);
    else out[c] = kvq_cuda_decode_channel(io, s, block, h, t, c);
  }
  if (s.method == KVQ_LAYOUT_POLAR) {
    __syncthreads(); // every rotated coordinate in y before the rotation back reads them all
    // kvq_polar_unrotate's floats: the Hadamard butterflies in place on y, then every coordinate
    if (s.rotation != KVQ_LAYOUT_ROTATION_DENSE) kvq_cuda_polar_butterflies(y, d);
    for (unsigned c = threadIdx.x; c < d; c += blockDim.x) out[c] = kvq_polar_unrotate_coord(io, y, d, s.rotation, c);
  }
  __syncthreads(); // out complete before any thread reads it
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_METHODS_CUH
