/*
 * UNIFORM: token-wise asymmetric quantization (KIVI's value scheme, used by QJL for values).
 * For each token and each group of G channels: minimum and maximum, the fp16 scale and minimum, and
 * each channel's code by threshold comparison (core/quantize_math.h). docs/FORMAT.md has the bytes.
 */
#include "core/layout.h"
#include "core/quantize_math.h"
#include "cpu.h"

static void uniform_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t d = s->head_dim, b = s->bits, G = s->group;
  uint8_t *params = block + kvq_uniform_params_offset(s->page_size, d, b);
  for (uint32_t t = 0; t < n; t++) {
    const float *xt = x + t * token_stride;
    for (uint32_t g = 0; g < d / G; g++) {
      float mn = xt[g * G], mx = xt[g * G];
      for (uint32_t c = g * G + 1; c < (g + 1) * G; c++) {
        if (xt[c] < mn) mn = xt[c];
        if (xt[c] > mx) mx = xt[c];
      }
      uint32_t word = kvq_uniform_params(mn, mx, b);
      kvq_cpu_or_word(params + 4 * (t * (d / G) + g), word);
      float scale = kvq_uniform_param_scale(word), min = kvq_uniform_param_min(word);
      for (uint32_t c = g * G; c < (g + 1) * G; c++) {
        uint32_t i = t * d + c;
        uint32_t code = kvq_uniform_code(xt[c], min, scale, b);
        kvq_cpu_put_code(block, i, b, code);
      }
    }
  }
}

static void uniform_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t d = s->head_dim, b = s->bits, G = s->group;
  const uint8_t *params = block + kvq_uniform_params_offset(s->page_size, d, b);
  for (uint32_t c = 0; c < d; c++) {
    uint32_t word = kvq_cpu_word(params + 4 * (t * (d / G) + c / G));
    uint32_t i = t * d + c;
    uint32_t code = kvq_cpu_code(block, i, b);
    out[c] = kvq_uniform_value(kvq_uniform_param_min(word), kvq_uniform_param_scale(word), code);
  }
}

const cpu_method kvq_cpu_uniform = {.encode = uniform_encode, .decode = uniform_decode};
