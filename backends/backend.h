/*
 * The backend interface: what core asks of a backend, and nothing else. Core plans every public call
 * into the jobs below; a backend owns its memory and runs jobs on it. Core never includes a backend
 * and backends never include each other; backends/registry.c is the only place that names them.
 *
 * Versioning: a backend fills kvq_backend_ops.abi_version with KVQ_BACKEND_ABI_VERSION; core refuses
 * a table of another version. Fields are only appended.
 *
 * Memory model: kvq_buffer is memory owned by one backend (host memory for the CPU backend, device
 * memory for GPU backends), created zero-filled by buffer_create and moved with write/read/copy/zero.
 * Offsets are bytes. Host arrays passed inside a job (sequence views, page lists) are read before the job
 * call returns; the backend must copy what it needs later.
 *
 * Synchronization model: a job or buffer call may return with its work still in flight. Work runs in
 * submission order. buffer_read returns only once the data is on the host; finish() waits for all
 * submitted work. Core calls finish() before a public call returns results to the caller, and ends
 * the per-step calls with end_deferred (below): one submission per call where a backend batches.
 *
 * Errors: every call returns a kvq_status; on failure the backend writes a sentence to
 * backend->message. Device loss is KVQ_ERROR_DEVICE_LOST, device memory exhaustion
 * KVQ_ERROR_DEVICE_MEMORY. A backend never aborts.
 */
#ifndef KVQ_BACKENDS_BACKEND_H
#define KVQ_BACKENDS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "kvq/kvq.h"

#define KVQ_BACKEND_ABI_VERSION 7u

typedef struct kvq_backend kvq_backend;
typedef struct kvq_buffer kvq_buffer;

/*
 * What every backend's struct kvq_buffer begins with (its first member, named `base`): the backend
 * that created or imported it. Each backend defines the rest of the struct; before it treats a
 * buffer as its own it checks the owner (kvq_buffer_owned), so that a buffer handed to the wrong
 * backend is refused with KVQ_ERROR_INVALID_ARGUMENT instead of being read as another layout.
 */
typedef struct kvq_buffer_base {
  const kvq_backend *owner;
} kvq_buffer_base;

/* 1 when `buffer` is NULL (nothing to check) or belongs to `backend`. */
static inline int kvq_buffer_owned(const kvq_backend *backend, const kvq_buffer *buffer) {
  return !buffer || ((const kvq_buffer_base *)(const void *)buffer)->owner == backend;
}

/* Caller memory of any kind, as a tensor names it (kvq_tensor_memory): a pointer for pointer kinds
 * (host, CUDA device memory), a handle for handle kinds (a VkBuffer); the other is NULL / 0. */
typedef struct kvq_device_memory {
  kvq_memory kind;
  void *pointer;
  uint64_t handle;
} kvq_device_memory;

/* One side (keys or values) of one layer as jobs see it. */
typedef struct kvq_side_desc {
  kvq_side_layout layout;
  kvq_buffer *fixed[KVQ_SIDE_FIXED]; /* matrices and codebooks (core/config.h says which), fp32; or NULL */
  double qjl_constant;                   /* QJL: c_d for this head_dim */
} kvq_side_desc;

/* 1 when every buffer in `buffers` (NULL entries allowed) and the side's fixed arrays belong to
 * `backend` (side may be NULL). */
static inline int kvq_buffers_owned(const kvq_backend *backend, const kvq_side_desc *side, kvq_buffer *const *buffers,
                                    unsigned count) {
  for (unsigned i = 0; i < count; i++)
    if (!kvq_buffer_owned(backend, buffers[i])) return 0;
  for (int i = 0; side && i < KVQ_SIDE_FIXED; i++)
    if (!kvq_buffer_owned(backend, side->fixed[i])) return 0;
  return 1;
}

/* ---- Jobs ------------------------------------------------------------------------------------ */

