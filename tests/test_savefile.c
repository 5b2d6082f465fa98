/* Saving and loading caches: round trips, and every way a file can be bad. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/codebook.h"
#include "core/fixed_check.h"
#include "core/internal.h"
#include "core/layout.h"
#include "core/page_check.h"
#include "core/sha256.h"
#include "helpers.h"

typedef struct fixture {
  kvq_context *ctx;
  kvq_cache *cache;
  kvq_layer_config layers[2];
  uint32_t seqs[3];
  float *k, *v, *q;
} fixture;

enum { N = 90, HKV = 2, HQ = 4, D = 64 };

/* A CPU context, a cache of `config` (its layers in f->layers) and N tokens of synthetic keys, values
 * and queries drawn with `data_seed`. */
static void start(fixture *f, const kvq_cache_config *config, uint64_t data_seed) {
  f->ctx = th_cpu_context();
  KVQ_CHECK(f->ctx, kvq_cache_create(f->ctx, config, &f->cache));
  f->k = malloc(sizeof(float) * N * HKV * D), f->v = malloc(sizeof(float) * N * HKV * D);
  f->q = malloc(sizeof(float) * N * HQ * D);
  kvq_synth_config sc = kvq_synth_defaults(N, HKV, HQ, D, data_seed);
  kvq_synth_generate(&sc, f->k, f->v, f->q);
}

static void build(fixture *f) {
  memset(f, 0, sizeof *f);
  kvq_method_config qjl = kvq_method_defaults(KVQ_METHOD_QJL, D), uni = kvq_method_defaults(KVQ_METHOD_UNIFORM, D);
  kvq_method_config ex = kvq_method_defaults(KVQ_METHOD_EXACT, D);
  f->layers[0] = th_layer(HQ, HKV, D, qjl, uni);
  f->layers[1] = th_layer(HQ, HKV, D, ex, ex);
  kvq_cache_config config = th_config(f->layers, 2, KVQ_DTYPE_F16, 16, 32, 40, 4, 77);
  start(f, &config, 8);
  uint32_t dropped;
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seqs[0]));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &dropped));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seqs[1]));
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seqs[2]));
  const uint32_t lengths[3] = {N, 61, 5};
  for (int s = 0; s < 3; s++)
    for (uint32_t l = 0; l < 2; l++) th_append(f->ctx, f->cache, f->seqs[s], l, f->k, f->v, 0, lengths[s] - l, HKV, D, KVQ_DTYPE_F16);
  th_append(f->ctx, f->cache, dropped, 0, f->k, f->v, 0, 40, HKV, D, KVQ_DTYPE_F16);
  KVQ_CHECK(f->ctx, kvq_flush(f->cache, f->seqs[1]));
  KVQ_CHECK(f->ctx, kvq_sequence_free(f->cache, dropped)); /* leaves holes in the pool and the slots */
}

static void destroy(fixture *f) {
  kvq_cache_destroy(f->cache);
  kvq_context_destroy(f->ctx);
  free(f->k);
  free(f->v);
  free(f->q);
}

static uint8_t *save(fixture *f, kvq_cache *cache, size_t *size) {
  uint64_t bytes;
  KVQ_CHECK(f->ctx, kvq_cache_save_size(cache, &bytes));
  uint8_t *data = malloc(bytes);
  KVQ_CHECK(f->ctx, kvq_cache_save_to_memory(cache, data, bytes, size));
  cr_assert_eq(*size, bytes);
  return data;
}

