// PolarQuant: each token is rotated, y = R x, then every block of 2^L rotated coordinates becomes
// one fp16 radius and 2^L - 1 angle codes. The math is core/methods/polar.h, the CPU reference's
// too. Work unit: KVQ_POLAR_GROUP_TOKENS tokens, encoded by a whole workgroup. As on the CPU, keys
// are scored in the rotated space against the prepared query R q, and values are summed there and
// rotated back once per output row; a thread decodes one rotated coordinate
// (kvq_polar_decode_coord), which gives the CPU's floats bit for bit. Tokens are read once into
// arrays (applying R per channel of every token would pass the loop limit, docs/VULKAN.md).
#include "core/methods/polar.h"
#include "shaders/work_units.h"

#define KVQ_PREPARES
#define KVQ_SUMS_ROTATED
#define KVQ_TOKEN_ERROR

// The kv head of the head block at byte `block`: core places page k of a pool at k * page_bytes, so
// head blocks sit at whole multiples of head_bytes (the quantize job refuses other page offsets when
// the tables are per head, backends/vulkan/vk_jobs.c).
uint polar_tables(uint block) {
  return kvq_polar_tables(block / (pc.head_words * 4u) % pc.kv_heads, pc.codebook, pc.levels, pc.level_bits);
}

// QUANTIZE by workgroup (shaders/quantize.comp): unit u is tokens [uT, uT + T) of the head block,
// T = KVQ_POLAR_GROUP_TOKENS (shaders/work_units.h), their coordinates spread over the invocations as
// the CUDA backend spreads a token's over a block (kvq_cuda_polar_encode), through the same functions
// of core/methods/polar.h in the same order per coordinate, so the codes and radii are
// kvq_polar_encode_unit's byte for byte. One invocation per token ran the d x d rotation, every level
// and private arrays serially. Here a dense rotation reads each matrix entry once for the T tokens,
// and reads entries and inputs four floats at a time: llvmpipe runs every load in a loop or branch
// lane by lane, so loads, not arithmetic, bound it; KVQ_IN is read once per input (it enters the fp16
// conversion's loop on every read).
// Shared memory, 10 KiB at T = 4 (every Vulkan device offers 16 KiB): the dense rotation's inputs
// (polar_x), then the rotated tokens (polar_a) and each level's entries, which polar_a and polar_b
// take turns to hold (in place, angle a would overwrite entry a while another invocation still
// reads it; a level writes at most d / 2 entries).
#define POLAR_T KVQ_POLAR_GROUP_TOKENS
#define POLAR_A KVQ_MAX_HEAD_DIM
#define POLAR_B (KVQ_MAX_HEAD_DIM / 2u)
shared vec4 polar_x[POLAR_T * KVQ_MAX_HEAD_DIM / 4u];
shared float polar_a[POLAR_T * POLAR_A], polar_b[POLAR_T * POLAR_B];
#define KVQ_ENCODES_BY_WORKGROUP

// The dense rotation (fixed0) four entries at a time: the same words as KVQ_POLAR_ROTATION reads
// (d is a multiple of 16, so each row starts on a 16-byte boundary).
layout(std430, binding = KVQ_BINDING_FIXED0) readonly buffer Fixed0Vec4 { uvec4 fixed0_vec4[]; };

// Every write to shared memory visible to the whole workgroup before the next step reads it.
void polar_sync() {
  memoryBarrierShared();
  barrier();
}

// Entry e of token k of the unit in polar_a (which 0) or polar_b (which 1).
float polar_get(uint which, uint k, uint e) { return which == 0u ? polar_a[k * POLAR_A + e] : polar_b[k * POLAR_B + e]; }
void polar_set(uint which, uint k, uint e, float v) {
  if (which == 0u) polar_a[k * POLAR_A + e] = v;
  else polar_b[k * POLAR_B + e] = v;
}

