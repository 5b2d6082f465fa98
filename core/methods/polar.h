/*
 * PolarQuant (Han, Kacham, Karbasi, Mirrokni, Zandieh, ../shared/papers/001 and
 * ../shared/design/polarquant-math.md):
 *   1. precondition x <- R x (a random orthogonal matrix, or a randomized Hadamard transform);
 *   2. recursive polar transform over blocks of 2^L coordinates: level 1 angles of coordinate pairs
 *      in [0, 2 pi), level l >= 2 angles atan(r_right / r_left) in [0, pi/2], one radius per block;
 *   3. each angle quantized with its level's codebook, the radius kept in fp16.
 * Decisions follow core/quantize_math.h (nearest centroid by dot product at level 1, boundary
 * comparisons of squared radii above), so no atan2, sqrt or division decides a code. Keys are scored
 * against the rotated query R q (the prepared query); values are summed in the rotated space and
 * rotated back once.
 *
 * fixed0: the dense rotation (d x d, row-major) or the d signs of the Hadamard form; fixed1: the
 * codebook tables (core/layout.h), one per kv head when learned online; `tables` below is the first
 * element of the tables of the block's kv head (kvq_polar_tables). Work unit: one token. Arguments as
 * in core/methods/exact.h; L levels, bits the packed level bits, rotation a kvq_rotation value.
 *
 * Decoding comes in three forms that give the same floats bit for bit (tests/test_polar.c): a whole
 * token top down (kvq_polar_decode_token: every level splits each sub-block's radius, for the CPU and
 * the GPU's unfused score job), a run of 8 coordinates (kvq_polar_decode_run, for the Vulkan fused
 * passes' keys and values) and one coordinate (kvq_polar_decode_coord, for a GPU thread that needs
 * one): all multiply the block radius by
 * the level L factor first and the level 1 factor last, each product rounded on its own.
 *
 * On GPUs, the loops over d x d entries take four columns per trip and the codebook searches two
 * candidates, for lavapipe's loop limit (docs/VULKAN.md).
 */
#ifndef KVQ_CORE_METHODS_POLAR_H
#define KVQ_CORE_METHODS_POLAR_H

#include "core/halfconv.h"
#include "core/layout.h"
#include "core/methods/io.h"
#include "core/quantize_math.h"

/* The side's fixed arrays (docs/FORMAT.md): 0 the rotation, dense R (d x d, row-major) or the d signs
 * of the Hadamard form; 1 the codebook tables (core/layout.h), one set per kv head when learned. */
#define KVQ_POLAR_ROTATION(i) KVQ_FIXED0(i)
#define KVQ_POLAR_TABLE(i) KVQ_FIXED1(i)


/* Centroid `code` of a level's table at element `table` of fixed1: its cos into c, its sin into s
 * (elements table + 2 code and table + 2 code + 1; table is even, every level's and head's tables
 * being multiples of 4 floats, core/layout.h). A backend may define KVQ_POLAR_CENTROID before this
 * header to read the pair another way, with the same two floats: the Vulkan shaders read it with one
 * 8-byte load, since llvmpipe pays per load instruction (shaders/methods/polar.glsl). */
#ifndef KVQ_POLAR_CENTROID
#define KVQ_POLAR_CENTROID(c, s, table, code)              \
  {                                                         \
    c = KVQ_POLAR_TABLE((table) + 2u * (code));             \
    s = KVQ_POLAR_TABLE((table) + 2u * (code) + 1u);        \
  }
#endif

/* Where code i of b bits lies in its level's array (kvq_io_code_place: word, slot, codes a word
 * holds), for kvq_polar_decode_run; a backend may define it before this header to compute the same
 * three numbers another way (the Vulkan shaders: without an integer division, which llvmpipe runs
 * lane by lane and in both branches of kvq_io_code_place). */
#ifndef KVQ_POLAR_CODE_PLACE
#define KVQ_POLAR_CODE_PLACE(i, b, place) kvq_io_code_place((i), (b), place);
#endif

/* The first element in fixed1 of the tables of kv head h, and of level l's: 2^b (cos, sin)
 * centroids, then 2^b (cos^2, sin^2) boundaries. */
KVQ_SHARED_FN kvq_u32 kvq_polar_tables(kvq_u32 h, kvq_u32 codebook, kvq_u32 L, kvq_u32 bits) {
  return codebook == KVQ_LAYOUT_CODEBOOK_ONLINE ? h * kvq_polar_table_floats(L, bits) : 0u;
}
KVQ_SHARED_FN kvq_u32 kvq_polar_level_table(kvq_u32 tables, kvq_u32 bits, kvq_u32 l) {
  return tables + kvq_polar_table_level_offset(bits, l);
}

