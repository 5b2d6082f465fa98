#version 450
#extension GL_GOOGLE_include_directive : require
// Fused decode attention, pass 2 of 3 (shaders/flash.glsl): the split's probability-weighted sum of
// values for every query head of the pass, each value decoded once; invocations share the channels.
// Value methods that sum in a rotated space (KVQ_SUMS_ROTATED) sum the split's page tokens there
// (kvq_decode_rotated_run: no rotation per token) into the split output and its window tokens apart
// (kvq_flash_window), since only the page part is rotated back, once per output row after the combine.
#include "shaders/common.glsl"
#include "shaders/method.glsl"
#include "shaders/attention.glsl"
#include "shaders/flash.glsl"

// The split's probabilities, a vec4 of a quad of the pass's heads per token (0 for heads past the
// pass's): one load per token and quad where a load per head cost llvmpipe, which runs each load
// lane by lane (docs/VULKAN.md), a walk over the lanes per head.
#define KVQ_FLASH_QUADS (KVQ_FLASH_HEADS_PER_PASS / 4u)
shared vec4 prob4[KVQ_FLASH_QUADS][KVQ_FLASH_SPLIT];
// Token i's decoding handle (shaders/method.glsl) or, in the window, its first ring element (in .x):
// computed once per token here instead of once per channel (page-table lookup, page position).
shared uvec3 token_at[KVQ_FLASH_SPLIT];

#ifndef KVQ_SUMS_ROTATED
// Channels per invocation of the value sum: a power of two dividing every head_dim (a multiple of
// 16, core/layout.h). 8 fp32 partial sums per head stay in registers at 8 heads per pass.
#define KVQ_FLASH_VALUE_RUN KVQ_DECODE_RUN

// How a page token's run of KVQ_FLASH_VALUE_RUN channels is decoded, chosen once per run of the
// split (uniform: it depends on the cache's parameters only) and taken by a token loop of its own,
// since llvmpipe runs every side of a branch under masks: inside the token loop, the paths not taken
// cost as much as the one taken (docs/BENCH.md, "The value side of the fused decode"). A loop whose
// count is 0 runs its body once, masked.
#define KVQ_VALUE_BY_RUN 0u     // the method's kvq_decode_run (KVQ_DECODES_RUN): what a run shares read once
#define KVQ_VALUE_AFFINE 1u     // KVQ_DECODES_AFFINE groups of at least a run: scale and minimum read once
#define KVQ_VALUE_CHANNELS 2u   // kvq_decode_token per channel
uint kvq_value_path(uint c0, uint paged) {
#ifdef KVQ_DECODES_RUN
  float probe[KVQ_FLASH_VALUE_RUN];
  if (paged > 0u && kvq_decode_run(token_at[0], c0, probe)) return KVQ_VALUE_BY_RUN;
#endif
#ifdef KVQ_DECODES_AFFINE
  if (kvq_affine_run() >= KVQ_FLASH_VALUE_RUN) return KVQ_VALUE_AFFINE; // groups are powers of two: a run never straddles one
#endif
  return KVQ_VALUE_CHANNELS;
}

// acc[g4][j] += the probabilities of token i for quad g4's heads times v[j]. Constant bounds, so that
// the loops unroll and acc stays in registers; heads is uniform.
void value_add(uint i, uint heads, float v[KVQ_FLASH_VALUE_RUN], inout vec4 acc[KVQ_FLASH_QUADS][KVQ_FLASH_VALUE_RUN]) {
  for (uint g4 = 0u; g4 < KVQ_FLASH_QUADS; g4++) {
    if (4u * g4 < heads) {
      vec4 p = prob4[g4][i];
      for (uint j = 0u; j < KVQ_FLASH_VALUE_RUN; j++) acc[g4][j] += p * v[j];
    }
  }
}
#endif

