/*
 * Appending tokens and flushing: the residual window and when pages get quantized.
 *
 * Per (sequence, layer) the state is tokens n, ring_start F and quantized Q (internal.h). The ring
 * of R + P slots holds tokens [F, n), token t at slot t % (R + P). After an append, pages are
 * quantized while n - F >= R + P: page F / P from tokens [F, F + P), then F += P. A flush
 * quantizes [F, n) (the last page possibly partial) and sets Q = n, leaving F at the start of the
 * partial page, whose tokens stay in the ring so the page can be re-quantized once it fills.
 */
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"
#include "memory_limits.h"
#include "page_backup.h"
#include "policy.h"
#include "tensor.h"
#include "token_check.h"

static uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

/* An append's new tokens of one side, packed in the input dtype: in host memory, or (device tensors
 * read in place) in a device buffer at a byte offset. */
typedef struct token_source {
  const uint8_t *host;
  kvq_buffer *device;
  uint64_t offset;
} token_source;

/* Writes bytes [at, at + bytes) of the packed new tokens into dst at dst_offset; with `if_clear`
 * (device tokens only) a copy the check word stops (kvq_device_copy_if_clear). */
static kvq_status put_tokens(kvq_cache *cache, const token_source *src, uint64_t at, kvq_buffer *dst, uint64_t dst_offset,
                             uint64_t bytes, kvq_buffer *if_clear) {
  kvq_backend *be = cache->ctx->backend;
  if (src->device && if_clear) return kvq_device_copy_if_clear(cache->ctx, dst, dst_offset, src->device, src->offset + at, bytes);
  return src->device ? be->ops->buffer_copy(be, dst, dst_offset, src->device, src->offset + at, bytes)
                     : be->ops->buffer_write(be, dst, dst_offset, src->host + at, bytes);
}

/* Copies `count` packed tokens (from byte `at` of src) to ring slots starting at token position
 * `first`, wrapping (only while the check word is clear, with `if_clear`). */
static kvq_status ring_put(kvq_cache *cache, kvq_buffer *ring, uint64_t ring_offset, uint64_t token_bytes, uint32_t first,
                           uint32_t count, const token_source *src, uint64_t at, kvq_buffer *if_clear) {
  while (count > 0) {
    uint32_t slot = first % cache->ring_capacity;
    uint32_t run = cache->ring_capacity - slot < count ? cache->ring_capacity - slot : count;
    kvq_status st = put_tokens(cache, src, at, ring, ring_offset + slot * token_bytes, run * token_bytes, if_clear);
    if (st != KVQ_OK) return st;
    first += run;
    count -= run;
    at += run * token_bytes;
  }
  return KVQ_OK;
}

static kvq_status write_ring(kvq_cache *cache, kvq_buffer *ring, uint64_t ring_offset, uint64_t token_bytes,
                             uint32_t first, uint32_t count, const token_source *src, uint64_t at, kvq_buffer *if_clear) {
  const kvq_status st = ring_put(cache, ring, ring_offset, token_bytes, first, count, src, at, if_clear);
  return st == KVQ_OK ? KVQ_OK : kvq_fail_backend(cache->ctx, st, "writing the full-precision window");
}

/* Copies ring tokens [first, first + count) into `dst` at dst_offset, in order. */
static kvq_status copy_from_ring(kvq_cache *cache, kvq_buffer *ring, uint64_t ring_offset, uint64_t token_bytes,
                                 uint32_t first, uint32_t count, kvq_buffer *dst, uint64_t dst_offset) {
  kvq_backend *be = cache->ctx->backend;
  while (count > 0) {
    uint32_t slot = first % cache->ring_capacity;
    uint32_t run = cache->ring_capacity - slot < count ? cache->ring_capacity - slot : count;
    kvq_status st = be->ops->buffer_copy(be, dst, dst_offset, ring, ring_offset + slot * token_bytes, run * token_bytes);
    if (st != KVQ_OK) return kvq_fail_backend(cache->ctx, st, "staging window tokens");
    first += run;
    count -= run;
    dst_offset += run * token_bytes;
  }
  return KVQ_OK;
}

/* Quantizes pages of one side from `src`: page i of the run (sequence page first_page + i) holds
 * its tokens at src_offset + i * page_stride; the last page of the run holds `last_tokens` valid
 * tokens, the others P. One QUANTIZE job for the whole run. */
/* Quantization errors read back but not yet added to the statistics: an append adds them only when
 * it succeeds, so a device failure part way cannot count a page's errors twice on a retry; kvq_flush
 * adds every run it read (its quantized layers stay quantized). Both add them after their one wait. */