/* ---- rotations ------------------------------------------------------------------------------- */

/* The in-place Walsh-Hadamard butterflies in docs/FORMAT.md's order (for len = 1, 2, .., d/2, for
 * each block of 2 len, for j in its first half: a = z[j], b = z[j + len]; z[j] = a + b;
 * z[j + len] = a - b), each sum rounded on its own. */
KVQ_SHARED_FN void kvq_polar_butterflies(KVQ_INOUT kvq_f32 z[KVQ_MAX_HEAD_DIM], kvq_u32 d) {
  for (kvq_u32 len = 1u; len < d; len <<= 1u)
    for (kvq_u32 i = 0u; i < d; i += 2u * len)
      for (kvq_u32 j = i; j < i + len; j++) {
        KVQ_PRECISE kvq_f32 a = z[j];
        KVQ_PRECISE kvq_f32 b = z[j + len];
        z[j] = KVQ_FADD(a, b);
        z[j + len] = KVQ_FSUB(a, b);
      }
}

/* One step of a dense row: p + r x with the matrix entry r, the product and the sum each rounded.
 * Apart from kvq_polar_row_step so that a GPU kernel may read an entry once for several tokens. */
KVQ_SHARED_FN kvq_f32 kvq_polar_row_term(kvq_f32 p, kvq_f32 r, kvq_f32 x) {
  KVQ_PRECISE kvq_f32 next = KVQ_FADD(p, KVQ_FMUL(r, x));
  return next;
}
KVQ_SHARED_FN kvq_f32 kvq_polar_row_step(KVQ_IO_PARAM kvq_f32 p, kvq_u32 at, kvq_f32 x) {
  return kvq_polar_row_term(p, KVQ_POLAR_ROTATION(at), x);
}

/* Row i of the dense y = R x for the input at element x: sum_c R[i][c] x_c, c increasing, each
 * product and sum rounded. The input is read through KVQ_IN where it is used (its conversion is
 * exact, so every read gives the same float): no per-thread array of the token. */
KVQ_SHARED_FN kvq_f32 kvq_polar_rotate_row(KVQ_IO_PARAM kvq_u32 x, kvq_u32 i, kvq_u32 d) {
  KVQ_PRECISE kvq_f32 p = 0.0f;
  for (kvq_u32 c = 0u; c < d; c += 4u) { /* d is a multiple of 16 */
    p = kvq_polar_row_step(KVQ_IO p, i * d + c, KVQ_IN(x + c));
    p = kvq_polar_row_step(KVQ_IO p, i * d + c + 1u, KVQ_IN(x + c + 1u));
    p = kvq_polar_row_step(KVQ_IO p, i * d + c + 2u, KVQ_IN(x + c + 2u));
    p = kvq_polar_row_step(KVQ_IO p, i * d + c + 3u, KVQ_IN(x + c + 3u));
  }
  return p;
}

/* The Hadamard form's first step for coordinate c: the sign times the input (exact). */
KVQ_SHARED_FN kvq_f32 kvq_polar_sign_in(KVQ_IO_PARAM kvq_u32 x, kvq_u32 c) {
  KVQ_PRECISE kvq_f32 y = KVQ_FMUL(KVQ_POLAR_ROTATION(c), KVQ_IN(x + c));
  return y;
}

/* Butterfly k (0 .. d/2 - 1) of the stage of half-length len reads and writes entries j and j + len. */
KVQ_SHARED_FN kvq_u32 kvq_polar_butterfly_at(kvq_u32 len, kvq_u32 k) { return (k / len) * 2u * len + k % len; }

/* y = R x for the input at element x (core/quantize_math.h's order): dense rows as
 * kvq_polar_rotate_row; Hadamard: the signs, the butterflies, the scale. GPU kernels may run the
 * rows, coordinates and butterflies of one stage in parallel: each is computed on its own. */
KVQ_SHARED_FN void kvq_polar_rotate(KVQ_IO_PARAM kvq_u32 x, kvq_u32 d, kvq_u32 rotation,
                                    KVQ_OUT KVQ_PRECISE kvq_f32 y[KVQ_MAX_HEAD_DIM]) {
  if (rotation == KVQ_LAYOUT_ROTATION_DENSE) {
    for (kvq_u32 i = 0u; i < d; i++) y[i] = kvq_polar_rotate_row(KVQ_IO x, i, d);
    return;
  }
  for (kvq_u32 c = 0u; c < d; c++) y[c] = kvq_polar_sign_in(KVQ_IO x, c); /* the signs: exact */
  kvq_polar_butterflies(y, d);
  kvq_f32 scale = kvq_hadamard_scale(d);
  for (kvq_u32 c = 0u; c < d; c++) y[c] = KVQ_FMUL(y[c], scale);
}

