/*
 * The cases of one method at one grid point (bench.h, bench_case): one cache of `batch` sequences
 * of `context` tokens, filled by the timed appends, then decode attention with one query per
 * sequence (the whole batch in one kvq_attention call) as the fused call, scoring alone and the
 * weighted sum alone. Every sample is preceded by the cold-cache write (clock.c) and timed by the
 * wall clock around the call (end to end: host work, uploads, readback of the output) and, where
 * the backend has one, by the device clock (the kernels and transfers the call submitted).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "core/gpu_plan.h"
#include "core/internal.h"
#include "method_spec.h"
#ifdef KVQ_BENCH_CUBLAS
#include "cublas_baseline.h"
#endif

/* Tokens generated once per point and appended over and over up to the context: long contexts
 * would otherwise need gigabytes of synthetic input on the host. */
#define CHUNK_TOKENS 16384u

typedef struct run {
  kvq_context *ctx;
  const bench_options *o;
  const bench_device *dev;
  bench_cold *cold;
  const bench_point *p;
  const char *method;
  bench_results *res;
  kvq_cache *cache;
  double bits;
  kvq_status last; /* the status of the last timed call */
  const char *what; /* and what it was, for messages */
} run;

static bench_row *new_row(run *r, bench_case kase) {
  bench_row *row = bench_add_row(r->res);
  if (!row) return NULL;
  *row = (bench_row){.dev = r->dev, .method = r->method, .kase = kase, .context = r->p->context,
                     .batch = r->p->batch, .query_heads = r->p->query_heads, .kv_heads = r->p->kv_heads,
                     .head_dim = r->p->head_dim, .bits = r->bits, .error = -1, .check = "-", .plan = "-"};
  return row;
}

/* Rows that did not run, with the reason: a point beyond what fits is a result, not a failure. */
static int skip_all(run *r, const char *why) {
  for (int c = 0; c < CASE_COUNT; c++) {
    if (!r->o->cases[c]) continue;
    bench_row *row = new_row(r, (bench_case)c);
    if (!row) return 2;
    row->skipped = 1;
    snprintf(row->note, sizeof row->note, "%s", why);
  }
  return 0;
}

/* Statuses that mean "does not fit on this device", as opposed to a kvq failure. */
static int does_not_fit(kvq_status st) {
  return st == KVQ_ERROR_DEVICE_MEMORY || st == KVQ_ERROR_OUT_OF_MEMORY || st == KVQ_ERROR_UNSUPPORTED ||
         st == KVQ_ERROR_OUT_OF_RANGE || st == KVQ_ERROR_CAPACITY;
}

static int fail(run *r, const char *what) {
  fprintf(stderr, "kvq-bench: %s, %s, context %u, batch %u: %s: %s\n", r->dev->backend, r->method, r->p->context,
          r->p->batch, what, kvq_context_last_error(r->ctx));
  return 2;
}

/* One timed sample of `call`: cold cache, device clock restarted, wall clock around the call.
 * 0; 1: the call failed (r->last, not yet reported: failed_call decides); 2: failed, reported. */
typedef kvq_status (*call_fn)(run *r, void *arg);
static int sample(run *r, call_fn call, void *arg, double *wall, double *device) {
  uint64_t ns = 0;
  if (bench_cold_flush(r->cold) != 0) return fail(r, "the cold-cache write");
  if (r->dev->device_clock) kvq_context_device_time(r->ctx, &ns);
  const double t0 = bench_now();
  if ((r->last = call(r, arg)) != KVQ_OK) return 1;
  *wall = bench_now() - t0;
  *device = r->dev->device_clock && kvq_context_device_time(r->ctx, &ns) == KVQ_OK ? ns * 1e-9 : -1;
  return 0;
}

/* After a timed call failed: a point the device cannot hold (out of device memory, beyond the 4 GiB
 * kvq's kernels address) makes the row a skipped one, with kvq's reason; anything else is a failure
 * of kvq and fails the run. */
static int failed_call(run *r, bench_row *row) {
  if (!does_not_fit(r->last)) return fail(r, r->what ? r->what : "a timed call");
  if (row) {
    row->skipped = 1;
    snprintf(row->note, sizeof row->note, "%s", kvq_context_last_error(r->ctx));
  }
  return 1;
}

