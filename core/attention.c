/*
 * The planner for attention, scores and dequantization: turns public calls into backend jobs.
 *
 * Attention for a batch of sequences runs PREPARE_QUERY (when the key method needs it), SCORE,
 * SOFTMAX and WEIGHTED_SUM, or the fused ATTENTION job when the backend offers one. Batches are cut
 * so that the score matrix stays within a scratch budget (a long prefill is split by query rows).
 * Results land in host scratch first and reach the caller's tensors only when everything succeeded.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "gpu_meta.h"
#include "internal.h"
#include "memory_limits.h"
#include "output_undo.h"
#include "policy.h"
#include "tensor.h"

/* Score and prepared-query floats per batch: 64 MiB of fp32. Bounds the memory of one step, not
 * the problem size. */
#define SCORE_BUDGET ((uint64_t)16 << 20)

typedef enum stage { STAGE_LOGITS, STAGE_PROBABILITIES, STAGE_OUTPUT } stage;

/* One block of queries of one sequence, packed on the host. */
typedef struct attend_item {
  kvq_sequence *seq;
  kvq_layer_view view;   /* the layer as the jobs see it: scores rows have view.slots + view.window */
  uint32_t mask;
  uint32_t rows;         /* query positions */
  uint32_t position;     /* causal: position of row 0 */
  const float *queries;  /* [rows][Hq][d]; NULL when read in place from device_queries */
  const kvq_tensor *device_queries; /* kvq_attention: a device tensor read in place (or NULL) */
  const kvq_tensor *device_output;  /* kvq_attention: a device tensor written in place (or NULL) */
  const kvq_tensor *device_scores;  /* kvq_scores: a device tensor written in place (or NULL) */
  const uint32_t *kept;  /* kvq_scores in place: the slot of each of the view.kept kept tokens */
  float *scores;         /* [rows][Hq][slots + window] (LOGITS / PROBABILITIES); NULL with device_scores */
  float *output;         /* [rows][Hq][d] (OUTPUT) */
  double *sums;          /* H2O, Q-Hitter: each slot's probability mass over the item's rows, applied to
                            the statistics only once the whole call succeeded (a failed call changes
                            nothing) */
} attend_item;

typedef struct batch {
  kvq_attention_seq *seqs;
  uint32_t *slots, *index, *alive; /* per listed page: pool slot, page number, kept masks */
  uint32_t seq_count, slot_count, rows;
  uint64_t score_floats, accumulate_floats;
  uint64_t budget_floats; /* scores and prepared queries: what SCORE_BUDGET bounds */
} batch;

static uint64_t row_width(const attend_item *it) { return (uint64_t)it->view.slots + it->view.window; }

/* What one query row of `width` scored tokens takes of SCORE_BUDGET: its scores and its prepared
 * query (CQ's tables are large). */
static uint64_t budget_per_row(const kvq_cache *cache, uint32_t layer, uint64_t width) {
  const kvq_layer_config *L = &cache->layers[layer];
  return (uint64_t)L->query_heads * (width + kvq_prepared_floats(&cache->storage[layer].side[KVQ_SIDE_KEYS].layout));
}

int kvq_attention_one_batch(const kvq_cache *cache, uint32_t layer, uint64_t rows, uint64_t width) {
  /* attend() closes a batch when the next rows would pass the budget: rows within it are one batch */
  return rows * budget_per_row(cache, layer, width) <= SCORE_BUDGET;
}

/* kvq_scores into a device tensor, in place: the kept columns of one sequence's score rows (the
 * batch's rows from score_offset, view.slots + view.window wide), one conversion per run of
 * consecutive kept slots, into rows [row0, + query_count) of the caller's tensor. */
static kvq_status scatter_scores(kvq_context *ctx, kvq_buffer *scores, const kvq_attention_seq *v, const attend_item *it,
                                 uint32_t row0, uint32_t query_heads, uint32_t checks) {
  const uint64_t width = (uint64_t)v->quantized + v->window;
  const int64_t strides[3] = {(int64_t)(query_heads * width), (int64_t)width, 1};
  kvq_status st = KVQ_OK;
  for (uint32_t j = 0, len; j < it->view.kept && st == KVQ_OK; j += len) {
    for (len = 1; j + len < it->view.kept && it->kept[j + len] == it->kept[j] + len;) len++;
    const uint32_t start[3] = {row0, 0, j}, shape[3] = {v->query_count, query_heads, len};
    st = kvq_tensor_scatter_block(ctx, scores, (v->score_offset + it->kept[j]) * 4, KVQ_DTYPE_F32, strides, it->device_scores,
                                  start, shape, checks);
  }
  return st;
}

/* Records the jobs for one batch whose views are built, and the reads of its results: its output rows
 * into `outputs` (when a part has a host output), the policy's sums into `sums`, both delivered by the
 * call's wait (*later, kvq_read_later); host scores are read at once. */
