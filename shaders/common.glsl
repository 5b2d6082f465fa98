// Declarations every kvq compute shader shares: the shared C/GLSL headers, the push constants and
// the eight storage buffers of the one pipeline layout (backends/vulkan/vk_dispatch.c).
// All buffers are arrays of 32-bit words; floats are read with uintBitsToFloat so that no optional
// 16-bit or 8-bit storage feature is needed.

#include "core/layout.h"
#include "core/halfconv.h"
#include "core/quantize_math.h"
#include "core/gpu_plan.h"
#include "shaders/push.h"

// Workgroups of KVQ_GPU_GROUP_SIZE invocations; a shader that defines KVQ_LOCAL_SIZE before including
// this has its own (flash_combine.comp).
#ifndef KVQ_LOCAL_SIZE
#define KVQ_LOCAL_SIZE KVQ_GPU_GROUP_SIZE
#endif
layout(local_size_x = KVQ_LOCAL_SIZE) in;

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
layout(std430, binding = KVQ_BINDING_RESULTS) buffer Results { uint results[]; };        // what an earlier job or this one produces

// The invocation's index over a dispatch of (x, y) workgroups, x fastest.
uint kvq_invocation() {
  return (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
}

float kvq_f(uint bits) { return uintBitsToFloat(bits); }

// A job recorded behind the device checks of its call (pc.flags has KVQ_PUSH_IF_CLEAR, shaders/push.h)
// writes nothing once a check failed: the check word results[pc.check_word] is then not zero. The
// checks ran in earlier dispatches of the same submission, and nothing writes the word while such a
// job runs, so every invocation of a workgroup reads the same answer.
bool kvq_check_refused() { return (pc.flags & KVQ_PUSH_IF_CLEAR) != 0u && results[pc.check_word] != 0u; }

// Element `index` of an array of `dtype` (KVQ_LAYOUT_F32/F16/BF16) values starting at word 0 of a
// buffer, as fp32. 16-bit elements are the halves of little-endian words.
#define KVQ_READ_ELEMENT(buffer, dtype, index)                                                     \
  ((dtype) == KVQ_LAYOUT_F32 ? uintBitsToFloat(buffer[(index)])                                    \
   : (dtype) == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32((buffer[(index) >> 1] >> (((index) & 1u) * 16u)) & 0xffffu) \
                               : kvq_bf16_bits_to_f32((buffer[(index) >> 1] >> (((index) & 1u) * 16u)) & 0xffffu))

// The accessors of the shared method headers (core/methods/io.h): the buffers are globals here, so
// functions take no io parameter; page words are written with atomicOr where units share them.
#define KVQ_IO_PARAM
#define KVQ_IO
#define KVQ_IN(i) KVQ_READ_ELEMENT(src, pc.input_dtype, (i))
#define KVQ_PAGE(w) pages[(w)]
#define KVQ_PAGE_SET(w, v) pages[(w)] = (v)
#define KVQ_PAGE_OR(w, v) atomicOr(pages[(w)], (v))
#define KVQ_FIXED0(i) uintBitsToFloat(fixed0[(i)])
#define KVQ_FIXED1(i) uintBitsToFloat(fixed1[(i)])
#define KVQ_PREPARED(i) uintBitsToFloat(results[(i)])
#include "core/methods/io.h"
