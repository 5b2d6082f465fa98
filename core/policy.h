/* Token policies (kvq.h, "Token policies"): token statistics and eviction, in core. */
#ifndef KVQ_CORE_POLICY_H
#define KVQ_CORE_POLICY_H

#include <stdint.h>

#include "internal.h"

/* Whether a policy keeps per-token statistics (H2O, Q-Hitter), and whether it needs the
 * quantization errors (Q-Hitter). */
int kvq_policy_tracks(const kvq_policy_config *policy);
int kvq_policy_needs_errors(const kvq_policy_config *policy);

/* How many of its candidates (the kept tokens in [sinks, n - recent)) a decision at n tokens keeps at
 * most: the heavy hitters, floor(heavy_fraction * n) or `heavy`; 0 under StreamingLLM. */
uint32_t kvq_policy_candidates_kept(const kvq_policy_config *policy, uint32_t n);

void kvq_tracked_free(kvq_tracked *tracked);
/* Grows the statistics so that positions up to `end` can be added without allocating. */
kvq_status kvq_tracked_reserve(kvq_cache *cache, kvq_sequence *seq, uint32_t end);
/* Adds positions [tracked.end, end) with zero statistics (reserved before). */
void kvq_tracked_extend(kvq_sequence *seq, uint32_t end);
/* The index of a position's statistics, or UINT32_MAX. */
uint32_t kvq_tracked_find(const kvq_tracked *tracked, uint32_t position);

/* Adds one attention call's sums (per slot of a layer's view, kvq_job_attention.accumulate) to the
 * statistics of the tokens those slots hold. */
void kvq_policy_add_attention(const kvq_cache *cache, kvq_sequence *seq, const kvq_layer_view *view, const double *sums);

/* Adds the quantization errors of full pages (fp32 [pages][P][kv_heads], one side of one layer) to
 * the statistics: page i of the run is page first_page + i of the sequence. */
void kvq_policy_add_errors(const kvq_cache *cache, kvq_sequence *seq, int side, uint32_t first_page, uint32_t pages,
                           uint32_t kv_heads, const float *errors);

/* How close the next H2O or Q-Hitter decision on a sequence is to a tie: the score gap between the
 * last candidate it keeps and the first it evicts, relative to the largest |score|; INFINITY when
 * no decision depends on the scores. For golden files (kept sets must agree unless near a tie). */
double kvq_policy_margin(const kvq_cache *cache, const kvq_sequence *seq);

/* What running the policy would do, decided without changing anything, so that a call can still
 * fail (kvq_append when the pages are too few even after the evictions) and leave the cache as it
 * was: the sequence's kept-token masks afterwards (NULL: nothing evicted), which statistics entries
 * go (NULL: none), and how many pages that empties. Valid until the page table or the statistics
 * change; growing their capacity is fine. */
typedef struct kvq_policy_plan {
  uint32_t *alive;
  uint8_t *drop;
  uint32_t pages_freed;
} kvq_policy_plan;
kvq_status kvq_policy_plan_make(const kvq_cache *cache, const kvq_sequence *seq, kvq_policy_plan *plan);
/* Applies a plan (cannot fail) and frees it. */
void kvq_policy_plan_apply(kvq_cache *cache, kvq_sequence *seq, kvq_policy_plan *plan);
void kvq_policy_plan_free(kvq_policy_plan *plan);

/* Runs the policy on a sequence whose layers all hold the same number of tokens. */
kvq_status kvq_policy_run(kvq_cache *cache, kvq_sequence *seq);

/* Whether all layers of a sequence hold the same number of tokens. */
int kvq_sequence_in_step(const kvq_cache *cache, const kvq_sequence *seq);

#endif