static kvq_status run_batch(kvq_cache *cache, uint32_t layer, stage upto, batch *b, attend_item *const *parts,
                            const uint32_t *part_row0, float *outputs, float *sums, int *later) {
  kvq_context *ctx = cache->ctx;
  kvq_backend *be = ctx->backend;
  const kvq_layer_storage *ls = &cache->storage[layer];
  const kvq_layer_config *L = &ls->config;
  const uint64_t row_floats = (uint64_t)L->query_heads * L->head_dim;
  const uint32_t pf = kvq_prepared_floats(&ls->side[KVQ_SIDE_KEYS].layout);
  kvq_buffer *queries, *prepared = NULL, *scores, *output = NULL, *accumulate = NULL;
  /* H2O and Q-Hitter learn from the attention the model computes (kvq_attention), not from scores
   * a caller inspects */
  const int accumulating = upto == STAGE_OUTPUT && kvq_policy_tracks(&cache->config.policy);
  kvq_status st;
  if ((st = kvq_scratch(cache, KVQ_SCRATCH_QUERIES, b->rows * row_floats * 4, &queries)) != KVQ_OK) return st;
  if (pf && (st = kvq_scratch(cache, KVQ_SCRATCH_PREPARED, (uint64_t)b->rows * L->query_heads * pf * 4, &prepared)) != KVQ_OK)
    return st;
  if ((st = kvq_scratch(cache, KVQ_SCRATCH_SCORES, b->score_floats * 4, &scores)) != KVQ_OK) return st;
  if (upto == STAGE_OUTPUT && (st = kvq_scratch(cache, KVQ_SCRATCH_OUTPUT, b->rows * row_floats * 4, &output)) != KVQ_OK)
    return st;
  if (accumulating && (st = kvq_scratch(cache, KVQ_SCRATCH_ACCUMULATE, b->accumulate_floats * 4, &accumulate)) != KVQ_OK)
    return st;
  for (uint32_t i = 0; i < b->seq_count; i++) {
    const attend_item *it = parts[i];
    if (it->device_queries) { /* converted in place on the device, checked there */
      if ((st = kvq_tensor_gather_rows(ctx, it->device_queries, part_row0[i], b->seqs[i].query_count, queries,
                                       (uint64_t)b->seqs[i].query_first * row_floats * 4, KVQ_DTYPE_F32)) != KVQ_OK)
        return st;
      continue;
    }
    st = be->ops->buffer_write(be, queries, (uint64_t)b->seqs[i].query_first * row_floats * 4,
                               it->queries + (uint64_t)part_row0[i] * row_floats, (uint64_t)b->seqs[i].query_count * row_floats * 4);
    if (st != KVQ_OK) return kvq_fail_backend(ctx, st, "uploading queries");
  }
  const uint32_t only = upto == STAGE_OUTPUT ? ctx->bench_jobs : 0u; /* kvq-bench's jobs alone (internal.h) */
  if (pf && only != KVQ_BENCH_JOBS_WEIGHTED_SUM) {
    kvq_job_prepare prep = {.keys = &ls->side[KVQ_SIDE_KEYS], .query_heads = L->query_heads,
                            .rows = b->rows * L->query_heads, .queries = queries, .out = prepared};
    if ((st = be->ops->prepare_queries(be, &prep)) != KVQ_OK) return kvq_fail_backend(ctx, st, "preparing queries");
  }
  kvq_job_attention job = {
      .keys = &ls->side[KVQ_SIDE_KEYS],
      .values = &ls->side[KVQ_SIDE_VALUES],
      .query_heads = L->query_heads,
      .window_dtype = cache->config.input_dtype,
      .scale = (float)(1.0 / sqrt((double)L->head_dim)),
      .seq_count = b->seq_count,
      .seqs = b->seqs,
      .page_slots = b->slots,
      .page_index = b->index,
      .page_alive = b->alive,
      .alive_words = cache->alive_words,
      .key_pages = ls->pages[KVQ_SIDE_KEYS],
      .value_pages = ls->pages[KVQ_SIDE_VALUES],
      .key_ring = ls->ring[KVQ_SIDE_KEYS],
      .value_ring = ls->ring[KVQ_SIDE_VALUES],
      .queries = queries,
      .prepared = prepared,
      .scores = scores,
      .output = output,
      .accumulate = accumulate,
  };
  if (be->features & KVQ_BACKEND_CORE_META) {
    /* core keeps the packed metadata, updated where page tables changed: no page is listed here */
    kvq_sequence **owners = malloc(sizeof *owners * b->seq_count);
    uint32_t *listed = malloc(sizeof *listed * b->seq_count);
    if (!owners || !listed) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory planning attention");
    for (uint32_t i = 0; st == KVQ_OK && i < b->seq_count; i++) owners[i] = parts[i]->seq, listed[i] = parts[i]->view.pages;
    job.page_slots = job.page_index = job.page_alive = NULL;
    if (st == KVQ_OK) st = kvq_gpu_meta_pack(cache, &job, b->seqs, owners, listed);
    free(owners);
    free(listed);
    if (st != KVQ_OK) return st;
  }
  if (only == KVQ_BENCH_JOBS_SCORE || only == KVQ_BENCH_JOBS_WEIGHTED_SUM) {
    st = only == KVQ_BENCH_JOBS_SCORE ? be->ops->score(be, &job) : be->ops->weighted_sum(be, &job);
    if (st != KVQ_OK) return kvq_fail_backend(ctx, st, "a benchmarked job");
  } else if (upto == STAGE_OUTPUT && only != KVQ_BENCH_JOBS_UNFUSED && be->ops->attention &&
             be->ops->supports(be, KVQ_JOB_ATTENTION, &job.keys->layout, &job.values->layout)) {
    if ((st = be->ops->attention(be, &job)) != KVQ_OK) return kvq_fail_backend(ctx, st, "attention");
  } else {
    if ((st = be->ops->score(be, &job)) != KVQ_OK) return kvq_fail_backend(ctx, st, "scoring");
    if (upto >= STAGE_PROBABILITIES && (st = be->ops->softmax(be, &job)) != KVQ_OK)
      return kvq_fail_backend(ctx, st, "softmax");
    if (upto == STAGE_OUTPUT && (st = be->ops->weighted_sum(be, &job)) != KVQ_OK)
      return kvq_fail_backend(ctx, st, "weighted sum");
  }
  /* Results come back with the call's one wait (attend): the batch's output rows in one read (its
   * sequences' rows lie one after the other, as in the call's `outputs`), the policy's sums in another
   * (kvq_read_later). Device outputs and scores are written in place here, recorded before that wait:
   * a backend that records (Vulkan) submits nothing of the call before its last step that can fail,
   * so a failed call writes none of them (its recording is dropped, kvq_reads_drop, kvq_call_end). */
  int host_outputs = 0;
  for (uint32_t i = 0; upto == STAGE_OUTPUT && i < b->seq_count; i++) host_outputs += !parts[i]->device_output;
  if (upto == STAGE_OUTPUT && host_outputs < (int)b->seq_count) {
    /* Device outputs, in place: every one checked (fp32 overflow, the output dtype's range) before
     * any is written, and none written when a check of the call failed (queries included). */
    for (int pass = 0; pass < 2 && st == KVQ_OK; pass++)
      for (uint32_t i = 0; i < b->seq_count && st == KVQ_OK; i++)
        if (parts[i]->device_output)
          st = kvq_tensor_scatter_rows(ctx, output, (uint64_t)b->seqs[i].query_first * row_floats * 4, parts[i]->device_output,
                                       part_row0[i], b->seqs[i].query_count,
                                       pass ? KVQ_JOB_CONVERT_IF_CLEAR : KVQ_JOB_CONVERT_FITS | KVQ_JOB_CONVERT_NO_WRITE);
    if (st != KVQ_OK) return st;
  }
  if (upto == STAGE_OUTPUT && host_outputs) {
    st = kvq_read_later(ctx, output, 0, outputs, b->rows * row_floats * 4, later);
  } else if (upto != STAGE_OUTPUT) {
    /* Device scores, in place: checked (finite, masked logits aside; the scores' dtype) before any
     * is written, as outputs are. */
    const uint32_t check = KVQ_JOB_CONVERT_FITS | KVQ_JOB_CONVERT_NO_WRITE | (upto == STAGE_LOGITS ? KVQ_JOB_CONVERT_MASKED : 0u);
    for (int pass = 0; pass < 2 && st == KVQ_OK; pass++)
      for (uint32_t i = 0; i < b->seq_count && st == KVQ_OK; i++)
        if (parts[i]->device_scores)
          st = scatter_scores(ctx, scores, &b->seqs[i], parts[i], part_row0[i], L->query_heads, pass ? KVQ_JOB_CONVERT_IF_CLEAR : check);
    if (st != KVQ_OK) return st;
    /* host scores: a wait per read (a scores call writes nothing in place then) */
    for (uint32_t i = 0; st == KVQ_OK && i < b->seq_count; i++) {
      const kvq_attention_seq *v = &b->seqs[i];
      if (parts[i]->device_scores) continue;
      const uint64_t n = (uint64_t)v->quantized + v->window;
      st = be->ops->buffer_read(be, scores, v->score_offset * 4, parts[i]->scores + (uint64_t)part_row0[i] * L->query_heads * n,
                                (uint64_t)v->query_count * L->query_heads * n * 4);
    }
  }
  if (st != KVQ_OK) return kvq_fail_backend(ctx, st, "reading results");
  if (accumulating && (st = kvq_read_later(ctx, accumulate, 0, sums, b->accumulate_floats * 4, later)) != KVQ_OK)
    return kvq_fail_backend(ctx, st, "reading attention sums");
  return KVQ_OK;
}

