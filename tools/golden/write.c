/* `kvq golden --write`: runs the golden matrix on the CPU reference and records everything. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvq/kvq.h>

#include "core/bytes.h"
#include "core/config.h"
#include "core/internal.h"
#include "core/policy.h"
#include "core/savefile.h"
#include "core/sha256.h"
#include "golden.h"
#include "halfconv_util.h"
#include "replay.h"

#define QUERIES 4 /* per (layer, sequence) */

static kvq_context *cpu_context(void) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_CPU;
  kvq_context *ctx = NULL;
  return kvq_context_create(&opt, &ctx) == KVQ_OK ? ctx : NULL;
}

/* Stores fp32 values in a dtype's little-endian bytes. */
static void to_dtype(const float *x, uint64_t n, kvq_dtype dtype, uint8_t *out) {
  for (uint64_t i = 0; i < n; i++) golden_store(dtype, out + i * kvq_dtype_size(dtype), x[i]);
}

static int fail(FILE *log, const char *what, kvq_context *ctx) {
  /* setup failures of the whole run */
  fprintf(log, "kvq golden --write: %s%s%s\n", what, ctx ? ": " : "", ctx ? kvq_context_last_error(ctx) : "");
  return 1;
}

/* What a token-policy case records while it replays: after every append to layer 0, the kept
 * positions ("kept/<sequence>": count, then the positions, per such step) and, before it, how close
 * the policy's decision is to a tie ("margins/<sequence>", fp64 per such step). */
typedef struct decisions {
  uint32_t *kept[GOLDEN_SEQUENCES];
  uint64_t kept_count[GOLDEN_SEQUENCES], kept_capacity[GOLDEN_SEQUENCES];
  double *margins[GOLDEN_SEQUENCES];
  uint64_t margin_count[GOLDEN_SEQUENCES];
  int failed;
} decisions;

static int push_u32(decisions *d, int s, uint32_t v) {
  if (d->kept_count[s] == d->kept_capacity[s]) {
    const uint64_t capacity = d->kept_capacity[s] ? 2 * d->kept_capacity[s] : 1024;
    uint32_t *grown = realloc(d->kept[s], sizeof(uint32_t) * capacity);
    if (!grown) return -1;
    d->kept[s] = grown, d->kept_capacity[s] = capacity;
  }
  d->kept[s][d->kept_count[s]++] = v;
  return 0;
}

static int record_decision(void *arg, kvq_cache *cache, const uint32_t ids[GOLDEN_SEQUENCES], const uint32_t *step,
                           int after) {
  decisions *d = arg;
  const int s = (int)step[0];
  if (step[1] != 0 || step[3] == 0 || (step[3] & GOLDEN_ATTEND)) return 0; /* appends to layer 0 only */
  kvq_status found;
  const kvq_sequence *seq = kvq_sequence_lookup(cache, ids[s], "kvq golden", &found);
  if (!after) {
    double *grown = realloc(d->margins[s], sizeof(double) * (d->margin_count[s] + 1));
    if (!grown) return -1;
    d->margins[s] = grown;
    d->margins[s][d->margin_count[s]++] = kvq_sequence_in_step(cache, seq) ? kvq_policy_margin(cache, seq) : INFINITY;
    return 0;
  }
  size_t count;
  if (kvq_sequence_positions(cache, ids[s], 0, NULL, 0, &count) != KVQ_OK || push_u32(d, s, (uint32_t)count) != 0) return -1;
  for (size_t i = 0; i < count; i++)
    if (push_u32(d, s, 0) != 0) return -1;
  return kvq_sequence_positions(cache, ids[s], 0, d->kept[s] + d->kept_count[s] - count, count, &count) == KVQ_OK ? 0 : -1;
}

/* The smallest relative margin a recorded decision may have (docs/GOLDEN.md): far above what
 * backends' rounding can move the scores, so that kept sets must agree exactly. */
#define MIN_DECISION_MARGIN 1e-4

/* Adds the expected results of a golden file's inputs, computed on `ctx`: matrix fingerprints,
 * page images, kept tokens of policy cases, logits, probabilities and outputs. With `keep`, the
 * replayed cache is returned. */
