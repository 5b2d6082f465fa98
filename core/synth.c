/*
 * Synthetic LLM-like keys, values and queries (docs/EVAL.md documents the model), reproducible from
 * a seed through kvq's own generator, so tests and `kvq eval` see the same data everywhere.
 *
 * Per kv head h (stream: seed, layer = h, purpose KVQ_PURPOSE_SYNTHETIC):
 *   - `outliers` distinct channels are outlier channels, each with a scale s_c uniform in
 *     [outlier_min, outlier_max]; every other channel has s_c = 1 (the persistent large key channels
 *     the QJL and KIVI papers report);
 *   - a per-channel mean mu_c = 0.5 * s_c * g;
 *   - key      k[t][c] = mu_c + s_c * g
 *   - value    v[t][c] = g                                   (values have no channel outliers)
 *   - query of query head j in h's group: q[t][c] = temperature * (0.5 * k[a][c] / s_c + g), where a
 *     is a uniformly drawn earlier-or-equal token (so that attention has a few peaks, not noise),
 * with g a fresh standard Gaussian each time, drawn in the order the loops above list them:
 * channels' outlier choice and scales, then means, then for t = 0.. : keys, values, queries.
 */
#include <kvq/kvq.h>

#include <stdlib.h>

#include "rng.h"

kvq_synth_config kvq_synth_defaults(uint32_t tokens, uint32_t kv_heads, uint32_t query_heads, uint32_t head_dim,
                                    uint64_t seed) {
  return (kvq_synth_config){.tokens = tokens, .kv_heads = kv_heads, .query_heads = query_heads, .head_dim = head_dim,
                            .outliers = 4, .outlier_min = 10.0f, .outlier_max = 20.0f, .temperature = 1.0f,
                            .seed = seed};
}

kvq_status kvq_synth_generate(const kvq_synth_config *c, float *keys, float *values, float *queries) {
  if (!c) return KVQ_ERROR_INVALID_ARGUMENT;
  const uint32_t d = c->head_dim, group = c->kv_heads ? c->query_heads / c->kv_heads : 0;
  if (!d || !c->kv_heads || !group || c->query_heads % c->kv_heads || c->outliers > d) return KVQ_ERROR_INVALID_ARGUMENT;
  float *scale = malloc(sizeof(float) * d);
  float *mean = malloc(sizeof(float) * d);
  float *k = malloc(sizeof(float) * (size_t)c->tokens * d); /* this head's keys, for the queries */
  if (!scale || !mean || !k) {
    free(scale);
    free(mean);
    free(k);
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  for (uint32_t h = 0; h < c->kv_heads; h++) {
    kvq_rng rng;
    kvq_rng_init(&rng, c->seed, h, KVQ_PURPOSE_SYNTHETIC);
    for (uint32_t ch = 0; ch < d; ch++) scale[ch] = 1.0f;
    for (uint32_t j = 0; j < c->outliers; j++) {
      uint32_t ch;
      do ch = kvq_rng_u32(&rng) % d;
      while (scale[ch] != 1.0f);
      scale[ch] = (float)(c->outlier_min + (c->outlier_max - c->outlier_min) * kvq_rng_uniform(&rng));
    }
    for (uint32_t ch = 0; ch < d; ch++) mean[ch] = (float)(0.5 * scale[ch] * kvq_rng_gaussian(&rng));
    for (uint32_t t = 0; t < c->tokens; t++) {
      for (uint32_t ch = 0; ch < d; ch++) k[(size_t)t * d + ch] = (float)(mean[ch] + scale[ch] * kvq_rng_gaussian(&rng));
      for (uint32_t ch = 0; ch < d; ch++) {
        float v = (float)kvq_rng_gaussian(&rng);
        if (values) values[((size_t)t * c->kv_heads + h) * d + ch] = v;
      }
      for (uint32_t j = 0; j < group; j++) {
        uint32_t a = kvq_rng_u32(&rng) % (t + 1);
        for (uint32_t ch = 0; ch < d; ch++) {
          float q = (float)(c->temperature * (0.5 * k[(size_t)a * d + ch] / scale[ch] + kvq_rng_gaussian(&rng)));
          if (queries) queries[((size_t)t * c->query_heads + h * group + j) * d + ch] = q;
        }
      }
      if (keys)
        for (uint32_t ch = 0; ch < d; ch++) keys[((size_t)t * c->kv_heads + h) * d + ch] = k[(size_t)t * d + ch];
    }
  }
  free(scale);
  free(mean);
  free(k);
  return 0;
}
