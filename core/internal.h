/* The core's objects. Nothing here is visible outside libkvq. */
#ifndef KVQ_CORE_INTERNAL_H
#define KVQ_CORE_INTERNAL_H

#include <stdint.h>

#include "backends/backend.h"
#include "config.h"
#include "kvq/kvq.h"

/* The work of a context's last load (kvq_cache_load*, kvq_codebooks_load*), so that tests can bound
 * it by the file's size and the configuration instead of by wall time (tests/test_golden.c):
 *   steps:    one per iteration of a loop whose length the file decides (a page-table entry, a
 *             position a check visits, a statistics record);
 *   reserved: token statistics entries the loader reserved memory for.
 * Not part of the API; reset when a load starts. */
typedef struct kvq_load_work {
  uint64_t steps, reserved;
} kvq_load_work;

struct kvq_context {
  kvq_backend *backend;
  int async; /* kvq_context_set_async: calls leave their device work in flight */
  /* Checks of caller device tensors done on the device (core/tensor_device.c): a 16-byte buffer whose
   * first word CONVERT jobs set bits in. recorded: this call recorded checks; pending: asynchronous
   * calls' checks, not yet read; dirty: the word was read non-zero and is zeroed before its next use;
   * what: the call, for messages. */
  kvq_buffer *checks;
  int checks_recorded, checks_pending, checks_dirty;
  const char *checks_what;
  uint32_t live_caches;
  int destroy_requested;
  uint64_t host_memory_bytes; /* the host's physical memory, read at creation (core/memory_limits.c); 0: unknown */
  char error[1024];
  kvq_load_work load_work;
  /* kvq_context_set_load_limit: the most kvq_cache_config_bytes a loaded cache may have; 0 automatic. */
  uint64_t load_limit;
  /* Attention metadata packed by core for backends with KVQ_BACKEND_CORE_META (core/gpu_meta.c),
   * kept from one job to the next; created on first use. sequence_uids: the last uid given to a
   * sequence (kvq_sequence.uid), unique for the context's life. */
  struct kvq_gpu_meta *gpu_meta;
  uint64_t sequence_uids;
  /* kvq-bench only (KVQ_BENCH_JOBS_*): which attention jobs kvq_attention runs, so that the benchmark
   * can time scoring and the weighted sum alone; 0 (every other caller) is the normal plan. */
  uint32_t bench_jobs;
};

/* kvq_context.bench_jobs. SCORE: query preparation and SCORE only (the output is not written).
 * UNFUSED: SCORE, SOFTMAX and WEIGHTED_SUM even where the backend has the fused job, which leaves the
 * probabilities in the cache's score scratch. WEIGHTED_SUM: that job alone, over the probabilities an
 * UNFUSED call of the same shape left there (the output is then that call's). Not part of the API. */
enum { KVQ_BENCH_JOBS_SCORE = 1u, KVQ_BENCH_JOBS_UNFUSED = 2u, KVQ_BENCH_JOBS_WEIGHTED_SUM = 3u };

/* Whether kvq_attention runs `rows` query rows of `width` scored tokens each (of one layer) as one
 * batch, not split at its score scratch budget: the score scratch then holds every row's scores
 * after the call (kvq-bench's checks of the jobs it times alone). Not part of the API. */
int kvq_attention_one_batch(const kvq_cache *cache, uint32_t layer, uint64_t rows, uint64_t width);

/* The context's backend counters (kvq_backend_stats, backends/backend.h), read and, with `reset`,
 * zeroed: for tests that count submissions and host<->device bytes. KVQ_ERROR_UNSUPPORTED when the
 * backend keeps none (CPU). Not part of the API. */
kvq_status kvq_context_backend_stats(kvq_context *ctx, kvq_backend_stats *out, int reset);

/* Bracket a public call whose device work the backend may record into one submission (kvq_append,
 * kvq_flush, kvq_attention, kvq_scores, kvq_dequantize): kvq_call_end submits it, waiting for it
 * unless the context is asynchronous (kvq_context_set_async), and returns `status` (or the
 * submission's failure when `status` is KVQ_OK). When `status` is a failure the call's recording is
 * discarded instead (kvq_call_discard): a failed call runs none of the work it recorded since its
 * last submission, so it must not have submitted a change to the cache or to an output before
 * every step that can fail succeeded (tests/test_fault.c). */
void kvq_call_begin(kvq_context *ctx);
/* As kvq_call_begin, for a call whose recording the backend may submit part way when a resource of
 * it runs out (the backend's defer_parts, backends/backend.h), since a failure after that changes
 * nothing the caller had: the calls that make a new cache (kvq_cache_create, kvq_cache_load*) and
 * kvq_cache_save*, which only reads. Every other call's recording runs whole or not at all. */