int kvq_golden_record_results(golden_file *g, kvq_context *ctx, kvq_cache **keep, char *error, size_t error_size) {
  golden_inputs in;
  kvq_cache *cache = NULL;
  uint32_t ids[GOLDEN_SEQUENCES];
  char name[128];
  if (golden_inputs_parse(g, &in, error, error_size) != 0) return -1;
  const int policy = in.config.policy.kind != KVQ_POLICY_KEEP_ALL;
  decisions d = {0};
  if (golden_replay(ctx, &in, &cache, ids, policy ? record_decision : NULL, &d) != KVQ_OK) {
    snprintf(error, error_size, "replay: %s", kvq_context_last_error(ctx));
    golden_inputs_free(&in);
    for (int s = 0; s < GOLDEN_SEQUENCES; s++) free(d.kept[s]), free(d.margins[s]);
    return -1;
  }
  int rc = 0;
  for (int s = 0; s < GOLDEN_SEQUENCES && policy; s++) {
    for (uint64_t i = 0; i < d.margin_count[s] && rc == 0; i++)
      if (d.margins[s][i] < MIN_DECISION_MARGIN) {
        snprintf(error, error_size,
                 "sequence %d, decision %llu: relative margin %.3g is below %g: a near-tie that another backend may "
                 "decide otherwise; change the case (seed, budget) so that every decision is clear",
                 s, (unsigned long long)i, d.margins[s][i], MIN_DECISION_MARGIN);
        rc = -1;
      }
    golden_name(name, sizeof name, "kept", s, -1, -1);
    if (rc == 0) rc = golden_add_u32(g, name, d.kept[s], d.kept_count[s]);
    golden_name(name, sizeof name, "margins", s, -1, -1);
    if (rc == 0) rc = golden_add(g, name, GOLDEN_BYTES, d.margins[s], sizeof(double) * d.margin_count[s]);
  }
  for (int s = 0; s < GOLDEN_SEQUENCES; s++) free(d.kept[s]), free(d.margins[s]);
  for (uint32_t l = 0; l < in.config.layer_count && rc == 0; l++) {
    const kvq_layer_config *L = &in.layers[l];
    for (int side = 0; side < 2; side++) {
      for (int i = 0; i < KVQ_SIDE_FIXED; i++) {
        const uint64_t floats = kvq_side_fixed_floats(&cache->storage[l].side[side].layout, i);
        if (!floats) continue;
        uint8_t digest[32];
        kvq_sha256_digest(cache->storage[l].fixed_host[side][i], (size_t)floats * 4, digest);
        golden_name(name, sizeof name, "matrix_sha256", (int)l, side, i);
        rc |= golden_add(g, name, GOLDEN_BYTES, digest, 32);
      }
      for (int s = 0; s < GOLDEN_SEQUENCES; s++) {
        uint32_t pages;
        kvq_cache_read_pages(cache, ids[s], l, side, NULL, &pages);
        uint64_t bytes = pages * cache->storage[l].side[side].layout.page_bytes;
        uint8_t *img = malloc(bytes ? bytes : 1);
        rc |= !img || kvq_cache_read_pages(cache, ids[s], l, side, img, &pages) != KVQ_OK;
        golden_name(name, sizeof name, "pages", (int)l, side, s);
        if (img) rc |= golden_add(g, name, GOLDEN_BYTES, img, bytes);
        free(img);
      }
    }
    for (int s = 0; s < GOLDEN_SEQUENCES && rc == 0; s++) {
      uint64_t count, qcount;
      golden_name(name, sizeof name, "query_block", (int)l, s, -1);
      const uint32_t *block = golden_u32(golden_find(g, name), &count);
      golden_name(name, sizeof name, "queries", (int)l, s, -1);
      const float *q = golden_f32(golden_find(g, name), &qcount);
      kvq_sequence_info info;
      kvq_sequence_info_get(cache, ids[s], l, &info);
      const uint32_t hq = L->query_heads, d = L->head_dim, len = (uint32_t)info.kept_tokens; /* the results' columns */
      if (!block || count != 2 || !q || qcount != (uint64_t)block[0] * hq * d) {
        snprintf(error, error_size, "malformed query records for layer %u sequence %d", l, s);
        rc = -1;
        break;
      }
      const uint32_t nq = block[0];
      const kvq_mask mask = (kvq_mask)block[1];
      float *logits = malloc(sizeof(float) * nq * hq * len), *probs = malloc(sizeof(float) * nq * hq * len);
      float *out = malloc(sizeof(float) * nq * hq * d);
      if (golden_run_block(cache, ids[s], l, L, q, nq, mask, len, logits, probs, out) != KVQ_OK) {
        snprintf(error, error_size, "attention: %s", kvq_context_last_error(ctx));
        rc = -1;
      } else {
        golden_name(name, sizeof name, "logits", (int)l, s, -1);
        rc |= golden_add_f32(g, name, logits, (uint64_t)nq * hq * len);
        golden_name(name, sizeof name, "probs", (int)l, s, -1);
        rc |= golden_add_f32(g, name, probs, (uint64_t)nq * hq * len);
        golden_name(name, sizeof name, "outputs", (int)l, s, -1);
        rc |= golden_add_f32(g, name, out, (uint64_t)nq * hq * d);
      }
      free(logits), free(probs), free(out);
    }
  }
  if (rc != 0 && !error[0]) snprintf(error, error_size, "out of memory");
  golden_inputs_free(&in);
  if (rc == 0 && keep) *keep = cache;
  else kvq_cache_destroy(cache);
  return rc ? -1 : 0;
}

