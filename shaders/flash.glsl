// The fused decode attention (flash-decoding) shared by its three passes: the token axis of a
// sequence is cut into splits of KVQ_FLASH_SPLIT tokens, one workgroup per (query row, kv head,
// head pass, split), and each workgroup handles up to KVQ_FLASH_HEADS_PER_PASS query heads of the
// kv head's GQA group, so that each key and value is decoded once for all of them
// (core/gpu_plan.h). Scratch (binding DST), fp32: each sequence's from its KVQ_SEQ_SCRATCH, laid
// out as kvq_flash_*_at say.

uint kvq_group() { return pc.query_heads / pc.kv_heads; }
uint kvq_head_passes() { return kvq_flash_passes(kvq_group()); }

uint kvq_flash_prob(uint n, uint row_head, uint t) { return kvq_seq(KVQ_SEQ_SCRATCH) + kvq_flash_prob_at(n, row_head, t); }
uint kvq_flash_max(uint rows, uint n, uint row_head, uint split) {
  return kvq_seq(KVQ_SEQ_SCRATCH) + kvq_flash_max_at(rows * pc.query_heads, n, row_head, split);
}
uint kvq_flash_sum(uint rows, uint n, uint row_head, uint split) {
  return kvq_seq(KVQ_SEQ_SCRATCH) + kvq_flash_sum_at(rows * pc.query_heads, n, row_head, split);
}
uint kvq_flash_out(uint rows, uint n, uint row_head, uint split, uint c) {
  return kvq_seq(KVQ_SEQ_SCRATCH) + kvq_flash_out_at(rows * pc.query_heads, n, pc.head_dim, row_head, split, c);
}
uint kvq_flash_window(uint rows, uint n, uint row_head, uint split, uint c) {
  return kvq_seq(KVQ_SEQ_SCRATCH) + kvq_flash_window_at(rows * pc.query_heads, n, pc.head_dim, row_head, split, c);
}

// The workgroup's (row, kv head, pass, split) from its unit in the sequence (kvq_locate,
// KVQ_PLAN_FLASH); false for units past the last row.
bool kvq_flash_unit(uint unit, uint n, out uint r, out uint kvh, out uint pass, out uint split) {
  uint splits = kvq_flash_splits(n), passes = kvq_head_passes();
  split = unit % splits;
  pass = (unit / splits) % passes;
  kvh = (unit / splits / passes) % pc.kv_heads;
  r = unit / splits / passes / pc.kv_heads;
  return r < kvq_seq(KVQ_SEQ_QUERY_COUNT);
}

#include "shaders/reduce.glsl"