/* What the call's batches read back, delivered by its one wait (attend). */
typedef struct call_results {
  float *outputs;  /* every query row of the call, in the items' order (NULL: no host output) */
  float *sums;     /* the policy's sums of every part, in the parts' order (NULL: not accumulating) */
  size_t parts;    /* parts of the batches recorded so far */
  uint64_t rows, sums_at; /* their rows, and their floats of sums */
  int later;       /* reads recorded for the wait (kvq_read_later) */
} call_results;

/* Records the batch being built (its parts follow the r->parts recorded before it) and starts the next. */
static kvq_status record_batch(kvq_cache *cache, uint32_t layer, stage upto, batch *b, attend_item **parts,
                               const uint32_t *part_row0, call_results *r) {
  const uint64_t row_floats = (uint64_t)cache->layers[layer].query_heads * cache->layers[layer].head_dim;
  const kvq_status st = run_batch(cache, layer, upto, b, parts + r->parts, part_row0 + r->parts,
                                  r->outputs ? r->outputs + r->rows * row_floats : NULL,
                                  r->sums ? r->sums + r->sums_at : NULL, &r->later);
  r->parts += b->seq_count;
  r->rows += b->rows;
  r->sums_at += b->accumulate_floats;
  b->seq_count = b->slot_count = b->rows = 0;
  b->score_floats = b->accumulate_floats = b->budget_floats = 0;
  return st;
}

/* Splits the items into batches within the score budget and runs them. `outputs` (NULL for scores, or
 * when no item has a host output): room for every query row of the items, in order, where the items'
 * host outputs point. */
static kvq_status attend(kvq_cache *cache, uint32_t layer, stage upto, attend_item *items, size_t count, float *outputs) {
  const kvq_layer_config *L = &cache->layers[layer];
  const uint32_t words = cache->alive_words;
  const int accumulating = upto == STAGE_OUTPUT && kvq_policy_tracks(&cache->config.policy);
  /* with core's packed metadata (KVQ_BACKEND_CORE_META) the batch lists no pages */
  const int list_pages = !(cache->ctx->backend->features & KVQ_BACKEND_CORE_META);
  size_t total_pages = 0, parts_max = 0;
  uint64_t sums_floats = 0;
  for (size_t i = 0; i < count; i++) {
    const uint64_t floats_per_row = budget_per_row(cache, layer, row_width(&items[i]));
    const uint64_t rows_per_part = floats_per_row ? SCORE_BUDGET / floats_per_row : items[i].rows;
    const uint64_t parts_of_item = rows_per_part ? (items[i].rows + rows_per_part - 1) / rows_per_part : items[i].rows;
    if (list_pages) total_pages += items[i].view.pages * (size_t)parts_of_item; /* a split item lists its pages per part */
    parts_max += (size_t)parts_of_item;
    sums_floats += parts_of_item * row_width(&items[i]);
  }
  batch b = {0};
  call_results r = {.outputs = outputs};
  b.seqs = malloc(sizeof *b.seqs * (parts_max ? parts_max : 1));
  b.slots = malloc(sizeof *b.slots * (total_pages ? total_pages : 1));
  b.index = malloc(sizeof *b.index * (total_pages ? total_pages : 1));
  b.alive = malloc(sizeof *b.alive * (total_pages ? total_pages : 1) * words);
  /* every part of the call, in order: a batch's parts follow those of the batches before it */
  attend_item **parts = calloc(parts_max ? parts_max : 1, sizeof *parts);
  uint32_t *part_row0 = calloc(parts_max ? parts_max : 1, sizeof *part_row0);
  /* host memory first: nothing recorded can then be left behind by a failed allocation */
  if (accumulating) r.sums = malloc(sizeof(float) * (sums_floats ? sums_floats : 1));
  kvq_status st = KVQ_OK;
  if (!b.seqs || !b.slots || !b.index || !b.alive || !parts || !part_row0 || (accumulating && !r.sums)) {
    st = kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory planning attention");
    goto done;
  }
  for (size_t i = 0; i < count && st == KVQ_OK; i++) {
    attend_item *it = &items[i];
    const uint64_t n = row_width(it);
    const uint64_t score_floats = (uint64_t)L->query_heads * n, floats_per_row = budget_per_row(cache, layer, n);
    uint32_t rows_per_part = (uint32_t)(SCORE_BUDGET / floats_per_row);
    if (rows_per_part == 0) rows_per_part = 1; /* one row always fits: n <= 2^31 tokens */
    for (uint32_t row0 = 0; row0 < it->rows && st == KVQ_OK; row0 += rows_per_part) {
      uint32_t rows = it->rows - row0 < rows_per_part ? it->rows - row0 : rows_per_part;
      if (b.seq_count > 0 && b.budget_floats + rows * floats_per_row > SCORE_BUDGET &&
          (st = record_batch(cache, layer, upto, &b, parts, part_row0, &r)) != KVQ_OK)
        break;
      const uint32_t pages = it->view.pages;
      b.seqs[b.seq_count] = (kvq_attention_seq){
          .page_first = b.slot_count,
          .quantized = it->view.slots,
          .window = it->view.window,
          .window_first = it->view.window_first,
          .ring_capacity = cache->ring_capacity,
          .ring_offset = kvq_ring_offset(cache, layer, kvq_sequence_slot(cache, it->seq)),
          .query_first = b.rows,
          .query_count = rows,
          .query_position = it->position + row0,
          .mask = it->mask,
          .score_offset = b.score_floats,
          .accumulate_offset = b.accumulate_floats,
      };
      if (pages && list_pages) {
        memcpy(b.slots + b.slot_count, it->seq->pages, sizeof(uint32_t) * pages);
        memcpy(b.index + b.slot_count, it->seq->page_index, sizeof(uint32_t) * pages);
        memcpy(b.alive + (size_t)b.slot_count * words, it->seq->alive, sizeof(uint32_t) * pages * words);
      }
      parts[r.parts + b.seq_count] = it;
      part_row0[r.parts + b.seq_count] = row0;
      b.seq_count++;
      b.slot_count += pages;
      b.rows += rows;
      b.score_floats += rows * score_floats;
      b.budget_floats += rows * floats_per_row;
      b.accumulate_floats += n;
    }
  }
  if (st == KVQ_OK && b.seq_count > 0) st = record_batch(cache, layer, upto, &b, parts, part_row0, &r);
  /* The call's one wait: every batch's reads, and, with the policy, the device checks its statistics
   * wait on (kvq_attention), read with them. A failed call drops its reads with its recording
   * instead, device outputs' writes included: nothing of it runs. */
  if (st == KVQ_OK && accumulating) st = kvq_device_checks_read(cache->ctx);
done:
  if (st != KVQ_OK) kvq_reads_drop(cache->ctx, &r.later);
  const kvq_status waited = kvq_reads_wait(cache->ctx, &r.later);
  if (st == KVQ_OK && waited != KVQ_OK) st = kvq_fail_backend(cache->ctx, waited, "reading results");
  /* Results on the host: the call's work finished before the caller's host arrays or the statistics
   * change (a backend that times its work, CUDA, ends the span here; nothing is left to submit where
   * the reads waited) */
  int host_results = outputs || accumulating;
  for (size_t i = 0; i < count; i++) host_results |= upto != STAGE_OUTPUT && !items[i].device_scores;
  if (st == KVQ_OK && host_results) st = kvq_call_settle(cache->ctx, 1, "finishing");
  uint64_t at = 0;
  for (size_t p = 0; st == KVQ_OK && r.sums && p < r.parts; p++) { /* the parts of one item add up */
    const uint64_t n = row_width(parts[p]);
    for (uint64_t t = 0; t < n; t++) parts[p]->sums[t] += r.sums[at + t];
    at += n;
  }
  free(b.seqs);
  free(b.slots);
  free(b.index);
  free(b.alive);
  free(parts);
  free(part_row0);
  free(r.sums);
  return st;
}

