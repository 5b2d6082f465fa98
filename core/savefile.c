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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixed_check.h"
#include "layout.h"
#include "page_check.h"
#include "sha256.h"
#include "token_check.h"

enum {
  TAG_CONF = 0x464e4f43u, /* "CONF" little-endian */
  TAG_MATX = 0x5854414du, /* "MATX" */
  TAG_SEQS = 0x53514553u, /* "SEQS" */
  TAG_PAGE = 0x45474150u, /* "PAGE" */
  TAG_WIND = 0x444e4957u, /* "WIND" */
  TAG_CODE = 0x45444f43u, /* "CODE" */
  TAG_PLCY = 0x59434c50u, /* "PLCY" */
};

/* Header flags: bit 0 = a PLCY section follows SEQS (the cache has a token policy). */
#define FLAG_POLICY 1u

/* A method record: 23 u32 (docs/FORMAT.md), every method's parameters whatever the method. */
static void put_method(kvq_writer *w, const kvq_method_config *m) {
  kvq_put_u32(w, (uint32_t)m->method);
  kvq_put_u32(w, (uint32_t)m->exact.dtype);
  kvq_put_u32(w, m->qjl.sketch_dim);
  kvq_put_u32(w, m->qjl.outlier_count);
  kvq_put_u32(w, m->qjl.outlier_sketch_dim);
  kvq_put_u32(w, m->uniform.bits);
  kvq_put_u32(w, m->uniform.group_size);
  kvq_put_u32(w, m->kivi.bits);
  kvq_put_u32(w, m->kivi.group_tokens);
  kvq_put_u32(w, m->polar.levels);
  for (int l = 0; l < KVQ_POLAR_MAX_LEVELS; l++) kvq_put_u32(w, m->polar.bits[l]);
  kvq_put_u32(w, (uint32_t)m->polar.rotation);
  kvq_put_u32(w, (uint32_t)m->polar.codebook);
  kvq_put_u32(w, m->cq.channels);
  kvq_put_u32(w, m->cq.bits);
  kvq_put_u32(w, m->cq.iterations);
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
  m->kivi.bits = kvq_get_u32(r);
  m->kivi.group_tokens = kvq_get_u32(r);
  m->polar.levels = kvq_get_u32(r);
  for (int l = 0; l < KVQ_POLAR_MAX_LEVELS; l++) m->polar.bits[l] = kvq_get_u32(r);
  m->polar.rotation = (kvq_rotation)kvq_get_u32(r);
  m->polar.codebook = (kvq_codebook_source)kvq_get_u32(r);
  m->cq.channels = kvq_get_u32(r);
  m->cq.bits = kvq_get_u32(r);
  m->cq.iterations = kvq_get_u32(r);
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
      (uint64_t)c->layer_count * (3 + 2 * KVQ_METHOD_RECORD_WORDS) * 4 > r->size - r->pos)
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

/* The fixed arrays of a cache (all of them, or only learned codebooks): u32 count, then per array
 * u32 layer, side, index, kind, ready, 0, u64 floats, SHA-256 of the floats, the floats. */
static void put_fixed(kvq_writer *w, const kvq_cache *cache, int learned_only) {
  const kvq_cache_config *c = &cache->config;
  uint32_t arrays = 0;
  for (uint32_t l = 0; l < c->layer_count; l++)
    for (int s = 0; s < 2; s++)
      for (int i = 0; i < KVQ_SIDE_FIXED; i++) {
        const kvq_side_layout *layout = &cache->storage[l].side[s].layout;
        arrays += kvq_side_fixed_floats(layout, i) > 0 && (!learned_only || kvq_side_fixed_kind(layout, i) == KVQ_FIXED_LEARNED);
      }
  kvq_put_u32(w, arrays);
  for (uint32_t l = 0; l < c->layer_count; l++)
    for (uint32_t s = 0; s < 2; s++)
      for (uint32_t i = 0; i < KVQ_SIDE_FIXED; i++) {
        const kvq_side_layout *layout = &cache->storage[l].side[s].layout;
        const uint64_t floats = kvq_side_fixed_floats(layout, (int)i);
        const kvq_fixed_kind kind = kvq_side_fixed_kind(layout, (int)i);
        if (!floats || (learned_only && kind != KVQ_FIXED_LEARNED)) continue;
        const float *m = cache->storage[l].fixed_host[s][i];
        kvq_put_u32(w, l);
        kvq_put_u32(w, s);
        kvq_put_u32(w, i);
        kvq_put_u32(w, (uint32_t)kind);
        kvq_put_u32(w, kind != KVQ_FIXED_LEARNED || cache->storage[l].learned[s]);
        kvq_put_u32(w, 0);
        kvq_put_u64(w, floats);
        uint8_t digest[32] = {0};
        if (w->data) kvq_sha256_digest(m, (size_t)floats * 4, digest);
        kvq_put_bytes(w, digest, 32);
        kvq_put_f32s(w, m, floats);
      }
}

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
  const int policy = c->policy.kind != KVQ_POLICY_KEEP_ALL;
  kvq_put_u32(w, policy ? FLAG_POLICY : 0); /* flags */
  kvq_put_u32(w, policy ? 6 : 5);           /* sections */
  kvq_put_zeros(w, 32);

  uint64_t at = section_begin(w, TAG_CONF);
  kvq_put_config(w, c);
  section_end(w, at);

  at = section_begin(w, TAG_MATX);
  put_fixed(w, cache, 0);
  section_end(w, at);

  at = section_begin(w, TAG_SEQS);
  kvq_put_u32(w, c->max_sequences);
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    kvq_put_u32(w, seq->generation); /* kept for free slots too, so freed ids stay invalid */
    kvq_put_u32(w, seq->live);
    if (!seq->live) continue;
    kvq_put_u32(w, seq->page_count);
    for (uint32_t l = 0; l < c->layer_count; l++) {
      kvq_put_u32(w, seq->layers[l].tokens);
      kvq_put_u32(w, seq->layers[l].ring_start);
      kvq_put_u32(w, seq->layers[l].quantized);
    }
    for (uint32_t j = 0; j < seq->page_count; j++) kvq_put_u32(w, seq->pages[j]);
  }
  section_end(w, at);

  if (policy) {
    at = section_begin(w, TAG_PLCY);
    kvq_put_policy_section(w, cache);
    section_end(w, at);
  }

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