/* Coordinate c of x = R^T y, into the float lvalue x_c: column c of the dense matrix against y
 * (summed in kvq_acc, rows increasing, four per trip), or signs_c * (z_c * scale) for the Hadamard
 * form, where y must already have gone through kvq_polar_butterflies (H is symmetric). Only class-3
 * results come from here.
 *
 * A macro, not a function, because y is an array: GLSL passes array parameters by copy, so a
 * function taking y and called once per coordinate would copy d floats d times. The macro expands
 * in place in kvq_polar_unrotate and kvq_polar_unrotate_coord below, the only two places that
 * compute this, in C, CUDA and GLSL alike (GLSL's preprocessor takes the line continuations). */
#define KVQ_POLAR_UNROTATE_COORD(x_c, y, d, rotation, c)                                                        \
  {                                                                                                             \
    if ((rotation) == KVQ_LAYOUT_ROTATION_DENSE) {                                                              \
      kvq_acc kvq_polar_column = KVQ_ACC(0.0f);                                                                 \
      for (kvq_u32 kvq_polar_i = 0u; kvq_polar_i < (d); kvq_polar_i += 4u) {                                    \
        kvq_polar_column += KVQ_ACC(KVQ_POLAR_ROTATION(kvq_polar_i * (d) + (c))) * KVQ_ACC((y)[kvq_polar_i]);   \
        kvq_polar_column +=                                                                                     \
            KVQ_ACC(KVQ_POLAR_ROTATION((kvq_polar_i + 1u) * (d) + (c))) * KVQ_ACC((y)[kvq_polar_i + 1u]);       \
        kvq_polar_column +=                                                                                     \
            KVQ_ACC(KVQ_POLAR_ROTATION((kvq_polar_i + 2u) * (d) + (c))) * KVQ_ACC((y)[kvq_polar_i + 2u]);       \
        kvq_polar_column +=                                                                                     \
            KVQ_ACC(KVQ_POLAR_ROTATION((kvq_polar_i + 3u) * (d) + (c))) * KVQ_ACC((y)[kvq_polar_i + 3u]);       \
      }                                                                                                         \
      x_c = KVQ_F32(kvq_polar_column);                                                                          \
    } else {                                                                                                    \
      x_c = KVQ_POLAR_ROTATION(c) * ((y)[c] * kvq_hadamard_scale(d));                                           \
    }                                                                                                           \
  }

/* x = R^T y for the whole vector: the Hadamard butterflies on a copy of y (the caller's y is left
 * as it is), then every coordinate as KVQ_POLAR_UNROTATE_COORD. */
KVQ_SHARED_FN void kvq_polar_unrotate(KVQ_IO_PARAM const kvq_f32 y[KVQ_MAX_HEAD_DIM], kvq_u32 d, kvq_u32 rotation,
                                      KVQ_OUT kvq_f32 x[KVQ_MAX_HEAD_DIM]) {
  kvq_f32 z[KVQ_MAX_HEAD_DIM];
  for (kvq_u32 c = 0u; c < d; c++) z[c] = y[c];
  if (rotation != KVQ_LAYOUT_ROTATION_DENSE) kvq_polar_butterflies(z, d);
  for (kvq_u32 c = 0u; c < d; c++) KVQ_POLAR_UNROTATE_COORD(x[c], z, d, rotation, c)
}

/* Coordinate c of kvq_polar_unrotate's x, for a GPU kernel whose threads share the coordinates: y
 * is the rotated vector for the dense form, and for the Hadamard form the vector after
 * kvq_polar_butterflies ran on it in place (in shared or scratch memory, not a per-thread copy). */
KVQ_SHARED_FN kvq_f32 kvq_polar_unrotate_coord(KVQ_IO_PARAM const kvq_f32 y[KVQ_MAX_HEAD_DIM], kvq_u32 d, kvq_u32 rotation,
                                               kvq_u32 c) {
  kvq_f32 x_c;
  KVQ_POLAR_UNROTATE_COORD(x_c, y, d, rotation, c)
  return x_c;
}

/* ---- QUANTIZE --------------------------------------------------------------------------------- */

/* Level 1: the centroid with the largest dot product with the pair (px, py); strictly greater wins,
 * so ties keep the lower index. Two candidates per trip. */
