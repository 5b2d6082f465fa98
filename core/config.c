#include "config.h"

#include <stdarg.h>
#include <stdio.h>

#include "layout.h"
#include "rng.h"

/* kvq.h fixes the public enum values; the layouts and files use the same numbers. */
_Static_assert(KVQ_METHOD_EXACT == KVQ_LAYOUT_EXACT && KVQ_METHOD_QJL == KVQ_LAYOUT_QJL &&
                   KVQ_METHOD_UNIFORM == KVQ_LAYOUT_UNIFORM && KVQ_METHOD_KIVI == KVQ_LAYOUT_KIVI &&
                   KVQ_METHOD_POLAR == KVQ_LAYOUT_POLAR && KVQ_METHOD_CQ == KVQ_LAYOUT_CQ,
               "method ids");
_Static_assert(KVQ_ROTATION_DENSE == KVQ_LAYOUT_ROTATION_DENSE && KVQ_ROTATION_HADAMARD == KVQ_LAYOUT_ROTATION_HADAMARD &&
                   KVQ_CODEBOOK_OFFLINE == KVQ_LAYOUT_CODEBOOK_OFFLINE && KVQ_CODEBOOK_ONLINE == KVQ_LAYOUT_CODEBOOK_ONLINE,
               "PolarQuant variant ids");
_Static_assert(offsetof(kvq_side_layout, iterations) == KVQ_SIDE_FIELD_COUNT * sizeof(uint32_t),
               "KVQ_SIDE_FIELD_COUNT counts KVQ_SIDE_FIELDS (shaders/push.h sizes the push constants by it)");
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
  case KVQ_METHOD_KIVI: return "kivi";
  case KVQ_METHOD_POLAR: return "polar";
  case KVQ_METHOD_CQ: return "cq";
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

static int valid_bits(uint32_t b) { return b == 1 || b == 2 || b == 3 || b == 4 || b == 8; }

static kvq_status check_method(const kvq_method_config *mc, int is_keys, uint32_t layer, uint32_t head_dim,
                               uint32_t page_size, char *message, size_t size) {
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
    if (!valid_bits(u->bits))
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "layers[%u].%s.uniform.bits = %u: must be 1, 2, 3, 4 or 8",
                  layer, side, u->bits);
    if (!is_pow2(u->group_size) || u->group_size < KVQ_MIN_UNIFORM_GROUP || u->group_size > head_dim ||
        head_dim % u->group_size)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].%s.uniform.group_size = %u: must be a power of two from 4 that divides head_dim (%u)",
                  layer, side, u->group_size, head_dim);
    return KVQ_OK;
  }
  case KVQ_METHOD_KIVI: {
    const kvq_kivi_config *k = &mc->kivi;
    if (!valid_bits(k->bits))
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "layers[%u].%s.kivi.bits = %u: must be 1, 2, 3, 4 or 8", layer,
                  side, k->bits);
    if (k->group_tokens != 0 && (!is_pow2(k->group_tokens) || k->group_tokens < 4 || page_size % k->group_tokens))
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].%s.kivi.group_tokens = %u: must be 0 (the page) or a power of two from 4 dividing page_size (%u)",
                  layer, side, k->group_tokens, page_size);
    return KVQ_OK;
  }
  case KVQ_METHOD_POLAR: {
    const kvq_polar_config *p = &mc->polar;
    if (p->levels < 1 || p->levels > KVQ_MAX_POLAR_LEVELS || head_dim % (1u << p->levels))
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].%s.polar.levels = %u: must be from 1 to 8 with 2^levels dividing head_dim (%u)", layer, side,
                  p->levels, head_dim);
    for (uint32_t l = 0; l < p->levels; l++)
      if (p->bits[l] < 1 || p->bits[l] > KVQ_MAX_POLAR_BITS)
        return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "layers[%u].%s.polar.bits[%u] = %u: must be from 1 to 8", layer,
                    side, l, p->bits[l]);
    if (p->rotation != KVQ_ROTATION_DENSE && p->rotation != KVQ_ROTATION_HADAMARD)
      return fail(KVQ_ERROR_INVALID_ARGUMENT, message, size, "layers[%u].%s.polar.rotation: unknown rotation %d", layer,
                  side, (int)p->rotation);
    if (p->rotation == KVQ_ROTATION_HADAMARD && !is_pow2(head_dim))
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].%s.polar.rotation: a Hadamard rotation needs a power-of-two head_dim (%u)", layer, side,
                  head_dim);
    if (p->codebook != KVQ_CODEBOOK_OFFLINE && p->codebook != KVQ_CODEBOOK_ONLINE)
      return fail(KVQ_ERROR_INVALID_ARGUMENT, message, size, "layers[%u].%s.polar.codebook: unknown codebook source %d",
                  layer, side, (int)p->codebook);
    return KVQ_OK;
  }
  case KVQ_METHOD_CQ: {
    const kvq_cq_config *c = &mc->cq;
    if (!is_pow2(c->channels) || c->channels > KVQ_MAX_CQ_CHANNELS || head_dim % c->channels)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size,
                  "layers[%u].%s.cq.channels = %u: must be 1, 2, 4, 8 or 16 and divide head_dim (%u)", layer, side,
                  c->channels, head_dim);
    if (c->bits < 1 || c->bits > KVQ_MAX_CQ_BITS)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "layers[%u].%s.cq.bits = %u: must be from 1 to 12", layer, side,
                  c->bits);
    if (c->iterations > 100000)
      return fail(KVQ_ERROR_OUT_OF_RANGE, message, size, "layers[%u].%s.cq.iterations = %u: at most 100000", layer, side,
                  c->iterations);
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
    kvq_status st = check_method(&L->keys, 1, l, L->head_dim, c->page_size, message, size);
    if (st) return st;
    st = check_method(&L->values, 0, l, L->head_dim, c->page_size, message, size);
    if (st) return st;
  }
  return kvq_policy_validate(&c->policy, c->page_size, c->residual_window, message, size);
}

