/*
 * Learning codebooks from calibration data (kvq_codebooks_learn): k-means++ seeding on the host from
 * the cache's seed, then Lloyd iterations as backend jobs (KMEANS_ASSIGN, KMEANS_UPDATE) until no
 * assignment changes or the iteration budget is spent.
 *   PolarQuant (online codebooks): per kv head and level, 1-D k-means on the angles of the rotated
 *   calibration tokens (computed in double on the host; learned codebooks need not agree between
 *   platforms, only the codes computed with them do).
 *   CQ: per kv head and channel group, k-means on the c-dimensional group vectors.
 */
#include "learn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "codebook.h"
#include "fwht.h"
#include "layout.h"
#include "memory_limits.h"
#include "rng.h"
#include "tensor.h"

#define POLAR_ITERATIONS 100u

static double distance2(const float *a, const float *b, uint32_t dims) {
  double sum = 0.0;
  for (uint32_t i = 0; i < dims; i++) sum += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
  return sum;
}

/* k-means++: the first centroid drawn in proportion to the weights, each next one in proportion to
 * weight times squared distance to the nearest chosen; when every point coincides with a chosen
 * centroid (fewer distinct points than clusters), points are taken in turn. */
static int seed_problem(kvq_rng *rng, const float *data, const float *weights, uint32_t points, uint32_t dims,
                        uint32_t clusters, float *centroids) {
  double *nearest = malloc(sizeof(double) * points);
  if (!nearest) return -1;
  double total = 0.0;
  for (uint32_t t = 0; t < points; t++) total += weights ? weights[t] : 1.0;
  for (uint32_t k = 0; k < clusters; k++) {
    uint32_t pick = k % points;
    if (total > 0.0) {
      double target = kvq_rng_uniform(rng) * total, run = 0.0;
      for (uint32_t t = 0; t < points; t++) {
        run += (weights ? weights[t] : 1.0) * (k == 0 ? 1.0 : nearest[t]);
        pick = t;
        if (run > target) break;
      }
    }
    memcpy(centroids + (size_t)k * dims, data + (size_t)pick * dims, sizeof(float) * dims);
    total = 0.0;
    for (uint32_t t = 0; t < points; t++) {
      const double d2 = distance2(data + (size_t)t * dims, centroids + (size_t)k * dims, dims);
      if (k == 0 || d2 < nearest[t]) nearest[t] = d2;
      total += (weights ? weights[t] : 1.0) * nearest[t];
    }
  }
  free(nearest);
  return 0;
}

kvq_status kvq_kmeans(kvq_context *ctx, kvq_rng *rng, const kvq_kmeans_set *set, float *centroids, double *objective,
                      uint32_t *steps) {
  kvq_backend *be = ctx->backend;
  const uint64_t pts = (uint64_t)set->problems * set->points;
  const uint64_t cents = (uint64_t)set->problems * set->clusters * set->dims;
  for (uint32_t p = 0; p < set->problems; p++)
    if (seed_problem(rng, set->data + (uint64_t)p * set->points * set->dims, set->weights, set->points, set->dims,
                     set->clusters, centroids + (uint64_t)p * set->clusters * set->dims) != 0)
      return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_learn: out of host memory");
  kvq_buffer *data = NULL, *weights = NULL, *cb = NULL, *assignment = NULL, *distance = NULL;
  uint32_t *assigned = malloc(sizeof(uint32_t) * pts), *previous = malloc(sizeof(uint32_t) * pts);
  float *dist = objective ? malloc(sizeof(float) * pts) : NULL;
  if (!assigned || !previous || (objective && !dist)) {
    free(assigned), free(previous), free(dist);
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_learn: out of host memory");
  }
  /* from here on every failure is the backend's */
  kvq_status st = be->ops->buffer_create(be, pts * set->dims * 4, &data);
  if (st == KVQ_OK && set->weights) st = be->ops->buffer_create(be, (uint64_t)set->points * 4, &weights);
  if (st == KVQ_OK) st = be->ops->buffer_create(be, cents * 4, &cb);
  if (st == KVQ_OK) st = be->ops->buffer_create(be, pts * 4, &assignment);
  /* the distances only where the objective is wanted: each step then reads back the assignment alone */
  if (st == KVQ_OK && objective) st = be->ops->buffer_create(be, pts * 4, &distance);
  if (st == KVQ_OK) st = be->ops->buffer_write(be, data, 0, set->data, pts * set->dims * 4);
  if (st == KVQ_OK && weights) st = be->ops->buffer_write(be, weights, 0, set->weights, (uint64_t)set->points * 4);
  if (st == KVQ_OK) st = be->ops->buffer_write(be, cb, 0, centroids, cents * 4);
  kvq_job_kmeans job = {set->problems, set->points, set->dims, set->clusters, data, weights, cb, assignment, distance};
  uint32_t step = 0;
  for (;; step++) {
    if (st == KVQ_OK) st = be->ops->kmeans_assign(be, &job);
    if (st == KVQ_OK) st = be->ops->buffer_read(be, assignment, 0, assigned, pts * 4);
    if (st == KVQ_OK && objective) st = be->ops->buffer_read(be, distance, 0, dist, pts * 4);
    if (st != KVQ_OK) break;
    if (objective) {
      double sum = 0.0;
      for (uint64_t i = 0; i < pts; i++) sum += (set->weights ? set->weights[i % set->points] : 1.0) * dist[i];
      objective[step] = sum;
    }
    if ((step > 0 && memcmp(assigned, previous, sizeof(uint32_t) * pts) == 0) || step == set->iterations) break;
    memcpy(previous, assigned, sizeof(uint32_t) * pts);
    if ((st = be->ops->kmeans_update(be, &job)) != KVQ_OK) break;
  }
  if (st == KVQ_OK) st = be->ops->buffer_read(be, cb, 0, centroids, cents * 4);
  if (st != KVQ_OK) st = kvq_fail_backend(ctx, st, "learning codebooks");
  if (steps) *steps = step;
  kvq_buffer *buffers[5] = {data, weights, cb, assignment, distance};
  for (int i = 0; i < 5; i++)
    if (buffers[i]) be->ops->buffer_destroy(be, buffers[i]);
  free(assigned), free(previous), free(dist);
  return st;
}

