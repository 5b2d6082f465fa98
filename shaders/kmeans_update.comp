#version 450
#extension GL_GOOGLE_include_directive : require
// KMEANS_UPDATE over points [range_first, range_first + count) (shaders/kmeans.glsl): component k of centroid j of
// problem p becomes the weighted mean of component k of the points assigned to j; a centroid without
// points, or whose points weigh 0 in all, keeps its value. As in the CPU reference, an assignment
// beyond the clusters counts for cluster 0. Bindings:
//   src     data, fp32 [problems][points][dims]
//   fixed0  weights, fp32 [points], shared by the problems (read only with KVQ_PUSH_WEIGHTS, else 1)
//   dst     assignment, u32 [problems][points] (what KMEANS_ASSIGN wrote there)
//   results     centroids, fp32 [problems][clusters][dims], read and written
//   pages   the running sums of every centroid value between ranges, 4 fp32 words each (a job of
//           one range binds none)
// The CPU reference sums in double; here the sums are fp32 pairs, compensated (Neumaier), which
// carry about twice fp32's precision, so the means come out close to the CPU's: not bit for bit
// (learned centroids are data, they need not agree between backends), but the closer they are, the
// more often both backends take the same Lloyd steps. Precise and in point order across the ranges,
// so a device always learns the same centroids from the same data.
// Invocation: one (problem, cluster, component), component fastest.
#include "shaders/common.glsl"
#include "shaders/kmeans.glsl"

// (s, c) += x: s + c is the sum, c what rounding s lost (Neumaier's variant of Kahan's summation).
void kvq_km_add(inout float s, inout float c, float x) {
  precise float t = KVQ_FADD(s, x);
  precise float lost = abs(s) >= abs(x) ? KVQ_FADD(KVQ_FSUB(s, t), x) : KVQ_FADD(KVQ_FSUB(x, t), s);
  precise float kept = KVQ_FADD(c, lost);
  s = t;
  c = kept;
}

void main() {
  uint id = kvq_invocation();
  uint points = KVQ_KM_POINTS, dims = KVQ_KM_DIMS, clusters = KVQ_KM_CLUSTERS;
  if (id >= KVQ_KM_PROBLEMS * clusters * dims) return;
  uint k = id % dims, j = id / dims % clusters, p = id / dims / clusters;
  bool weighted = (pc.flags & KVQ_PUSH_WEIGHTS) != 0u;
  float sum = 0.0, sum_lost = 0.0, total = 0.0, total_lost = 0.0;
  if (pc.range_first > 0u) {
    sum = uintBitsToFloat(pages[4u * id]);
    sum_lost = uintBitsToFloat(pages[4u * id + 1u]);
    total = uintBitsToFloat(pages[4u * id + 2u]);
    total_lost = uintBitsToFloat(pages[4u * id + 3u]);
  }
  for (uint t = pc.range_first; t < pc.range_first + pc.count; t++) {
    uint i = p * points + t, a = dst[i];
    if ((a < clusters ? a : 0u) != j) continue;
    float w = weighted ? uintBitsToFloat(fixed0[t]) : 1.0;
    precise float term = KVQ_FMUL(w, uintBitsToFloat(src[i * dims + k]));
    kvq_km_add(sum, sum_lost, term);
    kvq_km_add(total, total_lost, w);
  }
  if (pc.range_first + pc.count < points) {
    pages[4u * id] = floatBitsToUint(sum);
    pages[4u * id + 1u] = floatBitsToUint(sum_lost);
    pages[4u * id + 2u] = floatBitsToUint(total);
    pages[4u * id + 3u] = floatBitsToUint(total_lost);
    return;
  }
  precise float mean_sum = KVQ_FADD(sum, sum_lost), mean_total = KVQ_FADD(total, total_lost);
  if (mean_total > 0.0) results[id] = floatBitsToUint(mean_sum / mean_total);
}
