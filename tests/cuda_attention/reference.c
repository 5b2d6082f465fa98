/*
 * The CPU side of the CUDA attention kernels' test (fixture.h): for every case, builds a key and a
 * value pool on the CPU backend (a cache's sides, learned codebooks included; pages quantized by the
 * backend's QUANTIZE job), a batch of four sequences over them and runs the CPU backend's SCORE,
 * SOFTMAX (with ACCUMULATE where the case asks) and WEIGHTED_SUM on it, and writes the inputs, the
 * job's packed metadata (core/gpu_plan.c, the plan a GPU backend takes) and the CPU's results.
 * Usage: cuda_attention_reference OUTPUT.
 *
 * The batch (pool of 8 pages of P = 16 tokens, pool slots 1 and 4 garbage, listed by no sequence):
 *   seq 0  3 pages at slots 7, 2, 5 (logical pages 0, 1, 3: page 2 evicted), 37 tokens (the last page
 *          partial, 5 tokens), dead tokens 3 and 7 of page 0 and 15 of page 1; a window of 6 tokens
 *          at positions 53.. through a ring of 8 (wrapping); 2 query rows at positions 55.., causal
 *   seq 1  5 pages at slots 0, 3, 6, 7, 2 (logical pages 0..4; slots 7 and 2 also seq 0's), 80
 *          tokens (two flash splits of 64 and 16), tokens 0 and 73 dead, no window, 1 query row, no mask
 *   seq 2  no pages, a window of 7 at positions 3.. in a ring of 7 (wrapping), 1 query row at
 *          position 4, causal
 *   seq 3  1 page (logical 2, positions 32..47) at slot 6, 1 query row at position 10, causal: every
 *          slot masked (probabilities 0, output 0)
 * The fused (flash) plan of the same batch, with the accumulate sums where the case has them (the
 * fused path emits them too), is written too where the plan fuses the job (every case: PolarQuant
 * values included).
 * Query rows: seq 1 row 0, seq 3 row 1, seq 0 rows 2..3, seq 2 row 4. Scores and sums lie with
 * gaps between the sequences. Cases without a window give seq 0 and seq 2 none (seq 2 then has no slot).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fixture_inputs.h"
#include "core/gpu_plan.h"
#include "core/halfconv.h"
#include "core/internal.h"
#include "fixture.h"

_Static_assert(KVQ_ATTENTION_FIXTURE_SIDE_FIELDS == KVQ_SIDE_FIELD_COUNT, "fixture.h: the side fields");
_Static_assert(KVQ_ATTENTION_FIXTURE_KERNELS == KVQ_PLAN_KERNELS, "fixture.h: the plan's kernels");

enum { D = 16, P = 16, POOL = 8, ROWS = 5, SEQS = 4, LISTED = 9, CALIBRATION = 256, GAP = 5 };

typedef struct spec {
  const char *name;
  uint32_t query_heads, kv_heads;
  kvq_dtype window_dtype;
  int window, accumulate;
  kvq_method_config keys, values;
} spec;

static int fail(const char *what, kvq_context *ctx) {
  fprintf(stderr, "cuda_attention_reference: %s: %s\n", what, ctx ? kvq_context_last_error(ctx) : "");
  return 1;
}

static float value_at(uint32_t i, uint32_t salt) { return fx_value_at(i, salt, D, 5u, 11u); }

static int write_all(FILE *f, const void *p, size_t bytes) { return fwrite(p, 1, bytes, f) == bytes ? 0 : 1; }

typedef struct buffers {
  kvq_buffer *pool[2], *ring[2], *queries, *prepared, *scores, *output, *accumulate, *tokens;
} buffers;

static int create(kvq_backend *be, uint64_t bytes, kvq_buffer **out) { return be->ops->buffer_create(be, bytes ? bytes : 4, out) != KVQ_OK; }

static int write_case(FILE *f, const spec *sp, uint32_t seed) {
  kvq_context_options opt = kvq_context_options_default();
  opt.backend = KVQ_BACKEND_CPU;
  kvq_context *ctx = NULL;
  if (kvq_context_create(&opt, &ctx) != KVQ_OK) return fail("kvq_context_create", NULL);
  const uint32_t HQ = sp->query_heads, HKV = sp->kv_heads;
  kvq_layer_config layer = {.query_heads = HQ, .kv_heads = HKV, .head_dim = D, .keys = sp->keys, .values = sp->values};
  kvq_cache_config config = {.layer_count = 1, .layers = &layer, .input_dtype = KVQ_DTYPE_F32, .page_size = P,
                             .residual_window = 0, .max_pages = POOL, .max_sequences = 1, .seed = seed};
  kvq_cache *cache = NULL;
  buffers bu = {0};
  int bad = kvq_cache_create(ctx, &config, &cache) != KVQ_OK ? fail(sp->name, ctx) : 0;
  kvq_backend *be = ctx->backend;
  const size_t token_floats = (size_t)HKV * D, esize = kvq_dtype_size(sp->window_dtype);
  float *calibration = malloc(sizeof(float) * CALIBRATION * token_floats * 2);
  if (!bad && !calibration) bad = fail("out of memory", NULL);
  if (!bad && cache->storage[0].learned[0] + cache->storage[0].learned[1] < 2) { /* learn from calibration tokens */
    for (size_t i = 0; i < CALIBRATION * token_floats * 2; i++) calibration[i] = value_at((uint32_t)i, seed + 7u);
    int64_t shape[3] = {CALIBRATION, HKV, D};
    kvq_tensor ck = kvq_tensor_host(calibration, KVQ_DTYPE_F32, 3, shape);
    kvq_tensor cv = kvq_tensor_host(calibration + CALIBRATION * token_floats, KVQ_DTYPE_F32, 3, shape);
    if (kvq_codebooks_learn(cache, 0, &ck, &cv, NULL) != KVQ_OK) bad = fail("kvq_codebooks_learn", ctx);
  }
  free(calibration);
  if (bad) {
    kvq_cache_destroy(cache);
    kvq_context_destroy(ctx);
    return 1;
  }
  const kvq_side_desc *side[2] = {&cache->storage[0].side[0], &cache->storage[0].side[1]};

  /* The batch (the comment at the top). */
  const uint32_t W0 = sp->window ? 6 : 0, W2 = sp->window ? 7 : 0;
  kvq_attention_seq seqs[SEQS] = {
      {.page_first = 0, .quantized = 37, .window = W0, .window_first = 53, .ring_capacity = 8, .ring_offset = 0,
       .query_first = 2, .query_count = 2, .query_position = 55, .mask = KVQ_MASK_CAUSAL},
      {.page_first = 3, .quantized = 80, .window = 0, .window_first = 32, .ring_capacity = 8, .ring_offset = 0,
       .query_first = 0, .query_count = 1, .query_position = 31, .mask = KVQ_MASK_NONE},
      {.page_first = 8, .quantized = 0, .window = W2, .window_first = 3, .ring_capacity = 7,
       .ring_offset = 8 * token_floats * esize, .query_first = 4, .query_count = 1, .query_position = 4, .mask = KVQ_MASK_CAUSAL},
      {.page_first = 8, .quantized = 16, .window = 0, .window_first = 48, .ring_capacity = 8, .ring_offset = 0,
       .query_first = 1, .query_count = 1, .query_position = 10, .mask = KVQ_MASK_CAUSAL},
  };
  uint64_t score_floats = 0, accumulate_floats = 0;
  for (int i = 0; i < SEQS; i++) {
    const uint64_t n = (uint64_t)seqs[i].quantized + seqs[i].window;
    seqs[i].score_offset = score_floats;
    seqs[i].accumulate_offset = accumulate_floats;
    score_floats += n * seqs[i].query_count * HQ + GAP;
    accumulate_floats += n + GAP;
  }
  const uint32_t page_slots[LISTED] = {7, 2, 5, 0, 3, 6, 7, 2, 6}, page_index[LISTED] = {0, 1, 3, 0, 1, 2, 3, 4, 2};
  const uint32_t page_alive[LISTED] = {0xffffu & ~(1u << 3 | 1u << 7), 0xffffu & ~(1u << 15), 0xffffu, 0xfffeu, 0xffffu,
                                       0xffffu, 0xffffu, 0xffffu & ~(1u << 9), 0xffffu};
  const uint32_t ring_bytes = (uint32_t)((8 + 7) * token_floats * esize), pf = kvq_prepared_floats(&side[0]->layout);

  /* The pools: every slot quantized from its own tokens (slot 5, seq 0's last page, from 5), then
   * slots 1 and 4 overwritten with garbage. */
  uint8_t *pool[2] = {NULL, NULL}, *ring[2] = {malloc(ring_bytes), malloc(ring_bytes)};
  float *tokens = malloc(sizeof(float) * POOL * P * token_floats), *queries = malloc(sizeof(float) * ROWS * HQ * D);
  float *prepared = malloc(sizeof(float) * ROWS * HQ * (pf ? pf : 1));
  float *scores = malloc(sizeof(float) * score_floats), *logits = malloc(sizeof(float) * score_floats);
  float *output = malloc(sizeof(float) * ROWS * HQ * D), *sums = malloc(sizeof(float) * accumulate_floats);
  if (!ring[0] || !ring[1] || !tokens || !queries || !prepared || !scores || !logits || !output || !sums) bad = fail("out of memory", NULL);
  for (int s = 0; !bad && s < 2; s++) {
    const uint64_t pb = side[s]->layout.page_bytes;
    pool[s] = malloc(POOL * pb);
    for (size_t i = 0; i < POOL * P * token_floats; i++) tokens[i] = value_at((uint32_t)i, seed + 1u + (uint32_t)s);
    kvq_quantize_item items[POOL];
    for (uint32_t e = 0; e < POOL; e++)
      items[e] = (kvq_quantize_item){.src_offset = e * P * token_floats * 4, .dst_offset = e * pb, .tokens = e == 5 ? 5 : P};
    bad = !pool[s] || create(be, sizeof(float) * POOL * P * token_floats, &bu.tokens) || create(be, POOL * pb, &bu.pool[s]) ||
          be->ops->buffer_write(be, bu.tokens, 0, tokens, sizeof(float) * POOL * P * token_floats) != KVQ_OK;
    for (uint32_t e = 0; e < POOL; e++) items[e].src = bu.tokens;
    kvq_job_quantize job = {.side = side[s], .input_dtype = KVQ_DTYPE_F32, .dst = bu.pool[s], .count = POOL, .items = items};
    if (!bad) bad = be->ops->quantize(be, &job) != KVQ_OK || be->ops->buffer_read(be, bu.pool[s], 0, pool[s], POOL * pb) != KVQ_OK;
    if (!bad) {
      memset(pool[s] + 1 * pb, 0xa5, pb);
      memset(pool[s] + 4 * pb, 0x5a, pb);
      bad = be->ops->buffer_write(be, bu.pool[s], 0, pool[s], POOL * pb) != KVQ_OK;
    }
    if (bu.tokens) be->ops->buffer_destroy(be, bu.tokens);
    bu.tokens = NULL;
    for (uint32_t i = 0; !bad && i < ring_bytes / esize; i++) {
      const float v = value_at(i, seed + 3u + (uint32_t)s);
      if (esize == 4) memcpy(ring[s] + 4 * i, &v, 4);
      else {
        const uint16_t h = (uint16_t)(sp->window_dtype == KVQ_DTYPE_F16 ? kvq_f32_to_f16_bits(v) : kvq_f32_to_bf16_bits(v));
        memcpy(ring[s] + 2 * i, &h, 2);
      }
    }
    if (!bad) bad = create(be, ring_bytes, &bu.ring[s]) || be->ops->buffer_write(be, bu.ring[s], 0, ring[s], ring_bytes) != KVQ_OK;
    if (bad) fail("the CPU backend's pools", ctx);
  }
  for (uint32_t i = 0; i < ROWS * HQ * D; i++) queries[i] = value_at(i, seed + 11u) * 0.5f;
  if (!bad) {
    bad = create(be, sizeof(float) * ROWS * HQ * D, &bu.queries) ||
          be->ops->buffer_write(be, bu.queries, 0, queries, sizeof(float) * ROWS * HQ * D) != KVQ_OK;
    if (!bad && pf) {
      kvq_job_prepare job = {.keys = side[0], .query_heads = HQ, .rows = ROWS * HQ, .queries = bu.queries};
      bad = create(be, sizeof(float) * ROWS * HQ * pf, &bu.prepared);
      job.out = bu.prepared;
      if (!bad) bad = be->ops->prepare_queries(be, &job) != KVQ_OK ||
                      be->ops->buffer_read(be, bu.prepared, 0, prepared, sizeof(float) * ROWS * HQ * pf) != KVQ_OK;
    }
    if (bad) fail("the CPU backend's PREPARE_QUERY", ctx);
  }
  /* scores start as a pattern (the gaps keep it), the output as zeros */
  for (uint64_t i = 0; i < score_floats; i++) scores[i] = -1234.5f;
  memset(output, 0, sizeof(float) * ROWS * HQ * D);
  for (uint64_t i = 0; i < accumulate_floats; i++) sums[i] = 777.0f;
  if (!bad)
    bad = create(be, sizeof(float) * score_floats, &bu.scores) || create(be, sizeof(float) * ROWS * HQ * D, &bu.output) ||
          create(be, sizeof(float) * accumulate_floats, &bu.accumulate) ||
          be->ops->buffer_write(be, bu.scores, 0, scores, sizeof(float) * score_floats) != KVQ_OK ||
          be->ops->buffer_write(be, bu.output, 0, output, sizeof(float) * ROWS * HQ * D) != KVQ_OK ||
          be->ops->buffer_write(be, bu.accumulate, 0, sums, sizeof(float) * accumulate_floats) != KVQ_OK;
  kvq_job_attention job = {.keys = side[0], .values = side[1], .query_heads = HQ, .window_dtype = sp->window_dtype,
                           .scale = 1.0f / sqrtf((float)D), .seq_count = SEQS, .seqs = seqs, .page_slots = page_slots,
                           .page_index = page_index, .page_alive = page_alive, .alive_words = 1,
                           .key_pages = bu.pool[0], .value_pages = bu.pool[1], .key_ring = bu.ring[0], .value_ring = bu.ring[1],
                           .queries = bu.queries, .prepared = bu.prepared, .scores = bu.scores, .output = bu.output,
                           .accumulate = sp->accumulate ? bu.accumulate : NULL};
  if (!bad) {
    bad = be->ops->score(be, &job) != KVQ_OK || be->ops->buffer_read(be, bu.scores, 0, logits, sizeof(float) * score_floats) != KVQ_OK ||
          be->ops->softmax(be, &job) != KVQ_OK || be->ops->buffer_read(be, bu.scores, 0, scores, sizeof(float) * score_floats) != KVQ_OK ||
          be->ops->buffer_read(be, bu.accumulate, 0, sums, sizeof(float) * accumulate_floats) != KVQ_OK ||
          be->ops->weighted_sum(be, &job) != KVQ_OK ||
          be->ops->buffer_read(be, bu.output, 0, output, sizeof(float) * ROWS * HQ * D) != KVQ_OK;
    if (bad) fail("the CPU backend's attention jobs", ctx);
  }
  kvq_gpu_attention_plan plan;
  char why[256];
  uint32_t *meta = NULL;
  if (!bad && kvq_gpu_plan_attention(&job, 0, &plan, why, sizeof why) != KVQ_OK) bad = fail(why, NULL);
  if (!bad && (plan.fused || plan.pages != LISTED || !(meta = calloc(plan.meta_words, 4)))) bad = fail("the plan", NULL);
  if (!bad) kvq_gpu_pack_attention(&job, &plan, meta);
  /* the fused plan of the same job, its accumulate sums included (the fused path emits them too) */
  kvq_job_attention fused_job = job;
  kvq_gpu_attention_plan fused;
  uint32_t *fused_meta = NULL;
  if (!bad && kvq_gpu_plan_attention(&fused_job, 1, &fused, why, sizeof why) != KVQ_OK) bad = fail(why, NULL);
  if (!bad && fused.fused && !(fused_meta = calloc(fused.meta_words, 4))) bad = fail("out of memory", NULL);
  if (!bad && fused.fused) kvq_gpu_pack_attention(&fused_job, &fused, fused_meta);

  kvq_attention_fixture c = {.query_heads = HQ, .window_dtype = (uint32_t)sp->window_dtype, .alive_words = 1,
                             .accumulate = (uint32_t)sp->accumulate, .scale = job.scale, .pool_pages = POOL, .ring_bytes = ring_bytes,
                             .query_rows = ROWS, .prepared_floats = pf, .score_floats = (uint32_t)score_floats,
                             .accumulate_floats = sp->accumulate ? (uint32_t)accumulate_floats : 0u, .output_floats = ROWS * HQ * D,
                             .sequences = SEQS, .listed_pages = LISTED};
  if (!bad) {
    snprintf(c.name, sizeof c.name, "%s", sp->name);
    c.meta_words = (uint32_t)plan.meta_words;
    c.rotated_sums = (uint32_t)plan.rotated_sums;
    c.scratch_bytes = (uint32_t)plan.scratch_bytes;
    for (uint32_t k = 0; k < KVQ_PLAN_KERNELS; k++) c.units[k] = (uint32_t)plan.units[k];
    c.fused = (uint32_t)fused.fused;
    c.fused_meta_words = fused.fused ? (uint32_t)fused.meta_words : 0u;
    c.fused_scratch_bytes = (uint32_t)fused.scratch_bytes;
    c.fused_rotated_at = (uint32_t)fused.rotated_at;
    for (uint32_t k = 0; k < KVQ_PLAN_KERNELS; k++) c.fused_units[k] = (uint32_t)fused.units[k];
    for (int s = 0; s < 2; s++) {
      const kvq_side_layout *l = &side[s]->layout;
      uint32_t at = 0;
#define KVQ_FIXTURE_FIELD(name) c.side[s][at++] = l->name;
      KVQ_SIDE_FIELDS(KVQ_FIXTURE_FIELD)
#undef KVQ_FIXTURE_FIELD
      c.head_bytes[s] = l->head_bytes;
      c.page_bytes[s] = (uint32_t)l->page_bytes;
      c.qjl_constant[s] = (float)side[s]->qjl_constant;
      for (int j = 0; j < 2; j++) c.fixed_floats[s][j] = (uint32_t)kvq_side_fixed_floats(l, j);
    }
    bad = write_all(f, &c, sizeof c);
    for (int s = 0; s < 2; s++)
      for (int j = 0; !bad && j < 2; j++)
        bad = c.fixed_floats[s][j] != 0 && write_all(f, cache->storage[0].fixed_host[s][j], sizeof(float) * c.fixed_floats[s][j]);
    if (!bad)
      bad = write_all(f, pool[0], (size_t)POOL * c.page_bytes[0]) || write_all(f, pool[1], (size_t)POOL * c.page_bytes[1]) ||
            write_all(f, ring[0], ring_bytes) || write_all(f, ring[1], ring_bytes) ||
            write_all(f, queries, sizeof(float) * ROWS * HQ * D) || write_all(f, prepared, sizeof(float) * ROWS * HQ * pf) ||
            write_all(f, meta, sizeof(uint32_t) * plan.meta_words) ||
            (c.fused_meta_words && write_all(f, fused_meta, sizeof(uint32_t) * c.fused_meta_words)) || write_all(f, logits, sizeof(float) * score_floats) ||
            write_all(f, scores, sizeof(float) * score_floats) || write_all(f, sums, sizeof(float) * c.accumulate_floats) ||
            write_all(f, output, sizeof(float) * c.output_floats);
    if (bad) fail("writing the fixture", NULL);
  }
  kvq_buffer *all[] = {bu.pool[0], bu.pool[1], bu.ring[0], bu.ring[1], bu.queries, bu.prepared, bu.scores, bu.output, bu.accumulate};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) be->ops->buffer_destroy(be, all[i]);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  free(pool[0]), free(pool[1]), free(ring[0]), free(ring[1]), free(tokens), free(queries), free(prepared), free(scores), free(logits);
  free(output), free(sums), free(meta), free(fused_meta);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: cuda_attention_reference OUTPUT\n");
    return 2;
  }
  const uint32_t b4222[] = {4, 2, 2, 2}, b323[] = {3, 2, 3};
  const kvq_dtype F32 = KVQ_DTYPE_F32, F16 = KVQ_DTYPE_F16, BF16 = KVQ_DTYPE_BF16;
  const spec specs[] = {
      {"QJL m=64 k=4 m_o=32 keys, UNIFORM 3 bits G=8 values, 2/2 heads, fp32 window, H2O sums", 2, 2, F32, 1, 1, mc_qjl(64, 4, 32), mc_uniform(3, 8)},
      {"QJL m=32 k=0 keys, KIVI 2 bits Gt=8 values, 4/1 heads, bf16 window", 4, 1, BF16, 1, 0, mc_qjl(32, 0, 32), mc_kivi(2, 8)},
      {"UNIFORM 4 bits G=16 keys, EXACT fp16 values, 6/2 heads, fp16 window, H2O sums", 6, 2, F16, 1, 1, mc_uniform(4, 16), mc_exact(F16)},
      {"KIVI 3 bits whole page keys, EXACT bf16 values, 1/1 heads, no window", 1, 1, F32, 0, 0, mc_kivi(3, 0), mc_exact(BF16)},
      {"EXACT fp16 keys, PolarQuant dense offline L=4 values, 1/1 heads, fp32 window, H2O sums", 1, 1, F32, 1, 1, mc_exact(F16),
       mc_polar(4, b4222, KVQ_ROTATION_DENSE, KVQ_CODEBOOK_OFFLINE)},
      {"PolarQuant Hadamard offline L=3 keys, CQ c=4 b=6 learned values, 3/1 heads, bf16 window", 3, 1, BF16, 1, 0,
       mc_polar(3, b323, KVQ_ROTATION_HADAMARD, KVQ_CODEBOOK_OFFLINE), mc_cq(4, 6)},
      {"PolarQuant dense L=4 keys, PolarQuant Hadamard learned L=4 values, 2/2 heads, fp16 window", 2, 2, F16, 1, 0,
       mc_polar(4, b4222, KVQ_ROTATION_DENSE, KVQ_CODEBOOK_OFFLINE), mc_polar(4, b4222, KVQ_ROTATION_HADAMARD, KVQ_CODEBOOK_ONLINE)},
      {"CQ c=2 b=8 learned keys, EXACT fp32 values, 2/2 heads, no window, H2O sums", 2, 2, F16, 0, 1, mc_cq(2, 8), mc_exact(F32)},
      {"EXACT fp32 keys, UNIFORM 4 bits G=16 values, 9/1 heads, fp32 window", 9, 1, F32, 1, 0, mc_exact(F32), mc_uniform(4, 16)},
      {"QJL m=160 k=0 keys, EXACT fp16 values, 8/1 heads, fp16 window", 8, 1, F16, 1, 0, mc_qjl(160, 0, 32), mc_exact(F16)},
      /* every layout the fused keys decode by runs of 8 channels (backends/cuda/kernels/runs.cuh):
       * EXACT bf16, UNIFORM 1, 2 and 8 bits with a parameter word per 4 channels (two per run), KIVI
       * 1, 2, 4 and 8 bits */
      {"EXACT bf16 keys, KIVI 1 bit Gt=4 values, 4/2 heads, bf16 window", 4, 2, BF16, 1, 0, mc_exact(BF16), mc_kivi(1, 4)},
      {"UNIFORM 2 bits G=4 keys, KIVI 8 bits Gt=8 values, 2/1 heads, fp16 window", 2, 1, F16, 1, 0, mc_uniform(2, 4), mc_kivi(8, 8)},
      {"UNIFORM 8 bits G=4 keys, UNIFORM 1 bit G=4 values, 3/1 heads, no window", 3, 1, F32, 0, 0, mc_uniform(8, 4), mc_uniform(1, 4)},
      {"UNIFORM 1 bit G=8 keys, UNIFORM 8 bits G=8 values, 2/2 heads, fp32 window", 2, 2, F32, 1, 0, mc_uniform(1, 8), mc_uniform(8, 8)},
      {"KIVI 1 bit Gt=4 keys, UNIFORM 2 bits G=4 values, 4/1 heads, fp32 window", 4, 1, F32, 1, 0, mc_kivi(1, 4), mc_uniform(2, 4)},
      {"KIVI 2 bits Gt=8 keys, EXACT fp16 values, 4/1 heads, fp16 window, H2O sums", 4, 1, F16, 1, 1, mc_kivi(2, 8), mc_exact(F16)},
      {"KIVI 4 bits whole page keys, KIVI 4 bits values, 2/1 heads, bf16 window", 2, 1, BF16, 1, 0, mc_kivi(4, 0), mc_kivi(4, 0)},
      {"KIVI 8 bits Gt=4 keys, EXACT bf16 values, 1/1 heads, no window", 1, 1, F32, 0, 0, mc_kivi(8, 4), mc_exact(BF16)},
  };
  FILE *f = fopen(argv[1], "wb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  int bad = 0;
  for (size_t i = 0; i < sizeof specs / sizeof specs[0] && !bad; i++) bad = write_case(f, &specs[i], 2000u + (uint32_t)i);
  if (fclose(f) != 0) bad = 1;
  if (bad) remove(argv[1]);
  return bad;
}