/* Codebooks for the layers that need them, learned on the CPU from sequence 0's tokens (as
 * stored, in the input dtype) and recorded as a codebook file that replays load first. */
static int layer_learns(const golden_case *c, uint32_t l) {
  kvq_side_layout s[2];
  kvq_side_layout_init(&s[0], &c->layers[l].keys, c->page_size, c->layers[l].head_dim, c->layers[l].kv_heads);
  kvq_side_layout_init(&s[1], &c->layers[l].values, c->page_size, c->layers[l].head_dim, c->layers[l].kv_heads);
  return kvq_side_needs_learning(&s[0]) || kvq_side_needs_learning(&s[1]);
}

static int case_codebooks(const golden_case *c, const kvq_cache_config *config, golden_file *g) {
  int needed = 0;
  for (uint32_t l = 0; l < c->layer_count; l++) needed |= layer_learns(c, l);
  if (!needed) return 0;
  kvq_context *ctx = cpu_context();
  kvq_cache *cache = NULL;
  int rc = !ctx || kvq_cache_create(ctx, config, &cache) != KVQ_OK;
  char name[64];
  for (uint32_t l = 0; l < c->layer_count && rc == 0; l++) {
    if (!layer_learns(c, l)) continue;
    const golden_record *kr, *vr;
    golden_name(name, sizeof name, "keys", (int)l, -1, -1);
    kr = golden_find(g, name);
    golden_name(name, sizeof name, "values", (int)l, -1, -1);
    vr = golden_find(g, name);
    if (!kr || !vr) {
      rc = 1;
      break;
    }
    int64_t shape[3] = {c->lengths[0], c->layers[l].kv_heads, c->layers[l].head_dim};
    kvq_tensor k = kvq_tensor_host(kr->data, c->input, 3, shape), v = kvq_tensor_host(vr->data, c->input, 3, shape);
    rc |= kvq_codebooks_learn(cache, l, &k, &v, NULL) != KVQ_OK;
  }
  uint64_t size = 0;
  size_t written = 0;
  uint8_t *file = NULL;
  rc = rc || kvq_codebooks_save_size(cache, &size) != KVQ_OK || !(file = malloc(size)) ||
       kvq_codebooks_save_to_memory(cache, file, size, &written) != KVQ_OK ||
       golden_add(g, "codebooks", GOLDEN_BYTES, file, written) != 0;
  free(file);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  return rc ? -1 : 0;
}

/* The input records of a case: config, schedule, sequences, the token streams in the input dtype,
 * and the query blocks (the last QUERIES positions of each sequence: sequence 0 causal, 1 none). */
