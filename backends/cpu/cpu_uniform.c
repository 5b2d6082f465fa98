/*
 * UNIFORM: token-wise asymmetric quantization (KIVI's value scheme, used by QJL for values); the math
 * is core/methods/uniform.h. docs/FORMAT.md has the bytes.
 */
#include "core/layout.h"
#include "cpu_io.h"
#include "core/methods/uniform.h"

static void uniform_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, x, NULL);
  for (uint32_t t = 0; t < n; t++)
    kvq_uniform_encode_unit(&io, 0, t, 0, (uint32_t)token_stride, s->page_size, s->head_dim, s->bits, s->group);
}

static void uniform_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const kvq_side_layout *s = &h->side->layout;
  const kvq_io io = kvq_cpu_io(h, block, NULL, NULL);
  for (uint32_t c = 0; c < s->head_dim; c++) out[c] = kvq_uniform_decode(&io, 0, t, c, s->page_size, s->head_dim, s->bits, s->group);
}

const cpu_method kvq_cpu_uniform = {.encode = uniform_encode, .decode = uniform_decode};