/* Everything observable of a sequence: info, every token decoded, attention of the last 4. */
static void expect_same(fixture *f, kvq_cache *a, kvq_cache *b, uint32_t seq) {
  for (uint32_t l = 0; l < 2; l++) {
    kvq_sequence_info ia, ib;
    KVQ_CHECK(f->ctx, kvq_sequence_info_get(a, seq, l, &ia));
    KVQ_CHECK(f->ctx, kvq_sequence_info_get(b, seq, l, &ib));
    cr_assert(ia.tokens == ib.tokens && ia.quantized_tokens == ib.quantized_tokens && ia.pages == ib.pages);
    const uint32_t n = (uint32_t)ia.tokens;
    float *x[2][2], *o[2];
    for (int c = 0; c < 2; c++) {
      kvq_cache *cache = c ? b : a;
      x[c][0] = malloc(sizeof(float) * n * HKV * D);
      x[c][1] = malloc(sizeof(float) * n * HKV * D);
      int64_t shape[3] = {n, HKV, D}, qshape[3] = {4, HQ, D};
      kvq_tensor kt = kvq_tensor_host(x[c][0], KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(x[c][1], KVQ_DTYPE_F32, 3, shape);
      KVQ_CHECK(f->ctx, kvq_dequantize(cache, seq, l, 0, n, &kt, &vt));
      o[c] = malloc(sizeof(float) * 4 * HQ * D);
      kvq_attention_request req = {.sequence = seq, .mask = KVQ_MASK_CAUSAL,
                                   .queries = kvq_tensor_host(f->q + (size_t)(n - 4) * HQ * D, KVQ_DTYPE_F32, 3, qshape),
                                   .output = kvq_tensor_host(o[c], KVQ_DTYPE_F32, 3, qshape)};
      KVQ_CHECK(f->ctx, kvq_attention(cache, l, &req, 1));
    }
    cr_assert_eq(memcmp(x[0][0], x[1][0], sizeof(float) * n * HKV * D), 0, "layer %u keys", l);
    cr_assert_eq(memcmp(x[0][1], x[1][1], sizeof(float) * n * HKV * D), 0, "layer %u values", l);
    cr_assert_eq(memcmp(o[0], o[1], sizeof(float) * 4 * HQ * D), 0, "layer %u attention", l);
    for (int c = 0; c < 2; c++) {
      free(x[c][0]);
      free(x[c][1]);
      free(o[c]);
    }
  }
}

Test(savefile, round_trip_in_memory) {
  fixture f;
  build(&f);
  size_t size;
  uint8_t *data = save(&f, f.cache, &size);
  kvq_cache *loaded;
  KVQ_CHECK(f.ctx, kvq_cache_load_from_memory(f.ctx, data, size, &loaded));
  for (int s = 0; s < 3; s++) expect_same(&f, f.cache, loaded, f.seqs[s]);
  kvq_memory_report ra, rb;
  KVQ_CHECK(f.ctx, kvq_cache_memory(f.cache, &ra));
  KVQ_CHECK(f.ctx, kvq_cache_memory(loaded, &rb));
  cr_assert_eq(memcmp(&ra, &rb, sizeof ra), 0, "memory reports differ");
  size_t size2;
  uint8_t *again = save(&f, loaded, &size2);
  cr_assert(size == size2 && memcmp(data, again, size) == 0, "saving a loaded cache gives the same bytes");
  /* the loaded cache keeps working exactly like the original */
  for (int c = 0; c < 2; c++) {
    kvq_cache *cache = c ? loaded : f.cache;
    th_append(f.ctx, cache, f.seqs[1], 0, f.k, f.v, 61, 29, HKV, D, KVQ_DTYPE_F16);
    th_append(f.ctx, cache, f.seqs[1], 1, f.k, f.v, 60, 30, HKV, D, KVQ_DTYPE_F16);
    uint32_t fresh;
    KVQ_CHECK(f.ctx, kvq_sequence_add(cache, &fresh));
    th_append(f.ctx, cache, fresh, 0, f.k, f.v, 0, 50, HKV, D, KVQ_DTYPE_F16);
    th_append(f.ctx, cache, fresh, 1, f.k, f.v, 0, 50, HKV, D, KVQ_DTYPE_F16);
  }
  expect_same(&f, f.cache, loaded, f.seqs[1]);
  free(data);
  free(again);
  kvq_cache_destroy(loaded);
  destroy(&f);
}

Test(savefile, round_trip_through_a_file) {
  fixture f;
  build(&f);
  char path[] = "/tmp/kvq-test-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  KVQ_CHECK(f.ctx, kvq_cache_save(f.cache, path));
  char tmp[64];
  snprintf(tmp, sizeof tmp, "%s.tmp-kvq", path);
  cr_assert_neq(access(tmp, F_OK), 0, "the temporary file is renamed away");
  kvq_cache *loaded;
  KVQ_CHECK(f.ctx, kvq_cache_load(f.ctx, path, &loaded));
  for (int s = 0; s < 3; s++) expect_same(&f, f.cache, loaded, f.seqs[s]);
  kvq_cache_destroy(loaded);
  remove(path);
  cr_assert_eq(kvq_cache_load(f.ctx, path, &loaded), KVQ_ERROR_IO);
  cr_assert_null(loaded);
  cr_assert_eq(kvq_cache_save(f.cache, "/nonexistent-dir/x.kvq"), KVQ_ERROR_IO);
  destroy(&f);
}

static void reseal(uint8_t *data, size_t size) { kvq_sha256_digest(data, size - 32, data + size - 32); }

static void expect_load_fails(fixture *f, const uint8_t *data, size_t size, kvq_status want, const char *what) {
  kvq_cache *loaded = (kvq_cache *)(uintptr_t)1;
  kvq_status st = kvq_cache_load_from_memory(f->ctx, data, size, &loaded);
  cr_assert_eq(st, want, "%s: %s (%s), expected %s", what, kvq_status_string(st), kvq_context_last_error(f->ctx),
               kvq_status_string(want));
  cr_assert_null(loaded, "%s: out must be NULL on failure", what);
  cr_assert_neq(kvq_context_last_error(f->ctx)[0], 0, "%s: a message", what);
}

Test(savefile, truncated_files) {
  fixture f;
  build(&f);
  size_t size;
  uint8_t *data = save(&f, f.cache, &size);
  const size_t cuts[] = {0, 1, 7, 8, 63, 64, 65, 200, size / 2, size - 33, size - 32, size - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    char what[64];
    snprintf(what, sizeof what, "cut at %zu of %zu", cuts[i], size);
    expect_load_fails(&f, data, cuts[i], KVQ_ERROR_TRUNCATED, what);
  }
  free(data);
  destroy(&f);
}

Test(savefile, corrupted_files) {
  fixture f;
  build(&f);
  size_t size;
  uint8_t *data = save(&f, f.cache, &size);
  /* any flipped bit past the header fields is caught by the checksum */
  for (size_t at = 64; at < size; at += size / 97 + 1) {
    data[at] ^= 0x10;
    char what[64];
    snprintf(what, sizeof what, "bit flipped at %zu", at);
    expect_load_fails(&f, data, size, KVQ_ERROR_CHECKSUM, what);
    data[at] ^= 0x10;
  }
  data[0] = 'X';
  expect_load_fails(&f, data, size, KVQ_ERROR_BAD_FORMAT, "magic");
  data[0] = 'K';
  data[8] = 2; /* version 2, resealed: a newer format */
  reseal(data, size);
  expect_load_fails(&f, data, size, KVQ_ERROR_VERSION, "version 2");
  data[8] = 1;
  uint8_t *longer = malloc(size + 1);
  memcpy(longer, data, size);
  longer[size] = 0;
  expect_load_fails(&f, longer, size + 1, KVQ_ERROR_BAD_FORMAT, "trailing byte");
  free(longer);
  free(data);
  destroy(&f);
}

/* A correct checksum does not make content trustworthy: consistent files with impossible values
 * must be rejected field by field. Offsets follow docs/FORMAT.md: the CONF payload starts at 80. */
Test(savefile, consistent_checksum_bad_content) {
  fixture f;
  build(&f);
  size_t size;
  uint8_t *data = save(&f, f.cache, &size);
  uint8_t *copy = malloc(size);
  struct {
    size_t offset;
    uint32_t value;
    const char *what;
  } edits[] = {
      {80 + 8, 17, "page_size 17"},
      {80 + 0, 0, "zero layers"},
      {80 + 0, 1000000, "a million layers"},
      {80 + 4, 9, "unknown input dtype"},
      {80 + 32 + 12, 5, "unknown key method"},
      {80 + 32 + 12 + 8, 33, "m = 33"},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    memcpy(copy, data, size);
    memcpy(copy + edits[i].offset, &edits[i].value, 4);
    reseal(copy, size);
    expect_load_fails(&f, copy, size, KVQ_ERROR_BAD_FORMAT, edits[i].what);
  }
  free(copy);
  free(data);
  destroy(&f);
}

/* Offset of a section's payload in a saved file (tags as in docs/FORMAT.md). */
static size_t section_payload(const uint8_t *data, size_t size, const char tag[4], uint64_t *bytes) {
  size_t at = 64;
  while (at + 16 <= size - 32) {
    uint64_t n;
    memcpy(&n, data + at + 8, 8);
    if (memcmp(data + at, tag, 4) == 0) {
      *bytes = n;
      return at + 16;
    }
    at += 16 + n + (8 - n % 8) % 8;
  }
  cr_assert_fail("no section %.4s", tag);
  return 0;
}

/* Files whose checksum is right but whose content kvq could never have written. */
Test(savefile, forged_content_is_refused) {
  fixture f;
  build(&f);
  size_t size;
  uint8_t *data = save(&f, f.cache, &size), *copy = malloc(size);
  uint64_t n;
  /* the first page image starts after the PAGE section's count and slot list */
  const size_t pages = section_payload(data, size, "PAGE", &n);
  uint32_t used;
  memcpy(&used, data + pages, 4);
  const size_t image = pages + 4 + 4 * (size_t)used; /* layer 0 keys: QJL, d = 64, m = 128, k = 4, m_o = 128, P = 16 */
  const size_t outliers = image + 16 * 128 / 8 * 2 + 16 * 2 * 2;
  struct {
    size_t at;
    uint8_t value;
    const char *what;
  } forged[] = {
      {outliers + 3, 200, "an outlier channel beyond head_dim"},
      {outliers + 0, 63, "outlier channels out of order"},
      {outliers + 6, 1, "a nonzero padding byte after the outlier list"},
  };
  for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
    memcpy(copy, data, size);
    copy[forged[i].at] = forged[i].value;
    reseal(copy, size);
    expect_load_fails(&f, copy, size, KVQ_ERROR_BAD_FORMAT, forged[i].what);
  }
  /* the same matrix twice (S recorded in place of S_o: equal sizes here); a MATX record is 6 u32,
   * u64 float count, 32 bytes of SHA-256, the floats */
  memcpy(copy, data, size);
  const size_t matx = section_payload(copy, size, "MATX", &n);
  uint64_t floats;
  memcpy(&floats, copy + matx + 4 + 24, 8);
  const size_t second = matx + 4 + 24 + 8 + 32 + (size_t)floats * 4;
  uint32_t index;
  memcpy(&index, copy + second + 8, 4);
  cr_assert_eq(index, 1u, "the second record is S_o");
  memset(copy + second + 8, 0, 4); /* index 1 -> 0 */
  reseal(copy, size);
  expect_load_fails(&f, copy, size, KVQ_ERROR_BAD_FORMAT, "a matrix recorded twice");
  /* header fields a newer kvq might use */
  memcpy(copy, data, size);
  copy[24] = 1;
  reseal(copy, size);
  expect_load_fails(&f, copy, size, KVQ_ERROR_BAD_FORMAT, "unknown flags");
  memcpy(copy, data, size);
  copy[40] = 7;
  reseal(copy, size);
  expect_load_fails(&f, copy, size, KVQ_ERROR_BAD_FORMAT, "reserved header bytes");
  free(copy);
  free(data);
  destroy(&f);
}