typedef struct error_run {
  int side;
  uint32_t first_page, pages, kv_heads;
  float *errors;
} error_run;
typedef struct pending_errors {
  error_run *runs;
  uint32_t count, capacity;
  /* Some runs' errors were read with buffer_read_later: on the host only after the backend's next
   * wait (pending_wait), their arrays the destinations until then. */
  int later;
} pending_errors;

/* The errors read later reach the host with the call's one submission: waited for here, after the
 * rest of the append is recorded. When the append failed (`st`, kept with its message) they are
 * dropped with the rest of its recording instead, which must not run (kvq_reads_drop), before the
 * arrays are freed. */
static kvq_status pending_wait(kvq_cache *cache, pending_errors *p, kvq_status st) {
  if (st != KVQ_OK) {
    kvq_reads_drop(cache->ctx, &p->later);
    return st;
  }
  const kvq_status waited = kvq_reads_wait(cache->ctx, &p->later);
  if (st != KVQ_OK || waited == KVQ_OK) return st;
  return kvq_fail_backend(cache->ctx, waited, "reading quantization errors");
}

static void pending_apply(kvq_cache *cache, kvq_sequence *seq, pending_errors *p) {
  for (uint32_t i = 0; i < p->count; i++)
    kvq_policy_add_errors(cache, seq, p->runs[i].side, p->runs[i].first_page, p->runs[i].pages, p->runs[i].kv_heads,
                          p->runs[i].errors);
}

static void pending_free(pending_errors *p) {
  for (uint32_t i = 0; i < p->count; i++) free(p->runs[i].errors);
  free(p->runs);
  memset(p, 0, sizeof *p);
}

static kvq_status quantize_pages(kvq_cache *cache, uint32_t layer, int side, kvq_sequence *seq, pending_errors *pending,
                                 kvq_buffer *if_clear, uint32_t first_page,
                                 uint32_t count, uint32_t last_tokens, kvq_buffer *src, uint64_t src_offset,
                                 uint64_t page_stride) {
  kvq_layer_storage *ls = &cache->storage[layer];
  const uint32_t P = cache->config.page_size, kv_heads = ls->config.kv_heads;
  /* Q-Hitter wants each token's quantization error; only whole pages count (each page is quantized
   * whole exactly once per layer), so the errors of a partial last page are not read. */
  const uint32_t whole = last_tokens == P ? count : count - 1;
  const int errors_wanted = kvq_policy_needs_errors(&cache->config.policy) && whole > 0;
  kvq_buffer *errors = NULL;
  float *host_errors = NULL;
  kvq_quantize_item *items = malloc(sizeof *items * count);
  kvq_status st = items ? KVQ_OK : kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory planning quantization");
  if (st == KVQ_OK && errors_wanted) {
    host_errors = malloc(sizeof(float) * whole * P * kv_heads);
    if (!host_errors) st = kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for quantization errors");
    else st = kvq_scratch(cache, KVQ_SCRATCH_ERRORS, (uint64_t)count * P * kv_heads * 4, &errors);
  }
  for (uint32_t i = 0; st == KVQ_OK && i < count; i++) {
    items[i] = (kvq_quantize_item){
        .src = src,
        .src_offset = src_offset + i * page_stride,
        .dst_offset = (uint64_t)seq->pages[kvq_page_entry(seq, first_page + i)] * ls->side[side].layout.page_bytes,
        .tokens = i + 1 == count ? last_tokens : P,
    };
  }
  kvq_job_quantize job = {
      .side = &ls->side[side],
      .input_dtype = cache->config.input_dtype,
      .dst = ls->pages[side],
      .count = count,
      .items = items,
      .errors = errors,
      .if_clear = if_clear,
  };
  kvq_backend *be = cache->ctx->backend;
  if (st == KVQ_OK && (st = be->ops->quantize(be, &job)) != KVQ_OK) st = kvq_fail_backend(cache->ctx, st, "quantizing pages");
  /* room for the run first: once its read is recorded, host_errors must live until the wait */
  if (st == KVQ_OK && errors_wanted && pending->count == pending->capacity) {
    const uint32_t capacity = pending->capacity ? 2 * pending->capacity : 4;
    error_run *grown = realloc(pending->runs, sizeof *grown * capacity);
    if (!grown) st = kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for quantization errors");
    else pending->runs = grown, pending->capacity = capacity;
  }
  if (st == KVQ_OK && errors_wanted) {
    const uint64_t bytes = (uint64_t)whole * P * kv_heads * 4;
    /* The errors are added only at the call's end, so they come back with its one submission (the
     * scratch is reused by the next run: the copy is recorded before that run). */
    st = kvq_read_later(cache->ctx, errors, 0, host_errors, bytes, &pending->later);
    if (st != KVQ_OK) {
      st = kvq_fail_backend(cache->ctx, st, "reading quantization errors");
    } else { /* kept for the caller to add */
      pending->runs[pending->count++] = (error_run){side, first_page, whole, kv_heads, host_errors};
      host_errors = NULL;
    }
  }
  free(items);
  free(host_errors);
  return st;
}

