/*
 * What cache files and codebook files share (docs/FORMAT.md): the header and the SHA-256 trailer,
 * sections, the config record, fixed-array sections, and the save and read sequences on memory and
 * on disk. core/savefile_cache.c and core/savefile_codebooks.c say what goes in each file.
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
#include "sha256.h"

static kvq_status bad(kvq_context *ctx, const char *who, const char *what) {
  return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "%s: %s", who, what);
}

/* ---- Records --------------------------------------------------------------------------------------- */

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

/* ---- The file: header, sections, trailer ------------------------------------------------------------ */

uint64_t kvq_file_begin(kvq_writer *w, const char *magic, uint32_t flags, uint32_t sections) {
  kvq_put_bytes(w, magic, 8);
  kvq_put_u32(w, KVQ_FILE_VERSION);
  kvq_put_u32(w, KVQ_FILE_HEADER_BYTES);
  const uint64_t file_bytes_at = w->pos;
  kvq_put_u64(w, 0); /* patched by kvq_file_end */
  kvq_put_u32(w, flags);
  kvq_put_u32(w, sections);
  kvq_put_zeros(w, 32);
  return file_bytes_at;
}

void kvq_file_end(kvq_writer *w, uint64_t file_bytes_at) {
  if (!w->data) {
    kvq_put_zeros(w, 32);
    return;
  }
  kvq_writer patch = {w->data, file_bytes_at};
  kvq_put_u64(&patch, w->pos + 32);
  uint8_t digest[32];
  kvq_sha256_digest(w->data, (size_t)w->pos, digest);
  kvq_put_bytes(w, digest, 32);
}

kvq_status kvq_file_open(kvq_context *ctx, const void *buffer, size_t size, const char *magic, const char *kind,
                         const char *who, uint32_t *flags, uint32_t *sections, kvq_reader *body) {
  const uint8_t *data = buffer;
  if (size < 8 || memcmp(data, magic, 8) != 0) {
    if (size < 8 && memcmp(data, magic, size) == 0)
      return kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "%s: %zu bytes, the header alone has 64", who, size);
    return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "%s: not a kvq %s file (magic bytes differ)", who, kind);
  }
  if (size < KVQ_FILE_HEADER_BYTES)
    return kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "%s: %zu bytes, the header alone has 64", who, size);
  kvq_reader h = {data, size, 8, 0};
  const uint32_t version = kvq_get_u32(&h), header_bytes = kvq_get_u32(&h);
  const uint64_t file_bytes = kvq_get_u64(&h);
  *flags = kvq_get_u32(&h);
  *sections = kvq_get_u32(&h);
  if (version != KVQ_FILE_VERSION)
    return kvq_fail(ctx, KVQ_ERROR_VERSION, "%s: format version %u, this kvq reads version %u", who, version,
                    KVQ_FILE_VERSION);
  if (header_bytes != KVQ_FILE_HEADER_BYTES || file_bytes < KVQ_FILE_HEADER_BYTES + 32)
    return bad(ctx, who, "inconsistent header");
  if (size < file_bytes)
    return kvq_fail(ctx, KVQ_ERROR_TRUNCATED, "%s: %zu bytes of a %llu-byte file", who, size, (unsigned long long)file_bytes);
  if (size > file_bytes) return bad(ctx, who, "trailing bytes after the checksum");
  uint8_t digest[32];
  kvq_sha256_digest(data, (size_t)file_bytes - 32, digest);
  if (memcmp(digest, data + file_bytes - 32, 32) != 0)
    return kvq_fail(ctx, KVQ_ERROR_CHECKSUM, "%s: SHA-256 mismatch: the file is corrupted", who);
  for (uint32_t i = 32; i < 64; i++)
    if (data[i]) return bad(ctx, who, "reserved header bytes are not zero");
  *body = (kvq_reader){data, file_bytes - 32, KVQ_FILE_HEADER_BYTES, 0};
  return KVQ_OK;
}

uint64_t kvq_section_begin(kvq_writer *w, uint32_t tag) {
  kvq_put_u32(w, tag);
  kvq_put_u32(w, 0);
  uint64_t at = w->pos;
  kvq_put_u64(w, 0); /* patched by kvq_section_end */
  return at;
}

void kvq_section_end(kvq_writer *w, uint64_t at) {
  uint64_t payload = w->pos - (at + 8);
  kvq_put_zeros(w, (8 - payload % 8) % 8);
  if (w->data) {
    kvq_writer patch = {w->data, at};
    kvq_put_u64(&patch, payload);
  }
}

/* The next section, which must carry `tag`: its payload as a reader, the outer reader moved past
 * its zero padding. Sections appear in one fixed order, each exactly once. */
