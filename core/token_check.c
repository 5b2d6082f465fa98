#include "token_check.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "halfconv.h"
#include "layout.h"
#include "quantize_math.h"
#include "tensor.h"

/* The decisions are core/methods/range.h's (shared with the Vulkan shader and the CUDA kernel that
 * check device tokens), read from the vector converted to fp32; this file adds what failed, in words. */
#define KVQ_IO_PARAM const float *io,
#define KVQ_IO io,
#define KVQ_IN(i) (io[(i)])
#include "methods/range.h"

static kvq_status check_vector(kvq_context *ctx, const kvq_side_layout *s, const float *x, const char *side,
                               uint64_t token, uint32_t head) {
  const uint32_t d = s->head_dim;
  /* The largest magnitude's bits in one pass without an exit, which the compiler vectorizes: the
   * magnitudes of floats order as their bits do, and NaN and infinity lie above every finite one. */
  uint32_t top = 0;
  for (uint32_t c = 0; c < d; c++) {
    uint32_t bits;
    memcpy(&bits, &x[c], sizeof bits);
    bits &= 0x7fffffffu;
    top = bits > top ? bits : top;
  }
  if (top >= 0x7f800000u) /* then the loop says which channel */
    for (uint32_t c = 0; c < d; c++)
      if (!isfinite(x[c]))
        return kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "%s: token %llu, head %u, channel %u is %g", side,
                        (unsigned long long)token, head, c, (double)x[c]);
  /* Shortcuts from the largest magnitude that pass only vectors range.h passes (the same decisions),
   * without its conversion of every number, per-group fp16 parameters or sums, which were most of
   * an append's host time:
   * - EXACT: fp16 and bf16 rounding is monotone, so the vector fits iff its largest magnitude does;
   * - UNIFORM and KIVI: with every |x| within KIVI's bound (32752) a group's minimum fits fp16 and its
   *   range, at most 65504 in fp32, times 1 / (2^b - 1) <= 1 gives a scale that fits too;
   * - QJL and PolarQuant: the sum of squares is at most d largest^2 <= 4e9 before rounding and within
   *   d 2^-24 of it after, so its root stays below 63300, under PolarQuant's 65440 and fp16's 65520. */
  float largest;
  memcpy(&largest, &top, sizeof largest);
  const int fits = s->method == KVQ_LAYOUT_EXACT ? !kvq_range_exact_fails(largest, s->dtype)
                   : s->method == KVQ_LAYOUT_UNIFORM || s->method == KVQ_LAYOUT_KIVI ? !kvq_range_kivi_fails(largest)
                   : s->method == KVQ_LAYOUT_QJL || s->method == KVQ_LAYOUT_POLAR ? (double)largest * largest * d <= 4.0e9
                                                                                  : 0;
  if (fits) return KVQ_OK;
  if (s->method > KVQ_LAYOUT_CQ) return kvq_fail(ctx, KVQ_ERROR_INTERNAL, "%s: unknown layout method %u", side, s->method);
  if (!kvq_range_vector_fails(x, 0, s->method, d, s->dtype, s->group, s->bits)) return KVQ_OK;
  switch (s->method) {
  case KVQ_LAYOUT_EXACT:
    for (uint32_t c = 0; c < d; c++)
      if (kvq_range_exact_fails(x[c], s->dtype))
        return kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "%s: token %llu, head %u, channel %u = %g overflows %s storage",
                        side, (unsigned long long)token, head, c, (double)x[c], s->dtype == KVQ_LAYOUT_F16 ? "fp16" : "bf16");
    break;
  case KVQ_LAYOUT_QJL:
    return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                    "%s: token %llu, head %u has norm %g, beyond the fp16 range of QJL's stored norms", side,
                    (unsigned long long)token, head, sqrt((double)kvq_range_square_sum(x, 0, d)));
  case KVQ_LAYOUT_UNIFORM:
    for (uint32_t g = 0; g < d / s->group; g++) {
      const float mn = kvq_range_group_min(x, 0, g, s->group), mx = kvq_range_group_max(x, 0, g, s->group);
      if (kvq_range_uniform_fails(mn, mx, s->bits))
        return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                        "%s: token %llu, head %u, group %u spans [%g, %g]: its fp16 minimum or scale overflows", side,
                        (unsigned long long)token, head, g, (double)mn, (double)mx);
    }
    break;
  case KVQ_LAYOUT_KIVI:
    for (uint32_t c = 0; c < d; c++)
      if (kvq_range_kivi_fails(x[c]))
        return kvq_fail(ctx, KVQ_ERROR_NON_FINITE,
                        "%s: token %llu, head %u, channel %u = %g: KIVI stores channel scales in fp16 and needs |x| <= 32752",
                        side, (unsigned long long)token, head, c, (double)x[c]);
    break;
  case KVQ_LAYOUT_POLAR:
    return kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "%s: token %llu, head %u has norm %g, beyond PolarQuant's fp16 radii", side,
                    (unsigned long long)token, head, sqrt((double)kvq_range_square_sum(x, 0, d)));
  }
  return kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "%s: token %llu, head %u is beyond what its method stores", side,
                  (unsigned long long)token, head);
}

kvq_status kvq_check_tokens(kvq_context *ctx, const kvq_side_layout *s, kvq_dtype dtype, const void *raw,
                            uint32_t count, const char *side, uint64_t first) {
  /* fp32 vectors are read where they are (aligned: the caller's fp32 tensor, or a malloc'd copy),
   * others converted to fp32 one vector at a time */
  const int in_place = dtype == KVQ_DTYPE_F32 && (uintptr_t)raw % _Alignof(float) == 0;
  float *x = in_place ? NULL : malloc(sizeof(float) * s->head_dim);
  if (!in_place && !x) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory checking tokens");
  const uint8_t *p = raw;
  const size_t vector_bytes = (size_t)s->head_dim * (dtype == KVQ_DTYPE_F32 ? 4 : 2);
  kvq_status st = KVQ_OK;
  for (uint32_t t = 0; t < count && st == KVQ_OK; t++)
    for (uint32_t h = 0; h < s->kv_heads && st == KVQ_OK; h++) {
      if (!in_place) kvq_convert_to_f32(dtype, p, x, s->head_dim);
      st = check_vector(ctx, s, in_place ? (const float *)(const void *)p : x, side, first + t, h);
      p += vector_bytes;
    }
  free(x);
  return st;
}