#ifdef KVQ_SUMS_ROTATED
// The rotated path's run sums (main): acc[g][j] is head g's sum of run coordinate j. Constant loop
// bounds, so that the loops unroll and acc stays in registers; heads is uniform.
void rotated_zero(out float acc[KVQ_FLASH_HEADS_PER_PASS][KVQ_ROTATED_RUN]) {
  for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++)
    for (uint j = 0u; j < KVQ_ROTATED_RUN; j++) acc[g][j] = 0.0;
}
void rotated_add(uint i, uint heads, float v[KVQ_ROTATED_RUN], inout float acc[KVQ_FLASH_HEADS_PER_PASS][KVQ_ROTATED_RUN]) {
  for (uint g4 = 0u; g4 < KVQ_FLASH_QUADS; g4++) {
    if (4u * g4 < heads) {
      vec4 p = prob4[g4][i];
      for (uint g = 0u; g < 4u; g++)
        for (uint j = 0u; j < KVQ_ROTATED_RUN; j++) acc[4u * g4 + g][j] += p[g] * v[j];
    }
  }
}
// The split's page part (window false: kvq_flash_out) or window part of heads row_head0 .. + heads - 1.
void rotated_store(bool window, uint rows, uint n, uint row_head0, uint heads, uint split, uint c0,
                   float acc[KVQ_FLASH_HEADS_PER_PASS][KVQ_ROTATED_RUN]) {
  for (uint g = 0u; g < heads; g++)
    for (uint j = 0u; j < KVQ_ROTATED_RUN; j++) {
      uint c = c0 + j;
      dst[window ? kvq_flash_window(rows, n, row_head0 + g, split, c) : kvq_flash_out(rows, n, row_head0 + g, split, c)] =
          floatBitsToUint(acc[g][j]);
    }
}
#endif

