#include "config.h"

#include <stdarg.h>
#include <stdio.h>

#include "layout.h"
#include "rng.h"

/* kvq.h fixes the public enum values; the layouts and files use the same numbers. */
_Static_assert(KVQ_METHOD_EXACT == KVQ_LAYOUT_EXACT && KVQ_METHOD_QJL == KVQ_LAYOUT_QJL &&
                   KVQ_METHOD_UNIFORM == KVQ_LAYOUT_UNIFORM,
               "method ids");
_Static_assert(KVQ_DTYPE_F32 == KVQ_LAYOUT_F32 && KVQ_DTYPE_F16 == KVQ_LAYOUT_F16 &&
                   KVQ_DTYPE_BF16 == KVQ_LAYOUT_BF16,
               "dtype ids");

size_t kvq_dtype_size(kvq_dtype dtype) { return dtype == KVQ_DTYPE_F32 ? 4 : 2; }

const char *kvq_dtype_name(kvq_dtype dtype) {
  switch (dtype) {
  case KVQ_DTYPE_F32: return "fp32";
  case KVQ_DTYPE_F16: return "fp16";
  case KVQ_DTYPE_BF16: return "bf16";
  }
  return "unknown dtype";
}

const char *kvq_method_name(kvq_method method) {
  switch (method) {
  case KVQ_METHOD_EXACT: return "exact";
  case KVQ_METHOD_QJL: return "qjl";
  case KVQ_METHOD_UNIFORM: return "uniform";
  }
  return "unknown method";
}

uint64_t kvq_token_bytes(kvq_dtype dtype, uint32_t kv_heads, uint32_t head_dim) {
  return (uint64_t)kv_heads * head_dim * kvq_dtype_size(dtype);
}

static kvq_status fail(kvq_status status, char *message, size_t size, const char *format, ...) {
  if (message && size > 0) {
    va_list args;
    va_start(args, format);
    vsnprintf(message, size, format, args);
    va_end(args);
  }
  return status;
}

static int is_pow2(uint32_t x) { return x != 0 && (x & (x - 1)) == 0; }
static int valid_dtype(kvq_dtype d) { return d == KVQ_DTYPE_F32 || d == KVQ_DTYPE_F16 || d == KVQ_DTYPE_BF16; }

static kvq_status check_method(const kvq_method_config *mc, int is_keys, uint32_t layer, uint32_t head_dim,
                               char *message, size_t size) {
  const char *side = is_keys ? "keys" : "values";
  switch (mc->method) {
  case KVQ_METHOD_EXACT:
    if (!valid_dtype(mc->exact.dtype))
      return fail(KVQ_ERROR_INVALID_ARGUMENT, message, size, "layers[%u].%s.exact.dtype: unknown dtype %d",
                  layer, side, (int)mc->exact.dtype);
    return KVQ_OK;
  case KVQ_METHOD_QJL: {
    if (!is_keys)
      return fail(KVQ_ERROR_INVALID_ARGUMENT, message, size,
                  "layers[%u].values.method: QJL estimates inner products and only quantizes keys", layer);
    const kvq_qjl_config *q = &mc->qjl;
    if (q->sketch_dim == 0 || q->sketch_dim % KVQ_SKETCH_MULTIPLE || q->sketch_dim > KVQ_MAX_SKETCH_DIM)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].keys.qjl.sketch_dim = %u: must be a multiple of 32 from 32 to 1024", layer,
                  q->sketch_dim);
    if (q->outlier_count > KVQ_MAX_OUTLIERS || q->outlier_count >= head_dim)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].keys.qjl.outlier_count = %u: must be at most 32 and below head_dim (%u)", layer,
                  q->outlier_count, head_dim);
    if (q->outlier_count > 0 && (q->outlier_sketch_dim == 0 || q->outlier_sketch_dim % KVQ_SKETCH_MULTIPLE ||
                                 q->outlier_sketch_dim > KVQ_MAX_SKETCH_DIM))
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].keys.qjl.outlier_sketch_dim = %u: must be a multiple of 32 from 32 to 1024", layer,
                  q->outlier_sketch_dim);
    return KVQ_OK;
  }
  case KVQ_METHOD_UNIFORM: {
    const kvq_uniform_config *u = &mc->uniform;
    if (!(u->bits == 1 || u->bits == 2 || u->bits == 3 || u->bits == 4 || u->bits == 8))
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "layers[%u].%s.uniform.bits = %u: must be 1, 2, 3, 4 or 8",
                  layer, side, u->bits);
    if (!is_pow2(u->group_size) || u->group_size < KVQ_MIN_UNIFORM_GROUP || u->group_size > head_dim ||
        head_dim % u->group_size)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].%s.uniform.group_size = %u: must be a power of two from 4 that divides head_dim (%u)",
                  layer, side, u->group_size, head_dim);
    return KVQ_OK;
  }
  }
  return fail(KVQ_ERROR_INVALID_ARGUMENT, message, size, "layers[%u].%s.method: unknown method %d", layer, side,
              (int)mc->method);
}

