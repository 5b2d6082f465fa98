// PolarQuant (backends/cpu/cpu_polar.c): each token is rotated, y = R x, then every block of 2^L
// rotated coordinates becomes one fp16 radius and 2^L - 1 angle codes, decided exactly as the CPU
// reference decides them (core/quantize_math.h). Work unit: one token.
// fixed0: the dense rotation (d x d, row-major) or the d signs of the Hadamard form; fixed1: the
// codebook tables (core/layout.h), one per kv head when learned online.
//
// As on the CPU, keys are scored in the rotated space against the prepared query R q, and values
// are summed there and rotated back once per output row. Applying R per channel of every token
// would also run far more loop iterations than llvmpipe (lavapipe) allows one invocation: 65535 in
// all, counting every entry of a loop even where no lane takes it (an element read through
// KVQ_READ_ELEMENT enters the fp16 conversion's loop), after which it quietly leaves its loops. So
// tokens are read once into arrays, the d x d loops take four columns per iteration (d is a
// multiple of 16), and the codebook searches two candidates: QUANTIZE then stays near 51000 at worst
// (d = 256, 8 bits at every level).

#define KVQ_PREPARES
#define KVQ_SUMS_ROTATED
#define KVQ_TOKEN_ERROR

const uint POLAR_DENSE = 0u;  // KVQ_ROTATION_DENSE (docs/FORMAT.md fixes the values)
const uint POLAR_ONLINE = 1u; // KVQ_CODEBOOK_ONLINE

float polar_fixed0(uint i) { return uintBitsToFloat(fixed0[i]); }
float polar_fixed1(uint i) { return uintBitsToFloat(fixed1[i]); }

// The kv head of the head block at byte `block`: core places page k of a pool at k * page_bytes, so
// head blocks sit at whole multiples of head_bytes (the quantize job refuses other page offsets when
// the tables are per head, backends/vulkan/vk_jobs.c).
uint polar_kv_head(uint block) { return block / (pc.head_words * 4u) % pc.kv_heads; }

// The first float in fixed1 of the tables of the head block at `block`, and of one level's: 2^b
// (cos, sin) centroids, then 2^b (cos^2, sin^2) boundaries.
uint polar_tables(uint block) {
  return pc.codebook == POLAR_ONLINE ? polar_kv_head(block) * kvq_polar_table_floats(pc.levels, pc.level_bits) : 0u;
}
uint polar_level_table(uint block, uint level) {
  return polar_tables(block) + kvq_polar_table_level_offset(pc.level_bits, level);
}

// ---- rotations -----------------------------------------------------------------------------

// y = R x for the vector whose channel c is element x + c of src (in pc.input_dtype), in the
// reference's order (core/quantize_math.h): dense y_i = sum_c R[i][c] x_c with c increasing;
// Hadamard: the signs, the in-place butterflies of core/fwht.h, then the scale. `precise` keeps
// every product and sum rounded on its own, so stored codes match the CPU's bit for bit.
// The in-place Walsh-Hadamard butterflies of core/fwht.h, in its order, each sum rounded on its own.
void polar_butterflies(inout float y[KVQ_MAX_HEAD_DIM]) {
  for (uint len = 1u; len < pc.head_dim; len <<= 1)
    for (uint i = 0u; i < pc.head_dim; i += 2u * len)
      for (uint j = i; j < i + len; j++) {
        precise float a = y[j], b = y[j + len];
        y[j] = KVQ_FADD(a, b);
        y[j + len] = KVQ_FSUB(a, b);
      }
}

float polar_input(uint x, uint c) { return KVQ_READ_ELEMENT(src, pc.input_dtype, x + c); }
float polar_row_step(float p, uint i, float x[KVQ_MAX_HEAD_DIM], uint c) {
  precise float next = KVQ_FADD(p, KVQ_FMUL(polar_fixed0(i * pc.head_dim + c), x[c]));
  return next;
}
void polar_rotate(uint x, out precise float y[KVQ_MAX_HEAD_DIM]) {
  uint d = pc.head_dim;
  float v[KVQ_MAX_HEAD_DIM];
  for (uint c = 0u; c < d; c++) v[c] = polar_input(x, c);
  if (pc.rotation == POLAR_DENSE) {
    for (uint i = 0u; i < d; i++) {
      precise float p = 0.0;
      for (uint c = 0u; c < d; c += 4u) {
        p = polar_row_step(p, i, v, c);
        p = polar_row_step(p, i, v, c + 1u);
        p = polar_row_step(p, i, v, c + 2u);
        p = polar_row_step(p, i, v, c + 3u);
      }
      y[i] = p;
    }
    return;
  }
  for (uint c = 0u; c < d; c++) y[c] = KVQ_FMUL(polar_fixed0(c), v[c]);
  polar_butterflies(y);
  float scale = kvq_hadamard_scale(d);
  for (uint c = 0u; c < d; c++) y[c] = KVQ_FMUL(y[c], scale);
}

