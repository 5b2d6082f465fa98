/*
 * KIVI keys (Liu et al., 2024): channel-wise asymmetric quantization. For each channel, the tokens
 * of a group of Gt consecutive tokens of the page share an fp16 scale and minimum; codes are decided
 * by the same thresholds as UNIFORM (core/quantize_math.h). Partial groups of a flushed page use
 * their valid tokens only. docs/FORMAT.md has the bytes.
 */
#include "core/layout.h"
#include "core/quantize_math.h"
#include "cpu.h"

static void kivi_encode(const cpu_head *h, const float *x, uint64_t token_stride, uint32_t n, uint8_t *block) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t d = s->head_dim, b = s->bits, Gt = s->group;
  uint8_t *params = block + kvq_kivi_params_offset(s->page_size, d, b);
  for (uint32_t t0 = 0; t0 < n; t0 += Gt) {
    const uint32_t t1 = n - t0 < Gt ? n : t0 + Gt; /* the group's valid tokens */
    for (uint32_t c = 0; c < d; c++) {
      float mn = x[t0 * token_stride + c], mx = mn;
      for (uint32_t t = t0 + 1; t < t1; t++) {
        const float v = x[t * token_stride + c];
        if (v < mn) mn = v;
        if (v > mx) mx = v;
      }
      const uint32_t word = kvq_uniform_params(mn, mx, b);
      kvq_cpu_or_word(params + 4 * ((t0 / Gt) * d + c), word);
      const float scale = kvq_uniform_param_scale(word), min = kvq_uniform_param_min(word);
      for (uint32_t t = t0; t < t1; t++) {
        const uint32_t i = t * d + c;
        kvq_cpu_put_code(block, i, b, kvq_uniform_code(x[t * token_stride + c], min, scale, b));
      }
    }
  }
}

static void kivi_decode(const cpu_head *h, const uint8_t *block, uint32_t t, float *out) {
  const kvq_side_layout *s = &h->side->layout;
  const uint32_t d = s->head_dim, b = s->bits;
  const uint8_t *params = block + kvq_kivi_params_offset(s->page_size, d, b) + 4 * (t / s->group) * d;
  for (uint32_t c = 0; c < d; c++) {
    const uint32_t word = kvq_cpu_word(params + 4 * c), i = t * d + c;
    const uint32_t code = kvq_cpu_code(block, i, b);
    out[c] = kvq_uniform_value(kvq_uniform_param_min(word), kvq_uniform_param_scale(word), code);
  }
}

const cpu_method kvq_cpu_kivi = {.encode = kivi_encode, .decode = kivi_decode};