/* A timed row's rates from its median time (the device clock's where there is one). A zero time (a
 * device clock that counted no submission, a clock coarser than the call) has no rate: 0, where a
 * division would give inf. */
static double finish_row(run *r, bench_row *row, uint64_t read_bytes) {
  row->read_bytes = read_bytes;
  const double t = row->device.count ? row->device.median : row->wall.median;
  row->gbs = t > 0 ? read_bytes / t / 1e9 : 0;
  row->of_copy = r->dev->copy_gbs > 0 ? row->gbs / r->dev->copy_gbs : -1;
  return t;
}

/* ---- Appends -------------------------------------------------------------------------------- */

typedef struct append_arg {
  uint32_t seq, tokens;
  const float *k, *v;
} append_arg;

/* A whole sequence: `tokens` appended chunk by chunk, then flushed so that every token is in pages. */
static kvq_status append_seq(run *r, void *arg) {
  const append_arg *a = arg;
  kvq_status st = KVQ_OK;
  for (uint32_t done = 0; done < a->tokens && st == KVQ_OK;) {
    const uint32_t n = a->tokens - done < CHUNK_TOKENS ? a->tokens - done : CHUNK_TOKENS;
    const int64_t shape[3] = {n, r->p->kv_heads, r->p->head_dim};
    kvq_tensor kt = kvq_tensor_host((void *)a->k, KVQ_DTYPE_F32, 3, shape);
    kvq_tensor vt = kvq_tensor_host((void *)a->v, KVQ_DTYPE_F32, 3, shape);
    st = kvq_append(r->cache, a->seq, 0, &kt, &vt);
    done += n;
  }
  if (st == KVQ_OK) st = kvq_flush(r->cache, a->seq);
  r->what = "append";
  return st;
}

static int fill(run *r, const float *k, const float *v, uint32_t *seqs, bench_row *row) {
  /* warm-up: a sequence of one chunk, freed again (pipelines, first-touch of pages and staging) */
  uint32_t warm;
  double wall, device;
  append_arg a = {.tokens = r->p->context < CHUNK_TOKENS ? r->p->context : CHUNK_TOKENS, .k = k, .v = v};
  if (kvq_sequence_add(r->cache, &warm) != KVQ_OK) return fail(r, "adding a sequence");
  a.seq = warm;
  int rc = sample(r, append_seq, &a, &wall, &device);
  if (rc) return rc == 1 ? failed_call(r, row) : rc;
  if (kvq_sequence_free(r->cache, warm) != KVQ_OK) return fail(r, "freeing a sequence");
  double walls[BENCH_MAX_GRID * 64], devices[BENCH_MAX_GRID * 64];
  unsigned n = 0;
  a.tokens = r->p->context;
  for (uint32_t s = 0; s < r->p->batch; s++) {
    if (kvq_sequence_add(r->cache, &seqs[s]) != KVQ_OK) return fail(r, "adding a sequence");
    a.seq = seqs[s];
    if ((rc = sample(r, append_seq, &a, &wall, &device)) != 0) return rc == 1 ? failed_call(r, row) : rc;
    if (n < sizeof walls / sizeof *walls) walls[n] = wall, devices[n] = device, n++;
  }
  if (!row) return 0;
  row->plan = "quantize";
  bench_stats_of(walls, n, &row->wall);
  if (r->dev->device_clock) bench_stats_of(devices, n, &row->device);
  /* fp32 K and V, per sequence */
  const double t = finish_row(r, row, (uint64_t)r->p->context * r->p->kv_heads * r->p->head_dim * 4 * 2);
  row->tokens_per_s = t > 0 ? r->p->context / t : 0;
  row->check = "appends accepted";
  return 0;
}

/* ---- Decode --------------------------------------------------------------------------------- */

typedef struct decode_arg {
  kvq_attention_request *req;
  uint32_t jobs; /* KVQ_BENCH_JOBS_* (0: kvq_attention as every caller runs it) */
} decode_arg;

static kvq_status decode(run *r, void *arg) {
  const decode_arg *a = arg;
  r->ctx->bench_jobs = a->jobs;
  const kvq_status st = kvq_attention(r->cache, 0, a->req, r->p->batch);
  r->ctx->bench_jobs = 0;
  r->what = "attention";
  return st;
}

