/*
 * QJL keys (Zandieh et al., ../shared/papers/000; Definition 3.1 and Algorithm 1), with the outlier
 * split of its Section 4.1. Per (page, kv head):
 *   O        = the k channels with the largest sum over the page's valid tokens of x*x (ties: lower
 *              index), listed ascending as uint8 (kvq_qjl_choose_outliers, kvq_qjl_put_outliers)
 *   k_in     = k with the channels of O zeroed, k_out = k with the others zeroed
 *   stored   = sign bits of S k_in (m rows, fixed0), of S_o k_out (m_o rows, fixed1), fp16 norms
 * Estimator of q.k (with kvq's exactly unbiased constant c_d instead of sqrt(pi/2)):
 *   c_d/m |k_in| <S q_in, sign(S k_in)> + c_d/m_o |k_out| <S_o q_out, sign(S_o k_out)>
 * where q_in, q_out are q masked like the key; S q is prepared once per query, and per page
 * S q_in = S q - sum over the outliers c of S[:, c] q_c (kvq_qjl_query_parts4).
 *
 * Work unit of encoding: one 32-row word of sign bits of one token, the inlier sketch's words first,
 * then the outlier sketch's; the unit of a sketch's word 0 also stores its norm. The outlier list is
 * chosen before (the GPU: shaders/qjl_outliers.comp), since every token of the page needs it.
 * For lavapipe's loop limit (docs/VULKAN.md), loops over sketch rows take 4 or 32 rows per trip
 * through an inner loop of constant trip count, and the loop over outliers runs to the constant bound.
 * Arguments as in core/methods/exact.h; `outer` is 1 for the outlier sketch (S_o), 0 for S.
 */
#ifndef KVQ_CORE_METHODS_QJL_H
#define KVQ_CORE_METHODS_QJL_H

#include "core/halfconv.h"
#include "core/layout.h"
#include "core/methods/io.h"

/* The side's fixed arrays (docs/FORMAT.md): 0 the sketch S (m x d, row-major), 1 the outlier sketch
 * S_o (m_o x d). */
#define KVQ_QJL_S(i) KVQ_FIXED0(i)
#define KVQ_QJL_S_OUT(i) KVQ_FIXED1(i)

/* ---- the outlier channels ---------------------------------------------------------------------- */

/* The sum over the n valid tokens of x*x of channel c, in token order, each operation rounded. */
KVQ_SHARED_FN kvq_f32 kvq_qjl_channel_norm2(KVQ_IO_PARAM kvq_u32 x, kvq_u32 stride, kvq_u32 n, kvq_u32 c) {
  KVQ_PRECISE kvq_f32 sum = 0.0f;
  for (kvq_u32 t = 0u; t < n; t++) {
    kvq_f32 v = KVQ_IN(x + t * stride + c);
    sum = KVQ_FADD(sum, KVQ_FMUL(v, v));
  }
  return sum;
}

/* The k channels of largest norm2 as a bit mask over channels (ties: the lower channel). */
KVQ_SHARED_FN void kvq_qjl_choose_outliers(kvq_f32 norm2[KVQ_MAX_HEAD_DIM], kvq_u32 d, kvq_u32 k,
                                           KVQ_OUT kvq_u32 chosen[KVQ_MAX_HEAD_DIM / 32u]) {
  for (kvq_u32 w = 0u; w < KVQ_MAX_HEAD_DIM / 32u; w++) chosen[w] = 0u;
  for (kvq_u32 j = 0u; j < k; j++) {
    kvq_u32 best = d;
    for (kvq_u32 c = 0u; c < d; c++)
      if (((chosen[c / 32u] >> (c % 32u)) & 1u) == 0u && (best == d || norm2[c] > norm2[best])) best = c;
    chosen[best / 32u] |= 1u << (best % 32u);
  }
}

/* Byte offset of the outlier list of the head block at `block`. */
KVQ_SHARED_FN kvq_u32 kvq_qjl_list_at(kvq_u32 block, kvq_u32 P, kvq_u32 m, kvq_u32 mo, kvq_u32 k) {
  return block + kvq_qjl_outliers_offset(P, m, mo, k);
}