static int case_inputs(const golden_case *c, golden_file *g) {
  char name[128];
  int rc = 0;
  kvq_cache_config config = {.layer_count = c->layer_count, .layers = c->layers, .input_dtype = c->input,
                             .page_size = c->page_size, .residual_window = c->window, .max_pages = 32,
                             .max_sequences = GOLDEN_SEQUENCES, .seed = c->seed};
  config.policy = c->policy;
  kvq_writer w = {NULL, 0};
  kvq_put_config(&w, &config);
  uint8_t *conf = malloc((size_t)w.pos);
  if (!conf) return -1;
  kvq_writer w2 = {conf, 0};
  kvq_put_config(&w2, &config);
  rc |= golden_add(g, "name", GOLDEN_BYTES, c->name, strlen(c->name));
  rc |= golden_add(g, "config", GOLDEN_BYTES, conf, w.pos);
  free(conf);
  if (c->policy.kind != KVQ_POLICY_KEEP_ALL) { /* the config record has no policy: its own record */
    uint8_t record[24];
    kvq_writer pw = {record, 0};
    kvq_put_policy(&pw, &c->policy);
    rc |= golden_add(g, "policy", GOLDEN_BYTES, record, pw.pos);
  }
  uint32_t steps;
  uint32_t *schedule = golden_schedule(c, &steps);
  rc |= !schedule || golden_add_u32(g, "schedule", schedule, 4 * (uint64_t)steps);
  free(schedule);
  const uint32_t sequences[2 * GOLDEN_SEQUENCES] = {0, c->lengths[0], c->lengths[0], c->lengths[1]};
  rc |= golden_add_u32(g, "sequences", sequences, 2 * GOLDEN_SEQUENCES);
  const uint32_t total = c->lengths[0] + c->lengths[1];
  for (uint32_t l = 0; l < c->layer_count && rc == 0; l++) {
    const kvq_layer_config *L = &c->layers[l];
    const uint32_t hq = L->query_heads, d = L->head_dim;
    const uint64_t n = (uint64_t)total * L->kv_heads * d;
    float *k = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * n), *q = malloc(sizeof(float) * total * hq * d);
    uint8_t *raw = malloc(n * kvq_dtype_size(c->input));
    kvq_synth_config sc = kvq_synth_defaults(total, L->kv_heads, hq, d, c->seed * 16 + l);
    rc |= !k || !v || !q || !raw || kvq_synth_generate(&sc, k, v, q) != 0;
    if (rc == 0) {
      to_dtype(k, n, c->input, raw);
      golden_name(name, sizeof name, "keys", (int)l, -1, -1);
      rc |= golden_add(g, name, GOLDEN_BYTES, raw, n * kvq_dtype_size(c->input));
      to_dtype(v, n, c->input, raw);
      golden_name(name, sizeof name, "values", (int)l, -1, -1);
      rc |= golden_add(g, name, GOLDEN_BYTES, raw, n * kvq_dtype_size(c->input));
      if (c->prefill) { /* decoding queries every position: the stream of queries */
        golden_name(name, sizeof name, "stream_queries", (int)l, -1, -1);
        rc |= golden_add_f32(g, name, q, (uint64_t)total * hq * d);
      }
      for (int s = 0; s < GOLDEN_SEQUENCES; s++) {
        const uint32_t len = c->lengths[s], nq = len < QUERIES ? len : QUERIES;
        const uint32_t block[2] = {nq, s == 0 ? (uint32_t)KVQ_MASK_CAUSAL : (uint32_t)KVQ_MASK_NONE};
        golden_name(name, sizeof name, "query_block", (int)l, s, -1);
        rc |= golden_add_u32(g, name, block, 2);
        golden_name(name, sizeof name, "queries", (int)l, s, -1);
        rc |= golden_add_f32(g, name, q + ((uint64_t)sequences[2 * s] + len - nq) * hq * d, (uint64_t)nq * hq * d);
      }
    }
    free(k), free(v), free(q), free(raw);
  }
  if (rc == 0) rc = case_codebooks(c, &config, g);
  return rc ? -1 : 0;
}