/* Queries must be finite: a NaN would silently poison every score it touches. */
static kvq_status check_finite_queries(kvq_context *ctx, const float *q, uint64_t count, const char *what) {
  for (uint64_t i = 0; i < count; i++)
    if (!isfinite(q[i]))
      return kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "%s: element %llu is %g", what, (unsigned long long)i, (double)q[i]);
  return KVQ_OK;
}

/* Finite inputs can still overflow fp32 (queries or keys near FLT_MAX): report it, do not return
 * NaN as a success. Masked logits are -inf by definition and are skipped. */
static kvq_status check_finite_results(kvq_context *ctx, const float *x, uint64_t count, int logits, const char *what) {
  for (uint64_t i = 0; i < count; i++)
    if (!isfinite(x[i]) && !(logits && x[i] == -INFINITY))
      return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                      "%s: the result overflowed fp32 (element %llu is %g): queries or keys are too large", what,
                      (unsigned long long)i, (double)x[i]);
  return KVQ_OK;
}

/* Results go out in the caller's dtype: a value beyond fp16 or bf16 range would become Inf there. */
static kvq_status check_fits(kvq_context *ctx, const float *x, uint64_t count, kvq_dtype dtype, const char *what) {
  const float limit = dtype == KVQ_DTYPE_F16 ? 65504.0f : dtype == KVQ_DTYPE_BF16 ? 0x1.fep127f : INFINITY;
  for (uint64_t i = 0; i < count && dtype != KVQ_DTYPE_F32; i++)
    if (fabsf(x[i]) > limit && isfinite(x[i]) && fabsf(kvq_round_to(dtype, x[i])) > limit)
      return kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "%s: result %g does not fit the output's %s", what, (double)x[i],
                      kvq_dtype_name(dtype));
  return KVQ_OK;
}

/* Validates one block of queries and fills an item (queries packed to fp32, owned by the caller). */
static kvq_status prepare_item(kvq_cache *cache, uint32_t layer, uint32_t id, kvq_mask mask, const kvq_tensor *queries,
                               const char *what, attend_item *it) {
  kvq_context *ctx = cache->ctx;
  kvq_status st;
  kvq_sequence *seq = kvq_sequence_layer_lookup(cache, id, layer, what, &st);
  if (!seq) return st;
  const kvq_layer_config *L = &cache->layers[layer];
  const int64_t expect[3] = {-1, L->query_heads, L->head_dim};
  if ((st = kvq_tensor_check(ctx, queries, what, expect)) != KVQ_OK) return st;
  if (mask != KVQ_MASK_CAUSAL && mask != KVQ_MASK_NONE)
    return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: unknown mask %d", what, (int)mask);
  const uint32_t n = seq->layers[layer].tokens;
  if (n == 0) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE, "%s: sequence %u has no tokens in layer %u", what, id, layer);
  if (mask == KVQ_MASK_CAUSAL && queries->shape[0] > n)
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE,
                    "%s: %lld causal queries but the sequence has %u tokens (causal queries are its last positions)", what,
                    (long long)queries->shape[0], n);
  it->seq = seq;
  kvq_layer_view_get(cache, seq, layer, &it->view);
  it->mask = (uint32_t)mask;
  it->rows = (uint32_t)queries->shape[0];
  it->position = mask == KVQ_MASK_CAUSAL ? n - it->rows : 0;
  return KVQ_OK;
}

static kvq_status check_layer(kvq_cache *cache, uint32_t layer, const char *what) {
  if (layer < cache->config.layer_count) return KVQ_OK;
  return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_RANGE, "%s: layer %u, the cache has %u layers", what, layer,
                  cache->config.layer_count);
}

/* kvq_attention's `staged` device outputs that are not written in place (kvq_tensor_on_device: a
 * 16-bit VkBuffer tensor not ending on a word, or one of 2^32 elements), from their host rows. */
