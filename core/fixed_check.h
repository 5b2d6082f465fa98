/* Checks that a fixed array read from a file (a matrix or a codebook) is one kvq could have
 * written: finiteness is checked by the loader; this adds what each kind implies. */
#ifndef KVQ_CORE_FIXED_CHECK_H
#define KVQ_CORE_FIXED_CHECK_H

#include <stddef.h>

#include "config.h"

/* 0, or -1 with a reason, for a learned array (random matrices and offline tables are compared with
 * the ones the seed and the config give, by the loader): learned PolarQuant tables hold unit (cos, sin)
 * centroids, level 1 no boundaries, levels >= 2 ascending centroids in [0, pi/2] with (cos^2, sin^2)
 * boundaries in between and the last pair zero; learned arrays not yet learned are zero. CQ centroids
 * are taken as saved (their SHA-256 and finiteness are checked by the loader). */
int kvq_fixed_check(const kvq_side_layout *layout, int index, const float *data, int ready, char *why, size_t why_size);

#endif