/* What an append changes in the host bookkeeping, saved before it changes it, for an append whose
 * device checks are read only after everything is recorded (one submission): restored when the
 * checks refuse it. The free stack only loses entries off its top or gains them above its old top,
 * so its count restores it; page-table entries are only appended, except when the policy's plan
 * evicts (then the table is saved whole), and statistics entries likewise (saved whole when the plan
 * drops some). */
typedef struct append_undo {
  int saved;
  uint32_t free_count, page_count, page_end, tracked_count, tracked_end;
  uint32_t *pages, *page_index, *alive; /* the page table, when the plan evicts */
  uint32_t *position;                   /* the statistics, when the plan drops entries */
  double *attention;
  float *key_error, *value_error;
} append_undo;

static void undo_free(append_undo *u) {
  free(u->pages), free(u->page_index), free(u->alive);
  free(u->position), free(u->attention), free(u->key_error), free(u->value_error);
  memset(u, 0, sizeof *u);
}

static void *copy_of(const void *src, size_t bytes, int *ok) {
  void *dst = malloc(bytes ? bytes : 1);
  if (!dst) *ok = 0;
  else if (bytes) memcpy(dst, src, bytes);
  return dst;
}

static kvq_status undo_save(kvq_cache *cache, const kvq_sequence *seq, const kvq_policy_plan *plan, append_undo *u) {
  const kvq_tracked *t = &seq->tracked;
  *u = (append_undo){.saved = 1, .free_count = cache->free_count, .page_count = seq->page_count, .page_end = seq->page_end,
                     .tracked_count = t->count, .tracked_end = t->end};
  int ok = 1;
  if (plan->alive) {
    u->pages = copy_of(seq->pages, sizeof(uint32_t) * seq->page_count, &ok);
    u->page_index = copy_of(seq->page_index, sizeof(uint32_t) * seq->page_count, &ok);
    u->alive = copy_of(seq->alive, sizeof(uint32_t) * seq->page_count * cache->alive_words, &ok);
  }
  if (plan->drop) {
    u->position = copy_of(t->position, sizeof(uint32_t) * t->count, &ok);
    u->attention = copy_of(t->attention, sizeof(double) * t->count, &ok);
    u->key_error = copy_of(t->key_error, sizeof(float) * t->count, &ok);
    u->value_error = copy_of(t->value_error, sizeof(float) * t->count, &ok);
  }
  if (ok) return KVQ_OK;
  undo_free(u);
  return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_append: out of host memory");
}

static void undo_restore(kvq_cache *cache, kvq_sequence *seq, const append_undo *u) {
  kvq_tracked *t = &seq->tracked;
  cache->free_count = u->free_count;
  kvq_page_table_changed(seq, u->pages ? 0 : u->page_count); /* the whole table where it was saved whole */
  seq->page_count = u->page_count;
  seq->page_end = u->page_end;
  if (u->pages) {
    memcpy(seq->pages, u->pages, sizeof(uint32_t) * u->page_count);
    memcpy(seq->page_index, u->page_index, sizeof(uint32_t) * u->page_count);
    memcpy(seq->alive, u->alive, sizeof(uint32_t) * u->page_count * cache->alive_words);
  }
  if (u->position) {
    memcpy(t->position, u->position, sizeof(uint32_t) * u->tracked_count);
    memcpy(t->attention, u->attention, sizeof(double) * u->tracked_count);
    memcpy(t->key_error, u->key_error, sizeof(float) * u->tracked_count);
    memcpy(t->value_error, u->value_error, sizeof(float) * u->tracked_count);
  }
  t->count = u->tracked_count;
  t->end = u->tracked_end;
}

/* Puts tokens [from, to) of one side in the staging buffer, in order: those below n come from the
 * ring (the window), the others from the packed new tokens, whose first is token n. */
