#include "rng.h"

#include <math.h>

#include "detmath.h"

void kvq_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u; /* the key schedule: golden ratio and sqrt(3) - 1 */
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

void kvq_rng_init(kvq_rng *rng, uint64_t seed, uint32_t layer, uint32_t purpose) {
  rng->key[0] = (uint32_t)seed;
  rng->key[1] = (uint32_t)(seed >> 32);
  rng->layer = layer;
  rng->purpose = purpose;
  rng->next_block = 0;
  rng->used = 4;
  rng->has_spare = 0;
  rng->spare = 0.0;
}

uint32_t kvq_rng_u32(kvq_rng *rng) {
  if (rng->used == 4) {
    uint32_t counter[4] = {(uint32_t)rng->next_block, (uint32_t)(rng->next_block >> 32), rng->layer,
                           rng->purpose};
    kvq_philox4x32_10(counter, rng->key, rng->block);
    rng->next_block++;
    rng->used = 0;
  }
  return rng->block[rng->used++];
}

double kvq_rng_uniform(kvq_rng *rng) {
  uint32_t a = kvq_rng_u32(rng) >> 5;
  uint32_t b = kvq_rng_u32(rng) >> 6;
  return ((double)a * 67108864.0 + (double)b) * (1.0 / 9007199254740992.0);
}

double kvq_rng_gaussian(kvq_rng *rng) {
  if (rng->has_spare) {
    rng->has_spare = 0;
    return rng->spare;
  }
  double u, v, s;
  do {
    u = 2.0 * kvq_rng_uniform(rng) - 1.0;
    v = 2.0 * kvq_rng_uniform(rng) - 1.0;
    s = u * u + v * v;
  } while (!(s > 0.0 && s < 1.0));
  double f = sqrt(-2.0 * kvq_det_log(s) / s);
  rng->spare = v * f;
  rng->has_spare = 1;
  return u * f;
}
