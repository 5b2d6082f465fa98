// PolarQuant: each token is rotated, y = R x, then every block of 2^L rotated coordinates becomes
// one fp16 radius and 2^L - 1 angle codes. The math is core/methods/polar.h, the CPU reference's
// too. Work unit: KVQ_POLAR_GROUP_TOKENS tokens, encoded by a whole workgroup. As on the CPU, keys
// are scored in the rotated space against the prepared query R q, and values are summed there and
// rotated back once per output row; a thread decodes one rotated coordinate
// (kvq_polar_decode_coord) or, in the fused passes (keys and values), a run of 8 (kvq_polar_decode_run), which give
// the CPU's floats bit for bit. Tokens are read once into
// arrays (applying R per channel of every token would pass the loop limit, docs/VULKAN.md).
#extension GL_EXT_control_flow_attributes : require
// A centroid's cos and sin (kvq_polar_decode_token, kvq_polar_decode_run) with one 8-byte load of the
// codebook table instead of two 4-byte ones: the same two floats. llvmpipe runs every load as a
// loop over the lanes whatever its width, so this halves the decoding's table loads there
// (docs/BENCH.md, "PolarQuant fused decode: centroid pairs and code words read once").
layout(std430, binding = KVQ_BINDING_FIXED1) readonly buffer Fixed1Vec2 { uvec2 fixed1_vec2[]; };
#define KVQ_POLAR_CENTROID(c, s, table, code)                                   \
  {                                                                             \
    vec2 kvq_polar_pair = uintBitsToFloat(fixed1_vec2[((table) >> 1u) + (code)]); \
    c = kvq_polar_pair.x;                                                       \
    s = kvq_polar_pair.y;                                                       \
  }
// Where each level's codes and table lie (kvq_polar_level_offset, kvq_polar_table_level_offset;
// entry L + 1 of polar_codes_at: the radii), computed once per invocation for the cache's layout
// (push constants) by the global initializer, which runs at the start of main: the run decoding of
// the fused value pass (kvq_polar_decode_run) reads them instead of stepping through the levels
// with two integer divisions per level and run, which llvmpipe runs lane by lane (about 10% of a
// polar-b4222 fused call, docs/BENCH.md). Constant trip counts, so that the indices are constants.
#include "core/layout.h"
#define POLAR_LEVEL_SLOTS 10u // levels 1 .. KVQ_POLAR_MAX_LEVELS (8) and the radii
uint polar_codes_at[POLAR_LEVEL_SLOTS], polar_table_at[POLAR_LEVEL_SLOTS];
bool polar_offsets() {
  polar_codes_at[0] = 0u;
  polar_table_at[0] = 0u;
  polar_codes_at[1] = 0u;
  polar_table_at[1] = 0u;
  [[unroll]] for (uint l = 1u; l + 1u < POLAR_LEVEL_SLOTS; l++) {
    bool level = l <= pc.levels;
    uint b = level ? kvq_polar_level_bits(pc.level_bits, l) : 1u;
    polar_codes_at[l + 1u] = polar_codes_at[l] + (level ? kvq_code_words(pc.page_size * kvq_polar_angles(pc.head_dim, l), b) * 4u : 0u);
    polar_table_at[l + 1u] = polar_table_at[l] + (level ? 4u << b : 0u);
  }
  return true;
}
bool polar_offsets_set = polar_offsets();
// kvq_io_code_place's word, slot and codes per word of code i at b bits (1 .. 8, PolarQuant's
// widths), for kvq_polar_decode_run, without an integer division: 32 / b from a packed byte table,
// the word from a float product (exact to within one below for i < 2^16, where i is at most
// 256 x 128: the float error is under 2^-9, less than 1 / cpw), then one correction on the slot.
void polar_code_place(uint i, uint b, out uint place[3]) {
  uint cpw = ((b <= 4u ? 0x080A1020u : 0x04040506u) >> (8u * ((b - 1u) & 3u))) & 0xffu;
  uint word = uint(float(i) * (1.0 / float(cpw)));
  uint slot = i - word * cpw;
  bool over = slot >= cpw;
  place[0] = over ? word + 1u : word;
  place[1] = over ? slot - cpw : slot;
  place[2] = cpw;
}
#define KVQ_POLAR_CODE_PLACE(i, b, place) polar_code_place((i), (b), place);
#define KVQ_POLAR_RUN_CODES_AT(P, d, bits, l) polar_codes_at[(l)]
#define KVQ_POLAR_RUN_TABLE_AT(bits, l) polar_table_at[(l)]
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

