/* Append-time checks: every token a method will store must be representable, so that quantizing a
 * page later can never fail half-way. */
#ifndef KVQ_CORE_TOKEN_CHECK_H
#define KVQ_CORE_TOKEN_CHECK_H

#include "internal.h"

/* Checks `count` packed tokens ([count][kv_heads][head_dim] in `dtype`) against a side's method:
 * finite numbers everywhere; EXACT: representable in the storage dtype; QJL: |k| within fp16 range;
 * UNIFORM: every group's fp16 minimum and scale finite. `first` numbers tokens in messages. */
kvq_status kvq_check_tokens(kvq_context *ctx, const kvq_side_layout *layout, kvq_dtype dtype, const void *raw,
                            uint32_t count, const char *side_name, uint64_t first);

#endif
