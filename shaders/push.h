/*
 * The push constants of every kvq compute shader, defined once for the host (C) and the shaders
 * (GLSL): the X-macro below expands to a C struct in backends/vulkan/ and to the push_constant block
 * in shaders/common.glsl, so the two cannot drift apart. All fields are 32-bit words; floats travel
 * as their bits. The host checks the size against the device's maxPushConstantsSize (128 bytes is
 * the minimum every Vulkan device guarantees, and the static assertion below keeps us within it).
 *
 * Side fields describe the layout a job reads or writes (KVQ_SIDE_FIELDS, core/layout.h, the first
 * fields of kvq_side_layout), then its head block in words and QJL's estimator constant; job
 * fields say what to do with it: `count` items (pages, clusters, points) from `range_first` (a job
 * split over several dispatches gives each its range), `meta` the word offset of the job's host
 * arrays in binding 0, `src_word` / `dst_word` where the job's input / output starts in src / dst
 * (in 32-bit words), `units` the work units of one head block (QUANTIZE, shaders/work_units.h),
 * `check_word` the index in the results binding of the check word a job recorded behind a device
 * check reads (with KVQ_PUSH_IF_CLEAR, kvq_check_refused in shaders/common.glsl).
 */
#ifndef KVQ_SHADERS_PUSH_H
#define KVQ_SHADERS_PUSH_H

#include "core/layout.h"

#define KVQ_PUSH_FIELDS(F)                                                                          \
  /* the side layout (core/layout.h), then what the kernels derive from it */                       \
  KVQ_SIDE_FIELDS(F) F(head_words) F(constant_bits)                                                 \
  /* the job */                                                                                    \
  F(count) F(range_first) F(input_dtype) F(meta) F(flags) F(src_word) F(dst_word) F(units)         \
  F(query_heads) F(scale_bits) F(window_dtype) F(alive_words) F(check_word)

#define KVQ_PUSH_WORDS (KVQ_SIDE_FIELD_COUNT + 15u)

/* The eight storage-buffer bindings every shader declares (shaders/common.glsl). */
#define KVQ_BINDING_META 0   /* the job's host arrays */
#define KVQ_BINDING_PAGES 1  /* a page pool */
#define KVQ_BINDING_FIXED0 2 /* matrices and codebooks (fp32) */
#define KVQ_BINDING_FIXED1 3
#define KVQ_BINDING_SRC 4    /* inputs: tokens, queries, probabilities */
#define KVQ_BINDING_DST 5    /* outputs: errors, decoded tokens, prepared queries, scores */
#define KVQ_BINDING_RING 6   /* the full-precision window */
#define KVQ_BINDING_RESULTS 7 /* results: prepared queries (read by SCORE), attention outputs, probability sums, k-means distances */

/* flags */
#define KVQ_PUSH_ERRORS 1u     /* QUANTIZE: write per-token errors */
#define KVQ_PUSH_ACCUMULATE 2u /* SOFTMAX: write per-slot probability sums */
#define KVQ_PUSH_WEIGHTS 4u    /* KMEANS_UPDATE: weights are bound */
#define KVQ_PUSH_DISTANCE 8u   /* KMEANS_ASSIGN: distances are bound */
/* FLASH_COMBINE: the values sum in a rotated space (core/gpu_plan.h, rotated_sums): the splits'
 * page sums are combined into the rotated sums at element dst_word of dst, the window sums into
 * results, for weighted_sum_rotate.comp */
#define KVQ_PUSH_ROTATED 128u
/* QUANTIZE's steps and COPY_WORDS: write nothing when the check word results[check_word] is not
 * zero (an append of device tokens recorded behind its checks, core/append.c) */
#define KVQ_PUSH_IF_CLEAR 64u
/* CONVERT (shaders/tensor_convert.comp): flags, and the bits it sets in its flag word */
#define KVQ_CONVERT_CHECK_FINITE 1u /* flag a non-finite source element (and write 0 for it) */
#define KVQ_CONVERT_CHECK_FITS 2u   /* flag a non-finite element or one the destination dtype cannot hold */
#define KVQ_CONVERT_NO_WRITE 4u     /* check only */
#define KVQ_CONVERT_IF_CLEAR 8u     /* write nothing when the flag word is not zero */
#define KVQ_CONVERT_MASKED 16u      /* CHECK_FITS passes -infinity (masked logits, kvq_scores) */
#define KVQ_CHECK_RANGE 32u         /* set by shaders/token_check.comp: a token its method cannot store */

#if defined(GL_core_profile) || defined(VULKAN)
#define KVQ_PUSH_MEMBER(name) uint name;
#else
#include <stdint.h>
#define KVQ_PUSH_MEMBER(name) uint32_t name;
typedef struct kvq_push {
  KVQ_PUSH_FIELDS(KVQ_PUSH_MEMBER)
} kvq_push;
_Static_assert(sizeof(kvq_push) == KVQ_PUSH_WORDS * 4u, "KVQ_PUSH_WORDS must count the fields");
_Static_assert(sizeof(kvq_push) <= 128u, "push constants must fit the 128 bytes every device offers");
#endif

#endif
