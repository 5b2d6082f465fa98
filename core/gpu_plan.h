/*
 * How a GPU backend runs an attention job, decided once in core for every GPU backend (the Vulkan
 * backend now, the CUDA backend next): the workgroup size, the flash-decoding constants, the
 * metadata the kernels read and, in C (and the CUDA backend's C++ host code) only, the plan (core/gpu_plan.c) that sizes a job's
 * dispatches and scratch and packs its metadata. The constants and shared functions are written in
 * the common subset of C, CUDA and GLSL (core/shared_lang.h); shaders/attention.glsl and
 * shaders/flash.glsl read them.
 *
 * One dispatch per kernel for a whole batch. Every kernel of an attention job gives each sequence
 * of the batch a whole number of workgroups (its units, KVQ_PLAN_*): the plan writes, per kernel, the
 * prefix sums of the sequences' units, and a workgroup finds its sequence by a binary search in
 * them (kvq_locate, shaders/attention.glsl) and its place within the sequence by the difference.
 *
 * Metadata of an attention job, 32-bit words from the job's base (push constant `meta`):
 *   [KVQ_META_SLOTS]      word offset of page_slots (one word per page any sequence lists)
 *   [KVQ_META_INDEX]      word offset of page_index (the pages' logical numbers)
 *   [KVQ_META_ALIVE]      word offset of page_alive (alive_words kept-token masks per page)
 *   [KVQ_META_SEQS]       S, the sequences of the batch
 *   [KVQ_META_UNITS + k]  word offset of kernel k's unit table: S + 1 words, the workgroups of the
 *                         sequences before sequence i at i; the kernel's total at S
 *   [KVQ_META_RECORDS]    S records of KVQ_SEQ_WORDS words (KVQ_SEQ_*), then the unit tables, the
 *                         page slots, the page indices and the kept-token masks
 */
#ifndef KVQ_CORE_GPU_PLAN_H
#define KVQ_CORE_GPU_PLAN_H

#include "shared_lang.h"

/* Invocations of one workgroup, in every kernel (GLSL local_size_x, the CUDA block size). */
#define KVQ_GPU_GROUP_SIZE 64u

/* Flash-decoding (shaders/flash.glsl): a sequence's tokens are cut into splits of KVQ_FLASH_SPLIT,
 * one workgroup per (query row, kv head, head pass, split), each one token per invocation; a
 * workgroup takes up to KVQ_FLASH_HEADS_PER_PASS query heads of a GQA group, larger groups take
 * more passes. */
#define KVQ_FLASH_SPLIT KVQ_GPU_GROUP_SIZE
#define KVQ_FLASH_HEADS_PER_PASS 8u

/* The combine (KVQ_PLAN_COMBINE) takes a unit's 64 outputs with KVQ_FLASH_COMBINE_GROUPS groups of
 * KVQ_GPU_GROUP_SIZE invocations, group g reading splits g, g + G, ... of each output, and adds the
 * groups' partial sums in group order (no term through more than S additions, S the splits): at
 * 256k tokens a thread reading all 4096 splits one after another took 1.8 ms on an H200. */
#define KVQ_FLASH_COMBINE_GROUPS 8u

KVQ_SHARED_FN kvq_u32 kvq_flash_splits(kvq_u32 n) { return (n + KVQ_FLASH_SPLIT - 1u) / KVQ_FLASH_SPLIT; }
KVQ_SHARED_FN kvq_u32 kvq_flash_passes(kvq_u32 group) {
  return (group + KVQ_FLASH_HEADS_PER_PASS - 1u) / KVQ_FLASH_HEADS_PER_PASS;
}
/* A sequence's flash scratch (fp32, from its KVQ_SEQ_SCRATCH), for n tokens, R query rows, H query
 * heads and S splits: probabilities relative to their split's maximum [R][H][n], split maxima
 * [R][H][S], split sums [R][H][S], split outputs [R][H][S][d], and, for value methods that sum in a
 * rotated space (KVQ_SUMS_ROTATED), the split outputs' window parts [R][H][S][d] after them: there
 * the split outputs hold the page tokens' sums in the rotated space, which the combine must keep
 * apart from the window tokens' (unrotated) sums until the page part is rotated back. Offsets from
 * the sequence's start; row_head = r * H + h. (core/gpu_plan.c sizes the whole in 64 bits first.)
 * With the job's accumulate sums, the split normalization after the combine (KVQ_PLAN_SOFTMAX's
 * units) replaces each split sum l_s by the split's factor f_s = e^(m_s - M) / L (M, L the row's
 * maximum and sum over its splits; 0 for a split without a visible token), so that slot t's
 * probability is p_t f_(t / KVQ_FLASH_SPLIT), which the fused ACCUMULATE sums over the rows. */
