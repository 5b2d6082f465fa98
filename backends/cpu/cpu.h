/*
 * The CPU reference backend: plain scalar C, one file per method, readable against the papers.
 * It implements every job; its outputs are the truth the other backends are compared with.
 * Codes follow core/quantize_math.h and the orders documented in docs/FORMAT.md exactly; scores,
 * softmax and weighted sums accumulate in double so that the reference is as close to exact as
 * the stored codes allow.
 */
#ifndef KVQ_BACKENDS_CPU_CPU_H
#define KVQ_BACKENDS_CPU_CPU_H

#include <stdint.h>

#include "backends/backend.h"
#include "core/bytes.h"

struct kvq_buffer {
  kvq_buffer_base base; /* first: the owner (backends/backend.h) */
  uint8_t *data;
  uint64_t size;
};

/* The backend: a workspace of one page of one kv head in fp32, allocated when the backend starts,
 * so that QUANTIZE (the only job that changes a cache) never fails for lack of host memory. */
typedef struct cpu_backend {
  kvq_backend base;
  float *page_workspace; /* KVQ_MAX_PAGE_SIZE * KVQ_MAX_HEAD_DIM floats */
} cpu_backend;

/* The view of one kv head's block of one page that method code works on. */
typedef struct cpu_head {
  const kvq_side_desc *side;
  const float *fixed[KVQ_SIDE_FIXED]; /* host pointers of side->fixed[] (NULL if absent) */
  uint32_t kv_head;                   /* which kv head's block the call works on (per-head codebooks) */
} cpu_head;

/*
 * What each method provides. `x` points at token 0, channel 0 of one kv head of fp32 tokens; token t
 * starts at x + t * token_stride.
 */
typedef struct cpu_method {
  /* Encode n (1..P) tokens into a zeroed head block. */
  void (*encode)(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block);
  /* Reconstruct token t of a head block into out[head_dim]. */
  void (*decode)(const cpu_head *h, const uint8_t *block, uint32_t t, float *out);
  /* Optional (keys): per-query preprocessing into prepared[kvq_prepared_floats()]. */
  void (*prepare)(const cpu_head *h, const float *q, float *prepared);
  /* Optional (keys): q . k_t for the first n tokens of a block, into dots[n]; when absent the
   * generic path decodes each key and takes the dot product. */
  void (*dot_page)(const cpu_head *h, const uint8_t *block, uint32_t n, const float *q, const float *prepared,
                   double *dots);
  /* Optional: methods that decode into a rotated space map a decoded vector back (in place is not
   * allowed); applied once per output row of a weighted sum and to dequantized tokens. */
  void (*unrotate)(const cpu_head *h, const float *in, float *out);
  /* Optional (values summed by code): add the first n tokens' probabilities p[t] into a per-code
   * mass of kvq_code_mass_size() doubles, and turn a mass into the output vector. */
  void (*gather)(const cpu_head *h, const uint8_t *block, uint32_t n, const float *p, double *mass);
  void (*spread)(const cpu_head *h, const double *mass, double *out);
} cpu_method;

extern const cpu_method kvq_cpu_exact;
extern const cpu_method kvq_cpu_qjl;
extern const cpu_method kvq_cpu_uniform;
extern const cpu_method kvq_cpu_kivi;
extern const cpu_method kvq_cpu_polar;
extern const cpu_method kvq_cpu_cq;

const cpu_method *kvq_cpu_method(uint32_t layout_method);
cpu_head kvq_cpu_head(const kvq_side_desc *side);

/* KVQ_ERROR_INVALID_ARGUMENT with a message, for a job or buffer of another backend. */
kvq_status kvq_cpu_foreign(kvq_backend *b);
#define KVQ_CPU_OWNS(b, side, ...)                                                                               \
  do {                                                                                                             \
    kvq_buffer *const owned_[] = {__VA_ARGS__};                                                                    \
    if (!kvq_buffers_owned((b), (side), owned_, (unsigned)(sizeof owned_ / sizeof owned_[0])))                     \
      return kvq_cpu_foreign(b);                                                                                   \
  } while (0)

/* The jobs (cpu_jobs.c, cpu_attention.c). */
kvq_status kvq_cpu_quantize(kvq_backend *b, const kvq_job_quantize *job);
kvq_status kvq_cpu_dequantize(kvq_backend *b, const kvq_job_dequantize *job);
kvq_status kvq_cpu_prepare(kvq_backend *b, const kvq_job_prepare *job);
kvq_status kvq_cpu_score(kvq_backend *b, const kvq_job_attention *job);
kvq_status kvq_cpu_softmax(kvq_backend *b, const kvq_job_attention *job);
kvq_status kvq_cpu_weighted_sum(kvq_backend *b, const kvq_job_attention *job);

kvq_status kvq_cpu_kmeans_assign(kvq_backend *b, const kvq_job_kmeans *job);
kvq_status kvq_cpu_kmeans_update(kvq_backend *b, const kvq_job_kmeans *job);

/* The nearest of `clusters` centroids (core/quantize_math.h: kvq_distance_step, kvq_nearer, the
 * rule CQ's codes are decided by), its squared distance in *distance if not NULL. */
uint32_t kvq_cpu_nearest(const float *x, const float *centroids, uint32_t clusters, uint32_t dims, float *distance);

kvq_status kvq_cpu_backend_create(kvq_backend **out, char *why, size_t why_size);

#endif