/* A freed id stays invalid across save and load, and is not handed out again. */
Test(savefile, freed_ids_stay_freed) {
  fixture f;
  build(&f);
  uint32_t gone;
  KVQ_CHECK(f.ctx, kvq_sequence_add(f.cache, &gone));
  KVQ_CHECK(f.ctx, kvq_sequence_free(f.cache, gone));
  size_t size;
  uint8_t *data = save(&f, f.cache, &size);
  kvq_cache *loaded;
  KVQ_CHECK(f.ctx, kvq_cache_load_from_memory(f.ctx, data, size, &loaded));
  kvq_sequence_info info;
  cr_assert_eq(kvq_sequence_info_get(loaded, gone, 0, &info), KVQ_ERROR_NOT_FOUND);
  uint32_t fresh;
  KVQ_CHECK(f.ctx, kvq_sequence_add(loaded, &fresh));
  cr_assert_neq(fresh, gone, "a freed id came back after loading");
  kvq_cache_destroy(loaded);
  free(data);
  destroy(&f);
}

/* ---- Every method through save and load ------------------------------------------------------- */

static kvq_method_config method_with(kvq_method kind, uint32_t a, uint32_t b) {
  kvq_method_config m = kvq_method_defaults(kind, D);
  if (kind == KVQ_METHOD_KIVI) m.kivi.bits = a, m.kivi.group_tokens = b;
  if (kind == KVQ_METHOD_POLAR) m.polar.rotation = (kvq_rotation)a, m.polar.codebook = (kvq_codebook_source)b;
  if (kind == KVQ_METHOD_CQ) m.cq.channels = a, m.cq.bits = b, m.cq.iterations = 10;
  return m;
}

/* One layer of each key/value method pair: 61 tokens flushed (a partial page) and 37 in a second
 * sequence with a window, learned codebooks where needed. Saving, loading and saving again gives
 * the same bytes, and the loaded cache decodes and attends exactly as the original. */
