/* k-means steps for codebook learning: nearest centroids, then weighted means. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/quantize_math.h"
#include "cpu.h"

uint32_t kvq_cpu_nearest(const float *x, const float *centroids, uint32_t clusters, uint32_t dims, float *distance) {
  uint32_t best = 0;
  float best_d = 0.0f;
  for (uint32_t j = 0; j < clusters; j++) {
    const float *mu = centroids + (size_t)j * dims;
    float sum = 0.0f;
    for (uint32_t i = 0; i < dims; i++) sum = kvq_distance_step(sum, x[i], mu[i]);
    if (kvq_nearer(j, sum, best_d)) best = j, best_d = sum;
  }
  if (distance) *distance = best_d;
  return best;
}

static int in_buffer(const kvq_buffer *buf, uint64_t bytes) { return buf && bytes <= buf->size; }

static kvq_status check(kvq_backend *b, const kvq_job_kmeans *job) {
  KVQ_CPU_OWNS(b, NULL, job->data, job->weights, job->centroids, job->assignment, job->distance);
  const uint64_t pts = (uint64_t)job->problems * job->points;
  if (!in_buffer(job->data, pts * job->dims * 4) || !in_buffer(job->assignment, pts * 4) ||
      !in_buffer(job->centroids, (uint64_t)job->problems * job->clusters * job->dims * 4) ||
      (job->weights && !in_buffer(job->weights, (uint64_t)job->points * 4)) ||
      (job->distance && !in_buffer(job->distance, pts * 4))) {
    snprintf(b->message, sizeof b->message, "cpu: a k-means buffer is too small");
    return KVQ_ERROR_INTERNAL;
  }
  return KVQ_OK;
}

kvq_status kvq_cpu_kmeans_assign(kvq_backend *b, const kvq_job_kmeans *job) {
  kvq_status st = check(b, job);
  if (st != KVQ_OK) return st;
  const float *data = (const float *)job->data->data, *centroids = (const float *)job->centroids->data;
  uint32_t *assignment = (uint32_t *)job->assignment->data;
  float *distance = job->distance ? (float *)job->distance->data : NULL;
  for (uint32_t p = 0; p < job->problems; p++)
    for (uint32_t t = 0; t < job->points; t++) {
      const uint64_t i = (uint64_t)p * job->points + t;
      assignment[i] = kvq_cpu_nearest(data + i * job->dims, centroids + (uint64_t)p * job->clusters * job->dims,
                                      job->clusters, job->dims, distance ? distance + i : NULL);
    }
  return KVQ_OK;
}

kvq_status kvq_cpu_kmeans_update(kvq_backend *b, const kvq_job_kmeans *job) {
  kvq_status st = check(b, job);
  if (st != KVQ_OK) return st;
  const float *data = (const float *)job->data->data, *weights = job->weights ? (const float *)job->weights->data : NULL;
  const uint32_t *assignment = (const uint32_t *)job->assignment->data;
  float *centroids = (float *)job->centroids->data;
  double *sum = calloc((size_t)job->clusters * (job->dims + 1), sizeof(double)); /* per cluster: dims sums, weight */
  if (!sum) {
    snprintf(b->message, sizeof b->message, "cpu: out of host memory for k-means");
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  for (uint32_t p = 0; p < job->problems; p++) {
    memset(sum, 0, sizeof(double) * job->clusters * (job->dims + 1));
    for (uint32_t t = 0; t < job->points; t++) {
      const uint64_t i = (uint64_t)p * job->points + t;
      const uint32_t j = assignment[i] < job->clusters ? assignment[i] : 0;
      const double w = weights ? weights[t] : 1.0;
      double *acc = sum + (size_t)j * (job->dims + 1);
      for (uint32_t k = 0; k < job->dims; k++) acc[k] += w * data[i * job->dims + k];
      acc[job->dims] += w;
    }
    for (uint32_t j = 0; j < job->clusters; j++) {
      const double *acc = sum + (size_t)j * (job->dims + 1);
      if (acc[job->dims] <= 0.0) continue; /* an empty cluster keeps its centroid */
      for (uint32_t k = 0; k < job->dims; k++)
        centroids[((uint64_t)p * job->clusters + j) * job->dims + k] = (float)(acc[k] / acc[job->dims]);
    }
  }
  free(sum);
  return KVQ_OK;
}
