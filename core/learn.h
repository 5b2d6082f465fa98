/* Codebook learning (kvq_codebooks_learn) and the k-means driver it uses (exposed for tests). */
#ifndef KVQ_CORE_LEARN_H
#define KVQ_CORE_LEARN_H

#include "internal.h"
#include "rng.h"

/* `problems` independent k-means problems of the same size on host data. */
typedef struct kvq_kmeans_set {
  uint32_t problems, points, dims, clusters;
  uint32_t iterations;   /* Lloyd iterations at most (each: assign, then update) */
  const float *data;     /* [problems][points][dims] */
  const float *weights;  /* [points] or NULL */
} kvq_kmeans_set;

/* k-means++ seeding from rng, then Lloyd iterations on ctx's backend until no assignment changes
 * or `iterations` updates were made. centroids receives [problems][clusters][dims]. With objective
 * (iterations + 1 doubles), objective[i] is the weighted sum of squared distances after the i-th
 * assignment; *steps (if not NULL) the number of updates made. */
kvq_status kvq_kmeans(kvq_context *ctx, kvq_rng *rng, const kvq_kmeans_set *set, float *centroids, double *objective,
                      uint32_t *steps);

#endif
