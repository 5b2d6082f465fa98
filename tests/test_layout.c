/* Layouts and accounting: the sizes docs/FORMAT.md states, its worked example byte for byte, and
 * field offsets that never overlap for any valid configuration. */
#include <math.h>
#include <string.h>

#include "core/config.h"
#include "core/internal.h"
#include "core/layout.h"
#include "helpers.h"

static double key_bits(kvq_method_config keys, uint32_t d, uint32_t P) {
  kvq_layer_config layer = th_layer(1, 1, d, keys, kvq_method_defaults(KVQ_METHOD_EXACT, d));
  double k, v;
  cr_assert_eq(kvq_layer_bits_per_number(&layer, P, &k, &v), KVQ_OK);
  return k;
}

/* The numbers docs/FORMAT.md and README.md quote (d = 128, P = 32). */
Test(layout, documented_bits_per_number) {
  struct {
    kvq_method_config m;
    double bits;
  } cases[] = {
      {th_qjl(256, 8, 256), 4.28125}, {th_qjl(256, 0, 32), 2.125},  {th_qjl(512, 8, 256), 6.28125},
      {th_uniform(2, 32), 3.0},       {th_uniform(4, 32), 5.0},     {th_uniform(1, 32), 2.0},
      {th_uniform(3, 32), 4.21875},   {th_uniform(8, 32), 9.0},     {kvq_method_defaults(KVQ_METHOD_EXACT, 128), 16.0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double bits = key_bits(cases[i].m, 128, 32);
    cr_assert_eq(bits, cases[i].bits, "case %zu: %.6f bits, documented %.6f", i, bits, cases[i].bits);
  }
}

/* docs/FORMAT.md, "Worked example": the same bytes. */
Test(layout, worked_example_bytes) {
  kvq_method_config K = th_qjl(32, 1, 32), V = th_uniform(2, 16);
  kvq_layer_config layer = th_layer(1, 1, 16, K, V);
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 16, 0, 2, 1, 42);
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  uint32_t seq;
  KVQ_CHECK(ctx, kvq_sequence_add(cache, &seq));
  float k[3 * 16], v[3 * 16];
  for (int t = 0; t < 3; t++)
    for (int i = 0; i < 16; i++) {
      k[t * 16 + i] = (float)((i * 7 + t * 3) % 11 - 5) * 0.25f;
      v[t * 16 + i] = (float)((i * 5 + t) % 9 - 4) * 0.5f;
    }
  k[5] = 8.0f;
  k[16 + 5] = -6.0f;
  int64_t shape[3] = {3, 1, 16};
  kvq_tensor kt = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(v, KVQ_DTYPE_F32, 3, shape);
  KVQ_CHECK(ctx, kvq_append(cache, seq, 0, &kt, &vt));
  KVQ_CHECK(ctx, kvq_flush(cache, seq));
  uint8_t kp[208], vp[128];
  uint32_t pages;
  cr_assert_eq(cache->storage[0].side[0].layout.page_bytes, 208);
  cr_assert_eq(cache->storage[0].side[1].layout.page_bytes, 128);
  KVQ_CHECK(ctx, kvq_cache_read_pages(cache, seq, 0, 0, kp, &pages));
  KVQ_CHECK(ctx, kvq_cache_read_pages(cache, seq, 0, 1, vp, &pages));
  const uint8_t signs[12] = {0x08, 0xea, 0x0d, 0x53, 0xb9, 0xd6, 0x26, 0xb8, 0x56, 0x5d, 0xd5, 0x89};
  const uint8_t signs_out[12] = {0xc2, 0x66, 0xa8, 0xf7, 0x3d, 0x99, 0x57, 0x08, 0xc2, 0x66, 0xa8, 0xf7};
  const uint8_t norm_in[6] = {0x53, 0x42, 0x6c, 0x42, 0xfb, 0x41}, norm_out[6] = {0x00, 0x48, 0x00, 0x46, 0x00, 0x3a};
  cr_assert_eq(memcmp(kp, signs, 12), 0);
  cr_assert_eq(memcmp(kp + 64, signs_out, 12), 0);
  cr_assert_eq(memcmp(kp + 128, norm_in, 6), 0);
  cr_assert_eq(memcmp(kp + 160, norm_out, 6), 0);
  cr_assert_eq(kp[192], 5);
  for (int i = 0; i < 208; i++) {
    int documented = (i < 12) || (i >= 64 && i < 76) || (i >= 128 && i < 134) || (i >= 160 && i < 166) || i == 192;
    if (!documented) cr_assert_eq(kp[i], 0, "key byte %d", i);
  }
  const uint8_t codes[12] = {0x88, 0xdd, 0x22, 0x76, 0xd8, 0x2d, 0x62, 0xb7, 0xdd, 0x22, 0x76, 0x8b};
  const uint8_t params[12] = {0x55, 0x3d, 0x00, 0xc0, 0x55, 0x3d, 0x00, 0xc0, 0x55, 0x3d, 0x00, 0xc0};
  cr_assert_eq(memcmp(vp, codes, 12), 0);
  cr_assert_eq(memcmp(vp + 64, params, 12), 0);
  for (int i = 0; i < 128; i++)
    if (!(i < 12 || (i >= 64 && i < 76))) cr_assert_eq(vp[i], 0, "value byte %d", i);
  uint32_t s00;
  memcpy(&s00, cache->storage[0].fixed_host[0][0], 4);
  cr_assert_eq(s00, 0xbf2ba089u);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/* Every valid configuration: fields in order, inside the block, blocks 16-byte multiples. */
Test(layout, fields_never_overlap) {
  const uint32_t Ps[] = {16, 32, 64, 128, 256}, ds[] = {16, 48, 64, 80, 128, 256};
  for (int pi = 0; pi < 5; pi++)
    for (int di = 0; di < 6; di++) {
      const uint32_t P = Ps[pi], d = ds[di];
      for (uint32_t m = 32; m <= 1024; m += 96)
        for (uint32_t k = 0; k <= 32 && k < d; k += 4)
          for (uint32_t mo = 32; mo <= 256; mo += 224) {
            uint32_t prev = 0;
            uint32_t offs[] = {kvq_qjl_signs_out_offset(P, m), kvq_qjl_norm_in_offset(P, m, mo, k),
                               kvq_qjl_norm_out_offset(P, m, mo, k), kvq_qjl_outliers_offset(P, m, mo, k),
                               kvq_qjl_head_bytes(P, m, mo, k)};
            for (int i = 0; i < 5; i++) {
              cr_assert_geq(offs[i], prev);
              cr_assert_eq(offs[i] % 4, 0);
              prev = offs[i];
            }
            cr_assert_eq(offs[1], P * m / 8 + (k ? P * mo / 8 : 0));
            cr_assert_geq(offs[4], offs[3] + k);
            cr_assert_eq(offs[4] % 16, 0);
          }
      const uint32_t bs[] = {1, 2, 3, 4, 8};
      for (int b = 0; b < 5; b++)
        for (uint32_t G = 4; G <= d; G *= 2) {
          if (d % G) continue;
          const uint32_t cpw = 32 / bs[b];
          cr_assert_geq(kvq_uniform_code_words(P, d, bs[b]) * cpw, P * d);
          cr_assert_lt((kvq_uniform_code_words(P, d, bs[b]) - 1) * cpw, P * d);
          cr_assert_eq(kvq_uniform_head_bytes(P, d, bs[b], G) % 16, 0);
          cr_assert_geq(kvq_uniform_head_bytes(P, d, bs[b], G), kvq_uniform_params_offset(P, d, bs[b]) + P * (d / G) * 4);
        }
      for (uint32_t dt = 0; dt < 3; dt++) cr_assert_eq(kvq_exact_head_bytes(P, d, dt), P * d * (dt == 0 ? 4 : 2));
    }
}

/* The memory report and the configuration bound tell the truth about what a cache holds. */
Test(layout, memory_report) {
  kvq_layer_config layers[2] = {th_layer(8, 2, 128, th_qjl(256, 8, 256), th_uniform(2, 32)),
                                th_layer(4, 4, 64, kvq_method_defaults(KVQ_METHOD_EXACT, 64), th_uniform(4, 16))};
  kvq_cache_config config = th_config(layers, 2, KVQ_DTYPE_F16, 32, 32, 10, 3, 1);
  kvq_context *ctx = th_cpu_context();
  kvq_cache *cache;
  KVQ_CHECK(ctx, kvq_cache_create(ctx, &config, &cache));
  kvq_memory_report r;
  KVQ_CHECK(ctx, kvq_cache_memory(cache, &r));
  const uint64_t k0 = 2 * kvq_qjl_head_bytes(32, 256, 256, 8), v0 = 2 * kvq_uniform_head_bytes(32, 128, 2, 32);
  const uint64_t k1 = 4 * kvq_exact_head_bytes(32, 64, KVQ_LAYOUT_F16), v1 = 4 * kvq_uniform_head_bytes(32, 64, 4, 16);
  cr_assert_eq(r.page_bytes, k0 + v0 + k1 + v1);
  cr_assert_eq(r.pages_bytes_total, 10 * r.page_bytes);
  cr_assert_eq(r.pages_used, 0);
  cr_assert_eq(r.fixed_bytes, (256 + 256) * 128 * 4, "the QJL matrices of layer 0");
  cr_assert_eq(r.window_bytes_total, 2 * 3 * 64 * (2 * 128 + 4 * 64) * 2, "K and V rings of R + P tokens per slot");
  const double numbers0 = 32.0 * 2 * 128, numbers1 = 32.0 * 4 * 64;
  cr_assert(fabs(r.key_bits_per_number - (k0 + k1) * 8.0 / (numbers0 + numbers1)) < 1e-12);
  cr_assert(fabs(r.value_bits_per_number - (v0 + v1) * 8.0 / (numbers0 + numbers1)) < 1e-12);
  uint64_t bound;
  KVQ_CHECK(ctx, kvq_cache_config_bytes(&config, &bound));
  cr_assert_geq(bound, r.pages_bytes_total + r.window_bytes_total + r.fixed_bytes);
  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
}

/* kvq_method_defaults gives a configuration kvq accepts for every valid head_dim. */
Test(layout, defaults_valid_for_every_head_dim) {
  const kvq_method keys[] = {KVQ_METHOD_EXACT, KVQ_METHOD_QJL, KVQ_METHOD_UNIFORM};
  for (uint32_t d = 16; d <= 256; d += 16)
    for (int k = 0; k < 3; k++) {
      kvq_layer_config layer = th_layer(2, 1, d, kvq_method_defaults(keys[k], d), kvq_method_defaults(KVQ_METHOD_UNIFORM, d));
      kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F16, 32, 0, 4, 1, 1);
      char why[256];
      cr_assert_eq(kvq_cache_config_check(&config, why, sizeof why), KVQ_OK, "head_dim %u, keys %d: %s", d, k, why);
    }
}
