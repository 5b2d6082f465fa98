/*
 * Saving and loading caches. Layout (docs/FORMAT.md has every byte):
 *   header (64 bytes): "KVQCACHE", u32 version, u32 header bytes, u64 file bytes, u32 flags,
 *                      u32 section count, 32 zero bytes
 *   sections:          u32 tag, u32 0, u64 payload bytes, payload (zero-padded to 8 bytes)
 *                      CONF config, MATX matrices, SEQS sequences, PAGE pages in use, WIND windows
 *   trailer:           SHA-256 of everything before it
 * Loading checks magic, version, length and checksum, then validates every field, so a file with a
 * correct checksum but inconsistent content is still rejected (KVQ_ERROR_BAD_FORMAT) rather than
 * trusted.
 */
#include "savefile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sha256.h"

enum {
  TAG_CONF = 0x464e4f43u, /* "CONF" little-endian */
  TAG_MATX = 0x5854414du, /* "MATX" */
  TAG_SEQS = 0x53514553u, /* "SEQS" */
  TAG_PAGE = 0x45474150u, /* "PAGE" */
  TAG_WIND = 0x444e4957u, /* "WIND" */
};

static void put_method(kvq_writer *w, const kvq_method_config *m) {
  kvq_put_u32(w, (uint32_t)m->method);
  kvq_put_u32(w, (uint32_t)m->exact.dtype);
  kvq_put_u32(w, m->qjl.sketch_dim);
  kvq_put_u32(w, m->qjl.outlier_count);
  kvq_put_u32(w, m->qjl.outlier_sketch_dim);
  kvq_put_u32(w, m->uniform.bits);
  kvq_put_u32(w, m->uniform.group_size);
}

static void get_method(kvq_reader *r, kvq_method_config *m) {
  memset(m, 0, sizeof *m);
  m->method = (kvq_method)kvq_get_u32(r);
  m->exact.dtype = (kvq_dtype)kvq_get_u32(r);
  m->qjl.sketch_dim = kvq_get_u32(r);
  m->qjl.outlier_count = kvq_get_u32(r);
  m->qjl.outlier_sketch_dim = kvq_get_u32(r);
  m->uniform.bits = kvq_get_u32(r);
  m->uniform.group_size = kvq_get_u32(r);
}

void kvq_put_config(kvq_writer *w, const kvq_cache_config *c) {
  kvq_put_u32(w, c->layer_count);
  kvq_put_u32(w, (uint32_t)c->input_dtype);
  kvq_put_u32(w, c->page_size);
  kvq_put_u32(w, c->residual_window);
  kvq_put_u32(w, c->max_pages);
  kvq_put_u32(w, c->max_sequences);
  kvq_put_u64(w, c->seed);
  for (uint32_t l = 0; l < c->layer_count; l++) {
    const kvq_layer_config *L = &c->layers[l];
    kvq_put_u32(w, L->query_heads);
    kvq_put_u32(w, L->kv_heads);
    kvq_put_u32(w, L->head_dim);
    put_method(w, &L->keys);
    put_method(w, &L->values);
  }
}

int kvq_get_config(kvq_reader *r, kvq_cache_config *c, kvq_layer_config **layers) {
  memset(c, 0, sizeof *c);
  *layers = NULL;
  c->layer_count = kvq_get_u32(r);
  c->input_dtype = (kvq_dtype)kvq_get_u32(r);
  c->page_size = kvq_get_u32(r);
  c->residual_window = kvq_get_u32(r);
  c->max_pages = kvq_get_u32(r);
  c->max_sequences = kvq_get_u32(r);
  c->seed = kvq_get_u64(r);
  if (r->short_read || c->layer_count == 0 || c->layer_count > 4096 ||
      (uint64_t)c->layer_count * 17 * 4 > r->size - r->pos)
    return -1;
  kvq_layer_config *L = calloc(c->layer_count, sizeof *L);
  if (!L) return -1;
  for (uint32_t l = 0; l < c->layer_count; l++) {
    L[l].query_heads = kvq_get_u32(r);
    L[l].kv_heads = kvq_get_u32(r);
    L[l].head_dim = kvq_get_u32(r);
    get_method(r, &L[l].keys);
    get_method(r, &L[l].values);
  }
  c->layers = L;
  *layers = L;
  return r->short_read ? -1 : 0;
}

