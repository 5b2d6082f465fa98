/*
 * Coupled Quantization (Zhang et al., ../shared/papers/004): each group g of c contiguous channels
 * stores the b-bit index of its nearest centroid (core/quantize_math.h) among the 2^b learned for its
 * (kv head, group), fp32 in fixed1 (core/layout.h). Keys are scored through lookup tables of
 * <q_group, centroid> built once per query (the prepared query). Work unit: one channel group of one
 * token, unit = t * (d / c) + g, so that the 2^b-centroid search of a GPU invocation stays within
 * lavapipe's loop limit (docs/VULKAN.md).
 * Arguments as in core/methods/exact.h; h the kv head, c channels per group, b code bits.
 */
#ifndef KVQ_CORE_METHODS_CQ_H
#define KVQ_CORE_METHODS_CQ_H

#include "core/layout.h"
#include "core/methods/io.h"
#include "core/quantize_math.h"

/* The side's fixed array 1 (docs/FORMAT.md): fp32 centroids [kv head][group][2^b][c]. */
#define KVQ_CQ_CENTROID(i) KVQ_FIXED1(i)

/* The element of fixed1 where centroid 0 of group g of kv head h starts. */
KVQ_SHARED_FN kvq_u32 kvq_cq_centroids(kvq_u32 h, kvq_u32 g, kvq_u32 d, kvq_u32 c, kvq_u32 b) {
  return ((h * (d / c) + g) << b) * c;
}

KVQ_SHARED_FN void kvq_cq_encode_unit(KVQ_IO_PARAM kvq_u32 block, kvq_u32 unit, kvq_u32 x, kvq_u32 stride, kvq_u32 d,
                                      kvq_u32 c, kvq_u32 b, kvq_u32 h) {
  kvq_u32 groups = d / c, t = unit / groups, g = unit % groups;
  /* the group's inputs read where they are used (their conversion is exact, so every read gives the
   * same float): no per-thread array, which a CUDA kernel would keep in local memory */
  kvq_u32 at = x + t * stride + g * c;
  kvq_u32 mu = kvq_cq_centroids(h, g, d, c, b), best = 0u;
  kvq_f32 best_d = 0.0f;
  for (kvq_u32 j = 0u; j < (1u << b); j++) {
    KVQ_PRECISE kvq_f32 sum = 0.0f;
    for (kvq_u32 i = 0u; i + 1u < c; i += 2u) { /* two dims per trip (c is 1 or even): the loop limit */
      sum = kvq_distance_step(sum, KVQ_IN(at + i), KVQ_CQ_CENTROID(mu + i));
      sum = kvq_distance_step(sum, KVQ_IN(at + i + 1u), KVQ_CQ_CENTROID(mu + i + 1u));
    }
    if (c == 1u) sum = kvq_distance_step(sum, KVQ_IN(at), KVQ_CQ_CENTROID(mu));
    if (kvq_nearer(j, sum, best_d) != 0u) {
      best = j;
      best_d = sum;
    }
    mu += c;
  }
  kvq_io_put_code(KVQ_IO block >> 2u, unit, b, best);
}

/* The code of group g of token t: code t * d/c + g of the packed array (core/layout.h). kvq_io_code
 * finds 1-, 2-, 4- and 8-bit codes' words with shifts, so a loop over tokens (a GPU's value pass) keeps
 * no integer division but d / c, which is the same for every token. */
KVQ_SHARED_FN kvq_u32 kvq_cq_code(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 g, kvq_u32 d, kvq_u32 c, kvq_u32 b) {
  return kvq_io_code(KVQ_IO block >> 2u, t * (d / c) + g, b);
}

/* The element of fixed1 where the centroid group g of token t is coded by starts: its c channels follow. */
KVQ_SHARED_FN kvq_u32 kvq_cq_decode_group(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 g, kvq_u32 d, kvq_u32 c, kvq_u32 b,
                                          kvq_u32 h) {
  return kvq_cq_centroids(h, g, d, c, b) + kvq_cq_code(KVQ_IO block, t, g, d, c, b) * c;
}

/* Channel i of token t. */
KVQ_SHARED_FN kvq_f32 kvq_cq_decode(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 i, kvq_u32 d, kvq_u32 c, kvq_u32 b,
                                    kvq_u32 h) {
  return KVQ_CQ_CENTROID(kvq_cq_decode_group(KVQ_IO block, t, i / c, d, c, b, h) + i % c);
}

/* Entry g * 2^b + j of the prepared query: <q_g, centroid j of group g>, the query at input element q
 * (0 on the CPU and CUDA, whose input is the query row; the query's place in src on Vulkan). */
KVQ_SHARED_FN kvq_f32 kvq_cq_prepare_entry(KVQ_IO_PARAM kvq_u32 q, kvq_u32 g, kvq_u32 j, kvq_u32 d, kvq_u32 c, kvq_u32 b,
                                           kvq_u32 h) {
  kvq_u32 mu = kvq_cq_centroids(h, g, d, c, b) + j * c;
  kvq_acc dot = KVQ_ACC(0.0f);
  for (kvq_u32 i = 0u; i < c; i++) dot += KVQ_ACC(KVQ_IN(q + g * c + i)) * KVQ_ACC(KVQ_CQ_CENTROID(mu + i));
  return KVQ_F32(dot);
}

/* q.k_t: the prepared entries of token t's codes, summed over the groups in order; the query's tables
 * at prepared element p (0 on the CPU and CUDA; the row's place in the prepared buffer on Vulkan). */
KVQ_SHARED_FN kvq_acc kvq_cq_score(KVQ_IO_PARAM kvq_u32 block, kvq_u32 t, kvq_u32 p, kvq_u32 d, kvq_u32 c, kvq_u32 b) {
  /* the codes read in order a word at a time (kvq_io_code's words and bits): one division per token,
   * not two per group, and one load per 32 / b codes */
  kvq_u32 groups = d / c, cpw = 32u / b, i = t * groups, w = (block >> 2u) + i / cpw, k = i % cpw;
  kvq_u32 word = KVQ_PAGE(w) >> (k * b), mask = (1u << b) - 1u;
  kvq_acc dot = KVQ_ACC(0.0f);
  for (kvq_u32 g = 0u; g < groups; g++) {
    dot += KVQ_ACC(KVQ_PREPARED(p + (g << b) + (word & mask)));
    word >>= b;
    k++;
    if (k == cpw && g + 1u < groups) { /* the next word, never one past the token's last code */
      k = 0u;
      w++;
      word = KVQ_PAGE(w);
    }
  }
  return dot;
}

#endif /* KVQ_CORE_METHODS_CQ_H */