KVQ_SHARED_FN kvq_u32 kvq_flash_prob_at(kvq_u32 n, kvq_u32 row_head, kvq_u32 t) { return row_head * n + t; }
KVQ_SHARED_FN kvq_u32 kvq_flash_max_at(kvq_u32 row_heads, kvq_u32 n, kvq_u32 row_head, kvq_u32 split) {
  return row_heads * n + row_head * kvq_flash_splits(n) + split;
}
KVQ_SHARED_FN kvq_u32 kvq_flash_sum_at(kvq_u32 row_heads, kvq_u32 n, kvq_u32 row_head, kvq_u32 split) {
  return kvq_flash_max_at(row_heads, n, row_head, split) + row_heads * kvq_flash_splits(n);
}
KVQ_SHARED_FN kvq_u32 kvq_flash_out_at(kvq_u32 row_heads, kvq_u32 n, kvq_u32 d, kvq_u32 row_head, kvq_u32 split,
                                       kvq_u32 c) {
  return row_heads * (n + 2u * kvq_flash_splits(n)) + (row_head * kvq_flash_splits(n) + split) * d + c;
}
KVQ_SHARED_FN kvq_u32 kvq_flash_window_at(kvq_u32 row_heads, kvq_u32 n, kvq_u32 d, kvq_u32 row_head, kvq_u32 split,
                                          kvq_u32 c) {
  return kvq_flash_out_at(row_heads, n, d, row_head, split, c) + row_heads * kvq_flash_splits(n) * d;
}

/* The metadata header (words). */
#define KVQ_META_SLOTS 0u
#define KVQ_META_INDEX 1u
#define KVQ_META_ALIVE 2u
#define KVQ_META_SEQS 3u
#define KVQ_META_UNITS 4u

/* The kernels' unit tables: what one workgroup of each covers, for a sequence of n tokens and R
 * query rows of H query heads (of Hkv kv heads) and head_dim d. */
#define KVQ_PLAN_SCORE 0u        /* 64 of the R*H*n logits (r, h, t), t fastest */
#define KVQ_PLAN_SOFTMAX 1u      /* one of the R*H rows (fused: the row's split normalization) */
#define KVQ_PLAN_ACCUMULATE 2u   /* one of the n slots (unfused or fused) */
#define KVQ_PLAN_WEIGHTED_SUM 3u /* one of the R*H*d outputs (r, h, c), c fastest */
#define KVQ_PLAN_ROTATE 4u       /* 64 of the R*H rows: the rotated sums turned back */
#define KVQ_PLAN_FLASH 5u        /* one (r, kv head, pass, split), split fastest (logits and values) */
#define KVQ_PLAN_COMBINE 6u      /* 64 of the R*H*d outputs */
#define KVQ_PLAN_KERNELS 7u
#define KVQ_META_RECORDS (KVQ_META_UNITS + KVQ_PLAN_KERNELS)