void kvq_encode_unit_group(uint block, uint u, uint n, uint x) {
  uint lane = gl_LocalInvocationID.x, lanes = gl_WorkGroupSize.x, d = pc.head_dim, L = pc.levels;
  uint P = pc.page_size, bits = pc.level_bits, tables = polar_tables(block), stride = pc.kv_heads * d;
  uint t0 = u * POLAR_T, tokens = min(n - t0, POLAR_T); // the unit's valid tokens, 1 .. T
  // y = R x of each token into polar_a (kvq_polar_rotate's floats).
  if (pc.rotation == KVQ_LAYOUT_ROTATION_DENSE) {
    // The inputs into polar_x (zeros past the valid tokens, whose results are never stored), then
    // row i of every token: kvq_polar_rotate_row's steps (kvq_polar_row_term), c increasing.
    for (uint e = lane; e < POLAR_T * d / 4u; e += lanes) {
      uint k = e / (d / 4u), c = e % (d / 4u) * 4u, at = x + (t0 + k) * stride + c;
      polar_x[k * KVQ_MAX_HEAD_DIM / 4u + c / 4u] =
          k < tokens ? vec4(KVQ_IN(at), KVQ_IN(at + 1u), KVQ_IN(at + 2u), KVQ_IN(at + 3u)) : vec4(0.0);
    }
    polar_sync();
    for (uint i = lane; i < d; i += lanes) {
      precise float p[POLAR_T];
      for (uint k = 0u; k < POLAR_T; k++) p[k] = 0.0;
      for (uint c = 0u; c < d / 4u; c++) { // four columns a trip (the loop limit: d / 64 rows of d / 4)
        vec4 r = uintBitsToFloat(fixed0_vec4[(i * d) / 4u + c]);
        for (uint k = 0u; k < POLAR_T; k++) {
          vec4 v = polar_x[k * KVQ_MAX_HEAD_DIM / 4u + c];
          p[k] = kvq_polar_row_term(p[k], r.x, v.x);
          p[k] = kvq_polar_row_term(p[k], r.y, v.y);
          p[k] = kvq_polar_row_term(p[k], r.z, v.z);
          p[k] = kvq_polar_row_term(p[k], r.w, v.w);
        }
      }
      for (uint k = 0u; k < POLAR_T; k++) polar_a[k * POLAR_A + i] = p[k];
    }
  } else {
    // The signs, then each butterfly stage shared (one stage's butterflies touch disjoint entries;
    // a barrier between stages), then the scale.
    for (uint e = lane; e < POLAR_T * d; e += lanes) {
      uint k = e / d, c = e % d;
      polar_a[k * POLAR_A + c] = k < tokens ? kvq_polar_sign_in(x + (t0 + k) * stride, c) : 0.0;
    }
    polar_sync();
    for (uint len = 1u; len < d; len <<= 1u) {
      for (uint e = lane; e < POLAR_T * (d / 2u); e += lanes) {
        uint j = e / (d / 2u) * POLAR_A + kvq_polar_butterfly_at(len, e % (d / 2u));
        precise float a = polar_a[j], b = polar_a[j + len];
        precise float sum = KVQ_FADD(a, b), difference = KVQ_FSUB(a, b);
        polar_a[j] = sum;
        polar_a[j + len] = difference;
      }
      polar_sync();
    }
    float scale = kvq_hadamard_scale(d);
    for (uint e = lane; e < POLAR_T * d; e += lanes) {
      uint j = e / d * POLAR_A + e % d;
      precise float scaled = KVQ_FMUL(polar_a[j], scale);
      polar_a[j] = scaled;
    }
  }
  polar_sync();
  // Level by level: angle a reads entries 2a, 2a + 1 of the level below and writes entry a of the
  // other array; tokens past the valid ones store nothing.
  uint from = 0u;
  for (uint l = 1u; l <= L; l++) {
    uint angles = kvq_polar_angles(d, l);
    for (uint e = lane; e < tokens * angles; e += lanes) {
      uint k = e / angles, a = e % angles;
      polar_set(1u - from, k, a,
                kvq_polar_encode_angle(block, t0 + k, l, a, polar_get(from, k, 2u * a), polar_get(from, k, 2u * a + 1u), P,
                                       d, bits, tables));
    }
    polar_sync();
    from = 1u - from;
  }
  for (uint e = lane; e < tokens * (d >> L); e += lanes) {
    uint k = e / (d >> L), r = e % (d >> L);
    kvq_polar_put_radius(block, t0 + k, r, polar_get(from, k, r), P, d, L, bits);
  }
}

float kvq_decode_rotated(uint block, uint t, uint i) {
  return kvq_polar_decode_coord(block, t, i, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, polar_tables(block));
}

// Channel c of the unrotated token (DEQUANTIZE).
float kvq_decode(uint block, uint t, uint c) {
  return kvq_polar_decode(block, t, c, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, pc.rotation, polar_tables(block));
}