/* ---- Writing ------------------------------------------------------------------------------------ */

static uint64_t section_begin(kvq_writer *w, uint32_t tag) {
  kvq_put_u32(w, tag);
  kvq_put_u32(w, 0);
  uint64_t at = w->pos;
  kvq_put_u64(w, 0); /* patched by section_end */
  return at;
}

static void section_end(kvq_writer *w, uint64_t at) {
  uint64_t payload = w->pos - (at + 8);
  kvq_put_zeros(w, (8 - payload % 8) % 8);
  if (w->data) {
    kvq_writer patch = {w->data, at};
    kvq_put_u64(&patch, payload);
  }
}

/* Writes (or, with w->data == NULL, measures) the whole file. Device reads go through a bounce
 * buffer of one page / one token, so the writer never needs the pool in host memory. */
static kvq_status write_file(kvq_cache *cache, kvq_writer *w) {
  kvq_context *ctx = cache->ctx;
  kvq_backend *be = ctx->backend;
  const kvq_cache_config *c = &cache->config;
  uint64_t max_chunk = 0;
  for (uint32_t l = 0; l < c->layer_count; l++)
    for (int s = 0; s < 2; s++) {
      uint64_t pb = cache->storage[l].side[s].layout.page_bytes;
      uint64_t tb = kvq_token_bytes(c->input_dtype, cache->layers[l].kv_heads, cache->layers[l].head_dim);
      max_chunk = pb > max_chunk ? pb : max_chunk;
      max_chunk = tb > max_chunk ? tb : max_chunk;
    }
  uint8_t *bounce = w->data ? malloc((size_t)max_chunk) : NULL;
  if (w->data && !bounce) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "saving: out of host memory");
  kvq_status st = KVQ_OK;

  /* header */
  kvq_put_bytes(w, KVQ_FILE_MAGIC, 8);
  kvq_put_u32(w, KVQ_FILE_VERSION);
  kvq_put_u32(w, KVQ_FILE_HEADER_BYTES);
  const uint64_t file_bytes_at = w->pos;
  kvq_put_u64(w, 0);
  kvq_put_u32(w, 0); /* flags */
  kvq_put_u32(w, 5); /* sections */
  kvq_put_zeros(w, 32);

  uint64_t at = section_begin(w, TAG_CONF);
  kvq_put_config(w, c);
  section_end(w, at);

  at = section_begin(w, TAG_MATX);
  uint32_t matrices = 0;
  for (uint32_t l = 0; l < c->layer_count; l++)
    for (int s = 0; s < 2; s++)
      for (int i = 0; i < KVQ_SIDE_MATRICES; i++) matrices += kvq_side_matrix_rows(&cache->storage[l].side[s].layout, i) > 0;
  kvq_put_u32(w, matrices);
  for (uint32_t l = 0; l < c->layer_count; l++)
    for (uint32_t s = 0; s < 2; s++)
      for (uint32_t i = 0; i < KVQ_SIDE_MATRICES; i++) {
        const uint32_t rows = kvq_side_matrix_rows(&cache->storage[l].side[s].layout, (int)i);
        if (!rows) continue;
        const uint32_t cols = cache->layers[l].head_dim;
        const float *m = cache->storage[l].matrix_host[s][i];
        kvq_put_u32(w, l);
        kvq_put_u32(w, s);
        kvq_put_u32(w, i);
        kvq_put_u32(w, rows);
        kvq_put_u32(w, cols);
        uint8_t digest[32] = {0};
        if (w->data) kvq_sha256_digest(m, (size_t)rows * cols * 4, digest);
        kvq_put_bytes(w, digest, 32);
        kvq_put_f32s(w, m, (uint64_t)rows * cols);
      }
  section_end(w, at);

  at = section_begin(w, TAG_SEQS);
  kvq_put_u32(w, cache->live_sequences);
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    if (!seq->live) continue;
    kvq_put_u32(w, (uint32_t)seq->generation << 16 | slot);
    kvq_put_u32(w, seq->page_count);
    for (uint32_t l = 0; l < c->layer_count; l++) {
      kvq_put_u32(w, seq->layers[l].tokens);
      kvq_put_u32(w, seq->layers[l].ring_start);
      kvq_put_u32(w, seq->layers[l].quantized);
    }
    for (uint32_t j = 0; j < seq->page_count; j++) kvq_put_u32(w, seq->pages[j]);
  }
  section_end(w, at);

  /* Pages in use, in ascending slot order: for each, every layer's key then value image. */
  at = section_begin(w, TAG_PAGE);
  uint8_t *used = calloc(c->max_pages, 1);
  if (!used) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "saving: out of host memory");
  uint32_t used_count = 0;
  for (uint32_t slot = 0; used && slot < c->max_sequences; slot++)
    if (cache->seqs[slot].live)
      for (uint32_t j = 0; j < cache->seqs[slot].page_count; j++) used[cache->seqs[slot].pages[j]] = 1, used_count++;
  kvq_put_u32(w, used_count);
  for (uint32_t p = 0; used && p < c->max_pages; p++)
    if (used[p]) kvq_put_u32(w, p);
  for (uint32_t p = 0; used && st == KVQ_OK && p < c->max_pages; p++) {
    if (!used[p]) continue;
    for (uint32_t l = 0; l < c->layer_count && st == KVQ_OK; l++)
      for (int s = 0; s < 2 && st == KVQ_OK; s++) {
        const uint64_t pb = cache->storage[l].side[s].layout.page_bytes;
        if (w->data) {
          st = be->ops->buffer_read(be, cache->storage[l].pages[s], (uint64_t)p * pb, bounce, pb);
          if (st != KVQ_OK) st = kvq_fail_backend(ctx, st, "saving: reading a page");
        }
        kvq_put_bytes(w, bounce, pb);
      }
  }
  free(used);
  section_end(w, at);

  /* Window tokens [ring_start, tokens) of each live sequence, per layer, keys then values. */
  at = section_begin(w, TAG_WIND);
  for (uint32_t slot = 0; st == KVQ_OK && slot < c->max_sequences; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    if (!seq->live) continue;
    for (uint32_t l = 0; l < c->layer_count && st == KVQ_OK; l++) {
      const uint64_t tb = kvq_token_bytes(c->input_dtype, cache->layers[l].kv_heads, cache->layers[l].head_dim);
      const uint64_t ring_offset = kvq_ring_offset(cache, l, slot);
      for (int s = 0; s < 2 && st == KVQ_OK; s++)
        for (uint32_t t = seq->layers[l].ring_start; t < seq->layers[l].tokens && st == KVQ_OK; t++) {
          if (w->data) {
            st = be->ops->buffer_read(be, cache->storage[l].ring[s], ring_offset + (t % cache->ring_capacity) * tb,
                                      bounce, tb);
            if (st != KVQ_OK) st = kvq_fail_backend(ctx, st, "saving: reading the window");
          }
          kvq_put_bytes(w, bounce, tb);
        }
    }
  }
  section_end(w, at);

  const uint64_t total = w->pos + 32;
  if (w->data) {
    kvq_writer patch = {w->data, file_bytes_at};
    kvq_put_u64(&patch, total);
    uint8_t digest[32];
    kvq_sha256_digest(w->data, (size_t)w->pos, digest);
    kvq_put_bytes(w, digest, 32);
  } else {
    kvq_put_zeros(w, 32);
  }
  free(bounce);
  return st;
}