/* warm-up calls, then samples, into the row's statistics: 0, 1 (the row is skipped), 2 (failed) */
static int time_decode(run *r, decode_arg *a, bench_row *row) {
  double walls[256], devices[256], wall, device;
  int rc;
  const unsigned n = r->o->samples < 256 ? r->o->samples : 256;
  for (unsigned i = 0; i < r->o->warmup; i++)
    if ((rc = sample(r, decode, a, &wall, &device)) != 0) return rc == 1 ? failed_call(r, row) : rc;
  for (unsigned i = 0; i < n; i++)
    if ((rc = sample(r, decode, a, &walls[i], &devices[i])) != 0) return rc == 1 ? failed_call(r, row) : rc;
  bench_stats_of(walls, n, &row->wall);
  if (r->dev->device_clock) bench_stats_of(devices, n, &row->device);
  return 0;
}

/* The attention plan of this point's decode job (core/gpu_plan.h): fused or not, and its scratch. */
static void plan_of(run *r, int *fused, uint64_t *flash_scratch, uint64_t *rotated) {
  const kvq_layer_storage *ls = &r->cache->storage[0];
  kvq_backend *be = r->ctx->backend;
  kvq_attention_seq *seqs = calloc(r->p->batch, sizeof *seqs);
  *fused = 0, *flash_scratch = *rotated = 0;
  if (!seqs) return;
  for (uint32_t i = 0; i < r->p->batch; i++)
    seqs[i] = (kvq_attention_seq){.quantized = r->p->context, .query_first = i, .query_count = 1,
                                  .query_position = r->p->context - 1};
  kvq_job_attention job = {.keys = &ls->side[KVQ_SIDE_KEYS], .values = &ls->side[KVQ_SIDE_VALUES],
                           .query_heads = r->p->query_heads, .window_dtype = KVQ_DTYPE_F32,
                           .seq_count = r->p->batch, .seqs = seqs};
  const int fused_kernels = be->ops->attention && be->ops->supports(be, KVQ_JOB_ATTENTION, &job.keys->layout, &job.values->layout);
  kvq_gpu_attention_plan plan;
  char why[160];
  if (kvq_gpu_plan_attention(&job, fused_kernels, &plan, why, sizeof why) == KVQ_OK) {
    *fused = plan.fused;
    if (plan.fused) *flash_scratch = plan.scratch_bytes;
    else *rotated = plan.scratch_bytes;
  }
  free(seqs);
}

/* The reference output of a point's query (bench/check.c): attention in double precision over the
 * tokens as the cache holds them (kvq_dequantize of the first sequence; for QJL keys the estimate
 * whose inner products are the scores), which every backend must reproduce to rounding; where those
 * do not fit in 64 MiB per side (keys, values), over the fp32 input tokens, which only exact caches must come close to. */