Test(savefile, every_method_round_trips, .timeout = 120) {
  const kvq_method_config pairs[][2] = {
      {method_with(KVQ_METHOD_KIVI, 2, 0), method_with(KVQ_METHOD_KIVI, 3, 8)},
      {method_with(KVQ_METHOD_POLAR, KVQ_ROTATION_DENSE, KVQ_CODEBOOK_OFFLINE),
       method_with(KVQ_METHOD_POLAR, KVQ_ROTATION_HADAMARD, KVQ_CODEBOOK_ONLINE)},
      {method_with(KVQ_METHOD_CQ, 4, 8), method_with(KVQ_METHOD_CQ, 1, 3)},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    fixture f;
    memset(&f, 0, sizeof f);
    f.layers[0] = th_layer(HQ, HKV, D, pairs[i][0], pairs[i][1]);
    f.layers[1] = f.layers[0];
    kvq_cache_config config = th_config(f.layers, 2, KVQ_DTYPE_F16, 16, 16, 20, 2, 5);
    start(&f, &config, 9);
    int64_t shape[3] = {N, HKV, D};
    kvq_tensor kt = kvq_tensor_host(f.k, KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(f.v, KVQ_DTYPE_F32, 3, shape);
    for (uint32_t l = 0; l < 2 && i != 0; l++) KVQ_CHECK(f.ctx, kvq_codebooks_learn(f.cache, l, &kt, &vt, NULL));
    KVQ_CHECK(f.ctx, kvq_sequence_add(f.cache, &f.seqs[0]));
    KVQ_CHECK(f.ctx, kvq_sequence_add(f.cache, &f.seqs[1]));
    for (uint32_t l = 0; l < 2; l++) {
      th_append(f.ctx, f.cache, f.seqs[0], l, f.k, f.v, 0, 61, HKV, D, KVQ_DTYPE_F16);
      th_append(f.ctx, f.cache, f.seqs[1], l, f.k, f.v, 0, 37, HKV, D, KVQ_DTYPE_F16);
    }
    KVQ_CHECK(f.ctx, kvq_flush(f.cache, f.seqs[0]));
    size_t size, size2;
    uint8_t *data = save(&f, f.cache, &size);
    kvq_cache *loaded;
    KVQ_CHECK(f.ctx, kvq_cache_load_from_memory(f.ctx, data, size, &loaded));
    uint8_t *again = save(&f, loaded, &size2);
    cr_assert(size == size2 && memcmp(data, again, size) == 0, "pair %zu: a loaded cache re-saves to the same bytes", i);
    for (int s = 0; s < 2; s++) expect_same(&f, f.cache, loaded, f.seqs[s]);
    kvq_cache_destroy(loaded);
    free(data), free(again);
    destroy(&f);
  }
}

static kvq_method_config polar3222(void) {
  kvq_method_config m = method_with(KVQ_METHOD_POLAR, KVQ_ROTATION_HADAMARD, KVQ_CODEBOOK_OFFLINE);
  m.polar.bits[0] = 3;
  return m;
}

/* Loading checks every page image of every method (core/page_check.c): a page the encoder wrote
 * passes; the same page with a bit set in the unused top bits of a 3-bit code word, with a code bit
 * of a token past the valid count, in the block padding, or with impossible side data does not.
 * Offsets follow docs/FORMAT.md for one-head blocks with d = 64, P = 16 and 5 valid tokens. */
Test(savefile, page_checks_cover_every_method) {
  struct {
    kvq_method_config m;
    uint32_t past_valid_code_byte; /* a byte of codes of token 5 */
    uint32_t padding_byte;         /* a byte of block padding (0: the block has none) */
    uint32_t side_offset;          /* an fp16 side datum of token 0 made negative (0: none) */
  } cases[] = {
      /* KIVI 3 bits, groups of 4 tokens: 1024 codes 10 per word = 103 words (412 bytes; token 5's
       * codes 320.. from word 32 = byte 128); params at 412, 4 groups x 64 channels, to 1436; padding
       * to 1440 */
      {method_with(KVQ_METHOD_KIVI, 3, 4), 128, 1437, 412},
      /* PolarQuant 3,2,2,2: level 1 has 512 codes 10 per word (52 words, token 5's codes 160.. from
       * word 16 = byte 64), then levels 2-4 (64, 32, 16 bytes) and the radii at 320 */
      {polar3222(), 64, 0, 320},
      /* CQ 1 channel, 3 bits: 1024 codes 10 per word = 103 words (token 5 from word 32 = byte 128),
       * padding from 412 to 416 */
      {method_with(KVQ_METHOD_CQ, 1, 3), 128, 413, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fixture f;
    memset(&f, 0, sizeof f);
    f.layers[0] = th_layer(1, 1, D, cases[i].m, th_exact(KVQ_DTYPE_F16));
    kvq_cache_config config = th_config(f.layers, 1, KVQ_DTYPE_F32, 16, 0, 4, 1, 5);
    f.ctx = th_cpu_context();
    KVQ_CHECK(f.ctx, kvq_cache_create(f.ctx, &config, &f.cache));
    float *k = malloc(sizeof(float) * 40 * D), *v = malloc(sizeof(float) * 40 * D);
    kvq_synth_config sc = kvq_synth_defaults(40, 1, 1, D, 3);
    kvq_synth_generate(&sc, k, v, NULL);
    int64_t shape[3] = {40, 1, D};
    kvq_tensor kt = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, shape);
    if (cases[i].m.method == KVQ_METHOD_CQ) KVQ_CHECK(f.ctx, kvq_codebooks_learn(f.cache, 0, &kt, NULL, NULL));
    KVQ_CHECK(f.ctx, kvq_sequence_add(f.cache, &f.seqs[0]));
    th_append(f.ctx, f.cache, f.seqs[0], 0, k, v, 0, 5, 1, D, KVQ_DTYPE_F32);
    KVQ_CHECK(f.ctx, kvq_flush(f.cache, f.seqs[0]));
    const kvq_side_layout *s = &f.cache->storage[0].side[0].layout;
    uint8_t *page = malloc(s->page_bytes), *bad = malloc(s->page_bytes);
    uint32_t pages;
    KVQ_CHECK(f.ctx, kvq_cache_read_pages(f.cache, f.seqs[0], 0, 0, page, &pages));
    char why[256];
    cr_assert_eq(kvq_page_image_check(s, page, 5, why, sizeof why), 0, "case %zu: the encoder's page: %s", i, why);
    cr_assert_neq(kvq_page_image_check(s, page, 4, why, sizeof why), 0, "case %zu: 5 tokens are not 4", i);
    const struct {
      uint32_t offset;
      uint8_t bits;
      const char *what;
    } changes[] = {{3, 0x80, "the unused top bits of a code word"},
                   {cases[i].past_valid_code_byte, 0x01, "a code past the valid tokens"},
                   {cases[i].padding_byte, 0x01, "block padding"},
                   {cases[i].side_offset + 1, 0x80, "a negative side datum"}};
    for (size_t c = 0; c < sizeof changes / sizeof changes[0]; c++) {
      if (changes[c].offset <= 1 && c >= 2) continue; /* the case has no such bytes */
      cr_assert_lt(changes[c].offset, s->head_bytes, "case %zu: %s", i, changes[c].what);
      memcpy(bad, page, s->page_bytes);
      bad[changes[c].offset] ^= changes[c].bits;
      cr_assert_neq(kvq_page_image_check(s, bad, 5, why, sizeof why), 0, "case %zu: %s passes", i, changes[c].what);
    }
    free(page), free(bad), free(k), free(v);
    destroy(&f);
  }
}

/* A forged file refused as BAD_FORMAT for the reason it was forged for (the message says which). */
static void expect_refused(fixture *f, const uint8_t *data, size_t size, const char *what, const char *reason) {
  expect_load_fails(f, data, size, KVQ_ERROR_BAD_FORMAT, what);
  cr_assert_not_null(strstr(kvq_context_last_error(f->ctx), reason), "%s: refused for another reason: %s", what,
                     kvq_context_last_error(f->ctx));
}

/* The fixed array (layer, side, index) in a saved file's MATX section: the offset of its record
 * (6 u32, u64 floats, SHA-256, data) and its float count. */
static size_t matx_record(const uint8_t *data, size_t size, uint32_t layer, uint32_t side, uint32_t index, uint64_t *floats) {
  uint64_t n;
  size_t at = section_payload(data, size, "MATX", &n);
  uint32_t count;
  memcpy(&count, data + at, 4);
  at += 4;
  for (uint32_t k = 0; k < count; k++) {
    uint32_t head[6];
    memcpy(head, data + at, 24);
    memcpy(floats, data + at + 24, 8);
    if (head[0] == layer && head[1] == side && head[2] == index) return at;
    at += 24 + 8 + 32 + (size_t)*floats * 4;
  }
  cr_assert_fail("no fixed array %u/%u/%u", layer, side, index);
  return 0;
}

/* Rewrites a fixed array's data (and its SHA-256) in a saved file. */
static void set_fixed(uint8_t *copy, size_t at, uint64_t floats, uint64_t element, float value) {
  memcpy(copy + at + 24 + 8 + 32 + element * 4, &value, 4);
  kvq_sha256_digest(copy + at + 24 + 8 + 32, (size_t)floats * 4, copy + at + 24 + 8);
}

/*
 * Matrices, codebooks and policy state that kvq could not have written are refused too, even with
 * consistent checksums: a Hadamard sign that is not +-1, offline codebook tables that differ from
 * the ones the config defines, learned tables whose centroids are not unit vectors, codebooks marked
 * not learned while the layer holds tokens, and an evicted attention sink.
 */
Test(savefile, forged_codebooks_and_policy_state_are_refused) {
  fixture f;
  memset(&f, 0, sizeof f);
  kvq_method_config keys = kvq_method_defaults(KVQ_METHOD_POLAR, D), values = keys;
  keys.polar.rotation = KVQ_ROTATION_HADAMARD;
  values.polar.codebook = KVQ_CODEBOOK_ONLINE;
  f.layers[0] = th_layer(HQ, HKV, D, keys, values);
  kvq_cache_config config = th_config(f.layers, 1, KVQ_DTYPE_F32, 16, 0, 12, 1, 6);
  config.policy = kvq_policy_defaults(KVQ_POLICY_H2O);
  config.policy.sinks = 2, config.policy.heavy_fraction = 0.0f, config.policy.heavy = 8;
  start(&f, &config, 10);
  int64_t shape[3] = {N, HKV, D}, qshape[3] = {1, HQ, D};
  kvq_tensor vt = kvq_tensor_host(f.v, KVQ_DTYPE_F32, 3, shape);
  KVQ_CHECK(f.ctx, kvq_codebooks_learn(f.cache, 0, NULL, &vt, NULL));
  KVQ_CHECK(f.ctx, kvq_sequence_add(f.cache, &f.seqs[0]));
  float out[HQ * D];
  for (uint32_t t = 0; t < N; t++) { /* decode: the policy evicts as it goes */
    th_append(f.ctx, f.cache, f.seqs[0], 0, f.k, f.v, t, 1, HKV, D, KVQ_DTYPE_F32);
    kvq_attention_request r = {f.seqs[0], KVQ_MASK_CAUSAL, kvq_tensor_host(f.q + (size_t)t * HQ * D, KVQ_DTYPE_F32, 3, qshape),
                               kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape)};
    KVQ_CHECK(f.ctx, kvq_attention(f.cache, 0, &r, 1));
  }
  kvq_sequence_info info;
  KVQ_CHECK(f.ctx, kvq_sequence_info_get(f.cache, f.seqs[0], 0, &info));
  cr_assert_lt(info.kept_tokens, info.tokens, "the policy evicted");
  size_t size;
  uint8_t *data = save(&f, f.cache, &size), *copy = malloc(size);
  uint64_t floats;
  size_t at = matx_record(data, size, 0, 0, 0, &floats); /* the keys' Hadamard signs */
  memcpy(copy, data, size);
  set_fixed(copy, at, floats, 5, 0.5f);
  reseal(copy, size);
  expect_refused(&f, copy, size, "a Hadamard sign of 0.5", "Hadamard sign");
  at = matx_record(data, size, 0, 0, 1, &floats); /* the keys' offline tables */
  memcpy(copy, data, size);
  float centroid;
  memcpy(&centroid, copy + at + 64 + 4 * 2, 4);
  set_fixed(copy, at, floats, 2, nextafterf(centroid, 2.0f));
  reseal(copy, size);
  expect_refused(&f, copy, size, "offline tables one ulp off", "offline codebook tables differ");
  at = matx_record(data, size, 0, 1, 1, &floats); /* the values' learned tables */
  memcpy(copy, data, size);
  set_fixed(copy, at, floats, 0, 0.5f); /* level 1, centroid 0: cos 0.5 with its old sin */
  reseal(copy, size);
  expect_refused(&f, copy, size, "a learned centroid off the unit circle", "not unit centroids");
  memcpy(copy, data, size);
  memset(copy + at + 16, 0, 4); /* ready 0 */
  memset(copy + at + 24 + 8 + 32, 0, (size_t)floats * 4);
  kvq_sha256_digest(copy + at + 24 + 8 + 32, (size_t)floats * 4, copy + at + 24 + 8);
  reseal(copy, size);
  expect_refused(&f, copy, size, "codebooks not learned under tokens", "codebooks are not learned");
  /* PLCY: policy (6 u32), then the sequence: pages taken, page numbers, masks (1 word per page) */
  uint64_t n;
  const size_t plcy = section_payload(data, size, "PLCY", &n);
  memcpy(copy, data, size);
  uint32_t page_index, mask;
  memcpy(&page_index, copy + plcy + 24 + 4, 4);
  cr_assert_eq(page_index, 0u, "the sinks' page is kept");
  const size_t masks = plcy + 24 + 4 + 4 * (size_t)info.pages;
  memcpy(&mask, copy + masks, 4);
  cr_assert(mask & 1u, "the first sink is kept");
  mask &= ~1u;
  memcpy(copy + masks, &mask, 4);
  reseal(copy, size);
  expect_refused(&f, copy, size, "an evicted sink", "kept-token masks");
  memcpy(copy, data, size); /* then the statistics: u32 count, per kept token u32 position, f64, f32, f32 */
  const size_t stats = masks + 4 * (size_t)info.pages;
  uint32_t count, position;
  memcpy(&count, copy + stats, 4);
  memcpy(&position, copy + stats + 4, 4);
  cr_assert(count == info.kept_tokens && position == 0, "statistics of the kept tokens, from position 0");
  position = 1;
  memcpy(copy + stats + 4, &position, 4);
  reseal(copy, size);
  expect_refused(&f, copy, size, "statistics of another token", "statistics do not match");
  kvq_cache *loaded; /* and the file as saved loads */
  KVQ_CHECK(f.ctx, kvq_cache_load_from_memory(f.ctx, data, size, &loaded));
  kvq_cache_destroy(loaded);
  free(copy), free(data);
  destroy(&f);
}