static int write_case(const golden_case *c, const char *dir, kvq_context *ctx, FILE *log, kvq_cache **keep) {
  golden_file g = {0};
  char error[512] = "", path[1024];
  int rc = case_inputs(c, &g) != 0 ? (snprintf(error, sizeof error, "out of memory"), 1)
                                   : kvq_golden_record_results(&g, ctx, keep, error, sizeof error) != 0;
  snprintf(path, sizeof path, "%s/%s.kvqg", dir, c->name);
  if (!rc) rc = golden_save(&g, path, error, sizeof error) != 0;
  if (rc) fprintf(log, "kvq golden --write: %s: %s\n", c->name, error);
  else fprintf(log, "wrote %s\n", path);
  golden_free(&g);
  return rc;
}

int kvq_golden_write_case(const golden_case *c, const char *dir, FILE *log) {
  kvq_context *ctx = cpu_context();
  if (!ctx) {
    fprintf(log, "kvq golden --write: the CPU backend does not start\n");
    return 1;
  }
  const int rc = write_case(c, dir, ctx, log, NULL);
  kvq_context_destroy(ctx);
  return rc;
}

static int write_bytes(const char *dir, const char *file, const uint8_t *data, size_t size, FILE *log) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(data, 1, size, f) == size;
  if (f) ok = fclose(f) == 0 && ok;
  fprintf(log, ok ? "wrote %s\n" : "kvq golden --write: cannot write %s\n", path);
  return ok ? 0 : 1;
}

/* A saved cache that every later kvq must load, and saved files it must reject (docs/GOLDEN.md). */
static int write_saved_files(kvq_cache *cache, const char *dir, FILE *log) {
  uint64_t size;
  size_t written;
  if (kvq_cache_save_size(cache, &size) != KVQ_OK) return 1;
  uint8_t *data = malloc(size), *bad = malloc(size);
  int rc = kvq_cache_save_to_memory(cache, data, size, &written) != KVQ_OK;
  rc |= write_bytes(dir, "cache-v1.kvq", data, size, log);
  rc |= write_bytes(dir, "reject-truncated.kvq", data, 4096, log);
  memcpy(bad, data, size);
  bad[size / 3] ^= 0x01;
  rc |= write_bytes(dir, "reject-checksum.kvq", bad, size, log);
  memcpy(bad, data, size);
  bad[8] = 99; /* format version 99, checksum recomputed */
  kvq_sha256_digest(bad, size - 32, bad + size - 32);
  rc |= write_bytes(dir, "reject-version.kvq", bad, size, log);
  memcpy(bad, data, size);
  const uint32_t page_size = 24; /* CONF payload starts at 80; page_size is its third field */
  memcpy(bad + 88, &page_size, 4);
  kvq_sha256_digest(bad, size - 32, bad + size - 32);
  rc |= write_bytes(dir, "reject-bad-format.kvq", bad, size, log);
  free(data);
  free(bad);
  return rc;
}

/* ---- Long streams (docs/GOLDEN.md): a sequence of 2^31 - 16 tokens in a file of a few KB ------- */

enum { LONG_P = 16, LONG_DIM = 16, LONG_DECODED = 48, LONG_TOKENS = 0x7ffffff0 /* 2^31 - 16, a page boundary */ };

/* One sequence decoded token by token under H2O (sinks, recent 16, no heavy tokens), then the policy
 * applied once more, in a cache of one layer of exact fp16 keys and values, 16 tokens per page, no
 * window. No attention runs, so every statistic is zero and the file is the same on every platform.
 * After 48 tokens the sequence keeps the page of its sinks (with sinks > 0) and its last page. */
