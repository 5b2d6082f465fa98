// The method a shader variant is built for (KVQ_METHOD, a KVQ_LAYOUT_* value, and KVQ_VK_METHOD_<M>,
// which picks its code below; both set by shaders/meson.build from its one list of methods). How
// many units a head block or a query splits into is shaders/work_units.h's (shared with the host
// and the CPU reference): kvq_encode_units(n) and kvq_prepare_units() below.
// The math itself is in core/methods/<method>.h, shared with the CPU reference and CUDA
// (docs/DESIGN.md, "One source for each method's math"); each methods/*.glsl only binds it to this
// pipeline (push constants, the kv head of a block) and provides:
//   void  kvq_encode_unit(uint block, uint unit, uint n, uint x)
//                                                       encode one unit into the zeroed head block at
//                                                       byte `block` of `pages`; token t, channel c
//                                                       of the input is element x + t*kv_heads*d + c of src
//   float kvq_decode(uint block, uint t, uint c)        channel c of token t as DEQUANTIZE returns it
// or instead, with KVQ_ENCODES_BY_WORKGROUP defined (shaders/work_units.h's kvq_encode_by_workgroup
// must say the same for the method, as the host sizes the dispatch by it):
//   void  kvq_encode_unit_group(uint block, uint unit, uint n, uint x)
//                                                       the same, called by every invocation of a
//                                                       workgroup with the same arguments (it may hold
//                                                       barriers)
// and may define, with their functions:
//   KVQ_PREPARES      keys are scored against a prepared query (PREPARE_QUERY):
//     uint  kvq_prepared_floats()                       floats of one prepared query
//     void  kvq_prepare_unit(uint q, uint h, uint u, uint out_at)
//                                                       unit u of preparing the fp32 query at element
//                                                       q of src for kv head h into dst from element
//                                                       out_at (QJL: row u of S q; PolarQuant: all;
//                                                       CQ: table entry u)
//     float kvq_score_dot(uint block, uint t, uint q, uint p)
//                                                       q.k_t for the query at element q of src,
//                                                       prepared at element p of results
//   KVQ_SCORES_HEADS  (with KVQ_PREPARES) the fused logits (flash_logits.comp) score a paged key
//                     against all the heads of a pass in one call, decoding it once:
//     void  kvq_score_heads(uint block, uint t, uint p, uint heads, inout float logit[KVQ_FLASH_HEADS_PER_PASS])
//                                                       adds q_g.k_t to logit[g], g < heads, for the
//                                                       prepared queries at p + g * kvq_prepared_floats()
//   KVQ_SUMS_ROTATED  values are summed in a rotated space and rotated back once per output row:
//     float kvq_decode_rotated(uint block, uint t, uint i)  coordinate i of token t in that space
//     KVQ_ROTATED_RUN and void kvq_decode_rotated_run(uint block, uint t, uint c0, out float v[KVQ_ROTATED_RUN])
//                                                       coordinates c0 .. c0 + KVQ_ROTATED_RUN - 1 (c0 a
//                                                       multiple of it, which divides every head_dim),
//                                                       = kvq_decode_rotated's (the fused value pass)
//     void  kvq_rotate_back(uint s, out float x[KVQ_MAX_HEAD_DIM])
//                                                       the sum at element s of dst, rotated back
//   KVQ_TOKEN_ERROR   float kvq_token_error(uint block, uint t, uint x)
//                                                       ||x - x^|| of token t, x at element x of src
//   KVQ_DECODES_BY_TOKEN  kvq_decode split in two for the fused attention's loops, which call the
//                     first once per token and the second per channel (lavapipe and NIR do not
//                     hoist loop invariants reliably, so the split is written out):
//     uvec3 kvq_token(uint block, uint t)               what decoding token t needs of the block
//     float kvq_decode_token(uvec3 token, uint c)       channel c of it, = kvq_decode(block, t, c)
//     (methods without it get the plain kvq_decode through the defaults at the end of this file)
//   KVQ_DECODES_AFFINE  (with KVQ_DECODES_BY_TOKEN) runs of a token's channels share the scale and
//                     minimum that decoding reads, so the fused scoring reads them once per run:
//     uint  kvq_affine_run()                             channels per run, a power of two dividing d
//     vec2  kvq_affine_params(uvec3 token, uint c)       (scale, minimum) of the run from channel c
//     float kvq_affine_decode(vec2 scale_min, uvec3 token, uint c)
//                                                       channel c of the run, = kvq_decode_token
//   KVQ_DECODES_RUN   (with or without KVQ_DECODES_BY_TOKEN) the fused value pass decodes
//                     KVQ_DECODE_RUN consecutive channels of a token in one call, reading what they
//                     share (a code word, a parameter word) once instead of once per channel:
//     bool  kvq_decode_run(uvec3 token, uint c0, out float v[KVQ_DECODE_RUN])
//                                                       channels c0 .. c0 + KVQ_DECODE_RUN - 1 (c0 a
//                                                       multiple of KVQ_DECODE_RUN), each = kvq_decode_token;
//                                                       false (v unset) where this cache's parameters
//                                                       (push constants: uniform) do not allow it
//   KVQ_RUNS_ALWAYS   (with KVQ_DECODES_RUN) kvq_decode_run never returns false, so the fused logits
//                     take their run loop without probing it first (methods with KVQ_DECODES_RUN and
//                     no scoring hook of their own, KVQ_PREPARES, KVQ_SCORES_HEADS or
//                     KVQ_FLASH_SPLIT_SCORES, score paged keys by runs wherever kvq_decode_run accepts
//                     the cache: shaders/flash_logits.comp)
// Channels of kvq_decode_run: flash_values.comp's run (a power of two dividing every head_dim, which
// is a multiple of 16, core/layout.h).
#define KVQ_DECODE_RUN 8u
#if defined(KVQ_VK_METHOD_EXACT)
#include "methods/exact.glsl"
#elif defined(KVQ_VK_METHOD_QJL)
#include "methods/qjl.glsl"
#elif defined(KVQ_VK_METHOD_UNIFORM)
#include "methods/uniform.glsl"
#elif defined(KVQ_VK_METHOD_KIVI)
#include "methods/kivi.glsl"
#elif defined(KVQ_VK_METHOD_POLAR)
#include "methods/polar.glsl"
#elif defined(KVQ_VK_METHOD_CQ)
#include "methods/cq.glsl"
#else
#error "shaders/method.glsl: no shader code for this method yet"
#endif

#include "shaders/work_units.h"

uint kvq_encode_units(uint n) {
  return kvq_encode_units_of(KVQ_METHOD, n, pc.head_dim, pc.group, pc.sketch_dim, pc.outliers, pc.outlier_sketch_dim,
                             pc.channels);
}
uint kvq_prepare_units() { return kvq_prepare_units_of(KVQ_METHOD, pc.sketch_dim, pc.head_dim, pc.channels, pc.code_bits); }

#ifndef KVQ_DECODES_BY_TOKEN
uvec3 kvq_token(uint block, uint t) { return uvec3(block, t, 0u); }
float kvq_decode_token(uvec3 token, uint c) { return kvq_decode(token.x, token.y, c); }
#elif defined(KVQ_SUMS_ROTATED)
#error "shaders/method.glsl: flash_values.comp decodes rotated sums from the default token handle (block, slot)"
#endif