/* A sequence's record (backends/backend.h, kvq_attention_seq, and what the plan derives). */
#define KVQ_SEQ_PAGE_FIRST 0u
#define KVQ_SEQ_QUANTIZED 1u
#define KVQ_SEQ_WINDOW 2u
#define KVQ_SEQ_WINDOW_FIRST 3u
#define KVQ_SEQ_RING_CAPACITY 4u
#define KVQ_SEQ_RING_ELEMENT 5u /* ring_offset in window-dtype elements */
#define KVQ_SEQ_QUERY_FIRST 6u
#define KVQ_SEQ_QUERY_COUNT 7u
#define KVQ_SEQ_QUERY_POSITION 8u
#define KVQ_SEQ_MASK 9u
#define KVQ_SEQ_SCORE_OFFSET 10u
#define KVQ_SEQ_ACCUMULATE_OFFSET 11u
#define KVQ_SEQ_SCRATCH 12u /* the plan: the first float of the sequence's flash scratch */
#define KVQ_SEQ_WORDS 13u

/* C, and C++ host code that asks for it (the CUDA backend: KVQ_GPU_PLAN_HOST) */
#if defined(KVQ_LANG_C) || defined(KVQ_GPU_PLAN_HOST)
#include <stddef.h>

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a GPU backend does for one attention job (kvq_gpu_plan_attention). */
typedef struct kvq_gpu_attention_plan {
  /* 1: the fused flash-decoding kernels (KVQ_PLAN_FLASH twice, then KVQ_PLAN_COMBINE, then ROTATE
   * with rotated_sums; with the job's accumulate then the split normalization over
   * KVQ_PLAN_SOFTMAX's units and the fused ACCUMULATE over KVQ_PLAN_ACCUMULATE's, both on the flash
   * scratch); 0: SCORE, SOFTMAX (and ACCUMULATE with the job's accumulate), WEIGHTED_SUM (and
   * ROTATE with rotated_sums) */
  int fused;
  int rotated_sums;             /* the value method sums in a rotated space (KVQ_SUMS_ROTATED) */
  uint64_t units[KVQ_PLAN_KERNELS]; /* each kernel's workgroups for the whole batch */
  uint64_t scratch_bytes;       /* flash scratch (fused) and/or rotated sums; 0: none */
  /* With rotated_sums: the first float of the rotated sums in scratch, one head_dim row per output
   * row and indexed as the output (0 unfused; fused, past every sequence's flash scratch, where
   * the combine leaves the combined rotated page sums for the ROTATE kernel). */
  uint64_t rotated_at;
  uint64_t pages;               /* pages the sequences list */
  uint64_t meta_words;          /* the metadata kvq_gpu_pack_attention writes */
} kvq_gpu_attention_plan;

/* Plans an attention job (keys and values both given, as core's jobs are). `fused_kernels`:
 * whether the backend has fused kernels for the job's methods; the fused path is taken (with the
 * probability sums of the H2O and Q-Hitter policies too) unless the batch's flash scratch lies
 * beyond 32-bit indices. Values summed in a rotated space (PolarQuant) are fused too: the splits'
 * rotated page sums are combined and then rotated back once per output row (KVQ_PLAN_ROTATE after
 * KVQ_PLAN_COMBINE). Fails
 * (KVQ_ERROR_UNSUPPORTED, with why) where anything the kernels address lies beyond 32-bit indices. */
kvq_status kvq_gpu_plan_attention(const kvq_job_attention *job, int fused_kernels, kvq_gpu_attention_plan *plan,
                                  char *why, size_t why_size);
/* Writes the job's metadata, plan->meta_words words, as described at the top. */
void kvq_gpu_pack_attention(const kvq_job_attention *job, const kvq_gpu_attention_plan *plan, uint32_t *meta);
/* The pieces of it, for core's incremental packer (core/gpu_meta.c): the workgroups kernel k
 * (KVQ_PLAN_*) gives sequence q, the floats of q's flash scratch, and q's record (KVQ_SEQ_WORDS
 * words) with its flash scratch from float `scratch`. */
uint64_t kvq_gpu_seq_units(const kvq_job_attention *job, const kvq_attention_seq *q, uint32_t k);
uint64_t kvq_gpu_flash_scratch_floats(const kvq_job_attention *job, const kvq_attention_seq *q);
void kvq_gpu_pack_record(const kvq_job_attention *job, const kvq_attention_seq *q, uint32_t scratch, uint32_t *record);
#ifdef __cplusplus
}
#endif
#endif

#endif /* KVQ_CORE_GPU_PLAN_H */
