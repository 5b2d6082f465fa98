/* Attention through kvq: a context on the chosen backend and one cache for both layers (kvq takes
 * a head_dim per layer), every token compressed (no full-precision window, a flush after each
 * append), unmasked attention of every query over every kept token. Under a token policy each
 * layer has a sequence of its own, attended twice: once for the policy to observe, once over the
 * tokens it keeps (docs/MODEL.md, "Token policies"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "method_spec.h"
#include "policy_spec.h"
#include "use.h"

enum { PAGE_SIZE = 16 };

struct kvq_use_kvq {
  kvq_context *context;
  kvq_cache *cache;
  uint32_t head_dims[KVQ_USE_LAYERS];
  uint32_t max_tokens;
  /* without a policy sequences[0] holds both layers; with one, sequences[l] holds layer l */
  uint32_t sequences[KVQ_USE_LAYERS];
  int has_sequence[KVQ_USE_LAYERS];
  uint32_t current; /* the sequence the last call attended over */
  int has_current;
  kvq_policy_kind policy;
  float *zeros; /* with a policy: the placeholder of the other layer, [max_tokens][heads][128] */
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
  /* a policy's sentence takes a sequence per layer (see kvq_use_kvq_attention) */
  const int evicting = options->policy.kind != KVQ_POLICY_KEEP_ALL;
  const uint32_t sequences = evicting ? KVQ_USE_LAYERS : 1;
  kvq_cache_config config = {
      .layer_count = KVQ_USE_LAYERS,
      .layers = layers,
      .input_dtype = KVQ_DTYPE_F32,
      .page_size = PAGE_SIZE,
      .residual_window = 0, /* every token compressed */
      .max_pages = (max_tokens + PAGE_SIZE - 1) / PAGE_SIZE * sequences,
      .max_sequences = sequences,
      .seed = options->seed,
      .policy = options->policy,
  };
  kvq_use_kvq *s = calloc(1, sizeof *s);
  if (!s) return KVQ_ERROR_OUT_OF_MEMORY;
  s->max_tokens = max_tokens;
  s->policy = options->policy.kind;
  memcpy(s->head_dims, head_dims, sizeof head_dims);
  const size_t widest = (size_t)max_tokens * KVQ_USE_HEADS * head_dims[KVQ_USE_LAYERS - 1];
  if (evicting && !(s->zeros = calloc(widest, sizeof(float)))) {
    free(s);
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
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
  free(s->zeros);
  free(s);
}

const char *kvq_use_kvq_last_error(const kvq_use_kvq *s) { return s ? s->error : ""; }

kvq_cache *kvq_use_kvq_cache(kvq_use_kvq *s) { return s ? s->cache : NULL; }

kvq_status kvq_use_kvq_sequence(const kvq_use_kvq *s, uint32_t *sequence) {
  if (!s || !sequence || !s->has_current) return KVQ_ERROR_INVALID_ARGUMENT;
  *sequence = s->current;
  return KVQ_OK;
}

kvq_status kvq_use_kvq_policy(kvq_policy_kind kind, float lambda, uint32_t budget, kvq_policy_config *policy,
                              char *message, size_t size) {
  say(message, size, "%s%s", "", "");
  if (!policy || (unsigned)kind > KVQ_POLICY_QHITTER) return KVQ_ERROR_INVALID_ARGUMENT;
  if (kind == KVQ_POLICY_KEEP_ALL) {
    *policy = (kvq_policy_config){0};
    return KVQ_OK;
  }
  /* StreamingLLM's 4 sinks, and the least recent window kvq allows with no full-precision window:
   * one page (the end of a sentence means nothing special to a bidirectional encoder) */
  const uint32_t sinks = kvq_policy_defaults(kind).sinks, recent = PAGE_SIZE;
  if (budget < sinks + recent || budget > 0x7fffffffu) {
    if (message && size)
      snprintf(message, size,
               "a token budget of %u: from %u (the %u first tokens and the %u newest, one page, that every policy "
               "keeps) to 2^31 - 1",
               budget, sinks + recent, sinks, recent);
    return KVQ_ERROR_OUT_OF_RANGE;
  }
  if (!(lambda >= 0.0f && lambda <= 1.0f)) {
    if (message && size) snprintf(message, size, "Q-Hitter's lambda %g: from 0 to 1", (double)lambda);
    return KVQ_ERROR_OUT_OF_RANGE;
  }
  *policy = kvq_policy_for_budget(kind, lambda, budget, sinks, recent);
  return KVQ_OK;
}

static kvq_status fail(kvq_use_kvq *s, const char *what, kvq_status status) {
  snprintf(s->error, sizeof s->error, "%s: %s: %s", what, kvq_status_string(status), kvq_context_last_error(s->context));
  return status;
}