// Encoding exists only in the QUANTIZE shader (KVQ_QUANTIZE_SHADER, shaders/quantize.comp): glslang keeps
// a shared array in every shader that declares it, and the 16 KiB below plus the fused passes' own
// would pass the 16 KiB every Vulkan device offers.
#ifdef KVQ_QUANTIZE_SHADER
// QUANTIZE by workgroup (shaders/quantize.comp): unit u is tokens [uT, uT + T) of the head block,
// T = KVQ_POLAR_GROUP_TOKENS (shaders/work_units.h), their coordinates spread over the invocations as
// the CUDA backend spreads a token's over a block (kvq_cuda_polar_encode), each float through the
// same functions of core/methods/polar.h in the same order per coordinate, so the codes and radii
// are kvq_polar_encode_unit's byte for byte; only who computes what, and where the operands are
// staged, differ. llvmpipe runs every load in a loop or branch lane by lane (one scalar load per
// invocation, shared memory too, even where every invocation reads the same address), while its
// arithmetic is SIMD, so the steps below are shaped to load less per token:
// - dense rotation: an invocation computes a block of POLAR_R rows for the T tokens, so each load
//   of a matrix entry serves T products and each load of an input POLAR_R (1.25 loads per product
//   with one row per invocation and T = 4, 0.25 here); four matrix floats per load. Eight rows
//   took 10 to 13% less CPU per append on lavapipe than four (docs/BENCH.md, "PolarQuant appends:
//   where the QUANTIZE shader's time goes"; sixteen no less than four: the accumulators then live
//   in memory); at d 128 it leaves 16 of the 64 invocations the rotation.
// - levels: an invocation decides the codes of one 32-bit word of codes (32 / bits codes, kept in
//   order) with the level's codebook (up to POLAR_K entries) loaded once into registers, and stores
//   the word with one atomicOr, instead of reading two table floats per candidate per angle and an
//   atomicOr per code; the search evaluates 4 register slots for codebooks of up to 4 entries (2-bit
//   levels) and POLAR_K for larger ones (polar_level); larger codebooks than POLAR_K read the table
//   as the CPU does (kvq_polar_nearest, kvq_polar_boundaries_passed).
// Shared memory, polar_s4: 16 KiB at T = 8, what every Vulkan device offers. Region 0 (T arrays of
// KVQ_MAX_HEAD_DIM floats) takes the rotated tokens, region 1 (before it, as large) first the dense
// rotation's inputs, then, once the rotation is done, the two regions take turns to hold a level's
// entries (in place, angle a would overwrite entry a while another invocation still reads it).
#define POLAR_T KVQ_POLAR_GROUP_TOKENS
#define POLAR_A KVQ_MAX_HEAD_DIM
#define POLAR_R 8u  // dense rows per invocation block (d is a multiple of 16)
#define POLAR_K 16u // codebooks of up to 4 bits go to registers (b4222's largest, 16 centroids)
shared vec4 polar_s4[2u * POLAR_T * POLAR_A / 4u];
// polar_s4 entry by entry: entry i is component i % 4 of vec4 i / 4 (a store writes that float only).
// The array is of vec4s so that the dense rotation reads 4 inputs with one load and a level reads an
// angle's 2 entries with one: llvmpipe pays a loop over the lanes for every load, whatever its width
// (docs/BENCH.md, "PolarQuant appends: the staging in vec4s").
float polar_get(uint i) { return polar_s4[i >> 2u][i & 3u]; }
void polar_set(uint i, float v) { polar_s4[i >> 2u][i & 3u] = v; }
#define KVQ_ENCODES_BY_WORKGROUP