kvq_status kvq_cache_save_size(kvq_cache *cache, uint64_t *bytes) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!bytes) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_save_size: bytes is NULL");
  kvq_writer w = {NULL, 0};
  kvq_status st = write_file(cache, &w);
  if (st == KVQ_OK) *bytes = w.pos;
  return st;
}

kvq_status kvq_cache_save_to_memory(kvq_cache *cache, void *buffer, size_t capacity, size_t *written) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!buffer || !written)
    return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_save_to_memory: buffer or written is NULL");
  uint64_t size;
  kvq_status st = kvq_cache_save_size(cache, &size);
  if (st != KVQ_OK) return st;
  if (size > capacity)
    return kvq_fail(cache->ctx, KVQ_ERROR_BUFFER_TOO_SMALL, "kvq_cache_save_to_memory: needs %llu bytes, got %zu",
                    (unsigned long long)size, capacity);
  kvq_writer w = {buffer, 0};
  if ((st = write_file(cache, &w)) != KVQ_OK) return st;
  *written = (size_t)w.pos;
  return KVQ_OK;
}

kvq_status kvq_cache_save(kvq_cache *cache, const char *path) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_context *ctx = cache->ctx;
  if (!path || !*path) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_save: path is empty");
  uint64_t size;
  kvq_status st = kvq_cache_save_size(cache, &size);
  if (st != KVQ_OK) return st;
  if (size > SIZE_MAX) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_save: file too large for memory");
  uint8_t *data = malloc((size_t)size);
  if (!data) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_save: out of host memory for %llu bytes",
                             (unsigned long long)size);
  kvq_writer w = {data, 0};
  st = write_file(cache, &w);
  /* Write a temporary file beside the target and rename it: readers never see a partial file. */
  size_t plen = strlen(path);
  char *tmp = st == KVQ_OK ? malloc(plen + 16) : NULL;
  if (st == KVQ_OK && !tmp) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_save: out of host memory");
  if (st == KVQ_OK) {
    snprintf(tmp, plen + 16, "%s.tmp-kvq", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
      st = kvq_fail(ctx, KVQ_ERROR_IO, "kvq_cache_save: cannot create %s: %s", tmp, strerror(errno));
    } else {
      int ok = fwrite(data, 1, (size_t)size, f) == (size_t)size;
      ok = fflush(f) == 0 && ok;
      ok = fclose(f) == 0 && ok;
      if (!ok || rename(tmp, path) != 0) {
        st = kvq_fail(ctx, KVQ_ERROR_IO, "kvq_cache_save: cannot write %s: %s", path, strerror(errno));
        remove(tmp);
      }
    }
  }
  free(tmp);
  free(data);
  return st;
}