KVQ_SHARED_FN kvq_u32 kvq_polar_nearest(KVQ_IO_PARAM kvq_f32 px, kvq_f32 py, kvq_u32 table, kvq_u32 K) {
  kvq_f32 best = kvq_polar_pair_dot(px, py, KVQ_POLAR_TABLE(table), KVQ_POLAR_TABLE(table + 1u));
  kvq_u32 code = 0u;
  for (kvq_u32 j = 1u; j < K; j += 2u) {
    kvq_f32 dot = kvq_polar_pair_dot(px, py, KVQ_POLAR_TABLE(table + 2u * j), KVQ_POLAR_TABLE(table + 2u * j + 1u));
    if (dot > best) {
      best = dot;
      code = j;
    }
    if (j + 1u < K) {
      dot = kvq_polar_pair_dot(px, py, KVQ_POLAR_TABLE(table + 2u * j + 2u), KVQ_POLAR_TABLE(table + 2u * j + 3u));
      if (dot > best) {
        best = dot;
        code = j + 1u;
      }
    }
  }
  return code;
}

/* Levels >= 2: how many of the 2^b - 1 boundaries the angle between the halves' squared radii s_a,
 * s_b is at or past, two per trip. */
KVQ_SHARED_FN kvq_u32 kvq_polar_boundaries_passed(KVQ_IO_PARAM kvq_f32 s_a, kvq_f32 s_b, kvq_u32 table, kvq_u32 K) {
  kvq_u32 boundaries = table + 2u * K, code = 0u;
  for (kvq_u32 j = 0u; j + 1u < K; j += 2u) {
    code += kvq_polar_past(s_a, s_b, KVQ_POLAR_TABLE(boundaries + 2u * j), KVQ_POLAR_TABLE(boundaries + 2u * j + 1u));
    if (j + 2u < K)
      code += kvq_polar_past(s_a, s_b, KVQ_POLAR_TABLE(boundaries + 2u * j + 2u), KVQ_POLAR_TABLE(boundaries + 2u * j + 3u));
  }
  return code;
}

/* The entry level l + 1 reads from the two entries an angle of level l was decided from: level 1's
 * pair gives its squared radius, the halves above give the sum of theirs. Apart from
 * kvq_polar_encode_angle so that a GPU kernel may decide the codes its own way (codebook in
 * registers, codes packed per word) with this same float arithmetic. */
KVQ_SHARED_FN kvq_f32 kvq_polar_next_entry(kvq_u32 l, kvq_f32 first, kvq_f32 second) {
  if (l == 1u) return kvq_polar_pair_square(first, second);
  KVQ_PRECISE kvq_f32 sum = KVQ_FADD(first, second);
  return sum;
}

/* Angle a of level l of token t from the level's two entries (level 1: the rotated pair; above:
 * the halves' squared radii): stores its code and returns the entry the next level reads
 * (kvq_polar_next_entry). */
KVQ_SHARED_FN kvq_f32 kvq_polar_encode_angle(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 l, kvq_u32 a, kvq_f32 first,
                                             kvq_f32 second, kvq_u32 P, kvq_u32 d, kvq_u32 bits, kvq_u32 tables) {
  kvq_u32 b = kvq_polar_level_bits(bits, l), K = 1u << b, angles = kvq_polar_angles(d, l);
  kvq_u32 table = kvq_polar_level_table(tables, bits, l);
  kvq_u32 codes = (block + kvq_polar_level_offset(P, d, bits, l)) >> 2u;
  kvq_u32 code = l == 1u ? kvq_polar_nearest(KVQ_IO first, second, table, K)
                         : kvq_polar_boundaries_passed(KVQ_IO first, second, table, K);
  kvq_io_put_code(KVQ_IO codes, t * angles + a, b, code);
  return kvq_polar_next_entry(l, first, second);
}

/* Radius k of token t from its block's squared radius (kvq_sqrt: 1 fp16 ulp apart on GLSL at worst,
 * class 2). */
KVQ_SHARED_FN void kvq_polar_put_radius(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 k, kvq_f32 square, kvq_u32 P,
                                        kvq_u32 d, kvq_u32 L, kvq_u32 bits) {
  kvq_u32 radii = block + kvq_polar_radius_offset(P, d, L, bits), blocks = d >> L;
  kvq_io_put_u16(KVQ_IO radii + 2u * (t * blocks + k), kvq_f32_to_f16_bits(kvq_sqrt(square)));
}

