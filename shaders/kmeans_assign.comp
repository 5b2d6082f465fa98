#version 450
#extension GL_GOOGLE_include_directive : require
// KMEANS_ASSIGN over clusters [range_first, range_first + count) (shaders/kmeans.glsl): the nearest centroid of
// every point of every problem (core/quantize_math.h: kvq_distance_step and kvq_nearer, the
// CPU reference's decision and CQ's) and its squared
// distance. Bindings:
//   src     data, fp32 [problems][points][dims]
//   fixed1  centroids, fp32 [problems][clusters][dims]
//   dst     assignment, u32 [problems][points]
//   results     distance, fp32 [problems][points] (written only with KVQ_PUSH_DISTANCE)
// After the first range, the best centroid so far is read back from dst and its distance computed
// again by the same operations, so splitting the clusters changes no result.
// Invocation: one point of one problem.
#include "shaders/common.glsl"
#include "shaders/kmeans.glsl"

float kvq_km_distance(uint x, uint mu, uint dims) {
  precise float sum = 0.0;
  for (uint i = 0u; i < dims; i++) sum = kvq_distance_step(sum, uintBitsToFloat(src[x + i]), uintBitsToFloat(fixed1[mu + i]));
  return sum;
}

void main() {
  uint i = kvq_invocation();
  uint points = KVQ_KM_POINTS, dims = KVQ_KM_DIMS;
  if (i >= KVQ_KM_PROBLEMS * points) return;
  uint x = i * dims, mu = i / points * KVQ_KM_CLUSTERS * dims, best = 0u;
  float best_d = 0.0;
  if (pc.range_first > 0u) {
    best = dst[i];
    best_d = kvq_km_distance(x, mu + best * dims, dims);
  }
  for (uint j = pc.range_first; j < pc.range_first + pc.count; j++) {
    float sum = kvq_km_distance(x, mu + j * dims, dims);
    if (kvq_nearer(j, sum, best_d) != 0u) {
      best = j;
      best_d = sum;
    }
  }
  dst[i] = best;
  if ((pc.flags & KVQ_PUSH_DISTANCE) != 0u) results[i] = floatBitsToUint(best_d);
}