int kvq_next_section(kvq_reader *file, uint32_t tag, kvq_reader *out) {
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
int kvq_section_finished(const kvq_reader *r) { return !r->short_read && r->pos == r->size; }

/* ---- Fixed arrays: matrices and codebooks ------------------------------------------------------- */

/* The fixed arrays of a cache (all of them, or only learned codebooks): u32 count, then per array
 * u32 layer, side, index, kind, ready, 0, u64 floats, SHA-256 of the floats, the floats. */
void kvq_put_fixed(kvq_writer *w, const kvq_cache *cache, int learned_only) {
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

/* Reads a fixed-array section (put_fixed) into dest[(layer * 2 + side) * KVQ_SIDE_FIXED + index],
 * arrays sized as the cache's; ready[layer * 2 + side] receives learned codebooks' readiness. Every
 * array the cache needs (or, with learned_only, every learned one) must appear exactly once, with
 * the cache's kind and size, finite values and a matching SHA-256. */
kvq_status kvq_get_fixed(kvq_context *ctx, const kvq_cache *cache, kvq_reader *r, int learned_only, float **dest, int *ready,
                          const char *who) {
  const uint32_t L = cache->config.layer_count;
  uint32_t expected = 0;
  for (uint32_t l = 0; l < L; l++)
    for (int s = 0; s < 2; s++)
      for (int i = 0; i < KVQ_SIDE_FIXED; i++) {
        const kvq_side_layout *layout = &cache->storage[l].side[s].layout;
        expected += kvq_side_fixed_floats(layout, i) > 0 && (!learned_only || kvq_side_fixed_kind(layout, i) == KVQ_FIXED_LEARNED);
      }
  if (kvq_get_u32(r) != expected) return bad(ctx, who, "wrong number of matrices and codebooks for the config");
  uint8_t *seen = calloc((size_t)L * 2 * KVQ_SIDE_FIXED, 1);
  if (!seen) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "%s: out of host memory", who);
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
      st = bad(ctx, who, "a matrix or codebook does not match the config, or appears twice");
      break;
    }
    seen[slot] = 1;
    /* What the seed and the config derive (random matrices, offline tables) is already in dest, built as
     * kvq_cache_create builds it: the file's copy is read aside and must equal it bit for bit. */
    const int derived = kind == KVQ_FIXED_RANDOM || kind == KVQ_FIXED_COMPUTED;
    float *m = derived ? malloc((size_t)floats * sizeof(float)) : dest[slot];
    if (!m) {
      st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "%s: out of host memory", who);
      break;
    }
    uint8_t md[32];
    if (!kvq_get_f32s(r, m, floats)) {
      if (derived) free(m);
      st = bad(ctx, who, "matrix section too short");
      break;
    }
    kvq_sha256_digest(m, (size_t)floats * 4, md);
    if (memcmp(md, sha, 32) != 0) st = bad(ctx, who, "a matrix or codebook does not match its SHA-256");
    for (uint64_t e = 0; e < floats && st == KVQ_OK; e++)
      if (!isfinite(m[e])) st = bad(ctx, who, "a matrix or codebook holds a non-finite number");
    if (derived) {
      if (st == KVQ_OK && memcmp(m, dest[slot], (size_t)floats * sizeof(float)) != 0)
        st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "%s: layer %u %s: %s differ from the ones seed %llu and the config give",
                      who, l, s ? "values" : "keys", kvq_fixed_name(layout, (int)i), (unsigned long long)cache->config.seed);
      free(m);
      continue;
    }
    char why[256];
    const int check = st == KVQ_OK ? kvq_fixed_check(layout, (int)i, m, (int)is_ready, why, sizeof why) : 0;
    if (check != 0)
      st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "%s: layer %u %s: %s", who, l,
                    s ? "values" : "keys", why);
    if (kind == KVQ_FIXED_LEARNED) ready[l * 2 + s] = (int)is_ready;
  }
  free(seen);
  if (st == KVQ_OK && !kvq_section_finished(r)) st = bad(ctx, who, "matrix section has the wrong length");
  return st;
}

/* ---- Saving and reading whole files -------------------------------------------------------------- */

kvq_status kvq_file_save_size(kvq_cache *cache, kvq_file_writer write, uint64_t *bytes, const char *who) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!bytes) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: bytes is NULL", who);
  kvq_writer w = {NULL, 0};
  kvq_status st = write(cache, &w);
  if (st == KVQ_OK) *bytes = w.pos;
  return st;
}

kvq_status kvq_file_save_to_memory(kvq_cache *cache, kvq_file_writer write, void *buffer, size_t capacity,
                                   size_t *written, const char *who) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!buffer || !written) return kvq_fail(cache->ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: buffer or written is NULL", who);
  uint64_t size;
  kvq_status st = kvq_file_save_size(cache, write, &size, who);
  if (st != KVQ_OK) return st;
  if (size > capacity)
    return kvq_fail(cache->ctx, KVQ_ERROR_BUFFER_TOO_SMALL, "%s: needs %llu bytes, got %zu", who, (unsigned long long)size,
                    capacity);
  kvq_writer w = {buffer, 0};
  if ((st = write(cache, &w)) != KVQ_OK) return st;
  *written = (size_t)w.pos;
  return KVQ_OK;
}

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

kvq_status kvq_file_save(kvq_cache *cache, kvq_file_writer write, const char *path, const char *who) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_context *ctx = cache->ctx;
  if (!path || !*path) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "%s: path is empty", who);
  uint64_t size;
  kvq_status st = kvq_file_save_size(cache, write, &size, who);
  if (st != KVQ_OK) return st;
  uint8_t *data = size <= SIZE_MAX ? malloc((size_t)size) : NULL;
  if (!data) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "%s: out of host memory for %llu bytes", who, (unsigned long long)size);
  kvq_writer w = {data, 0};
  st = write(cache, &w);
  if (st == KVQ_OK) st = write_atomically(ctx, path, data, size, who);
  free(data);
  return st;
}

/* Reads a whole file into a malloc'ed buffer. */
kvq_status kvq_file_read(kvq_context *ctx, const char *path, uint8_t **out, size_t *out_size, const char *who) {
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