static kvq_status write_staged(kvq_context *ctx, const kvq_attention_request *requests, const attend_item *items, size_t count,
                               size_t staged) {
  const kvq_tensor **tensors = malloc(sizeof *tensors * staged);
  const float **rows = malloc(sizeof *rows * staged);
  kvq_status st = tensors && rows ? KVQ_OK : kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_attention: out of host memory");
  for (size_t i = 0, n = 0; i < count && st == KVQ_OK; i++)
    if (items[i].output && requests[i].output.memory != KVQ_MEMORY_HOST) tensors[n] = &requests[i].output, rows[n++] = items[i].output;
  if (st == KVQ_OK) st = kvq_tensors_write(ctx, staged, tensors, rows);
  free(tensors);
  free(rows);
  return st;
}

static kvq_status attention_call(kvq_cache *cache, uint32_t layer, const kvq_attention_request *requests, size_t count,
                                 kvq_output_undo *undo) {
  kvq_context *ctx = cache->ctx;
  kvq_status st = check_layer(cache, layer, "kvq_attention");
  if (st != KVQ_OK) return st;
  if (count == 0) return KVQ_OK;
  if (!requests) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_attention: requests is NULL");
  if (count > SIZE_MAX / sizeof(kvq_attention_request)) /* no such array can exist */
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE, "kvq_attention: %zu requests", count);
  const kvq_layer_config *L = &cache->layers[layer];
  attend_item *items = calloc(count, sizeof *items);
  if (!items) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_attention: out of host memory");
  for (size_t i = 0; i < count && st == KVQ_OK; i++) {
    st = prepare_item(cache, layer, requests[i].sequence, requests[i].mask, &requests[i].queries,
                      "kvq_attention queries", &items[i]);
    const int64_t expect[3] = {requests[i].queries.shape[0], L->query_heads, L->head_dim};
    if (st == KVQ_OK) st = kvq_tensor_check(ctx, &requests[i].output, "kvq_attention output", expect);
  }
  const uint64_t row_floats = (uint64_t)L->query_heads * L->head_dim;
  /* every request's queries and outputs in fp32 (host copies, or device scratch of the same size) */
  uint64_t working = 0;
  for (size_t i = 0; i < count && st == KVQ_OK; i++) working = kvq_size_mul_add(items[i].rows, 2 * row_floats * 4, working);
  if (st == KVQ_OK) st = kvq_call_fits(ctx, working, "kvq_attention");
  ctx->checks_what = "kvq_attention";
  /* Host outputs are read back into one array of every request's rows, in order (the rows of the
   * call's batches follow each other so: one read per batch), where each item's output points. */
  uint64_t total_rows = 0;
  int host_outputs = 0;
  int staged_outputs = 0;
  for (size_t i = 0; i < count && st == KVQ_OK; i++) {
    /* device tensors are read and written in place (and checked there) where the backend can */
    if (kvq_tensor_on_device(ctx, &requests[i].queries)) items[i].device_queries = &requests[i].queries;
    if (kvq_tensor_on_device(ctx, &requests[i].output)) items[i].device_output = &requests[i].output;
    staged_outputs |= !items[i].device_output && requests[i].output.memory != KVQ_MEMORY_HOST;
    host_outputs |= !items[i].device_output;
    total_rows += items[i].rows;
  }
  /* A device output written through host memory (staged: kvq_tensor_on_device) is read and written
   * after the wait for the rows it needs, which would run the in-place writes of the others with it,
   * so that a failure staging it would leave those written. With one staged, every device output is
   * (as kvq_dequantize does): all written together by the call's last recording, which a failed call
   * drops whole. */
  for (size_t i = 0; i < count && staged_outputs; i++) items[i].device_output = NULL;
  float *outputs = st == KVQ_OK && host_outputs ? malloc(total_rows * row_floats * 4 + 4) : NULL;
  if (st == KVQ_OK && host_outputs && !outputs) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_attention: out of host memory");
  for (size_t i = 0, row = 0; i < count && st == KVQ_OK; row += items[i].rows, i++) {
    float *q = items[i].device_queries ? NULL : malloc(items[i].rows * row_floats * 4);
    items[i].output = items[i].device_output ? NULL : outputs + row * row_floats;
    items[i].queries = q;
    if (kvq_policy_tracks(&cache->config.policy)) items[i].sums = calloc(row_width(&items[i]) + 1, sizeof(double));
    if ((!q && !items[i].device_queries) || (kvq_policy_tracks(&cache->config.policy) && !items[i].sums)) {
      st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_attention: out of host memory");
    } else if (q) {
      st = kvq_tensor_read(ctx, &requests[i].queries, q, KVQ_DTYPE_F32);
      if (st == KVQ_OK) st = check_finite_queries(ctx, q, items[i].rows * row_floats, "kvq_attention queries");
    }
  }
  /* device outputs saved before any is written, where a failed call would leave them written (CUDA) */
  int undoing = 0;
  for (size_t i = 0; i < count && st == KVQ_OK; i++) undoing |= kvq_output_undo_needed(ctx, &requests[i].output);
  const kvq_tensor **saving = undoing ? malloc(sizeof *saving * count) : NULL;
  if (undoing && !saving) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_attention: out of host memory");
  for (size_t i = 0; i < count && saving; i++) saving[i] = &requests[i].output;
  if (saving && st == KVQ_OK) st = kvq_output_undo_save(cache, saving, count, undo);
  free(saving);
  /* with the policy, attend reads the device checks too: its statistics count only a call that
   * succeeded */
  if (st == KVQ_OK) st = attend(cache, layer, STAGE_OUTPUT, items, count, outputs);
  for (size_t i = 0; i < count && st == KVQ_OK; i++) {
    if (!items[i].output) continue; /* checked on the device */
    st = check_finite_results(ctx, items[i].output, items[i].rows * row_floats, 0, "kvq_attention");
    if (st == KVQ_OK)
      st = check_fits(ctx, items[i].output, items[i].rows * row_floats, requests[i].output.dtype, "kvq_attention");
  }
  /* Every output written before the statistics change (a failed write leaves them all as they were):
   * device outputs written through host memory first, together (write_staged), host outputs last. */
  size_t staged = 0;
  for (size_t i = 0; i < count; i++) staged += items[i].output && requests[i].output.memory != KVQ_MEMORY_HOST;
  if (st == KVQ_OK && staged) st = write_staged(ctx, requests, items, count, staged);
  /* their writes run (recorded, Vulkan) before the statistics change: a failed submission leaves
   * the cache as it was */
  if (st == KVQ_OK && staged) st = kvq_call_settle(ctx, 0, "kvq_attention: writing device outputs");
  for (size_t i = 0; i < count && st == KVQ_OK; i++)
    if (items[i].output && requests[i].output.memory == KVQ_MEMORY_HOST) kvq_tensor_scatter(&requests[i].output, items[i].output);
  for (size_t i = 0; i < count && st == KVQ_OK; i++)
    if (items[i].sums) kvq_policy_add_attention(cache, items[i].seq, &items[i].view, items[i].sums);
  for (size_t i = 0; i < count; i++) {
    free((void *)items[i].queries);
    free(items[i].sums);
  }
  free(outputs);
  free(items);
  return st;
}