/* Stores the chosen channels ascending as uint8, zero-padded to whole words. */
KVQ_SHARED_FN void kvq_qjl_put_outliers(KVQ_IO_PARAM kvq_u32 block, kvq_u32 chosen[KVQ_MAX_HEAD_DIM / 32u], kvq_u32 d,
                                        kvq_u32 P, kvq_u32 m, kvq_u32 mo, kvq_u32 k) {
  kvq_u32 list = kvq_qjl_list_at(block, P, m, mo, k) >> 2u;
  kvq_u32 word = 0u, j = 0u;
  for (kvq_u32 c = 0u; c < d; c++) {
    if (((chosen[c / 32u] >> (c % 32u)) & 1u) == 0u) continue;
    word |= c << (8u * (j % 4u));
    j++;
    if (j % 4u == 0u) {
      KVQ_PAGE_SET(list + j / 4u - 1u, word);
      word = 0u;
    }
  }
  if (j % 4u != 0u) KVQ_PAGE_SET(list + j / 4u, word);
}

/* The page's outlier list (entries past k are 0). */
KVQ_SHARED_FN void kvq_qjl_load_list(KVQ_IO_PARAM kvq_u32 block, kvq_u32 P, kvq_u32 m, kvq_u32 mo, kvq_u32 k,
                                     KVQ_OUT kvq_u32 list[KVQ_MAX_OUTLIERS]) {
  kvq_u32 at = kvq_qjl_list_at(block, P, m, mo, k);
  for (kvq_u32 j = 0u; j < KVQ_MAX_OUTLIERS; j++) list[j] = j < k ? kvq_io_u8(KVQ_IO at + j) : 0u;
}

/* Whether channel c is one of the page's outliers: 1 or 0. */
KVQ_SHARED_FN kvq_u32 kvq_qjl_is_outlier(KVQ_IO_PARAM kvq_u32 block, kvq_u32 c, kvq_u32 P, kvq_u32 m, kvq_u32 mo, kvq_u32 k) {
  kvq_u32 at = kvq_qjl_list_at(block, P, m, mo, k), found = 0u;
  for (kvq_u32 j = 0u; j < k; j++)
    if (kvq_io_u8(KVQ_IO at + j) == c) found = 1u;
  return found;
}

/* ---- sketches, signs and norms ------------------------------------------------------------------ */

/* Entry (i, c) of S (outer = 0) or S_o (outer = 1). */
KVQ_SHARED_FN kvq_f32 kvq_qjl_sketch(KVQ_IO_PARAM kvq_u32 outer, kvq_u32 i, kvq_u32 c, kvq_u32 d) {
  return outer != 0u ? KVQ_QJL_S_OUT(i * d + c) : KVQ_QJL_S(i * d + c);
}

/* Word w (rows 32w .. 32w + 31) of token t's sign bits of a sketch; bit set iff the projection > 0. */
KVQ_SHARED_FN kvq_u32 kvq_qjl_sign_word_at(kvq_u32 block, kvq_u32 outer, kvq_u32 t, kvq_u32 w, kvq_u32 P, kvq_u32 m,
                                           kvq_u32 mo) {
  kvq_u32 signs = block + (outer != 0u ? kvq_qjl_signs_out_offset(P, m) : kvq_qjl_signs_offset());
  return (signs >> 2u) + t * kvq_qjl_words_per_token(outer != 0u ? mo : m) + w;
}

/* Byte offset of token t's fp16 norm of a sketch's part. */
KVQ_SHARED_FN kvq_u32 kvq_qjl_norm_at(kvq_u32 block, kvq_u32 outer, kvq_u32 t, kvq_u32 P, kvq_u32 m, kvq_u32 mo, kvq_u32 k) {
  return block + (outer != 0u ? kvq_qjl_norm_out_offset(P, m, mo, k) : kvq_qjl_norm_in_offset(P, m, mo, k)) + 2u * t;
}
KVQ_SHARED_FN kvq_f32 kvq_qjl_norm(KVQ_IO_PARAM kvq_u32 block, kvq_u32 outer, kvq_u32 t, kvq_u32 P, kvq_u32 m, kvq_u32 mo,
                                   kvq_u32 k) {
  return kvq_f16_bits_to_f32(kvq_io_u16(KVQ_IO kvq_qjl_norm_at(block, outer, t, P, m, mo, k)));
}