/* A forgery of a fixed array: element e of the new array from the old one (d = row length). Each
 * below keeps the array plausible (orthogonal rows, +-1 signs) but not what the seed draws. */
typedef float (*forge_fn)(const float *old, uint64_t e, uint32_t d);
static float scaled_by_two(const float *old, uint64_t e, uint32_t d) { (void)d; return 2.0f * old[e]; }
static float row_3_negated(const float *old, uint64_t e, uint32_t d) { return e / d == 3 ? -old[e] : old[e]; }
static float all_negated(const float *old, uint64_t e, uint32_t d) { (void)d; return -old[e]; }
static float rows_0_and_1_swapped(const float *old, uint64_t e, uint32_t d) {
  return e / d == 0 ? old[e + d] : e / d == 1 ? old[e - d] : old[e];
}

static void expect_forgery_refused(fixture *f, const uint8_t *data, size_t size, uint32_t layer, uint32_t side,
                                   uint32_t index, forge_fn forge, const char *what, const char *reason) {
  uint64_t floats;
  const size_t at = matx_record(data, size, layer, side, index, &floats);
  uint8_t *copy = malloc(size);
  float *old = malloc((size_t)floats * 4);
  memcpy(copy, data, size);
  memcpy(old, data + at + 24 + 8 + 32, (size_t)floats * 4);
  for (uint64_t e = 0; e < floats; e++) {
    const float v = forge(old, e, D);
    memcpy(copy + at + 24 + 8 + 32 + e * 4, &v, 4);
  }
  cr_assert_neq(memcmp(copy, data, size), 0, "%s: the forgery changes the file", what);
  kvq_sha256_digest(copy + at + 24 + 8 + 32, (size_t)floats * 4, copy + at + 24 + 8);
  reseal(copy, size);
  expect_refused(f, copy, size, what, reason);
  free(old), free(copy);
}