void kvq_call_begin_parts(kvq_context *ctx);
kvq_status kvq_call_end(kvq_context *ctx, kvq_status status);
/* The same for calls that are synchronous in every mode (creating and loading caches, loading
 * codebooks): their one submission is waited for before they return. */
kvq_status kvq_call_end_waiting(kvq_context *ctx, kvq_status status);
/* In a synchronous call (or with `always`), submits the work the call recorded so far and waits for
 * it, so that the call changes the cache's host state only once its device work succeeded: a failed
 * submission or wait then leaves the cache as it was (tests/test_fault.c). No extra submission: the
 * call's kvq_call_end finds nothing left to submit. An asynchronous call's work is submitted here
 * without a wait (and the call goes on deferring): its submission, which can fail, comes before the
 * bookkeeping too, and the work stays in flight (kvq_context_wait reports its failures;
 * tests/test_fault_more.c). `what`: the message's words for the work. */
kvq_status kvq_call_settle(kvq_context *ctx, int always, const char *what);
/* Drops what a failing call recorded since its last submission (the backend's discard, on a backend
 * that records: KVQ_BACKEND_RECORDS); a backend that runs each operation as issued has nothing to
 * drop. What core counted for the recording is put back: device checks it recorded are not read
 * (their word is zeroed before its next use, since the fill this call may have recorded never ran).
 * Harmless to call twice. */
void kvq_call_discard(kvq_context *ctx);

/* Words of attention metadata the last attention job of the context packed or compared in core
 * (core/gpu_meta.c): O(sequences + page-table entries that changed), not O(listed pages). For tests;
 * 0 when the backend packs its own. Not part of the API. */
uint64_t kvq_context_meta_packed(const kvq_context *ctx);

/* Frees a context once it was destroyed and its last cache is gone. */
void kvq_context_release(kvq_context *ctx);