kvq_status kvq_config_validate(const kvq_cache_config *c, char *message, size_t size) {
  if (!c) return fail(KVQ_ERROR_INVALID_ARGUMENT, message, size, "config is NULL");
  if (c->layer_count == 0) return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "layer_count is 0: need at least 1 layer");
  if (c->layer_count > 4096)
    return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "layer_count = %u: at most 4096 layers", c->layer_count);
  if (!c->layers) return fail(KVQ_ERROR_INVALID_ARGUMENT, message, size, "layers is NULL");
  if (!valid_dtype(c->input_dtype))
    return fail(KVQ_ERROR_INVALID_ARGUMENT, message, size, "input_dtype: unknown dtype %d", (int)c->input_dtype);
  if (!is_pow2(c->page_size) || c->page_size < KVQ_MIN_PAGE_SIZE || c->page_size > KVQ_MAX_PAGE_SIZE)
    return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "page_size = %u: must be a power of two from 16 to 256",
                c->page_size);
  if (c->residual_window % c->page_size)
    return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "residual_window = %u: must be a multiple of page_size (%u)",
                c->residual_window, c->page_size);
  if (c->residual_window > 65536)
    return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "residual_window = %u: at most 65536 tokens",
                c->residual_window);
  if (c->max_pages == 0) return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "max_pages is 0: need at least 1 page");
  /* Token positions are 32-bit in jobs and kernels. */
  if ((uint64_t)c->max_pages * c->page_size + c->residual_window + c->page_size > 0x7fffffffull)
    return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                "max_pages = %u: max_pages * page_size must stay below 2^31 tokens", c->max_pages);
  if (c->max_sequences == 0 || c->max_sequences > 65535)
    return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "max_sequences = %u: must be from 1 to 65535",
                c->max_sequences);
  for (uint32_t l = 0; l < c->layer_count; l++) {
    const kvq_layer_config *L = &c->layers[l];
    if (L->head_dim == 0 || L->head_dim % KVQ_HEAD_DIM_MULTIPLE || L->head_dim > KVQ_MAX_HEAD_DIM)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].head_dim = %u: must be a multiple of 16 from 16 to 256", l, L->head_dim);
    if (L->kv_heads == 0 || L->kv_heads > 1024)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "layers[%u].kv_heads = %u: must be from 1 to 1024", l,
                  L->kv_heads);
    if (L->query_heads == 0 || L->query_heads % L->kv_heads || L->query_heads > 65536)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].query_heads = %u: must be a positive multiple of kv_heads (%u)", l, L->query_heads,
                  L->kv_heads);
    kvq_status st = check_method(&L->keys, 1, l, L->head_dim, message, size);
    if (st) return st;
    st = check_method(&L->values, 0, l, L->head_dim, message, size);
    if (st) return st;
  }
  return KVQ_OK;
}

void kvq_side_layout_init(kvq_side_layout *s, const kvq_method_config *mc, uint32_t P, uint32_t d, uint32_t hkv) {
  *s = (kvq_side_layout){.method = (uint32_t)mc->method, .page_size = P, .head_dim = d, .kv_heads = hkv};
  switch (mc->method) {
  case KVQ_METHOD_EXACT:
    s->dtype = (uint32_t)mc->exact.dtype;
    s->head_bytes = kvq_exact_head_bytes(P, d, s->dtype);
    break;
  case KVQ_METHOD_QJL:
    s->sketch_dim = mc->qjl.sketch_dim;
    s->outliers = mc->qjl.outlier_count;
    s->outlier_sketch_dim = s->outliers ? mc->qjl.outlier_sketch_dim : 0;
    s->head_bytes = kvq_qjl_head_bytes(P, s->sketch_dim, s->outlier_sketch_dim, s->outliers);
    break;
  case KVQ_METHOD_UNIFORM:
    s->bits = mc->uniform.bits;
    s->group = mc->uniform.group_size;
    s->head_bytes = kvq_uniform_head_bytes(P, d, s->bits, s->group);
    break;
  }
  s->page_bytes = (uint64_t)s->head_bytes * hkv;
}

uint32_t kvq_side_matrix_rows(const kvq_side_layout *s, int index) {
  if (s->method != KVQ_LAYOUT_QJL) return 0;
  return index == 0 ? s->sketch_dim : s->outlier_sketch_dim;
}

uint32_t kvq_side_matrix_purpose(const kvq_side_layout *s, int index) {
  (void)s;
  return index == 0 ? KVQ_PURPOSE_QJL_SKETCH : KVQ_PURPOSE_QJL_OUTLIER_SKETCH;
}

uint32_t kvq_prepared_floats(const kvq_side_layout *keys) {
  return keys->method == KVQ_LAYOUT_QJL ? keys->sketch_dim : 0;
}
