/*
 * k-means jobs on Vulkan, for codebook learning (core/learn.c): KMEANS_ASSIGN and KMEANS_UPDATE.
 * shaders/kmeans_assign.comp and shaders/kmeans_update.comp say which buffer goes to which binding;
 * the job's sizes go into the metadata buffer (shaders/kmeans.glsl).
 *
 * For the loop limit (docs/VULKAN.md) a job runs as several dispatches, each over a range of the
 * clusters (ASSIGN) or of the points (UPDATE) that keeps an invocation near LOOP_BUDGET trips; the
 * shaders carry their state from one range to the next, so the ranges change no result.
 */
#include <stdio.h>

#include "vk.h"

#define LOOP_BUDGET 32768u /* about half of the loop limit: room for the shaders' other loops */

/* a * b * c, or UINT64_MAX when a * b alone exceeds 32 bits (the product cannot overflow then). */
static uint64_t product(uint32_t a, uint32_t b, uint32_t c) {
  const uint64_t ab = (uint64_t)a * b;
  return ab > UINT32_MAX ? UINT64_MAX : ab * c;
}

/* Every array lies in its buffer and every index the shaders compute fits their 32 bits; then the
 * sizes go to the metadata buffer (*base: their word offset). */
static kvq_status prepare(vk_backend *b, const kvq_job_kmeans *job, uint32_t *base) {
  const uint64_t points = product(job->problems, job->points, 1), values = product(job->problems, job->points, job->dims);
  const uint64_t centroid_values = product(job->problems, job->clusters, job->dims);
  if (points > UINT32_MAX || values > UINT32_MAX || centroid_values > UINT32_MAX)
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED,
                        "a k-means job of more than 2^32 values is larger than kvq's shaders index");
  if (job->dims > LOOP_BUDGET / 2)
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "k-means points of more than 16384 dims are beyond kvq's shaders");
  kvq_status st = kvq_vk_check_range(b, job->data, 0, values * 4, "the k-means points");
  if (st == KVQ_OK) st = kvq_vk_check_range(b, job->centroids, 0, centroid_values * 4, "the k-means centroids");
  if (st == KVQ_OK) st = kvq_vk_check_range(b, job->assignment, 0, points * 4, "the k-means assignment");
  if (st == KVQ_OK && job->weights) st = kvq_vk_check_range(b, job->weights, 0, (uint64_t)job->points * 4, "the k-means weights");
  if (st == KVQ_OK && job->distance) st = kvq_vk_check_range(b, job->distance, 0, points * 4, "the k-means distances");
  const uint32_t sizes[4] = {job->problems, job->points, job->dims, job->clusters};
  if (st == KVQ_OK) st = kvq_vk_metadata(b, sizes, sizeof sizes, base);
  return st;
}

/* One dispatch per range of `per_range` of the `total` clusters or points (at least one range), then
 * the submission. */
static kvq_status run_ranges(vk_backend *b, kvq_vk_shader shader, kvq_push *push, kvq_buffer *const buffers[KVQ_VK_BINDINGS],
                             uint64_t invocations, uint32_t total, uint32_t per_range) {
  kvq_status st = KVQ_OK;
  uint32_t first = 0;
  do {
    push->range_first = first;
    push->count = total - first < per_range ? total - first : per_range;
    st = kvq_vk_dispatch(b, shader, push, buffers, invocations);
    first += push->count;
  } while (st == KVQ_OK && first < total);
  return kvq_vk_done(b, st);
}

kvq_status kvq_vk_kmeans_assign(kvq_backend *backend, const kvq_job_kmeans *job) {
  vk_backend *b = (vk_backend *)backend;
  uint32_t base = 0;
  kvq_status st = prepare(b, job, &base);
  if (st != KVQ_OK) return st;
  kvq_push push = {0};
  push.meta = base;
  push.flags = job->distance ? KVQ_PUSH_DISTANCE : 0;
  kvq_buffer *buffers[KVQ_VK_BINDINGS] = {0};
  buffers[KVQ_BINDING_META] = b->metadata;
  buffers[KVQ_BINDING_SRC] = job->data;
  buffers[KVQ_BINDING_FIXED1] = job->centroids;
  buffers[KVQ_BINDING_DST] = job->assignment;
  buffers[KVQ_BINDING_RESULTS] = job->distance;
  /* a centroid costs dims + 2 trips; a range after the first also recomputes one distance */
  const uint32_t per_cluster = job->dims + 2, clusters = (LOOP_BUDGET - per_cluster) / per_cluster;
  return run_ranges(b, KVQ_VK_SHADER_kmeans_assign, &push, buffers, (uint64_t)job->problems * job->points, job->clusters,
                    clusters > 0 ? clusters : 1);
}

kvq_status kvq_vk_kmeans_update(kvq_backend *backend, const kvq_job_kmeans *job) {
  vk_backend *b = (vk_backend *)backend;
  uint32_t base = 0;
  kvq_status st = prepare(b, job, &base);
  if (st != KVQ_OK || job->points == 0) return st; /* no points: every centroid stays */
  const uint64_t values = (uint64_t)job->problems * job->clusters * job->dims;
  kvq_buffer *running = NULL; /* compensated sums between ranges (4 words a value): one range needs none */
  if (job->points > LOOP_BUDGET && values > 0 && (st = kvq_vk_buffer_make(b, values * 16, 0, &running)) != KVQ_OK) return st;
  kvq_push push = {0};
  push.meta = base;
  push.flags = job->weights ? KVQ_PUSH_WEIGHTS : 0;
  kvq_buffer *buffers[KVQ_VK_BINDINGS] = {0};
  buffers[KVQ_BINDING_META] = b->metadata;
  buffers[KVQ_BINDING_PAGES] = running;
  buffers[KVQ_BINDING_SRC] = job->data;
  buffers[KVQ_BINDING_FIXED0] = job->weights;
  buffers[KVQ_BINDING_DST] = job->assignment;
  buffers[KVQ_BINDING_RESULTS] = job->centroids;
  /* a point costs one trip */
  st = run_ranges(b, KVQ_VK_SHADER_kmeans_update, &push, buffers, values, job->points, LOOP_BUDGET);
  kvq_vk_retire(b, running); /* freed once the recorded dispatches are done (deferred calls submit later) */
  return st;
}