static kvq_status scores_call(kvq_cache *cache, uint32_t id, uint32_t layer, const kvq_tensor *queries, kvq_mask mask,
                              kvq_score_kind kind, const kvq_tensor *scores, kvq_output_undo *undo) {
  kvq_context *ctx = cache->ctx;
  kvq_status st = check_layer(cache, layer, "kvq_scores");
  if (st != KVQ_OK) return st;
  if (kind != KVQ_SCORES_LOGITS && kind != KVQ_SCORES_PROBABILITIES)
    return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_scores: unknown score kind %d", (int)kind);
  attend_item item = {0};
  if ((st = prepare_item(cache, layer, id, mask, queries, "kvq_scores queries", &item)) != KVQ_OK) return st;
  const uint32_t n = item.view.kept, width = (uint32_t)row_width(&item);
  const int64_t expect[3] = {queries->shape[0], cache->layers[layer].query_heads, n};
  if ((st = kvq_tensor_check(ctx, scores, "kvq_scores scores", expect)) != KVQ_OK) return st;
  const kvq_layer_config *L = &cache->layers[layer];
  const uint64_t rows = (uint64_t)item.rows * L->query_heads;
  /* the queries, every row's scores and the kept list (host copies, or device scratch) */
  const uint64_t working = kvq_size_add(kvq_size_mul3(rows, L->head_dim, 4), kvq_size_mul_add(rows, (uint64_t)width * 4, (uint64_t)n * 4));
  if ((st = kvq_call_fits(ctx, working, "kvq_scores")) != KVQ_OK) return st;
  /* device tensors are read and written in place (and checked there) where the backend can */
  const int device_queries = kvq_tensor_on_device(ctx, queries), device_scores = kvq_tensor_on_device(ctx, scores);
  float *q = device_queries ? NULL : malloc(rows * L->head_dim * 4);
  item.scores = device_scores ? NULL : malloc(rows * width * 4 + 4);
  uint32_t *kept = malloc(sizeof(uint32_t) * n + 4);
  item.queries = q;
  if ((!q && !device_queries) || (!item.scores && !device_scores) || !kept)
    st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_scores: out of host memory");
  ctx->checks_what = "kvq_scores";
  if (st == KVQ_OK) {
    kvq_layer_view_kept(cache, item.seq, &item.view, kept, NULL);
    item.kept = kept;
    item.device_queries = device_queries ? queries : NULL;
    item.device_scores = device_scores ? scores : NULL;
  }
  if (st == KVQ_OK && q) {
    st = kvq_tensor_read(ctx, queries, q, KVQ_DTYPE_F32);
    if (st == KVQ_OK) st = check_finite_queries(ctx, q, rows * L->head_dim, "kvq_scores queries");
  }
  if (st == KVQ_OK) st = kvq_output_undo_save(cache, &scores, 1, undo);
  if (st == KVQ_OK) st = attend(cache, layer, kind == KVQ_SCORES_LOGITS ? STAGE_LOGITS : STAGE_PROBABILITIES, &item, 1, NULL);
  if (st == KVQ_OK && !device_scores) {
    if (n != width) /* evicted tokens' slots leave the rows: kept tokens only, in order */
      for (uint64_t r = 0; r < rows; r++)
        for (uint32_t j = 0; j < n; j++) item.scores[r * n + j] = item.scores[r * width + kept[j]];
    st = check_finite_results(ctx, item.scores, rows * n, kind == KVQ_SCORES_LOGITS, "kvq_scores");
    if (st == KVQ_OK) st = check_fits(ctx, item.scores, rows * n, scores->dtype, "kvq_scores");
    /* the call's work done before the output is written (kvq_attention) */
    if (st == KVQ_OK) st = kvq_call_settle(ctx, 0, "kvq_scores");
    if (st == KVQ_OK) st = kvq_tensor_write(ctx, scores, item.scores);
  }
  free(q);
  free(kept);
  free(item.scores);
  return st;
}

/* Decodes kept tokens [first, first + count) of one side into out[count][kv_heads][head_dim] fp32:
 * `slot` gives each kept token's slot in the layer's view (page slots, then the window). Pages are
 * decoded in runs of at most KVQ_STAGING_PAGES listed pages per job. Every read goes through
 * kvq_read_later (*later), so the call's tokens come back with one wait: the decoded ones straight
 * into out, the window's in the input dtype into raw (token i at raw's token i - *in_window), for
 * the caller to convert once it has waited. */
static kvq_status dequantize_side(kvq_cache *cache, const kvq_sequence *seq, uint32_t layer, int side,
                                  const kvq_layer_view *view, const uint32_t *slot, uint32_t count, float *out,
                                  uint8_t *raw, uint32_t *in_window, int *later) {
  kvq_context *ctx = cache->ctx;
  kvq_backend *be = ctx->backend;
  const kvq_layer_storage *ls = &cache->storage[layer];
  const uint32_t P = cache->config.page_size;
  const uint64_t token_floats = (uint64_t)ls->config.kv_heads * ls->config.head_dim;
  kvq_status st = KVQ_OK;
  uint32_t k = 0;
  while (k < count && slot[k] < view->slots && st == KVQ_OK) { /* quantized part: decode the listed pages it spans */
    const uint32_t page0 = slot[k] / P;
    uint32_t end = k;
    while (end < count && slot[end] < view->slots && slot[end] / P - page0 < KVQ_STAGING_PAGES) end++;
    const uint32_t pages = slot[end - 1] / P - page0 + 1;
    kvq_buffer *scratch;
    if ((st = kvq_scratch(cache, KVQ_SCRATCH_OUTPUT, (uint64_t)pages * P * token_floats * 4, &scratch)) != KVQ_OK) return st;
    kvq_job_dequantize job = {.side = &ls->side[side], .pages = ls->pages[side], .count = pages,
                              .slots = seq->pages + page0, .out = scratch};
    if ((st = be->ops->dequantize(be, &job)) != KVQ_OK) return kvq_fail_backend(ctx, st, "dequantizing");
    for (; k < end && st == KVQ_OK; k++) { /* the copy is recorded before the next run reuses scratch */
      st = kvq_read_later(ctx, scratch, (uint64_t)(slot[k] - page0 * P) * token_floats * 4, out + k * token_floats,
                          token_floats * 4, later);
      if (st != KVQ_OK) return kvq_fail_backend(ctx, st, "reading dequantized tokens");
    }
  }
  *in_window = k;
  const uint64_t token_bytes = kvq_token_bytes(cache->config.input_dtype, ls->config.kv_heads, ls->config.head_dim);
  const uint64_t ring_offset = kvq_ring_offset(cache, layer, kvq_sequence_slot(cache, seq));
  for (; k < count && st == KVQ_OK; k++) { /* window tokens */
    const uint32_t position = view->window_first + (slot[k] - view->slots);
    st = kvq_read_later(ctx, ls->ring[side], ring_offset + (uint64_t)(position % cache->ring_capacity) * token_bytes,
                        raw + (uint64_t)(k - *in_window) * token_bytes, token_bytes, later);
    if (st != KVQ_OK) st = kvq_fail_backend(ctx, st, "reading the window");
  }
  return st;
}