void main() {
  uint unit;
  if (!kvq_locate(KVQ_PLAN_FLASH, unit)) return; // uniform over the workgroup
  uint n = kvq_seq_tokens(), rows = kvq_seq(KVQ_SEQ_QUERY_COUNT);
  uint r, kvh, pass, split;
  if (n == 0u || !kvq_flash_unit(unit, n, r, kvh, pass, split)) return; // uniform over the workgroup
  uint lane = gl_LocalInvocationID.x, d = pc.head_dim;
  uint h0 = kvh * kvq_group() + pass * KVQ_FLASH_HEADS_PER_PASS;
  uint heads = min(KVQ_FLASH_HEADS_PER_PASS, kvq_group() - pass * KVQ_FLASH_HEADS_PER_PASS);
  uint first = split * KVQ_FLASH_SPLIT, count = min(KVQ_FLASH_SPLIT, n - first);
  for (uint g4 = 0u; g4 < KVQ_FLASH_QUADS; g4++) {
    vec4 p = vec4(0.0);
    for (uint g = 0u; g < 4u; g++) // constant trips; heads past the pass's stay 0
      if (lane < count && 4u * g4 + g < heads) p[g] = uintBitsToFloat(dst[kvq_flash_prob(n, r * pc.query_heads + h0 + 4u * g4 + g, first + lane)]);
    prob4[g4][lane] = p;
  }
  uint quantized = kvq_seq(KVQ_SEQ_QUANTIZED);
  if (lane < count) {
    uint t = first + lane;
    token_at[lane] = t < quantized ? kvq_token(kvq_slot_block(t, kvh), t & (pc.page_size - 1u)) : uvec3(kvq_window_first(t, kvh), 0u, 0u);
  }
  barrier();
#ifdef KVQ_SUMS_ROTATED
  // Runs of KVQ_ROTATED_RUN rotated coordinates per invocation, as the plain path below: each page
  // token's run decoded once for the heads (kvq_decode_rotated_run: each of its codes read once,
  // not L times per coordinate), its probabilities read once per run. The split's page tokens come
  // first (i < paged), then its window tokens, in loops of their own (no branch per token); each
  // part is stored apart (a part without tokens stores zeros).
  uint paged = quantized > first ? min(count, quantized - first) : 0u;
  for (uint c0 = lane * KVQ_ROTATED_RUN; c0 < d; c0 += KVQ_FLASH_SPLIT * KVQ_ROTATED_RUN) {
    float acc[KVQ_FLASH_HEADS_PER_PASS][KVQ_ROTATED_RUN], v[KVQ_ROTATED_RUN];
    rotated_zero(acc);
    for (uint i = 0u; i < paged; i++) {
      kvq_decode_rotated_run(token_at[i].x, token_at[i].y, c0, v);
      rotated_add(i, heads, v, acc);
    }
    rotated_store(false, rows, n, r * pc.query_heads + h0, heads, split, c0, acc);
    rotated_zero(acc);
    for (uint i = paged; i < count; i++) {
      for (uint j = 0u; j < KVQ_ROTATED_RUN; j++) v[j] = kvq_window_at(token_at[i].x + c0 + j);
      rotated_add(i, heads, v, acc);
    }
    rotated_store(true, rows, n, r * pc.query_heads + h0, heads, split, c0, acc);
  }
#else
  // One run of KVQ_FLASH_VALUE_RUN channels per invocation (d is a multiple of 16, core/layout.h):
  // the token's handle and probabilities are read once per run instead of once per channel, and the
  // path kvq_value_path chose decodes the run (the method's run decode: one read of what its
  // channels share). Page tokens, then window tokens, each kind in token loops of its own.
  for (uint c0 = lane * KVQ_FLASH_VALUE_RUN; c0 < d; c0 += KVQ_FLASH_SPLIT * KVQ_FLASH_VALUE_RUN) {
    // acc[g4][j]: channel c0 + j of the quad g4's 4 heads, in vec4s
    vec4 acc[KVQ_FLASH_QUADS][KVQ_FLASH_VALUE_RUN];
    for (uint g4 = 0u; g4 < KVQ_FLASH_QUADS; g4++)
      for (uint j = 0u; j < KVQ_FLASH_VALUE_RUN; j++) acc[g4][j] = vec4(0.0);
    uint paged = quantized > first ? min(count, quantized - first) : 0u, path = kvq_value_path(c0, paged);
#ifdef KVQ_DECODES_RUN
    for (uint i = 0u; i < (path == KVQ_VALUE_BY_RUN ? paged : 0u); i++) {
      float v[KVQ_FLASH_VALUE_RUN];
      kvq_decode_run(token_at[i], c0, v);
      value_add(i, heads, v, acc);
    }
#endif
#ifdef KVQ_DECODES_AFFINE
    for (uint i = 0u; i < (path == KVQ_VALUE_AFFINE ? paged : 0u); i++) {
      float v[KVQ_FLASH_VALUE_RUN];
      vec2 scale_min = kvq_affine_params(token_at[i], c0);
      for (uint j = 0u; j < KVQ_FLASH_VALUE_RUN; j++) v[j] = kvq_affine_decode(scale_min, token_at[i], c0 + j);
      value_add(i, heads, v, acc);
    }
#endif
    for (uint i = 0u; i < (path == KVQ_VALUE_CHANNELS ? paged : 0u); i++) {
      float v[KVQ_FLASH_VALUE_RUN];
      for (uint j = 0u; j < KVQ_FLASH_VALUE_RUN; j++) v[j] = kvq_decode_token(token_at[i], c0 + j);
      value_add(i, heads, v, acc);
    }
    for (uint i = paged; i < count; i++) {
      float v[KVQ_FLASH_VALUE_RUN];
      for (uint j = 0u; j < KVQ_FLASH_VALUE_RUN; j++) v[j] = kvq_window_at(token_at[i].x + c0 + j);
      value_add(i, heads, v, acc);
    }
    for (uint g4 = 0u; g4 < KVQ_FLASH_QUADS; g4++) // constant bounds: acc indexed by constants only
      for (uint g = 0u; g < 4u; g++)
        if (4u * g4 + g < heads)
          for (uint j = 0u; j < KVQ_FLASH_VALUE_RUN; j++)
            dst[kvq_flash_out(rows, n, r * pc.query_heads + h0 + 4u * g4 + g, split, c0 + j)] = floatBitsToUint(acc[g4][j][g]);
  }
#endif
}
