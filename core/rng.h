/*
 * kvq's random numbers: Philox4x32-10 (Salmon et al., SC'11), a counter-based generator, so that any
 * implementation reproduces every draw from (seed, layer, purpose, index) alone.
 *
 * Stream (seed, layer, purpose): key = (seed low 32 bits, seed high 32 bits); block b of the stream
 * is Philox4x32-10(counter = (b low 32, b high 32, layer, purpose), key), four uint32 words, used
 * in order x0, x1, x2, x3. Word w of the stream is word w % 4 of block w / 4.
 *
 * Uniform double: two consecutive words a, b -> ((a >> 5) * 2^26 + (b >> 6)) * 2^-53, in [0, 1).
 * Gaussian: Marsaglia's polar method on uniforms u = 2U - 1, v = 2U' - 1 (U drawn before U'):
 * s = u*u + v*v, rejected unless 0 < s < 1, then f = sqrt(-2 * kvq_det_log(s) / s) and the pair
 * (u * f, v * f) is returned in that order (the second is kept for the next call).
 * Everything is computed in IEEE double with the operations in exactly this order.
 */
#ifndef KVQ_CORE_RNG_H
#define KVQ_CORE_RNG_H

#include <stdint.h>

/* Purposes of random streams (part of the file format: never renumber). */
enum kvq_rng_purpose {
  KVQ_PURPOSE_QJL_SKETCH = 1,         /* S, the m x d inlier sketch of a layer */
  KVQ_PURPOSE_QJL_OUTLIER_SKETCH = 2, /* S_o, the m_o x d outlier sketch of a layer */
  KVQ_PURPOSE_POLAR_ROTATION = 3,     /* PolarQuant's dense d x d rotation of a layer */
  KVQ_PURPOSE_POLAR_SIGNS = 4,        /* PolarQuant's Hadamard signs of a layer */
  KVQ_PURPOSE_KMEANS_KEYS = 5,        /* k-means++ seeding of a layer's key codebooks */
  KVQ_PURPOSE_KMEANS_VALUES = 6,      /* k-means++ seeding of a layer's value codebooks */
  KVQ_PURPOSE_SYNTHETIC = 100,        /* the synthetic LLM-like data generator (core/synth.c) */
  KVQ_PURPOSE_TEST = 200              /* tests' own draws */
};

void kvq_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

typedef struct kvq_rng {
  uint32_t key[2];
  uint32_t layer, purpose;
  uint64_t next_block;
  uint32_t block[4];
  unsigned used; /* words of `block` already consumed (4 = none left) */
  int has_spare;
  double spare;
} kvq_rng;

void kvq_rng_init(kvq_rng *rng, uint64_t seed, uint32_t layer, uint32_t purpose);
uint32_t kvq_rng_u32(kvq_rng *rng);
double kvq_rng_uniform(kvq_rng *rng);
double kvq_rng_gaussian(kvq_rng *rng);

#endif