static kvq_status stage(kvq_cache *cache, kvq_buffer *ring, uint64_t ring_offset, uint64_t token_bytes, uint32_t n,
                        const token_source *packed, uint32_t from, uint32_t to) {
  kvq_status st = KVQ_OK;
  const uint32_t old_end = to < n ? to : n;
  if (from < old_end) st = copy_from_ring(cache, ring, ring_offset, token_bytes, from, old_end - from, cache->staging, 0);
  const uint32_t new_from = from > n ? from : n;
  if (st == KVQ_OK && new_from < to) {
    st = put_tokens(cache, packed, (uint64_t)(new_from - n) * token_bytes, cache->staging, (uint64_t)(new_from - from) * token_bytes,
                    (uint64_t)(to - new_from) * token_bytes, NULL); /* scratch: a refused append may write it */
    if (st != KVQ_OK) st = kvq_fail_backend(cache->ctx, st, "staging new tokens");
  }
  return st;
}

static kvq_status append_call(kvq_cache *cache, uint32_t id, uint32_t layer, const kvq_tensor *keys, const kvq_tensor *values) {
  kvq_context *ctx = cache->ctx;
  kvq_status st;
  kvq_sequence *seq = kvq_sequence_layer_lookup(cache, id, layer, "kvq_append", &st);
  if (!seq) return st;
  const kvq_layer_config *L = &cache->layers[layer];
  const int64_t expect[3] = {-1, L->kv_heads, L->head_dim};
  if ((st = kvq_tensor_check(ctx, keys, "kvq_append keys", expect)) != KVQ_OK) return st;
  if ((st = kvq_tensor_check(ctx, values, "kvq_append values", expect)) != KVQ_OK) return st;
  if (keys->shape[0] != values->shape[0])
    return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_append: %lld key tokens but %lld value tokens",
                    (long long)keys->shape[0], (long long)values->shape[0]);
  const kvq_tensor *tensors[2] = {keys, values};
  for (int s = 0; s < 2; s++)
    if (tensors[s]->dtype != cache->config.input_dtype)
      return kvq_fail(ctx, KVQ_ERROR_DTYPE_MISMATCH, "kvq_append: %s are %s, the cache's input dtype is %s",
                      s ? "values" : "keys", kvq_dtype_name(tensors[s]->dtype), kvq_dtype_name(cache->config.input_dtype));

  for (int s = 0; s < 2; s++)
    if (!cache->storage[layer].learned[s])
      return kvq_fail(ctx, KVQ_ERROR_NO_CODEBOOK,
                      "kvq_append: layer %u's %s need codebooks: kvq_codebooks_learn or kvq_codebooks_load first", layer,
                      s ? "values" : "keys");
  kvq_seq_layer *state = &seq->layers[layer];
  const uint32_t P = cache->config.page_size, R = cache->config.residual_window;
  const uint64_t max_tokens = (uint64_t)cache->config.max_pages * P + R + P; /* the whole pool, nothing evicted */
  if (cache->config.policy.kind == KVQ_POLICY_KEEP_ALL && (uint64_t)keys->shape[0] + state->tokens > max_tokens)
    return kvq_fail(ctx, KVQ_ERROR_CAPACITY, "kvq_append: %lld tokens would make the sequence longer than the cache can hold",
                    (long long)keys->shape[0]);
  if ((uint64_t)keys->shape[0] + state->tokens > KVQ_MAX_POSITIONS)
    return kvq_fail(ctx, KVQ_ERROR_CAPACITY, "kvq_append: %lld tokens would take the sequence past position 2^31 - 1",
                    (long long)keys->shape[0]);
  const uint32_t count = (uint32_t)keys->shape[0];
  const uint32_t n = state->tokens, F = state->ring_start, n_new = n + count;
  uint32_t F_new = F;
  while (n_new - F_new >= R + P) F_new += P;
  const uint32_t quantized_new = state->quantized > F_new ? state->quantized : F_new;
  const uint32_t pages_needed = ceil_div(quantized_new, P); /* pages [0, pages_needed) exist afterwards */
  /* A page the policy may free must not be counted before the policy ran: capacity is checked
   * after it (below). */
  const uint64_t token_bytes = kvq_token_bytes(cache->config.input_dtype, L->kv_heads, L->head_dim);
  /* the new tokens of both sides, copied to the host or gathered into device scratch */
  if ((st = kvq_call_fits(ctx, kvq_size_mul3(2, token_bytes, count), "kvq_append")) != KVQ_OK) return st;
  kvq_policy_plan plan = {0};
  pending_errors pending = {0};
  append_undo undo = {0};
  kvq_page_backup pages_undo = {0};
  /* Device keys and values are read in place on the device after the checks below; their finite
   * and range checks run there too (docs/VULKAN.md says what differs from host tensors). */
  const int in_place = kvq_tensor_on_device(ctx, keys) && kvq_tensor_on_device(ctx, values) && ctx->backend->ops->check_tokens;
  /* Synchronously, a non-finite element, or one the method cannot store, refuses the append and
   * changes nothing, as for host tensors. Where the backend can stop its writes on the check word
   * (KVQ_BACKEND_IF_CLEAR), the whole append is recorded behind the checks and the word is read once at
   * the end, the call's one submission: every write to the pages and the window is skipped on the
   * device when a check failed, and the host bookkeeping is restored (`undo`). Elsewhere the word is
   * read before anything changes (a submission of its own). Asynchronously the checks are reported
   * by kvq_context_wait (kvq.h) and the append takes place. */
  const int behind_checks = in_place && !ctx->async && (ctx->backend->features & KVQ_BACKEND_IF_CLEAR);
  kvq_buffer *if_clear = NULL; /* the check word the append's writes wait on (behind_checks) */
  int writes_recorded = 0;     /* pages or window writes may be recorded: a failure must not submit them */
  uint8_t *packed[2] = {NULL, NULL};
  token_source sources[2] = {{0}};
  for (int s = 0; s < 2 && st == KVQ_OK && !in_place; s++) {
    /* A host tensor already packed in the input dtype (row-major, no gaps: the usual prefill) is
     * checked and copied to the device in place, as the packed copy would be: it is only read, and
     * only during this call (a backend whose writes may read it later, in asynchronous mode, gets a
     * copy: KVQ_BACKEND_WRITE_COPIES). Others are gathered (and device tensors staged) into host
     * memory. */
    const int in_call = !ctx->async || (ctx->backend->features & KVQ_BACKEND_WRITE_COPIES);
    const uint8_t *bytes = in_call ? kvq_tensor_packed_host(tensors[s], cache->config.input_dtype) : NULL;
    if (!bytes) {
      if (!(packed[s] = malloc(token_bytes * count))) {
        st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_append: out of host memory for %u tokens", count);
        break;
      }
      if ((st = kvq_tensor_read(ctx, tensors[s], packed[s], cache->config.input_dtype)) != KVQ_OK) break;
      bytes = packed[s];
    }
    sources[s].host = bytes;
    st = kvq_check_tokens(ctx, &cache->storage[layer].side[s].layout, cache->config.input_dtype, bytes, count,
                          s ? "kvq_append values" : "kvq_append keys", n);
  }
  if (in_place) { /* both sides' new tokens, gathered in the input dtype into one device buffer */
    kvq_buffer *tokens = NULL;
    ctx->checks_what = "kvq_append";
    st = kvq_scratch(cache, KVQ_SCRATCH_TOKENS, 2 * token_bytes * count, &tokens);
    for (int s = 0; s < 2 && st == KVQ_OK; s++) {
      sources[s] = (token_source){NULL, tokens, (uint64_t)s * token_bytes * count};
      st = kvq_tensor_gather_rows(ctx, tensors[s], 0, count, tokens, sources[s].offset, cache->config.input_dtype);
      if (st == KVQ_OK)
        st = kvq_device_tokens_check(ctx, &cache->storage[layer].side[s], cache->config.input_dtype, tokens, sources[s].offset, count);
    }
    if (st == KVQ_OK && !ctx->async && !behind_checks) st = kvq_device_checks_read(ctx);
    if (behind_checks) if_clear = ctx->checks;
  }
  if (st != KVQ_OK) goto done;
  /* The policy runs once per decoding step: before the step's first append, when every layer
   * holds the same tokens. It may free pages this append then uses, so it is planned first and
   * applied only once nothing can refuse the append any more: a refused append evicts nothing. */
  if (layer == 0 && count > 0 && kvq_sequence_in_step(cache, seq) &&
      (st = kvq_policy_plan_make(cache, seq, &plan)) != KVQ_OK)
    goto done;
  const uint32_t new_pages = pages_needed > seq->page_end ? pages_needed - seq->page_end : 0;
  if (new_pages > cache->free_count + plan.pages_freed) {
    st = kvq_fail(ctx, KVQ_ERROR_CAPACITY,
                  "kvq_append: needs %u new pages, %u of %u are free (%u more after evictions)", new_pages,
                  cache->free_count, cache->config.max_pages, plan.pages_freed);
    goto done;
  }
  /* reserved for the page table and statistics before the evictions shrink them: enough after */
  if ((st = kvq_reserve_page_table(cache, seq, seq->page_count + new_pages)) != KVQ_OK) goto done;
  if ((st = kvq_tracked_reserve(cache, seq, n_new)) != KVQ_OK) goto done;
  /* Saved for every append, not only those behind device checks: a host allocation or a device call
   * can still fail below (tests/test_fault.c), after the plan evicted and pages were taken. */
  if ((st = undo_save(cache, seq, &plan, &undo)) != KVQ_OK) goto done;
  const uint32_t free_before = cache->free_count; /* slots above it: freed by the plan's evictions */
  kvq_policy_plan_apply(cache, seq, &plan);
  /* On a backend that runs each operation as issued, pages holding what the cache was before the call
   * are kept before anything writes them (core/page_backup.c): slots the plan just evicted that the
   * append takes again (kvq_take_pages pops the top of the free stack and clears them in every layer),
   * and this layer's pages that exist already and are quantized again: a page an earlier flush left
   * partly filled, or one an append of another layer took (its bytes of this layer zeros, put back
   * by clearing them: decoding several layers copies nothing). */
  const int at_once = kvq_page_backup_wanted(ctx);
  for (uint32_t i = 0; at_once && i < new_pages && st == KVQ_OK; i++)
    if (cache->free_count - 1 - i >= free_before)
      for (uint32_t l = 0; l < cache->config.layer_count && st == KVQ_OK; l++)
        st = kvq_page_backup_add(cache, &pages_undo, l, cache->free_pages[cache->free_count - 1 - i], 0);
  for (uint32_t page = F / P; at_once && page < F_new / P && st == KVQ_OK; page++) {
    const uint32_t e = kvq_page_entry(seq, page);
    /* the layer quantized nothing into a page from its quantized count on */
    if (e != UINT32_MAX) st = kvq_page_backup_add(cache, &pages_undo, layer, seq->pages[e], page * P >= state->quantized);
  }
  if (st == KVQ_OK) st = kvq_page_backup_save(cache, &pages_undo);
  if (st != KVQ_OK) goto done;
  writes_recorded = 1; /* device work that changes the cache follows (behind the checks, if any) */

  /* From here on only backend (device) failures are possible, and the checks behind which the rest
   * is recorded. Both sides are quantized before either ring is written, so the window still holds
   * every token until the pages exist. */
  if ((st = kvq_take_pages(cache, seq, new_pages, if_clear, free_before)) != KVQ_OK) goto done;
  /* New positions get (zero) statistics before their pages are quantized, which adds errors to them;
   * undone (`undo`) if anything fails. */
  kvq_tracked_extend(seq, n_new);
  const uint64_t ring_offset = kvq_ring_offset(cache, layer, kvq_sequence_slot(cache, seq));
  const uint32_t chunk = cache->staging_pages * P;
  for (int s = 0; s < 2 && st == KVQ_OK; s++)
    for (uint32_t from = F; from < F_new && st == KVQ_OK; from += chunk) {
      const uint32_t to = F_new - from < chunk ? F_new : from + chunk;
      st = stage(cache, cache->storage[layer].ring[s], ring_offset, token_bytes, n, &sources[s], from, to);
      if (st == KVQ_OK)
        st = quantize_pages(cache, layer, s, seq, &pending, if_clear, from / P, (to - from) / P, P, cache->staging, 0,
                            (uint64_t)P * token_bytes);
    }
  /* The tokens that stay in the window go to their ring slots, written in place: a backend that runs
   * each copy at once (CUDA) has written one side's slots when the other side's copy, or anything
   * after, fails. When the new tokens [keep_from, n_new) reach a ring turn past the old window's first
   * token F, they may share slots with the old window [F, n), and then the whole old window is kept
   * in scratch first and copied back on failure, so a failed append leaves the window as it was. (Not
   * only the old tokens one turn before the new ones: an append of more than a turn overwrites old
   * tokens two turns before it, and the slots shared can be two runs, at both ends of the old window.)
   * One token at a time (decoding) keeps none: the ring holds R + P slots and never more than
   * R + P - 1 tokens, so n + 1 <= F + R + P. A backend that records the call
   * (KVQ_BACKEND_RECORDS: Vulkan) needs none of it and must not: its copies are recorded, not run,
   * and a failed call runs none of them (its recording is discarded, kvq_call_end; a failed
   * submission runs nothing), the copy into scratch neither (a copy back would then write stale
   * scratch over the window). */
  const uint32_t keep_from = n > F_new ? n : F_new, cap = cache->ring_capacity;
  const uint32_t kept_from = F;
  const uint32_t kept = st == KVQ_OK && at_once && n_new > F + cap ? n - F : 0;
  kvq_buffer *backup = NULL;
  int ring_written = 0;
  if (kept) st = kvq_scratch(cache, KVQ_SCRATCH_WINDOW, 2 * token_bytes * kept, &backup);
  for (int s = 0; s < 2 && kept && st == KVQ_OK; s++)
    st = copy_from_ring(cache, cache->storage[layer].ring[s], ring_offset, token_bytes, kept_from, kept, backup,
                        (uint64_t)s * token_bytes * kept);
  for (int s = 0; s < 2 && st == KVQ_OK; s++) {
    ring_written = 1;
    st = write_ring(cache, cache->storage[layer].ring[s], ring_offset, token_bytes, keep_from, n_new - keep_from, &sources[s],
                    (uint64_t)(keep_from - n) * token_bytes, if_clear);
  }
  /* the one submission: the checks, and whether the device skipped everything recorded behind them */
  if (st == KVQ_OK && behind_checks) st = kvq_device_checks_read(ctx);
  st = pending_wait(cache, &pending, st); /* no submission of its own when the checks read waited */
  /* the work done before the bookkeeping says so (nothing left when a wait above took it) */
  if (st == KVQ_OK) st = kvq_call_settle(ctx, 0, "kvq_append: quantizing and writing the window");
  if (st == KVQ_OK) {
    state->tokens = n_new;
    state->ring_start = F_new;
    state->quantized = quantized_new;
    pending_apply(cache, seq, &pending);
  } else if (ring_written && kept && st != KVQ_ERROR_DEVICE_LOST) {
    /* the old window back in its slots (status and message stay the failure's, unless this fails
     * too; a lost device's context is only good for destroying), ordered after the writes on the
     * device, before anything that reads the window */
    kvq_status back = KVQ_OK;
    for (int s = 0; s < 2 && back == KVQ_OK; s++) {
      const token_source saved = {NULL, backup, (uint64_t)s * token_bytes * kept};
      back = ring_put(cache, cache->storage[layer].ring[s], ring_offset, token_bytes, kept_from, kept, &saved, 0, NULL);
    }
    if (back != KVQ_OK) st = kvq_undo_failed(ctx, "the window tokens it overwrote");
  }
