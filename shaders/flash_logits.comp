#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef KVQ_SUBGROUPS
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
// Fused decode attention, pass 1 of 3 (shaders/flash.glsl): each invocation decodes its token's key
// once and scores it against every query head of the pass; the workgroup then finds, per head, the
// split's maximum logit and the sum of exp(logit - maximum), and stores exp(logit - maximum).
#include "shaders/common.glsl"
#include "shaders/method.glsl"
#include "shaders/attention.glsl"
#include "shaders/flash.glsl"
// A method may score its split's quantized tokens with the whole workgroup (tables in shared memory,
// work once per page): it defines KVQ_FLASH_SPLIT_SCORES and
//   void kvq_flash_split_scores(uint r, uint kvh, uint h0, uint heads, uint first, bool visible,
//                               inout float logit[KVQ_FLASH_HEADS_PER_PASS])
// called by every invocation (it may hold barriers); the loop below then scores the window only.
#ifdef KVQ_VK_METHOD_QJL
#include "shaders/methods/qjl_flash.glsl"
#elif defined(KVQ_VK_METHOD_KIVI)
#include "shaders/methods/kivi_flash.glsl"
#endif

// Methods whose paged keys the loop below decodes by runs (KVQ_DECODES_RUN: exact, uniform) read the
// pass's queries from shared memory, staged once by the workgroup, 4 channels a load: llvmpipe runs
// each load lane by lane (docs/VULKAN.md), and a float loaded from the query buffer per channel and
// head was most of exact fp16's call (118 -> 76 CPU ms per fused call at 4k, docs/BENCH.md, "The
// query in shared memory"). Same products in the same order: the same floats.
#if defined(KVQ_DECODES_RUN) && !defined(KVQ_FLASH_SPLIT_SCORES) && !defined(KVQ_SCORES_HEADS) && !defined(KVQ_PREPARES)
#define KVQ_FLASH_QUERY_SHARED
shared vec4 kvq_flash_query[KVQ_FLASH_HEADS_PER_PASS * KVQ_MAX_HEAD_DIM / 4u]; // 8 KiB: [head][channel / 4]
#endif

void main() {
  uint unit;
  if (!kvq_locate(KVQ_PLAN_FLASH, unit)) return; // uniform over the workgroup
  uint n = kvq_seq_tokens(), rows = kvq_seq(KVQ_SEQ_QUERY_COUNT);
  uint r, kvh, pass, split;
  if (n == 0u || !kvq_flash_unit(unit, n, r, kvh, pass, split)) return; // uniform over the workgroup
  uint lane = gl_LocalInvocationID.x, t = split * KVQ_FLASH_SPLIT + lane, d = pc.head_dim;
  uint h0 = kvh * kvq_group() + pass * KVQ_FLASH_HEADS_PER_PASS;
  uint heads = min(KVQ_FLASH_HEADS_PER_PASS, kvq_group() - pass * KVQ_FLASH_HEADS_PER_PASS);
  bool visible = t < n && kvq_visible(r, t);
  float logit[KVQ_FLASH_HEADS_PER_PASS];
  for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++) logit[g] = 0.0;
