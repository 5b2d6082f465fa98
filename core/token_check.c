#include "token_check.h"

#include <math.h>
#include <stdlib.h>

#include "halfconv.h"
#include "layout.h"
#include "quantize_math.h"
#include "tensor.h"

static int f16_is_inf(uint32_t bits) { return (bits & 0x7c00u) == 0x7c00u; }

static kvq_status check_vector(kvq_context *ctx, const kvq_side_layout *s, const float *x, const char *side,
                               uint64_t token, uint32_t head) {
  const uint32_t d = s->head_dim;
  for (uint32_t c = 0; c < d; c++)
    if (!isfinite(x[c]))
      return kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "%s: token %llu, head %u, channel %u is %g", side,
                      (unsigned long long)token, head, c, (double)x[c]);
  switch (s->method) {
  case KVQ_LAYOUT_EXACT:
    if (s->dtype == KVQ_LAYOUT_F32) return KVQ_OK;
    for (uint32_t c = 0; c < d; c++) {
      uint32_t bits = s->dtype == KVQ_LAYOUT_F16 ? kvq_f32_to_f16_bits(x[c]) : kvq_f32_to_bf16_bits(x[c]);
      int inf = s->dtype == KVQ_LAYOUT_F16 ? f16_is_inf(bits) : (bits & 0x7f80u) == 0x7f80u;
      if (inf)
        return kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "%s: token %llu, head %u, channel %u = %g overflows %s storage",
                        side, (unsigned long long)token, head, c, (double)x[c], s->dtype == KVQ_LAYOUT_F16 ? "fp16" : "bf16");
    }
    return KVQ_OK;
  case KVQ_LAYOUT_QJL: {
    /* |k_in| and |k_out| never exceed |k| computed the same way (sums of fewer non-negative terms in
     * the same order, monotone rounding), so checking |k| covers both stored norms. */
    float sum = 0.0f;
    for (uint32_t c = 0; c < d; c++) sum = sum + x[c] * x[c];
    if (f16_is_inf(kvq_f32_to_f16_bits(sqrtf(sum))))
      return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                      "%s: token %llu, head %u has norm %g, beyond the fp16 range of QJL's stored norms", side,
                      (unsigned long long)token, head, sqrt((double)sum));
    return KVQ_OK;
  }
  case KVQ_LAYOUT_UNIFORM:
    for (uint32_t g = 0; g < d / s->group; g++) {
      float mn = x[g * s->group], mx = mn;
      for (uint32_t c = g * s->group; c < (g + 1) * s->group; c++) {
        if (x[c] < mn) mn = x[c];
        if (x[c] > mx) mx = x[c];
      }
      uint32_t params = kvq_uniform_params(mn, mx, s->bits);
      if (f16_is_inf(params) || f16_is_inf(params >> 16))
        return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                        "%s: token %llu, head %u, group %u spans [%g, %g]: its fp16 minimum or scale overflows", side,
                        (unsigned long long)token, head, g, (double)mn, (double)mx);
    }
    return KVQ_OK;
  case KVQ_LAYOUT_KIVI:
    /* A channel's scale spans several tokens, so bound every value: with |x| <= 32752 no group can
     * reach an fp16 minimum or scale beyond 65504 (the range is at most 65504, the scale at most that). */
    for (uint32_t c = 0; c < d; c++)
      if (fabsf(x[c]) > 32752.0f)
        return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                        "%s: token %llu, head %u, channel %u = %g: KIVI stores channel scales in fp16 and needs |x| <= 32752",
                        side, (unsigned long long)token, head, c, (double)x[c]);
    return KVQ_OK;
  case KVQ_LAYOUT_POLAR: {
    /* Block radii are fp16 and the rotation preserves the norm up to fp32 rounding (d 2^-24 relative,
     * well inside the margin of 65440 against 65504). */
    float sum = 0.0f;
    for (uint32_t c = 0; c < d; c++) sum = sum + x[c] * x[c];
    if (sqrtf(sum) > 65440.0f)
      return kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "%s: token %llu, head %u has norm %g, beyond PolarQuant's fp16 radii", side,
                      (unsigned long long)token, head, sqrt((double)sum));
    return KVQ_OK;
  }
  case KVQ_LAYOUT_CQ: return KVQ_OK; /* no side data: any finite value has a nearest centroid */
  }
  return kvq_fail(ctx, KVQ_ERROR_INTERNAL, "%s: unknown layout method %u", side, s->method);
}

kvq_status kvq_check_tokens(kvq_context *ctx, const kvq_side_layout *s, kvq_dtype dtype, const void *raw,
                            uint32_t count, const char *side, uint64_t first) {
  float *x = malloc(sizeof(float) * s->head_dim);
  if (!x) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory checking tokens");
  const uint8_t *p = raw;
  const size_t vector_bytes = (size_t)s->head_dim * (dtype == KVQ_DTYPE_F32 ? 4 : 2);
  kvq_status st = KVQ_OK;
  for (uint32_t t = 0; t < count && st == KVQ_OK; t++)
    for (uint32_t h = 0; h < s->kv_heads && st == KVQ_OK; h++) {
      kvq_convert_to_f32(dtype, p, x, s->head_dim);
      st = check_vector(ctx, s, x, side, first + t, h);
      p += vector_bytes;
    }
  free(x);
  return st;
}