// The dense rotation (fixed0) four entries at a time: the same words as KVQ_POLAR_ROTATION reads
// (d is a multiple of 16, so each row starts on a 16-byte boundary).
layout(std430, binding = KVQ_BINDING_FIXED0) readonly buffer Fixed0Vec4 { uvec4 fixed0_vec4[]; };

// Every write to shared memory visible to the whole workgroup before the next step reads it.
void polar_sync() {
  memoryBarrierShared();
  barrier();
}

// Where token k's entries start in region `which` (0 or 1) of polar_s4: arithmetic, not a choice
// between two arrays, so that reading an entry is one load.
uint polar_at(uint which, uint k) { return which == 0u ? (POLAR_T + k) * POLAR_A : k * POLAR_A; }

// Level l's codes of the unit where `run` (uniform; false: nothing), for the angles [lo, hi) of the
// level's code array (code i is angle i % angles of token i / angles; the unit's tokens start at t0):
// angle a of token k reads entries 2a, 2a + 1 of region `from` and writes entry a of the other
// region; its code is kvq_polar_encode_angle's (kvq_polar_nearest's rule at level 1, `nearest`:
// candidates in increasing order, strictly greater wins, so ties keep the lower index;
// kvq_polar_boundaries_passed's count above), stored where kvq_io_put_code stores it (code i at word
// i / (32 / b), bit (i % (32 / b)) b). An invocation takes the whole words of [lo, hi) in turn; words at
// its ends are shared with the neighbouring units, hence the atomicOr into the zeroed page. The
// level's centroids (level 1: cos, sin) or boundaries (above: cos^2, sin^2) come in registers
// (polar_codebook, once per level); where `slots` (a constant at every call: 4 or POLAR_K) holds its
// 2^b of them, the search runs over those slots only (constant trip counts, [[unroll]]: the arrays
// stay registers); slots 0: the table's own search, as the CPU (kvq_polar_nearest,
// kvq_polar_boundaries_passed).
void polar_level(bool run, uint slots, bool nearest, uint l, uint from, uint lo, uint hi, uint t0, uint angles, uint b,
                 uint table, uint codes, float cb0[POLAR_K], float cb1[POLAR_K]) {
  uint lane = gl_LocalInvocationID.x, lanes = gl_WorkGroupSize.x, K = 1u << b, cpw = 32u / b;
  uint first_word = lo / cpw, end_word = run ? (hi - 1u) / cpw + 1u : 0u;
  for (uint w = first_word + lane; w < end_word; w += lanes) {
    uint i = max(w * cpw, lo), end = min(w * cpw + cpw, hi), k = i / angles - t0, a = i % angles, word = 0u;
    for (; i < end; i++) {
      uint e = polar_at(from, k) + 2u * a; // even: the pair is half of one vec4
      vec4 quad = polar_s4[e >> 2u];
      vec2 pair = (e & 2u) != 0u ? quad.zw : quad.xy;
      float first = pair.x, second = pair.y;
      uint code = 0u;
      if (slots == 0u) {
        code = nearest ? kvq_polar_nearest(first, second, table, K) : kvq_polar_boundaries_passed(first, second, table, K);
      } else if (nearest) {
        float best = kvq_polar_pair_dot(first, second, cb0[0], cb1[0]);
        [[unroll]] for (uint j = 1u; j < slots; j++) {
          float dot = kvq_polar_pair_dot(first, second, cb0[j], cb1[j]);
          if (j < K && dot > best) {
            best = dot;
            code = j;
          }
        }
      } else {
        [[unroll]] for (uint j = 0u; j + 1u < slots; j++) code += j + 1u < K ? kvq_polar_past(first, second, cb0[j], cb1[j]) : 0u;
      }
      word |= code << ((i - w * cpw) * b);
      polar_set(polar_at(1u - from, k) + a, kvq_polar_next_entry(l, first, second));
      a++;
      if (a == angles) {
        a = 0u;
        k++;
      }
    }
    KVQ_PAGE_OR(codes + w, word);
  }
}

