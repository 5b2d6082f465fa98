/*
 * kvq: compressed key/value caches for transformer inference, and attention computed directly over
 * the compressed cache, on the CPU (the reference), Vulkan and CUDA.
 *
 * This is the only installed header. Everything in it is C11 and stable within a minor version.
 *
 * Ownership: every object kvq creates (context, cache) is owned by the caller until passed to its
 * destroy function; destroy functions accept NULL. kvq never keeps a pointer to caller memory past
 * the call that received it (configs and tensors are copied or consumed before returning).
 *
 * Errors: every fallible function returns a kvq_status. On failure nothing observable changed
 * (no partial appends, no half-written outputs, no sequence created) unless the function says
 * otherwise, and kvq_context_last_error() describes the failure in words. kvq never aborts or exits.
 *
 * Thread safety: functions marked "thread-safe" may be called from any thread at any time. All other
 * functions taking a context, or a cache created from it, must not run concurrently for the same
 * context: use one context per thread, or serialize calls. Different contexts are independent.
 */
#ifndef KVQ_KVQ_H
#define KVQ_KVQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(KVQ_BUILDING_LIBRARY)
#define KVQ_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define KVQ_API __attribute__((visibility("default")))
#else
#define KVQ_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------------- */

/* KVQ_VERSION_MAJOR, _MINOR, _PATCH, KVQ_VERSION_NUMBER (MAJOR * 10000 + MINOR * 100 + PATCH) and
 * KVQ_VERSION_STRING: the header's version, generated from meson.build's one definition. */
#include <kvq/kvq_version.h>