static uint32_t pack_level_bits(const kvq_polar_config *p) {
  uint32_t packed = 0;
  for (uint32_t l = 0; l < p->levels; l++) packed |= p->bits[l] << (4 * l);
  return packed;
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
  case KVQ_METHOD_KIVI:
    s->bits = mc->kivi.bits;
    s->group = mc->kivi.group_tokens ? mc->kivi.group_tokens : P;
    s->head_bytes = kvq_kivi_head_bytes(P, d, s->bits, s->group);
    break;
  case KVQ_METHOD_POLAR:
    s->levels = mc->polar.levels;
    s->level_bits = pack_level_bits(&mc->polar);
    s->rotation = (uint32_t)mc->polar.rotation;
    s->codebook = (uint32_t)mc->polar.codebook;
    s->head_bytes = kvq_polar_head_bytes(P, d, s->levels, s->level_bits);
    break;
  case KVQ_METHOD_CQ:
    s->channels = mc->cq.channels;
    s->code_bits = mc->cq.bits;
    s->iterations = mc->cq.iterations;
    s->head_bytes = kvq_cq_head_bytes(P, d, s->channels, s->code_bits);
    break;
  }
  s->page_bytes = (uint64_t)s->head_bytes * hkv;
}

kvq_fixed_kind kvq_side_fixed_kind(const kvq_side_layout *s, int index) {
  switch (s->method) {
  case KVQ_LAYOUT_QJL: return index == 0 || s->outliers ? KVQ_FIXED_RANDOM : KVQ_FIXED_NONE;
  case KVQ_LAYOUT_POLAR:
    return index == 0 ? KVQ_FIXED_RANDOM : s->codebook == KVQ_CODEBOOK_ONLINE ? KVQ_FIXED_LEARNED : KVQ_FIXED_COMPUTED;
  case KVQ_LAYOUT_CQ: return index == 1 ? KVQ_FIXED_LEARNED : KVQ_FIXED_NONE;
  }
  return KVQ_FIXED_NONE;
}

uint64_t kvq_side_fixed_floats(const kvq_side_layout *s, int index) {
  if (kvq_side_fixed_kind(s, index) == KVQ_FIXED_NONE) return 0;
  switch (s->method) {
  case KVQ_LAYOUT_QJL: return (uint64_t)(index == 0 ? s->sketch_dim : s->outlier_sketch_dim) * s->head_dim;
  case KVQ_LAYOUT_POLAR:
    if (index == 0) return s->rotation == KVQ_ROTATION_DENSE ? (uint64_t)s->head_dim * s->head_dim : s->head_dim;
    return (uint64_t)(s->codebook == KVQ_CODEBOOK_ONLINE ? s->kv_heads : 1) * kvq_polar_table_floats(s->levels, s->level_bits);
  case KVQ_LAYOUT_CQ: return (uint64_t)s->kv_heads * s->head_dim << s->code_bits;
  }
  return 0;
}

uint32_t kvq_side_fixed_purpose(const kvq_side_layout *s, int index) {
  if (s->method == KVQ_LAYOUT_POLAR)
    return s->rotation == KVQ_ROTATION_DENSE ? KVQ_PURPOSE_POLAR_ROTATION : KVQ_PURPOSE_POLAR_SIGNS;
  return index == 0 ? KVQ_PURPOSE_QJL_SKETCH : KVQ_PURPOSE_QJL_OUTLIER_SKETCH;
}

const char *kvq_fixed_name(const kvq_side_layout *s, int index) {
  switch (s->method) {
  case KVQ_LAYOUT_QJL: return index == 0 ? "the QJL sketch S" : "the QJL outlier sketch S_o";
  case KVQ_LAYOUT_POLAR:
    if (index == 0) return s->rotation == KVQ_ROTATION_DENSE ? "the PolarQuant rotation" : "the Hadamard signs";
    return s->codebook == KVQ_CODEBOOK_ONLINE ? "the learned codebook tables" : "the offline codebook tables";
  case KVQ_LAYOUT_CQ: return "the CQ codebooks";
  }
  return "a fixed array";
}

int kvq_side_needs_learning(const kvq_side_layout *s) {
  for (int i = 0; i < KVQ_SIDE_FIXED; i++)
    if (kvq_side_fixed_kind(s, i) == KVQ_FIXED_LEARNED) return 1;
  return 0;
}

uint32_t kvq_prepared_floats(const kvq_side_layout *keys) {
  switch (keys->method) {
  case KVQ_LAYOUT_QJL: return keys->sketch_dim;                    /* S q */
  case KVQ_LAYOUT_POLAR: return keys->head_dim;                    /* R q */
  case KVQ_LAYOUT_CQ: return (keys->head_dim / keys->channels) << keys->code_bits; /* <q_g, centroid> tables */
  }
  return 0;
}