/*
 * Issue 8, item 5: what the seed derives is checked against the seed. With every checksum
 * recomputed, a QJL sketch scaled by 2 or with a row negated, a PolarQuant value-side rotation that
 * differs from the key side's (both are drawn from the same stream), and negated Hadamard signs all
 * load on a loader that trusts saved matrices, and every later score silently changes. Each is
 * refused, naming the array.
 */
Test(savefile, random_matrices_are_checked_against_the_seed) {
  fixture f;
  build(&f); /* layer 0: QJL keys (sketch S and outlier sketch S_o) */
  size_t size;
  uint8_t *data = save(&f, f.cache, &size);
  expect_forgery_refused(&f, data, size, 0, 0, 0, scaled_by_two, "S scaled by 2", "the QJL sketch S differ");
  expect_forgery_refused(&f, data, size, 0, 0, 0, row_3_negated, "a row of S negated", "the QJL sketch S differ");
  expect_forgery_refused(&f, data, size, 0, 0, 1, row_3_negated, "a row of S_o negated", "the QJL outlier sketch S_o differ");
  free(data);
  destroy(&f);

  const kvq_rotation rotations[2] = {KVQ_ROTATION_DENSE, KVQ_ROTATION_HADAMARD};
  for (int r = 0; r < 2; r++) {
    memset(&f, 0, sizeof f);
    const kvq_method_config polar = method_with(KVQ_METHOD_POLAR, rotations[r], KVQ_CODEBOOK_OFFLINE);
    f.layers[0] = th_layer(HQ, HKV, D, polar, polar);
    kvq_cache_config config = th_config(f.layers, 1, KVQ_DTYPE_F32, 16, 0, 8, 1, 31);
    f.ctx = th_cpu_context();
    KVQ_CHECK(f.ctx, kvq_cache_create(f.ctx, &config, &f.cache));
    data = save(&f, f.cache, &size);
    if (r == 0) {
      expect_forgery_refused(&f, data, size, 0, 1, 0, rows_0_and_1_swapped, "a value-side rotation unlike the keys'",
                             "values: the PolarQuant rotation differ");
      expect_forgery_refused(&f, data, size, 0, 0, 0, row_3_negated, "a key-side rotation with a row negated",
                             "keys: the PolarQuant rotation differ");
    } else {
      expect_forgery_refused(&f, data, size, 0, 0, 0, all_negated, "negated Hadamard signs", "the Hadamard signs differ");
    }
    kvq_cache *loaded; /* the file as saved loads */
    KVQ_CHECK(f.ctx, kvq_cache_load_from_memory(f.ctx, data, size, &loaded));
    kvq_cache_destroy(loaded);
    free(data);
    kvq_cache_destroy(f.cache);
    kvq_context_destroy(f.ctx);
  }
}

