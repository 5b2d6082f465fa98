/* Configuration checks, method defaults and the per-layer storage description derived from them. */
#ifndef KVQ_CORE_CONFIG_H
#define KVQ_CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/kvq.h"

/* How one side (keys or values) of one layer is stored. Everything a job needs to read or write a
 * page, derived once from the layer's method config. */
typedef struct kvq_side_layout {
  uint32_t method;        /* KVQ_LAYOUT_* */
  uint32_t page_size;     /* P */
  uint32_t head_dim;      /* d */
  uint32_t kv_heads;      /* Hkv */
  uint32_t dtype;         /* EXACT: storage dtype */
  uint32_t sketch_dim;    /* QJL: m */
  uint32_t outliers;      /* QJL: k */
  uint32_t outlier_sketch_dim; /* QJL: m_o */
  uint32_t bits;          /* UNIFORM: b */
  uint32_t group;         /* UNIFORM: G */
  uint32_t head_bytes;    /* one kv head's block of a page */
  uint64_t page_bytes;    /* one page: kv_heads head blocks */
} kvq_side_layout;

/* Validates a whole cache config; on failure writes a message naming the parameter. */
kvq_status kvq_config_validate(const kvq_cache_config *config, char *message, size_t message_size);

/* Fills a layout from a method config already validated for this layer. */
void kvq_side_layout_init(kvq_side_layout *layout, const kvq_method_config *method, uint32_t page_size,
                          uint32_t head_dim, uint32_t kv_heads);

/* Rows of the random matrices a side needs (0 when none): index 0 = S, 1 = S_o for QJL. */
#define KVQ_SIDE_MATRICES 2
uint32_t kvq_side_matrix_rows(const kvq_side_layout *layout, int index);
/* The rng purpose of matrix `index` of a side. */
uint32_t kvq_side_matrix_purpose(const kvq_side_layout *layout, int index);

/* Floats of prepared query (PREPARE_QUERY output) per query head that a key layout's SCORE reads:
 * QJL keeps S q (m floats); other layouts score the query itself (0). */
uint32_t kvq_prepared_floats(const kvq_side_layout *keys);

/* Bytes a token takes in the input dtype, all kv heads: kv_heads * head_dim * sizeof(dtype). */
uint64_t kvq_token_bytes(kvq_dtype dtype, uint32_t kv_heads, uint32_t head_dim);
size_t kvq_dtype_size(kvq_dtype dtype);
const char *kvq_dtype_name(kvq_dtype dtype);
const char *kvq_method_name(kvq_method method);

#endif
