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
#ifndef KVQ_CORE_SYNTH_H
#define KVQ_CORE_SYNTH_H

#include <stdint.h>

typedef struct kvq_synth_config {
  uint32_t tokens;
  uint32_t kv_heads;
  uint32_t query_heads; /* a multiple of kv_heads */
  uint32_t head_dim;
  uint32_t outliers;    /* outlier channels per kv head (0 for none) */
  float outlier_min, outlier_max;
  float temperature;    /* query scale; 1 gives logits of standard deviation about 1-3 */
  uint64_t seed;
} kvq_synth_config;

/* The defaults: 4 outlier channels scaled 10-20x, temperature 1. */
kvq_synth_config kvq_synth_defaults(uint32_t tokens, uint32_t kv_heads, uint32_t query_heads, uint32_t head_dim,
                                    uint64_t seed);

/* Fills keys and values [tokens][kv_heads][head_dim] and queries [tokens][query_heads][head_dim]
 * (any of them may be NULL to skip storing it; the draws are the same). Returns 0, or -1 on bad
 * parameters or no memory. */
int kvq_synth_generate(const kvq_synth_config *config, float *keys, float *values, float *queries);

#endif