typedef enum kvq_job_kind {
  KVQ_JOB_QUANTIZE = 0,      /* encode pages from full-precision tokens */
  KVQ_JOB_DEQUANTIZE = 1,    /* decode pages to fp32 */
  KVQ_JOB_PREPARE_QUERY = 2, /* per-method query preprocessing (QJL: S q) */
  KVQ_JOB_SCORE = 3,         /* scaled logits of queries against pages and window */
  KVQ_JOB_SOFTMAX = 4,       /* masked, numerically stable softmax of logit rows */
  KVQ_JOB_WEIGHTED_SUM = 5,  /* probabilities times values */
  KVQ_JOB_ATTENTION = 6,     /* fused score + softmax + weighted sum (optional) */
  KVQ_JOB_KMEANS_ASSIGN = 7, /* nearest centroid of every point (codebook learning) */
  KVQ_JOB_KMEANS_UPDATE = 8, /* weighted mean of every cluster's points */
  KVQ_JOB_KIND_COUNT
} kvq_job_kind;

/* Encode one page: `tokens` valid tokens ([tokens][kv_heads][head_dim] in the input dtype, contiguous)
 * from src at src_offset, into the page image at dst_offset (side.layout.page_bytes). */
typedef struct kvq_quantize_item {
  kvq_buffer *src;
  uint64_t src_offset;
  uint64_t dst_offset;
  uint32_t tokens; /* 1 .. page_size; the rest of the page is written as zeros */
} kvq_quantize_item;

typedef struct kvq_job_quantize {
  const kvq_side_desc *side;
  kvq_dtype input_dtype;
  kvq_buffer *dst;                 /* the layer's page pool for this side */
  uint32_t count;
  const kvq_quantize_item *items;  /* host array */
  /* Optional (NULL: not wanted), for the Q-Hitter policy: fp32 [count][page_size][kv_heads], the
   * quantization error ||x - x^||_2 of every valid token and kv head, x^ being what DEQUANTIZE
   * returns for it (in any summation order: policy decisions need not agree at near-ties). */
  kvq_buffer *errors;
  /* Optional (NULL: the job always runs), only for backends with KVQ_BACKEND_IF_CLEAR: the job writes
   * nothing (pages, errors) when the 32-bit word at if_clear/if_clear_offset (bytes, a multiple of
   * 4) is not zero when the job runs, as the device checks of an append recorded before it leave
   * it (core/append.c). */
  kvq_buffer *if_clear;
  uint64_t if_clear_offset;
} kvq_job_quantize;

/* Decode whole pages: page slots[i] of `pages` -> out[i][page_size][kv_heads][head_dim] fp32 at
 * out_offset. Tokens beyond a page's valid count decode from its zero padding. */
typedef struct kvq_job_dequantize {
  const kvq_side_desc *side;
  kvq_buffer *pages;
  uint32_t count;
  const uint32_t *slots;           /* host array */
  kvq_buffer *out;
  uint64_t out_offset;
} kvq_job_dequantize;

/* Query preprocessing: rows fp32 vectors of head_dim at queries/q_offset -> rows vectors of
 * kvq_prepared_floats(side) floats at out/out_offset. Rows are [position][query head]: row r belongs
 * to query head r % query_heads, whose kv head is that / (query_heads / kv_heads). */
typedef struct kvq_job_prepare {
  const kvq_side_desc *keys;
  uint32_t query_heads;
  uint32_t rows;
  kvq_buffer *queries;
  uint64_t q_offset;
  kvq_buffer *out;
  uint64_t out_offset;
} kvq_job_prepare;

/* One sequence in an attention batch. Its n = quantized + window token slots are: slots
 * [0, quantized) in its pages, slot t in page page_slots[page_first + t / P] at index t % P (the last
 * page may be partial), then the window: slot quantized + w is the token at position
 * window_first + w, in ring slot (window_first + w) % ring_capacity. Page k of the sequence holds
 * positions page_index[page_first + k] * P + i, and its token i is kept iff bit i % 32 of
 * page_alive[(page_first + k) * alive_words + i / 32] is set; a slot that is not kept is masked
 * like a future token (logit -inf, probability 0). Window tokens are always kept. */
typedef struct kvq_attention_seq {
  uint32_t page_first;
  uint32_t quantized;
  uint32_t window;
  uint32_t window_first;
  uint32_t ring_capacity;
  uint64_t ring_offset;   /* byte offset of this sequence's ring in key_ring / value_ring */
  uint32_t query_first;   /* first query row of the batch (row = one position, all query heads) */
  uint32_t query_count;   /* rows of this sequence in the batch */
  uint32_t query_position; /* causal mask: row r sits at position query_position + r and sees the
                              tokens at positions <= it */
  uint32_t mask;          /* kvq_mask */
  uint64_t score_offset;  /* element offset of its scores [nq][query_heads][n] in `scores` */
  uint64_t accumulate_offset; /* element offset of its n sums in `accumulate` */
} kvq_attention_seq;

