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

// Workgroup-wide max and sum of one float per invocation (every invocation gets the result; all
// invocations of the workgroup must call them together). With KVQ_SUBGROUPS (a variant built for
// devices whose compute stage reports subgroup arithmetic) each subgroup reduces in registers and
// only the per-subgroup results meet in shared memory; without, a tree in shared memory.
shared float kvq_reduce[KVQ_SPLIT];

#ifdef KVQ_SUBGROUPS
float kvq_workgroup_max(float x) {
  float s = subgroupMax(x);
  if (subgroupElect()) kvq_reduce[gl_SubgroupID] = s;
  barrier();
  float m = kvq_reduce[0];
  for (uint i = 1u; i < gl_NumSubgroups; i++) m = max(m, kvq_reduce[i]);
  barrier();
  return m;
}
float kvq_workgroup_sum(float x) {
  float s = subgroupAdd(x);
  if (subgroupElect()) kvq_reduce[gl_SubgroupID] = s;
  barrier();
  float total = 0.0;
  for (uint i = 0u; i < gl_NumSubgroups; i++) total += kvq_reduce[i];
  barrier();
  return total;
}
#else
float kvq_workgroup_max(float x) {
  uint lane = gl_LocalInvocationID.x;
  kvq_reduce[lane] = x;
  barrier();
  for (uint step = KVQ_SPLIT / 2u; step > 0u; step /= 2u) {
    if (lane < step) kvq_reduce[lane] = max(kvq_reduce[lane], kvq_reduce[lane + step]);
    barrier();
  }
  float m = kvq_reduce[0];
  barrier();
  return m;
}
float kvq_workgroup_sum(float x) {
  uint lane = gl_LocalInvocationID.x;
  kvq_reduce[lane] = x;
  barrier();
  for (uint step = KVQ_SPLIT / 2u; step > 0u; step /= 2u) {
    if (lane < step) kvq_reduce[lane] += kvq_reduce[lane + step];
    barrier();
  }
  float total = kvq_reduce[0];
  barrier();
  return total;
}
#endif