// x = R^T y: columns of the dense matrix, or signs * (H y) * scale with the butterflies (H is
// symmetric), as cpu_polar.c rotates back. Floats: only class-3 results come from here.
void polar_unrotate(float y[KVQ_MAX_HEAD_DIM], out float x[KVQ_MAX_HEAD_DIM]) {
  uint d = pc.head_dim;
  if (pc.rotation == POLAR_DENSE) {
    for (uint c = 0u; c < d; c++) {
      float sum = 0.0;
      for (uint i = 0u; i < d; i += 4u) {
        sum += polar_fixed0(i * d + c) * y[i];
        sum += polar_fixed0((i + 1u) * d + c) * y[i + 1u];
        sum += polar_fixed0((i + 2u) * d + c) * y[i + 2u];
        sum += polar_fixed0((i + 3u) * d + c) * y[i + 3u];
      }
      x[c] = sum;
    }
    return;
  }
  polar_butterflies(y);
  float scale = kvq_hadamard_scale(d);
  for (uint c = 0u; c < d; c++) x[c] = polar_fixed0(c) * (y[c] * scale);
}

// ---- QUANTIZE ------------------------------------------------------------------------------

// Level 1: the centroid with the largest dot product with the pair; strictly greater wins, so ties
// keep the lower index. Candidates go two per loop iteration (see the top).
void polar_consider(float px, float py, uint table, uint j, inout float best, inout uint code) {
  float dot = kvq_polar_pair_dot(px, py, polar_fixed1(table + 2u * j), polar_fixed1(table + 2u * j + 1u));
  if (dot > best) {
    best = dot;
    code = j;
  }
}
uint polar_nearest(float px, float py, uint table, uint K) {
  float best = kvq_polar_pair_dot(px, py, polar_fixed1(table), polar_fixed1(table + 1u));
  uint code = 0u;
  for (uint j = 1u; j < K; j += 2u) {
    polar_consider(px, py, table, j, best, code);
    if (j + 1u < K) polar_consider(px, py, table, j + 1u, best, code);
  }
  return code;
}

// Levels >= 2: how many of the 2^b - 1 boundaries the angle between the halves' squared radii
// s_a, s_b is at or past, two per loop iteration.
uint polar_boundary_passed(float s_a, float s_b, uint boundaries, uint j) {
  return kvq_polar_past(s_a, s_b, polar_fixed1(boundaries + 2u * j), polar_fixed1(boundaries + 2u * j + 1u));
}
uint polar_boundaries_passed(float s_a, float s_b, uint table, uint K) {
  uint boundaries = table + 2u * K, code = 0u;
  for (uint j = 0u; j + 1u < K; j += 2u) {
    code += polar_boundary_passed(s_a, s_b, boundaries, j);
    if (j + 2u < K) code += polar_boundary_passed(s_a, s_b, boundaries, j + 1u);
  }
  return code;
}


void kvq_encode_unit(uint block, uint t, uint n, uint x) {
  uint d = pc.head_dim, L = pc.levels;
  // The rotated token; then, level by level, the squared radii of its sub-blocks. Angle a of a
  // level reads entries 2a and 2a + 1 and writes entry a, so one array serves in place.
  precise float v[KVQ_MAX_HEAD_DIM];
  polar_rotate(x + t * pc.kv_heads * d, v);
  for (uint l = 1u; l <= L; l++) {
    uint b = kvq_polar_level_bits(pc.level_bits, l), K = 1u << b, angles = kvq_polar_angles(d, l);
    uint table = polar_level_table(block, l);
    uint codes = (block + kvq_polar_level_offset(pc.page_size, d, pc.level_bits, l)) >> 2;
    for (uint a = 0u; a < angles; a++) {
      float first = v[2u * a], second = v[2u * a + 1u];
      if (l == 1u) {
        kvq_io_put_code(codes, t * angles + a, b, polar_nearest(first, second, table, K));
        v[a] = kvq_polar_pair_square(first, second);
      } else {
        kvq_io_put_code(codes, t * angles + a, b, polar_boundaries_passed(first, second, table, K));
        v[a] = KVQ_FADD(first, second);
      }
    }
  }
  uint radii = block + kvq_polar_radius_offset(pc.page_size, d, L, pc.level_bits), blocks = d >> L;
  for (uint k = 0u; k < blocks; k++) // GLSL's sqrt is not correctly rounded: 1 fp16 ulp (class 2)
    kvq_io_put_u16(radii + 2u * (t * blocks + k), kvq_f32_to_f16_bits(sqrt(v[k])));
}