/* Token t: rotated, then level by level its angle codes and the squared radii of its sub-blocks
 * (angle a of a level reads entries 2a and 2a + 1 and writes entry a, so one array serves in place),
 * then the fp16 block radii. */
KVQ_SHARED_FN void kvq_polar_encode_unit(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 x, kvq_u32 stride, kvq_u32 P,
                                         kvq_u32 d, kvq_u32 L, kvq_u32 bits, kvq_u32 rotation, kvq_u32 tables) {
  KVQ_PRECISE kvq_f32 v[KVQ_MAX_HEAD_DIM];
  kvq_polar_rotate(KVQ_IO x + t * stride, d, rotation, v);
  for (kvq_u32 l = 1u; l <= L; l++)
    for (kvq_u32 a = 0u; a < kvq_polar_angles(d, l); a++)
      v[a] = kvq_polar_encode_angle(KVQ_IO block, t, l, a, v[2u * a], v[2u * a + 1u], P, d, bits, tables);
  for (kvq_u32 k = 0u; k < (d >> L); k++) kvq_polar_put_radius(KVQ_IO block, t, k, v[k], P, d, L, bits);
}

/* ---- decoding (in the rotated space) ----------------------------------------------------------- */

/* Rotated coordinate i of token t: the block radius times the factors of levels L, L - 1, .., 1 in
 * that order, each product rounded on its own (as kvq_polar_decode_token computes it); the factor of
 * level l is the cos (first half) or sin (second half) of the centroid coding the level-l sub-block
 * that holds i. The levels' codes follow each other, then the radii (core/layout.h), and so do the
 * levels' tables: one pass up finds level L's, the way down steps back (2L loop trips in all). */
KVQ_SHARED_FN kvq_f32 kvq_polar_decode_coord(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 i, kvq_u32 P, kvq_u32 d,
                                             kvq_u32 L, kvq_u32 bits, kvq_u32 tables) {
  kvq_u32 codes = block, table = tables;
  for (kvq_u32 l = 1u; l < L; l++) {
    codes += kvq_code_words(P * kvq_polar_angles(d, l), kvq_polar_level_bits(bits, l)) * 4u;
    table += 4u << kvq_polar_level_bits(bits, l);
  }
  kvq_u32 radii = codes + kvq_code_words(P * kvq_polar_angles(d, L), kvq_polar_level_bits(bits, L)) * 4u;
  KVQ_PRECISE kvq_f32 y = kvq_f16_bits_to_f32(kvq_io_u16(KVQ_IO radii + 2u * (t * (d >> L) + (i >> L))));
  for (kvq_u32 l = L; l >= 1u; l--) {
    kvq_u32 b = kvq_polar_level_bits(bits, l);
    kvq_u32 code = kvq_io_code(KVQ_IO codes >> 2u, t * kvq_polar_angles(d, l) + (i >> l), b);
    y = KVQ_FMUL(y, KVQ_POLAR_TABLE(table + 2u * code + ((i >> (l - 1u)) & 1u)));
    if (l > 1u) {
      codes -= kvq_code_words(P * kvq_polar_angles(d, l - 1u), kvq_polar_level_bits(bits, l - 1u)) * 4u;
      table -= 4u << kvq_polar_level_bits(bits, l - 1u);
    }
  }
  return y;
}

/* Token t whole, top down: from each block radius, every level splits each sub-block's radius r
 * into (r cos, r sin) of its code's centroid. Sub-block a of a level writes entries 2a and 2a + 1,
 * so going through a downwards one array serves in place. The code of sub-block a is code
 * t * angles + a of the level's array, in word j / cpw, slot j % cpw (kvq_io_code, cpw = 32 / b,
 * which need not be a power of two): the word and slot are divided out once per level and then
 * stepped down with a, so that no division is left per code, and each word is read once for its codes
 * (the Vulkan score job, shaders/methods/polar.glsl's kvq_score_dot, runs this for every key it
 * scores). The levels' code arrays and tables
 * follow each other (core/layout.h), as in kvq_polar_decode_coord. */