/* Writes data to path + ".tmp-kvq", syncs it and renames it over path: readers never see a partial
 * file. `who` names the caller in messages. */
static kvq_status write_atomically(kvq_context *ctx, const char *path, const uint8_t *data, uint64_t size, const char *who) {
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 16);
  if (!tmp) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "%s: out of host memory", who);
  snprintf(tmp, plen + 16, "%s.tmp-kvq", path);
  kvq_status st = KVQ_OK;
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    st = kvq_fail(ctx, KVQ_ERROR_IO, "%s: cannot create %s: %s", who, tmp, strerror(errno));
  } else {
    int ok = fwrite(data, 1, (size_t)size, f) == (size_t)size;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok; /* the data is on disk before the rename makes it the file */
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
      st = kvq_fail(ctx, KVQ_ERROR_IO, "%s: cannot write %s: %s", who, path, strerror(errno));
      remove(tmp);
    }
  }
  free(tmp);
  return st;
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
  if (st == KVQ_OK) st = write_atomically(ctx, path, data, size, "kvq_cache_save");
  free(data);
  return st;
}

/* ---- Reading ------------------------------------------------------------------------------------ */

static kvq_status bad(kvq_context *ctx, const char *what) {
  return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: %s", what);
}

/* The next section, which must carry `tag`: its payload as a reader, the outer reader moved past
 * its zero padding. Sections appear in one fixed order, each exactly once. */
static int next_section(kvq_reader *file, uint32_t tag, kvq_reader *out) {
  uint32_t t = kvq_get_u32(file), reserved = kvq_get_u32(file);
  uint64_t n = kvq_get_u64(file);
  if (file->short_read || t != tag || reserved != 0 || n > file->size - file->pos) return 0;
  *out = (kvq_reader){file->data + file->pos, n, 0, 0};
  const uint8_t *pad = (kvq_get_bytes(file, n), kvq_get_bytes(file, (8 - n % 8) % 8));
  for (uint64_t i = 0; pad && i < (8 - n % 8) % 8; i++)
    if (pad[i]) return 0;
  return !file->short_read;
}

/* A section must be consumed to its last byte. */
static int finished(const kvq_reader *r) { return !r->short_read && r->pos == r->size; }

/* Reads a fixed-array section (put_fixed) into dest[(layer * 2 + side) * KVQ_SIDE_FIXED + index],
 * arrays sized as the cache's; ready[layer * 2 + side] receives learned codebooks' readiness. Every
 * array the cache needs (or, with learned_only, every learned one) must appear exactly once, with
 * the cache's kind and size, finite values and a matching SHA-256. */