/* The version of the library actually linked (may differ from the header's). Thread-safe. */
KVQ_API unsigned kvq_version_number(void);
/* "MAJOR.MINOR.PATCH" of the linked library; a static string. Thread-safe. */
KVQ_API const char *kvq_version(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes. Values are stable: new codes are only ever appended.
 * ------------------------------------------------------------------------------------------- */

typedef enum kvq_status {
  KVQ_OK = 0,
  KVQ_ERROR_INVALID_ARGUMENT = 1,    /* NULL where an object is required, unknown enum, bad shape */
  KVQ_ERROR_OUT_OF_RANGE = 2,        /* a parameter outside its documented range */
  KVQ_ERROR_DTYPE_MISMATCH = 3,      /* a tensor's dtype differs from what the cache expects */
  KVQ_ERROR_NON_FINITE = 4,          /* NaN/Inf input, or a value the storage format cannot hold */
  KVQ_ERROR_CAPACITY = 5,            /* no free page or sequence slot left */
  KVQ_ERROR_NOT_FOUND = 6,           /* unknown or already freed sequence id */
  KVQ_ERROR_OUT_OF_MEMORY = 7,       /* host memory allocation failed */
  KVQ_ERROR_UNSUPPORTED = 8,         /* valid request that this build or backend cannot serve */
  KVQ_ERROR_BACKEND_UNAVAILABLE = 9, /* backend not built, no loader, or no device */
  KVQ_ERROR_BUFFER_TOO_SMALL = 10,   /* a caller buffer cannot hold the result */
  KVQ_ERROR_IO = 11,                 /* a file could not be opened, read or written */
  KVQ_ERROR_BAD_FORMAT = 12,         /* not a kvq file, or inconsistent content */
  KVQ_ERROR_TRUNCATED = 13,          /* a file or buffer ends early */
  KVQ_ERROR_CHECKSUM = 14,           /* content does not match its checksum */
  KVQ_ERROR_VERSION = 15,            /* a file format version this library cannot read */
  KVQ_ERROR_DEVICE_LOST = 16,        /* the GPU device was lost or hung, or a failed call could not put back
                                        what it had written (its undo's copies failed too: the cache, and
                                        the call's device outputs, may hold part of its work):
                                        destroy the caches and the context */
  KVQ_ERROR_DEVICE_MEMORY = 17,      /* GPU memory exhausted */
  KVQ_ERROR_INTERNAL = 18,           /* a bug in kvq; please report it with the message */
  KVQ_ERROR_NO_CODEBOOK = 19         /* the layer's method needs codebooks: learn or load them first */
} kvq_status;

/* A short English description of a status ("invalid argument"); never NULL. Thread-safe. */
KVQ_API const char *kvq_status_string(kvq_status status);

/* ---------------------------------------------------------------------------------------------
 * Data types and tensors
 * ------------------------------------------------------------------------------------------- */

typedef enum kvq_dtype {
  KVQ_DTYPE_F32 = 0,
  KVQ_DTYPE_F16 = 1,  /* IEEE binary16 */
  KVQ_DTYPE_BF16 = 2  /* bfloat16 */
} kvq_dtype;

/* Where a tensor's elements live, and which field of kvq_tensor names that memory. */
typedef enum kvq_memory {
  KVQ_MEMORY_HOST = 0,          /* data: a host pointer (every backend) */
  KVQ_MEMORY_VULKAN_BUFFER = 1, /* handle: a caller-owned VkBuffer (Vulkan backend only) */
  KVQ_MEMORY_CUDA_DEVICE = 2    /* data: a CUDA device pointer (CUDA backend only) */
} kvq_memory;

#define KVQ_MAX_RANK 4

/*
 * A strided view of caller memory, of any kind: `memory` says what names it, a pointer in `data`
 * (host memory, CUDA device memory) or a handle in `handle` (a VkBuffer); the other field is NULL / 0.
 * Element (i0, i1, ...) lives at byte
 *   offset + sizeof(dtype) * (i0 * strides[0] + i1 * strides[1] + ...)
 * from data, or from the start of the buffer `handle` names. Strides are in elements and must be >= 1.
 * Input tensors are only read; output tensors are written only when the call succeeds.
 * KVQ_MEMORY_HOST works on every backend. KVQ_MEMORY_VULKAN_BUFFER works on a Vulkan context
 * created on the runtime's own device (kvq_context_options.vulkan): handle is a VkBuffer of that
 * device (data is ignored) that covers the tensor's elements, created with STORAGE_BUFFER usage, and
 * TRANSFER_SRC usage for inputs and TRANSFER_DST usage for outputs. kvq_append, kvq_attention,
 * kvq_scores and kvq_dequantize read and write such tensors in place with compute shaders on the
 * context's queue (their finite-value checks run there too: docs/VULKAN.md says how they differ from
 * host tensors'); codebook learning moves them through host memory with transfers. Either way the work is done before the call returns,
 * unless the context is asynchronous (kvq_context_set_async), and nothing is written between strided
 * elements. KVQ_MEMORY_CUDA_DEVICE works on a CUDA context: data is a device pointer (cudaMalloc,
 * or managed memory) of the context's device; kvq moves the elements through host memory with
 * copies on the context's stream (docs/CUDA.md). Either device kind on another backend returns
 * KVQ_ERROR_UNSUPPORTED.
 */
typedef struct kvq_tensor {
  kvq_memory memory;
  void *data;      /* KVQ_MEMORY_HOST, KVQ_MEMORY_CUDA_DEVICE: the memory's address; else NULL */
  uint64_t handle; /* KVQ_MEMORY_VULKAN_BUFFER: the VkBuffer (cast to uint64_t); else 0 */
  uint64_t offset;
  kvq_dtype dtype;
  uint32_t rank;
  int64_t shape[KVQ_MAX_RANK];
  int64_t strides[KVQ_MAX_RANK];
} kvq_tensor;

/* A contiguous row-major host tensor over data (not copied). A rank above KVQ_MAX_RANK is clamped
 * to it (and then refused by calls that expect rank 3). Thread-safe. */
KVQ_API kvq_tensor kvq_tensor_host(void *data, kvq_dtype dtype, uint32_t rank, const int64_t *shape);
/* The same over a caller's VkBuffer (vk_buffer: the VkBuffer cast to uint64_t), element 0 at byte
 * `offset` of it. Thread-safe. */
KVQ_API kvq_tensor kvq_tensor_vulkan(uint64_t vk_buffer, uint64_t offset, kvq_dtype dtype, uint32_t rank,
                                     const int64_t *shape);
/* The same over CUDA device memory (a device pointer). Thread-safe. */
KVQ_API kvq_tensor kvq_tensor_cuda(void *device_pointer, kvq_dtype dtype, uint32_t rank, const int64_t *shape);

/*
 * Converts `count` host numbers from `src` (of `src_dtype`) to `dst` (of `dst_dtype`) as kvq converts
 * tensors: fp32 to fp16 or bf16 rounds to nearest even (overflow gives infinity, NaN stays NaN),
 * widening is exact. Host byte order; src and dst must not overlap unless they are the same pointer
 * with the same dtype. KVQ_ERROR_INVALID_ARGUMENT for an unknown dtype or a NULL pointer with
 * count > 0 (nothing is written). Thread-safe.
 */
KVQ_API kvq_status kvq_convert(const void *src, kvq_dtype src_dtype, void *dst, kvq_dtype dst_dtype, size_t count);

/* ---------------------------------------------------------------------------------------------
 * Backends and contexts
 * ------------------------------------------------------------------------------------------- */

typedef enum kvq_backend_kind {
  KVQ_BACKEND_AUTO = 0,   /* the most capable available: CUDA, then Vulkan on a GPU, then CPU */
  KVQ_BACKEND_CPU = 1,    /* the scalar reference; always available */
  KVQ_BACKEND_VULKAN = 2,
  KVQ_BACKEND_CUDA = 3
} kvq_backend_kind;

typedef enum kvq_availability {
  KVQ_AVAILABLE = 0,
  KVQ_UNAVAILABLE_NOT_BUILT = 1,  /* this kvq was built without the backend */
  KVQ_UNAVAILABLE_NO_LOADER = 2,  /* the runtime library (Vulkan loader, CUDA driver) is missing */
  KVQ_UNAVAILABLE_NO_DEVICE = 3,  /* the runtime is present but reports no usable device */
  KVQ_UNAVAILABLE_ERROR = 4       /* starting it failed; see reason */
} kvq_availability;

typedef struct kvq_backend_info {
  kvq_backend_kind kind;
  const char *name;              /* "cpu", "vulkan", "cuda": static strings */
  kvq_availability availability;
  char reason[256];              /* why it is unavailable; empty when available */
  char device[256];              /* the device it would use; empty when unavailable */
} kvq_backend_info;

/*
 * Lists every backend kvq knows (built or not) with its availability. Writes at most `capacity`
 * entries to `infos` (may be NULL when capacity is 0) and the total count to `*count`.
 * Probing may start a GPU runtime briefly. Thread-safe.
 */
KVQ_API kvq_status kvq_backends_list(kvq_backend_info *infos, size_t capacity, size_t *count);

typedef struct kvq_context kvq_context;

/*
 * A Vulkan device the runtime already has, for kvq to run on instead of creating its own. kvq uses
 * these objects and never destroys them: they must outlive every context and cache built on them.
 * The handles are the runtime's VkInstance, VkPhysicalDevice and VkDevice (cast to void *); the
 * queue (queue_family, queue_index) must support compute, and kvq submits to it from the thread
 * that calls kvq, so the runtime must not use that queue concurrently with a kvq call. The instance
 * must have been created for Vulkan 1.2 or later, through the system's Vulkan loader
 * (libvulkan.so.1): kvq loads its instance and device functions for these objects through that
 * loader, into tables of its own, and never touches the runtime's function pointers. kvq needs no
 * device extension or feature.
 */
typedef struct kvq_vulkan_device {
  void *instance;        /* VkInstance */
  void *physical_device; /* VkPhysicalDevice */
  void *device;          /* VkDevice */
  uint32_t queue_family;
  uint32_t queue_index;
} kvq_vulkan_device;

/*
 * A CUDA device the runtime already uses, for kvq's CUDA backend to run on: kvq enqueues its work on
 * `stream` (the runtime's cudaStream_t, cast to void *; NULL for the legacy default stream) of device
 * `device_ordinal`, in `context` (a CUcontext, cast to void *) or, when NULL, that device's primary
 * context. kvq never destroys them: they must outlive every context and cache built on them. A
 * context of the runtime's own must be of device `device_ordinal` (else kvq_context_create returns
 * KVQ_ERROR_INVALID_ARGUMENT); kvq pushes it onto the calling thread's context stack
 * (cuCtxPushCurrent) around every call that touches CUDA and pops it before returning, so the
 * thread's current context is unchanged after each kvq call; the runtime must not change the current
 * context from inside a kvq call (a callback). kvq does not link libcuda: it gets the two driver
 * functions from the CUDA runtime (cudaGetDriverEntryPointByVersion); a driver without them makes
 * kvq_context_create return KVQ_ERROR_BACKEND_UNAVAILABLE.
 */
typedef struct kvq_cuda_device {
  int32_t device_ordinal;
  void *stream;  /* cudaStream_t */
  void *context; /* CUcontext, or NULL for the primary context */
} kvq_cuda_device;

typedef struct kvq_context_options {
  /* sizeof(kvq_context_options) as the caller was compiled: kvq_context_options_default() sets it, and
   * 0 means this header's size. Lets later versions add members at the end without breaking callers:
   * a library reads only the members it knows, and refuses (KVQ_ERROR_UNSUPPORTED) options from a
   * newer header that set a member it does not know. */
  uint32_t struct_size;
  kvq_backend_kind backend; /* KVQ_BACKEND_AUTO by default */
  int32_t device_index;     /* GPU backends: device to use; -1 picks the most capable */
  /* Vulkan backend only: the runtime's own device (see kvq_vulkan_device), or NULL (the default)
   * for kvq to create its instance and device. Read during kvq_context_create only. */
  const kvq_vulkan_device *vulkan;
  /* CUDA backend only: the runtime's device, stream and context (see kvq_cuda_device), or NULL (the
   * default) for kvq to use device_index's primary context and a stream of its own. Read during
   * kvq_context_create only. At most one of vulkan and cuda may be set, and only for its backend or
   * KVQ_BACKEND_AUTO (which then tries that backend alone). */
  const kvq_cuda_device *cuda;
} kvq_context_options;

/* The defaults: automatic backend, most capable device, struct_size set. Thread-safe. */
KVQ_API kvq_context_options kvq_context_options_default(void);

/*
 * Creates a context on a backend (options may be NULL for the defaults). When the requested backend
 * is unavailable, returns KVQ_ERROR_BACKEND_UNAVAILABLE and sets *out to NULL; kvq_backends_list()
 * says why. KVQ_ERROR_INVALID_ARGUMENT for an unknown backend, a struct_size below this layout's, or a
 * runtime device for another backend (or both); KVQ_ERROR_UNSUPPORTED for options from a newer header
 * that set a member this library does not know; KVQ_ERROR_OUT_OF_RANGE for device_index < -1.
 * Thread-safe.
 */
KVQ_API kvq_status kvq_context_create(const kvq_context_options *options, kvq_context **out);

/*
 * Asynchronous mode. By default (synchronous) every call has finished its device work when it
 * returns. With kvq_context_set_async(context, 1), kvq_append, kvq_flush and kvq_attention may return
 * KVQ_OK with their device work still in flight on the context's queue (the runtime's own queue when
 * the context was created with kvq_context_options.vulkan): one queue submission per call, never
 * waited for by that call, unless the call returns results to host memory (a host output tensor, and
 * the policy statistics that H2O and Q-Hitter read back), where it waits as in synchronous mode.
 * kvq_scores and kvq_dequantize wait for results they return to host memory; into device tensors they
 * are asynchronous like kvq_attention. The CPU backend is always synchronous: the mode is accepted
 * and changes nothing.
 *
 * While a call's work is in flight:
 *   - host tensors it was given may be reused at once (kvq copied what it needs before returning);
 *   - device tensors (VkBuffers) it reads (keys, values, queries) must not be written, and device
 *     tensors it writes (attention outputs) must not be read or written, by the caller or the
 *     runtime's own work, until the work is done: after kvq_context_wait, or, on the context's queue,
 *     by work the runtime submits after the call returned behind a pipeline barrier whose first scope
 *     covers all commands (submission order makes kvq's writes visible to it);
 *   - every call on the context or its caches may be made: a call that uses the device first waits for
 *     the work in flight (at most one call's work is in flight per context), and buffers a destroyed
 *     cache used are freed once that work is done.
 * An error of work in flight (KVQ_ERROR_DEVICE_LOST, a failure the Vulkan validation layer reported in
 * validation runs) is returned by kvq_context_wait, or by the next call that waits for it, with
 * kvq_context_last_error saying what failed. The checks of device tensors that run on the device
 * (KVQ_ERROR_NON_FINITE: a non-finite query, key or value, a key or value its layer's method cannot
 * store, an output that overflows) are returned by kvq_context_wait only, an append with such a device
 * key or value having then taken place (a non-finite element stored as 0; a synchronous append refuses
 * it first); until the wait later calls write
 * no device outputs. Argument errors, capacity
 * and the finite-value checks of host data are still returned by the call itself.
 *
 * kvq_context_set_async returns KVQ_ERROR_INVALID_ARGUMENT for a NULL context; turning the mode off
 * first waits for work in flight, returning its error if it failed. Thread-safety: as any call on the
 * context.
 */
KVQ_API kvq_status kvq_context_set_async(kvq_context *context, int enabled);

/*
 * Waits until every call made on the context has finished its device work: afterwards its outputs
 * may be read and its inputs reused. Returns KVQ_OK at once when nothing is in flight (always, on
 * synchronous contexts and the CPU backend); else the error of the work waited for
 * (KVQ_ERROR_DEVICE_LOST and the others above), with kvq_context_last_error saying what failed.
 * KVQ_ERROR_INVALID_ARGUMENT for a NULL context. Thread-safety: as any call on the context.
 */
KVQ_API kvq_status kvq_context_wait(kvq_context *context);

/*
 * The most memory a cache loaded on this context may take: kvq_cache_load and
 * kvq_cache_load_from_memory refuse, before allocating anything, a file whose configuration's
 * kvq_cache_config_bytes exceeds it (KVQ_ERROR_OUT_OF_RANGE, the message giving both numbers). A
 * saved file's configuration (max_pages, max_sequences, residual_window) is not bounded by the
 * file's size: an empty cache of many gigabytes saves to a few kilobytes, so without a limit a
 * small untrusted file could make kvq reserve up to 2^46 bytes. `max_bytes` 0 (the default)
 * selects the automatic limit, KVQ_LOAD_LIMIT_FLOOR bytes or KVQ_LOAD_LIMIT_PER_FILE_BYTE times the
 * file's size, whichever is larger; UINT64_MAX removes the limit (for trusted files: only the 2^46
 * bytes of kvq_cache_create remain). kvq_codebooks_load loads into an existing cache and reserves
 * nothing the file decides, so it has no limit. KVQ_ERROR_INVALID_ARGUMENT for a NULL context.
 * Thread-safety: as any call on the context.
 */
#define KVQ_LOAD_LIMIT_FLOOR ((uint64_t)256 << 20)
#define KVQ_LOAD_LIMIT_PER_FILE_BYTE 64u
KVQ_API kvq_status kvq_context_set_load_limit(kvq_context *context, uint64_t max_bytes);

/*
 * The device time, in nanoseconds, that the work this context submitted since the previous call took,
 * measured by the device's own timestamps (the first call starts the count). For profiling: kvq-bench
 * prints it next to wall time. KVQ_ERROR_UNSUPPORTED on backends without a device clock (the CPU
 * backend); *ns is left unchanged on failure. Thread-safety: as any call on the context.
 */
KVQ_API kvq_status kvq_context_device_time(kvq_context *context, uint64_t *ns);

/* Destroys a context. Caches created from it stay usable and the context is freed when the last of
 * them is destroyed (do not call kvq_context_last_error on a destroyed context: the caches' errors
 * are still recorded there, but the caller no longer owns it). NULL is ignored. */
KVQ_API void kvq_context_destroy(kvq_context *context);

/* The backend a context runs on (never AUTO). */
KVQ_API kvq_backend_kind kvq_context_backend(const kvq_context *context);

/*
 * The message of the last failed call made with this context or one of its caches ("" if none).
 * The string belongs to the context and is valid until its next call.
 */
KVQ_API const char *kvq_context_last_error(const kvq_context *context);

/* ---------------------------------------------------------------------------------------------
 * Methods and cache configuration
 * ------------------------------------------------------------------------------------------- */

typedef enum kvq_method {
  KVQ_METHOD_EXACT = 0,   /* full precision in exact.dtype: the baseline */
  KVQ_METHOD_QJL = 1,     /* 1-bit quantized JL sketch with outlier channels (keys only) */
  KVQ_METHOD_UNIFORM = 2, /* token-wise asymmetric b-bit quantization in groups of channels */
  KVQ_METHOD_KIVI = 3,    /* channel-wise asymmetric b-bit quantization over groups of tokens (KIVI's keys) */
  KVQ_METHOD_POLAR = 4,   /* PolarQuant: random rotation, recursive polar transform, angle codebooks */
  KVQ_METHOD_CQ = 5       /* Coupled Quantization: c channels share one b-bit code from learned codebooks */
} kvq_method;

typedef struct kvq_exact_config {
  kvq_dtype dtype;                /* storage dtype; values beyond its range are rejected at append */
} kvq_exact_config;

typedef struct kvq_qjl_config {
  uint32_t sketch_dim;            /* m: rows of the inlier sketch; multiple of 32, 32..1024 */
  uint32_t outlier_count;         /* k: outlier channels per (page, kv head); 0..32, < head_dim */
  uint32_t outlier_sketch_dim;    /* m_o: rows of the outlier sketch; multiple of 32, 32..1024 */
} kvq_qjl_config;

typedef struct kvq_uniform_config {
  uint32_t bits;                  /* 1, 2, 3, 4 or 8 */
  uint32_t group_size;            /* G channels per scale/minimum; power of two, 4..256, divides head_dim */
} kvq_uniform_config;

typedef struct kvq_kivi_config {
  uint32_t bits;                  /* 1, 2, 3, 4 or 8 */
  uint32_t group_tokens;          /* tokens per scale/minimum of a channel: a power of two from 4 dividing
                                     page_size, or 0 for the whole page */
} kvq_kivi_config;

typedef enum kvq_rotation {
  KVQ_ROTATION_DENSE = 0,         /* a random orthogonal matrix (QR of a Gaussian matrix) */
  KVQ_ROTATION_HADAMARD = 1       /* H D / sqrt(d): random signs, then a Walsh-Hadamard transform
                                     (head_dim must be a power of two) */
} kvq_rotation;

typedef enum kvq_codebook_source {
  KVQ_CODEBOOK_OFFLINE = 0,       /* Lloyd-Max on the analytic angle densities, built with the cache */
  KVQ_CODEBOOK_ONLINE = 1         /* k-means++ on calibration angles (kvq_codebooks_learn), per kv head */
} kvq_codebook_source;

#define KVQ_POLAR_MAX_LEVELS 8

typedef struct kvq_polar_config {
  uint32_t levels;                       /* L: blocks of 2^L coordinates, 1..8; 2^L divides head_dim */
  uint32_t bits[KVQ_POLAR_MAX_LEVELS];   /* bits of the angles of level 1 .. L (bits[0] is level 1): 1..8 */
  kvq_rotation rotation;
  kvq_codebook_source codebook;
} kvq_polar_config;

typedef struct kvq_cq_config {
  uint32_t channels;              /* c contiguous channels share one code: 1, 2, 4, 8 or 16 */
  uint32_t bits;                  /* b bits per code: 1..12 (2^b centroids per channel group) */
  uint32_t iterations;            /* Lloyd iterations of kvq_codebooks_learn (at most; stops when stable) */
} kvq_cq_config;

/* One method and its parameters; only the member for `method` is read. */
typedef struct kvq_method_config {
  kvq_method method;
  kvq_exact_config exact;
  kvq_qjl_config qjl;
  kvq_uniform_config uniform;
  kvq_kivi_config kivi;
  kvq_polar_config polar;
  kvq_cq_config cq;
} kvq_method_config;

/*
 * The documented defaults of a method at a head_dim: exact fp16; QJL m = 2 * head_dim,
 * k = head_dim / 16, m_o = 2 * head_dim (256, 8, 256 at head_dim 128); uniform 2 bits, G = 32
 * (G = 16 when head_dim is not a multiple of 32); KIVI 2 bits over the whole page; PolarQuant
 * L = 4 with 4, 2, 2, 2 bits (3.875 bits per number), dense rotation, offline codebooks; CQ 4
 * channels with 8 bits (2 bits per number), 100 Lloyd iterations. Valid for every valid head_dim.
 * Thread-safe.
 */
KVQ_API kvq_method_config kvq_method_defaults(kvq_method method, uint32_t head_dim);

typedef struct kvq_layer_config {
  uint32_t query_heads;           /* Hq <= 65536; a multiple of kv_heads (query head h uses kv head h / (Hq/Hkv)) */
  uint32_t kv_heads;              /* Hkv, 1..1024 */
  uint32_t head_dim;              /* d: multiple of 16, 16..256 */
  kvq_method_config keys;         /* any method */
  kvq_method_config values;       /* any method but QJL (an inner-product estimator) */
} kvq_layer_config;

/* ---------------------------------------------------------------------------------------------
 * Token policies: which tokens a sequence keeps (docs/API.md, "Token policies")
 *
 * Every policy keeps the first `sinks` tokens and the newest `recent` tokens. H2O and Q-Hitter
 * also keep `heavy` more tokens, those of the largest score; STREAMING keeps no others; KEEP_ALL
 * evicts nothing. Scores, per token of a sequence:
 *   H2O        A_t: the attention probability the token received in every kvq_attention call since
 *              it was appended, summed over calls, query rows, query heads and layers;
 *   Q-Hitter   lambda A_t / max A + (1 - lambda) (2 - E^K_t / max E^K - E^V_t / max E^V) / 2, with
 *              E^K_t (E^V_t) the quantization error ||k - k^||_2 of the token's key (value) summed
 *              over layers and kv heads, and the maxima taken over the candidates (a zero maximum
 *              makes its term 0).
 * The policy runs on the candidates (tokens past the sinks, before the recent ones): when there
 * are more than `heavy`, the others are evicted, the lowest scores first (ties: the older token is
 * kept; Q-Hitter's equal scores fall back to A_t, so lambda = 1 selects exactly as H2O). Evicted
 * tokens are gone from attention, scores and dequantization in every layer; a page whose tokens
 * are all evicted returns to the pool. After a decision a sequence keeps sinks + recent + heavy
 * tokens (attention in that step also sees the step's new token); with an absolute `heavy`
 * (heavy_fraction 0) that is a constant, so a cache of fixed size streams without end, while with
 * heavy_fraction the kept tokens grow with the stream.
 * ------------------------------------------------------------------------------------------- */

typedef enum kvq_policy_kind {
  KVQ_POLICY_KEEP_ALL = 0,  /* nothing is evicted (the default of a zeroed config) */
  KVQ_POLICY_STREAMING = 1, /* StreamingLLM: attention sinks and a recent window */
  KVQ_POLICY_H2O = 2,       /* plus heavy hitters by accumulated attention */
  KVQ_POLICY_QHITTER = 3    /* plus heavy hitters by attention and quantization friendliness */
} kvq_policy_kind;

typedef struct kvq_policy_config {
  kvq_policy_kind kind;
  uint32_t sinks;           /* the first tokens, always kept */
  uint32_t recent;          /* the newest tokens, always kept: at least residual_window + page_size,
                               so that no token in the full-precision window is ever a candidate */
  uint32_t heavy;           /* H2O, Q-Hitter: candidates kept (ignored when heavy_fraction > 0) */
  float heavy_fraction;     /* H2O, Q-Hitter: if > 0, keep floor(heavy_fraction * tokens appended)
                               candidates instead of `heavy`; at most 1 */
  float lambda;             /* Q-Hitter: weight of the attention term, 0..1 */
} kvq_policy_config;

/*
 * Sensible values for a policy: sinks 4 (StreamingLLM's), recent 0 (the minimum, filled in as
 * residual_window + page_size when the cache is created), heavy_fraction 0.2 (H2O's 20%) and
 * lambda 0.5 (Q-Hitter's). Thread-safe.
 */
KVQ_API kvq_policy_config kvq_policy_defaults(kvq_policy_kind kind);

typedef struct kvq_cache_config {
  uint32_t layer_count;           /* 1..4096 */
  const kvq_layer_config *layers; /* layer_count entries; copied by kvq_cache_create */
  kvq_dtype input_dtype;          /* dtype of appended keys/values and of the full-precision window */
  uint32_t page_size;             /* P tokens per page: power of two, 16..256 */
  uint32_t residual_window;       /* R newest tokens kept in full precision: multiple of P, 0..65536 */
  uint32_t max_pages;             /* pages in the pool shared by all sequences, >= 1 */
  uint32_t max_sequences;         /* live sequences at once, 1..65535 */
  uint64_t seed;                  /* all random matrices derive from it (docs/FORMAT.md) */
  kvq_policy_config policy;       /* which tokens sequences keep; zeroed: KEEP_ALL. recent = 0 means
                                     residual_window + page_size */
} kvq_cache_config;

/*
 * Checks a configuration without creating anything. On KVQ_ERROR_OUT_OF_RANGE or
 * KVQ_ERROR_INVALID_ARGUMENT, writes a message naming the offending parameter to `message`
 * (if not NULL, `message_size` bytes, NUL-terminated). Thread-safe.
 */
KVQ_API kvq_status kvq_cache_config_check(const kvq_cache_config *config, char *message, size_t message_size);

/*
 * Bytes a cache with this configuration allocates when created: pages, full-precision windows,
 * matrices, staging and bookkeeping (a bound: these never grow). Attention, scores and dequantize
 * add scratch buffers sized by their largest call (kvq_memory_report.scratch_bytes). KVQ_ERROR_OUT_OF_RANGE when the total does not
 * fit in 64 bits (*bytes is then UINT64_MAX). kvq_cache_create refuses caches above 2^46 bytes.
 * Thread-safe.
 */
KVQ_API kvq_status kvq_cache_config_bytes(const kvq_cache_config *config, uint64_t *bytes);

/*
 * Exact bits per cached number of one layer at a page size, as the page layouts store them:
 * codes, side data and padding counted; the full-precision window, matrices and codebooks not.
 * Thread-safe.
 */
KVQ_API kvq_status kvq_layer_bits_per_number(const kvq_layer_config *layer, uint32_t page_size,
                                             double *key_bits, double *value_bits);

/* ---------------------------------------------------------------------------------------------
 * Caches and sequences
 *
 * A cache holds, for every layer, a pool of pages shared by all sequences. Each sequence has one
 * page table shared by all layers: page j holds its tokens [jP, (j+1)P) in every layer and kv head.
 * Layers are appended independently but see the same positions. The newest R tokens of each layer
 * stay in full precision; whenever that window reaches R + P tokens its oldest P are quantized as
 * one page. kvq_flush() quantizes the whole window (a last partial page is padded with zeros; if the
 * sequence grows later, that page is re-quantized once it is full).
 * ------------------------------------------------------------------------------------------- */

typedef struct kvq_cache kvq_cache;

/*
 * Creates an empty cache on a context: builds the random matrices on the host, uploads them and
 * allocates all storage up front, so appends and flushes never allocate device memory (attention,
 * scores and dequantization use scratch buffers that grow to their largest call). Messages name the
 * bad parameter; *out is NULL on failure. A cache whose buffers do not fit the backend (one buffer
 * beyond the device's largest -- Vulkan's maxStorageBufferRange or maxMemoryAllocationSize -- or all
 * of them beyond its memory: the device's, or the host's for the CPU backend) is refused with
 * KVQ_ERROR_OUT_OF_RANGE before anything is allocated, as is one above 2^46 bytes.
 */
KVQ_API kvq_status kvq_cache_create(kvq_context *context, const kvq_cache_config *config, kvq_cache **out);

/* Destroys a cache and its storage. NULL is ignored. */
KVQ_API void kvq_cache_destroy(kvq_cache *cache);

/*
 * Copies the cache's configuration to *config. Its `layers` pointer refers to memory owned by the
 * cache, valid until the cache is destroyed.
 */
KVQ_API kvq_status kvq_cache_get_config(const kvq_cache *cache, kvq_cache_config *config);

/* Adds an empty sequence; *sequence receives its id. KVQ_ERROR_CAPACITY when max_sequences live.
 * Ids carry a 16-bit generation: a freed id is refused until its slot has been reused 65535 times. */
KVQ_API kvq_status kvq_sequence_add(kvq_cache *cache, uint32_t *sequence);

/* Frees a sequence: its pages return to the pool and its id becomes invalid. */
KVQ_API kvq_status kvq_sequence_free(kvq_cache *cache, uint32_t sequence);

typedef struct kvq_sequence_info {
  uint64_t tokens;            /* tokens appended to this layer: the next token's position */
  uint64_t quantized_tokens;  /* of which stored in pages (the rest are in the window) */
  uint32_t pages;             /* pages in the sequence's page table (shared by all layers) */
  uint64_t kept_tokens;       /* tokens attention covers: tokens minus those a policy evicted */
} kvq_sequence_info;

/* The progress of one layer of a sequence (tokens appended, how many are in pages, the page
 * table's length, how many tokens are kept). */
KVQ_API kvq_status kvq_sequence_info_get(const kvq_cache *cache, uint32_t sequence, uint32_t layer,
                                         kvq_sequence_info *info);

/*
 * The positions of the tokens a layer of a sequence keeps, ascending: column j of kvq_scores and
 * token j of kvq_dequantize are the token at positions[j]. Without evictions they are 0 .. n - 1.
 * *count receives the number of kept tokens; with positions == NULL only the count is returned;
 * KVQ_ERROR_CAPACITY (nothing written) when capacity is smaller.
 */
KVQ_API kvq_status kvq_sequence_positions(const kvq_cache *cache, uint32_t sequence, uint32_t layer,
                                          uint32_t *positions, size_t capacity, size_t *count);

/* What the H2O and Q-Hitter policies know about a kept token. */
typedef struct kvq_token_stats {
  uint32_t position;
  double attention;           /* A_t (see "Token policies") */
  float key_error;            /* E^K_t: the errors of the layers that quantized the token's page whole so
                                 far (all of them once the token is a candidate); Q-Hitter only */
  float value_error;          /* E^V_t; likewise */
} kvq_token_stats;

/*
 * The statistics of every token a sequence keeps in any layer, by ascending position (tokens
 * appended to some layers but not yet to others included). Only caches whose policy is H2O or
 * Q-Hitter keep statistics (KVQ_ERROR_INVALID_ARGUMENT otherwise). Counts as for
 * kvq_sequence_positions.
 */
KVQ_API kvq_status kvq_sequence_token_stats(const kvq_cache *cache, uint32_t sequence, kvq_token_stats *stats,
                                            size_t capacity, size_t *count);

/*
 * Runs the cache's token policy on a sequence now. It also runs by itself at the start of every
 * kvq_append to layer 0 whenever all layers hold the same number of tokens, which is once per
 * decoding step in the usual loop (append and attend layer by layer); the pages it frees count for
 * that append, and an append that fails evicts nothing. Requires all layers to hold the same number
 * of tokens (KVQ_ERROR_INVALID_ARGUMENT otherwise); KEEP_ALL does nothing.
 */
KVQ_API kvq_status kvq_sequence_apply_policy(kvq_cache *cache, uint32_t sequence);

/*
 * Appends tokens to one layer of a sequence. keys and values are [tokens, kv_heads, head_dim] in the
 * cache's input dtype (tokens >= 1; any strides). All tokens are validated first: non-finite numbers,
 * or numbers the layer's storage cannot represent (for example a key norm beyond fp16 range for
 * QJL), reject the whole call with KVQ_ERROR_NON_FINITE; a call that would need more pages than
 * are free returns KVQ_ERROR_CAPACITY. Either way the cache is unchanged.
 * Limits (as for kvq_attention, kvq_scores, kvq_dequantize and kvq_codebooks_learn): a call whose
 * working memory (its tensors in fp32 or the input dtype) would exceed the host's memory, the
 * device's, or what malloc can be asked for returns KVQ_ERROR_OUT_OF_RANGE before it allocates or
 * reads anything, the cache unchanged.
 */
KVQ_API kvq_status kvq_append(kvq_cache *cache, uint32_t sequence, uint32_t layer,
                              const kvq_tensor *keys, const kvq_tensor *values);

/* Quantizes the full-precision window of every layer of a sequence (see above). KVQ_ERROR_CAPACITY
 * when the pages it needs are not free; like any other failure (host memory, the device), it changes
 * nothing. */
KVQ_API kvq_status kvq_flush(kvq_cache *cache, uint32_t sequence);

/* ---------------------------------------------------------------------------------------------
 * Codebooks (PolarQuant with KVQ_CODEBOOK_ONLINE, CQ)
 *
 * Such a layer needs codebooks before it can store tokens: appending to it returns
 * KVQ_ERROR_NO_CODEBOOK until they are learned or loaded. Codebooks are data: learned once (on any
 * backend), saved with the cache or on their own, and shared; they are not required to agree between
 * backends, but the codes computed with given codebooks are.
 * ------------------------------------------------------------------------------------------- */

/*
 * Learns the codebooks of one layer from calibration keys and values [tokens, kv_heads, head_dim]
 * (any float dtype; the side that needs no codebook may be NULL), with optional per-token weights
 * (`weights`, one non-negative float per calibration token, for Fisher-weighted learning; NULL for
 * equal weights). PolarQuant: per kv head and level, 1-D k-means++ on the angles of the rotated
 * calibration tokens, then Lloyd iterations (100 at most). CQ: per kv head and channel group,
 * k-means++ on the groups' c-dimensional vectors, then Lloyd iterations (cq.iterations at most; both
 * stop when no assignment changes). Seeded from the cache's seed, so the same data give the same
 * codebooks on one backend. Refused (nothing changes) while any sequence holds tokens in the layer.
 */
KVQ_API kvq_status kvq_codebooks_learn(kvq_cache *cache, uint32_t layer, const kvq_tensor *keys,
                                       const kvq_tensor *values, const float *weights);

/* Codebooks on their own: a small versioned, checksummed file (docs/FORMAT.md) holding every
 * learned codebook of the cache (none when no layer learns any). Sizes and statuses as for caches. */
KVQ_API kvq_status kvq_codebooks_save_size(kvq_cache *cache, uint64_t *bytes);
KVQ_API kvq_status kvq_codebooks_save_to_memory(kvq_cache *cache, void *buffer, size_t capacity, size_t *written);
KVQ_API kvq_status kvq_codebooks_save(kvq_cache *cache, const char *path);

/*
 * Loads codebooks into a cache whose learned codebooks have the same shapes (same methods,
 * head_dim, kv heads and bits in the layers that learn). A layer whose sequences hold tokens keeps
 * its codebooks unless the file's are identical (codes would change meaning): KVQ_ERROR_INVALID_ARGUMENT.
 */
KVQ_API kvq_status kvq_codebooks_load(kvq_cache *cache, const char *path);
KVQ_API kvq_status kvq_codebooks_load_from_memory(kvq_cache *cache, const void *buffer, size_t size);

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------- */

typedef enum kvq_mask {
  /*
   * A block of nq queries is the last nq positions of the sequence (their keys already appended):
   * query i, at position n - nq + i, attends to the kept tokens at positions 0 .. n - nq + i
   * (n: tokens appended). Requires nq <= n.
   */
  KVQ_MASK_CAUSAL = 0,
  KVQ_MASK_NONE = 1           /* every query attends to all kept tokens */
} kvq_mask;

typedef struct kvq_attention_request {
  uint32_t sequence;
  kvq_mask mask;
  kvq_tensor queries;         /* [nq, query_heads, head_dim], any float dtype */
  kvq_tensor output;          /* [nq, query_heads, head_dim], any float dtype */
} kvq_attention_request;

/*
 * Attention of one layer for a batch of sequences, each with its block of queries: scaled logits
 * q.k / sqrt(head_dim) over the quantized pages and the full-precision window, a numerically
 * stable softmax, and the probability-weighted sum of values. GQA: query head h uses kv head
 * h / (query_heads / kv_heads). All requests are validated before any output is written. A
 * sequence without tokens in the layer is KVQ_ERROR_OUT_OF_RANGE. Queries holding NaN or Inf, and
 * results that overflow fp32 or the output tensor's dtype, return KVQ_ERROR_NON_FINITE. Attention
 * covers the kept tokens only; under H2O and Q-Hitter each call adds the probabilities it computed
 * to the tokens' accumulated attention (causal rows see the tokens up to their position).
 */
KVQ_API kvq_status kvq_attention(kvq_cache *cache, uint32_t layer,
                                 const kvq_attention_request *requests, size_t count);

typedef enum kvq_score_kind {
  KVQ_SCORES_LOGITS = 0,        /* q.k / sqrt(head_dim); masked entries are -infinity */
  KVQ_SCORES_PROBABILITIES = 1  /* softmax over each query's row; masked entries are 0 */
} kvq_score_kind;

/*
 * The scores of a block of queries against the kept tokens of one layer of a sequence:
 * queries [nq, query_heads, head_dim] -> scores [nq, query_heads, kept] (kept = n unless a policy
 * evicted tokens; kvq_sequence_positions gives each column's position). Unlike kvq_attention it
 * adds nothing to the policy's accumulated attention. Errors as kvq_attention.
 */
KVQ_API kvq_status kvq_scores(kvq_cache *cache, uint32_t sequence, uint32_t layer,
                              const kvq_tensor *queries, kvq_mask mask, kvq_score_kind kind,
                              const kvq_tensor *scores);

/*
 * Reconstructs kept tokens [first, first + count) of one layer of a sequence (indices into the kept
 * tokens, as kvq_sequence_positions lists them; without evictions, positions) as the cache holds them:
 * window tokens exactly, quantized tokens decoded. For QJL keys the reconstruction is the unbiased
 * estimate c_d/m |k_in| S^T sign(S k_in) + c_d/m_o |k_out| S_o^T sign(S_o k_out) (masked), whose
 * inner product with any query equals the score estimator. keys/values are [count, kv_heads,
 * head_dim] outputs of any float dtype; either may be NULL.
 */
KVQ_API kvq_status kvq_dequantize(kvq_cache *cache, uint32_t sequence, uint32_t layer,
                                  uint64_t first, uint64_t count,
                                  const kvq_tensor *keys, const kvq_tensor *values);

/* ---------------------------------------------------------------------------------------------
 * Memory accounting
 * ------------------------------------------------------------------------------------------- */

typedef struct kvq_memory_report {
  uint32_t pages_total, pages_used;
  uint32_t sequences_total, sequences_used;
  uint64_t page_bytes;            /* bytes of one page in all layers, keys and values */
  uint64_t pages_bytes_total;     /* the whole pool */
  uint64_t pages_bytes_used;      /* pages in use */
  uint64_t window_bytes_total;    /* full-precision windows of all sequence slots */
  uint64_t window_bytes_used;     /* window tokens currently held */
  uint64_t fixed_bytes;           /* matrices and codebooks (stored once per cache) */
  uint64_t staging_bytes;         /* allocated with the cache for appends that quantize pages */
  uint64_t scratch_bytes;         /* grown by attention, scores and dequantization to their largest call */
  double key_bits_per_number;     /* page layouts, side data and padding included, all layers */
  double value_bits_per_number;
  double bits_per_number;         /* keys and values together */
} kvq_memory_report;

/* What a cache holds and what it costs (see kvq_memory_report). Thread-safety: as any call on the
 * cache's context. */
KVQ_API kvq_status kvq_cache_memory(const kvq_cache *cache, kvq_memory_report *report);

/* ---------------------------------------------------------------------------------------------
 * Synthetic LLM-like data (the model is documented in docs/EVAL.md), reproducible from a seed through
 * kvq's own generator on every platform: what `kvq eval`, kvq-bench and kvq's tests run on.
 * ------------------------------------------------------------------------------------------- */

typedef struct kvq_synth_config {
  uint32_t tokens;
  uint32_t kv_heads;
  uint32_t query_heads; /* a multiple of kv_heads */
  uint32_t head_dim;
  uint32_t outliers;    /* outlier channels per kv head (0 for none, at most head_dim) */
  float outlier_min, outlier_max;
  float temperature;    /* query scale; 1 gives logits of standard deviation about 1-3 */
  uint64_t seed;
} kvq_synth_config;

/* The defaults: 4 outlier channels scaled 10-20x, temperature 1. Thread-safe. */
KVQ_API kvq_synth_config kvq_synth_defaults(uint32_t tokens, uint32_t kv_heads, uint32_t query_heads, uint32_t head_dim,
                                            uint64_t seed);

/* Fills keys and values [tokens][kv_heads][head_dim] and queries [tokens][query_heads][head_dim], fp32,
 * caller-owned (any may be NULL to skip storing it; the draws are the same). KVQ_ERROR_INVALID_ARGUMENT
 * for a NULL config, zero heads or head_dim, query heads not a multiple of kv heads or more outliers
 * than channels; KVQ_ERROR_OUT_OF_MEMORY. Thread-safe. */
KVQ_API kvq_status kvq_synth_generate(const kvq_synth_config *config, float *keys, float *values, float *queries);

/* ---------------------------------------------------------------------------------------------
 * Saving and loading (format: docs/FORMAT.md; little-endian, versioned, SHA-256 checked)
 * ------------------------------------------------------------------------------------------- */

/* Exact size in bytes of the file kvq_cache_save() would write now. */
KVQ_API kvq_status kvq_cache_save_size(kvq_cache *cache, uint64_t *bytes);

/* Writes the cache (config, matrices, sequences, pages, windows) to `path`: the file is assembled in
 * host memory (kvq_cache_save_size bytes), written to `path` + ".tmp-kvq", synced and renamed over
 * `path`, so readers never see a partial file. Do not save two caches to one path concurrently. */
KVQ_API kvq_status kvq_cache_save(kvq_cache *cache, const char *path);

/* The same bytes into caller memory; KVQ_ERROR_BUFFER_TOO_SMALL if capacity < kvq_cache_save_size. */
KVQ_API kvq_status kvq_cache_save_to_memory(kvq_cache *cache, void *buffer, size_t capacity, size_t *written);

/*
 * Loads a saved cache onto a context (any backend); the whole file is read into host memory first.
 * Truncated files return KVQ_ERROR_TRUNCATED, corrupted ones KVQ_ERROR_CHECKSUM, other format
 * versions KVQ_ERROR_VERSION, and files whose checksum is right but whose content kvq could not have
 * written KVQ_ERROR_BAD_FORMAT (random matrices and offline tables must equal the ones the file's
 * seed and config give, so loading costs about what kvq_cache_create costs, plus reading). Sequence
 * ids stay valid. *out is NULL on failure.
 */
KVQ_API kvq_status kvq_cache_load(kvq_context *context, const char *path, kvq_cache **out);
KVQ_API kvq_status kvq_cache_load_from_memory(kvq_context *context, const void *buffer, size_t size,
                                              kvq_cache **out);

#ifdef __cplusplus
}
#endif

#endif /* KVQ_KVQ_H */