/* ---- PolarQuant angles --------------------------------------------------------------------------- */

KVQ_DEFINE_FWHT(fwht_f64, double)

/* y = R x in double, with the cache's fp32 rotation (dense matrix or Hadamard signs). */
static void rotate_double(const kvq_side_layout *s, const float *R, const float *x, double *y) {
  const uint32_t d = s->head_dim;
  if (s->rotation == KVQ_ROTATION_DENSE) {
    for (uint32_t i = 0; i < d; i++) {
      double sum = 0.0;
      for (uint32_t c = 0; c < d; c++) sum += (double)R[(size_t)i * d + c] * x[c];
      y[i] = sum;
    }
    return;
  }
  for (uint32_t c = 0; c < d; c++) y[c] = (double)R[c] * x[c];
  fwht_f64(y, d);
  for (uint32_t c = 0; c < d; c++) y[c] /= sqrt((double)d);
}

static int by_value(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Learns every level's table for every kv head into tables (kv_heads x table floats). */
static kvq_status learn_polar(kvq_cache *cache, uint32_t layer, int side, const float *x, uint32_t tokens,
                              const float *weights, kvq_rng *rng, float *tables) {
  kvq_context *ctx = cache->ctx;
  const kvq_side_layout *s = &cache->storage[layer].side[side].layout;
  const float *R = cache->storage[layer].fixed_host[side][0];
  const uint32_t d = s->head_dim, H = s->kv_heads, L = s->levels;
  const uint32_t table_floats = kvq_polar_table_floats(L, s->level_bits);
  double *y = malloc(sizeof(double) * d * 2), *r = y + d;
  float *angles = malloc(sizeof(float) * (size_t)H * tokens * (d / 2));
  float *point_weights = weights ? malloc(sizeof(float) * (size_t)tokens * (d / 2)) : NULL;
  float *centroids = malloc(sizeof(float) * (size_t)H << KVQ_MAX_POLAR_BITS);
  kvq_status st = KVQ_OK;
  if (!y || !angles || (weights && !point_weights) || !centroids)
    st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_learn: out of host memory");
  for (uint32_t l = 1; l <= L && st == KVQ_OK; l++) {
    const uint32_t per_token = d >> l, bits = kvq_polar_level_bits(s->level_bits, l), K = 1u << bits;
    for (uint32_t h = 0; h < H; h++)
      for (uint32_t t = 0; t < tokens; t++) {
        rotate_double(s, R, x + ((size_t)t * H + h) * d, y);
        /* radii of level l - 1, then this level's angles */
        for (uint32_t c = 0; c < d; c++) r[c] = y[c];
        for (uint32_t level = 1; level < l; level++)
          for (uint32_t a = 0; a < (d >> level); a++) r[a] = sqrt(r[2 * a] * r[2 * a] + r[2 * a + 1] * r[2 * a + 1]);
        float *out = angles + ((size_t)h * tokens + t) * per_token;
        for (uint32_t a = 0; a < per_token; a++) {
          double angle = l == 1 ? atan2(r[2 * a + 1], r[2 * a]) : atan2(fabs(r[2 * a + 1]), fabs(r[2 * a]));
          if (angle < 0) angle += 2 * 3.14159265358979323846;
          out[a] = (float)angle;
        }
      }
    if (weights)
      for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t a = 0; a < per_token; a++) point_weights[(size_t)t * per_token + a] = weights[t];
    kvq_kmeans_set set = {H, tokens * per_token, 1, K, POLAR_ITERATIONS, angles, point_weights};
    st = kvq_kmeans(ctx, rng, &set, centroids, NULL, NULL);
    for (uint32_t h = 0; h < H && st == KVQ_OK; h++) {
      double c[1u << KVQ_MAX_POLAR_BITS];
      qsort(centroids + (size_t)h * K, K, sizeof(float), by_value);
      for (uint32_t j = 0; j < K; j++) c[j] = centroids[(size_t)h * K + j];
      kvq_polar_fill_level(l, bits, c, tables + (size_t)h * table_floats + kvq_polar_table_level_offset(s->level_bits, l));
    }
  }
  free(y), free(angles), free(point_weights), free(centroids);
  return st;
}