/* Decoded tokens of kvq_dequantize written in place into device tensors: every page the kept tokens
 * [first, first + count) span decoded by one DEQUANTIZE job per side into scratch, then one conversion
 * per run of consecutive kept slots (window tokens straight from the ring, converted from the input
 * dtype), with the 16-bit outputs' range checked before any is written (the host path's check_fits). */
#define DEQUANTIZE_IN_PLACE_BUDGET ((uint64_t)256 << 20) /* bytes of decoded pages; larger calls are staged */

/* The listed pages the kept tokens at `slot` span ([*page0, + result)), and how many of the tokens
 * lie in pages (*quantized; the rest are window tokens). */
static uint32_t spanned_pages(const kvq_cache *cache, const kvq_layer_view *view, const uint32_t *slot, uint32_t count,
                              uint32_t *quantized, uint32_t *page0) {
  const uint32_t P = cache->config.page_size;
  uint32_t q = 0;
  while (q < count && slot[q] < view->slots) q++;
  *quantized = q;
  *page0 = q ? slot[0] / P : 0;
  return q ? slot[q - 1] / P - *page0 + 1 : 0;
}

static int dequantize_in_place_fits(const kvq_cache *cache, uint32_t layer, const kvq_layer_view *view, const uint32_t *slot,
                                    uint32_t count) {
  uint32_t quantized, page0;
  const uint64_t pages = spanned_pages(cache, view, slot, count, &quantized, &page0);
  return 2 * pages * cache->config.page_size * cache->layers[layer].kv_heads * cache->layers[layer].head_dim * 4 <=
         DEQUANTIZE_IN_PLACE_BUDGET;
}

static kvq_status dequantize_in_place(kvq_cache *cache, const kvq_sequence *seq, uint32_t layer, const kvq_layer_view *view,
                                      const uint32_t *slot, uint32_t count, const kvq_tensor *const outs[2]) {
  kvq_context *ctx = cache->ctx;
  kvq_backend *be = ctx->backend;
  const kvq_layer_storage *ls = &cache->storage[layer];
  const uint32_t P = cache->config.page_size, d = ls->config.head_dim;
  const uint64_t token_floats = (uint64_t)ls->config.kv_heads * d;
  const kvq_dtype dtype = cache->config.input_dtype;
  const uint64_t token_bytes = kvq_token_bytes(dtype, ls->config.kv_heads, d);
  const uint64_t ring_offset = kvq_ring_offset(cache, layer, kvq_sequence_slot(cache, seq));
  uint32_t quantized, page0;
  const uint32_t pages = spanned_pages(cache, view, slot, count, &quantized, &page0);
  const uint64_t side_floats = (uint64_t)pages * P * token_floats;
  kvq_buffer *decoded = NULL;
  kvq_status st = pages ? kvq_scratch(cache, KVQ_SCRATCH_OUTPUT, 2 * side_floats * 4, &decoded) : KVQ_OK;
  for (int s = 0; s < 2 && st == KVQ_OK && pages; s++) {
    if (!outs[s]) continue;
    kvq_job_dequantize job = {.side = &ls->side[s], .pages = ls->pages[s], .count = pages, .slots = seq->pages + page0,
                              .out = decoded, .out_offset = s * side_floats * 4};
    if ((st = be->ops->dequantize(be, &job)) != KVQ_OK) st = kvq_fail_backend(ctx, st, "dequantizing");
  }
  const int64_t packed[3] = {(int64_t)token_floats, d, 1};
  ctx->checks_what = "kvq_dequantize";
  /* fp32 outputs hold every decoded value (the host path checks nothing for them): without a 16-bit
   * output, one unchecked pass; with one, its check first and every write only if it passed */
  int checked = 0;
  for (int s = 0; s < 2; s++) checked |= outs[s] && outs[s]->dtype != KVQ_DTYPE_F32;
  for (int pass = !checked; pass < 2 && st == KVQ_OK; pass++)
    for (int s = 0; s < 2 && st == KVQ_OK; s++) {
      if (!outs[s] || (pass == 0 && outs[s]->dtype == KVQ_DTYPE_F32)) continue;
      const uint32_t checks = !checked ? 0u : pass ? KVQ_JOB_CONVERT_IF_CLEAR : KVQ_JOB_CONVERT_FITS | KVQ_JOB_CONVERT_NO_WRITE;
      for (uint32_t k = 0, len; k < count && st == KVQ_OK; k += len) {
        const uint32_t start[3] = {k, 0, 0};
        if (k < quantized) { /* decoded pages */
          for (len = 1; k + len < quantized && slot[k + len] == slot[k] + len;) len++;
          const uint32_t shape[3] = {len, ls->config.kv_heads, d};
          st = kvq_tensor_scatter_block(ctx, decoded, (s * side_floats + (uint64_t)(slot[k] - page0 * P) * token_floats) * 4,
                                        KVQ_DTYPE_F32, packed, outs[s], start, shape, checks);
        } else { /* window tokens: consecutive positions, up to where the ring wraps */
          const uint32_t ring_slot = (view->window_first + (slot[k] - view->slots)) % cache->ring_capacity;
          len = count - k < cache->ring_capacity - ring_slot ? count - k : cache->ring_capacity - ring_slot;
          const uint32_t shape[3] = {len, ls->config.kv_heads, d};
          st = kvq_tensor_scatter_block(ctx, ls->ring[s], ring_offset + ring_slot * token_bytes, dtype, packed, outs[s], start,
                                        shape, checks);
        }
      }
    }
  return st;
}

