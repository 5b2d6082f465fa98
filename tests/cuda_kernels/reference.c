/*
 * The CPU side of the CUDA kernels' test (fixture.h): builds small caches on the CPU backend through
 * the public API, for every method with representative parameters, and writes what the emulated
 * kernels must reproduce. Usage: cuda_kernels_reference OUTPUT.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fixture_inputs.h"
#include "backends/cpu/cpu.h"
#include "core/halfconv.h"
#include "core/internal.h"
#include "fixture.h"

_Static_assert(KVQ_FIXTURE_SIDE_FIELDS == KVQ_SIDE_FIELD_COUNT, "fixture.h: the side fields");

enum { HKV = 2, HQ = 4, D = 64, P = 32, TOKENS = 80, CALIBRATION = 256, QUERY_ROWS = 2 * HQ };

/* Prepared floats per query row, at most (CQ c=2 b=8: 32 groups x 256 entries). */
#define MAX_PREPARED (D / 2 * 256)

typedef struct spec {
  const char *name;
  kvq_dtype input;
  kvq_method_config keys, values;
} spec;

static int fail(const char *what, kvq_context *ctx) {
  fprintf(stderr, "cuda_kernels_reference: %s: %s\n", what, ctx ? kvq_context_last_error(ctx) : "");
  return 1;
}

static float value_at(uint32_t i, uint32_t salt) { return fx_value_at(i, salt, D, 5u, 41u); }

static void put_element(uint8_t *p, kvq_dtype dtype, size_t i, float v) {
  if (dtype == KVQ_DTYPE_F32) {
    memcpy(p + 4 * i, &v, 4);
    return;
  }
  uint16_t h = (uint16_t)(dtype == KVQ_DTYPE_F16 ? kvq_f32_to_f16_bits(v) : kvq_f32_to_bf16_bits(v));
  memcpy(p + 2 * i, &h, 2);
}

static int write_all(FILE *f, const void *p, size_t bytes) { return fwrite(p, 1, bytes, f) == bytes ? 0 : 1; }

/* The backend's QUANTIZE of the same tokens, with errors, into fresh buffers: its pages must be the
 * cache's, its errors are the reference; then its DEQUANTIZE of those whole pages. */
static int cpu_jobs(kvq_cache *cache, int side, const uint8_t *input, size_t input_bytes, uint32_t pages,
                    const uint8_t *expected_pages, float *errors, float *whole_pages) {
  kvq_backend *be = cache->ctx->backend;
  const kvq_side_desc *desc = &cache->storage[0].side[side];
  const uint64_t pb = desc->layout.page_bytes, token_bytes = input_bytes / TOKENS;
  const uint64_t out_bytes = (uint64_t)pages * P * HKV * D * 4;
  kvq_buffer *src = NULL, *dst = NULL, *err = NULL, *out = NULL;
  uint32_t slots[8];
  kvq_quantize_item items[8];
  int bad = be->ops->buffer_create(be, input_bytes, &src) != KVQ_OK || be->ops->buffer_create(be, pages * pb, &dst) != KVQ_OK ||
            be->ops->buffer_create(be, (uint64_t)pages * P * HKV * 4, &err) != KVQ_OK ||
            be->ops->buffer_create(be, out_bytes, &out) != KVQ_OK;
  if (!bad) bad = be->ops->buffer_write(be, src, 0, input, input_bytes) != KVQ_OK;
  for (uint32_t e = 0; e < pages; e++) slots[e] = e;
  for (uint32_t e = 0; e < pages; e++)
    items[e] = (kvq_quantize_item){.src = src, .src_offset = e * P * token_bytes, .dst_offset = e * pb,
                                   .tokens = TOKENS - e * P < P ? TOKENS - e * P : P};
  kvq_job_quantize job = {.side = desc, .input_dtype = cache->config.input_dtype, .dst = dst, .count = pages, .items = items, .errors = err};
  if (!bad) bad = be->ops->quantize(be, &job) != KVQ_OK;
  uint8_t *check = malloc(pages * pb);
  if (!bad) bad = !check || be->ops->buffer_read(be, dst, 0, check, pages * pb) != KVQ_OK || memcmp(check, expected_pages, pages * pb) != 0;
  if (!bad) bad = be->ops->buffer_read(be, err, 0, errors, (uint64_t)pages * P * HKV * 4) != KVQ_OK;
  kvq_job_dequantize whole = {.side = desc, .pages = dst, .count = pages, .slots = slots, .out = out};
  if (!bad) bad = be->ops->dequantize(be, &whole) != KVQ_OK || be->ops->buffer_read(be, out, 0, whole_pages, out_bytes) != KVQ_OK;
  free(check);
  if (src) be->ops->buffer_destroy(be, src);
  if (dst) be->ops->buffer_destroy(be, dst);
  if (err) be->ops->buffer_destroy(be, err);
  if (out) be->ops->buffer_destroy(be, out);
  return bad;
}