/*
 * Files kvq writes, kvq loads (two cases an independent decoder found refused):
 * - pages are taken for every layer at once, so a layer with QJL keys and outliers can hold a page
 *   with no token of its own yet, whose outlier list is zero: the loader asked it to be strictly
 *   ascending as well, which no list of k >= 2 zeros is;
 * - learned angles are fp32, and an angle cluster at pi/2 has its centroid at fp32(pi/2), whose cos
 *   is -4.4e-8: the loader refused a negative cos for levels >= 2.
 */
Test(savefile, files_kvq_writes_with_empty_qjl_pages_or_right_angles_load) {
  fixture f;
  memset(&f, 0, sizeof f);
  const kvq_method_config uni = kvq_method_defaults(KVQ_METHOD_UNIFORM, D), qjl = kvq_method_defaults(KVQ_METHOD_QJL, D);
  cr_assert_geq(qjl.qjl.outlier_count, 2u, "the default QJL keys keep at least two outliers");
  f.layers[0] = th_layer(HQ, HKV, D, uni, uni);
  f.layers[1] = th_layer(HQ, HKV, D, qjl, uni);
  kvq_cache_config config = th_config(f.layers, 2, KVQ_DTYPE_F32, 16, 0, 8, 1, 3);
  start(&f, &config, 4);
  KVQ_CHECK(f.ctx, kvq_sequence_add(f.cache, &f.seqs[0]));
  th_append(f.ctx, f.cache, f.seqs[0], 0, f.k, f.v, 0, 16, HKV, D, KVQ_DTYPE_F32); /* a page, layer 0 only */
  size_t size;
  uint8_t *data = save(&f, f.cache, &size);
  kvq_cache *loaded;
  KVQ_CHECK(f.ctx, kvq_cache_load_from_memory(f.ctx, data, size, &loaded));
  size_t size2;
  uint8_t *again = save(&f, loaded, &size2);
  cr_assert(size == size2 && memcmp(data, again, size) == 0, "the loaded cache re-saves to the same bytes");
  kvq_cache_destroy(loaded);
  free(data), free(again);
  destroy(&f);

  /* Learned tables as core/learn.c fills them, level 2's last centroid at fp32(pi/2). */
  kvq_method_config polar = kvq_method_defaults(KVQ_METHOD_POLAR, D);
  polar.polar.codebook = KVQ_CODEBOOK_ONLINE;
  kvq_side_layout layout;
  kvq_side_layout_init(&layout, &polar, 16, D, 1);
  const uint64_t floats = kvq_side_fixed_floats(&layout, 1);
  float *tables = calloc((size_t)floats, sizeof(float));
  for (uint32_t l = 1; l <= layout.levels; l++) {
    const uint32_t bits = kvq_polar_level_bits(layout.level_bits, l), K = 1u << bits;
    double c[1u << KVQ_MAX_POLAR_BITS];
    const double top = l == 1 ? 6.0 : (double)(float)(3.14159265358979323846 / 2); /* angles as learn.c stores them */
    for (uint32_t j = 0; j < K; j++) c[j] = top * (j + 1) / K;
    kvq_polar_fill_level(l, bits, c, tables + kvq_polar_table_level_offset(layout.level_bits, l));
  }
  const float *level2 = tables + kvq_polar_table_level_offset(layout.level_bits, 2);
  const uint32_t K2 = 1u << kvq_polar_level_bits(layout.level_bits, 2);
  cr_assert_lt(level2[2 * (K2 - 1)], 0.0f, "cos(fp32(pi/2)) is negative");
  char why[256] = "";
  cr_assert_eq(kvq_fixed_check(&layout, 1, tables, 1, why, sizeof why), 0, "a centroid at fp32(pi/2) is refused: %s", why);
  free(tables);
}

/* ---- What a stream under a token policy must hold ------------------------------------------------- */

