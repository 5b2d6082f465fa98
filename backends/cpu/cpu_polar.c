/*
 * PolarQuant (Han, Kacham, Karbasi, Mirrokni, Zandieh: "PolarQuant: quantizing KV caches with polar
 * transformation", ../shared/papers/001 and ../shared/design/polarquant-math.md). The math (rotation,
 * codes, radii, decoding, scores) is core/methods/polar.h; this file loops over its units. Tokens are
 * decoded whole, top down (kvq_polar_decode_token). Keys are scored against the rotated query; values
 * are summed in the rotated space and rotated back once.
 */
#include "core/layout.h"
#include "cpu_io.h"
#include "core/methods/polar.h"


/* The first table element of the call's kv head. */
static uint32_t tables_of(const cpu_head *h) {
  const kvq_side_layout *s = &h->side->layout;
  return kvq_polar_tables(h->kv_head, s->codebook, s->levels, s->level_bits);
}

static void polar_unrotate(const cpu_head *h, const float *y, float *x) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, NULL, NULL, NULL);
  kvq_polar_unrotate(&io, y, s->head_dim, s->rotation, x);
}

static void polar_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, x, NULL);
  for (uint32_t t = 0; t < n; t++)
    kvq_polar_encode_unit(&io, 0, t, 0, (uint32_t)token_stride, s->page_size, s->head_dim, s->levels, s->level_bits,
                          s->rotation, tables_of(h));
}

/* decode gives the rotated vector: the generic attention paths unrotate once per output row */
static void polar_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, NULL, NULL);
  kvq_polar_decode_token(&io, 0, t, s->page_size, s->head_dim, s->levels, s->level_bits, tables_of(h), out);
}

static void polar_prepare(const cpu_head *h, const float *q, float *prepared) {
  const kvq_io io = kvq_cpu_io(h, NULL, q, NULL);
  kvq_polar_rotate(&io, 0, h->side->layout.head_dim, h->side->layout.rotation, prepared);
}

static void polar_dot_page(const cpu_head *h, const uint8_t *block, uint32_t n, const float *q, const float *prepared,
                           double *dots) {
  (void)q;
  const kvq_io io = kvq_cpu_io(h, block, NULL, prepared);
  float key[KVQ_MAX_HEAD_DIM];
  for (uint32_t t = 0; t < n; t++) {
    polar_decode(h, block, t, key);
    dots[t] = kvq_polar_dot(&io, 0, key, h->side->layout.head_dim);
  }
}

const cpu_method kvq_cpu_polar = {.encode = polar_encode,
                                  .decode = polar_decode,
                                  .prepare = polar_prepare,
                                  .dot_page = polar_dot_page,
                                  .unrotate = polar_unrotate};
