/* fp16 / bf16 conversions (core/halfconv.h and the public kvq_convert): exact decoding, round half to
 * even, specials; and the public synthetic-data generator's argument checks. */
#include <criterion/criterion.h>

#include "helpers.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/halfconv.h"

/* Reference fp32 -> fp16 by arithmetic on doubles: the nearest of the two neighbouring fp16 values,
 * ties to the even one. Independent of the integer implementation under test. */
static uint32_t ref_f16(float x) {
  if (isnan(x)) return 0x7e00;
  uint32_t sign = signbit(x) ? 0x8000 : 0;
  double a = fabs((double)x);
  if (a >= 65520.0) return sign | 0x7c00;
  /* Step between fp16 values near a: 2^-24 below 2^-14, else 2^(e-10). */
  double step = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, ilogb(a) - 10);
  double lo = floor(a / step) * step, hi = lo + step;
  double pick;
  if (a - lo < hi - a) pick = lo;
  else if (a - lo > hi - a) pick = hi;
  else pick = fmod(lo / step, 2.0) == 0.0 ? lo : hi;
  /* Encode the picked value. */
  if (pick == 0.0) return sign;
  if (pick < 0x1p-14) return sign | (uint32_t)(pick / 0x1p-24);
  int e = ilogb(pick);
  if (e > 15) return sign | 0x7c00;
  uint32_t mant = (uint32_t)((pick / ldexp(1.0, e) - 1.0) * 1024.0);
  return sign | (uint32_t)(e + 15) << 10 | mant;
}

Test(half, every_f16_decodes_and_round_trips) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = kvq_f16_bits_to_f32(h);
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f && m) {
      cr_assert(isnan(f), "0x%04x must decode to NaN", h);
      cr_assert_eq(kvq_f32_to_f16_bits(f) & 0xfe00, (h & 0x8000) | 0x7e00, "NaN 0x%04x stays a quiet NaN", h);
      continue;
    }
    double expect = e == 0 ? ldexp((double)m, -24) : e == 0x1f ? INFINITY : ldexp(1.0 + m / 1024.0, (int)e - 15);
    if (h & 0x8000) expect = -expect;
    cr_assert_eq((double)f, expect, "0x%04x decodes to %a, expected %a", h, (double)f, expect);
    cr_assert_eq(kvq_f32_to_f16_bits(f), h, "0x%04x round trip", h);
  }
}

Test(half, round_half_to_even_matches_reference) {
  /* Every fp32 whose upper bits land in the fp16 range, sampled densely: all 2^13 low-mantissa
   * patterns near ties, plus a stride through the whole range. */
  uint32_t checked = 0;
  for (uint64_t u = 0; u < 0x100000000ull; u += 4099) {
    float x;
    uint32_t bits = (uint32_t)u;
    memcpy(&x, &bits, 4);
    if (isnan(x)) continue;
    cr_assert_eq(kvq_f32_to_f16_bits(x), ref_f16(x), "fp32 0x%08x (%a)", bits, (double)x);
    checked++;
  }
  for (uint32_t h = 0; h < 0x7c00; h++) { /* exact ties and their neighbours around each fp16 value */
    float base = kvq_f16_bits_to_f32(h);
    uint32_t b;
    memcpy(&b, &base, 4);
    for (int32_t delta = -2; delta <= 2; delta++) {
      uint32_t probe = (b & 0xffffe000u) + 0x1000u + (uint32_t)delta;
      float x;
      memcpy(&x, &probe, 4);
      cr_assert_eq(kvq_f32_to_f16_bits(x), ref_f16(x), "fp32 0x%08x near a tie", probe);
    }
  }
  cr_assert_gt(checked, 1000000u);
}

