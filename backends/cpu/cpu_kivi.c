/*
 * KIVI keys (Liu et al., 2024): channel-wise asymmetric quantization over groups of Gt tokens; the
 * math is core/methods/kivi.h. docs/FORMAT.md has the bytes.
 */
#include "core/layout.h"
#include "cpu_io.h"
#include "core/methods/kivi.h"
#include "shaders/work_units.h"

static void kivi_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, x, NULL);
  const uint32_t units = kvq_encode_units_of(KVQ_LAYOUT_KIVI, n, s->head_dim, s->group, 0, 0, 0, 0);
  for (uint32_t u = 0; u < units; u++)
    kvq_kivi_encode_unit(&io, 0, u, n, 0, (uint32_t)token_stride, s->page_size, s->head_dim, s->bits, s->group);
}

static void kivi_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, NULL, NULL);
  for (uint32_t c = 0; c < s->head_dim; c++) out[c] = kvq_kivi_decode(&io, 0, t, c, s->page_size, s->head_dim, s->bits, s->group);
}

const cpu_method kvq_cpu_kivi = {.encode = kivi_encode, .decode = kivi_decode};