/* The backend's PREPARE_QUERY of QUERY_ROWS query rows (2 positions x HQ query heads) against this
 * side's layout and fixed arrays, into prepared[QUERY_ROWS][kvq_prepared_floats]. */
static int cpu_prepare(kvq_cache *cache, int side, const float *queries, float *prepared, uint32_t pf) {
  kvq_backend *be = cache->ctx->backend;
  kvq_buffer *q = NULL, *out = NULL;
  int bad = be->ops->buffer_create(be, sizeof(float) * QUERY_ROWS * D, &q) != KVQ_OK ||
            be->ops->buffer_create(be, sizeof(float) * QUERY_ROWS * pf, &out) != KVQ_OK;
  if (!bad) bad = be->ops->buffer_write(be, q, 0, queries, sizeof(float) * QUERY_ROWS * D) != KVQ_OK;
  kvq_job_prepare job = {.keys = &cache->storage[0].side[side], .query_heads = HQ, .rows = QUERY_ROWS, .queries = q, .out = out};
  if (!bad) bad = be->ops->prepare_queries(be, &job) != KVQ_OK || be->ops->buffer_read(be, out, 0, prepared, sizeof(float) * QUERY_ROWS * pf) != KVQ_OK;
  if (q) be->ops->buffer_destroy(be, q);
  if (out) be->ops->buffer_destroy(be, out);
  return bad;
}

/* SCORE's dots as the CPU backend computes them before scaling (backends/cpu/cpu_attention.c): the
 * method's dot_page where it has one, else the decoded key dotted with q in double; dots[r][t]. */
static void cpu_dots(const kvq_side_desc *desc, const uint8_t *pages, uint32_t page_count, const float *queries,
                     const float *prepared, uint32_t pf, float *dots) {
  const kvq_side_layout *s = &desc->layout;
  const cpu_method *method = kvq_cpu_method(s->method);
  cpu_head head = kvq_cpu_head(desc);
  double part[P];
  float key[D];
  for (uint32_t r = 0; r < QUERY_ROWS; r++) {
    head.kv_head = r % HQ / (HQ / HKV);
    for (uint32_t e = 0; e < page_count; e++) {
      const uint8_t *block = pages + (size_t)e * s->page_bytes + (size_t)head.kv_head * s->head_bytes;
      const uint32_t count = TOKENS - e * P < P ? TOKENS - e * P : P;
      if (method->dot_page) method->dot_page(&head, block, count, queries + r * D, prepared + (size_t)r * pf, part);
      else
        for (uint32_t t = 0; t < count; t++) {
          method->decode(&head, block, t, key);
          part[t] = 0.0;
          for (uint32_t c = 0; c < D; c++) part[t] += (double)queries[r * D + c] * key[c];
        }
      for (uint32_t t = 0; t < count; t++) dots[r * TOKENS + e * P + t] = (float)part[t];
    }
  }
}