static kvq_status get_fixed(kvq_context *ctx, const kvq_cache *cache, kvq_reader *r, int learned_only, float **dest,
                            int *ready) {
  const uint32_t L = cache->config.layer_count;
  uint32_t expected = 0;
  for (uint32_t l = 0; l < L; l++)
    for (int s = 0; s < 2; s++)
      for (int i = 0; i < KVQ_SIDE_FIXED; i++) {
        const kvq_side_layout *layout = &cache->storage[l].side[s].layout;
        expected += kvq_side_fixed_floats(layout, i) > 0 && (!learned_only || kvq_side_fixed_kind(layout, i) == KVQ_FIXED_LEARNED);
      }
  if (kvq_get_u32(r) != expected) return bad(ctx, "wrong number of matrices and codebooks for the config");
  uint8_t *seen = calloc((size_t)L * 2 * KVQ_SIDE_FIXED, 1);
  if (!seen) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory");
  kvq_status st = KVQ_OK;
  for (uint32_t k = 0; k < expected && st == KVQ_OK; k++) {
    const uint32_t l = kvq_get_u32(r), s = kvq_get_u32(r), i = kvq_get_u32(r), kind = kvq_get_u32(r);
    const uint32_t is_ready = kvq_get_u32(r), reserved = kvq_get_u32(r);
    const uint64_t floats = kvq_get_u64(r);
    const uint8_t *sha = kvq_get_bytes(r, 32);
    const kvq_side_layout *layout = l < L && s < 2 ? &cache->storage[l].side[s].layout : NULL;
    const size_t slot = ((size_t)l * 2 + s) * KVQ_SIDE_FIXED + i;
    if (r->short_read || !layout || i >= KVQ_SIDE_FIXED || seen[slot] || reserved != 0 || is_ready > 1 ||
        kind != (uint32_t)kvq_side_fixed_kind(layout, (int)i) || floats != kvq_side_fixed_floats(layout, (int)i) ||
        floats == 0 || (!is_ready && kind != KVQ_FIXED_LEARNED) || (learned_only && kind != KVQ_FIXED_LEARNED)) {
      st = bad(ctx, "a matrix or codebook does not match the config, or appears twice");
      break;
    }
    seen[slot] = 1;
    /* What the seed and the config derive (random matrices, offline tables) is already in dest, built as
     * kvq_cache_create builds it: the file's copy is read aside and must equal it bit for bit. */
    const int derived = kind == KVQ_FIXED_RANDOM || kind == KVQ_FIXED_COMPUTED;
    float *m = derived ? malloc((size_t)floats * sizeof(float)) : dest[slot];
    if (!m) {
      st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory");
      break;
    }
    uint8_t md[32];
    if (!kvq_get_f32s(r, m, floats)) {
      if (derived) free(m);
      st = bad(ctx, "matrix section too short");
      break;
    }
    kvq_sha256_digest(m, (size_t)floats * 4, md);
    if (memcmp(md, sha, 32) != 0) st = bad(ctx, "a matrix or codebook does not match its SHA-256");
    for (uint64_t e = 0; e < floats && st == KVQ_OK; e++)
      if (!isfinite(m[e])) st = bad(ctx, "a matrix or codebook holds a non-finite number");
    if (derived) {
      if (st == KVQ_OK && memcmp(m, dest[slot], (size_t)floats * sizeof(float)) != 0)
        st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: layer %u %s: %s differ from the ones seed %llu and the config give",
                      l, s ? "values" : "keys", kvq_fixed_name(layout, (int)i), (unsigned long long)cache->config.seed);
      free(m);
      continue;
    }
    char why[256];
    const int check = st == KVQ_OK ? kvq_fixed_check(layout, (int)i, m, (int)is_ready, why, sizeof why) : 0;
    if (check != 0)
      st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: layer %u %s: %s", l,
                    s ? "values" : "keys", why);
    if (kind == KVQ_FIXED_LEARNED) ready[l * 2 + s] = (int)is_ready;
  }
  free(seen);
  if (st == KVQ_OK && !finished(r)) st = bad(ctx, "matrix section has the wrong length");
  return st;
}

/* Reads the sequence records into the cache: the invariants every later call relies on. */
static kvq_status load_sequences(kvq_cache *cache, kvq_reader *r, uint8_t *page_owner, int has_policy) {
  kvq_context *ctx = cache->ctx;
  const kvq_cache_config *c = &cache->config;
  const uint32_t P = c->page_size;
  if (kvq_get_u32(r) != c->max_sequences) return bad(ctx, "sequence section does not match max_sequences");
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    kvq_sequence *seq = &cache->seqs[slot];
    const uint32_t generation = kvq_get_u32(r), live = kvq_get_u32(r);
    if (r->short_read || generation > 0xffff || live > 1 || (live && generation == 0))
      return bad(ctx, "a sequence record is out of range");
    seq->generation = (uint16_t)generation;
    if (!live) continue;
    const uint32_t pages = kvq_get_u32(r);
    if (r->short_read || pages > c->max_pages) return bad(ctx, "a page table is longer than the pool");
    for (uint32_t l = 0; l < c->layer_count; l++) {
      kvq_seq_layer *sl = &seq->layers[l];
      sl->tokens = kvq_get_u32(r);
      sl->ring_start = kvq_get_u32(r);
      sl->quantized = kvq_get_u32(r);
      if (sl->ring_start > sl->quantized || sl->quantized > sl->tokens || sl->ring_start % P ||
          sl->tokens - sl->ring_start >= cache->ring_capacity || sl->tokens > KVQ_MAX_POSITIONS ||
          (!has_policy && (sl->quantized + P - 1) / P > pages)) /* with a policy: checked with its section */
        return bad(ctx, "a sequence's token counts break the cache invariants");
    }
    if ((uint64_t)pages * 4 > r->size - r->pos) return bad(ctx, "sequence section too short for its page tables");
    kvq_status st = kvq_reserve_page_table(cache, seq, pages);
    if (st != KVQ_OK) return st;
    for (uint32_t j = 0; j < pages; j++) {
      ctx->load_work.steps++;
      const uint32_t p = kvq_get_u32(r);
      if (r->short_read || p >= c->max_pages || page_owner[p]) return bad(ctx, "a page table names a page out of range or twice");
      page_owner[p] = 1;
      seq->pages[j] = p;
    }
    seq->page_count = pages;
    seq->live = 1;
    kvq_default_page_numbers(cache, seq); /* a PLCY section, if any, replaces them */
    cache->live_sequences++;
  }
  if (!finished(r)) return bad(ctx, "sequence section has the wrong length");
  /* the free stack: unused pages, lowest slot on top */
  cache->free_count = 0;
  for (uint32_t p = c->max_pages; p-- > 0;)
    if (!page_owner[p]) cache->free_pages[cache->free_count++] = p;
  return KVQ_OK;
}

