// What SCORE, SOFTMAX, WEIGHTED_SUM and the fused attention share: the job's metadata (core/gpu_plan.h:
// the header, the sequence records, the kernels' unit tables, the page lists) and the masking rule
// of backends/backend.h (kvq_attention_seq). A dispatch covers the whole batch: each workgroup
// first finds its sequence (kvq_locate), which kvq_seq then reads.

#include "core/gpu_plan.h"

uint kvq_seq_index = 0u; // the workgroup's sequence, set by kvq_locate

uint kvq_meta(uint word) { return meta[pc.meta + word]; }

// The workgroup's sequence and its unit within it for `kernel` (KVQ_PLAN_*): a binary search for the
// last sequence whose first unit is at or before the workgroup's index in the kernel's prefix table.
// False for the workgroups past the batch's last unit (the dispatch grid rounds up). Uniform over the
// workgroup.
bool kvq_locate(uint kernel, out uint unit) {
  uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  uint table = kvq_meta(KVQ_META_UNITS + kernel), lo = 0u, hi = kvq_meta(KVQ_META_SEQS);
  unit = 0u;
  if (wg >= kvq_meta(table + hi)) return false;
  while (hi - lo > 1u) {
    uint mid = (lo + hi) / 2u;
    if (kvq_meta(table + mid) <= wg) lo = mid;
    else hi = mid;
  }
  kvq_seq_index = lo;
  unit = wg - kvq_meta(table + lo);
  return true;
}
// The same for kernels whose units are KVQ_GPU_GROUP_SIZE invocations: the invocation's index
// within its sequence.
bool kvq_locate_invocation(uint kernel, out uint id) {
  uint unit;
  bool found = kvq_locate(kernel, unit);
  id = unit * KVQ_GPU_GROUP_SIZE + gl_LocalInvocationID.x;
  return found;
}

uint kvq_seq(uint field) { return kvq_meta(KVQ_META_RECORDS + kvq_seq_index * KVQ_SEQ_WORDS + field); }
uint kvq_seq_tokens() { return kvq_seq(KVQ_SEQ_QUANTIZED) + kvq_seq(KVQ_SEQ_WINDOW); }

// Whether query row r may attend to slot t: a kept token, not in its future (mask 0 = causal).
bool kvq_visible(uint r, uint t) {
  uint quantized = kvq_seq(KVQ_SEQ_QUANTIZED), P = pc.page_size;
  uint position;
  if (t >= quantized) {
    position = kvq_seq(KVQ_SEQ_WINDOW_FIRST) + (t - quantized);
  } else {
    uint page = kvq_seq(KVQ_SEQ_PAGE_FIRST) + t / P, i = t % P;
    if (((kvq_meta(kvq_meta(KVQ_META_ALIVE) + page * pc.alive_words + i / 32u) >> (i % 32u)) & 1u) == 0u) return false;
    position = kvq_meta(kvq_meta(KVQ_META_INDEX) + page) * P + i;
  }
  return kvq_seq(KVQ_SEQ_MASK) != 0u || position <= kvq_seq(KVQ_SEQ_QUERY_POSITION) + r;
}

// Byte offset in the page pool of kv head h's block of the page holding quantized slot t.
uint kvq_slot_block(uint t, uint h) {
  uint slot = kvq_meta(kvq_meta(KVQ_META_SLOTS) + kvq_seq(KVQ_SEQ_PAGE_FIRST) + t / pc.page_size);
  return (slot * pc.kv_heads + h) * pc.head_words * 4u;
}

// Channel c of kv head h of window slot t (t >= quantized), from the ring in the window dtype.
float kvq_window_value(uint t, uint h, uint c) {
  uint w = kvq_seq(KVQ_SEQ_WINDOW_FIRST) + (t - kvq_seq(KVQ_SEQ_QUANTIZED));
  uint slot = w % kvq_seq(KVQ_SEQ_RING_CAPACITY);
  uint index = kvq_seq(KVQ_SEQ_RING_ELEMENT) + (slot * pc.kv_heads + h) * pc.head_dim + c;
  return KVQ_READ_ELEMENT(ring, pc.window_dtype, index);
}