/* An attention job's metadata packed by core (core/gpu_meta.c) in the layout of core/gpu_plan.h,
 * for backends with KVQ_BACKEND_CORE_META: the whole image, and the word ranges that differ from the
 * image core packed before it (serial - 1); `whole`: take every word (the layout moved). The image
 * lives in core from one job to the next, updated where page tables changed, so a backend that keeps
 * the previous image on its device uploads only the changed ranges. */
typedef struct kvq_meta_range {
  uint32_t first, count; /* words */
} kvq_meta_range;
typedef struct kvq_attention_meta {
  const uint32_t *words;
  uint64_t count;
  const kvq_meta_range *changed;
  uint32_t changed_count;
  int whole;
  uint64_t serial; /* from 1, one per packed job of the context */
} kvq_attention_meta;

/* SCORE, SOFTMAX, WEIGHTED_SUM and ATTENTION all take this description; each reads what it needs.
 * queries: fp32 [rows][query_heads][head_dim]; prepared: fp32 [rows][query_heads][prepared floats];
 * scores: fp32 logits (SCORE writes, masked entries -inf), turned into probabilities in place by
 * SOFTMAX (masked entries 0); output: fp32 [rows][query_heads][head_dim] (WEIGHTED_SUM, ATTENTION). */
typedef struct kvq_job_attention {
  const kvq_side_desc *keys;
  const kvq_side_desc *values;
  uint32_t query_heads;
  kvq_dtype window_dtype;
  float scale;                     /* 1 / sqrt(head_dim) */
  uint32_t seq_count;
  const kvq_attention_seq *seqs;   /* host array */
  const uint32_t *page_slots;      /* host array */
  const uint32_t *page_index;      /* host array parallel to page_slots: logical page numbers */
  const uint32_t *page_alive;      /* host array: alive_words kept-token masks per page */
  uint32_t alive_words;            /* ceil(P / 32) */
  kvq_buffer *key_pages, *value_pages;
  kvq_buffer *key_ring, *value_ring;
  kvq_buffer *queries, *prepared, *scores, *output;
  /* Optional (NULL: not wanted), for the H2O and Q-Hitter policies: SOFTMAX (and a fused ATTENTION)
   * write, for every sequence and slot t, the sum over its query rows and query heads of the
   * probability of t, fp32, at accumulate_offset + t. */
  kvq_buffer *accumulate;
  /* Optional (NULL: the backend packs the metadata from the host arrays above): core's packed
   * metadata (KVQ_BACKEND_CORE_META); then page_slots, page_index and page_alive are NULL and the
   * sequences' page_first are those of the packed image. */
  const kvq_attention_meta *meta;
} kvq_job_attention;

/* Independent k-means problems of the same size, for codebook learning. ASSIGN writes, for every
 * point, the index of its nearest centroid (squared Euclidean distance summed over dims in order,
 * each difference and square rounded on its own; ties go to the lower index) and that distance.
 * UPDATE replaces every centroid by the weighted mean of its points; a centroid without points (or
 * with zero total weight) stays as it is. */
typedef struct kvq_job_kmeans {
  uint32_t problems, points, dims, clusters;
  kvq_buffer *data;       /* fp32 [problems][points][dims] */
  kvq_buffer *weights;    /* fp32 [points], shared by the problems; NULL for weight 1 */
  kvq_buffer *centroids;  /* fp32 [problems][clusters][dims] */
  kvq_buffer *assignment; /* u32 [problems][points] */
  kvq_buffer *distance;   /* fp32 [problems][points] (ASSIGN; may be NULL) */
} kvq_job_kmeans;

/* What a backend moved and submitted since it was created or its counters were last reset (the
 * optional stats op): an internal interface for tests and kvq-bench, not part of the API. Bytes
 * count host<->device traffic only: staging uploads, writes into host-visible metadata, readbacks;
 * device-to-device copies are not counted. A backend without a device (CPU) has no stats op. */