/* One work unit: sign word w of a sketch of token t, bit = (sum over channels in order of S[i][c] *
 * part[c], each product and sum rounded on its own) > 0, and with word 0 the norm of the part: its
 * squares summed in channel order, then the root (kvq_sqrt: on GLSL the stored half may differ by 1
 * ulp where the fp32 root lies next to an fp16 tie). A token's words are its own (core/layout.h).
 * part[c] (k_out for the outlier sketch, else k_in) is the input where bit c of `mask` (the page's
 * outlier channels) is `outer`, else 0: read where it is used, so no per-thread array of the token. */
KVQ_SHARED_FN void kvq_qjl_encode_word(KVQ_IO_PARAM kvq_u32 block, kvq_u32 unit, kvq_u32 x, kvq_u32 stride, kvq_u32 P,
                                       kvq_u32 d, kvq_u32 m, kvq_u32 mo, kvq_u32 k, kvq_u32 mask[KVQ_MAX_HEAD_DIM / 32u]) {
  kvq_u32 words_in = kvq_qjl_words_per_token(m);
  kvq_u32 token_words = words_in + (k > 0u ? kvq_qjl_words_per_token(mo) : 0u);
  kvq_u32 t = unit / token_words, w = unit % token_words, outer = 0u;
  if (w >= words_in) {
    outer = 1u;
    w -= words_in;
  }
  kvq_u32 xt = x + t * stride;
  kvq_u32 bits = 0u;
  for (kvq_u32 b = 0u; b < 32u; b++) {
    KVQ_PRECISE kvq_f32 p = 0.0f;
    kvq_u32 row = (w * 32u + b) * d;
    if (outer != 0u) /* the choice of sketch out of the loop: C compilers do not hoist it */
      for (kvq_u32 c = 0u; c < d; c++)
        p = KVQ_FADD(p, KVQ_FMUL(KVQ_QJL_S_OUT(row + c), ((mask[c / 32u] >> (c % 32u)) & 1u) == outer ? KVQ_IN(xt + c) : 0.0f));
    else
      for (kvq_u32 c = 0u; c < d; c++)
        p = KVQ_FADD(p, KVQ_FMUL(KVQ_QJL_S(row + c), ((mask[c / 32u] >> (c % 32u)) & 1u) == outer ? KVQ_IN(xt + c) : 0.0f));
    if (p > 0.0f) bits |= 1u << b;
  }
  KVQ_PAGE_SET(kvq_qjl_sign_word_at(block, outer, t, w, P, m, mo), bits);
  if (w != 0u) return;
  KVQ_PRECISE kvq_f32 sum = 0.0f;
  for (kvq_u32 c = 0u; c < d; c++) {
    kvq_f32 v = ((mask[c / 32u] >> (c % 32u)) & 1u) == outer ? KVQ_IN(xt + c) : 0.0f;
    sum = KVQ_FADD(sum, KVQ_FMUL(v, v));
  }
  kvq_io_put_u16(KVQ_IO kvq_qjl_norm_at(block, outer, t, P, m, mo, k), kvq_f32_to_f16_bits(kvq_sqrt(sum)));
}

/* The same, with the mask built from the page's stored outlier list. */
KVQ_SHARED_FN void kvq_qjl_encode_unit(KVQ_IO_PARAM kvq_u32 block, kvq_u32 unit, kvq_u32 x, kvq_u32 stride, kvq_u32 P,
                                       kvq_u32 d, kvq_u32 m, kvq_u32 mo, kvq_u32 k) {
  kvq_u32 list[KVQ_MAX_OUTLIERS];
  kvq_qjl_load_list(KVQ_IO block, P, m, mo, k, list);
  kvq_u32 mask[KVQ_MAX_HEAD_DIM / 32u];
  for (kvq_u32 i = 0u; i < KVQ_MAX_HEAD_DIM / 32u; i++) mask[i] = 0u;
  for (kvq_u32 j = 0u; j < k; j++) mask[list[j] / 32u] |= 1u << (list[j] % 32u);
  kvq_qjl_encode_word(KVQ_IO block, unit, x, stride, P, d, m, mo, k, mask);
}