KVQ_SHARED_FN void kvq_polar_decode_token(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 P, kvq_u32 d, kvq_u32 L,
                                          kvq_u32 bits, kvq_u32 tables, KVQ_OUT KVQ_PRECISE kvq_f32 y[KVQ_MAX_HEAD_DIM]) {
  kvq_u32 codes = block, table = tables;
  for (kvq_u32 l = 1u; l < L; l++) {
    codes += kvq_code_words(P * kvq_polar_angles(d, l), kvq_polar_level_bits(bits, l)) * 4u;
    table += 4u << kvq_polar_level_bits(bits, l);
  }
  kvq_u32 radii = codes + kvq_code_words(P * kvq_polar_angles(d, L), kvq_polar_level_bits(bits, L)) * 4u + 2u * t * (d >> L);
  for (kvq_u32 k = 0u; k < (d >> L); k++) y[k] = kvq_f16_bits_to_f32(kvq_io_u16(KVQ_IO radii + 2u * k));
  for (kvq_u32 l = L; l >= 1u; l--) {
    kvq_u32 b = kvq_polar_level_bits(bits, l), angles = kvq_polar_angles(d, l), cpw = 32u / b, mask = (1u << b) - 1u;
    kvq_u32 last = t * angles + angles - 1u, word = (codes >> 2u) + last / cpw, slot = last % cpw;
    /* Word by word, each read once for all its codes of the token (slot + 1 of them in the first
     * word, cpw in the next ones, fewer in the last): one code word read per cpw angles. */
    for (kvq_u32 a = angles; a > 0u; word--) {
      kvq_u32 packed = KVQ_PAGE(word), in_word = slot + 1u < a ? slot + 1u : a;
      for (kvq_u32 k = 0u; k < in_word; k++) {
        kvq_f32 r = y[a - 1u], c, s;
        KVQ_POLAR_CENTROID(c, s, table, (packed >> (slot * b)) & mask)
        y[2u * (a - 1u) + 1u] = KVQ_FMUL(r, s);
        y[2u * (a - 1u)] = KVQ_FMUL(r, c);
        slot--;
        a--;
      }
      slot = cpw - 1u; /* the previous code ends the previous word */
    }
    if (l > 1u) {
      codes -= kvq_code_words(P * kvq_polar_angles(d, l - 1u), kvq_polar_level_bits(bits, l - 1u)) * 4u;
      table -= 4u << kvq_polar_level_bits(bits, l - 1u);
    }
  }
}

/* Rotated coordinates c0 .. c0 + KVQ_POLAR_RUN - 1 of token t (c0 a multiple of KVQ_POLAR_RUN, which
 * divides every head_dim), for a GPU thread that sums a run of a value's coordinates or scores a
 * key run by run (the Vulkan fused passes): kvq_polar_decode_token's tree cut down to the run, so the same products in the same
 * order and the same floats bit for bit (tests/test_polar.c). The run is a sub-block of 2^3
 * coordinates: the levels above 3 each split a sub-block that holds the whole run, so
 * they give one factor for the run (one code and one table read a level); the levels from min(L, 3)
 * down split sub-blocks inside the run as the whole-token decoding does; for L < 3 the run holds
 * several radii. The loops over the levels inside the run and over the run have constant bounds, so
 * that a GPU compiler unrolls them and y stays in registers. What a GPU thread pays per run is loads
 * (llvmpipe runs each divergent load lane by lane), so inside the run each level's codes are read
 * with one word (kvq_polar_run_codes), not one read per code. */
#define KVQ_POLAR_RUN 8u
#define KVQ_POLAR_RUN_LEVELS 3u /* KVQ_POLAR_RUN = 2^KVQ_POLAR_RUN_LEVELS */

/* The n = KVQ_POLAR_RUN >> l codes of level l that a run needs, codes j0 .. j0 + n - 1 (j0 a multiple
 * of n) of the level's array at word `base`, b bits each, packed from bit 0 as in the page: one word
 * read where they share one, which they always do at power-of-two widths (32 / b codes a word, a
 * multiple of n, so a group of n starting at a multiple of n never crosses a word); at other widths
 * (words of 10, 6, 5 or 4 codes) the group may end in the next word (n <= 4 <= 32 / b: two at most),
 * whose codes are appended behind the first word's. */
KVQ_SHARED_FN kvq_u32 kvq_polar_run_codes(KVQ_IO_PARAM kvq_u32 base, kvq_u32 j0, kvq_u32 n, kvq_u32 b) {
  kvq_u32 place[3]; /* word, slot, codes a word holds: kvq_io_code's */
  KVQ_POLAR_CODE_PLACE(j0, b, place)
  kvq_u32 packed = KVQ_PAGE(base + place[0]) >> (place[1] * b), in_first = place[2] - place[1];
  if (in_first < n) packed = (packed & ((1u << (in_first * b)) - 1u)) | (KVQ_PAGE(base + place[0] + 1u) << (in_first * b));
  return packed;
}

