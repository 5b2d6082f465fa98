#version 450
#extension GL_GOOGLE_include_directive : require
// CONVERT (backends/backend.h, kvq_job_convert): the elements of a strided rank-3 tensor in `src`
// to a strided rank-3 tensor in `dst`, converting dtype (pc.input_dtype to pc.window_dtype), and
// checking values into the flag word results[pc.dst_word] (shaders/push.h, KVQ_CONVERT_*). Caller
// tensors are read and written in place this way, without a trip through host memory.
// metadata (16 words at pc.meta): shape0, shape1, shape2 (shape0 * shape1 * shape2 = pc.count),
// source offset and strides 0..2 in elements (words 3..6), destination offset and strides 0..2
// (words 11..14); the other words are unused.
// Invocation: one element.
#include "shaders/common.glsl"

uint src_bits(uint e) {
  if (pc.input_dtype == KVQ_LAYOUT_F32) return src[e];
  return (src[e >> 1] >> ((e & 1u) * 16u)) & 0xffffu;
}

float as_float(uint bits, uint dtype) {
  return dtype == KVQ_LAYOUT_F32 ? uintBitsToFloat(bits)
       : dtype == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32(bits)
                                 : kvq_bf16_bits_to_f32(bits);
}

void main() {
  uint i = kvq_invocation();
  if (i >= pc.count) return;
  if ((pc.flags & KVQ_CONVERT_IF_CLEAR) != 0u && results[pc.dst_word] != 0u) return; // a check failed: write nothing
  uint m = pc.meta, s1 = meta[m + 1u], s2 = meta[m + 2u];
  uint i2 = i % s2, i1 = (i / s2) % s1, i0 = i / (s1 * s2);
  uint se = meta[m + 3u] + i0 * meta[m + 4u] + i1 * meta[m + 5u] + i2 * meta[m + 6u];
  uint de = meta[m + 11u] + i0 * meta[m + 12u] + i1 * meta[m + 13u] + i2 * meta[m + 14u];
  uint bits = src_bits(se);
  float x = as_float(bits, pc.input_dtype);
  bool finite = !isnan(x) && !isinf(x);
  uint out_bits = bits;
  if (pc.window_dtype != pc.input_dtype)
    out_bits = pc.window_dtype == KVQ_LAYOUT_F32 ? floatBitsToUint(x)
             : pc.window_dtype == KVQ_LAYOUT_F16 ? kvq_f32_to_f16_bits(x)
                                                 : kvq_f32_to_bf16_bits(x);
  if ((pc.flags & KVQ_CONVERT_CHECK_FINITE) != 0u && !finite) {
    atomicOr(results[pc.dst_word], KVQ_CONVERT_CHECK_FINITE);
    out_bits = 0u; // what the cache holds instead (docs/VULKAN.md)
  }
  if ((pc.flags & KVQ_CONVERT_CHECK_FITS) != 0u) {
    bool overflows = pc.window_dtype == KVQ_LAYOUT_F16 ? (out_bits & 0x7c00u) == 0x7c00u
                   : pc.window_dtype == KVQ_LAYOUT_BF16 ? (out_bits & 0x7f80u) == 0x7f80u
                                                         : false;
    bool masked = (pc.flags & KVQ_CONVERT_MASKED) != 0u && isinf(x) && x < 0.0;
    if ((!finite || overflows) && !masked) atomicOr(results[pc.dst_word], KVQ_CONVERT_CHECK_FITS);
  }
  if ((pc.flags & KVQ_CONVERT_NO_WRITE) != 0u) return;
  if (pc.window_dtype == KVQ_LAYOUT_F32) {
    dst[de] = out_bits;
  } else { // a half of a word another invocation (or the caller's gap) may own: atomically
    uint shift = (de & 1u) * 16u;
    atomicAnd(dst[de >> 1], ~(0xffffu << shift));
    atomicOr(dst[de >> 1], (out_bits & 0xffffu) << shift);
  }
}