/* Bit b of a sign word as +1 (set) or -1. */
KVQ_SHARED_FN kvq_f32 kvq_qjl_sign(kvq_u32 bits, kvq_u32 b) { return ((bits >> b) & 1u) != 0u ? 1.0f : -1.0f; }

/* c_d/rows |k_part| dot: one sketch's part of the estimator, and of the reconstruction. */
KVQ_SHARED_FN kvq_acc kvq_qjl_estimate(kvq_acc c_d, kvq_u32 rows, kvq_f32 norm, kvq_acc dot) {
  return c_d / KVQ_ACC(rows) * KVQ_ACC(norm) * dot;
}

/* ---- DEQUANTIZE ---------------------------------------------------------------------------------- */

/* The unbiased reconstruction whose inner product with any q is the estimator: channel c of token t
 * is c_d/rows |k_part| (S^T sign(S k_part))_c for the sketch that holds channel c. */
KVQ_SHARED_FN kvq_f32 kvq_qjl_decode(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 c, kvq_u32 P, kvq_u32 d, kvq_u32 m,
                                     kvq_u32 mo, kvq_u32 k, kvq_acc c_d) {
  kvq_u32 outer = kvq_qjl_is_outlier(KVQ_IO block, c, P, m, mo, k);
  kvq_u32 rows = outer != 0u ? mo : m;
  kvq_acc sum = KVQ_ACC(0.0f);
  for (kvq_u32 w = 0u; w < rows / 32u; w++) {
    kvq_u32 bits = KVQ_PAGE(kvq_qjl_sign_word_at(block, outer, t, w, P, m, mo));
    kvq_u32 at = 32u * w * d + c;
    /* constant trip counts: not counted against the loop limit; the sign as a factor +-1 (exact), no branch */
    if (outer != 0u)
      for (kvq_u32 b = 0u; b < 32u; b++) sum += KVQ_ACC(kvq_qjl_sign(bits, b)) * KVQ_ACC(KVQ_QJL_S_OUT(at + b * d));
    else
      for (kvq_u32 b = 0u; b < 32u; b++) sum += KVQ_ACC(kvq_qjl_sign(bits, b)) * KVQ_ACC(KVQ_QJL_S(at + b * d));
  }
  return KVQ_F32(kvq_qjl_estimate(c_d, rows, kvq_qjl_norm(KVQ_IO block, outer, t, P, m, mo, k), sum));
}

/* ---- PREPARE_QUERY and SCORE ---------------------------------------------------------------------- */

/* Row i of S q, the query at input element q (Algorithm 1, line 6). */
KVQ_SHARED_FN kvq_f32 kvq_qjl_prepare_row(KVQ_IO_PARAM kvq_u32 q, kvq_u32 i, kvq_u32 d) {
  kvq_acc sum = KVQ_ACC(0.0f);
  for (kvq_u32 c = 0u; c < d; c++) sum += KVQ_ACC(KVQ_QJL_S(i * d + c)) * KVQ_ACC(KVQ_IN(q + c));
  return KVQ_F32(sum);
}

/* S[i][c] q_c (S_o's for outer = 1): one outlier channel's term of row i of a sketch part of the
 * query. */
KVQ_SHARED_FN kvq_acc kvq_qjl_outlier_product(KVQ_IO_PARAM kvq_u32 outer, kvq_u32 i, kvq_u32 c, kvq_f32 q_c, kvq_u32 d) {
  return KVQ_ACC(kvq_qjl_sketch(KVQ_IO outer, i, c, d)) * KVQ_ACC(q_c);
}

/* Row i of a sketch part of the query from `outliers`, the sum over the page's outlier channels c in
 * list order of S[i][c] q_c (S_o for outer = 1): for the inlier sketch the prepared (S q)_i (from
 * prepared element p) less that sum, for the outlier sketch the sum itself. kvq_qjl_part_of takes
 * (S q)_i read by the caller (the Vulkan fused pass reads 4 rows with one load); the read is only
 * made for the inlier sketch. */