// ---- decoding ------------------------------------------------------------------------------

// Rotated coordinate i of token t: its block's radius times, for every level, the cos (first half)
// or sin (second half) of the centroid coding the sub-block that holds i. One pass up the levels
// finds each level's codes and table on the way (core/layout.h: the levels' codes follow each
// other, then the radii; the tables likewise), so the factors are multiplied in another order than
// the CPU's: decoded values are class 3.
float kvq_decode_rotated(uint block, uint t, uint i) {
  uint d = pc.head_dim, codes = block, table = polar_tables(block);
  float y = 1.0;
  for (uint l = 1u; l <= pc.levels; l++) {
    uint b = kvq_polar_level_bits(pc.level_bits, l), angles = kvq_polar_angles(d, l);
    uint code = kvq_io_code(codes >> 2, t * angles + (i >> l), b);
    y *= polar_fixed1(table + 2u * code + ((i >> (l - 1u)) & 1u));
    codes += kvq_code_words(pc.page_size * angles, b) * 4u;
    table += 4u << b;
  }
  return y * kvq_f16_bits_to_f32(kvq_io_u16(codes + 2u * (t * (d >> pc.levels) + (i >> pc.levels))));
}

// Channel c of the unrotated token (DEQUANTIZE): (R^T y)_c = sum_i R[i][c] y_i.
float kvq_decode(uint block, uint t, uint c) {
  uint d = pc.head_dim;
  float sum = 0.0;
  for (uint i = 0u; i < d; i++) {
    float y = kvq_decode_rotated(block, t, i);
    if (pc.rotation == POLAR_DENSE) sum += polar_fixed0(i * d + c) * y;
    else sum += (bitCount(i & c) & 1) == 0 ? y : -y; // row c of the Walsh-Hadamard matrix
  }
  return pc.rotation == POLAR_DENSE ? sum : polar_fixed0(c) * (sum * kvq_hadamard_scale(d));
}

// ||x - x^|| of token t, x^ as DEQUANTIZE returns it, x at element x of src (QUANTIZE errors).
float kvq_token_error(uint block, uint t, uint x) {
  float y[KVQ_MAX_HEAD_DIM], decoded[KVQ_MAX_HEAD_DIM];
  for (uint i = 0u; i < pc.head_dim; i++) y[i] = kvq_decode_rotated(block, t, i);
  polar_unrotate(y, decoded);
  float sum = 0.0;
  for (uint c = 0u; c < pc.head_dim; c++) {
    float diff = polar_input(x, c) - decoded[c];
    sum += diff * diff;
  }
  return sqrt(sum);
}

// ---- attention -----------------------------------------------------------------------------

// PREPARE_QUERY: R q, exactly as the CPU reference rotates queries (pc.input_dtype is fp32 there).
uint kvq_prepared_floats() { return pc.head_dim; }
void kvq_prepare_unit(uint q, uint h, uint unit, uint out_at) {
  float y[KVQ_MAX_HEAD_DIM];
  polar_rotate(q, y);
  for (uint i = 0u; i < pc.head_dim; i++) dst[out_at + i] = floatBitsToUint(y[i]);
}

// q.k for key token t: the prepared query (element p of aux) against the rotated key.
float kvq_score_dot(uint block, uint t, uint q, uint p) {
  float dot = 0.0;
  for (uint i = 0u; i < pc.head_dim; i++) dot += uintBitsToFloat(aux[p + i]) * kvq_decode_rotated(block, t, i);
  return dot;
}

// The weighted sum's rotated page sum (d floats at element s of dst) rotated back, into x.
void kvq_rotate_back(uint s, out float x[KVQ_MAX_HEAD_DIM]) {
  float y[KVQ_MAX_HEAD_DIM];
  for (uint i = 0u; i < pc.head_dim; i++) y[i] = uintBitsToFloat(dst[s + i]);
  polar_unrotate(y, x);
}
