/*
 * How a GPU kernel of an attention job reads the job's metadata (core/gpu_plan.h: the header, the
 * sequence records, the kernels' unit tables, the page lists), written once in the common subset of
 * C, CUDA and GLSL (core/shared_lang.h) for shaders/attention.glsl and the CUDA kernels
 * (backends/cuda/kernels/attention.cuh): finding a workgroup's sequence and unit, the masking rule
 * of backends/backend.h (kvq_attention_seq), a quantized slot's page and a window slot's ring element.
 *
 * The metadata is reached through accessors that each language defines before including this header:
 *   KVQ_META_PARAM  the first parameter of every function here, with its comma: CUDA
 *                   `const unsigned *meta,` (the job's words), GLSL nothing (a global buffer)
 *   KVQ_META_ARG    the argument that passes it on: `meta,` or nothing
 *   KVQ_META(w)     word w of the job's metadata (from its KVQ_META_SLOTS header word on)
 */
#ifndef KVQ_CORE_GPU_ATTENTION_H
#define KVQ_CORE_GPU_ATTENTION_H

#include "gpu_plan.h"

#if !defined(KVQ_META)
#error "core/gpu_attention.h: define KVQ_META_PARAM, KVQ_META_ARG and KVQ_META(w) before including it"
#endif

/* Field KVQ_SEQ_* of sequence `seq`'s record. */
KVQ_SHARED_FN kvq_u32 kvq_gpu_seq(KVQ_META_PARAM kvq_u32 seq, kvq_u32 field) {
  return KVQ_META(KVQ_META_RECORDS + seq * KVQ_SEQ_WORDS + field);
}
KVQ_SHARED_FN kvq_u32 kvq_gpu_seq_tokens(KVQ_META_PARAM kvq_u32 seq) {
  return kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_QUANTIZED) + kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_WINDOW);
}

/* The sequence of workgroup `wg` of kernel `kernel` (KVQ_PLAN_*): a binary search for the last
 * sequence whose first unit is at or before wg in the kernel's prefix table. The sequence count
 * (KVQ_META_SEQS) for the workgroups past the batch's last unit (the grid rounds up). */
KVQ_SHARED_FN kvq_u32 kvq_gpu_locate(KVQ_META_PARAM kvq_u32 kernel, kvq_u32 wg) {
  kvq_u32 table = KVQ_META(KVQ_META_UNITS + kernel), lo = 0u, hi = KVQ_META(KVQ_META_SEQS);
  if (wg >= KVQ_META(table + hi)) return hi;
  while (hi - lo > 1u) {
    kvq_u32 mid = (lo + hi) / 2u;
    if (KVQ_META(table + mid) <= wg) lo = mid;
    else hi = mid;
  }
  return lo;
}
/* Workgroup wg's unit within its sequence `seq` (kvq_gpu_locate's). */
KVQ_SHARED_FN kvq_u32 kvq_gpu_unit(KVQ_META_PARAM kvq_u32 kernel, kvq_u32 seq, kvq_u32 wg) {
  return wg - KVQ_META(KVQ_META(KVQ_META_UNITS + kernel) + seq);
}

/* 1 where query row r of sequence `seq` may attend to slot t: a kept token, not in its future
 * (mask 0 = causal); else 0. P: tokens per page; alive_words: kept-token mask words per page. */
KVQ_SHARED_FN kvq_u32 kvq_gpu_visible(KVQ_META_PARAM kvq_u32 seq, kvq_u32 r, kvq_u32 t, kvq_u32 P, kvq_u32 alive_words) {
  kvq_u32 quantized = kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_QUANTIZED);
  kvq_u32 position;
  if (t >= quantized) {
    position = kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_WINDOW_FIRST) + (t - quantized);
  } else {
    kvq_u32 page = kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_PAGE_FIRST) + t / P, i = t % P;
    if (((KVQ_META(KVQ_META(KVQ_META_ALIVE) + page * alive_words + i / 32u) >> (i % 32u)) & 1u) == 0u) return 0u;
    position = KVQ_META(KVQ_META(KVQ_META_INDEX) + page) * P + i;
  }
  if (kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_MASK) != 0u) return 1u;
  return position <= kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_QUERY_POSITION) + r ? 1u : 0u;
}

/* The pool slot of the page holding quantized slot t (t < quantized) of sequence `seq`. */
KVQ_SHARED_FN kvq_u32 kvq_gpu_page_slot(KVQ_META_PARAM kvq_u32 seq, kvq_u32 t, kvq_u32 P) {
  return KVQ_META(KVQ_META(KVQ_META_SLOTS) + kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_PAGE_FIRST) + t / P);
}

/* The element (in window-dtype elements of the ring buffer) of channel c of kv head h of window slot
 * t (t >= quantized) of sequence `seq`: ring slot (window_first + t - quantized) % ring_capacity. */
KVQ_SHARED_FN kvq_u32 kvq_gpu_ring_element(KVQ_META_PARAM kvq_u32 seq, kvq_u32 t, kvq_u32 kv_heads, kvq_u32 d, kvq_u32 h,
                                           kvq_u32 c) {
  kvq_u32 w = kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_WINDOW_FIRST) + (t - kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_QUANTIZED));
  kvq_u32 slot = w % kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_RING_CAPACITY);
  return kvq_gpu_seq(KVQ_META_ARG seq, KVQ_SEQ_RING_ELEMENT) + (slot * kv_heads + h) * d + c;
}

#endif /* KVQ_CORE_GPU_ATTENTION_H */