/* Records a failure on a context (may be NULL) and returns `status`. */
kvq_status kvq_fail(kvq_context *ctx, kvq_status status, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Records a backend failure: its own message, prefixed. */
kvq_status kvq_fail_backend(kvq_context *ctx, kvq_status status, const char *what);
/* The status of a failed call whose undo failed too: a copy that puts back what the call overwrote
 * (`what`: window tokens, pages, an output; core/append.c, core/page_backup.c, core/output_undo.c),
 * after the call's own failure. KVQ_ERROR_DEVICE_LOST, the message the call's failure, then what
 * could not be put back and the backend's message. A backend that cannot copy between buffers it
 * holds, with ranges it checked, right after a first failure is not usable (on CUDA it is a sticky
 * error of the context), and the cache holds some of the failed call's writes: it must be destroyed,
 * as the status says (kvq.h). */
kvq_status kvq_undo_failed(kvq_context *ctx, const char *what);

/* A read whose bytes the call needs only after kvq_reads_wait: the backend's buffer_read_later where
 * it has one (then *later is set, and the bytes come with the call's one submission), else
 * buffer_read, the bytes at once. dst must live until kvq_reads_wait, or, in a call that failed,
 * kvq_reads_drop. Both return the backend's status (the caller says what failed). */
kvq_status kvq_read_later(kvq_context *ctx, kvq_buffer *buffer, uint64_t offset, void *dst, uint64_t bytes, int *later);
kvq_status kvq_reads_wait(kvq_context *ctx, int *later);
/* A failed call's reads: the call's recording is discarded with them (kvq_call_discard), so their
 * destinations stay unwritten and may be freed; nothing else the call recorded runs either. */
void kvq_reads_drop(kvq_context *ctx, int *later);
void kvq_clear_error(kvq_context *ctx);

enum { KVQ_SIDE_KEYS = 0, KVQ_SIDE_VALUES = 1 };

/* Per layer: its config, how each side is stored, its matrices and its buffers. */
typedef struct kvq_layer_storage {
  kvq_layer_config config;
  kvq_side_desc side[2];                            /* [KVQ_SIDE_*] */
  float *fixed_host[2][KVQ_SIDE_FIXED];         /* host copies of side[].fixed (for saving) */
  int learned[2];                                   /* learned codebooks present (or none needed) */
  kvq_buffer *pages[2];                             /* pool: max_pages * page_bytes */
  kvq_buffer *ring[2];                              /* windows: max_sequences * ring_capacity tokens */
} kvq_layer_storage;

/* A sequence's progress in one layer. Invariants: ring_start <= quantized <= tokens,
 * ring_start % P == 0, tokens - ring_start < ring_capacity; the ring holds [ring_start, tokens);
 * pages hold [0, quantized); attention reads [quantized, tokens) from the ring. */
typedef struct kvq_seq_layer {
  uint32_t tokens;
  uint32_t ring_start;
  uint32_t quantized;
} kvq_seq_layer;

/* What the H2O and Q-Hitter policies know about a sequence's kept tokens (kvq_token_stats): one
 * entry per kept position below `end`, ascending. */
typedef struct kvq_tracked {
  uint32_t count, capacity;
  uint32_t end;        /* the largest token count of any layer: positions below it were appended */
  uint32_t *position;
  double *attention;
  float *key_error, *value_error;
} kvq_tracked;

/* A sequence. Its page table (shared by all layers) lists, in ascending order of position, the
 * pages that hold its tokens: entry e is pool slot pages[e] holding positions
 * [page_index[e] P, page_index[e] P + P), with kept-token bits alive[e * alive_words ...]. Without
 * evictions page_index[e] = e. page_end is the number of pages the sequence ever took (the next
 * page's index): entries whose tokens were all evicted are gone from the table. */
typedef struct kvq_sequence {
  uint16_t generation; /* 1..65535, bumped whenever the slot is reused; part of the id */
  uint8_t live;
  uint32_t page_count, page_capacity, page_end;
  uint32_t *pages;
  uint32_t *page_index;
  uint32_t *alive;
  /* What core's packed attention metadata needs to update only what changed (core/gpu_meta.c):
   * uid names the sequence in its context (0: none yet; a reused slot gets a new one); every change
   * of the page table bumps pt_version and lowers pt_dirty_from to the first entry it touched
   * (kvq_page_table_changed: entries added, removed or moved), or widens [pt_masks_from,
   * pt_masks_to) to the entries whose kept-token masks alone changed (kvq_page_masks_changed); the
   * packer resets them (UINT32_MAX, an empty range) and sets pt_since to the version its image then
   * holds. */
  uint64_t uid, pt_version, pt_since;
  uint32_t pt_dirty_from, pt_masks_from, pt_masks_to;
  kvq_seq_layer *layers;
  kvq_tracked tracked;
} kvq_sequence;

enum kvq_scratch_kind {
  KVQ_SCRATCH_QUERIES,
  KVQ_SCRATCH_PREPARED,
  KVQ_SCRATCH_SCORES,
  KVQ_SCRATCH_OUTPUT,
  KVQ_SCRATCH_ACCUMULATE,
  KVQ_SCRATCH_ERRORS,
  KVQ_SCRATCH_TOKENS, /* an append's new tokens from device tensors, both sides */
  KVQ_SCRATCH_WINDOW, /* window tokens an append overwrites, kept until it succeeds (core/append.c) */
  KVQ_SCRATCH_SAVED_OUTPUTS, /* caller device outputs as they were before the call (core/output_undo.c) */
  KVQ_SCRATCH_PAGES, /* pages a failed append or flush overwrote, as they were (core/page_backup.c) */
  KVQ_SCRATCH_COUNT
};

struct kvq_cache {
  kvq_context *ctx;
  kvq_cache_config config;   /* config.layers points at `layers` */
  kvq_layer_config *layers;
  kvq_layer_storage *storage;
  uint32_t ring_capacity;    /* R + P */
  uint32_t *free_pages;      /* stack of free page slots */
  uint32_t free_count;
  kvq_sequence *seqs;        /* max_sequences slots */
  uint32_t live_sequences;
  kvq_buffer *scratch[KVQ_SCRATCH_COUNT];
  uint64_t scratch_size[KVQ_SCRATCH_COUNT];
  kvq_buffer *staging;       /* tokens of up to staging_pages pages being quantized by an append */
  kvq_buffer *zeros;         /* zeros_size zero bytes: the source that clears a page behind the device
                                checks (kvq_take_pages); created on first need */
  uint64_t zeros_size;
  uint32_t staging_pages;
  uint32_t alive_words;      /* ceil(P / 32): kept-token mask words per page-table entry */
};

/* The largest cache kvq_cache_create (and loading) accepts, in bytes. */
#define KVQ_MAX_CACHE_BYTES ((uint64_t)1 << 46)

/* Positions are 32-bit in jobs and kernels: a sequence holds positions below 2^31 - 1 (with a token
 * policy that evicts, a stream of that many tokens; 24 days at 1000 tokens per second). */
#define KVQ_MAX_POSITIONS 0x7fffffffu

/* Pages an append quantizes per QUANTIZE job: bounds the staging buffer allocated with the cache. */
#define KVQ_STAGING_PAGES 64u

/* A scratch buffer of at least `bytes` (grown, contents not kept). */
kvq_status kvq_scratch(kvq_cache *cache, int kind, uint64_t bytes, kvq_buffer **out);

/* The opening checks of the public calls on a sequence, written once: `id` names a live sequence of
 * the cache (else KVQ_ERROR_NOT_FOUND) and, for the layer form, `layer` is one of its layers (else
 * KVQ_ERROR_OUT_OF_RANGE). NULL on failure, with *status and the context's message (naming `who`,
 * the public function) set. */
kvq_sequence *kvq_sequence_lookup(const kvq_cache *cache, uint32_t id, const char *who, kvq_status *status);
kvq_sequence *kvq_sequence_layer_lookup(const kvq_cache *cache, uint32_t id, uint32_t layer, const char *who,
                                        kvq_status *status);
/* The slot index of a sequence. */
uint32_t kvq_sequence_slot(const kvq_cache *cache, const kvq_sequence *seq);

/* Byte offset of a sequence's window ring inside ring buffers of a layer. */
uint64_t kvq_ring_offset(const kvq_cache *cache, uint32_t layer, uint32_t slot);

/* Builds a cache's storage from a validated config (used by create and load), with its random
 * matrices and offline codebooks in fixed_host (learned codebooks start empty, not ready); the
 * caller uploads fixed_host with kvq_upload_fixed (load first compares the file's arrays with it). */
kvq_status kvq_cache_build(kvq_context *ctx, const kvq_cache_config *config, kvq_cache **out);
kvq_status kvq_upload_fixed(kvq_cache *cache);

/* Takes n pages from the free stack, zeroes them in every layer (so no bytes of a previous owner
 * remain) and appends them to a sequence's page table as its next pages, every token kept
 * (capacity checked and reserved before). With `if_clear` (the context's check word, a backend
 * with KVQ_BACKEND_IF_CLEAR), the slots that lie at or above stack position free_before (pages the call's
 * evictions freed, which a refused call keeps) are zeroed only if the check word is clear when the
 * device gets there (kvq_device_copy_if_clear from cache->zeros). */
kvq_status kvq_take_pages(kvq_cache *cache, kvq_sequence *seq, uint32_t n, kvq_buffer *if_clear, uint32_t free_before);
/* Records that page-table entries from `from` on changed (internal.h, kvq_sequence.pt_*). */
void kvq_page_table_changed(kvq_sequence *seq, uint32_t from);
/* Records that the kept-token masks of entries [from, to) changed, and nothing else. */
void kvq_page_masks_changed(kvq_sequence *seq, uint32_t from, uint32_t to);
/* The page-table entry holding page `index` of a sequence, or UINT32_MAX when it has none. */
uint32_t kvq_page_entry(const kvq_sequence *seq, uint32_t index);
/* Whether token i of page-table entry e is kept. */
int kvq_token_kept(const kvq_cache *cache, const kvq_sequence *seq, uint32_t e, uint32_t i);
/* Returns page-table entry e's slot to the pool and removes the entry. */
void kvq_release_entry(kvq_cache *cache, kvq_sequence *seq, uint32_t e);

/* How one layer of a sequence looks to jobs and callers: the page-table entries holding its
 * quantized tokens (entries 0 .. pages - 1), the token slots they form, its window, and how many
 * tokens it keeps. */
typedef struct kvq_layer_view {
  uint32_t pages;        /* listed entries */
  uint32_t slots;        /* page token slots: (pages - 1) P + valid tokens of the last listed page */
  uint32_t window_first; /* position of the first window token (the layer's quantized count) */
  uint32_t window;       /* window tokens */
  uint32_t kept;         /* kept page tokens + window tokens */
} kvq_layer_view;
void kvq_layer_view_get(const kvq_cache *cache, const kvq_sequence *seq, uint32_t layer, kvq_layer_view *view);
/* For each kept token, in order: its slot (page slots, then the window) and position; either
 * array may be NULL. */
void kvq_layer_view_kept(const kvq_cache *cache, const kvq_sequence *seq, const kvq_layer_view *view, uint32_t *slot,
                         uint32_t *position);
/* Grows a page table's capacity to hold `pages` entries without changing anything else. */
kvq_status kvq_reserve_page_table(kvq_cache *cache, kvq_sequence *seq, uint32_t pages);

/* Copies the page images of one (sequence, layer, side) in page-table order into dst
 * (the layer's listed pages, kvq_layer_view, of side.layout.page_bytes each); *pages receives the count.
 * With dst == NULL only counts. For golden files and tests. */
kvq_status kvq_cache_read_pages(kvq_cache *cache, uint32_t id, uint32_t layer, int side, void *dst, uint32_t *pages);

#endif
