/*
 * Attention jobs on Vulkan: SCORE, SOFTMAX (with the probability sums of the H2O and Q-Hitter
 * policies) and WEIGHTED_SUM, and the fused ATTENTION (flash-decoding, shaders/flash.glsl, with those
 * sums too) that core uses when it wants outputs only. What runs, for how many workgroups, with how
 * much scratch, is core's plan (core/gpu_plan.h); this file writes the words of core's packed metadata that changed
 * (core/gpu_meta.c) into the resident buffer (or, for a job built with host page lists, packs them
 * into the metadata ring) and records
 * one dispatch per kernel for the whole batch.
 */
#include <stdlib.h>
#include <string.h>

#include "core/gpu_plan.h"
#include "core/layout.h"
#include "vk.h"

/* A job's plan, where its metadata starts in the metadata buffer, and its scratch (or NULL). */
typedef struct attention_run {
  kvq_gpu_attention_plan plan;
  uint32_t base;
  kvq_buffer *meta; /* where the metadata is: the resident buffer, or the metadata ring */
  kvq_buffer *scratch;
} attention_run;

/* Plans the job, uploads its metadata and, with `scratch`, gets the plan's scratch memory: all
 * before anything is recorded. */
static kvq_status prepare(vk_backend *b, const kvq_job_attention *job, int fused_kernels, int scratch,
                          attention_run *run) {
  char why[160];
  memset(run, 0, sizeof *run);
  kvq_status st = kvq_gpu_plan_attention(job, fused_kernels, &run->plan, why, sizeof why);
  if (st != KVQ_OK) return kvq_vk_error(b, st, "%s", why);
  if (job->meta) { /* core's image (KVQ_BACKEND_CORE_META): only its changed words move */
    st = kvq_vk_metadata_resident(b, job->meta, &run->base, &run->meta);
  } else { /* host arrays (a job built by hand): packed here, into the metadata ring */
    uint32_t *meta = calloc((size_t)run->plan.meta_words, sizeof(uint32_t));
    if (!meta) return kvq_vk_error(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
    kvq_gpu_pack_attention(job, &run->plan, meta);
    run->meta = b->metadata;
    st = kvq_vk_metadata(b, meta, run->plan.meta_words * 4, &run->base);
    free(meta);
  }
  if (st == KVQ_OK && scratch && run->plan.scratch_bytes) st = kvq_vk_scratch(b, run->plan.scratch_bytes, &run->scratch);
  return st;
}

/* Push constants of a job's kernels on one side (base: the job's metadata). */
static void push_for(kvq_push *push, const kvq_job_attention *job, const kvq_side_desc *side, uint32_t base) {
  memset(push, 0, sizeof *push);
  kvq_vk_push_side(push, side);
  push->meta = base;
  push->query_heads = job->query_heads;
  memcpy(&push->scale_bits, &job->scale, 4);
  push->window_dtype = (uint32_t)job->window_dtype;
  push->alive_words = job->alive_words;
}

/* One dispatch of `shader` over the plan's units of `kernel` for the whole batch. */
static kvq_status launch(vk_backend *b, const attention_run *run, uint32_t kernel, kvq_vk_shader shader,
                         const kvq_push *push, kvq_buffer *const buffers[KVQ_VK_BINDINGS]) {
  return kvq_vk_dispatch(b, shader, push, buffers, run->plan.units[kernel] * KVQ_GPU_GROUP_SIZE);
}

static kvq_status score(vk_backend *b, const kvq_job_attention *job, const attention_run *run) {
  const kvq_vk_shader shader = KVQ_VK_VARIANT(score, job->keys->layout.method);
  if (shader == KVQ_VK_SHADER_COUNT)
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "no score shader for this key method");
  if (kvq_prepared_floats(&job->keys->layout) && !job->prepared)
    return kvq_vk_error(b, KVQ_ERROR_INTERNAL, "scores without the prepared queries");
  kvq_push push;
  push_for(&push, job, job->keys, run->base);
  kvq_buffer *buffers[KVQ_VK_BINDINGS];
  kvq_vk_bind_side(buffers, b, job->keys, job->key_pages, job->key_ring);
  buffers[KVQ_BINDING_META] = run->meta;
  buffers[KVQ_BINDING_SRC] = job->queries;
  buffers[KVQ_BINDING_DST] = job->scores;
  buffers[KVQ_BINDING_RESULTS] = job->prepared;
  return launch(b, run, KVQ_PLAN_SCORE, shader, &push, buffers);
}

static kvq_status softmax(vk_backend *b, const kvq_job_attention *job, const attention_run *run) {
  kvq_push push;
  push_for(&push, job, job->keys, run->base);
  kvq_buffer *buffers[KVQ_VK_BINDINGS] = {0};
  buffers[KVQ_BINDING_META] = run->meta;
  buffers[KVQ_BINDING_DST] = job->scores;
  buffers[KVQ_BINDING_RESULTS] = job->accumulate;
  kvq_status st = launch(b, run, KVQ_PLAN_SOFTMAX, KVQ_VK_SHADER_softmax, &push, buffers);
  if (st == KVQ_OK && job->accumulate) st = launch(b, run, KVQ_PLAN_ACCUMULATE, KVQ_VK_SHADER_accumulate, &push, buffers);
  return st;
}

/* Value methods that sum in a rotated space (plan.rotated_sums) leave the page sums there in
 * scratch memory; weighted_sum_rotate turns them back. */
