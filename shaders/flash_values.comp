#version 450
#extension GL_GOOGLE_include_directive : require
// Fused decode attention, pass 2 of 3 (shaders/flash.glsl): the split's probability-weighted sum of
// values for every query head of the pass, each value decoded once; invocations share the channels.
// Value methods that sum in a rotated space (KVQ_SUMS_ROTATED) sum the split's page tokens there
// (kvq_decode_rotated: no rotation per token) into the split output and its window tokens apart
// (kvq_flash_window), since only the page part is rotated back, once per output row after the combine.
#include "shaders/common.glsl"
#include "shaders/method.glsl"
#include "shaders/attention.glsl"
#include "shaders/flash.glsl"

shared float prob[KVQ_FLASH_HEADS_PER_PASS][KVQ_FLASH_SPLIT];
// Token i's decoding handle (shaders/method.glsl) or, in the window, its first ring element (in .x):
// computed once per token here instead of once per channel (page-table lookup, page position).
shared uvec3 token_at[KVQ_FLASH_SPLIT];

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
  for (uint g = 0u; g < heads; g++)
    prob[g][lane] = lane < count ? uintBitsToFloat(dst[kvq_flash_prob(n, r * pc.query_heads + h0 + g, first + lane)]) : 0.0;
  uint quantized = kvq_seq(KVQ_SEQ_QUANTIZED);
  if (lane < count) {
    uint t = first + lane;
    token_at[lane] = t < quantized ? kvq_token(kvq_slot_block(t, kvh), t & (pc.page_size - 1u)) : uvec3(kvq_window_first(t, kvh), 0u, 0u);
  }
  barrier();
  for (uint c = lane; c < d; c += KVQ_FLASH_SPLIT) {
    float acc[KVQ_FLASH_HEADS_PER_PASS];
    for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++) acc[g] = 0.0;
    for (uint i = 0u; i < count; i++) {
      uint t = first + i;
      uvec3 token = token_at[i];
#ifdef KVQ_SUMS_ROTATED
      if (t == quantized) { // the page part is complete: the window tokens sum apart
        for (uint g = 0u; g < heads; g++) {
          dst[kvq_flash_out(rows, n, r * pc.query_heads + h0 + g, split, c)] = floatBitsToUint(acc[g]);
          acc[g] = 0.0;
        }
      }
      // (a rotated method's handle is the default (block, slot): method.glsl refuses KVQ_DECODES_BY_TOKEN with it)
      float v = t < quantized ? kvq_decode_rotated(token.x, token.y, c) : kvq_window_at(token.x + c);
#else
      float v = t < quantized ? kvq_decode_token(token, c) : kvq_window_at(token.x + c);
#endif
      for (uint g = 0u; g < heads; g++) acc[g] += prob[g][i] * v;
    }
#ifdef KVQ_SUMS_ROTATED
    // acc holds the window part where the split reached the window (the page part was stored at
    // t == quantized), else the page part, and the other part of the split is 0
    bool windowed = first + count > quantized;
    for (uint g = 0u; g < heads; g++) {
      uint row_head = r * pc.query_heads + h0 + g;
      if (first >= quantized) dst[kvq_flash_out(rows, n, row_head, split, c)] = 0u; // no page token
      dst[windowed ? kvq_flash_window(rows, n, row_head, split, c) : kvq_flash_out(rows, n, row_head, split, c)] =
          floatBitsToUint(acc[g]);
      if (!windowed) dst[kvq_flash_window(rows, n, row_head, split, c)] = 0u;
    }
#else
    for (uint g = 0u; g < heads; g++)
      dst[kvq_flash_out(rows, n, r * pc.query_heads + h0 + g, split, c)] = floatBitsToUint(acc[g]);
#endif
  }
}
