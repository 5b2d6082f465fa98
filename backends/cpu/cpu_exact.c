/* EXACT: tokens stored as they are, in fp32, fp16 or bf16; the math is core/methods/exact.h. */
#include "core/layout.h"
#include "cpu_io.h"
#include "core/methods/exact.h"

static void exact_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, x, NULL);
  for (uint32_t t = 0; t < n; t++) kvq_exact_encode_unit(&io, 0, t, 0, (uint32_t)token_stride, s->head_dim, s->dtype);
}

static void exact_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, NULL, NULL);
  for (uint32_t c = 0; c < s->head_dim; c++) out[c] = kvq_exact_decode(&io, 0, t, c, s->head_dim, s->dtype);
}

const cpu_method kvq_cpu_exact = {.encode = exact_encode, .decode = exact_decode};