// The first POLAR_K entries of a level's codebook (two floats each from element `at` of fixed1,
// which is a multiple of 4: every level's and head's tables are multiples of 4 floats, core/layout.h)
// into registers for polar_level: once per level, by every invocation and unconditionally. Loaded
// inside each search's call under its `run` condition, as once, llvmpipe ran the loads of the four
// calls not taken too (a branch's sides all run, masked, and a masked load still walks the lanes one
// by one). Two entries per 16-byte load (llvmpipe pays a loop over the lanes per load, whatever its
// width), and entries 4 .. POLAR_K - 1 only where the codebook has more than 4 (b4222's levels 2 to
// 4 have 4): 2 or 8 loads per level and invocation instead of 32 (docs/BENCH.md, "PolarQuant
// appends: codebooks in 16-byte loads"). Slots past the codebook's K hold copies of its entries,
// which no search reads (they test j < K).
layout(std430, binding = KVQ_BINDING_FIXED1) readonly buffer Fixed1Vec4 { uvec4 fixed1_vec4[]; };
void polar_codebook(uint at, uint K, out float cb0[POLAR_K], out float cb1[POLAR_K]) {
  uint last = K / 2u - 1u; // the last pair of entries (K >= 2)
  vec4 pairs[POLAR_K / 2u];
  pairs[0] = uintBitsToFloat(fixed1_vec4[at >> 2u]);
  pairs[1] = uintBitsToFloat(fixed1_vec4[(at >> 2u) + min(1u, last)]);
  [[unroll]] for (uint m = 2u; m < POLAR_K / 2u; m++) pairs[m] = pairs[1];
  if (K > 4u)
    [[unroll]] for (uint m = 2u; m < POLAR_K / 2u; m++) pairs[m] = uintBitsToFloat(fixed1_vec4[(at >> 2u) + min(m, last)]);
  [[unroll]] for (uint m = 0u; m < POLAR_K / 2u; m++) {
    cb0[2u * m] = pairs[m].x;
    cb1[2u * m] = pairs[m].y;
    cb0[2u * m + 1u] = pairs[m].z;
    cb1[2u * m + 1u] = pairs[m].w;
  }
}

