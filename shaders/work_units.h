/*
 * How many invocations the Vulkan backend gives one head block to encode, and one query to prepare,
 * per method: the host sizes its dispatches with these (backends/vulkan/vk_jobs.c) and the shaders
 * split the work with them (shaders/method.glsl), so both read one definition. Written in the
 * common subset of C and GLSL (core/shared_lang.h).
 *
 * Encoding: one token for EXACT and UNIFORM; one channel of one group of Gt tokens for
 * KIVI (its scales are per channel); one 32-row word of sign bits of one token for QJL and one group
 * of c channels of one token for CQ (smaller units keep each invocation under the loop limit,
 * docs/VULKAN.md).
 * PolarQuant's unit is KVQ_POLAR_GROUP_TOKENS tokens encoded by a whole workgroup
 * (kvq_encode_by_workgroup): the rotation's rows or butterflies and each polar level's angles are
 * shared by the invocations, and each entry of a dense rotation is read once for all the tokens.
 * Preparing: one row of S q for QJL (all m x d products in one would pass that limit); for
 * PolarQuant one row of R q with the dense rotation (the whole d x d product passed that limit at
 * d = 256: every read of the query enters the fp16 conversion's loop), the whole rotated query with
 * the Hadamard form, which needs every coordinate (units 1 .. d - 1 then do nothing); for CQ one
 * entry <q_g, centroid j> of the lookup tables (2^b x d/c of them, c products each).
 */
#ifndef KVQ_SHADERS_WORK_UNITS_H
#define KVQ_SHADERS_WORK_UNITS_H

#include "core/layout.h"

/* Tokens of one PolarQuant work unit (one workgroup, shaders/methods/polar.glsl): its shared memory
 * holds 2 arrays of this many tokens of KVQ_MAX_HEAD_DIM floats, 16 KiB at 8, the 16 KiB every
 * Vulkan device offers (16 would not fit). More tokens per workgroup share each load of a rotation
 * entry or codebook between more tokens (docs/BENCH.md, "PolarQuant append on lavapipe"). Only the
 * Vulkan backend splits by it (the CUDA backend encodes a token per block). */
#define KVQ_POLAR_GROUP_TOKENS 8u

/* Work units to encode n tokens of a head block of `method` with the given layout parameters. */
KVQ_SHARED_FN kvq_u32 kvq_encode_units_of(kvq_u32 method, kvq_u32 n, kvq_u32 d, kvq_u32 group, kvq_u32 m, kvq_u32 k,
                                          kvq_u32 m_o, kvq_u32 channels) {
  if (method == KVQ_LAYOUT_KIVI) return (n + group - 1u) / group * d;
  if (method == KVQ_LAYOUT_QJL) return n * (kvq_qjl_words_per_token(m) + (k > 0u ? kvq_qjl_words_per_token(m_o) : 0u));
  if (method == KVQ_LAYOUT_CQ) return n * (d / channels);
  if (method == KVQ_LAYOUT_POLAR) return (n + KVQ_POLAR_GROUP_TOKENS - 1u) / KVQ_POLAR_GROUP_TOKENS;
  return n;
}

/* 1 where every work unit of `method` is encoded by a whole workgroup (KVQ_GPU_GROUP_SIZE
 * invocations, kvq_encode_unit_group in shaders/methods/<method>.glsl, which defines
 * KVQ_ENCODES_BY_WORKGROUP), 0 where by one invocation: the host sizes the QUANTIZE dispatch with it. */
KVQ_SHARED_FN kvq_u32 kvq_encode_by_workgroup(kvq_u32 method) { return method == KVQ_LAYOUT_POLAR ? 1u : 0u; }

/* Work units to prepare one query (methods with prepared queries) of head_dim d; CQ's c channels a
 * group and b code bits. */
KVQ_SHARED_FN kvq_u32 kvq_prepare_units_of(kvq_u32 method, kvq_u32 m, kvq_u32 d, kvq_u32 channels, kvq_u32 code_bits) {
  if (method == KVQ_LAYOUT_QJL) return m;
  if (method == KVQ_LAYOUT_CQ) return (d / channels) << code_bits;
  return method == KVQ_LAYOUT_POLAR ? d : 1u;
}

#endif
