// Declarations every kvq compute shader shares: the shared C/GLSL headers, the push constants and
// the eight storage buffers of the one pipeline layout (backends/vulkan/vk_dispatch.c).
// All buffers are arrays of 32-bit words; floats are read with uintBitsToFloat so that no optional
// 16-bit or 8-bit storage feature is needed.

#include "core/layout.h"
#include "core/halfconv.h"
#include "core/quantize_math.h"
#include "core/gpu_plan.h"
#include "shaders/push.h"

layout(local_size_x = KVQ_GPU_GROUP_SIZE) in;

layout(push_constant) uniform Push { KVQ_PUSH_FIELDS(KVQ_PUSH_MEMBER) } pc;

// Binding roles (shaders/push.h; a job binds what it uses and the host fills the rest with a
// dummy buffer):
layout(std430, binding = KVQ_BINDING_META) readonly buffer Meta { uint meta[]; };     // the job's host arrays
layout(std430, binding = KVQ_BINDING_PAGES) buffer Pages { uint pages[]; };            // a page pool
layout(std430, binding = KVQ_BINDING_FIXED0) readonly buffer Fixed0 { uint fixed0[]; }; // matrices, codebooks (fp32)
layout(std430, binding = KVQ_BINDING_FIXED1) readonly buffer Fixed1 { uint fixed1[]; };
layout(std430, binding = KVQ_BINDING_SRC) buffer Src { uint src[]; };                // inputs (tokens, queries, scores)
layout(std430, binding = KVQ_BINDING_DST) buffer Dst { uint dst[]; };                // outputs
layout(std430, binding = KVQ_BINDING_RING) readonly buffer Ring { uint ring[]; };     // the full-precision window
layout(std430, binding = KVQ_BINDING_AUX) buffer Aux { uint aux[]; };                // prepared queries, outputs, sums

// The invocation's index over a dispatch of (x, y) workgroups, x fastest.
uint kvq_invocation() {
  return (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
}

float kvq_f(uint bits) { return uintBitsToFloat(bits); }

// Element `index` of an array of `dtype` (KVQ_LAYOUT_F32/F16/BF16) values starting at word 0 of a
// buffer, as fp32. 16-bit elements are the halves of little-endian words.
#define KVQ_READ_ELEMENT(buffer, dtype, index)                                                     \
  ((dtype) == KVQ_LAYOUT_F32 ? uintBitsToFloat(buffer[(index)])                                    \
   : (dtype) == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32((buffer[(index) >> 1] >> (((index) & 1u) * 16u)) & 0xffffu) \
                               : kvq_bf16_bits_to_f32((buffer[(index) >> 1] >> (((index) & 1u) * 16u)) & 0xffffu))

// A page pool's byte and 16-bit fields (byte offsets from the start of the pool).
uint kvq_page_u8(uint byte) { return (pages[byte >> 2] >> ((byte & 3u) * 8u)) & 0xffu; }
uint kvq_page_u16(uint byte) { return (pages[byte >> 2] >> ((byte & 2u) * 8u)) & 0xffffu; }

// Packed codes (core/layout.h): code i of `bits` bits of the array starting at word `base`.
uint kvq_page_code(uint base, uint i, uint bits) {
  uint cpw = 32u / bits;
  return (pages[base + i / cpw] >> ((i % cpw) * bits)) & ((1u << bits) - 1u);
}
// Pages are zeroed before encoding; neighbours share words, so codes are ORed in atomically.
void kvq_page_put_code(uint base, uint i, uint bits, uint code) {
  uint cpw = 32u / bits;
  atomicOr(pages[base + i / cpw], code << ((i % cpw) * bits));
}
void kvq_page_put_u16(uint byte, uint value) { atomicOr(pages[byte >> 2], (value & 0xffffu) << ((byte & 2u) * 8u)); }
void kvq_page_put_u8(uint byte, uint value) { atomicOr(pages[byte >> 2], (value & 0xffu) << ((byte & 3u) * 8u)); }
