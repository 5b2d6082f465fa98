#version 450
#extension GL_GOOGLE_include_directive : require
// TOKEN_CHECK (backends/backend.h, kvq_job_token_check): the per-method range checks that
// core/token_check.c makes of appended host tokens, for the tokens an append of device keys or
// values gathered on the device (finite already: CONVERT wrote non-finite elements as 0 and flagged
// them). A (token, kv head) vector the side's method cannot store sets KVQ_CHECK_RANGE in the flag
// word results[pc.dst_word]. The decisions are core/methods/range.h's, the host's and the CUDA
// kernel's too, with fp32 operations rounded one by one; the norms' square root is GLSL's, which may
// be 1 ulp off (core/shared_lang.h, kvq_sqrt), so a norm within an ulp of a limit may be judged
// differently.
// Invocation: one vector of pc.head_dim elements of pc.input_dtype at element
// pc.src_word + invocation * pc.head_dim of src; pc.count vectors.
#include "shaders/common.glsl"
#include "core/methods/range.h"

void main() {
  uint v = kvq_invocation();
  if (v >= pc.count) return;
  if (kvq_range_vector_fails(pc.src_word + v * pc.head_dim, pc.method, pc.head_dim, pc.dtype, pc.group, pc.bits) != 0u)
    atomicOr(results[pc.dst_word], KVQ_CHECK_RANGE);
}