/* ---- Reading ------------------------------------------------------------------------------------ */

static kvq_status bad(kvq_context *ctx, const char *what) {
  return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: %s", what);
}

/* Finds a section's payload. */
static int find_section(const uint8_t *data, uint64_t body_end, uint32_t tag, kvq_reader *out) {
  kvq_reader r = {data, body_end, KVQ_FILE_HEADER_BYTES, 0};
  while (r.pos < body_end) {
    uint32_t t = kvq_get_u32(&r);
    kvq_get_u32(&r);
    uint64_t n = kvq_get_u64(&r);
    if (r.short_read || n > body_end - r.pos) return 0;
    if (t == tag) {
      *out = (kvq_reader){data + r.pos, n, 0, 0};
      return 1;
    }
    uint64_t padded = n + (8 - n % 8) % 8;
    if (padded > body_end - r.pos) return 0;
    r.pos += padded;
  }
  return 0;
}

kvq_status kvq_cache_load_from_memory(kvq_context *ctx, const void *buffer, size_t size, kvq_cache **out) {
  if (out) *out = NULL;
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!buffer || !out) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_load: buffer or out is NULL");
  const uint8_t *data = buffer;
  if (size < 8 || memcmp(data, KVQ_FILE_MAGIC, 8) != 0)
    return size < 8 && memcmp(data, KVQ_FILE_MAGIC, size) == 0
               ? kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "kvq_cache_load: %zu bytes, the header alone has 64", size)
               : bad(ctx, "not a kvq cache file (magic bytes differ)");
  if (size < KVQ_FILE_HEADER_BYTES)
    return kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "kvq_cache_load: %zu bytes, the header alone has 64", size);
  kvq_reader h = {data, size, 8, 0};
  uint32_t version = kvq_get_u32(&h), header_bytes = kvq_get_u32(&h);
  uint64_t file_bytes = kvq_get_u64(&h);
  if (version != KVQ_FILE_VERSION)
    return kvq_fail(ctx, KVQ_ERROR_VERSION, "kvq_cache_load: format version %u, this kvq reads version %u", version,
                    KVQ_FILE_VERSION);
  if (header_bytes != KVQ_FILE_HEADER_BYTES || file_bytes < KVQ_FILE_HEADER_BYTES + 32)
    return bad(ctx, "inconsistent header");
  if (size < file_bytes)
    return kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "kvq_cache_load: %zu bytes of a %llu-byte file", size,
                    (unsigned long long)file_bytes);
  if (size > file_bytes) return bad(ctx, "trailing bytes after the checksum");
  uint8_t digest[32];
  kvq_sha256_digest(data, (size_t)file_bytes - 32, digest);
  if (memcmp(digest, data + file_bytes - 32, 32) != 0)
    return kvq_fail(ctx, KVQ_ERROR_CHECKSUM, "kvq_cache_load: SHA-256 mismatch: the file is corrupted");
  const uint64_t body_end = file_bytes - 32;

  /* CONF */
  kvq_reader r;
  if (!find_section(data, body_end, TAG_CONF, &r)) return bad(ctx, "no config section");
  kvq_cache_config config;
  kvq_layer_config *layers = NULL;
  if (kvq_get_config(&r, &config, &layers) != 0) {
    free(layers);
    return bad(ctx, "malformed config section");
  }
  char why[512];
  kvq_status st = kvq_config_validate(&config, why, sizeof why);
  if (st != KVQ_OK) {
    free(layers);
    return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: invalid config: %s", why);
  }
  kvq_cache *cache = NULL;
  st = kvq_cache_build(ctx, &config, 0, &cache);
  free(layers);
  if (st != KVQ_OK) return st;
  const uint32_t L = config.layer_count, P = config.page_size;

  /* MATX: every matrix the layers need, each with a matching SHA-256 */
  if (!find_section(data, body_end, TAG_MATX, &r)) {
    st = bad(ctx, "no matrix section");
    goto fail;
  }
  uint32_t matrices = kvq_get_u32(&r), expected = 0;
  for (uint32_t l = 0; l < L; l++)
    for (int s = 0; s < 2; s++)
      for (int i = 0; i < KVQ_SIDE_MATRICES; i++) expected += kvq_side_matrix_rows(&cache->storage[l].side[s].layout, i) > 0;
  if (matrices != expected) {
    st = bad(ctx, "wrong number of matrices for the config");
    goto fail;
  }
  for (uint32_t k = 0; k < matrices; k++) {
    uint32_t l = kvq_get_u32(&r), s = kvq_get_u32(&r), i = kvq_get_u32(&r), rows = kvq_get_u32(&r), cols = kvq_get_u32(&r);
    const uint8_t *sha = kvq_get_bytes(&r, 32);
    if (r.short_read || l >= L || s > 1 || i >= KVQ_SIDE_MATRICES ||
        rows != kvq_side_matrix_rows(&cache->storage[l].side[s].layout, (int)i) || rows == 0 ||
        cols != cache->layers[l].head_dim) {
      st = bad(ctx, "a matrix does not match the config");
      goto fail;
    }
    float *m = cache->storage[l].matrix_host[s][i];
    if (!kvq_get_f32s(&r, m, (uint64_t)rows * cols)) {
      st = bad(ctx, "matrix section too short");
      goto fail;
    }
    uint8_t md[32];
    kvq_sha256_digest(m, (size_t)rows * cols * 4, md);
    if (memcmp(md, sha, 32) != 0) {
      st = bad(ctx, "a matrix does not match its SHA-256");
      goto fail;
    }
  }
  if ((st = kvq_upload_matrices(cache)) != KVQ_OK) goto fail;

  /* SEQS: check every invariant the cache relies on before trusting a number */
  if (!find_section(data, body_end, TAG_SEQS, &r)) {
    st = bad(ctx, "no sequence section");
    goto fail;
  }
  uint32_t live = kvq_get_u32(&r);
  if (live > config.max_sequences) {
    st = bad(ctx, "more live sequences than max_sequences");
    goto fail;
  }
  uint8_t *page_owner = calloc(config.max_pages, 1);
  if (!page_owner) {
    st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory");
    goto fail;
  }
  for (uint32_t k = 0; k < live && st == KVQ_OK; k++) {
    uint32_t id = kvq_get_u32(&r), pages = kvq_get_u32(&r);
    uint32_t slot = id & 0xffff, generation = id >> 16;
    if (r.short_read || slot >= config.max_sequences || generation == 0 || cache->seqs[slot].live ||
        pages > config.max_pages) {
      st = bad(ctx, "a sequence record is out of range");
      break;
    }
    kvq_sequence *seq = &cache->seqs[slot];
    for (uint32_t l = 0; l < L; l++) {
      kvq_seq_layer *sl = &seq->layers[l];
      sl->tokens = kvq_get_u32(&r);
      sl->ring_start = kvq_get_u32(&r);
      sl->quantized = kvq_get_u32(&r);
      if (sl->ring_start > sl->quantized || sl->quantized > sl->tokens || sl->ring_start % P ||
          sl->tokens - sl->ring_start >= cache->ring_capacity || (sl->quantized + P - 1) / P > pages)
        st = bad(ctx, "a sequence's token counts break the cache invariants");
    }
    if (st != KVQ_OK) break;
    if ((st = kvq_reserve_page_table(cache, seq, pages)) != KVQ_OK) break;
    for (uint32_t j = 0; j < pages; j++) {
      uint32_t p = kvq_get_u32(&r);
      if (r.short_read || p >= config.max_pages || page_owner[p]) {
        st = bad(ctx, "a page table names a page out of range or twice");
        break;
      }
      page_owner[p] = 1;
      seq->pages[j] = p;
    }
    seq->page_count = pages;
    seq->generation = (uint16_t)generation;
    seq->live = 1;
    cache->live_sequences++;
  }
  if (st == KVQ_OK && r.short_read) st = bad(ctx, "sequence section too short");
  if (st == KVQ_OK) { /* the free stack: unused pages, lowest slot on top */
    cache->free_count = 0;
    for (uint32_t p = config.max_pages; p-- > 0;)
      if (!page_owner[p]) cache->free_pages[cache->free_count++] = p;
  }
  if (st != KVQ_OK) {
    free(page_owner);
    goto fail;
  }

  /* PAGE: exactly the owned pages, ascending */
  kvq_backend *be = ctx->backend;
  if (!find_section(data, body_end, TAG_PAGE, &r)) {
    st = bad(ctx, "no page section");
    goto fail;
  }
  uint32_t used = kvq_get_u32(&r);
  uint32_t *slots = used == config.max_pages - cache->free_count ? malloc(sizeof(uint32_t) * (used ? used : 1)) : NULL;
  if (!slots) {
    free(page_owner);
    st = used == config.max_pages - cache->free_count ? kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory")
                                                      : bad(ctx, "page section does not match the page tables");
    goto fail;
  }
  for (uint32_t k = 0; k < used; k++) {
    slots[k] = kvq_get_u32(&r);
    if (r.short_read || slots[k] >= config.max_pages || !page_owner[slots[k]] || (k > 0 && slots[k] <= slots[k - 1])) {
      st = bad(ctx, "page section lists pages that no sequence owns");
      break;
    }
  }
  free(page_owner);
  for (uint32_t k = 0; k < used && st == KVQ_OK; k++)
    for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
      for (int s = 0; s < 2 && st == KVQ_OK; s++) {
        const uint64_t pb = cache->storage[l].side[s].layout.page_bytes;
        const uint8_t *img = kvq_get_bytes(&r, pb);
        if (!img) st = bad(ctx, "page section too short");
        else if ((st = be->ops->buffer_write(be, cache->storage[l].pages[s], (uint64_t)slots[k] * pb, img, pb)) != KVQ_OK)
          st = kvq_fail_backend(ctx, st, "loading pages");
      }
  free(slots);
  if (st != KVQ_OK) goto fail;

  /* WIND */
  if (!find_section(data, body_end, TAG_WIND, &r)) {
    st = bad(ctx, "no window section");
    goto fail;
  }
  for (uint32_t slot = 0; slot < config.max_sequences && st == KVQ_OK; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    if (!seq->live) continue;
    for (uint32_t l = 0; l < L && st == KVQ_OK; l++) {
      const uint64_t tb = kvq_token_bytes(config.input_dtype, cache->layers[l].kv_heads, cache->layers[l].head_dim);
      const uint64_t ring_offset = kvq_ring_offset(cache, l, slot);
      for (int s = 0; s < 2 && st == KVQ_OK; s++)
        for (uint32_t t = seq->layers[l].ring_start; t < seq->layers[l].tokens && st == KVQ_OK; t++) {
          const uint8_t *tok = kvq_get_bytes(&r, tb);
          if (!tok) st = bad(ctx, "window section too short");
          else if ((st = be->ops->buffer_write(be, cache->storage[l].ring[s], ring_offset + (t % cache->ring_capacity) * tb,
                                               tok, tb)) != KVQ_OK)
            st = kvq_fail_backend(ctx, st, "loading the window");
        }
    }
  }
  if (st != KVQ_OK) goto fail;
  if ((st = be->ops->finish(be)) != KVQ_OK) {
    st = kvq_fail_backend(ctx, st, "loading");
    goto fail;
  }
  *out = cache;
  return KVQ_OK;