/* Reads the page images: exactly the owned pages, ascending, each checked before it is stored. */
static kvq_status load_pages(kvq_cache *cache, kvq_reader *r, const uint8_t *page_owner) {
  kvq_context *ctx = cache->ctx;
  kvq_backend *be = ctx->backend;
  const kvq_cache_config *c = &cache->config;
  /* valid tokens of each (slot, layer): from the page tables */
  uint32_t *valid = calloc((size_t)c->max_pages * c->layer_count, sizeof *valid);
  if (!valid) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory");
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    for (uint32_t j = 0; seq->live && j < seq->page_count; j++)
      for (uint32_t l = 0; l < c->layer_count; l++) {
        const uint32_t q = seq->layers[l].quantized, first = seq->page_index[j] * c->page_size;
        valid[(size_t)seq->pages[j] * c->layer_count + l] = q <= first ? 0 : q - first < c->page_size ? q - first : c->page_size;
      }
  }
  kvq_status st = KVQ_OK;
  const uint32_t used = kvq_get_u32(r);
  if (used != c->max_pages - cache->free_count) st = bad(ctx, "page section does not match the page tables");
  uint32_t previous = 0;
  const uint8_t *slots = st == KVQ_OK ? kvq_get_bytes(r, (uint64_t)used * 4) : NULL;
  for (uint32_t k = 0; slots && k < used && st == KVQ_OK; k++) {
    const uint32_t p = (uint32_t)slots[4 * k] | (uint32_t)slots[4 * k + 1] << 8 | (uint32_t)slots[4 * k + 2] << 16 |
                       (uint32_t)slots[4 * k + 3] << 24;
    if (p >= c->max_pages || !page_owner[p] || (k > 0 && p <= previous)) st = bad(ctx, "page section lists pages that no sequence owns");
    previous = p;
  }
  if (st == KVQ_OK && !slots) st = bad(ctx, "page section too short");
  char why[256];
  for (uint32_t k = 0; k < used && st == KVQ_OK; k++) {
    const uint32_t p = (uint32_t)slots[4 * k] | (uint32_t)slots[4 * k + 1] << 8 | (uint32_t)slots[4 * k + 2] << 16 |
                       (uint32_t)slots[4 * k + 3] << 24;
    for (uint32_t l = 0; l < c->layer_count && st == KVQ_OK; l++)
      for (int s = 0; s < 2 && st == KVQ_OK; s++) {
        const kvq_side_layout *layout = &cache->storage[l].side[s].layout;
        const uint8_t *img = kvq_get_bytes(r, layout->page_bytes);
        if (!img) st = bad(ctx, "page section too short");
        else if (kvq_page_image_check(layout, img, valid[(size_t)p * c->layer_count + l], why, sizeof why) != 0)
          st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: page %u, layer %u, %s: %s", p, l, s ? "values" : "keys", why);
        else if ((st = be->ops->buffer_write(be, cache->storage[l].pages[s], (uint64_t)p * layout->page_bytes, img,
                                             layout->page_bytes)) != KVQ_OK)
          st = kvq_fail_backend(ctx, st, "loading pages");
      }
  }
  free(valid);
  if (st == KVQ_OK && !finished(r)) st = bad(ctx, "page section has the wrong length");
  return st;
}