Test(half, specials) {
  cr_assert_eq(kvq_f32_to_f16_bits(0.0f), 0x0000);
  cr_assert_eq(kvq_f32_to_f16_bits(-0.0f), 0x8000);
  cr_assert_eq(kvq_f32_to_f16_bits(INFINITY), 0x7c00);
  cr_assert_eq(kvq_f32_to_f16_bits(-INFINITY), 0xfc00);
  cr_assert_eq(kvq_f32_to_f16_bits(65504.0f), 0x7bff);
  cr_assert_eq(kvq_f32_to_f16_bits(65519.99f), 0x7bff, "below the midpoint to 65536 stays finite");
  cr_assert_eq(kvq_f32_to_f16_bits(65520.0f), 0x7c00, "the midpoint rounds to even: Inf");
  cr_assert_eq(kvq_f32_to_f16_bits(0x1p-24f), 0x0001, "smallest subnormal");
  cr_assert_eq(kvq_f32_to_f16_bits(0x1p-25f), 0x0000, "half the smallest subnormal ties to even 0");
  cr_assert_eq(kvq_f32_to_f16_bits(0x1.8p-24f), 0x0002, "1.5 subnormal units tie to even 2");
  cr_assert_eq(kvq_f32_to_f16_bits(0x1.000002p-25f), 0x0001, "just above half rounds up");
  cr_assert_eq(kvq_f32_to_f16_bits(0x1.ffcp-15f), 0x0400, "largest subnormal rounding up becomes the smallest normal");
  cr_assert_eq(kvq_f32_to_f16_bits(1.0f + 0x1p-11f), 0x3c00, "tie at 1 + 2^-11 goes to even 1.0");
  cr_assert_eq(kvq_f32_to_f16_bits(1.0f + 0x1.8p-10f), 0x3c02, "tie at 1 + 3*2^-11 goes to even 0x3c02");
  cr_assert(signbit(kvq_f16_bits_to_f32(0x8000)));
}

Test(half, bf16) {
  cr_assert_eq(kvq_f32_to_bf16_bits(1.0f), 0x3f80);
  cr_assert_eq(kvq_f32_to_bf16_bits(-0.0f), 0x8000);
  cr_assert_eq(kvq_f32_to_bf16_bits(INFINITY), 0x7f80);
  cr_assert_eq(kvq_f32_to_bf16_bits(0x1.00fffep0f), 0x3f80, "just below the tie rounds down");
  cr_assert_eq(kvq_f32_to_bf16_bits(0x1.010002p0f), 0x3f81, "just above the tie rounds up");
  cr_assert_eq(kvq_f32_to_bf16_bits(0x1.01p0f), 0x3f80, "exact tie 1 + 2^-8 rounds to even");
  cr_assert_eq(kvq_f32_to_bf16_bits(0x1.03p0f), 0x3f82, "exact tie 1 + 3*2^-8 rounds to even");
  cr_assert_eq(kvq_f32_to_bf16_bits(0x1.fffffep127f), 0x7f80, "FLT_MAX rounds to Inf in bf16");
  cr_assert_eq(kvq_f32_to_bf16_bits(0x1p-133f), 0x0001, "subnormal kept");
  float qnan = kvq_bf16_bits_to_f32(kvq_f32_to_bf16_bits(NAN));
  cr_assert(isnan(qnan));
  uint32_t snan_bits = 0x7f800001u; /* a signalling NaN whose payload is only in the low bits */
  float snan;
  memcpy(&snan, &snan_bits, 4);
  cr_assert(isnan(kvq_bf16_bits_to_f32(kvq_f32_to_bf16_bits(snan))), "NaN must not become Inf");
  for (uint32_t b = 0; b < 0x10000; b++) {
    if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) continue;
    cr_assert_eq(kvq_f32_to_bf16_bits(kvq_bf16_bits_to_f32(b)), b, "bf16 0x%04x round trip", b);
  }
}

/* kvq_convert (public) is the tensor conversion: every fp16 and bf16 value widens exactly and
 * narrows back to itself, ties near every fp16 value round as the reference says, and bad arguments
 * write nothing. */