static kvq_status dequantize_call(kvq_cache *cache, uint32_t id, uint32_t layer, uint64_t first, uint64_t count,
                                  const kvq_tensor *keys, const kvq_tensor *values, kvq_output_undo *undo) {
  kvq_context *ctx = cache->ctx;
  kvq_status st;
  const kvq_sequence *seq = kvq_sequence_layer_lookup(cache, id, layer, "kvq_dequantize", &st);
  if (!seq) return st;
  kvq_layer_view view;
  kvq_layer_view_get(cache, seq, layer, &view);
  const uint32_t n = view.kept;
  if (count == 0 || first > n || count > n - first)
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE,
                    "kvq_dequantize: tokens [%llu, +%llu) outside the %u kept tokens of the sequence",
                    (unsigned long long)first, (unsigned long long)count, n);
  if (!keys && !values) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_dequantize: keys and values are both NULL");
  const kvq_layer_config *L = &cache->layers[layer];
  const int64_t expect[3] = {(int64_t)count, L->kv_heads, L->head_dim};
  const kvq_tensor *outs[2] = {keys, values};
  for (int s = 0; s < 2; s++)
    if (outs[s] && (st = kvq_tensor_check(ctx, outs[s], s ? "kvq_dequantize values" : "kvq_dequantize keys", expect)) != KVQ_OK)
      return st;
  /* both sides decoded in fp32 and read in the input dtype (host copies, or device scratch) */
  const uint64_t token_bytes_in = kvq_token_bytes(cache->config.input_dtype, L->kv_heads, L->head_dim);
  st = kvq_call_fits(ctx, kvq_size_mul3(2, count, kvq_size_add((uint64_t)L->kv_heads * L->head_dim * 4, token_bytes_in)),
                     "kvq_dequantize");
  if (st != KVQ_OK) return st;
  float *buffers[2] = {NULL, NULL};
  uint32_t *slots = malloc(sizeof(uint32_t) * n);
  if (!slots) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_dequantize: out of host memory");
  kvq_layer_view_kept(cache, seq, &view, slots, NULL);
  if ((st = kvq_output_undo_save(cache, outs, 2, undo)) != KVQ_OK) {
    free(slots);
    return st;
  }
  /* device outputs are written in place when every output is one (else all are staged) */
  if ((!keys || kvq_tensor_on_device(ctx, keys)) && (!values || kvq_tensor_on_device(ctx, values)) &&
      dequantize_in_place_fits(cache, layer, &view, slots + first, (uint32_t)count)) {
    st = dequantize_in_place(cache, seq, layer, &view, slots + first, (uint32_t)count, outs);
    free(slots);
    return st;
  }
  const uint64_t token_floats = (uint64_t)L->kv_heads * L->head_dim;
  const uint64_t token_bytes = kvq_token_bytes(cache->config.input_dtype, L->kv_heads, L->head_dim);
  uint8_t *raw[2] = {NULL, NULL};
  uint32_t in_window[2] = {0, 0};
  int later = 0;
  for (int s = 0; s < 2 && st == KVQ_OK; s++) {
    if (!outs[s]) continue;
    buffers[s] = malloc(count * token_floats * sizeof(float));
    raw[s] = malloc(count * token_bytes);
    if (!buffers[s] || !raw[s]) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_dequantize: out of host memory");
    else st = dequantize_side(cache, seq, layer, s, &view, slots + first, (uint32_t)count, buffers[s], raw[s], &in_window[s], &later);
  }
  /* both sides' tokens with one wait; after a failure dropped unread (with the call's recording)
   * before the arrays are freed */
  if (st != KVQ_OK) kvq_reads_drop(ctx, &later);
  const kvq_status waited = kvq_reads_wait(ctx, &later);
  if (st == KVQ_OK && waited != KVQ_OK) st = kvq_fail_backend(ctx, waited, "reading dequantized tokens");
  for (int s = 0; s < 2 && st == KVQ_OK; s++)
    for (uint32_t k = in_window[s]; outs[s] && k < count; k++) /* the window's tokens, in the input dtype */
      kvq_convert_to_f32(cache->config.input_dtype, raw[s] + (uint64_t)(k - in_window[s]) * token_bytes,
                         buffers[s] + (uint64_t)k * token_floats, token_floats);
  free(raw[0]);
  free(raw[1]);
  free(slots);
  for (int s = 0; s < 2 && st == KVQ_OK; s++)
    if (outs[s]) st = check_fits(ctx, buffers[s], count * L->kv_heads * L->head_dim, outs[s]->dtype, "kvq_dequantize");
  /* the call's work done before the outputs are written (kvq_attention) */
  if (st == KVQ_OK) st = kvq_call_settle(ctx, 0, "kvq_dequantize");
  const kvq_tensor *written[2];
  const float *decoded[2];
  size_t sides = 0;
  for (int s = 0; s < 2; s++)
    if (outs[s]) written[sides] = outs[s], decoded[sides++] = buffers[s];
  if (st == KVQ_OK) st = kvq_tensors_write(ctx, sides, written, decoded); /* none written if one fails */
  free(buffers[0]);
  free(buffers[1]);
  return st;
}

kvq_status kvq_attention(kvq_cache *cache, uint32_t layer, const kvq_attention_request *requests, size_t count) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_output_undo undo = {0};
  kvq_call_begin(cache->ctx);
  return kvq_output_undo_end(&undo, kvq_call_end(cache->ctx, attention_call(cache, layer, requests, count, &undo)));
}

kvq_status kvq_scores(kvq_cache *cache, uint32_t id, uint32_t layer, const kvq_tensor *queries, kvq_mask mask,
                      kvq_score_kind kind, const kvq_tensor *scores) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_output_undo undo = {0};
  kvq_call_begin(cache->ctx);
  return kvq_output_undo_end(&undo, kvq_call_end(cache->ctx, scores_call(cache, id, layer, queries, mask, kind, scores, &undo)));
}

kvq_status kvq_dequantize(kvq_cache *cache, uint32_t id, uint32_t layer, uint64_t first, uint64_t count,
                          const kvq_tensor *keys, const kvq_tensor *values) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_output_undo undo = {0};
  kvq_call_begin(cache->ctx);
  return kvq_output_undo_end(&undo, kvq_call_end(cache->ctx, dequantize_call(cache, id, layer, first, count, keys, values, &undo)));
}