typedef struct kvq_backend_stats {
  uint64_t submissions;     /* queue submissions (vkQueueSubmit calls) */
  uint64_t waits;           /* host waits for submitted work (fence waits) */
  uint64_t bytes_to_device; /* host -> device */
  uint64_t bytes_to_host;   /* device -> host */
  /* A recording that outgrew a resource of its command buffer (Vulkan): overflow staging buffers it
   * took, and steps to the next descriptor pool of the chain (tests check their calls outgrew them) */
  uint64_t staging_overflows;
  uint64_t pool_steps;
  /* Of those overflow staging buffers, the ones allocated: the others were spare ones, kept from
   * earlier recordings (Vulkan: KVQ_VK_SPARE_STAGES) */
  uint64_t staging_allocations;
} kvq_backend_stats;

/* Caller tensors in place: one strided rank-3 tensor (elements at offset + i0 strides[0] + i1
 * strides[1] + i2 strides[2], in elements of dtype) copied to another of the same shape, converting
 * dtype (fp32 exactly; fp32 to fp16/bf16 rounding half to even; equal dtypes copy the bits), with
 * checks into the 32-bit flag word at flags/flag_offset (bytes, a multiple of 4):
 *   KVQ_JOB_CONVERT_FINITE: a non-finite source element sets bit 1 and is written as 0;
 *   KVQ_JOB_CONVERT_FITS:   a non-finite element, or one the destination dtype rounds to infinity,
 *                           sets bit 2;
 *   KVQ_JOB_CONVERT_NO_WRITE: checks only; KVQ_JOB_CONVERT_IF_CLEAR: writes nothing when the flag
 *                           word is not zero (as a dispatch recorded earlier left it);
 *   KVQ_JOB_CONVERT_MASKED: with FITS, -infinity passes (masked logits of kvq_scores).
 * Elements of the destination the shape does not reach (gaps between strided rows) are unchanged.
 * Indices are 32-bit: the backend refuses (KVQ_ERROR_UNSUPPORTED) what lies beyond. */
enum {
  KVQ_JOB_CONVERT_FINITE = 1u,
  KVQ_JOB_CONVERT_FITS = 2u,
  KVQ_JOB_CONVERT_NO_WRITE = 4u,
  KVQ_JOB_CONVERT_IF_CLEAR = 8u,
  KVQ_JOB_CONVERT_MASKED = 16u
};
typedef struct kvq_tensor_place {
  kvq_buffer *buffer;
  kvq_dtype dtype;
  uint64_t offset;     /* elements */
  int64_t strides[3];  /* elements */
} kvq_tensor_place;
typedef struct kvq_job_convert {
  uint32_t shape[3];
  kvq_tensor_place src, dst;
  uint32_t checks;     /* KVQ_JOB_CONVERT_* */
  kvq_buffer *flags;   /* NULL when checks is 0 */
  uint64_t flag_offset;
} kvq_job_convert;

/* The per-method range checks core makes of appended host tokens (core/token_check.c: what the side's
 * method can store: EXACT's fp16/bf16 storage, QJL's fp16 norms, UNIFORM's fp16 minimum and scale,
 * KIVI's |x| <= 32752, PolarQuant's radii), for tokens an append gathered on the device: `count`
 * tokens [count][kv_heads][head_dim] of `dtype` at src/src_offset (bytes, a multiple of the dtype's
 * size); any (token, kv head) vector the method cannot store sets KVQ_JOB_CHECK_RANGE in the flag
 * word at flags/flag_offset. Elements are assumed finite (CONVERT checked them). */
enum { KVQ_JOB_CHECK_RANGE = 32u };
typedef struct kvq_job_token_check {
  const kvq_side_desc *side;
  kvq_dtype dtype;
  kvq_buffer *src;
  uint64_t src_offset;
  uint32_t count;
  kvq_buffer *flags;
  uint64_t flag_offset;
} kvq_job_token_check;

/* ---- The table ------------------------------------------------------------------------------- */