kvq_status kvq_cache_load_from_memory(kvq_context *ctx, const void *buffer, size_t size, kvq_cache **out) {
  if (out) *out = NULL;
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!buffer || !out) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_load: buffer or out is NULL");
  ctx->load_work = (kvq_load_work){0, 0};
  const uint8_t *data = buffer;
  if (size < 8 || memcmp(data, KVQ_FILE_MAGIC, 8) != 0)
    return size < 8 && memcmp(data, KVQ_FILE_MAGIC, size) == 0
               ? kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "kvq_cache_load: %zu bytes, the header alone has 64", size)
               : bad(ctx, "not a kvq cache file (magic bytes differ)");
  if (size < KVQ_FILE_HEADER_BYTES)
    return kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "kvq_cache_load: %zu bytes, the header alone has 64", size);
  kvq_reader h = {data, size, 8, 0};
  const uint32_t version = kvq_get_u32(&h), header_bytes = kvq_get_u32(&h);
  const uint64_t file_bytes = kvq_get_u64(&h);
  const uint32_t flags = kvq_get_u32(&h), sections = kvq_get_u32(&h);
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
  for (uint32_t i = 32; i < 64; i++)
    if (data[i]) return bad(ctx, "reserved header bytes are not zero");
  if (flags & ~FLAG_POLICY) return bad(ctx, "unknown flags in the header (a newer kvq wrote this file?)");
  if (sections != (flags & FLAG_POLICY ? 6u : 5u)) return bad(ctx, "wrong number of sections");
  kvq_reader file = {data, file_bytes - 32, KVQ_FILE_HEADER_BYTES, 0};

  /* CONF */
  kvq_reader r;
  if (!next_section(&file, TAG_CONF, &r)) return bad(ctx, "expected the config section");
  kvq_cache_config config;
  kvq_layer_config *layers = NULL;
  if (kvq_get_config(&r, &config, &layers) != 0 || !finished(&r)) {
    free(layers);
    return bad(ctx, "malformed config section");
  }
  char why[512];
  kvq_status st = kvq_config_validate(&config, why, sizeof why);
  uint64_t bytes = 0;
  if (st == KVQ_OK && (kvq_cache_config_bytes(&config, &bytes) != KVQ_OK || bytes > KVQ_MAX_CACHE_BYTES)) {
    snprintf(why, sizeof why, "the cache would need more than 2^46 bytes");
    st = KVQ_ERROR_OUT_OF_RANGE;
  }
  if (st != KVQ_OK) {
    free(layers);
    return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: invalid config: %s", why);
  }
  kvq_cache *cache = NULL;
  st = kvq_cache_build(ctx, &config, &cache); /* with its matrices: the file's must equal them */
  free(layers);
  if (st != KVQ_OK) return st;
  const uint32_t L = config.layer_count;
  uint8_t *page_owner = NULL;

  /* MATX: every matrix and codebook the layers need, once each, each with a matching SHA-256 */
  if (!next_section(&file, TAG_MATX, &r)) {
    st = bad(ctx, "expected the matrix section");
    goto fail;
  }
  {
    float **dest = malloc(sizeof(float *) * L * 2 * KVQ_SIDE_FIXED);
    int *ready = malloc(sizeof(int) * L * 2);
    if (!dest || !ready) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory");
    for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
      for (int s = 0; s < 2; s++) {
        ready[l * 2 + s] = cache->storage[l].learned[s];
        for (int i = 0; i < KVQ_SIDE_FIXED; i++) dest[(l * 2 + s) * KVQ_SIDE_FIXED + i] = cache->storage[l].fixed_host[s][i];
      }
    if (st == KVQ_OK) st = get_fixed(ctx, cache, &r, 0, dest, ready);
    for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
      for (int s = 0; s < 2; s++) cache->storage[l].learned[s] = ready[l * 2 + s];
    free(dest);
    free(ready);
    if (st != KVQ_OK) goto fail;
  }
  if ((st = kvq_upload_fixed(cache)) != KVQ_OK) goto fail;

  /* SEQS, PAGE */
  page_owner = calloc(config.max_pages, 1);
  if (!page_owner) {
    st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory");
    goto fail;
  }
  if (!next_section(&file, TAG_SEQS, &r)) {
    st = bad(ctx, "expected the sequence section");
    goto fail;
  }
  if ((st = load_sequences(cache, &r, page_owner, (flags & FLAG_POLICY) != 0)) != KVQ_OK) goto fail;
  for (uint32_t l = 0; l < L; l++) /* tokens are only ever coded with learned codebooks */
    for (uint32_t slot = 0; slot < config.max_sequences; slot++)
      if (cache->seqs[slot].live && cache->seqs[slot].layers[l].tokens > 0 &&
          (!cache->storage[l].learned[0] || !cache->storage[l].learned[1])) {
        st = bad(ctx, "a layer holds tokens but its codebooks are not learned");
        goto fail;
      }
  if (flags & FLAG_POLICY) {
    if (!next_section(&file, TAG_PLCY, &r)) {
      st = bad(ctx, "expected the policy section");
      goto fail;
    }
    if ((st = kvq_get_policy_section(cache, &r)) != KVQ_OK) goto fail;
    if (!finished(&r)) {
      st = bad(ctx, "policy section has the wrong length");
      goto fail;
    }
  }
  if (!next_section(&file, TAG_PAGE, &r)) {
    st = bad(ctx, "expected the page section");
    goto fail;
  }
  if ((st = load_pages(cache, &r, page_owner)) != KVQ_OK) goto fail;

  /* WIND */
  kvq_backend *be = ctx->backend;
  if (!next_section(&file, TAG_WIND, &r)) {
    st = bad(ctx, "expected the window section");
    goto fail;
  }
  for (uint32_t slot = 0; slot < config.max_sequences && st == KVQ_OK; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    if (!seq->live) continue;
    for (uint32_t l = 0; l < L && st == KVQ_OK; l++) {
      const kvq_layer_config *lc = &cache->layers[l];
      const uint64_t tb = kvq_token_bytes(config.input_dtype, lc->kv_heads, lc->head_dim);
      const uint64_t ring_offset = kvq_ring_offset(cache, l, slot);
      for (int s = 0; s < 2 && st == KVQ_OK; s++)
        for (uint32_t t = seq->layers[l].ring_start; t < seq->layers[l].tokens && st == KVQ_OK; t++) {
          const uint8_t *tok = kvq_get_bytes(&r, tb);
          if (!tok) st = bad(ctx, "window section too short");
          else if (kvq_check_tokens(ctx, &cache->storage[l].side[s].layout, config.input_dtype, tok, 1, "kvq_cache_load window", t) != KVQ_OK)
            st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: window token %u of layer %u cannot be stored", t, l);
          else if ((st = be->ops->buffer_write(be, cache->storage[l].ring[s], ring_offset + (t % cache->ring_capacity) * tb,
                                               tok, tb)) != KVQ_OK)
            st = kvq_fail_backend(ctx, st, "loading the window");
        }
    }
  }
  if (st == KVQ_OK && !finished(&r)) st = bad(ctx, "window section has the wrong length");
  if (st == KVQ_OK && file.pos != file.size) st = bad(ctx, "bytes after the last section");
  if (st != KVQ_OK) goto fail;
  if ((st = be->ops->finish(be)) != KVQ_OK) {
    st = kvq_fail_backend(ctx, st, "loading");
    goto fail;
  }
  free(page_owner);
  kvq_clear_error(ctx);
  *out = cache;
  return KVQ_OK;
