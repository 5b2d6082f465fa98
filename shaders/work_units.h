/*
 * How many invocations the Vulkan backend gives one head block to encode, and one query to prepare,
 * per method: the host sizes its dispatches with these (backends/vulkan/vk_jobs.c) and the shaders
 * split the work with them (shaders/method.glsl), so both read one definition. Written in the
 * common subset of C and GLSL (core/shared_lang.h).
 *
 * Encoding: one token for EXACT, UNIFORM and PolarQuant; one channel of one group of Gt tokens for
 * KIVI (its scales are per channel); one 32-row word of sign bits of one token for QJL and one group
 * of c channels of one token for CQ (smaller units keep each invocation under the loop limit,
 * docs/VULKAN.md).
 * Preparing: one row of S q for QJL (all m x d products in one would pass that limit); the whole
 * rotated query for PolarQuant (the Hadamard form needs every coordinate).
 */
#ifndef KVQ_SHADERS_WORK_UNITS_H
#define KVQ_SHADERS_WORK_UNITS_H

#include "core/layout.h"

/* Work units to encode n tokens of a head block of `method` with the given layout parameters. */
KVQ_SHARED_FN kvq_u32 kvq_encode_units_of(kvq_u32 method, kvq_u32 n, kvq_u32 d, kvq_u32 group, kvq_u32 m, kvq_u32 k,
                                          kvq_u32 m_o, kvq_u32 channels) {
  if (method == KVQ_LAYOUT_KIVI) return (n + group - 1u) / group * d;
  if (method == KVQ_LAYOUT_QJL) return n * (kvq_qjl_words_per_token(m) + (k > 0u ? kvq_qjl_words_per_token(m_o) : 0u));
  if (method == KVQ_LAYOUT_CQ) return n * (d / channels);
  return n;
}

/* Work units to prepare one query (methods with prepared queries). */
KVQ_SHARED_FN kvq_u32 kvq_prepare_units_of(kvq_u32 method, kvq_u32 m) { return method == KVQ_LAYOUT_QJL ? m : 1u; }

#endif