static int reference_of(run *r, uint32_t seq, const float *k, const float *v, uint32_t chunk, const float *q,
                        float *reference, int *tight) {
  const bench_point *p = r->p;
  const uint64_t floats = (uint64_t)p->context * p->kv_heads * p->head_dim;
  *tight = floats <= ((uint64_t)16 << 20);
  if (!*tight) {
    bench_reference(k, v, chunk, q, p, reference);
    return 0;
  }
  float *kd = malloc(sizeof(float) * floats), *vd = malloc(sizeof(float) * floats);
  const int64_t shape[3] = {p->context, p->kv_heads, p->head_dim};
  kvq_tensor kt = kvq_tensor_host(kd, KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(vd, KVQ_DTYPE_F32, 3, shape);
  int rc = kd && vd && kvq_dequantize(r->cache, seq, 0, 0, p->context, &kt, &vt) == KVQ_OK ? 0 : fail(r, "kvq_dequantize");
  if (rc == 0) bench_reference(kd, vd, p->context, q, p, reference);
  free(kd), free(vd);
  return rc;
}

/* Outputs of every sequence against the reference: the worst sequence's relative error. */
static int check_outputs(run *r, const float *out, const float *reference, int tight, bench_row *row) {
  const double worst = bench_worst_error(out, reference, (size_t)r->p->query_heads * r->p->head_dim, r->p->batch);
  row->error = worst;
  /* against the cache's own tokens every backend agrees to fp32 rounding (and fp16 conversions on
   * GPUs); against the input only the exact caches do (fp16/bf16 rounding), and a compressed
   * cache's error there is its accuracy, reported but not bounded: it only has to be finite */
  const int exact = !strncmp(r->method, "exact-", 6);
  const double bound = tight ? r->o->check_bound : exact ? 0.02 : INFINITY;
  row->check = tight ? "attention over the cache's dequantized tokens" : exact ? "fp32 attention over the input"
                                                                               : "finite (error vs the fp32 input reported)";
  if (!(worst <= bound)) {
    fprintf(stderr, "kvq-bench: %s, %s, context %u, batch %u, %s: output off its reference (%s) by %.3g "
            "(relative L2; the bound is %.3g): the bench will not report the speed of wrong work\n",
            r->dev->backend, r->method, r->p->context, r->p->batch, bench_case_names[row->kase], row->check, worst, bound);
    return 2;
  }
  return 0;
}

/* Scoring alone writes no output: what the timed calls computed is read from the cache's score
 * scratch after the last sample (every sequence's logits, where the call was one batch: a call split
 * at kvq's scratch budget leaves only its last part there) and compared, sequence by sequence, with
 * the logits kvq_scores gives for the first sequence (every sequence holds the same tokens and runs
 * the same query). */
static int check_scores(run *r, const uint32_t *seqs, const float *q, bench_row *row) {
  const bench_point *p = r->p;
  const uint64_t per = (uint64_t)p->query_heads * p->context;
  if (!kvq_attention_one_batch(r->cache, 0, p->batch, p->context)) {
    row->check = "not checked (the timed call was split at kvq's 64 MiB score scratch)";
    return 0;
  }
  float *timed = malloc(sizeof(float) * per * p->batch), *logits = malloc(sizeof(float) * per);
  kvq_backend *be = r->ctx->backend;
  int rc = timed && logits ? 0 : 2;
  /* read before kvq_scores, which reuses the scratch */
  if (rc == 0 && be->ops->buffer_read(be, r->cache->scratch[KVQ_SCRATCH_SCORES], 0, timed, sizeof(float) * per * p->batch) != KVQ_OK)
    rc = fail(r, "reading the timed logits");
  const int64_t qs[3] = {1, p->query_heads, p->head_dim}, ls[3] = {1, p->query_heads, p->context};
  kvq_tensor qt = kvq_tensor_host((void *)q, KVQ_DTYPE_F32, 3, qs), lt = kvq_tensor_host(logits, KVQ_DTYPE_F32, 3, ls);
  if (rc == 0 && kvq_scores(r->cache, seqs[0], 0, &qt, KVQ_MASK_CAUSAL, KVQ_SCORES_LOGITS, &lt) != KVQ_OK)
    rc = fail(r, "kvq_scores");
  if (rc == 0) {
    row->check = "timed logits vs kvq_scores";
    row->error = bench_worst_error(timed, logits, per, p->batch);
    if (!(row->error <= r->o->check_bound)) {
      fprintf(stderr, "kvq-bench: %s, %s, context %u, batch %u, scores: the timed logits are off kvq_scores' by %.3g "
              "(relative L2; the bound is %.3g)\n", r->dev->backend, r->method, p->context, p->batch, row->error,
              r->o->check_bound);
      rc = 2;
    }
  }
  free(timed), free(logits);
  return rc;
}

static int decode_cases(run *r, const uint32_t *seqs, const float *q, const float *reference, int tight) {
  const bench_point *p = r->p;
  const size_t per = (size_t)p->query_heads * p->head_dim;
  float *out = malloc(sizeof(float) * per * p->batch);
  kvq_attention_request *req = malloc(sizeof *req * p->batch);
  if (!out || !req) {
    free(out), free(req);
    return 2;
  }
  const int64_t shape[3] = {1, p->query_heads, p->head_dim};
  for (uint32_t s = 0; s < p->batch; s++)
    req[s] = (kvq_attention_request){seqs[s], KVQ_MASK_CAUSAL, kvq_tensor_host((void *)q, KVQ_DTYPE_F32, 3, shape),
                                     kvq_tensor_host(out + s * per, KVQ_DTYPE_F32, 3, shape)};
  const kvq_side_layout *ks = &r->cache->storage[0].side[KVQ_SIDE_KEYS].layout;
  const kvq_side_layout *vs = &r->cache->storage[0].side[KVQ_SIDE_VALUES].layout;
  const uint64_t pages = (uint64_t)p->batch * ((p->context + r->o->page_size - 1) / r->o->page_size);
  const uint64_t key_bytes = pages * ks->page_bytes, value_bytes = pages * vs->page_bytes;
  const uint64_t score_bytes = (uint64_t)p->batch * p->query_heads * p->context * 4;
  int fused;
  uint64_t flash, rotated;
  plan_of(r, &fused, &flash, &rotated);
  const int cpu = r->dev->kind == KVQ_BACKEND_CPU;
  int rc = 0;
  bench_row *row;
  if (rc == 0 && r->o->cases[CASE_FUSED] && (row = new_row(r, CASE_FUSED))) {
    decode_arg a = {req, 0};
    memset(out, 0xff, sizeof(float) * per * p->batch); /* NaN: a call that writes nothing fails the check */
    rc = time_decode(r, &a, row);
    row->plan = fused && !cpu ? "fused" : "unfused";
    /* fused: the flash scratch written once and read once by the combine; unfused: logits written,
     * read and rewritten as probabilities by the softmax, read by the weighted sum */
    row->scratch_write = fused && !cpu ? flash : 2 * score_bytes + rotated;
    row->scratch_read = fused && !cpu ? flash : 2 * score_bytes + rotated;
    finish_row(r, row, key_bytes + value_bytes);
    if (rc == 0) rc = check_outputs(r, out, reference, tight, row);
    if (rc == 1) rc = 0; /* skipped: the next cases may still fit */
  }
  if (rc == 0 && r->o->cases[CASE_SCORES] && (row = new_row(r, CASE_SCORES))) {
    decode_arg a = {req, KVQ_BENCH_JOBS_SCORE};
    rc = time_decode(r, &a, row);
    row->plan = "score";
    row->scratch_write = score_bytes;
    finish_row(r, row, key_bytes);
    if (rc == 0) rc = check_scores(r, seqs, q, row);
    if (rc == 1) rc = 0;
  }
  if (rc == 0 && r->o->cases[CASE_WSUM] && (row = new_row(r, CASE_WSUM))) {
    /* one unfused call leaves this query's probabilities in the score scratch; the weighted sum
     * alone then recomputes that call's output from them, sample after sample. A batch kvq splits
     * at its scratch budget leaves only the last part's probabilities, which the other parts would
     * read as theirs: such a point is a skipped row (every sequence here has the same tokens and
     * query, so the output check could not tell; docs/BENCH.md) */
    decode_arg prime = {req, KVQ_BENCH_JOBS_UNFUSED}, a = {req, KVQ_BENCH_JOBS_WEIGHTED_SUM};
    if (!kvq_attention_one_batch(r->cache, 0, p->batch, p->context)) {
      row->skipped = 1;
      snprintf(row->note, sizeof row->note, "batch split at kvq's 64 MiB score scratch: its probabilities are not all kept");
      rc = 1;
    }
    if (rc == 0) rc = (r->last = decode(r, &prime)) == KVQ_OK ? 0 : failed_call(r, row);
    memset(out, 0xff, sizeof(float) * per * p->batch);
    if (rc == 0) rc = time_decode(r, &a, row);
    row->plan = "weighted sum";
    row->scratch_read = score_bytes + rotated;
    row->scratch_write = rotated;
    finish_row(r, row, value_bytes);
    if (rc == 0) rc = check_outputs(r, out, reference, tight, row);
    if (rc == 1) rc = 0;
  }
  free(out), free(req);
  return rc;
}

/* ---- The cuBLAS fp16 baseline (CUDA only) ---------------------------------------------------- */

/* Its one case, `fused`: decode attention over fp16 keys and values (bench/cublas_baseline.h), checked
 * against the fp32 reference like an exact cache, with a looser bound (its probabilities are fp16).
 * A baseline that fails or is off is a skipped row saying why: it is not kvq's work. */
static int cublas_rows(run *r) {
  bench_row *row = new_row(r, CASE_FUSED);
  if (!row) return 2;
  row->bits = 16;
#ifdef KVQ_BENCH_CUBLAS
  const bench_point *p = r->p; /* here: unused without cuBLAS, which -Werror turns into a failed build */
  const uint32_t chunk = p->context < CHUNK_TOKENS ? p->context : CHUNK_TOKENS;
  float *k = NULL, *v = NULL, *q = NULL;
  const size_t kv = (size_t)chunk * p->kv_heads * p->head_dim, per = (size_t)p->query_heads * p->head_dim;
  uint16_t *kh = malloc(2 * kv), *vh = malloc(2 * kv);
  float *reference = malloc(sizeof(float) * per), *out = malloc(sizeof(float) * per * p->batch);
  double *ms = malloc(sizeof(double) * (r->o->samples ? r->o->samples : 1));
  int rc = kh && vh && reference && out && ms && bench_synth(p, chunk, &k, &v, &q) == 0 ? 0 : 2;
  const char *at = strstr(r->dev->device, "CUDA device "); /* the ordinal kvq's context runs on */
  bench_cublas_job job = {.device = at ? atoi(at + 12) : 0, .batch = p->batch, .kv_heads = p->kv_heads,
                          .query_heads = p->query_heads, .head_dim = p->head_dim, .context = p->context,
                          .chunk = chunk, .keys = kh, .values = vh, .query = q, .warmup = r->o->warmup,
                          .samples = r->o->samples, .flush_bytes = r->dev->flush_bytes};
  bench_cublas_result result = {.ms = ms, .output = out};
  if (rc == 0) {
    kvq_convert(k, KVQ_DTYPE_F32, kh, KVQ_DTYPE_F16, kv);
    kvq_convert(v, KVQ_DTYPE_F32, vh, KVQ_DTYPE_F16, kv);
    bench_reference(k, v, chunk, q, p, reference);
    const int st = bench_cublas_decode(&job, &result);
    if (st != 0) {
      row->skipped = 1;
      snprintf(row->note, sizeof row->note, "%s", result.message);
    } else {
      const double worst = bench_worst_error(out, reference, per, p->batch);
      row->error = worst;
      row->check = "fp32 attention over the input";
      if (!(worst <= 0.05)) {
        row->skipped = 1;
        snprintf(row->note, sizeof row->note, "cuBLAS baseline output off the fp32 reference by %.3g: not reported", worst);
      }
      for (uint32_t i = 0; i < r->o->samples; i++) ms[i] *= 1e-3;
      bench_stats_of(ms, r->o->samples, &row->device);
      row->wall = row->device; /* events only: no end-to-end call to time */
      row->plan = "cuBLAS";
      const uint64_t scores = (uint64_t)p->batch * p->query_heads * p->context;
      row->scratch_write = row->scratch_read = scores * (4 + 2); /* fp32 logits, fp16 probabilities */
      finish_row(r, row, (uint64_t)p->batch * p->context * p->kv_heads * p->head_dim * 2 * 2);
    }
  }
  free(k), free(v), free(q), free(kh), free(vh), free(reference), free(out), free(ms);
  if (rc != 0) fprintf(stderr, "kvq-bench: cuBLAS baseline: out of host memory\n");
  return rc;
#else
  row->skipped = 1;
  snprintf(row->note, sizeof row->note, "this kvq-bench was built without cuBLAS");
  return 0;
#endif
}

int bench_run_method(kvq_context *ctx, const bench_options *o, const bench_device *dev, bench_cold *cold,
                     const bench_point *p, const char *method, bench_results *res) {
  run r = {.ctx = ctx, .o = o, .dev = dev, .cold = cold, .p = p, .method = method, .res = res};
  const int late = o->time_limit > 0 && bench_now() - o->started > o->time_limit;
  if (!strcmp(method, BENCH_CUBLAS_METHOD)) { /* a baseline of CUDA's only: no rows elsewhere */
    if (dev->kind != KVQ_BACKEND_CUDA || !o->cases[CASE_FUSED]) return 0;
    if (late) { /* its one case, skipped like every method's after the time limit */
      bench_row *row = new_row(&r, CASE_FUSED);
      if (!row) return 2;
      row->skipped = 1;
      snprintf(row->note, sizeof row->note, "beyond --time-limit");
      return 0;
    }
    return cublas_rows(&r);
  }
  kvq_layer_config layer = {.query_heads = p->query_heads, .kv_heads = p->kv_heads, .head_dim = p->head_dim};
  if (kvq_parse_layer_spec(method, strlen(method), p->head_dim, &layer.keys, &layer.values) != 0) {
    fprintf(stderr, "kvq-bench: cannot read method '%s' (the names of kvq eval, docs/EVAL.md)\n", method);
    return 2;
  }
  double kb = 0, vb = 0;
  if (kvq_layer_bits_per_number(&layer, o->page_size, &kb, &vb) == KVQ_OK) r.bits = (kb + vb) / 2;
  if (late) return skip_all(&r, "beyond --time-limit");
  if ((uint64_t)p->batch * p->context > o->max_tokens) {
    char why[96];
    snprintf(why, sizeof why, "batch x context beyond --max-tokens %llu", (unsigned long long)o->max_tokens);
    return skip_all(&r, why);
  }
  /* the batch and the warm-up sequence: in 64 bits, since a 32-bit product wraps for long contexts
   * with small pages and would ask kvq for a small pool that then fails as "does not fit" */
  const uint64_t max_pages = (uint64_t)(p->context / o->page_size + (p->context % o->page_size != 0)) * (p->batch + 1);
  if (max_pages > UINT32_MAX) return skip_all(&r, "more than 2^32 pages (raise --page-size)");
  kvq_cache_config config = {.layer_count = 1, .layers = &layer, .input_dtype = KVQ_DTYPE_F32,
                             .page_size = o->page_size, .max_pages = (uint32_t)max_pages,
                             .max_sequences = p->batch + 1, .seed = 1};
  char message[256];
  kvq_status st = kvq_cache_config_check(&config, message, sizeof message);
  if (st != KVQ_OK) {
    if (does_not_fit(st)) return skip_all(&r, message);
    fprintf(stderr, "kvq-bench: %s: %s\n", method, message);
    return 2;
  }
  if ((st = kvq_cache_create(ctx, &config, &r.cache)) != KVQ_OK) {
    if (does_not_fit(st)) return skip_all(&r, kvq_context_last_error(ctx));
    return fail(&r, "creating the cache");
  }
  const uint32_t chunk = p->context < CHUNK_TOKENS ? p->context : CHUNK_TOKENS;
  float *k = NULL, *v = NULL, *q = NULL;
  uint32_t *seqs = calloc(p->batch, sizeof *seqs);
  float *reference = malloc(sizeof(float) * p->query_heads * p->head_dim);
  int rc = seqs && reference && bench_synth(p, chunk, &k, &v, &q) == 0 ? 0 : 2;
  if (rc == 0 && (kvq_method_learns(&layer.keys) || kvq_method_learns(&layer.values))) {
    /* learned codebooks (CQ, online PolarQuant) from the first tokens: speed does not depend on
     * their quality, and 256 calibration tokens keep the learning short */
    const int64_t cal[3] = {chunk < 256 ? chunk : 256, p->kv_heads, p->head_dim};
    kvq_tensor kc = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, cal), vc = kvq_tensor_host(v, KVQ_DTYPE_F32, 3, cal);
    if (kvq_codebooks_learn(r.cache, 0, &kc, &vc, NULL) != KVQ_OK) rc = fail(&r, "learning codebooks");
  }
  bench_row *append_row = NULL;
  if (rc == 0 && o->cases[CASE_APPEND] && !(append_row = new_row(&r, CASE_APPEND))) rc = 2;
  if (rc == 0 && (rc = fill(&r, k, v, seqs, append_row)) == 1) {
    /* the appends did not fit: the decode cases have nothing to run on */
    char why[160];
    snprintf(why, sizeof why, "%s", kvq_context_last_error(ctx));
    rc = 0;
    for (int c = CASE_FUSED; c < CASE_COUNT; c++)
      if (o->cases[c]) {
        bench_row *row = new_row(&r, (bench_case)c);
        if (!row) {
          rc = 2;
          break;
        }
        row->skipped = 1;
        snprintf(row->note, sizeof row->note, "%s", why);
      }
    free(k), free(v), free(q), free(seqs), free(reference);
    kvq_cache_destroy(r.cache);
    return rc;
  }
  /* the reference decode (a dequantize of the whole context: minutes for PolarQuant on lavapipe)
   * only where a decode case is measured against it */
  int tight = 0, decodes = 0;
  for (int c = CASE_FUSED; c < CASE_COUNT; c++) decodes |= o->cases[c];
  if (rc == 0 && decodes) rc = reference_of(&r, seqs[0], k, v, chunk, q, reference, &tight);
  if (rc == 0 && decodes) rc = decode_cases(&r, seqs, q, reference, tight);
  free(k), free(v), free(q), free(seqs), free(reference);
  kvq_cache_destroy(r.cache);
  return rc;
}
