/*
 * Coupled Quantization (Zhang et al., "KV cache is 1 bit per channel: efficient large language model
 * inference with coupled quantization", ../shared/papers/004): c contiguous channels share one b-bit
 * code, the index of the nearest of 2^b centroids learned for that (kv head, channel group). Keys are
 * scored through lookup tables of <q_group, centroid> built once per query; values are summed by
 * code: the probability mass of every (group, code) is gathered first, then multiplied by the
 * centroids once.
 */
#include <string.h>

#include "core/layout.h"
#include "cpu_io.h"
#include "core/methods/cq.h"
#include "shaders/work_units.h"

/* The 2^b centroids of channel group g of the call's kv head. */
static const float *centroids(const cpu_head *h, uint32_t g) {
  const kvq_side_layout *s = &h->side->layout;
  return h->fixed[1] + kvq_cq_centroids(h->kv_head, g, s->head_dim, s->channels, s->code_bits);
}

static uint32_t code_of(const kvq_side_layout *s, const uint8_t *block, uint32_t t, uint32_t g) {
  const kvq_io io = {.page = (uint8_t *)block};
  return kvq_cq_code(&io, 0, t, g, s->head_dim, s->channels, s->code_bits);
}

static void cq_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, x, NULL);
  const uint32_t units = kvq_encode_units_of(KVQ_LAYOUT_CQ, n, s->head_dim, 0, 0, 0, 0, s->channels);
  for (uint32_t u = 0; u < units; u++)
    kvq_cq_encode_unit(&io, 0, u, 0, (uint32_t)token_stride, s->head_dim, s->channels, s->code_bits, h->kv_head);
}

static void cq_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, NULL, NULL);
  const uint32_t c = s->channels;
  for (uint32_t g = 0; g < s->head_dim / c; g++) /* a group at a time: its code read once */
    memcpy(out + g * c, h->fixed[1] + kvq_cq_decode_group(&io, 0, t, g, s->head_dim, c, s->code_bits, h->kv_head),
           sizeof(float) * c);
}

/* The lookup tables: prepared[g * 2^b + j] = <q_g, centroid j of group g>. */
static void cq_prepare(const cpu_head *h, const float *q, float *prepared) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, NULL, q, NULL);
  const uint32_t c = s->channels, K = 1u << s->code_bits;
  for (uint32_t g = 0; g < s->head_dim / c; g++)
    for (uint32_t j = 0; j < K; j++)
      prepared[(size_t)g * K + j] = kvq_cq_prepare_entry(&io, 0, g, j, s->head_dim, c, s->code_bits, h->kv_head);
}

static void cq_dot_page(const cpu_head *h, const uint8_t *block, uint32_t n, const float *q, const float *prepared,
                        double *dots) {
  (void)q;
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, NULL, prepared);
  for (uint32_t t = 0; t < n; t++) dots[t] = kvq_cq_score(&io, 0, t, 0, s->head_dim, s->channels, s->code_bits);
}

/* Adds each token's probability to the mass of its code in every group: mass[g * 2^b + code]. */
static void cq_gather(const cpu_head *h, const uint8_t *block, uint32_t n, const float *p, double *mass) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t groups = s->head_dim / s->channels, K = 1u << s->code_bits;
  for (uint32_t t = 0; t < n; t++)
    if (p[t] != 0.0f)
      for (uint32_t g = 0; g < groups; g++) mass[(size_t)g * K + code_of(s, block, t, g)] += p[t];
}

/* out = sum over (group, code) of mass times centroid. */
static void cq_spread(const cpu_head *h, const double *mass, double *out) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t c = s->channels, K = 1u << s->code_bits;
  for (uint32_t g = 0; g < s->head_dim / c; g++) {
    const float *mu = centroids(h, g);
    for (uint32_t i = 0; i < c; i++) out[g * c + i] = 0.0;
    for (uint32_t j = 0; j < K; j++)
      if (mass[(size_t)g * K + j] != 0.0)
        for (uint32_t i = 0; i < c; i++) out[g * c + i] += mass[(size_t)g * K + j] * mu[(size_t)j * c + i];
  }
}

const cpu_method kvq_cpu_cq = {.encode = cq_encode,
                               .decode = cq_decode,
                               .prepare = cq_prepare,
                               .dot_page = cq_dot_page,
                               .gather = cq_gather,
                               .spread = cq_spread};