void kvq_encode_unit_group(uint block, uint u, uint n, uint x) {
  uint lane = gl_LocalInvocationID.x, lanes = gl_WorkGroupSize.x, d = pc.head_dim, L = pc.levels;
  uint P = pc.page_size, bits = pc.level_bits, tables = polar_tables(block), stride = pc.kv_heads * d;
  uint t0 = u * POLAR_T, tokens = min(n - t0, POLAR_T); // the unit's valid tokens, 1 .. T
  // y = R x of each token into region 0 (kvq_polar_rotate's floats).
  if (pc.rotation == KVQ_LAYOUT_ROTATION_DENSE) {
    // The inputs into region 1 (zeros past the valid tokens, whose results are never stored), then
    // rows [i, i + POLAR_R) of every token: kvq_polar_rotate_row's steps (kvq_polar_row_term), c
    // increasing, for each row and token on its own. The staging takes channels lane, lane + lanes,
    // .. of each token in turn: no division per element (llvmpipe divides lane by lane).
    for (uint k = 0u; k < POLAR_T; k++)
      for (uint c = lane; c < d; c += lanes) polar_set(polar_at(1u, k) + c, k < tokens ? KVQ_IN(x + (t0 + k) * stride + c) : 0.0);
    polar_sync();
    for (uint i = lane * POLAR_R; i < d; i += lanes * POLAR_R) {
      precise float p[POLAR_R * POLAR_T]; // row i + r of token k at r * POLAR_T + k
      [[unroll]] for (uint j = 0u; j < POLAR_R * POLAR_T; j++) p[j] = 0.0;
      for (uint c = 0u; c < d / 4u; c++) { // four columns a trip (the loop limit: d / 4 trips)
        vec4 v[POLAR_T];
        [[unroll]] for (uint k = 0u; k < POLAR_T; k++) v[k] = polar_s4[(polar_at(1u, k) >> 2u) + c];
        [[unroll]] for (uint r = 0u; r < POLAR_R; r++) {
          vec4 m = uintBitsToFloat(fixed0_vec4[(i + r) * (d / 4u) + c]);
          [[unroll]] for (uint k = 0u; k < POLAR_T; k++) {
            uint j = r * POLAR_T + k;
            p[j] = kvq_polar_row_term(p[j], m.x, v[k].x);
            p[j] = kvq_polar_row_term(p[j], m.y, v[k].y);
            p[j] = kvq_polar_row_term(p[j], m.z, v[k].z);
            p[j] = kvq_polar_row_term(p[j], m.w, v[k].w);
          }
        }
      }
      [[unroll]] for (uint r = 0u; r < POLAR_R; r++)
        [[unroll]] for (uint k = 0u; k < POLAR_T; k++) polar_set(polar_at(0u, k) + i + r, p[r * POLAR_T + k]);
    }
  } else {
    // The signs, then each butterfly stage shared (one stage's butterflies touch disjoint entries;
    // a barrier between stages), then the scale.
    for (uint k = 0u; k < POLAR_T; k++)
      for (uint c = lane; c < d; c += lanes)
        polar_set(polar_at(0u, k) + c, k < tokens ? kvq_polar_sign_in(x + (t0 + k) * stride, c) : 0.0);
    polar_sync();
    for (uint len = 1u; len < d; len <<= 1u) {
      for (uint e = lane; e < POLAR_T * (d / 2u); e += lanes) {
        uint j = polar_at(0u, e / (d / 2u)) + kvq_polar_butterfly_at(len, e % (d / 2u));
        precise float a = polar_get(j), b = polar_get(j + len);
        precise float sum = KVQ_FADD(a, b), difference = KVQ_FSUB(a, b);
        polar_set(j, sum);
        polar_set(j + len, difference);
      }
      polar_sync();
    }
    float scale = kvq_hadamard_scale(d);
    for (uint k = 0u; k < POLAR_T; k++)
      for (uint c = lane; c < d; c += lanes) {
        uint j = polar_at(0u, k) + c;
        precise float scaled = KVQ_FMUL(polar_get(j), scale);
        polar_set(j, scaled);
      }
  }
  polar_sync();
  // Level by level (polar_level), the two regions taking turns as each level's input.
  uint from = 0u;
  for (uint l = 1u; l <= L; l++) {
    uint b = kvq_polar_level_bits(bits, l), K = 1u << b, angles = kvq_polar_angles(d, l);
    uint table = kvq_polar_level_table(tables, bits, l), codes = (block + kvq_polar_level_offset(P, d, bits, l)) >> 2u;
    uint lo = t0 * angles, hi = (t0 + tokens) * angles;
    // One call per kind of search, its slots and rule constant at the call, so that each call's
    // search unrolls to the slots its codebook can fill (4 for 2-bit levels, not POLAR_K). The
    // conditions are uniform, but llvmpipe runs every side of a branch under a mask: the calls not
    // taken still run, each for one masked trip of its loops (the work sits inside them).
    bool small = K <= 4u, large = !small && K <= POLAR_K;
    float cb0[POLAR_K], cb1[POLAR_K];
    polar_codebook(l == 1u ? table : table + 2u * K, K, cb0, cb1);
    polar_level(small && l == 1u, 4u, true, l, from, lo, hi, t0, angles, b, table, codes, cb0, cb1);
    polar_level(small && l > 1u, 4u, false, l, from, lo, hi, t0, angles, b, table, codes, cb0, cb1);
    polar_level(large && l == 1u, POLAR_K, true, l, from, lo, hi, t0, angles, b, table, codes, cb0, cb1);
    polar_level(large && l > 1u, POLAR_K, false, l, from, lo, hi, t0, angles, b, table, codes, cb0, cb1);
    polar_level(K > POLAR_K, 0u, l == 1u, l, from, lo, hi, t0, angles, b, table, codes, cb0, cb1);
    polar_sync();
    from = 1u - from;
  }
  for (uint e = lane; e < tokens * (d >> L); e += lanes) {
    uint k = e / (d >> L), r = e % (d >> L);
    kvq_polar_put_radius(block, t0 + k, r, polar_get(polar_at(from, k) + r), P, d, L, bits);
  }
}
#endif // KVQ_QUANTIZE_SHADER

