/*
 * Codebooks: PolarQuant's angle tables (offline Lloyd-Max on the analytic densities, or learned),
 * and the k-means machinery that learns them and CQ's centroids from calibration data
 * (kvq_codebooks_learn, core/learn.c).
 */
#ifndef KVQ_CORE_CODEBOOK_H
#define KVQ_CORE_CODEBOOK_H

#include <stdint.h>

/* Lloyd-Max centroids (ascending, radians) of the angle at PolarQuant level `level` for 2^bits
 * levels, from its density after a random rotation (docs/FORMAT.md, polarquant-math.md):
 * level 1 uniform on [0, 2 pi) (centroids (j + 1/2) 2 pi / K); level l >= 2 on [0, pi/2] with density
 * proportional to sin(2 psi)^(2^(l-1) - 1). Deterministic: kvq's own sin, cumulative trapezoid
 * moments on 65536 cells (linear between them), Lloyd iterations from evenly spaced centroids until
 * none moves by 1e-12 (at most 200000). */
int kvq_polar_lloyd_max(uint32_t level, uint32_t bits, double *centroids);

/* Fills one level's table (4 * 2^bits floats, layout.h) from ascending centroids (radians):
 * centroid (cos, sin) pairs, then for level >= 2 the (cos^2, sin^2) of the midpoints between
 * consecutive centroids. */
void kvq_polar_fill_level(uint32_t level, uint32_t bits, const double *centroids, float *table);

/* The offline tables of a side: every level of kvq_polar_table_floats(levels, level_bits). */
int kvq_polar_offline_tables(uint32_t levels, uint32_t level_bits, float *tables);

#endif