static kvq_cache *short_h2o_stream(kvq_context *ctx, uint32_t sinks) {
  kvq_layer_config layer = {.query_heads = 1, .kv_heads = 1, .head_dim = LONG_DIM,
                            .keys = kvq_method_defaults(KVQ_METHOD_EXACT, LONG_DIM),
                            .values = kvq_method_defaults(KVQ_METHOD_EXACT, LONG_DIM)};
  layer.keys.exact.dtype = layer.values.exact.dtype = KVQ_DTYPE_F16;
  kvq_cache_config config = {.layer_count = 1, .layers = &layer, .input_dtype = KVQ_DTYPE_F32, .page_size = LONG_P,
                             .residual_window = 0, .max_pages = 4, .max_sequences = 1, .seed = 31};
  config.policy = kvq_policy_defaults(KVQ_POLICY_H2O);
  config.policy.sinks = sinks, config.policy.recent = LONG_P, config.policy.heavy = 0, config.policy.heavy_fraction = 0.0f;
  kvq_cache *cache = NULL;
  uint32_t seq;
  if (kvq_cache_create(ctx, &config, &cache) != KVQ_OK || kvq_sequence_add(cache, &seq) != KVQ_OK) {
    kvq_cache_destroy(cache);
    return NULL;
  }
  int64_t shape[3] = {1, 1, LONG_DIM};
  kvq_status st = KVQ_OK;
  for (uint32_t t = 0; t < LONG_DECODED && st == KVQ_OK; t++) {
    float k[LONG_DIM], v[LONG_DIM]; /* multiples of 1/8 in [-1, 1]: exact in fp16 */
    for (uint32_t c = 0; c < LONG_DIM; c++) {
      k[c] = (float)((int)((t * 31 + c * 7) % 17) - 8) / 8.0f;
      v[c] = (float)((int)((t * 13 + c * 5) % 17) - 8) / 8.0f;
    }
    kvq_tensor kt = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(v, KVQ_DTYPE_F32, 3, shape);
    st = kvq_append(cache, seq, 0, &kt, &vt);
  }
  if (st != KVQ_OK || kvq_sequence_apply_policy(cache, seq) != KVQ_OK) {
    kvq_cache_destroy(cache);
    return NULL;
  }
  return cache;
}

/* The offset of a section's payload in a saved cache (docs/FORMAT.md: a 64-byte header, then per
 * section u32 tag, u32 0, u64 payload bytes, the payload padded to 8 bytes). */
static size_t section_payload(const uint8_t *data, size_t size, const char tag[4]) {
  size_t at = KVQ_FILE_HEADER_BYTES;
  while (at + 16 <= size - 32 && memcmp(data + at, tag, 4) != 0) {
    uint64_t n;
    memcpy(&n, data + at + 8, 8);
    at += 16 + (size_t)n + (size_t)((8 - n % 8) % 8);
  }
  return at + 16;
}

static void set32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}

/* Moves the end of short_h2o_stream's saved sequence from 48 tokens to LONG_TOKENS, as if it had
 * decoded that long: its token counts and pages taken, and the page numbers and statistics positions
 * past page 0 (the sinks' page) move by the same distance. SEQS: slot count, generation, live, page
 * count, (tokens, ring_start, quantized), page slots. PLCY: the policy (6 u32), pages taken, page
 * numbers, masks (1 word each with P = 16), statistics count, records. */
static void stretch(uint8_t *data, size_t size) {
  const uint32_t shift = LONG_TOKENS - LONG_DECODED;
  uint8_t *seqs = data + section_payload(data, size, "SEQS"), *plcy = data + section_payload(data, size, "PLCY");
  const uint32_t pages = kvq_le32(seqs + 12);
  for (int i = 0; i < 3; i++) set32(seqs + 16 + 4 * i, LONG_TOKENS);
  set32(plcy + 24, LONG_TOKENS / LONG_P);
  for (uint32_t e = 0; e < pages; e++) {
    uint8_t *number = plcy + 28 + 4 * e;
    if (kvq_le32(number) > 0) set32(number, kvq_le32(number) + shift / LONG_P);
  }
  uint8_t *count = plcy + 28 + 8 * pages;
  for (uint32_t k = 0; k < kvq_le32(count); k++) {
    uint8_t *position = count + 4 + KVQ_STATISTICS_RECORD_BYTES * k;
    if (kvq_le32(position) >= LONG_P) set32(position, kvq_le32(position) + shift);
  }
}

/* The statistics count of the (only) sequence in a stretched file. */
static uint8_t *statistics_count(uint8_t *data, size_t size) {
  uint8_t *seqs = data + section_payload(data, size, "SEQS"), *plcy = data + section_payload(data, size, "PLCY");
  return plcy + 28 + 8 * kvq_le32(seqs + 12);
}