/* Frees the sentence's sequences (before the next sentence). */
static kvq_status free_sequences(kvq_use_kvq *s) {
  s->has_current = 0;
  for (uint32_t l = 0; l < KVQ_USE_LAYERS; l++) {
    if (!s->has_sequence[l]) continue;
    const kvq_status status = kvq_sequence_free(s->cache, s->sequences[l]);
    if (status != KVQ_OK) return fail(s, "freeing the previous sentence", status);
    s->has_sequence[l] = 0;
  }
  return KVQ_OK;
}

static kvq_status append(kvq_use_kvq *s, uint32_t sequence, uint32_t layer, uint32_t tokens, const float *k,
                         const float *v) {
  const int64_t shape[3] = {tokens, KVQ_USE_HEADS, s->head_dims[layer]};
  /* kvq only reads its inputs: the casts drop const for kvq_tensor's void * */
  kvq_tensor keys = kvq_tensor_host((void *)(uintptr_t)k, KVQ_DTYPE_F32, 3, shape);
  kvq_tensor values = kvq_tensor_host((void *)(uintptr_t)v, KVQ_DTYPE_F32, 3, shape);
  const kvq_status status = kvq_append(s->cache, sequence, layer, &keys, &values);
  return status == KVQ_OK ? KVQ_OK : fail(s, "appending keys and values", status);
}

static kvq_status attend(kvq_use_kvq *s, uint32_t sequence, uint32_t layer, uint32_t tokens, const float *q,
                         float *out) {
  const int64_t shape[3] = {tokens, KVQ_USE_HEADS, s->head_dims[layer]};
  kvq_attention_request request = {
      .sequence = sequence,
      .mask = KVQ_MASK_NONE,
      .queries = kvq_tensor_host((void *)(uintptr_t)q, KVQ_DTYPE_F32, 3, shape),
      .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, shape),
  };
  const kvq_status status = kvq_attention(s->cache, layer, &request, 1);
  return status == KVQ_OK ? KVQ_OK : fail(s, "attention", status);
}

/*
 * Under a policy. kvq decides once for a whole sequence, over all its layers, and only when every
 * layer holds the same tokens; an encoder's layer 1 keys exist only after layer 0's attention. So
 * each layer gets a sequence of its own, whose other layer holds zeros (the same placeholder for
 * every token): the sentence's T tokens are appended and quantized, every query attends once (H2O
 * and Q-Hitter accumulate that attention, A_t), the policy keeps its budget, and every query
 * attends again over the kept tokens: that is the layer's output.
 */
static kvq_status attention_evicting(kvq_use_kvq *s, uint32_t layer, uint32_t tokens, const float *q, const float *k,
                                     const float *v, float *out) {
  if (s->has_sequence[layer]) {
    snprintf(s->error, sizeof s->error, "layer %u twice in a sentence (a policy's sentence is one step)", layer);
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  kvq_status status = kvq_sequence_add(s->cache, &s->sequences[layer]);
  if (status != KVQ_OK) return fail(s, "adding a sequence", status);
  s->has_sequence[layer] = 1;
  const uint32_t sequence = s->sequences[layer];
  for (uint32_t l = 0; l < KVQ_USE_LAYERS; l++) {
    status = l == layer ? append(s, sequence, l, tokens, k, v) : append(s, sequence, l, tokens, s->zeros, s->zeros);
    if (status != KVQ_OK) return status;
  }
  status = kvq_flush(s->cache, sequence); /* no token stays in full precision */
  if (status != KVQ_OK) return fail(s, "quantizing the last page", status);
  if (s->policy == KVQ_POLICY_H2O || s->policy == KVQ_POLICY_QHITTER) { /* the scores they rank by */
    status = attend(s, sequence, layer, tokens, q, out);
    if (status != KVQ_OK) return status;
  }
  status = kvq_sequence_apply_policy(s->cache, sequence);
  if (status != KVQ_OK) return fail(s, "the token policy", status);
  s->current = sequence, s->has_current = 1;
  return attend(s, sequence, layer, tokens, q, out);
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
    if ((status = free_sequences(s)) != KVQ_OK) return status;
  } else if (!s->has_sequence[0]) {
    snprintf(s->error, sizeof s->error, "layer %u before layer 0", layer);
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  if (s->policy != KVQ_POLICY_KEEP_ALL) return attention_evicting(s, layer, tokens, q, k, v, out);
  if (layer == 0) {
    status = kvq_sequence_add(s->cache, &s->sequences[0]);
    if (status != KVQ_OK) return fail(s, "adding a sequence", status);
    s->has_sequence[0] = 1;
    s->current = s->sequences[0], s->has_current = 1;
  }
  if ((status = append(s, s->sequences[0], layer, tokens, k, v)) != KVQ_OK) return status;
  status = kvq_flush(s->cache, s->sequences[0]); /* no token stays in full precision */
  if (status != KVQ_OK) return fail(s, "quantizing the last page", status);
  return attend(s, s->sequences[0], layer, tokens, q, out);
}