typedef struct kvq_backend_ops {
  uint32_t abi_version;
  const char *name;
  void (*destroy)(kvq_backend *backend);
  /* Whether this backend can run a job kind on a side layout (values for WEIGHTED_SUM, keys else;
   * ATTENTION checks both via keys and values). Core falls back to the CPU path never: a backend
   * must support every non-fused job of every layout it accepts at cache creation. */
  int (*supports)(const kvq_backend *backend, kvq_job_kind kind, const kvq_side_layout *keys,
                  const kvq_side_layout *values);

  kvq_status (*buffer_create)(kvq_backend *backend, uint64_t bytes, kvq_buffer **out); /* zero-filled */
  void (*buffer_destroy)(kvq_backend *backend, kvq_buffer *buffer);
  kvq_status (*buffer_write)(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, const void *src,
                             uint64_t bytes);
  kvq_status (*buffer_read)(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, void *dst, uint64_t bytes);
  kvq_status (*buffer_copy)(kvq_backend *backend, kvq_buffer *dst, uint64_t dst_offset, kvq_buffer *src,
                            uint64_t src_offset, uint64_t bytes);
  kvq_status (*buffer_zero)(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, uint64_t bytes);

  kvq_status (*quantize)(kvq_backend *backend, const kvq_job_quantize *job);
  kvq_status (*dequantize)(kvq_backend *backend, const kvq_job_dequantize *job);
  kvq_status (*prepare_queries)(kvq_backend *backend, const kvq_job_prepare *job);
  kvq_status (*score)(kvq_backend *backend, const kvq_job_attention *job);
  kvq_status (*softmax)(kvq_backend *backend, const kvq_job_attention *job);
  kvq_status (*weighted_sum)(kvq_backend *backend, const kvq_job_attention *job);
  kvq_status (*attention)(kvq_backend *backend, const kvq_job_attention *job); /* NULL if not fused */
  kvq_status (*kmeans_assign)(kvq_backend *backend, const kvq_job_kmeans *job);
  kvq_status (*kmeans_update)(kvq_backend *backend, const kvq_job_kmeans *job);

  kvq_status (*finish)(kvq_backend *backend);

  /* Optional (NULL: the backend takes host tensors only). Wraps caller-owned memory of a kind the
   * backend owns (a VkBuffer handle for Vulkan, a device pointer for CUDA) of at least `bytes` as a
   * buffer that write/read/copy accept; buffer_destroy then frees the wrapper, never the memory.
   * Memory of another kind is refused (KVQ_ERROR_INVALID_ARGUMENT). */
  kvq_status (*buffer_import)(kvq_backend *backend, const kvq_device_memory *memory, uint64_t bytes, kvq_buffer **out);

  /* Optional (NULL: no device clock). The device time, in ns, that the work submitted since the
   * previous call took, measured by the device's timestamps (kvq-bench prints it next to wall time). */
  kvq_status (*device_time)(kvq_backend *backend, uint64_t *ns);

  /* Optional (NULL: no counters). The counters since creation or the last reset (`reset` non-zero:
   * zero them after reading). */
  void (*stats)(kvq_backend *backend, kvq_backend_stats *out, int reset);

  /* Optional (NULL: every call completes its work before returning). Brackets one public call:
   * after defer, jobs and buffer operations may record their work without submitting it (reads and
   * finish still return with the data on the host); end_deferred submits what is recorded, waiting
   * for it when `wait` is set, else leaving it in flight (finish, a read or the next operation that
   * needs the queue waits for it). Core calls them through kvq_call_begin / kvq_call_end. */
  void (*defer)(kvq_backend *backend);
  kvq_status (*end_deferred)(kvq_backend *backend, int wait);

  /* Optional (NULL: caller device tensors are staged through host memory, core/tensor_device.c).
   * The CONVERT job above, on buffers of this backend (imported caller buffers included). */
  kvq_status (*convert)(kvq_backend *backend, const kvq_job_convert *job);

  /* Optional (NULL: device keys and values are staged through host memory and checked there). The
   * range checks of device tokens above. */
  kvq_status (*check_tokens)(kvq_backend *backend, const kvq_job_token_check *job);

  /* Optional (NULL: core reads with buffer_read). buffer_read whose bytes may reach dst only when the
   * work recorded so far is next waited for (a later buffer_read, finish, or end_deferred with wait),
   * so that reads a call needs only at its end share the call's one submission (Q-Hitter's
   * quantization errors, core/append.c) instead of each taking its own. dst must stay valid until
   * then; a wait that fails, or a failed call here, leaves it unwritten. Outside a deferred call the
   * bytes are on the host when it returns, as with buffer_read. */
  kvq_status (*buffer_read_later)(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, void *dst, uint64_t bytes);

  /* Optional (NULL: the backend runs each operation as it is issued, so there is nothing to drop).
   * For backends with KVQ_BACKEND_RECORDS: drops the work recorded since the last submission without
   * running any of it, as a failed submission would: buffer_read_later's destinations stay unwritten
   * (the caller may free them once it returns), buffers destroyed meanwhile are freed, and buffers
   * created meanwhile are still zero-filled before their first use (buffer_create's contract). Work
   * submitted earlier in the call (a read, finish, or, in a call deferred in parts, the staging space
   * running out) is not undone. Core calls it when a deferred call fails (kvq_call_discard), so that a failed call
   * does not run what it recorded before it failed. */
  void (*discard)(kvq_backend *backend);

  /* Optional (NULL: core calls defer). As defer, for a call that may be submitted part way where a
   * resource of the backend's recording runs out (staging memory), because a failure after such a
   * submission leaves nothing of the caller's changed: the calls that make a new cache (create,
   * load) and the save, which only reads. After defer, a backend with KVQ_BACKEND_RECORDS submits
   * nothing before end_deferred but reads and finish (it grows what the recording needs instead),
   * so that discard drops the whole failed call. */
  void (*defer_parts)(kvq_backend *backend);
} kvq_backend_ops;