done:
  /* the pages it overwrote, after all it issued */
  st = kvq_page_backup_restore(cache, &pages_undo, st);
  kvq_page_backup_free(&pages_undo);
  /* refused by the checks, or a host or device failure after the bookkeeping changed */
  if (st != KVQ_OK && undo.saved) undo_restore(cache, seq, &undo);
  /* refused before anything was recorded behind the checks (capacity, host memory): the checks are
   * still reported first, as a host append reports its token checks before its capacity (reading them
   * runs only the gathers and checks). Once writes are recorded, reading them would run the writes
   * of a failed append: its recording is dropped unread instead (kvq_call_end). */
  if (st != KVQ_OK && behind_checks && ctx->checks_recorded && !writes_recorded) {
    const kvq_status checked = kvq_device_checks_read(ctx);
    if (checked != KVQ_OK) st = checked;
  }
  undo_free(&undo);
  kvq_policy_plan_free(&plan); /* a plan not applied */
  pending_free(&pending);
  free(packed[0]);
  free(packed[1]);
  return st;
}

static kvq_status flush_call(kvq_cache *cache, uint32_t id) {
  kvq_status st;
  kvq_sequence *seq = kvq_sequence_lookup(cache, id, "kvq_flush", &st);
  if (!seq) return st;
  const uint32_t P = cache->config.page_size;
  uint32_t pages_needed = seq->page_end;
  for (uint32_t l = 0; l < cache->config.layer_count; l++)
    if (ceil_div(seq->layers[l].tokens, P) > pages_needed) pages_needed = ceil_div(seq->layers[l].tokens, P);
  const uint32_t new_pages = pages_needed - seq->page_end;
  if (new_pages > cache->free_count)
    return kvq_fail(cache->ctx, KVQ_ERROR_CAPACITY, "kvq_flush: needs %u new pages, %u of %u are free", new_pages,
                    cache->free_count, cache->config.max_pages);
  if ((st = kvq_reserve_page_table(cache, seq, seq->page_count + new_pages)) != KVQ_OK) return st;
  /* The page bookkeeping before the pages are taken: given back when the call fails, so that a
   * failure changes nothing (no plan: nothing is allocated). */
  append_undo undo = {0};
  const kvq_policy_plan no_plan = {0};
  if ((st = undo_save(cache, seq, &no_plan, &undo)) != KVQ_OK) return st;
  pending_errors pending = {0};
  /* Pages that exist already and are quantized again in place (a page an earlier flush left partly
   * filled): kept first on a backend that runs each operation as issued, put back on failure
   * (core/page_backup.c). */
  kvq_page_backup pages_undo = {0};
  for (uint32_t l = 0; kvq_page_backup_wanted(cache->ctx) && l < cache->config.layer_count && st == KVQ_OK; l++)
    for (uint32_t page = seq->layers[l].ring_start / P; page < ceil_div(seq->layers[l].tokens, P) && st == KVQ_OK; page++) {
      const uint32_t e = seq->layers[l].quantized < seq->layers[l].tokens ? kvq_page_entry(seq, page) : UINT32_MAX;
      if (e != UINT32_MAX) st = kvq_page_backup_add(cache, &pages_undo, l, seq->pages[e], page * P >= seq->layers[l].quantized);
    }
  if (st == KVQ_OK) st = kvq_page_backup_save(cache, &pages_undo);
  if (st == KVQ_OK) st = kvq_take_pages(cache, seq, new_pages, NULL, 0);
  if (st != KVQ_OK) {
    undo_restore(cache, seq, &undo);
    undo_free(&undo);
    kvq_page_backup_free(&pages_undo);
    return st;
  }
  /* Every layer's pages first; the layers are marked flushed only once all of them are, and the
   * device work succeeded: a failure changes nothing. */
  for (uint32_t l = 0; l < cache->config.layer_count && st == KVQ_OK; l++) {
    kvq_seq_layer *state = &seq->layers[l];
    if (state->quantized == state->tokens) continue;
    const kvq_layer_config *L = &cache->layers[l];
    const uint64_t token_bytes = kvq_token_bytes(cache->config.input_dtype, L->kv_heads, L->head_dim);
    const uint64_t ring_offset = kvq_ring_offset(cache, l, kvq_sequence_slot(cache, seq));
    const uint32_t F = state->ring_start, n = state->tokens;
    /* F is page-aligned and the ring holds a multiple of P slots, so each page's tokens are
     * contiguous in the ring and are quantized in place: pages up to the ring's end in one job,
     * those that wrap to its start in a second. */
    for (int s = 0; s < 2 && st == KVQ_OK; s++)
      for (uint32_t first = F; first < n && st == KVQ_OK;) {
        const uint32_t slot = first % cache->ring_capacity;
        const uint32_t until_wrap = (cache->ring_capacity - slot) / P, pages_left = ceil_div(n - first, P);
        const uint32_t pages = pages_left < until_wrap ? pages_left : until_wrap;
        const uint32_t last = first + (pages - 1) * P;
        st = quantize_pages(cache, l, s, seq, &pending, NULL, first / P, pages, n - last < P ? n - last : P,
                            cache->storage[l].ring[s], ring_offset + (uint64_t)slot * token_bytes, (uint64_t)P * token_bytes);
        first += pages * P;
      }
  }
  /* Q-Hitter's errors come back with the call's one wait (dropped with a failed call's recording). */
  st = pending_wait(cache, &pending, st);
  if (st == KVQ_OK) st = kvq_call_settle(cache->ctx, 0, "kvq_flush: quantizing the windows");
  if (st == KVQ_OK) {
    for (uint32_t l = 0; l < cache->config.layer_count; l++) {
      kvq_seq_layer *state = &seq->layers[l];
      if (state->quantized == state->tokens) continue;
      state->ring_start = state->tokens / P * P;
      state->quantized = state->tokens;
    }
    pending_apply(cache, seq, &pending);
  } else {
    undo_restore(cache, seq, &undo);
    st = kvq_page_backup_restore(cache, &pages_undo, st); /* after all the call issued */
  }
  kvq_page_backup_free(&pages_undo);
  undo_free(&undo);
  pending_free(&pending);
  return st;
}

kvq_status kvq_append(kvq_cache *cache, uint32_t id, uint32_t layer, const kvq_tensor *keys, const kvq_tensor *values) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_call_begin(cache->ctx);
  return kvq_call_end(cache->ctx, append_call(cache, id, layer, keys, values));
}

kvq_status kvq_flush(kvq_cache *cache, uint32_t id) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_call_begin(cache->ctx);
  return kvq_call_end(cache->ctx, flush_call(cache, id));
}