uint8_t *kvq_golden_long_stream(golden_long_stream which, size_t *size) {
  kvq_context *ctx = cpu_context();
  const int with_sinks = which == GOLDEN_LONG_WITH_SINKS || which == GOLDEN_LONG_HUGE_COUNT;
  kvq_cache *cache = ctx ? short_h2o_stream(ctx, with_sinks ? 4 : 0) : NULL;
  uint64_t bytes = 0;
  uint8_t *data = cache && kvq_cache_save_size(cache, &bytes) == KVQ_OK ? malloc((size_t)bytes) : NULL;
  if (data && kvq_cache_save_to_memory(cache, data, (size_t)bytes, size) != KVQ_OK) {
    free(data);
    data = NULL;
  }
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  if (!data) return NULL;
  stretch(data, *size);
  if (which == GOLDEN_LONG_FAR_POSITION) /* the policy keeps 4 sinks, whose page the sequence lacks */
    set32(data + section_payload(data, *size, "PLCY") + 4, 4);
  if (which == GOLDEN_LONG_HUGE_COUNT) /* statistics for every position, 20 records present */
    set32(statistics_count(data, *size), LONG_TOKENS);
  kvq_sha256_digest(data, *size - 32, data + *size - 32);
  return data;
}

/* The crafted files every kvq must refuse quickly (docs/GOLDEN.md). */
static int write_long_streams(const char *dir, FILE *log) {
  const struct {
    golden_long_stream which;
    const char *file;
  } files[] = {{GOLDEN_LONG_FAR_POSITION, "reject-bad-format-far-position.kvq"},
               {GOLDEN_LONG_HUGE_COUNT, "reject-bad-format-huge-count.kvq"}};
  int rc = 0;
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    size_t size = 0;
    uint8_t *data = kvq_golden_long_stream(files[i].which, &size);
    rc |= data ? write_bytes(dir, files[i].file, data, size, log) : fail(log, "cannot build a long stream", NULL);
    free(data);
  }
  return rc;
}

static int write_cache_file(kvq_cache *cache, const char *dir, const char *file, FILE *log) {
  uint64_t size;
  size_t written;
  if (kvq_cache_save_size(cache, &size) != KVQ_OK) return 1;
  uint8_t *data = malloc(size);
  int rc = !data || kvq_cache_save_to_memory(cache, data, size, &written) != KVQ_OK;
  if (!rc) rc = write_bytes(dir, file, data, size, log);
  free(data);
  return rc;
}

int kvq_golden_write(const char *dir, FILE *log) {
  kvq_context *ctx = cpu_context();
  if (!ctx) return fail(log, "cannot start the CPU backend", NULL);
  int rc = 0;
  /* The saved-cache files come from the case with the smallest matrices (with a window, a flushed
   * partial page and outliers), to keep them small. */
  const uint32_t saved_case = 3;
  kvq_cache *saved = NULL, *with_policy = NULL, *with_codebooks = NULL;
  for (uint32_t i = 0; i < golden_case_total(); i++) {
    const golden_case *c = golden_case_get(i);
    kvq_cache **keep = i == saved_case ? &saved : NULL;
    /* mid-stream under Q-Hitter (KIVI, PolarQuant, QJL, uniform; the policy section with errors), and
     * learned codebooks (online PolarQuant with Hadamard signs, CQ) */
    if (!strcmp(c->name, "qhitter-kivi2-keys-polar-values-two-layers-f16-stream")) keep = &with_policy;
    if (!strcmp(c->name, "polar-online-322-hadamard-keys-cq-8c8b-values-d64-f32-gqa2")) keep = &with_codebooks;
    rc |= write_case(c, dir, ctx, log, keep);
  }
  if (saved) rc |= write_saved_files(saved, dir, log);
  else rc = 1;
  rc |= write_long_streams(dir, log);
  rc |= !with_policy || write_cache_file(with_policy, dir, "cache-policy-v1.kvq", log);
  rc |= !with_codebooks || write_cache_file(with_codebooks, dir, "cache-codebooks-v1.kvq", log);
  kvq_cache_destroy(saved);
  kvq_cache_destroy(with_policy);
  kvq_cache_destroy(with_codebooks);
  kvq_context_destroy(ctx);
  return rc;
}