float kvq_decode_rotated(uint block, uint t, uint i) {
  return kvq_polar_decode_coord(block, t, i, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, polar_tables(block));
}

// Rotated coordinates c0 .. c0 + 7 of token t for the fused value pass (shaders/flash_values.comp):
// kvq_polar_decode_run, the same floats as kvq_decode_rotated gives one by one, each level's codes
// read with one word for the run (kvq_polar_run_codes) instead of L code reads (and divisions) per
// coordinate.
#define KVQ_ROTATED_RUN KVQ_POLAR_RUN
void kvq_decode_rotated_run(uint block, uint t, uint c0, out float v[KVQ_ROTATED_RUN]) {
  kvq_polar_decode_run(block, t, c0, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, polar_tables(block), v);
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

// The fused logits (shaders/flash_logits.comp, KVQ_SCORES_HEADS): each token's key decoded once for
// every head of the pass (issue 11: PolarQuant decoded once per token, shared by the GQA heads), run
// by run (kvq_polar_decode_run, the value pass's decoding: 8 coordinates in registers, the level
// offsets computed once per invocation) and each run dotted with every head's 8 prepared query
// floats, read two vec4 at a time (llvmpipe runs each load as a loop over the lanes, whatever its
// width; p and the stride are multiples of 16 floats, d being one). The same floats as the whole
// token's decoding (tests/test_polar.c), summed per head coordinate by coordinate in the same order as
// kvq_score_dot: the same logits. The whole-token decoding (kvq_polar_decode_token) keeps d floats per
// invocation, which llvmpipe holds in memory: run by run took about 10% less CPU per fused call on
// lavapipe once the run decoding was cheap (docs/BENCH.md). The queries stay in results (in shared
// memory they would take 8 KiB; not measured).
#define KVQ_SCORES_HEADS
layout(std430, binding = KVQ_BINDING_RESULTS) readonly buffer ResultsVec4 { uvec4 results_vec4[]; };
void kvq_score_heads(uint block, uint t, uint p, uint heads, inout float logit[KVQ_FLASH_HEADS_PER_PASS]) {
  uint stride = kvq_prepared_floats(), tables = polar_tables(block);
  for (uint c0 = 0u; c0 < pc.head_dim; c0 += KVQ_POLAR_RUN) {
    float y[KVQ_POLAR_RUN];
    kvq_polar_decode_run(block, t, c0, pc.page_size, pc.head_dim, pc.levels, pc.level_bits, tables, y);
    for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++) // a constant trip count: unrolled, logit[g] in registers
      if (g < heads) {
        vec4 q = uintBitsToFloat(results_vec4[(p + g * stride + c0) >> 2u]);
        vec4 q1 = uintBitsToFloat(results_vec4[((p + g * stride + c0) >> 2u) + 1u]);
        logit[g] += q.x * y[0];
        logit[g] += q.y * y[1];
        logit[g] += q.z * y[2];
        logit[g] += q.w * y[3];
        logit[g] += q1.x * y[4];
        logit[g] += q1.y * y[5];
        logit[g] += q1.z * y[6];
        logit[g] += q1.w * y[7];
      }
  }
}

// The weighted sum's rotated page sum (d floats at element s of dst) rotated back, into x.
void kvq_rotate_back(uint s, out float x[KVQ_MAX_HEAD_DIM]) {
  float y[KVQ_MAX_HEAD_DIM];
  for (uint i = 0u; i < pc.head_dim; i++) y[i] = uintBitsToFloat(dst[s + i]);
  kvq_polar_unrotate(y, pc.head_dim, pc.rotation, x);
}