fail:
  free(page_owner);
  kvq_cache_destroy(cache);
  return st;
}

/* Reads a whole file into a malloc'ed buffer. */
static kvq_status read_whole_file(kvq_context *ctx, const char *path, uint8_t **out, size_t *out_size, const char *who) {
  FILE *f = fopen(path, "rb");
  if (!f) return kvq_fail(ctx, KVQ_ERROR_IO, "%s: cannot open %s: %s", who, path, strerror(errno));
  uint8_t *data = NULL;
  size_t size = 0, capacity = 0;
  kvq_status st = KVQ_OK;
  for (;;) {
    if (size == capacity) {
      size_t grown = capacity ? capacity * 2 : 1 << 16;
      uint8_t *p = grown > capacity ? realloc(data, grown) : NULL;
      if (!p) {
        st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "%s: out of host memory reading %s", who, path);
        break;
      }
      data = p;
      capacity = grown;
    }
    size_t got = fread(data + size, 1, capacity - size, f);
    size += got;
    if (got == 0) {
      if (ferror(f)) st = kvq_fail(ctx, KVQ_ERROR_IO, "%s: cannot read %s", who, path);
      break;
    }
  }
  fclose(f);
  if (st != KVQ_OK) {
    free(data);
    data = NULL;
  }
  *out = data;
  *out_size = size;
  return st;
}

kvq_status kvq_cache_load(kvq_context *ctx, const char *path, kvq_cache **out) {
  if (out) *out = NULL;
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!path || !out) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_load: path or out is NULL");
  if (!*path) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_load: path is empty");
  uint8_t *data = NULL;
  size_t size = 0;
  kvq_status st = read_whole_file(ctx, path, &data, &size, "kvq_cache_load");
  if (st == KVQ_OK) st = kvq_cache_load_from_memory(ctx, data, size, out);
  free(data);
  return st;
}

/* ---- Codebook files ------------------------------------------------------------------------------ */

#define KVQ_CODEBOOK_MAGIC "KVQCODEB"

/* Header as for caches (magic KVQCODEB, version 1, two sections), CONF (the cache's config record,
 * to check compatibility), CODE (the learned codebooks, put_fixed with learned_only), SHA-256. */
static void write_codebooks(kvq_cache *cache, kvq_writer *w) {
  kvq_put_bytes(w, KVQ_CODEBOOK_MAGIC, 8);
  kvq_put_u32(w, KVQ_FILE_VERSION);
  kvq_put_u32(w, KVQ_FILE_HEADER_BYTES);
  const uint64_t file_bytes_at = w->pos;
  kvq_put_u64(w, 0);
  kvq_put_u32(w, 0);
  kvq_put_u32(w, 2);
  kvq_put_zeros(w, 32);
  uint64_t at = section_begin(w, TAG_CONF);
  kvq_put_config(w, &cache->config);
  section_end(w, at);
  at = section_begin(w, TAG_CODE);
  put_fixed(w, cache, 1);
  section_end(w, at);
  if (w->data) {
    kvq_writer patch = {w->data, file_bytes_at};
    kvq_put_u64(&patch, w->pos + 32);
    uint8_t digest[32];
    kvq_sha256_digest(w->data, (size_t)w->pos, digest);
    kvq_put_bytes(w, digest, 32);
  } else {
    kvq_put_zeros(w, 32);
  }
}

kvq_status kvq_codebooks_save_size(kvq_cache *cache, uint64_t *bytes) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!bytes) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_save_size: bytes is NULL");
  kvq_writer w = {NULL, 0};
  write_codebooks(cache, &w);
  *bytes = w.pos;
  return KVQ_OK;
}

