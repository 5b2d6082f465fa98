#version 450
#extension GL_GOOGLE_include_directive : require
// TOKEN_CHECK (backends/backend.h, kvq_job_token_check): the per-method range checks that
// core/token_check.c makes of appended host tokens, for the tokens an append of device keys or
// values gathered on the device (finite already: CONVERT wrote non-finite elements as 0 and flagged
// them). A (token, kv head) vector the side's method cannot store sets KVQ_CHECK_RANGE in the flag
// word results[pc.dst_word]. The decisions are the host's, operation for operation, with fp32
// operations rounded one by one; the norms' square root is GLSL's, which may be 1 ulp off
// (core/shared_lang.h, kvq_sqrt), so a norm within an ulp of a limit may be judged differently.
// Invocation: one vector of pc.head_dim elements of pc.input_dtype at element
// pc.src_word + invocation * pc.head_dim of src; pc.count vectors.
#include "shaders/common.glsl"

bool f16_inf(uint bits) { return (bits & 0x7c00u) == 0x7c00u; }

float x_at(uint e) { return KVQ_READ_ELEMENT(src, pc.input_dtype, e); }

// The sum of squares in channel order, as the host sums it.
float square_sum(uint base) {
  precise float sum = 0.0;
  for (uint c = 0u; c < pc.head_dim; c++) {
    float x = x_at(base + c);
    sum = KVQ_FADD(sum, KVQ_FMUL(x, x));
  }
  return sum;
}

bool fails(uint base) {
  uint d = pc.head_dim;
  if (pc.method == KVQ_LAYOUT_EXACT) {
    if (pc.dtype == KVQ_LAYOUT_F32) return false;
    for (uint c = 0u; c < d; c++) {
      float x = x_at(base + c);
      if (pc.dtype == KVQ_LAYOUT_F16 ? f16_inf(kvq_f32_to_f16_bits(x)) : (kvq_f32_to_bf16_bits(x) & 0x7f80u) == 0x7f80u)
        return true;
    }
    return false;
  }
  if (pc.method == KVQ_LAYOUT_QJL) return f16_inf(kvq_f32_to_f16_bits(kvq_sqrt(square_sum(base))));
  if (pc.method == KVQ_LAYOUT_UNIFORM) {
    for (uint g = 0u; g < d / pc.group; g++) {
      float mn = x_at(base + g * pc.group), mx = mn;
      for (uint c = 1u; c < pc.group; c++) {
        float x = x_at(base + g * pc.group + c);
        mn = x < mn ? x : mn;
        mx = x > mx ? x : mx;
      }
      uint params = kvq_uniform_params(mn, mx, pc.bits);
      if (f16_inf(params) || f16_inf(params >> 16)) return true;
    }
    return false;
  }
  if (pc.method == KVQ_LAYOUT_KIVI) {
    for (uint c = 0u; c < d; c++)
      if (abs(x_at(base + c)) > 32752.0) return true;
    return false;
  }
  if (pc.method == KVQ_LAYOUT_POLAR) return kvq_sqrt(square_sum(base)) > 65440.0;
  return false; // CQ: any finite value has a nearest centroid
}

void main() {
  uint v = kvq_invocation();
  if (v >= pc.count) return;
  if (fails(pc.src_word + v * pc.head_dim)) atomicOr(results[pc.dst_word], KVQ_CHECK_RANGE);
}
