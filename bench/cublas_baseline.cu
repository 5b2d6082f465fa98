// The cuBLAS fp16 baseline of decode attention (bench/cublas_baseline.h says what it computes).
// Built by nvcc only with the CUDA backend; it has never run on the machine it was written on (no
// GPU there): docs/BENCH.md says so until a GPU run's figures are recorded.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cublas_baseline.h"

namespace {

// Softmax of one column of n fp32 logits (one query head of one sequence) into fp16 probabilities:
// a block per column, maxima and sums reduced in shared memory.
__global__ void softmax_columns(const float *logits, __half *probs, unsigned n) {
  __shared__ float part[256];
  const float *x = logits + (size_t)blockIdx.x * n;
  __half *p = probs + (size_t)blockIdx.x * n;
  float m = -FLT_MAX;
  for (unsigned t = threadIdx.x; t < n; t += blockDim.x) m = fmaxf(m, x[t]);
  part[threadIdx.x] = m;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
    __syncthreads();
  }
  m = part[0];
  __syncthreads();
  float sum = 0;
  for (unsigned t = threadIdx.x; t < n; t += blockDim.x) sum += __expf(x[t] - m);
  part[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = 1.0f / part[0];
  for (unsigned t = threadIdx.x; t < n; t += blockDim.x) p[t] = __float2half(__expf(x[t] - m) * inv);
}

struct buffers {
  __half *k = nullptr, *v = nullptr, *q = nullptr, *p = nullptr;
  float *s = nullptr, *o = nullptr;
  void *flush = nullptr;
  cublasHandle_t handle = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~buffers() {
    cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(p), cudaFree(s), cudaFree(o), cudaFree(flush);
    if (handle) cublasDestroy(handle);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

int cuda_failed(bench_cublas_result *r, cudaError_t e, const char *what) {
  std::snprintf(r->message, sizeof r->message, "cuBLAS baseline: %s: %s", what, cudaGetErrorString(e));
  cudaGetLastError(); // clear it: the kvq calls that follow must not see it
  return e == cudaErrorMemoryAllocation || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? 1 : 2;
}

int cublas_failed(bench_cublas_result *r, cublasStatus_t s, const char *what) {
  std::snprintf(r->message, sizeof r->message, "cuBLAS baseline: %s: cuBLAS status %d", what, (int)s);
  return s == CUBLAS_STATUS_ALLOC_FAILED ? 1 : 2;
}

} // namespace

#define CUDA_OR_FAIL(call, what)                                                                                         \
  do {                                                                                                                   \
    cudaError_t e_ = (call);                                                                                             \
    if (e_ != cudaSuccess) return cuda_failed(result, e_, what);                                                         \
  } while (0)
#define CUBLAS_OR_FAIL(call, what)                                                                                       \
  do {                                                                                                                   \
    cublasStatus_t s_ = (call);                                                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) return cublas_failed(result, s_, what);                                             \
  } while (0)

extern "C" int bench_cublas_decode(const bench_cublas_job *job, bench_cublas_result *result) {
  const size_t n = job->context, d = job->head_dim, hkv = job->kv_heads, g = job->query_heads / job->kv_heads;
  const size_t mats = (size_t)job->batch * hkv; // one (sequence, kv head) per batched GEMM entry
  buffers b;
  CUDA_OR_FAIL(cudaSetDevice(job->device), "cudaSetDevice");
  CUDA_OR_FAIL(cudaMalloc((void **)&b.k, mats * n * d * sizeof(__half)), "cudaMalloc (keys)");
  CUDA_OR_FAIL(cudaMalloc((void **)&b.v, mats * n * d * sizeof(__half)), "cudaMalloc (values)");
  CUDA_OR_FAIL(cudaMalloc((void **)&b.q, mats * g * d * sizeof(__half)), "cudaMalloc (queries)");
  CUDA_OR_FAIL(cudaMalloc((void **)&b.s, mats * g * n * sizeof(float)), "cudaMalloc (logits)");
  CUDA_OR_FAIL(cudaMalloc((void **)&b.p, mats * g * n * sizeof(__half)), "cudaMalloc (probabilities)");
  CUDA_OR_FAIL(cudaMalloc((void **)&b.o, mats * g * d * sizeof(float)), "cudaMalloc (outputs)");
  CUDA_OR_FAIL(cudaMalloc(&b.flush, job->flush_bytes), "cudaMalloc (cold-cache buffer)");
  // Keys and values per (sequence, kv head) as [n][d] (cuBLAS: d x n, column-major, one token a
  // column): each head's chunk gathered once on the host, then copied over and over up to n tokens.
  std::vector<__half> hk((size_t)job->chunk * d), hv((size_t)job->chunk * d);
  for (size_t h = 0; h < hkv; h++) {
    for (size_t t = 0; t < job->chunk; t++) {
      std::memcpy(&hk[t * d], job->keys + (t * hkv + h) * d, d * sizeof(__half));
      std::memcpy(&hv[t * d], job->values + (t * hkv + h) * d, d * sizeof(__half));
    }
    for (size_t s = 0; s < job->batch; s++)
      for (size_t t0 = 0; t0 < n; t0 += job->chunk) {
        const size_t count = n - t0 < job->chunk ? n - t0 : job->chunk, at = ((s * hkv + h) * n + t0) * d;
        CUDA_OR_FAIL(cudaMemcpy(b.k + at, hk.data(), count * d * sizeof(__half), cudaMemcpyHostToDevice), "uploading keys");
        CUDA_OR_FAIL(cudaMemcpy(b.v + at, hv.data(), count * d * sizeof(__half), cudaMemcpyHostToDevice), "uploading values");
      }
  }
  // Queries [batch][query heads][d]: the GQA group of kv head h is heads h g .. h g + g - 1, so entry
  // (s, h) of the batched GEMM finds its g queries at (s hkv + h) g d, a d x g matrix.
  std::vector<__half> hq(mats * g * d);
  for (size_t s = 0; s < job->batch; s++)
    for (size_t i = 0; i < g * hkv * d; i++) hq[s * g * hkv * d + i] = __float2half(job->query[i]);
  CUDA_OR_FAIL(cudaMemcpy(b.q, hq.data(), hq.size() * sizeof(__half), cudaMemcpyHostToDevice), "uploading queries");
  CUBLAS_OR_FAIL(cublasCreate(&b.handle), "cublasCreate");
  CUDA_OR_FAIL(cudaEventCreate(&b.start), "cudaEventCreate");
  CUDA_OR_FAIL(cudaEventCreate(&b.stop), "cudaEventCreate");
  const float scale = 1.0f / sqrtf((float)d), one = 1.0f, zero = 0.0f;
  for (uint32_t i = 0; i < job->warmup + job->samples; i++) {
    CUDA_OR_FAIL(cudaMemset(b.flush, 0, job->flush_bytes), "the cold-cache write");
    CUDA_OR_FAIL(cudaEventRecord(b.start), "cudaEventRecord");
    // logits (n x g, column-major) = scale K^T Q
    CUBLAS_OR_FAIL(cublasGemmStridedBatchedEx(b.handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)g, (int)d, &scale, b.k,
                                              CUDA_R_16F, (int)d, (long long)(n * d), b.q, CUDA_R_16F, (int)d,
                                              (long long)(g * d), &zero, b.s, CUDA_R_32F, (int)n, (long long)(n * g),
                                              (int)mats, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "the logits GEMM");
    softmax_columns<<<(unsigned)(mats * g), 256>>>(b.s, b.p, (unsigned)n);
    CUDA_OR_FAIL(cudaGetLastError(), "the softmax kernel");
    // outputs (d x g) = V P
    CUBLAS_OR_FAIL(cublasGemmStridedBatchedEx(b.handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)d, (int)g, (int)n, &one, b.v,
                                              CUDA_R_16F, (int)d, (long long)(n * d), b.p, CUDA_R_16F, (int)n,
                                              (long long)(n * g), &zero, b.o, CUDA_R_32F, (int)d, (long long)(g * d),
                                              (int)mats, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "the output GEMM");
    CUDA_OR_FAIL(cudaEventRecord(b.stop), "cudaEventRecord");
    CUDA_OR_FAIL(cudaEventSynchronize(b.stop), "waiting for the baseline");
    float ms = 0;
    CUDA_OR_FAIL(cudaEventElapsedTime(&ms, b.start, b.stop), "cudaEventElapsedTime");
    if (i >= job->warmup) result->ms[i - job->warmup] = ms;
  }
  // [batch][kv head][g][d] is [batch][query head][d]
  CUDA_OR_FAIL(cudaMemcpy(result->output, b.o, mats * g * d * sizeof(float), cudaMemcpyDeviceToHost), "reading outputs");
  return 0;
}
