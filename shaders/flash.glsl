// The fused decode attention (flash-decoding) shared by its three passes: the token axis of a
// sequence is cut into splits of KVQ_SPLIT tokens, one workgroup per (query row, kv head, head pass,
// split), and each workgroup handles up to KVQ_HEADS_PER_PASS query heads of the kv head's GQA
// group, so that each key and value is decoded once for all of them.
// Scratch (binding DST), fp32, for the dispatch's sequence with n tokens, R rows, H query heads and
// S splits: probabilities relative to their split's maximum [R][H][n], split maxima [R][H][S],
// split sums [R][H][S], split outputs [R][H][S][d].

#define KVQ_SPLIT 64u          // tokens per workgroup: one per invocation (KVQ_VK_GROUP_SIZE)
#define KVQ_HEADS_PER_PASS 8u  // query heads of a GQA group per workgroup; larger groups take more passes

uint kvq_splits(uint n) { return (n + KVQ_SPLIT - 1u) / KVQ_SPLIT; }
uint kvq_group() { return pc.query_heads / pc.kv_heads; }
uint kvq_head_passes() { return (kvq_group() + KVQ_HEADS_PER_PASS - 1u) / KVQ_HEADS_PER_PASS; }

uint kvq_flash_max(uint rows, uint n, uint row_head, uint split) {
  return rows * pc.query_heads * n + row_head * kvq_splits(n) + split;
}
uint kvq_flash_sum(uint rows, uint n, uint row_head, uint split) {
  return kvq_flash_max(rows, n, row_head, split) + rows * pc.query_heads * kvq_splits(n);
}
uint kvq_flash_out(uint rows, uint n, uint row_head, uint split, uint c) {
  uint base = rows * pc.query_heads * (n + 2u * kvq_splits(n));
  return base + (row_head * kvq_splits(n) + split) * pc.head_dim + c;
}

// The workgroup's (row, kv head, pass, split); false for workgroups past the last row.
bool kvq_flash_unit(uint n, out uint r, out uint kvh, out uint pass, out uint split) {
  uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  uint splits = kvq_splits(n), passes = kvq_head_passes();
  split = wg % splits;
  pass = (wg / splits) % passes;
  kvh = (wg / splits / passes) % pc.kv_heads;
  r = wg / splits / passes / pc.kv_heads;
  return r < kvq_seq(SEQ_QUERY_COUNT);
}

#include "shaders/reduce.glsl"