/* What a backend can do beyond the table (kvq_backend.features; a backend allocated zero-filled has
 * none). KVQ_BACKEND_IF_CLEAR: its QUANTIZE honours kvq_job_quantize.if_clear, which, with CONVERT's
 * KVQ_JOB_CONVERT_IF_CLEAR for the window writes and page clearing, lets core record an append of
 * device tokens behind its checks in one submission, a refused append writing nothing (core/append.c);
 * without it core reads the checks back before the append changes anything, a submission of its own. */
enum { KVQ_BACKEND_IF_CLEAR = 1u };
/* KVQ_BACKEND_CORE_META: its attention jobs take core's packed metadata (kvq_job_attention.meta),
 * which core keeps up to date as page tables change instead of listing every page every call. */
enum { KVQ_BACKEND_CORE_META = 2u };
/* KVQ_BACKEND_RECORDS: in a deferred call its buffer operations and jobs are recorded and run only
 * when submitted (end_deferred, a read, finish); a failed submission runs none of them, and a failed
 * call drops them (discard, which such a backend has). Without it
 * each runs as it is issued (in stream order), so a call that fails part way has done what came
 * before: core then undoes in-place writes itself (the window, core/append.c). */
enum { KVQ_BACKEND_RECORDS = 4u };
/* KVQ_BACKEND_WRITE_COPIES: its buffer_write has read all of src when it returns (copied into staging
 * memory or into the buffer), even where the work stays in flight (asynchronous mode), so core may
 * pass a caller's host tensor to it in place: kvq.h promises that host tensors may be reused as soon
 * as a call returns. Without it (CUDA: cudaMemcpyAsync reads page-locked host memory after it
 * returns) core hands it a copy of its own in asynchronous mode (core/append.c). */
enum { KVQ_BACKEND_WRITE_COPIES = 8u };

struct kvq_backend {
  const kvq_backend_ops *ops;
  kvq_backend_kind kind;
  char device[256];  /* what it runs on, for kvq info */
  char message[512]; /* the last failure, in words */
  uint32_t features; /* KVQ_BACKEND_* bits */
  /* What the backend can hold, set when it is created, so that core refuses a cache or a call that
   * cannot fit before it allocates anything (core/memory_limits.c): the memory its buffers come from (the
   * device's memory; the host's for the CPU backend) and the largest single buffer. 0: not known, not
   * checked. */
  uint64_t memory_bytes;
  uint64_t max_buffer_bytes;
};

/* ---- Registry (backends/registry.c) ---------------------------------------------------------- */

/* Creates a backend of a concrete kind (not AUTO). On failure writes why to `why`. */
kvq_status kvq_backend_create(kvq_backend_kind kind, const kvq_context_options *options, kvq_backend **out,
                              kvq_availability *availability, char *why, size_t why_size);

/* Probes availability without keeping a backend. */
void kvq_backend_probe(kvq_backend_kind kind, kvq_backend_info *info);

#endif /* KVQ_BACKENDS_BACKEND_H */