/* ---- CQ --------------------------------------------------------------------------------------- */

static kvq_status learn_cq(kvq_cache *cache, uint32_t layer, int side, const float *x, uint32_t tokens,
                           const float *weights, kvq_rng *rng, float *centroids) {
  const kvq_side_layout *s = &cache->storage[layer].side[side].layout;
  const uint32_t d = s->head_dim, H = s->kv_heads, c = s->channels, groups = d / c;
  float *data = malloc(sizeof(float) * (size_t)H * groups * tokens * c);
  if (!data) return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_learn: out of host memory");
  /* problem (h, g): the group's c channels of every token, in token order */
  for (uint32_t h = 0; h < H; h++)
    for (uint32_t g = 0; g < groups; g++)
      for (uint32_t t = 0; t < tokens; t++)
        memcpy(data + (((size_t)h * groups + g) * tokens + t) * c, x + ((size_t)t * H + h) * d + g * c, sizeof(float) * c);
  kvq_kmeans_set set = {H * groups, tokens, c, 1u << s->code_bits, s->iterations, data, weights};
  kvq_status st = kvq_kmeans(cache->ctx, rng, &set, centroids, NULL, NULL);
  free(data);
  return st;
}

/* ---- The API -------------------------------------------------------------------------------------- */

static kvq_status learn_call(kvq_cache *cache, uint32_t layer, const kvq_tensor *keys, const kvq_tensor *values,
                             const float *weights) {
  kvq_context *ctx = cache->ctx;
  if (layer >= cache->config.layer_count)
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE, "kvq_codebooks_learn: layer %u, the cache has %u layers", layer,
                    cache->config.layer_count);
  kvq_layer_storage *ls = &cache->storage[layer];
  const kvq_tensor *tensors[2] = {keys, values};
  int needs[2], any = 0;
  for (int s = 0; s < 2; s++) any |= needs[s] = kvq_side_needs_learning(&ls->side[s].layout);
  if (!any)
    return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_learn: layer %u's methods use no learned codebooks", layer);
  for (uint32_t i = 0; i < cache->config.max_sequences; i++)
    if (cache->seqs[i].live && cache->seqs[i].layers[layer].tokens > 0)
      return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT,
                      "kvq_codebooks_learn: layer %u holds tokens coded with its current codebooks; free those sequences first",
                      layer);
  const int64_t expect[3] = {-1, ls->config.kv_heads, ls->config.head_dim};
  int64_t tokens = -1;
  kvq_status st;
  for (int s = 0; s < 2; s++) {
    if (!needs[s]) continue;
    if (!tensors[s])
      return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_learn: layer %u's %s need calibration data", layer,
                      s ? "values" : "keys");
    if ((st = kvq_tensor_check(ctx, tensors[s], s ? "kvq_codebooks_learn values" : "kvq_codebooks_learn keys", expect)) != KVQ_OK)
      return st;
    if (tokens >= 0 && tensors[s]->shape[0] != tokens)
      return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_codebooks_learn: keys and values hold different token counts");
    tokens = tensors[s]->shape[0];
  }
  if (tokens > (1 << 24))
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE, "kvq_codebooks_learn: %lld calibration tokens, at most 2^24", (long long)tokens);
  if (weights) {
    double total = 0.0;
    for (int64_t t = 0; t < tokens; t++) {
      /* NaN and infinities are non-finite input; a finite negative weight is out of the documented range */
      if (!isfinite(weights[t]) || weights[t] < 0.0f)
        return kvq_fail(ctx, isfinite(weights[t]) ? KVQ_ERROR_OUT_OF_RANGE : KVQ_ERROR_NON_FINITE,
                        "kvq_codebooks_learn: weight %lld is %g, need finite and >= 0", (long long)t,
                        (double)weights[t]);
      total += weights[t];
    }
    if (!(total > 0.0)) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE, "kvq_codebooks_learn: the weights sum to 0");
  }
  /* the calibration tokens in fp32, the learner's copy of them and its device copy (core/learn.c
   * above): three times the tokens, at most */
  const uint64_t token_floats = (uint64_t)ls->config.kv_heads * ls->config.head_dim;
  if ((st = kvq_call_fits(ctx, kvq_size_mul3(3, kvq_size_mul((uint64_t)tokens, token_floats), sizeof(float)),
                          "kvq_codebooks_learn")) != KVQ_OK)
    return st;
  /* learn into fresh arrays; the cache changes only when every side succeeded */
  float *learned[2] = {NULL, NULL}, *x = NULL;
  for (int s = 0; s < 2 && st == KVQ_OK; s++) {
    if (!needs[s]) continue;
    const uint64_t count = (uint64_t)tokens * ls->config.kv_heads * ls->config.head_dim;
    x = malloc(sizeof(float) * count);
    learned[s] = calloc((size_t)kvq_side_fixed_floats(&ls->side[s].layout, 1), sizeof(float));
    if (!x || !learned[s]) {
      st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_codebooks_learn: out of host memory");
      break;
    }
    if ((st = kvq_tensor_read(ctx, tensors[s], x, KVQ_DTYPE_F32)) != KVQ_OK) break;
    for (uint64_t i = 0; i < count && st == KVQ_OK; i++)
      if (!isfinite(x[i])) st = kvq_fail(ctx, KVQ_ERROR_NON_FINITE, "kvq_codebooks_learn: calibration %s hold %g",
                                         s ? "values" : "keys", (double)x[i]);
    kvq_rng rng;
    kvq_rng_init(&rng, cache->config.seed, layer, s ? KVQ_PURPOSE_KMEANS_VALUES : KVQ_PURPOSE_KMEANS_KEYS);
    if (st == KVQ_OK)
      st = ls->side[s].layout.method == KVQ_LAYOUT_POLAR
               ? learn_polar(cache, layer, s, x, (uint32_t)tokens, weights, &rng, learned[s])
               : learn_cq(cache, layer, s, x, (uint32_t)tokens, weights, &rng, learned[s]);
    free(x);
    x = NULL;
  }
  free(x); /* the side whose arrays were not both allocated */
  kvq_backend *be = ctx->backend;
  for (int s = 0; s < 2 && st == KVQ_OK; s++) {
    if (!needs[s]) continue;
    const uint64_t floats = kvq_side_fixed_floats(&ls->side[s].layout, 1);
    st = be->ops->buffer_write(be, ls->side[s].fixed[1], 0, learned[s], floats * 4);
    if (st != KVQ_OK) st = kvq_fail_backend(ctx, st, "uploading codebooks");
  }
  /* the uploads done before the host copy and the flags say so: a failure changes nothing (the
   * device copy of a layer that learns is read only once it is marked learned) */
  if (st == KVQ_OK) st = kvq_call_settle(ctx, 1, "kvq_codebooks_learn: uploading codebooks");
  for (int s = 0; s < 2 && st == KVQ_OK; s++) {
    if (!needs[s]) continue;
    memcpy(ls->fixed_host[s][1], learned[s], kvq_side_fixed_floats(&ls->side[s].layout, 1) * 4);
    ls->learned[s] = 1;
  }
  free(learned[0]), free(learned[1]);
  if (st == KVQ_OK) kvq_clear_error(ctx);
  return st;
}

kvq_status kvq_codebooks_learn(kvq_cache *cache, uint32_t layer, const kvq_tensor *keys, const kvq_tensor *values,
                               const float *weights) {
  if (!cache) return KVQ_ERROR_INVALID_ARGUMENT;
  /* a deferred call: each k-means step's jobs go with the read of its assignment, one submission
   * per step (docs/VULKAN.md); always waited for, since the codebooks are the cache's afterwards */
  kvq_call_begin(cache->ctx);
  return kvq_call_end_waiting(cache->ctx, learn_call(cache, layer, keys, values, weights));
}