// ||x - x^|| of token t, x^ as DEQUANTIZE returns it, x at element x of src (QUANTIZE errors).
float kvq_token_error(uint block, uint t, uint x) {
  float y[KVQ_MAX_HEAD_DIM], decoded[KVQ_MAX_HEAD_DIM];
  for (uint i = 0u; i < pc.head_dim; i++) y[i] = kvq_decode_rotated(block, t, i);
  kvq_polar_unrotate(y, pc.head_dim, pc.rotation, decoded);
  float sum = 0.0;
  for (uint c = 0u; c < pc.head_dim; c++) {
    float diff = KVQ_IN(x + c) - decoded[c];
    sum += diff * diff;
  }
  return sqrt(sum);
}

// PREPARE_QUERY: R q, exactly as the CPU reference rotates queries (pc.input_dtype is fp32 there):
// unit i computes row i of the dense form (kvq_polar_rotate's rows), unit 0 the whole Hadamard form.
uint kvq_prepared_floats() { return pc.head_dim; }
void kvq_prepare_unit(uint q, uint h, uint unit, uint out_at) {
  if (pc.rotation == KVQ_LAYOUT_ROTATION_DENSE) {
    dst[out_at + unit] = floatBitsToUint(kvq_polar_rotate_row(q, unit, pc.head_dim));
    return;
  }
  if (unit != 0u) return;
  float y[KVQ_MAX_HEAD_DIM];
  kvq_polar_rotate(q, pc.head_dim, pc.rotation, y);
  for (uint i = 0u; i < pc.head_dim; i++) dst[out_at + i] = floatBitsToUint(y[i]);
}

// q.k for key token t: the prepared query (element p of results) against the rotated key, decoded
// whole first (kvq_polar_decode_token: about 2 products and 1 code read per coordinate, no division
// per code), not coordinate by coordinate (kvq_polar_score: L of each, and 2 divisions per code
// read, docs/BENCH.md's per-kernel budget); the same floats, summed in the same order, so the same
// logit.
float kvq_score_dot(uint block, uint t, uint q, uint p) {
  float y[KVQ_MAX_HEAD_DIM];
  kvq_polar_decode_token(block, t, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, polar_tables(block), y);
  float dot = 0.0;
  for (uint i = 0u; i < pc.head_dim; i++) dot += KVQ_PREPARED(p + i) * y[i];
  return dot;
}

// The fused logits (shaders/flash_logits.comp, KVQ_SCORES_HEADS): each token's key decoded once,
// whole, and dotted with every head of the pass, instead of being decoded again per head through
// kvq_score_dot (issue 11: PolarQuant decoded once per token, shared by the GQA heads). Per head the
// sum runs as kvq_score_dot's, coordinate by coordinate: the same logits. The prepared queries are
// read from results four floats at a time (llvmpipe runs each load in a loop lane by lane, so a
// vec4 load is a quarter of the loads; p and the stride are multiples of 16 floats, d being one).
// They stay in results: in shared memory they would take 8 KiB, over the 16 KiB every Vulkan
// device offers together with this file's QUANTIZE arrays, which every PolarQuant shader declares.
#define KVQ_SCORES_HEADS
layout(std430, binding = KVQ_BINDING_RESULTS) readonly buffer ResultsVec4 { uvec4 results_vec4[]; };
void kvq_score_heads(uint block, uint t, uint p, uint heads, inout float logit[KVQ_FLASH_HEADS_PER_PASS]) {
  float y[KVQ_MAX_HEAD_DIM];
  kvq_polar_decode_token(block, t, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, polar_tables(block), y);
  uint stride = kvq_prepared_floats();
  for (uint i = 0u; i < pc.head_dim; i += 4u)
    for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++) // a constant trip count: unrolled, logit[g] in registers
      if (g < heads) {
        vec4 q = uintBitsToFloat(results_vec4[(p + g * stride + i) >> 2u]);
        logit[g] += q.x * y[i];
        logit[g] += q.y * y[i + 1u];
        logit[g] += q.z * y[i + 2u];
        logit[g] += q.w * y[i + 3u];
      }
}

// The weighted sum's rotated page sum (d floats at element s of dst) rotated back, into x.
void kvq_rotate_back(uint s, out float x[KVQ_MAX_HEAD_DIM]) {
  float y[KVQ_MAX_HEAD_DIM];
  for (uint i = 0u; i < pc.head_dim; i++) y[i] = uintBitsToFloat(dst[s + i]);
  kvq_polar_unrotate(y, pc.head_dim, pc.rotation, x);
}