/* One level l (a literal) of kvq_polar_decode_run's levels inside the run, with its variables. */
#define KVQ_POLAR_RUN_LEVEL(l)                                                                                    \
  if ((l) <= inner) {                                                                                             \
    kvq_u32 b = kvq_polar_level_bits(bits, (l)), mask = (1u << b) - 1u;                                           \
    kvq_u32 codes = block + KVQ_POLAR_RUN_CODES_AT(P, d, bits, (l)), table = tables + KVQ_POLAR_RUN_TABLE_AT(bits, (l)); \
    kvq_u32 run = kvq_polar_run_codes(KVQ_IO codes >> 2u, t * kvq_polar_angles(d, (l)) + (c0 >> (l)), KVQ_POLAR_RUN >> (l), b); \
    for (kvq_u32 k = 0u; k < KVQ_POLAR_RUN; k += 2u << ((l) - 1u)) {                                              \
      kvq_f32 r = y[k], c, s;                                                                                     \
      KVQ_POLAR_CENTROID(c, s, table, (run >> ((k >> (l)) * b)) & mask)                                           \
      y[k + (1u << ((l) - 1u))] = KVQ_FMUL(r, s);                                                                 \
      y[k] = KVQ_FMUL(r, c);                                                                                      \
    }                                                                                                             \
  }

/* Where kvq_polar_decode_run finds level l (1 .. L, L + 1: the radii) of a head block: the byte
 * offset of its codes in the block, and the first element of its table in the kv head's tables
 * (core/layout.h). A backend may define both before this header to read offsets it computed once for
 * the cache's layout (they divide by the codes a word holds, per level), as the Vulkan shaders do
 * (shaders/methods/polar.glsl), instead of once per run. */
#ifndef KVQ_POLAR_RUN_CODES_AT
#define KVQ_POLAR_RUN_CODES_AT(P, d, bits, l) kvq_polar_level_offset(P, d, bits, l)
#define KVQ_POLAR_RUN_TABLE_AT(bits, l) kvq_polar_table_level_offset(bits, l)
#endif

/* The fp16 half `high` (0: bits 0-15, 1: bits 16-31) of a word of radii as fp32, for decoding only:
 * kvq_f16_read (core/halfconv.h: the same floats as kvq_f16_bits_to_f32 for every stored value; GLSL
 * converts both halves at once without branches, kvq_f16_read2). */
KVQ_SHARED_FN kvq_f32 kvq_polar_f16_half(kvq_u32 word, kvq_u32 high) {
#if defined(KVQ_LANG_GLSL)
  vec2 halves = kvq_f16_read2(word);
  return high != 0u ? halves.y : halves.x;
#else
  return kvq_f16_read(high != 0u ? word >> 16u : word & 0xffffu);
#endif
}

KVQ_SHARED_FN void kvq_polar_decode_run(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 c0, kvq_u32 P, kvq_u32 d, kvq_u32 L,
                                        kvq_u32 bits, kvq_u32 tables, KVQ_OUT KVQ_PRECISE kvq_f32 y[KVQ_POLAR_RUN]) {
  kvq_u32 radii = block + KVQ_POLAR_RUN_CODES_AT(P, d, bits, L + 1u) + 2u * t * (d >> L);
  kvq_u32 inner = L < KVQ_POLAR_RUN_LEVELS ? L : KVQ_POLAR_RUN_LEVELS;
  /* The radius of every block that starts in the run: one block for L >= 3 (y[0]), KVQ_POLAR_RUN >> L
   * of them below (y[0], y[4] at L = 2; y[0], y[2], y[4], y[6] at L = 1), at byte `first` on. Their
   * 2-byte fields lie in one word for L >= 2 (at L = 2 the two start a word: the byte 2 (t d + c0) / 4
   * is a multiple of 4) and in two words at L = 1 (bytes t d + c0, a multiple of 8, to + 7): two
   * loads and selects, the same for every L, instead of a load and a branch per coordinate (llvmpipe
   * runs each masked load as a loop over the lanes). Every other entry is written by the levels
   * below before it is read. */
  kvq_u32 first = radii + 2u * (c0 >> L), w0 = KVQ_PAGE(first >> 2u), w1 = KVQ_PAGE((first >> 2u) + (L == 1u ? 1u : 0u));
  kvq_f32 h0 = kvq_polar_f16_half(w0, 0u), h1 = kvq_polar_f16_half(w0, 1u);
  kvq_f32 h2 = kvq_polar_f16_half(w1, 0u), h3 = kvq_polar_f16_half(w1, 1u);
  for (kvq_u32 k = 0u; k < KVQ_POLAR_RUN; k++) y[k] = 0.0f;
  y[0] = (first & 2u) != 0u ? h1 : h0;
  y[2] = L == 1u ? h1 : 0.0f;
  y[4] = L == 1u ? h2 : (L == 2u ? h1 : 0.0f);
  y[6] = L == 1u ? h3 : 0.0f;
  /* Levels L .. 4: the half of the level's sub-block that holds the run. */
  for (kvq_u32 l = L; l > inner; l--) {
    kvq_u32 codes = block + KVQ_POLAR_RUN_CODES_AT(P, d, bits, l), table = tables + KVQ_POLAR_RUN_TABLE_AT(bits, l);
    kvq_u32 b = kvq_polar_level_bits(bits, l), place[3];
    KVQ_POLAR_CODE_PLACE(t * kvq_polar_angles(d, l) + (c0 >> l), b, place)
    kvq_u32 code = (KVQ_PAGE((codes >> 2u) + place[0]) >> (place[1] * b)) & ((1u << b) - 1u); /* kvq_io_code's */
    y[0] = KVQ_FMUL(y[0], KVQ_POLAR_TABLE(table + 2u * code + ((c0 >> (l - 1u)) & 1u)));
  }
  /* Levels min(L, 3) .. 1: sub-block k of 2^l coordinates into its halves, second half first as in
   * kvq_polar_decode_token (the first half overwrites the sub-block's own entry); the level's codes
   * for the run come from one read (kvq_polar_run_codes), code k / 2^l at bits (k >> l) b. Written
   * out per level (KVQ_POLAR_RUN_LEVEL with a literal l) so that every index into y is a constant. */
  KVQ_POLAR_RUN_LEVEL(3u)
  KVQ_POLAR_RUN_LEVEL(2u)
  KVQ_POLAR_RUN_LEVEL(1u)
}

