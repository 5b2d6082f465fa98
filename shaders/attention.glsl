// What SCORE, SOFTMAX, WEIGHTED_SUM and the fused attention share: the job's metadata (core/gpu_plan.h:
// the header, the sequence records, the kernels' unit tables, the page lists) and the masking rule
// of backends/backend.h (kvq_attention_seq). A dispatch covers the whole batch: each workgroup
// first finds its sequence (kvq_locate), which kvq_seq then reads.

// The metadata functions themselves are core/gpu_attention.h's, shared with the CUDA kernels; here the
// metadata is a global buffer from word pc.meta.
#define KVQ_META_PARAM
#define KVQ_META_ARG
#define KVQ_META(w) meta[pc.meta + (w)]
#include "core/gpu_attention.h"

uint kvq_seq_index = 0u; // the workgroup's sequence, set by kvq_locate

uint kvq_meta(uint word) { return KVQ_META(word); }

// The workgroup's sequence and its unit within it for `kernel` (KVQ_PLAN_*, kvq_gpu_locate). False for
// the workgroups past the batch's last unit (the dispatch grid rounds up). Uniform over the workgroup.
bool kvq_locate(uint kernel, out uint unit) {
  uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  uint seq = kvq_gpu_locate(kernel, wg);
  unit = 0u;
  if (seq == kvq_meta(KVQ_META_SEQS)) return false;
  kvq_seq_index = seq;
  unit = kvq_gpu_unit(kernel, seq, wg);
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

uint kvq_seq(uint field) { return kvq_gpu_seq(kvq_seq_index, field); }
uint kvq_seq_tokens() { return kvq_gpu_seq_tokens(kvq_seq_index); }

// Whether query row r may attend to slot t: a kept token, not in its future (mask 0 = causal).
bool kvq_visible(uint r, uint t) { return kvq_gpu_visible(kvq_seq_index, r, t, pc.page_size, pc.alive_words) != 0u; }

// Byte offset in the page pool of kv head h's block of the page holding quantized slot t.
uint kvq_slot_block(uint t, uint h) {
  return (kvq_gpu_page_slot(kvq_seq_index, t, pc.page_size) * pc.kv_heads + h) * pc.head_words * 4u;
}

// Channel c of kv head h of window slot t (t >= quantized), from the ring in the window dtype: the
// element is kvq_window_first(t, h) + c, which loops over c compute once per token (the ring slot
// takes a modulo and metadata reads).
uint kvq_window_first(uint t, uint h) { return kvq_gpu_ring_element(kvq_seq_index, t, pc.kv_heads, pc.head_dim, h, 0u); }
float kvq_window_at(uint element) { return KVQ_READ_ELEMENT(ring, pc.window_dtype, element); }
float kvq_window_value(uint t, uint h, uint c) { return kvq_window_at(kvq_window_first(t, h) + c); }
