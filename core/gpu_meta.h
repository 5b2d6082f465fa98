/*
 * Core's packed attention metadata for GPU backends that take it (KVQ_BACKEND_CORE_META): one image
 * per context in the layout of core/gpu_plan.h, kept from one attention job to the next and updated
 * where page tables changed (core/gpu_meta.c).
 */
#ifndef KVQ_CORE_GPU_META_H
#define KVQ_CORE_GPU_META_H

#include "gpu_plan.h"
#include "internal.h"

typedef struct kvq_gpu_meta kvq_gpu_meta;

/* Packs the metadata of `job` (whose records are `seqs`, filled but for page_first, which this
 * sets) into the context's image, for sequences owners[i] listing listed[i] page-table entries each,
 * and points job->meta at it. Only what changed since the previous image is written and listed as
 * changed. */
kvq_status kvq_gpu_meta_pack(kvq_cache *cache, kvq_job_attention *job, kvq_attention_seq *seqs, kvq_sequence *const *owners,
                             const uint32_t *listed);
void kvq_gpu_meta_free(kvq_gpu_meta *m);

#endif