#ifdef KVQ_FLASH_QUERY_SHARED
  {
    uint q0 = ((kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h0) * d;
    for (uint i = lane; i < heads * (d / 4u); i += KVQ_GPU_GROUP_SIZE)
      kvq_flash_query[i] = vec4(uintBitsToFloat(src[q0 + 4u * i]), uintBitsToFloat(src[q0 + 4u * i + 1u]),
                                uintBitsToFloat(src[q0 + 4u * i + 2u]), uintBitsToFloat(src[q0 + 4u * i + 3u]));
    barrier();
  }
#endif
#ifdef KVQ_FLASH_SPLIT_SCORES
  kvq_flash_split_scores(r, kvh, h0, heads, split * KVQ_FLASH_SPLIT, visible, logit); // uniform control flow
#endif
  if (visible) {
    uint q = ((kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h0) * d;
    bool paged = t < kvq_seq(KVQ_SEQ_QUANTIZED);
    uint block = paged ? kvq_slot_block(t, kvh) : 0u;
    // What depends on the token only, once: its decoding handle (shaders/method.glsl; page_size is
    // a power of two, core/config.c) or its first window element.
    uvec3 token = paged ? kvq_token(block, t & (pc.page_size - 1u)) : uvec3(kvq_window_first(t, kvh), 0u, 0u);
#if defined(KVQ_FLASH_SPLIT_SCORES)
    if (paged) {
    } else // scored above
#elif defined(KVQ_SCORES_HEADS)
    if (paged) // the method scores the key against every head of the pass at once (decoding it once)
      kvq_score_heads(block, t % pc.page_size, ((kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h0) * kvq_prepared_floats(),
                      heads, logit);
    else
#elif defined(KVQ_PREPARES)
    if (paged) { // scored from the prepared queries in results (QJL's estimator, PolarQuant's rotation)
      uint row = (kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h0;
      for (uint g = 0u; g < heads; g++)
        logit[g] = kvq_score_dot(block, t % pc.page_size, q + g * d, (row + g) * kvq_prepared_floats());
    } else
#elif defined(KVQ_FLASH_QUERY_SHARED)
#ifdef KVQ_RUNS_ALWAYS
    const bool runs = true;
#else
    float probe[KVQ_DECODE_RUN];
    bool runs = paged && kvq_decode_run(token, 0u, probe); // whether this cache's parameters allow runs: uniform
#endif
    if (paged && runs) { // the method's run decode (exact caches: a run in one or two 16-byte loads)
      for (uint c0 = 0u; c0 < d; c0 += KVQ_DECODE_RUN) {
        float k[KVQ_DECODE_RUN];
        kvq_decode_run(token, c0, k);
        for (uint g = 0u; g < heads; g++) { // channel by channel, as the loops below
          vec4 a = kvq_flash_query[g * (d / 4u) + c0 / 4u], b = kvq_flash_query[g * (d / 4u) + c0 / 4u + 1u];
          logit[g] += a.x * k[0];
          logit[g] += a.y * k[1];
          logit[g] += a.z * k[2];
          logit[g] += a.w * k[3];
          logit[g] += b.x * k[4];
          logit[g] += b.y * k[5];
          logit[g] += b.z * k[6];
          logit[g] += b.w * k[7];
        }
      }
    } else
#endif
#ifdef KVQ_DECODES_AFFINE
    if (paged) { // runs of channels sharing a scale and minimum: those read once per run
      uint run = kvq_affine_run();
      for (uint c0 = 0u; c0 < d; c0 += run) {
        vec2 scale_min = kvq_affine_params(token, c0);
        for (uint c = c0; c < c0 + run; c++) {
          float k = kvq_affine_decode(scale_min, token, c);
          for (uint g = 0u; g < heads; g++) logit[g] += uintBitsToFloat(src[q + g * d + c]) * k;
        }
      }
    } else
#endif
    for (uint c = 0u; c < d; c++) {
      float k = paged ? kvq_decode_token(token, c) : kvq_window_at(token.x + c);
      for (uint g = 0u; g < heads; g++) logit[g] += uintBitsToFloat(src[q + g * d + c]) * k;
    }
  }
  const float minus_inf = uintBitsToFloat(0xff800000u);
  for (uint g = 0u; g < heads; g++) {
    float x = visible ? logit[g] * uintBitsToFloat(pc.scale_bits) : minus_inf;
    float m = kvq_workgroup_max(x);
    float p = visible ? exp(x - m) : 0.0;
    float sum = kvq_workgroup_sum(p);
    uint row_head = r * pc.query_heads + h0 + g;
    if (t < n) dst[kvq_flash_prob(n, row_head, t)] = floatBitsToUint(p);
    if (lane == 0u) {
      dst[kvq_flash_max(rows, n, row_head, split)] = floatBitsToUint(m);
      dst[kvq_flash_sum(rows, n, row_head, split)] = floatBitsToUint(sum);
    }
  }
}