KVQ_SHARED_FN kvq_acc kvq_qjl_part_of(kvq_u32 outer, kvq_acc prepared, kvq_acc outliers) {
  return outer == 0u ? prepared - outliers : outliers;
}
KVQ_SHARED_FN kvq_acc kvq_qjl_query_part_from(KVQ_IO_PARAM kvq_u32 outer, kvq_u32 i, kvq_u32 p, kvq_acc outliers) {
  return outer == 0u ? kvq_qjl_part_of(outer, KVQ_ACC(KVQ_PREPARED(p + i)), outliers) : outliers;
}

/* Rows i .. i + 3 of S q_in (outer = 0: the prepared S q from prepared element p, less the outlier
 * channels' products, summed over the list in order) or of S_o q_out (outer = 1: those products
 * alone), for the page whose outlier list is `list`; the query at input element q. Four rows per
 * call keep the loop over the outliers (counted against the loop limit) to rows / 4. */
KVQ_SHARED_FN void kvq_qjl_query_parts4(KVQ_IO_PARAM kvq_u32 outer, kvq_u32 i, kvq_u32 q, kvq_u32 p,
                                        kvq_u32 list[KVQ_MAX_OUTLIERS], kvq_u32 d, kvq_u32 k, KVQ_OUT kvq_acc parts[4]) {
  for (kvq_u32 r = 0u; r < 4u; r++) parts[r] = KVQ_ACC(0.0f);
  for (kvq_u32 j = 0u; j < k; j++) {
    kvq_f32 qc = KVQ_IN(q + list[j]);
    for (kvq_u32 r = 0u; r < 4u; r++) parts[r] += kvq_qjl_outlier_product(KVQ_IO outer, i + r, list[j], qc, d);
  }
  for (kvq_u32 r = 0u; r < 4u; r++) parts[r] = kvq_qjl_query_part_from(KVQ_IO outer, i + r, p, parts[r]);
}

/* <sign bits of token t, parts>: sum over the rows in order of (bit ? parts[i] : -parts[i]), with
 * the parts of a whole page computed once (the CPU's way). */
KVQ_SHARED_FN kvq_acc kvq_qjl_signed_dot(KVQ_IO_PARAM kvq_u32 block, kvq_u32 outer, kvq_u32 t,
                                         kvq_acc parts[KVQ_MAX_SKETCH_DIM], kvq_u32 P, kvq_u32 m, kvq_u32 mo) {
  kvq_u32 rows = outer != 0u ? mo : m;
  kvq_acc sum = KVQ_ACC(0.0f);
  for (kvq_u32 w = 0u; w < rows / 32u; w++) {
    kvq_u32 bits = KVQ_PAGE(kvq_qjl_sign_word_at(block, outer, t, w, P, m, mo));
    for (kvq_u32 b = 0u; b < 32u; b++) sum += ((bits >> b) & 1u) != 0u ? parts[32u * w + b] : -parts[32u * w + b];
  }
  return sum;
}

/* One sketch's part of q.k_t with the query parts computed four rows at a time (the GPU's way: no
 * array of a page's parts), in the same order and operations as kvq_qjl_signed_dot. */
KVQ_SHARED_FN kvq_acc kvq_qjl_score_part(KVQ_IO_PARAM kvq_u32 block, kvq_u32 outer, kvq_u32 t, kvq_u32 q, kvq_u32 p,
                                         kvq_u32 list[KVQ_MAX_OUTLIERS], kvq_u32 P, kvq_u32 d, kvq_u32 m, kvq_u32 mo,
                                         kvq_u32 k, kvq_acc c_d) {
  kvq_u32 rows = outer != 0u ? mo : m;
  kvq_acc sum = KVQ_ACC(0.0f);
  for (kvq_u32 i = 0u; i < rows; i += 4u) {
    kvq_u32 bits = KVQ_PAGE(kvq_qjl_sign_word_at(block, outer, t, i / 32u, P, m, mo)) >> (i % 32u);
    kvq_acc parts[4];
    kvq_qjl_query_parts4(KVQ_IO outer, i, q, p, list, d, k, parts);
    for (kvq_u32 r = 0u; r < 4u; r++) sum += ((bits >> r) & 1u) != 0u ? parts[r] : -parts[r]; /* constant trips */
  }
  return kvq_qjl_estimate(c_d, rows, kvq_qjl_norm(KVQ_IO block, outer, t, P, m, mo, k), sum);
}