static kvq_status weighted_sum(vk_backend *b, const kvq_job_attention *job, const attention_run *run) {
  const uint32_t method = job->values->layout.method;
  const kvq_vk_shader shader = KVQ_VK_VARIANT(weighted_sum, method);
  if (shader == KVQ_VK_SHADER_COUNT)
    return kvq_vk_error(b, KVQ_ERROR_UNSUPPORTED, "no weighted-sum shader for this value method");
  kvq_push push;
  push_for(&push, job, job->values, run->base);
  kvq_buffer *buffers[KVQ_VK_BINDINGS];
  kvq_vk_bind_side(buffers, b, job->values, job->value_pages, job->value_ring);
  buffers[KVQ_BINDING_META] = run->meta;
  buffers[KVQ_BINDING_SRC] = job->scores;
  buffers[KVQ_BINDING_RESULTS] = job->output;
  buffers[KVQ_BINDING_DST] = run->scratch; /* the rotated sums, where the method has them */
  kvq_status st = launch(b, run, KVQ_PLAN_WEIGHTED_SUM, shader, &push, buffers);
  if (st == KVQ_OK && run->plan.rotated_sums)
    st = launch(b, run, KVQ_PLAN_ROTATE, KVQ_VK_VARIANT(weighted_sum_rotate, method), &push, buffers);
  return st;
}

/* One unfused job (score, softmax or weighted_sum above) with its own plan and submission. */
typedef kvq_status (*attention_step)(vk_backend *b, const kvq_job_attention *job, const attention_run *run);
static kvq_status run_step(kvq_backend *backend, const kvq_job_attention *job, attention_step step, int scratch) {
  vk_backend *b = (vk_backend *)backend;
  attention_run run;
  kvq_status st = prepare(b, job, 0, scratch, &run);
  if (st != KVQ_OK) return st;
  st = step(b, job, &run);
  return kvq_vk_done(b, st);
}

kvq_status kvq_vk_score(kvq_backend *backend, const kvq_job_attention *job) {
  return run_step(backend, job, score, 0);
}
kvq_status kvq_vk_softmax(kvq_backend *backend, const kvq_job_attention *job) {
  return run_step(backend, job, softmax, 0);
}
kvq_status kvq_vk_weighted_sum(kvq_backend *backend, const kvq_job_attention *job) {
  return run_step(backend, job, weighted_sum, 1);
}

kvq_status kvq_vk_attention(kvq_backend *backend, const kvq_job_attention *job) {
  vk_backend *b = (vk_backend *)backend;
  const kvq_side_layout *ks = &job->keys->layout, *vs = &job->values->layout;
  const kvq_vk_shader logits = b->subgroups ? KVQ_VK_VARIANT(flash_logits_subgroups, ks->method)
                                            : KVQ_VK_VARIANT(flash_logits, ks->method);
  const kvq_vk_shader values = KVQ_VK_VARIANT(flash_values, vs->method);
  attention_run run;
  kvq_status st = prepare(b, job, logits != KVQ_VK_SHADER_COUNT && values != KVQ_VK_SHADER_COUNT, 1, &run);
  if (st != KVQ_OK) return st;
  if (!run.plan.fused) { /* the unfused kernels, one after the other, on the same metadata */
    st = score(b, job, &run);
    if (st == KVQ_OK) st = softmax(b, job, &run);
    if (st == KVQ_OK) st = weighted_sum(b, job, &run);
    return kvq_vk_done(b, st);
  }
  kvq_push key_push, value_push;
  push_for(&key_push, job, job->keys, run.base);
  push_for(&value_push, job, job->values, run.base);
  kvq_buffer *key_buffers[KVQ_VK_BINDINGS], *value_buffers[KVQ_VK_BINDINGS];
  kvq_vk_bind_side(key_buffers, b, job->keys, job->key_pages, job->key_ring);
  kvq_vk_bind_side(value_buffers, b, job->values, job->value_pages, job->value_ring);
  key_buffers[KVQ_BINDING_META] = value_buffers[KVQ_BINDING_META] = run.meta;
  key_buffers[KVQ_BINDING_DST] = value_buffers[KVQ_BINDING_DST] = run.scratch;
  key_buffers[KVQ_BINDING_SRC] = job->queries;
  key_buffers[KVQ_BINDING_RESULTS] = job->prepared; /* methods that score from prepared queries (QJL) */
  value_buffers[KVQ_BINDING_RESULTS] = job->output;
  st = launch(b, &run, KVQ_PLAN_FLASH, logits, &key_push, key_buffers);
  if (st == KVQ_OK) st = launch(b, &run, KVQ_PLAN_FLASH, values, &value_push, value_buffers);
  if (st == KVQ_OK) st = launch(b, &run, KVQ_PLAN_COMBINE, KVQ_VK_SHADER_flash_combine, &value_push, value_buffers);
  if (st == KVQ_OK && job->accumulate) { /* H2O / Q-Hitter: the sums from the scratch the combine has read */
    value_buffers[KVQ_BINDING_RESULTS] = job->accumulate;
    st = launch(b, &run, KVQ_PLAN_SOFTMAX, KVQ_VK_SHADER_flash_normalize, &value_push, value_buffers);
    if (st == KVQ_OK) st = launch(b, &run, KVQ_PLAN_ACCUMULATE, KVQ_VK_SHADER_accumulate_flash, &value_push, value_buffers);
  }
  return kvq_vk_done(b, st);
}
