#include "container.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/sha256.h"

#define MAGIC "KVQGOLD"

int golden_add(golden_file *g, const char *name, uint32_t kind, const void *data, uint64_t bytes) {
  if (g->count == g->capacity) {
    size_t capacity = g->capacity ? g->capacity * 2 : 32;
    golden_record *grown = realloc(g->records, sizeof *grown * capacity);
    if (!grown) return -1;
    g->records = grown;
    g->capacity = capacity;
  }
  golden_record *r = &g->records[g->count];
  r->name = malloc(strlen(name) + 1);
  r->data = malloc(bytes ? (size_t)bytes : 1);
  if (!r->name || !r->data) {
    free(r->name);
    free(r->data);
    return -1;
  }
  strcpy(r->name, name);
  if (bytes) memcpy(r->data, data, (size_t)bytes);
  r->kind = kind;
  r->bytes = bytes;
  g->count++;
  return 0;
}

int golden_add_u32(golden_file *g, const char *name, const uint32_t *values, uint64_t count) {
  return golden_add(g, name, GOLDEN_U32, values, count * 4);
}

int golden_add_f32(golden_file *g, const char *name, const float *values, uint64_t count) {
  return golden_add(g, name, GOLDEN_F32, values, count * 4);
}

const golden_record *golden_find(const golden_file *g, const char *name) {
  for (size_t i = 0; i < g->count; i++)
    if (strcmp(g->records[i].name, name) == 0) return &g->records[i];
  return NULL;
}

const uint32_t *golden_u32(const golden_record *r, uint64_t *count) {
  if (!r || r->kind != GOLDEN_U32 || r->bytes % 4) return NULL;
  *count = r->bytes / 4;
  return (const uint32_t *)r->data;
}

const float *golden_f32(const golden_record *r, uint64_t *count) {
  if (!r || r->kind != GOLDEN_F32 || r->bytes % 4) return NULL;
  *count = r->bytes / 4;
  return (const float *)r->data;
}

static void write_all(const golden_file *g, kvq_writer *w) {
  kvq_put_bytes(w, MAGIC, 8);
  kvq_put_u32(w, 1);
  kvq_put_u32(w, (uint32_t)g->count);
  kvq_put_u64(w, 0); /* file bytes, patched */
  for (size_t i = 0; i < g->count; i++) {
    const golden_record *r = &g->records[i];
    uint32_t n = (uint32_t)strlen(r->name);
    kvq_put_u32(w, n);
    kvq_put_bytes(w, r->name, n);
    kvq_put_zeros(w, (4 - n % 4) % 4);
    kvq_put_u32(w, r->kind);
    kvq_put_u32(w, 0);
    kvq_put_u64(w, r->bytes);
    kvq_put_bytes(w, r->data, r->bytes);
    kvq_put_zeros(w, (4 - r->bytes % 4) % 4);
  }
}

int golden_save(const golden_file *g, const char *path, char *error, size_t error_size) {
  kvq_writer count = {NULL, 0};
  write_all(g, &count);
  const uint64_t size = count.pos + 32;
  uint8_t *data = malloc((size_t)size);
  if (!data) {
    snprintf(error, error_size, "%s: out of memory", path);
    return -1;
  }
  kvq_writer w = {data, 0};
  write_all(g, &w);
  kvq_writer patch = {data, 16};
  kvq_put_u64(&patch, size);
  kvq_sha256_digest(data, (size_t)(size - 32), data + size - 32);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(data, 1, (size_t)size, f) == size;
  if (f) ok = fclose(f) == 0 && ok;
  if (!ok) snprintf(error, error_size, "%s: cannot write: %s", path, strerror(errno));
  free(data);
  return ok ? 0 : -1;
}

int golden_load(golden_file *g, const char *path, char *error, size_t error_size) {
  memset(g, 0, sizeof *g);
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(error, error_size, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  uint8_t *data = NULL;
  size_t size = 0, capacity = 0;
  for (;;) {
    if (size == capacity) {
      capacity = capacity ? capacity * 2 : 1 << 16;
      uint8_t *p = realloc(data, capacity);
      if (!p) {
        free(data);
        fclose(f);
        snprintf(error, error_size, "%s: out of memory", path);
        return -1;
      }
      data = p;
    }
    size_t got = fread(data + size, 1, capacity - size, f);
    size += got;
    if (got == 0) break;
  }
  fclose(f);
  int rc = -1;
  kvq_reader r = {data, size, 0, 0};
  const uint8_t *magic = kvq_get_bytes(&r, 8);
  uint32_t version = kvq_get_u32(&r), records = kvq_get_u32(&r);
  uint64_t file_bytes = kvq_get_u64(&r);
  uint8_t digest[32];
  if (!magic || memcmp(magic, MAGIC, 8) != 0) {
    snprintf(error, error_size, "%s: not a kvq golden file", path);
  } else if (version != 1) {
    snprintf(error, error_size, "%s: golden format version %u, this kvq reads 1", path, version);
  } else if (file_bytes != size || size < 56) {
    snprintf(error, error_size, "%s: %zu bytes, the header says %llu: truncated or padded", path, size,
             (unsigned long long)file_bytes);
  } else if (kvq_sha256_digest(data, size - 32, digest), memcmp(digest, data + size - 32, 32) != 0) {
    snprintf(error, error_size, "%s: SHA-256 mismatch: the file is corrupted", path);
  } else {
    r.size = size - 32;
    rc = 0;
    for (uint32_t i = 0; i < records && rc == 0; i++) {
      uint32_t n = kvq_get_u32(&r);
      const uint8_t *name = kvq_get_bytes(&r, n);
      kvq_get_bytes(&r, (4 - n % 4) % 4);
      uint32_t kind = kvq_get_u32(&r);
      kvq_get_u32(&r);
      uint64_t bytes = kvq_get_u64(&r);
      const uint8_t *payload = kvq_get_bytes(&r, bytes);
      kvq_get_bytes(&r, (4 - bytes % 4) % 4);
      char *copy = name && n < 4096 ? malloc(n + 1) : NULL;
      if (r.short_read || !copy || !payload) {
        free(copy);
        snprintf(error, error_size, "%s: malformed record %u", path, i);
        rc = -1;
        break;
      }
      memcpy(copy, name, n);
      copy[n] = 0;
      if (golden_add(g, copy, kind, payload, bytes) != 0) {
        snprintf(error, error_size, "%s: out of memory", path);
        rc = -1;
      }
      free(copy);
    }
    if (rc == 0 && r.pos != r.size) {
      snprintf(error, error_size, "%s: bytes after the last record", path);
      rc = -1;
    }
  }
  free(data);
  if (rc != 0) golden_free(g);
  return rc;
}

void golden_free(golden_file *g) {
  for (size_t i = 0; i < g->count; i++) {
    free(g->records[i].name);
    free(g->records[i].data);
  }
  free(g->records);
  memset(g, 0, sizeof *g);
}
