// KMEANS_ASSIGN and KMEANS_UPDATE on the GPU (backends/backend.h, kvq_job_kmeans): independent
// k-means problems of the same size, all of a job's problems in one launch. The results are the CPU
// reference's bit for bit (backends/cpu/cpu_kmeans.c), so that codebooks (CQ) and tables
// (PolarQuant) learned on a GPU are the CPU's:
//   ASSIGN  the squared distance in float, dims in order, kvq_distance_step (core/quantize_math.h:
//           each difference, square and sum rounded on its own), ties to the lower index (kvq_nearer);
//   UPDATE  the sums in double, in point order, each product w x exact in double (24-bit by 24-bit
//           significands), the mean acc / total in double, rounded once to float; an assignment at or
//           past `clusters` counts for cluster 0; a cluster whose total weight is <= 0 keeps its
//           centroid.
// (The Vulkan shaders sum UPDATE in compensated float pairs, close to the CPU but not bit for bit.)
//
// Buffers, device pointers to the first element (the job's buffers; the host adds any offsets):
//   data        fp32 [problems][points][dims]
//   weights     fp32 [points], shared by the problems, or null for weight 1
//   centroids   fp32 [problems][clusters][dims]   (ASSIGN reads; UPDATE reads and writes)
//   assignment  u32  [problems][points]           (ASSIGN writes; UPDATE reads)
//   distance    fp32 [problems][points], or null  (ASSIGN writes when not null)
// Every size is at least 1; indices are 64-bit inside the kernels, and the host keeps each grid
// within CUDA's 2^31 - 1 blocks (problems * clusters for UPDATE). Correctness first: UPDATE reads
// every assignment of a problem once per cluster (O(clusters * points) reads per problem), and its
// sums are sequential per component, as the CPU's order requires; no GPU has timed them.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_KMEANS_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_KMEANS_CUH

#include "backends/cuda/kernel_lang.cuh"

#include "core/quantize_math.h"

#define KVQ_CUDA_KMEANS_THREADS 128u

// KMEANS_ASSIGN. Launch: grid (ceil(problems * points / KVQ_CUDA_KMEANS_THREADS)), block
// (KVQ_CUDA_KMEANS_THREADS), no dynamic shared memory. Thread i (blockIdx.x * blockDim.x +
// threadIdx.x) takes point i of [problems][points] (problem i / points); threads past problems *
// points do nothing. Writes assignment[i], and distance[i] when distance is not null: nothing else.
__global__ void __launch_bounds__(KVQ_CUDA_KMEANS_THREADS)
    kvq_cuda_kmeans_assign(unsigned problems, unsigned points, unsigned dims, unsigned clusters, const float *__restrict__ data,
                           const float *__restrict__ centroids, unsigned *__restrict__ assignment, float *__restrict__ distance) {
  const unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<unsigned long long>(problems) * points) return;
  const float *x = data + i * dims;
  const float *mu = centroids + i / points * clusters * dims;
  unsigned best = 0u;
  float best_d = 0.0f;
  for (unsigned j = 0; j < clusters; j++, mu += dims) { // kvq_cpu_nearest, line by line
    float sum = 0.0f;
    for (unsigned k = 0; k < dims; k++) sum = kvq_distance_step(sum, x[k], mu[k]);
    if (kvq_nearer(j, sum, best_d)) best = j, best_d = sum;
  }
  assignment[i] = best;
  if (distance) distance[i] = best_d;
}

// KMEANS_UPDATE. Launch: grid (problems * clusters), block (KVQ_CUDA_KMEANS_THREADS) exactly, no
// dynamic shared memory (512 bytes of static shared memory). Block b updates centroid j = b %
// clusters of problem p = b / clusters: its threads test the problem's assignments a tile of
// KVQ_CUDA_KMEANS_THREADS points at a time; thread k (and k + blockDim.x, ... for dims past the
// block) then adds, in point order, the tile's points of cluster j to its component's double sum and
// to its own copy of the total weight (every thread's copy is the same sum in the same order). Writes
// centroids[(p * clusters + j) * dims + k] for every k when the total weight is > 0, nothing else.
__global__ void __launch_bounds__(KVQ_CUDA_KMEANS_THREADS)
    kvq_cuda_kmeans_update(unsigned points, unsigned dims, unsigned clusters, const float *__restrict__ data,
                           const float *__restrict__ weights, const unsigned *__restrict__ assignment, float *__restrict__ centroids) {
  KVQ_SHARED(unsigned, member, KVQ_CUDA_KMEANS_THREADS); // 1: point base + i of the tile is in cluster j
  const unsigned j = blockIdx.x % clusters;
  const unsigned long long p = blockIdx.x / clusters, first = p * points;
  float *mu = centroids + (p * clusters + j) * dims;
  for (unsigned k0 = 0; k0 < dims; k0 += blockDim.x) {
    const unsigned k = k0 + threadIdx.x;
    double acc = 0.0, total = 0.0;
    for (unsigned base = 0; base < points; base += blockDim.x) {
      const unsigned t = base + threadIdx.x;
      unsigned in = 0u;
      if (t < points) {
        const unsigned a = assignment[first + t];
        in = (a < clusters ? a : 0u) == j ? 1u : 0u;
      }
      __syncthreads(); // the previous tile is read by every thread
      member[threadIdx.x] = in;
      __syncthreads();
      const unsigned count = points - base < blockDim.x ? points - base : blockDim.x;
      if (k >= dims) continue;
      for (unsigned e = 0; e < count; e++) {
        if (!member[e]) continue;
        const double w = weights ? static_cast<double>(weights[base + e]) : 1.0;
        acc = __dadd_rn(acc, __dmul_rn(w, static_cast<double>(data[(first + base + e) * dims + k])));
        total = __dadd_rn(total, w);
      }
    }
    if (k < dims && total > 0.0) mu[k] = static_cast<float>(acc / total); // IEEE division, then one rounding
  }
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_KMEANS_CUH