/* A saved cache of one sequence decoded token by token under `policy` (one layer, QJL keys and
 * uniform values, P = 16, no window, N tokens), the policy applied once more at the end, and the
 * offset of its PLCY payload: the policy (6 u32), pages taken, the page numbers, the masks (1 word
 * per page with P = 16), the statistics count and records (u32 position, f64, f32, f32). */
static uint8_t *decoded_stream(fixture *f, kvq_policy_config policy, size_t *size, size_t *plcy, uint32_t *pages) {
  memset(f, 0, sizeof *f);
  f->layers[0] = th_layer(HQ, HKV, D, th_qjl(128, 0, 0), th_uniform(2, 32));
  kvq_cache_config config = th_config(f->layers, 1, KVQ_DTYPE_F32, 16, 0, 12, 1, 8);
  config.policy = policy;
  start(f, &config, 12);
  KVQ_CHECK(f->ctx, kvq_sequence_add(f->cache, &f->seqs[0]));
  for (uint32_t t = 0; t < N; t++) th_append(f->ctx, f->cache, f->seqs[0], 0, f->k, f->v, t, 1, HKV, D, KVQ_DTYPE_F32);
  KVQ_CHECK(f->ctx, kvq_sequence_apply_policy(f->cache, f->seqs[0]));
  kvq_sequence_info info;
  KVQ_CHECK(f->ctx, kvq_sequence_info_get(f->cache, f->seqs[0], 0, &info));
  *pages = info.pages;
  uint8_t *data = save(f, f->cache, size);
  uint64_t n;
  *plcy = section_payload(data, *size, "PLCY", &n);
  kvq_cache *loaded; /* as saved, the stream loads */
  KVQ_CHECK(f->ctx, kvq_cache_load_from_memory(f->ctx, data, *size, &loaded));
  kvq_cache_destroy(loaded);
  return data;
}

static uint32_t le32_at(const uint8_t *data, size_t at) {
  uint32_t v;
  memcpy(&v, data + at, 4);
  return v;
}
static void set_le32(uint8_t *data, size_t at, uint32_t v) { memcpy(data + at, &v, 4); }

/*
 * No decision evicts a sink, so a stream keeps the page of its sinks; a decision at n keeps at most
 * its heavy budget of the candidates [sinks, n - recent) (none under StreamingLLM); H2O measures no
 * quantization errors. Files that break one of these (checksums recomputed) are refused.
 */
Test(savefile, streams_a_policy_could_not_leave_are_refused) {
  fixture f;
  size_t size, plcy;
  uint32_t pages;
  /* StreamingLLM with no sinks evicted page 0; a policy with 2 sinks would have kept it */
  kvq_policy_config streaming = kvq_policy_defaults(KVQ_POLICY_STREAMING);
  streaming.sinks = 0, streaming.recent = 16;
  uint8_t *data = decoded_stream(&f, streaming, &size, &plcy, &pages);
  cr_assert_neq(le32_at(data, plcy + 28), 0u, "page 0 was evicted");
  set_le32(data, plcy + 4, 2);
  reseal(data, size);
  expect_refused(&f, data, size, "two sinks whose page is gone", "page of the attention sinks");
  free(data);
  destroy(&f);
  /* StreamingLLM evicts every candidate: a kept token between the sinks and the recent window is not
   * one it leaves (page 0 holds the 4 sinks, its tokens 4..15 evicted) */
  streaming.sinks = 4;
  data = decoded_stream(&f, streaming, &size, &plcy, &pages);
  const size_t masks = plcy + 28 + 4 * (size_t)pages;
  cr_assert(le32_at(data, plcy + 28) == 0 && le32_at(data, masks) == 0xfu, "page 0 keeps the sinks alone");
  set_le32(data, masks, 0x10fu);
  reseal(data, size);
  expect_refused(&f, data, size, "StreamingLLM keeping token 8", "more tokens kept");
  free(data);
  destroy(&f);
  /* H2O keeps 8 heavy candidates: the same file with a budget of 7 is not one it could leave */
  kvq_policy_config h2o = kvq_policy_defaults(KVQ_POLICY_H2O);
  h2o.sinks = 4, h2o.recent = 16, h2o.heavy = 8, h2o.heavy_fraction = 0.0f;
  data = decoded_stream(&f, h2o, &size, &plcy, &pages);
  uint8_t *copy = malloc(size);
  memcpy(copy, data, size);
  set_le32(copy, plcy + 12, 7);
  reseal(copy, size);
  expect_refused(&f, copy, size, "8 heavy tokens kept under a budget of 7", "more tokens kept");
  /* and its statistics carry no quantization errors (the first record's key error) */
  const size_t stats = plcy + 28 + 8 * (size_t)pages;
  const float error = 0.25f;
  memcpy(copy, data, size);
  memcpy(copy + stats + 4 + 4 + 8, &error, 4);
  reseal(copy, size);
  expect_refused(&f, copy, size, "a quantization error under H2O", "quantization errors");
  free(copy);
  free(data);
  destroy(&f);
}

/* A count read from a file is checked against the bytes that remain before anything is reserved:
 * the last sequence record claiming the whole pool's pages, with none of them in the file. */
Test(savefile, page_table_longer_than_the_file_is_refused) {
  fixture f;
  build(&f);
  size_t size;
  uint8_t *data = save(&f, f.cache, &size);
  uint64_t n;
  const size_t seqs = section_payload(data, size, "SEQS", &n);
  /* the last slot holds seqs[2]: 5 tokens in the window, no page; its record ends the section:
   * generation, live, page count, then (tokens, ring_start, quantized) per layer */
  const size_t last = seqs + n - 4 * (3 + 2 * 3);
  cr_assert(le32_at(data, last + 4) == 1 && le32_at(data, last + 8) == 0, "the last record is a live sequence without pages");
  set_le32(data, last + 8, 40); /* max_pages */
  reseal(data, size);
  expect_refused(&f, data, size, "40 pages claimed, none present", "too short for its page tables");
  free(data);
  destroy(&f);
}
