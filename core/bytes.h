/*
 * Little-endian byte streams for kvq's files. A writer with data == NULL only counts, so the size of
 * a file and its bytes come from the same code. A reader never reads past its end: a short read
 * sets `short_read` and returns zeros / NULL, so parsers check once at the end of a step.
 */
#ifndef KVQ_CORE_BYTES_H
#define KVQ_CORE_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Little-endian u16 and u32 at any address (page images, files). */
static inline uint32_t kvq_le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t kvq_le32(const uint8_t *p) { return kvq_le16(p) | kvq_le16(p + 2) << 16; }

typedef struct kvq_writer {
  uint8_t *data; /* NULL: count only */
  uint64_t pos;
} kvq_writer;

static inline void kvq_put_bytes(kvq_writer *w, const void *src, uint64_t n) {
  if (w->data && n) memcpy(w->data + w->pos, src, (size_t)n);
  w->pos += n;
}
/* Room for n bytes that arrive later (a device read straight into the file image): where they go,
 * or NULL when only counting. */
static inline uint8_t *kvq_put_later(kvq_writer *w, uint64_t n) {
  uint8_t *at = w->data ? w->data + w->pos : NULL;
  w->pos += n;
  return at;
}
static inline void kvq_put_u32(kvq_writer *w, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  kvq_put_bytes(w, b, 4);
}
static inline void kvq_put_u64(kvq_writer *w, uint64_t v) {
  kvq_put_u32(w, (uint32_t)v);
  kvq_put_u32(w, (uint32_t)(v >> 32));
}
static inline void kvq_put_zeros(kvq_writer *w, uint64_t n) {
  if (w->data && n) memset(w->data + w->pos, 0, (size_t)n);
  w->pos += n;
}
/* Writes fp32 values as little-endian words (portable across host byte orders). */
static inline void kvq_put_f32s(kvq_writer *w, const float *v, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &v[i], 4);
    kvq_put_u32(w, u);
  }
}

typedef struct kvq_reader {
  const uint8_t *data;
  uint64_t size, pos;
  int short_read;
} kvq_reader;

static inline const uint8_t *kvq_get_bytes(kvq_reader *r, uint64_t n) {
  if (r->short_read || n > r->size - r->pos) {
    r->short_read = 1;
    return NULL;
  }
  const uint8_t *p = r->data + r->pos;
  r->pos += n;
  return p;
}
static inline uint32_t kvq_get_u32(kvq_reader *r) {
  const uint8_t *b = kvq_get_bytes(r, 4);
  return b ? (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24 : 0;
}
static inline uint64_t kvq_get_u64(kvq_reader *r) {
  uint64_t lo = kvq_get_u32(r);
  return lo | (uint64_t)kvq_get_u32(r) << 32;
}
static inline int kvq_get_f32s(kvq_reader *r, float *out, uint64_t n) {
  if (n > (r->size - r->pos) / 4) {
    r->short_read = 1;
    return 0;
  }
  for (uint64_t i = 0; i < n; i++) {
    uint32_t u = kvq_get_u32(r);
    memcpy(&out[i], &u, 4);
  }
  return 1;
}

#endif