Test(half, kvq_convert_is_the_tensor_conversion) {
  enum { N = 0x10000 };
  uint16_t *bits = malloc(sizeof(uint16_t) * N), *back = malloc(sizeof(uint16_t) * N);
  float *wide = malloc(sizeof(float) * N);
  for (uint32_t h = 0; h < N; h++) bits[h] = (uint16_t)h;
  const kvq_dtype narrow[2] = {KVQ_DTYPE_F16, KVQ_DTYPE_BF16};
  for (int n = 0; n < 2; n++) {
    cr_assert_eq(kvq_convert(bits, narrow[n], wide, KVQ_DTYPE_F32, N), KVQ_OK);
    cr_assert_eq(kvq_convert(wide, KVQ_DTYPE_F32, back, narrow[n], N), KVQ_OK);
    for (uint32_t h = 0; h < N; h++) {
      const float expect = n == 0 ? kvq_f16_bits_to_f32(h) : kvq_bf16_bits_to_f32(h);
      cr_assert(memcmp(&wide[h], &expect, 4) == 0, "dtype %d: 0x%04x widens to %a", n, h, (double)wide[h]);
      if (isnan(expect)) continue;
      cr_assert_eq(back[h], h, "dtype %d: 0x%04x narrows back", n, h);
    }
  }
  float ties[5];
  uint16_t got[5];
  for (uint32_t h = 0; h < 0x7c00; h += 97) {
    const float base = kvq_f16_bits_to_f32(h);
    uint32_t b;
    memcpy(&b, &base, 4);
    for (int32_t delta = -2; delta <= 2; delta++) {
      const uint32_t probe = (b & 0xffffe000u) + 0x1000u + (uint32_t)delta;
      memcpy(&ties[delta + 2], &probe, 4);
    }
    cr_assert_eq(kvq_convert(ties, KVQ_DTYPE_F32, got, KVQ_DTYPE_F16, 5), KVQ_OK);
    for (int k = 0; k < 5; k++) cr_assert_eq(got[k], ref_f16(ties[k]), "near the tie above 0x%04x, probe %d", h, k - 2);
  }
  memset(back, 0xab, sizeof(uint16_t) * N);
  cr_assert_eq(kvq_convert(wide, (kvq_dtype)7, back, KVQ_DTYPE_F16, 4), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(kvq_convert(wide, KVQ_DTYPE_F32, back, (kvq_dtype)-1, 4), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(kvq_convert(NULL, KVQ_DTYPE_F32, back, KVQ_DTYPE_F16, 4), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(kvq_convert(wide, KVQ_DTYPE_F32, NULL, KVQ_DTYPE_F16, 4), KVQ_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(kvq_convert(NULL, KVQ_DTYPE_F32, NULL, KVQ_DTYPE_F16, 0), KVQ_OK, "nothing to convert");
  for (uint32_t i = 0; i < 4; i++) cr_assert_eq(back[i], 0xabab, "a refused conversion wrote element %u", i);
  free(bits), free(back), free(wide);
}

/* kvq_synth_generate (public) refuses what it cannot generate, with a status. */
Test(half, kvq_synth_generate_refuses_bad_configs) {
  float k[64];
  cr_assert_eq(kvq_synth_generate(NULL, k, NULL, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  kvq_synth_config c = kvq_synth_defaults(1, 1, 3, 16, 1);
  c.query_heads = 3, c.kv_heads = 2; /* not a multiple */
  cr_assert_eq(kvq_synth_generate(&c, NULL, NULL, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  c = kvq_synth_defaults(1, 1, 1, 16, 1);
  c.outliers = 17; /* more than head_dim */
  cr_assert_eq(kvq_synth_generate(&c, NULL, NULL, NULL), KVQ_ERROR_INVALID_ARGUMENT);
  c.outliers = 4;
  cr_assert_eq(kvq_synth_generate(&c, k, NULL, NULL), KVQ_OK);
}
