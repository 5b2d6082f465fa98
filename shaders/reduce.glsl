// Workgroup reductions for shaders whose workgroup shares one loop (the fused attention, the
// softmax): for the loop limit (docs/VULKAN.md), long token loops are spread over the
// KVQ_GPU_GROUP_SIZE invocations of a workgroup (local_size_x, core/gpu_plan.h) and reduced here.

// Workgroup-wide max and sum of one float per invocation (every invocation gets the result; all
// invocations of the workgroup must call them together). With KVQ_SUBGROUPS (a variant built for
// devices whose compute stage reports subgroup arithmetic) each subgroup reduces in registers and
// only the per-subgroup results meet in shared memory; without, a tree in shared memory.
shared float kvq_reduce[KVQ_GPU_GROUP_SIZE];

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
  for (uint step = KVQ_GPU_GROUP_SIZE / 2u; step > 0u; step /= 2u) {
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
  for (uint step = KVQ_GPU_GROUP_SIZE / 2u; step > 0u; step /= 2u) {
    if (lane < step) kvq_reduce[lane] += kvq_reduce[lane + step];
    barrier();
  }
  float total = kvq_reduce[0];
  barrier();
  return total;
}
#endif
