/* Configuration checks, method defaults and the per-layer storage description derived from them. */
#ifndef KVQ_CORE_CONFIG_H
#define KVQ_CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/kvq.h"
#include "layout.h"

/* How one side (keys or values) of one layer is stored. Everything a job needs to read or write a
 * page, derived once from the layer's method config. */
#define KVQ_SIDE_MEMBER(name) uint32_t name;
typedef struct kvq_side_layout {
  KVQ_SIDE_FIELDS(KVQ_SIDE_MEMBER) /* core/layout.h: the fields kernels read */
  uint32_t iterations;    /* CQ: Lloyd iterations */
  uint32_t head_bytes;    /* one kv head's block of a page */
  uint64_t page_bytes;    /* one page: kv_heads head blocks */
} kvq_side_layout;
#undef KVQ_SIDE_MEMBER

/* Validates a whole cache config; on failure writes a message naming the parameter. */
kvq_status kvq_config_validate(const kvq_cache_config *config, char *message, size_t message_size);

/* Validates a cache's token policy (core/policy.c); writes why to message. */
kvq_status kvq_policy_validate(const kvq_policy_config *policy, uint32_t page_size, uint32_t residual_window,
                               char *message, size_t size);

/* Fills a layout from a method config already validated for this layer. */
void kvq_side_layout_init(kvq_side_layout *layout, const kvq_method_config *method, uint32_t page_size,
                          uint32_t head_dim, uint32_t kv_heads);

/* Fixed data of a side: built once per cache, shared by all its tokens, saved with it.
 *   QJL:   0 = S (m x d), 1 = S_o (m_o x d), random
 *   POLAR: 0 = rotation (d x d dense, or the d signs of the Hadamard form), random;
 *          1 = angle codebook tables (one, or one per kv head when learned)
 *   CQ:    1 = centroids (per kv head and channel group), learned
 * All fp32. */
#define KVQ_SIDE_FIXED 2
typedef enum kvq_fixed_kind {
  KVQ_FIXED_NONE = 0,
  KVQ_FIXED_RANDOM = 1,   /* drawn from the cache's seed (matrix.h) */
  KVQ_FIXED_COMPUTED = 2, /* computed from the configuration (offline codebooks) */
  KVQ_FIXED_LEARNED = 3   /* learned from calibration data (kvq_codebooks_learn) or loaded */
} kvq_fixed_kind;
kvq_fixed_kind kvq_side_fixed_kind(const kvq_side_layout *layout, int index);
uint64_t kvq_side_fixed_floats(const kvq_side_layout *layout, int index);
/* The rng purpose of a random fixed array. */
uint32_t kvq_side_fixed_purpose(const kvq_side_layout *layout, int index);
/* What fixed array `index` of a side is, in words for messages ("the QJL sketch S", ...). */
const char *kvq_fixed_name(const kvq_side_layout *layout, int index);
/* Whether the side needs learned codebooks before it can store tokens. */
int kvq_side_needs_learning(const kvq_side_layout *layout);

/* Floats of prepared query (PREPARE_QUERY output) per query head that a key layout's SCORE reads:
 * QJL keeps S q (m floats); other layouts score the query itself (0). */
uint32_t kvq_prepared_floats(const kvq_side_layout *keys);

/* Bytes a token takes in the input dtype, all kv heads: kv_heads * head_dim * sizeof(dtype). */
uint64_t kvq_token_bytes(kvq_dtype dtype, uint32_t kv_heads, uint32_t head_dim);
size_t kvq_dtype_size(kvq_dtype dtype);
const char *kvq_dtype_name(kvq_dtype dtype);
const char *kvq_method_name(kvq_method method);

#endif