kvq_status kvq_codebooks_save_to_memory(kvq_cache *cache, void *buffer, size_t capacity, size_t *written) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!buffer || !written)
    return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_save_to_memory: buffer or written is NULL");
  uint64_t size;
  kvq_codebooks_save_size(cache, &size);
  if (size > capacity)
    return kvq_fail(cache->ctx, KVQ_ERROR_BUFFER_TOO_SMALL, "kvq_codebooks_save_to_memory: needs %llu bytes, got %zu",
                    (unsigned long long)size, capacity);
  kvq_writer w = {buffer, 0};
  write_codebooks(cache, &w);
  *written = (size_t)w.pos;
  return KVQ_OK;
}

kvq_status kvq_codebooks_save(kvq_cache *cache, const char *path) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!path || !*path) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_save: path is empty");
  uint64_t size;
  kvq_codebooks_save_size(cache, &size);
  uint8_t *data = size <= SIZE_MAX ? malloc((size_t)size) : NULL;
  if (!data) return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_save: out of host memory");
  kvq_writer w = {data, 0};
  write_codebooks(cache, &w);
  kvq_status st = write_atomically(cache->ctx, path, data, size, "kvq_codebooks_save");
  free(data);
  return st;
}

/* Whether a file's layer config learns the same codebooks as the cache's: same method, shape and,
 * for PolarQuant, the same rotation (its angles were measured after it), hence the same seed. */
static int same_codebooks(const kvq_cache_config *file, const kvq_cache *cache, uint32_t l, int s) {
  const kvq_layer_config *a = &file->layers[l];
  kvq_side_layout x, y;
  kvq_side_layout_init(&x, s ? &a->values : &a->keys, cache->config.page_size, a->head_dim, a->kv_heads);
  y = cache->storage[l].side[s].layout;
  if (kvq_side_needs_learning(&x) != kvq_side_needs_learning(&y)) return 0;
  if (!kvq_side_needs_learning(&y)) return 1;
  if (x.method != y.method || x.head_dim != y.head_dim || x.kv_heads != y.kv_heads ||
      kvq_side_fixed_floats(&x, 1) != kvq_side_fixed_floats(&y, 1) || x.level_bits != y.level_bits ||
      x.levels != y.levels || x.channels != y.channels || x.code_bits != y.code_bits)
    return 0;
  return y.method != KVQ_LAYOUT_POLAR || (x.rotation == y.rotation && file->seed == cache->config.seed);
}

/* Whether a layer may take a side's codebooks from a file (`fresh`: their floats, NULL when the side
 * learns none; `ready`: the file's learned flag). A layer holding tokens keeps its codebooks: its
 * tokens were coded with them, so only the very same floats, learned, may be loaded. The flag counts
 * as much as the floats: codebooks learned from all-zero data are all zeros, like codebooks not
 * learned, and un-learning a busy layer would refuse every later append and make its save a file
 * kvq_cache_load refuses. */
static kvq_status busy_layer_keeps_codebooks(kvq_cache *cache, uint32_t l, int s, const float *fresh, int ready) {
  int busy = 0;
  for (uint32_t i = 0; i < cache->config.max_sequences; i++) busy |= cache->seqs[i].live && cache->seqs[i].layers[l].tokens > 0;
  if (!busy || !fresh) return KVQ_OK;
  const char *side = s ? "value" : "key";
  if (!ready)
    return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT,
                    "kvq_codebooks_load: layer %u holds tokens, and the file's %s codebooks are not learned; free those "
                    "sequences first", l, side);
  const kvq_layer_storage *ls = &cache->storage[l];
  if (!ls->learned[s] || memcmp(fresh, ls->fixed_host[s][1], kvq_side_fixed_floats(&ls->side[s].layout, 1) * 4))
    return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT,
                    "kvq_codebooks_load: layer %u holds tokens coded with other %s codebooks; free those sequences first",
                    l, side);
  return KVQ_OK;
}

