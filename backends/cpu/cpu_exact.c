/* EXACT: tokens stored as they are, in fp32, fp16 or bf16 (round half to even, core/halfconv.h). */
#include <string.h>

#include "core/halfconv.h"
#include "core/layout.h"
#include "core/tensor.h"
#include "cpu.h"

static void exact_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  for (uint32_t t = 0; t < n; t++) {
    for (uint32_t c = 0; c < s->head_dim; c++) {
      float v = x[t * token_stride + c];
      uint8_t *dst = block + kvq_exact_offset(s->head_dim, s->dtype, t, c);
      if (s->dtype == KVQ_LAYOUT_F32) {
        uint32_t u = kvq_f32_to_bits(v);
        for (int i = 0; i < 4; i++) dst[i] = (uint8_t)(u >> (8 * i));
      } else {
        uint32_t u = s->dtype == KVQ_LAYOUT_F16 ? kvq_f32_to_f16_bits(v) : kvq_f32_to_bf16_bits(v);
        dst[0] = (uint8_t)u;
        dst[1] = (uint8_t)(u >> 8);
      }
    }
  }
}

static void exact_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const kvq_side_layout *s = &h->side->layout;
  kvq_convert_to_f32((kvq_dtype)s->dtype, block + kvq_exact_offset(s->head_dim, s->dtype, t, 0), out, s->head_dim);
}

const cpu_method kvq_cpu_exact = {.encode = exact_encode, .decode = exact_decode};