/* Channel c of the unrotated token t (one GPU thread's DEQUANTIZE): (R^T y)_c = sum_i R[i][c] y_i,
 * or signs_c * scale * sum_i H[c][i] y_i with H's entries (-1)^popcount(i & c). */
KVQ_SHARED_FN kvq_u32 kvq_polar_parity(kvq_u32 u) {
  u ^= u >> 16u;
  u ^= u >> 8u;
  u ^= u >> 4u;
  u ^= u >> 2u;
  u ^= u >> 1u;
  return u & 1u;
}
KVQ_SHARED_FN kvq_f32 kvq_polar_decode(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 c, kvq_u32 P, kvq_u32 d, kvq_u32 L,
                                       kvq_u32 bits, kvq_u32 rotation, kvq_u32 tables) {
  kvq_acc sum = KVQ_ACC(0.0f);
  for (kvq_u32 i = 0u; i < d; i++) {
    kvq_acc y = KVQ_ACC(kvq_polar_decode_coord(KVQ_IO block, t, i, P, d, L, bits, tables));
    if (rotation == KVQ_LAYOUT_ROTATION_DENSE) sum += KVQ_ACC(KVQ_POLAR_ROTATION(i * d + c)) * y;
    else sum += kvq_polar_parity(i & c) == 0u ? y : -y;
  }
  return rotation == KVQ_LAYOUT_ROTATION_DENSE ? KVQ_F32(sum) : KVQ_POLAR_ROTATION(c) * (KVQ_F32(sum) * kvq_hadamard_scale(d));
}

/* ---- SCORE ------------------------------------------------------------------------------------ */

/* q.k for a decoded rotated key y against the prepared query R q at prepared element p. */
KVQ_SHARED_FN kvq_acc kvq_polar_dot(KVQ_IO_PARAM kvq_u32 p, const kvq_f32 y[KVQ_MAX_HEAD_DIM], kvq_u32 d) {
  kvq_acc dot = KVQ_ACC(0.0f);
  for (kvq_u32 i = 0u; i < d; i++) dot += KVQ_ACC(KVQ_PREPARED(p + i)) * KVQ_ACC(y[i]);
  return dot;
}

/* The same, decoding key token t coordinate by coordinate (no array of the token). */
KVQ_SHARED_FN kvq_acc kvq_polar_score(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 p, kvq_u32 P, kvq_u32 d, kvq_u32 L,
                                      kvq_u32 bits, kvq_u32 tables) {
  kvq_acc dot = KVQ_ACC(0.0f);
  for (kvq_u32 i = 0u; i < d; i++)
    dot += KVQ_ACC(KVQ_PREPARED(p + i)) * KVQ_ACC(kvq_polar_decode_coord(KVQ_IO block, t, i, P, d, L, bits, tables));
  return dot;
}

#endif /* KVQ_CORE_METHODS_POLAR_H */