static int write_case(FILE *f, const spec *sp, uint32_t seed) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_CPU;
  kvq_context *ctx = NULL;
  if (kvq_context_create(&opt, &ctx) != KVQ_OK) return fail("kvq_context_create", NULL);
  kvq_layer_config layer = {.query_heads = HQ, .kv_heads = HKV, .head_dim = D, .keys = sp->keys, .values = sp->values};
  kvq_cache_config config = {.layer_count = 1, .layers = &layer, .input_dtype = sp->input, .page_size = P,
                             .residual_window = 0, .max_pages = 8, .max_sequences = 1, .seed = seed};
  kvq_cache *cache = NULL;
  int bad = 0;
  const size_t esize = sp->input == KVQ_DTYPE_F32 ? 4 : 2, n = (size_t)TOKENS * HKV * D;
  uint8_t *k = malloc(n * esize), *v = malloc(n * esize);
  float *calibration = malloc(sizeof(float) * CALIBRATION * HKV * D * 2), *decoded = malloc(sizeof(float) * n * 2);
  uint8_t *pages = malloc(8 * (size_t)KVQ_MAX_HEAD_BYTES * HKV);
  float *errors = malloc(sizeof(float) * 8 * P * HKV), *whole_pages = malloc(sizeof(float) * 8 * P * HKV * D);
  if (!k || !v || !calibration || !decoded || !pages || !errors || !whole_pages) bad = fail("out of memory", NULL);
  if (!bad && kvq_cache_create(ctx, &config, &cache) != KVQ_OK) bad = fail("kvq_cache_create", ctx);
  if (!bad && cache->storage[0].learned[0] + cache->storage[0].learned[1] < 2) { /* learn from calibration tokens */
    for (size_t i = 0; i < (size_t)CALIBRATION * HKV * D * 2; i++) calibration[i] = value_at((uint32_t)i, seed + 7u);
    int64_t shape[3] = {CALIBRATION, HKV, D};
    kvq_tensor ck = kvq_tensor_host(calibration, KVQ_DTYPE_F32, 3, shape);
    kvq_tensor cv = kvq_tensor_host(calibration + (size_t)CALIBRATION * HKV * D, KVQ_DTYPE_F32, 3, shape);
    if (kvq_codebooks_learn(cache, 0, &ck, &cv, NULL) != KVQ_OK) bad = fail("kvq_codebooks_learn", ctx);
  }
  for (size_t i = 0; !bad && i < n; i++) {
    put_element(k, sp->input, i, value_at((uint32_t)i, seed));
    put_element(v, sp->input, i, value_at((uint32_t)i, seed + 1u));
  }
  uint32_t seq = 0;
  int64_t shape[3] = {TOKENS, HKV, D};
  kvq_tensor kt = kvq_tensor_host(k, sp->input, 3, shape), vt = kvq_tensor_host(v, sp->input, 3, shape);
  kvq_tensor kd = kvq_tensor_host(decoded, KVQ_DTYPE_F32, 3, shape), vd = kvq_tensor_host(decoded + n, KVQ_DTYPE_F32, 3, shape);
  if (!bad && (kvq_sequence_add(cache, &seq) != KVQ_OK || kvq_append(cache, seq, 0, &kt, &vt) != KVQ_OK ||
               kvq_flush(cache, seq) != KVQ_OK || kvq_dequantize(cache, seq, 0, 0, TOKENS, &kd, &vd) != KVQ_OK))
    bad = fail(sp->name, ctx);
  for (int side = 0; !bad && side < 2; side++) {
    const kvq_side_desc *desc = &cache->storage[0].side[side];
    const kvq_side_layout *s = &desc->layout;
    kvq_fixture_case c = {.head_bytes = s->head_bytes, .page_bytes = (uint32_t)s->page_bytes, .qjl_constant = (float)desc->qjl_constant,
                          .input_dtype = (uint32_t)sp->input, .tokens = TOKENS,
                          .query_rows = QUERY_ROWS, .query_heads = HQ, .prepared_floats = kvq_prepared_floats(s)};
    snprintf(c.name, sizeof c.name, "%s, %s", sp->name, side == 0 ? "keys" : "values");
    uint32_t at = 0;
#define KVQ_FIXTURE_FIELD(name) c.side[at++] = s->name;
    KVQ_SIDE_FIELDS(KVQ_FIXTURE_FIELD)
#undef KVQ_FIXTURE_FIELD
    for (int j = 0; j < 2; j++) c.fixed_floats[j] = (uint32_t)kvq_side_fixed_floats(s, j);
    if (kvq_cache_read_pages(cache, seq, 0, side, pages, &c.pages) != KVQ_OK) {
      bad = fail("kvq_cache_read_pages", ctx);
      break;
    }
    memset(errors, 0, sizeof(float) * 8 * P * HKV);
    if (s->page_bytes != (uint64_t)s->head_bytes * HKV || c.pages != (TOKENS + P - 1) / P ||
        cpu_jobs(cache, side, side == 0 ? k : v, n * esize, c.pages, pages, errors, whole_pages)) {
      bad = fail("the CPU backend's quantize job (pages or errors)", ctx);
      break;
    }
    bad = write_all(f, &c, sizeof c) || write_all(f, side == 0 ? k : v, n * esize);
    for (int j = 0; !bad && j < 2; j++)
      bad = c.fixed_floats[j] != 0 && write_all(f, cache->storage[0].fixed_host[side][j], sizeof(float) * c.fixed_floats[j]);
    if (!bad)
      bad = write_all(f, pages, (size_t)c.pages * c.page_bytes) || write_all(f, decoded + side * n, sizeof(float) * n) ||
            write_all(f, errors, sizeof(float) * c.pages * P * HKV) ||
            write_all(f, whole_pages, sizeof(float) * c.pages * P * HKV * D);
    float queries[QUERY_ROWS * D], *prepared = malloc(sizeof(float) * QUERY_ROWS * MAX_PREPARED);
    for (uint32_t i = 0; i < QUERY_ROWS * D; i++) queries[i] = value_at(i, seed + 11u);
    if (!bad && (!prepared || c.prepared_floats > MAX_PREPARED || (c.prepared_floats && cpu_prepare(cache, side, queries, prepared, c.prepared_floats))))
      bad = fail("the CPU backend's query preparation", ctx);
    float dots[QUERY_ROWS * TOKENS];
    if (!bad) cpu_dots(desc, pages, c.pages, queries, prepared, c.prepared_floats, dots);
    if (!bad)
      bad = write_all(f, queries, sizeof queries) || write_all(f, prepared, sizeof(float) * QUERY_ROWS * c.prepared_floats) ||
            write_all(f, dots, sizeof dots);
    free(prepared);
    if (bad) fail("writing the fixture", NULL);
  }
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  free(k), free(v), free(calibration), free(decoded), free(pages), free(errors), free(whole_pages);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: cuda_kernels_reference OUTPUT\n");
    return 2;
  }
  const uint32_t b4222[] = {4, 2, 2, 2}, b323[] = {3, 2, 3};
  const spec specs[] = {
      {"QJL m=64 k=4 m_o=32, UNIFORM 3 bits G=16, fp32 input", KVQ_DTYPE_F32, mc_qjl(64, 4, 32), mc_uniform(3, 16)},
      {"QJL m=32 k=0, UNIFORM 4 bits G=32, bf16 input", KVQ_DTYPE_BF16, mc_qjl(32, 0, 32), mc_uniform(4, 32)},
      {"KIVI 2 bits Gt=8, EXACT fp16, fp16 input", KVQ_DTYPE_F16, mc_kivi(2, 8), mc_exact(KVQ_DTYPE_F16)},
      {"KIVI 3 bits whole page, EXACT bf16, fp32 input", KVQ_DTYPE_F32, mc_kivi(3, 0), mc_exact(KVQ_DTYPE_BF16)},
      {"PolarQuant dense offline L=4, PolarQuant Hadamard offline L=3", KVQ_DTYPE_F32,
       mc_polar(4, b4222, KVQ_ROTATION_DENSE, KVQ_CODEBOOK_OFFLINE), mc_polar(3, b323, KVQ_ROTATION_HADAMARD, KVQ_CODEBOOK_OFFLINE)},
      {"PolarQuant Hadamard learned L=4, CQ c=4 b=6 learned, fp16 input", KVQ_DTYPE_F16,
       mc_polar(4, b4222, KVQ_ROTATION_HADAMARD, KVQ_CODEBOOK_ONLINE), mc_cq(4, 6)},
      {"CQ c=2 b=8 learned, EXACT fp32, bf16 input", KVQ_DTYPE_BF16, mc_cq(2, 8), mc_exact(KVQ_DTYPE_F32)},
  };
  FILE *f = fopen(argv[1], "wb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  int bad = 0;
  for (size_t i = 0; i < sizeof specs / sizeof specs[0] && !bad; i++) bad = write_case(f, &specs[i], 1000u + (uint32_t)i);
  if (fclose(f) != 0) bad = 1;
  if (bad) remove(argv[1]);
  return bad;
}