/* q.k_t by the estimator, the query at input element q prepared at prepared element p. */
/* The same, given the page's outlier list (kvq_qjl_load_list; a GPU block loads it once). */
KVQ_SHARED_FN kvq_acc kvq_qjl_score_list(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 q, kvq_u32 p,
                                         kvq_u32 list[KVQ_MAX_OUTLIERS], kvq_u32 P, kvq_u32 d, kvq_u32 m, kvq_u32 mo,
                                         kvq_u32 k, kvq_acc c_d) {
  kvq_acc estimate = kvq_qjl_score_part(KVQ_IO block, 0u, t, q, p, list, P, d, m, mo, k, c_d);
  if (k > 0u) estimate += kvq_qjl_score_part(KVQ_IO block, 1u, t, q, p, list, P, d, m, mo, k, c_d);
  return estimate;
}
KVQ_SHARED_FN kvq_acc kvq_qjl_score(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 q, kvq_u32 p, kvq_u32 P, kvq_u32 d,
                                    kvq_u32 m, kvq_u32 mo, kvq_u32 k, kvq_acc c_d) {
  kvq_u32 list[KVQ_MAX_OUTLIERS];
  kvq_qjl_load_list(KVQ_IO block, P, m, mo, k, list);
  return kvq_qjl_score_list(KVQ_IO block, t, q, p, list, P, d, m, mo, k, c_d);
}

/* ---- lookup tables of signed sums (the GPUs' fused attention) ------------------------------------
 * The signed sum sum_i sigma_i P_i of one sketch part (sigma_i = +1 where the key's bit i is set, else
 * -1; P_i the query's part of row i) taken 4 rows (a nibble of sign bits) at a time: per group of 4
 * rows, a table of the 16 signed sums of its parts, built once per (page, query head) and shared by
 * the page's tokens, so that a token adds one table entry per 4 rows instead of 4 terms.
 * Rounding (why docs/ACCURACY.md's QJL bound, gamma(d + max(m, m_o) + 8) of its A, still holds): an
 * entry is a float sum of 4 terms (3 roundings) and a token's sum adds its rows / 4 entries one after
 * another from 0, so no term of the part goes through more than 3 + rows / 4 roundings, fewer than
 * the rows - 1 of the term-by-term sum for every sketch dimension kvq allows (multiples of 32: 11 <=
 * 31 at 32 rows), and the bound, which holds for any order of summation whose chains are no longer
 * (Higham, Accuracy and Stability, 4.2), covers it unchanged. */

/* bit b of `bits` set: +part, else -part (the term of a signed sum) */
KVQ_SHARED_FN kvq_f32 kvq_qjl_signed(kvq_u32 bits, kvq_u32 b, kvq_f32 part) { return ((bits >> b) & 1u) != 0u ? part : -part; }

/* Entry v (0 .. 15) of the table of 4 rows whose parts are p0 .. p3: the signed sum from the top
 * row down. */
KVQ_SHARED_FN kvq_f32 kvq_qjl_nibble_entry(kvq_u32 v, kvq_f32 p0, kvq_f32 p1, kvq_f32 p2, kvq_f32 p3) {
  kvq_f32 sum = kvq_qjl_signed(v, 3u, p3);
  sum += kvq_qjl_signed(v, 2u, p2);
  sum += kvq_qjl_signed(v, 1u, p1);
  return sum + kvq_qjl_signed(v, 0u, p0);
}

/* A table need only hold its 8 entries with bit 3 set: entry v of the others is exactly -entry(15 - v)
 * (every sign flipped, and round-to-nearest rounds -x to -round(x), so each partial sum is negated
 * exactly). Where entry v's magnitude lies among entries 8 .. 15 (stored at 0 .. 7): v & 7 for
 * v >= 8, (15 - v) & 7 = ~v & 7 below; its sign is bit 3 of v. */
KVQ_SHARED_FN kvq_u32 kvq_qjl_half_index(kvq_u32 v) { return (v ^ ((v >> 3u) - 1u)) & 7u; }

#endif /* KVQ_CORE_METHODS_QJL_H */