kvq_status kvq_codebooks_load_from_memory(kvq_cache *cache, const void *buffer, size_t size) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_context *ctx = cache->ctx;
  if (!buffer) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_load: buffer is NULL");
  ctx->load_work = (kvq_load_work){0, 0};
  const uint8_t *data = buffer;
  if (size < 8 || memcmp(data, KVQ_CODEBOOK_MAGIC, 8) != 0)
    return size < 8 && memcmp(data, KVQ_CODEBOOK_MAGIC, size) == 0
               ? kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "kvq_codebooks_load: %zu bytes, the header alone has 64", size)
               : kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: not a kvq codebook file");
  if (size < KVQ_FILE_HEADER_BYTES)
    return kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "kvq_codebooks_load: %zu bytes, the header alone has 64", size);
  kvq_reader h = {data, size, 8, 0};
  const uint32_t version = kvq_get_u32(&h), header_bytes = kvq_get_u32(&h);
  const uint64_t file_bytes = kvq_get_u64(&h);
  const uint32_t flags = kvq_get_u32(&h), sections = kvq_get_u32(&h);
  if (version != KVQ_FILE_VERSION)
    return kvq_fail(ctx, KVQ_ERROR_VERSION, "kvq_codebooks_load: format version %u, this kvq reads %u", version, KVQ_FILE_VERSION);
  if (header_bytes != KVQ_FILE_HEADER_BYTES || file_bytes < KVQ_FILE_HEADER_BYTES + 32)
    return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: inconsistent header");
  if (size < file_bytes)
    return kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "kvq_codebooks_load: %zu bytes of a %llu-byte file", size,
                    (unsigned long long)file_bytes);
  if (size > file_bytes) return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: trailing bytes");
  uint8_t digest[32];
  kvq_sha256_digest(data, (size_t)file_bytes - 32, digest);
  if (memcmp(digest, data + file_bytes - 32, 32) != 0)
    return kvq_fail(ctx, KVQ_ERROR_CHECKSUM, "kvq_codebooks_load: SHA-256 mismatch: the file is corrupted");
  for (uint32_t i = 32; i < 64; i++)
    if (data[i]) return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: reserved header bytes are not zero");
  if (flags != 0 || sections != 2) return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: unknown flags or sections");
  kvq_reader file = {data, file_bytes - 32, KVQ_FILE_HEADER_BYTES, 0}, r;
  kvq_cache_config config;
  kvq_layer_config *layers = NULL;
  if (!next_section(&file, TAG_CONF, &r) || kvq_get_config(&r, &config, &layers) != 0 || !finished(&r)) {
    free(layers);
    return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: malformed config section");
  }
  /* same_codebooks() derives page layouts from the file's methods, which divide by and shift with
   * their parameters (cq.channels 0, polar.levels beyond bits[]): only a config kvq could have
   * written may get that far, as when loading caches */
  char why[512];
  if (kvq_config_validate(&config, why, sizeof why) != KVQ_OK) {
    free(layers);
    return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: invalid config: %s", why);
  }
  kvq_status st = KVQ_OK;
  const uint32_t L = cache->config.layer_count;
  if (config.layer_count != L) st = kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_load: the file is for %u layers, the cache has %u",
                                             config.layer_count, L);
  for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
    for (int s = 0; s < 2 && st == KVQ_OK; s++)
      if (!same_codebooks(&config, cache, l, s))
        st = kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT,
                      "kvq_codebooks_load: layer %u's %s codebooks have another shape or rotation than this cache's", l,
                      s ? "value" : "key");
  free(layers);
  if (st != KVQ_OK) return st;
  /* read into fresh arrays; change the cache only when all of them are good */
  float **dest = calloc((size_t)L * 2 * KVQ_SIDE_FIXED, sizeof(float *));
  int *ready = calloc((size_t)L * 2, sizeof(int));
  if (!dest || !ready) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_load: out of host memory");
  for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
    for (int s = 0; s < 2 && st == KVQ_OK; s++) {
      const kvq_side_layout *layout = &cache->storage[l].side[s].layout;
      if (kvq_side_fixed_kind(layout, 1) != KVQ_FIXED_LEARNED) continue;
      dest[(l * 2 + s) * KVQ_SIDE_FIXED + 1] = malloc(sizeof(float) * kvq_side_fixed_floats(layout, 1));
      if (!dest[(l * 2 + s) * KVQ_SIDE_FIXED + 1]) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_load: out of host memory");
    }
  if (st == KVQ_OK && !next_section(&file, TAG_CODE, &r)) st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: expected the codebook section");
  if (st == KVQ_OK) st = get_fixed(ctx, cache, &r, 1, dest, ready);
  if (st == KVQ_OK && file.pos != file.size) st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_codebooks_load: bytes after the last section");
  for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
    for (int s = 0; s < 2 && st == KVQ_OK; s++)
      st = busy_layer_keeps_codebooks(cache, l, s, dest[(l * 2 + s) * KVQ_SIDE_FIXED + 1], ready[l * 2 + s]);
  kvq_backend *be = ctx->backend;
  for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
    for (int s = 0; s < 2 && st == KVQ_OK; s++) {
      const float *fresh = dest[(l * 2 + s) * KVQ_SIDE_FIXED + 1];
      if (!fresh) continue;
      const uint64_t floats = kvq_side_fixed_floats(&cache->storage[l].side[s].layout, 1);
      st = be->ops->buffer_write(be, cache->storage[l].side[s].fixed[1], 0, fresh, floats * 4);
      if (st != KVQ_OK) {
        st = kvq_fail_backend(ctx, st, "uploading codebooks");
        break;
      }
      memcpy(cache->storage[l].fixed_host[s][1], fresh, floats * 4);
      cache->storage[l].learned[s] = ready[l * 2 + s];
    }
  for (size_t i = 0; dest && i < (size_t)L * 2 * KVQ_SIDE_FIXED; i++) free(dest[i]);
  free(dest);
  free(ready);
  if (st == KVQ_OK) kvq_clear_error(ctx);
  return st;
}

kvq_status kvq_codebooks_load(kvq_cache *cache, const char *path) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!path || !*path) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_load: path is empty");
  uint8_t *data = NULL;
  size_t size = 0;
  kvq_status st = read_whole_file(cache->ctx, path, &data, &size, "kvq_codebooks_load");
  if (st == KVQ_OK) st = kvq_codebooks_load_from_memory(cache, data, size);
  free(data);
  return st;
}
