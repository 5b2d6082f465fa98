/*
 * The fixture file between the CPU reference (reference.c, linked with kvq) and the emulated CUDA
 * attention kernels' test (test_cuda_attention.cpp, which does not link kvq, so that it builds under
 * any sanitizer): for every case, one batch of attention sequences over a key and a value pool built
 * on the CPU backend, and the CPU backend's SCORE, SOFTMAX (with ACCUMULATE) and WEIGHTED_SUM of it.
 * Each case, little-endian, in this order:
 *   kvq_attention_fixture
 *   key fixed[0..1], value fixed[0..1]   fixed_floats fp32 each (the sides' matrices and codebooks)
 *   key pool, value pool                 pool_pages x page_bytes of each side: pages quantized by the
 *                                        CPU backend, and slots no sequence lists filled with garbage
 *   key ring, value ring                 ring_bytes each, window-dtype elements
 *   queries                              query_rows x query_heads x head_dim fp32
 *   prepared                             query_rows x query_heads x prepared_floats fp32: the CPU's
 *                                        PREPARE_QUERY of the queries against the keys
 *   meta                                 meta_words: kvq_gpu_pack_attention of the job (unfused plan)
 *   fused meta                           fused_meta_words (0 where the fused plan does not fuse the
 *                                        job): kvq_gpu_pack_attention of the job without accumulate
 *                                        under the fused plan (kvq_gpu_plan_attention(job, 1, ...))
 *   logits                               score_floats fp32: the scores buffer after the CPU's SCORE
 *                                        (entries no sequence owns keep the fill pattern)
 *   probabilities                        score_floats fp32: after the CPU's SOFTMAX
 *   accumulate                           accumulate_floats fp32 (0 floats without accumulate)
 *   output                               output_floats fp32: after the CPU's WEIGHTED_SUM
 */
#ifndef KVQ_TESTS_CUDA_ATTENTION_FIXTURE_H
#define KVQ_TESTS_CUDA_ATTENTION_FIXTURE_H

#include <stdint.h>

#define KVQ_ATTENTION_FIXTURE_SIDE_FIELDS 16u /* core/layout.h's KVQ_SIDE_FIELD_COUNT (checked by both) */
#define KVQ_ATTENTION_FIXTURE_KERNELS 7u      /* core/gpu_plan.h's KVQ_PLAN_KERNELS */

typedef struct kvq_attention_fixture {
  char name[160];
  uint32_t side[2][KVQ_ATTENTION_FIXTURE_SIDE_FIELDS]; /* keys, values: KVQ_SIDE_FIELDS in order */
  uint32_t head_bytes[2], page_bytes[2];
  float qjl_constant[2];
  uint32_t fixed_floats[2][2];
  uint32_t query_heads, window_dtype, alive_words, accumulate;
  float scale;
  uint32_t pool_pages, ring_bytes, query_rows, prepared_floats;
  uint32_t meta_words, units[KVQ_ATTENTION_FIXTURE_KERNELS], rotated_sums, scratch_bytes;
  uint32_t score_floats, accumulate_floats, output_floats;
  uint32_t sequences, listed_pages; /* sequences of the batch, pages they list */
  /* the fused plan of the job without accumulate: whether it fuses, its units, metadata and scratch,
   * and where the rotated sums start in that scratch (floats; with rotated_sums) */
  uint32_t fused, fused_units[KVQ_ATTENTION_FIXTURE_KERNELS], fused_meta_words, fused_scratch_bytes, fused_rotated_at;
} kvq_attention_fixture;

#endif
