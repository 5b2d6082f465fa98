/* Attention through kvq: a context on the chosen backend and one cache for both layers (kvq takes
 * a head_dim per layer), every token compressed (no full-precision window, a flush after each
 * append), unmasked attention of every query over every kept token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "method_spec.h"
#include "use.h"

enum { PAGE_SIZE = 16 };

struct kvq_use_kvq {
  kvq_context *context;
  kvq_cache *cache;
  uint32_t head_dims[KVQ_USE_LAYERS];
  uint32_t max_tokens;
  uint32_t sequence;
  int has_sequence;
  char error[512];
};

static void say(char *message, size_t size, const char *format, const char *a, const char *b) {
  if (message && size) snprintf(message, size, format, a, b);
}

kvq_status kvq_use_kvq_create(const kvq_use_kvq_options *options, uint32_t max_tokens, kvq_use_kvq **out,
                              char *message, size_t size) {
  say(message, size, "%s%s", "", "");
  if (!out) return KVQ_ERROR_INVALID_ARGUMENT;
  *out = NULL;
  if (!options || max_tokens == 0) return KVQ_ERROR_INVALID_ARGUMENT;
  /* the model's layers: 4 heads of 64, then 4 heads of 128 (model/use.h) */
  static const uint32_t head_dims[KVQ_USE_LAYERS] = {64, 128};
  kvq_layer_config layers[KVQ_USE_LAYERS];
  for (uint32_t l = 0; l < KVQ_USE_LAYERS; l++) {
    const char *spec = options->methods[l] ? options->methods[l] : "exact-f32";
    layers[l] = (kvq_layer_config){.query_heads = KVQ_USE_HEADS, .kv_heads = KVQ_USE_HEADS, .head_dim = head_dims[l]};
    if (kvq_parse_layer_spec(spec, strlen(spec), head_dims[l], &layers[l].keys, &layers[l].values) != 0) {
      say(message, size, "cannot read the method name \"%s\"%s (docs/EVAL.md, \"Method names\")", spec, "");
      return KVQ_ERROR_INVALID_ARGUMENT;
    }
  }
  kvq_cache_config config = {
      .layer_count = KVQ_USE_LAYERS,
      .layers = layers,
      .input_dtype = KVQ_DTYPE_F32,
      .page_size = PAGE_SIZE,
      .residual_window = 0, /* every token compressed */
      .max_pages = (max_tokens + PAGE_SIZE - 1) / PAGE_SIZE,
      .max_sequences = 1,
      .seed = options->seed,
      .policy = options->policy,
  };
  kvq_use_kvq *s = calloc(1, sizeof *s);
  if (!s) return KVQ_ERROR_OUT_OF_MEMORY;
  s->max_tokens = max_tokens;
  memcpy(s->head_dims, head_dims, sizeof head_dims);
  kvq_context_options context_options = kvq_context_options_default();
  context_options.backend = options->backend;
  kvq_status status = kvq_context_create(&context_options, &s->context);
  if (status != KVQ_OK) {
    say(message, size, "no kvq context on that backend: %s%s (kvq info says why)", kvq_status_string(status), "");
    free(s);
    return status;
  }
  status = kvq_cache_create(s->context, &config, &s->cache);
  if (status != KVQ_OK) {
    say(message, size, "kvq refused the cache: %s%s", kvq_context_last_error(s->context), "");
    kvq_use_kvq_destroy(s);
    return status;
  }
  *out = s;
  return KVQ_OK;
}

void kvq_use_kvq_destroy(kvq_use_kvq *s) {
  if (!s) return;
  kvq_cache_destroy(s->cache);
  kvq_context_destroy(s->context);
  free(s);
}

const char *kvq_use_kvq_last_error(const kvq_use_kvq *s) { return s ? s->error : ""; }

kvq_cache *kvq_use_kvq_cache(kvq_use_kvq *s) { return s ? s->cache : NULL; }

kvq_status kvq_use_kvq_sequence(const kvq_use_kvq *s, uint32_t *sequence) {
  if (!s || !sequence || !s->has_sequence) return KVQ_ERROR_INVALID_ARGUMENT;
  *sequence = s->sequence;
  return KVQ_OK;
}

static kvq_status fail(kvq_use_kvq *s, const char *what, kvq_status status) {
  snprintf(s->error, sizeof s->error, "%s: %s: %s", what, kvq_status_string(status), kvq_context_last_error(s->context));
  return status;
}

kvq_status kvq_use_kvq_attention(void *user, uint32_t layer, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                                 const float *q, const float *k, const float *v, float *out) {
  kvq_use_kvq *s = user;
  if (!s || !q || !k || !v || !out) return KVQ_ERROR_INVALID_ARGUMENT;
  s->error[0] = 0;
  if (layer >= KVQ_USE_LAYERS || heads != KVQ_USE_HEADS || head_dim != s->head_dims[layer] || tokens == 0 ||
      tokens > s->max_tokens) {
    snprintf(s->error, sizeof s->error, "layer %u with %u tokens of %u heads of %u does not fit this cache", layer,
             tokens, heads, head_dim);
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  kvq_status status;
  if (layer == 0) { /* a new sentence */
    if (s->has_sequence) {
      status = kvq_sequence_free(s->cache, s->sequence);
      if (status != KVQ_OK) return fail(s, "freeing the previous sentence", status);
      s->has_sequence = 0;
    }
    status = kvq_sequence_add(s->cache, &s->sequence);
    if (status != KVQ_OK) return fail(s, "adding a sequence", status);
    s->has_sequence = 1;
  } else if (!s->has_sequence) {
    snprintf(s->error, sizeof s->error, "layer %u before layer 0", layer);
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  const int64_t shape[3] = {tokens, heads, head_dim};
  /* kvq only reads its inputs: the casts drop const for kvq_tensor's void * */
  kvq_tensor keys = kvq_tensor_host((void *)(uintptr_t)k, KVQ_DTYPE_F32, 3, shape);
  kvq_tensor values = kvq_tensor_host((void *)(uintptr_t)v, KVQ_DTYPE_F32, 3, shape);
  status = kvq_append(s->cache, s->sequence, layer, &keys, &values);
  if (status != KVQ_OK) return fail(s, "appending keys and values", status);
  status = kvq_flush(s->cache, s->sequence); /* no token stays in full precision */
  if (status != KVQ_OK) return fail(s, "quantizing the last page", status);
  kvq_attention_request request = {
      .sequence = s->sequence,
      .mask = KVQ_MASK_NONE,
      .queries = kvq_tensor_host((void *)(uintptr_t)q, KVQ_DTYPE_F32, 3, shape),
      .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, shape),
  };
  status = kvq_attention(s->cache, layer, &request, 1);
  if (status != KVQ_OK) return fail(s, "attention", status);
  return KVQ_OK;
}
