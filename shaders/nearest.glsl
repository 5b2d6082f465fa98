// The nearest-centroid rule of kvq_cpu_nearest (backends/cpu/cpu_kmeans.c), shared by CQ's QUANTIZE
// (methods/cq.glsl) and KMEANS_ASSIGN (kmeans_assign.comp), so that a code learned and a code stored
// are decided alike: the squared distance is summed over the dims in order, each difference, square
// and sum rounded on its own (precise: no FMA contraction, no reordering), and centroid j becomes
// the best when it is the first or its sum is strictly smaller (ties keep the lower index).
//
// Loop bound: llvmpipe (lavapipe) counts the loop trips of a shader invocation, all loops together
// (a loop of n iterations counts n + 1, the halfconv.h loop of every fp16 read at least 1), and
// silently leaves every loop once the count reaches 65535. A search over 2^b centroids of c dims
// counts about 2^b (c + 2), more than that at b = 12, c = 16, so the callers keep their invocations
// to about half of the bound: CQ searches one channel group per invocation, two dims per trip, and
// the host splits KMEANS_ASSIGN's clusters and KMEANS_UPDATE's points into ranges (vk_kmeans.c).

// sum + (x - mu)^2, each operation rounded on its own.
float kvq_distance_step(float sum, float x, float mu) {
  precise float diff = KVQ_FSUB(x, mu);
  precise float square = KVQ_FMUL(diff, diff);
  precise float next = KVQ_FADD(sum, square);
  return next;
}

// Whether centroid j, at squared distance `sum`, replaces the best so far (at `best_d`).
bool kvq_nearer(uint j, float sum, float best_d) { return j == 0u || sum < best_d; }
