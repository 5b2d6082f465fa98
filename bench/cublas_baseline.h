/*
 * The cuBLAS fp16 baseline of decode attention (bench/cublas_baseline.cu, built only with the CUDA
 * backend): the same product kvq's exact fp16 cache computes, as a user of cuBLAS would write it, so
 * that kvq's own fp16 row is judged against a strong implementation. Per sequence and kv head, the
 * keys [n][d] and values [n][d] in fp16: logits = scale K Q^T for the GQA group's g queries (one
 * strided-batched GemmEx, fp16 in, fp32 out and compute), a softmax kernel (fp32 in, fp16
 * probabilities out), outputs = V^T P (GemmEx, fp16 in, fp32 out). Timed by CUDA events around the
 * three launches, after a warm-up, with 256 MiB zero-filled between samples.
 */
#ifndef KVQ_BENCH_CUBLAS_BASELINE_H
#define KVQ_BENCH_CUBLAS_BASELINE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bench_cublas_job {
  int device;                         /* CUDA device ordinal */
  uint32_t batch, kv_heads, query_heads, head_dim, context, chunk;
  const uint16_t *keys, *values;      /* fp16 [chunk][kv_heads][head_dim]: token t is row t % chunk */
  const float *query;                 /* fp32 [query_heads][head_dim], the same for every sequence */
  uint32_t warmup, samples;
  uint64_t flush_bytes;
} bench_cublas_job;

typedef struct bench_cublas_result {
  double *ms;                         /* samples entries: milliseconds by CUDA events */
  float *output;                      /* [batch][query_heads][head_dim] fp32, the last sample's */
  char message[256];                  /* why it failed */
} bench_cublas_result;

/* 0; 1 when the job does not fit (device memory) or no device is there; 2 on a CUDA or cuBLAS
 * failure. The message says which. */
int bench_cublas_decode(const bench_cublas_job *job, bench_cublas_result *result);

#ifdef __cplusplus
}
#endif

#endif