fail:
  kvq_cache_destroy(cache);
  return st;
}

kvq_status kvq_cache_load(kvq_context *ctx, const char *path, kvq_cache **out) {
  if (out) *out = NULL;
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!path || !out) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_load: path or out is NULL");
  if (!*path) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_load: path is empty");
  FILE *f = fopen(path, "rb");
  if (!f) return kvq_fail(ctx, KVQ_ERROR_IO, "kvq_cache_load: cannot open %s: %s", path, strerror(errno));
  uint8_t *data = NULL;
  size_t size = 0, capacity = 0;
  kvq_status st = KVQ_OK;
  for (;;) {
    if (size == capacity) {
      size_t grown = capacity ? capacity * 2 : 1 << 16;
      uint8_t *p = grown > capacity ? realloc(data, grown) : NULL;
      if (!p) {
        st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory reading %s", path);
        break;
      }
      data = p;
      capacity = grown;
    }
    size_t got = fread(data + size, 1, capacity - size, f);
    size += got;
    if (got == 0) {
      if (ferror(f)) st = kvq_fail(ctx, KVQ_ERROR_IO, "kvq_cache_load: cannot read %s", path);
      break;
    }
  }
  fclose(f);
  if (st == KVQ_OK) st = kvq_cache_load_from_memory(ctx, data, size, out);
  free(data);
  return st;
}
