/* Loading the model: manifest, weights, wiring check, vocabulary, and the tensors the forward
 * pass reads, by their graph names (docs/MODEL.md lists them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

kvq_status kvq_use_default_dir(char *buf, size_t size) {
  const char *model_dir = getenv("KVQ_MODEL_DIR");
  const char *cache = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  int n;
  if (model_dir && *model_dir) n = snprintf(buf, size, "%s/package/dist", model_dir);
  else if (cache && *cache) n = snprintf(buf, size, "%s/kvq/use-lite-0.2.0/package/dist", cache);
  else if (home && *home) n = snprintf(buf, size, "%s/.cache/kvq/use-lite-0.2.0/package/dist", home);
  else return KVQ_ERROR_NOT_FOUND;
  return n < 0 || (size_t)n >= size ? KVQ_ERROR_BUFFER_TOO_SMALL : KVQ_OK;
}

/* The tensor lookups of one load: the first failure's message is kept. */
typedef struct getter {
  const use_weights *w;
  char *message;
  size_t size;
  int failed;
} getter;

static const void *get(getter *g, int is_int, const char *name, uint32_t rank, int64_t d0, int64_t d1, int64_t d2,
                       int64_t d3) {
  if (g->failed) return NULL;
  int64_t shape[4] = {d0, d1, d2, d3};
  const void *p = use_weights_get(g->w, name, is_int, rank, shape, g->message, g->size);
  if (!p) g->failed = 1;
  return p;
}

/* A float tensor named by a format with the layer's index. */
static const float *layer_get(getter *g, const char *format, uint32_t layer, uint32_t rank, int64_t d0, int64_t d1,
                              int64_t d2, int64_t d3) {
  char name[512];
  snprintf(name, sizeof name, format, layer);
  return get(g, 0, name, rank, d0, d1, d2, d3);
}

static int32_t get_int(getter *g, const char *name) {
  const int32_t *p = get(g, 1, name, 0, 0, 0, 0, 0);
  return p ? *p : 0;
}

static float get_float(getter *g, const char *name) {
  const float *p = get(g, 0, name, 0, 0, 0, 0, 0);
  return p ? *p : 0;
}

static kvq_status read_layers(kvq_use_model *m, char *message, size_t size) {
  getter g = {&m->weights, message, size, 0};
  m->embeddings = get(&g, 0, "module/Embeddings_en", 2, USE_VOCAB_ROWS, USE_INPUT_DIM, 0, 0);
  m->timescales = get(&g, 0, USE_STACK "Layer_0/AddTimingSignal/TimingSignal/ExpandDims_1", 2, 1, USE_TIMESCALES, 0, 0);
  m->ln_epsilon = get_float(&g, USE_STACK "Layer_1/TransformerLayer/FFN/layer_prepostprocess/layer_norm/Cast/x");
  m->l2_epsilon = get_float(&g, "module_apply_default/Encoder_en/hidden_layers/l2_normalize/Maximum/y");
  int32_t max_tokens = get_int(&g, USE_KONA "ClipToMaxLength/Less/y");
  m->tanh_w = get(&g, 0, "module/Encoder_en/hidden_layers/tanh_layer_0/weights", 2, USE_HIDDEN, USE_HIDDEN, 0, 0);
  m->tanh_b = get(&g, 0, "module/Encoder_en/hidden_layers/tanh_layer_0/bias", 1, USE_HIDDEN, 0, 0, 0);
  /* both layers' reshapes read the head count from Layer_1's constant (constant folding shared it) */
  int32_t heads = get_int(&g, USE_STACK "Layer_1/TransformerLayer/MultiheadAttention/split_heads/split_last_dimension/"
                              "Reshape/shape/2");
  for (uint32_t l = 0; l < KVQ_USE_LAYERS; l++) {
    use_layer *L = &m->layers[l];
    L->in = l == 0 ? USE_INPUT_DIM : USE_HIDDEN;
    int64_t in = L->in, h = USE_HIDDEN, f = USE_FFN;
    char name[512];
    snprintf(name, sizeof name, USE_STACK "Layer_%u/TransformerLayer/MultiheadAttention/split_heads/split_last_dimension/"
             "Reshape/shape/3", l);
    int32_t head_dim = get_int(&g, name);
    snprintf(name, sizeof name, USE_STACK "Layer_%u/TransformerLayer/MultiheadAttention/Const", l);
    const int32_t *split = get(&g, 1, name, 1, 3, 0, 0, 0);
    snprintf(name, sizeof name, USE_STACK "Layer_%u/TransformerLayer/MultiheadAttention/mul/y", l);
    float scale = get_float(&g, name);
    if (g.failed) break;
    if (heads != KVQ_USE_HEADS || head_dim * heads != in || split[0] != in || split[1] != in || split[2] != in) {
      use_message(message, size, "model.json: layer %u splits q, k, v as %d, %d, %d into %d heads of %d (expected %lld "
                  "each, %d heads)", l, split[0], split[1], split[2], heads, head_dim, (long long)in, KVQ_USE_HEADS);
      return KVQ_ERROR_BAD_FORMAT;
    }
    L->heads = (uint32_t)heads;
    L->head_dim = (uint32_t)head_dim;
    /* The graph scales q by mul/y; the callbacks scale by 1/sqrt(head_dim), as kvq does. The ratio
     * (1 here up to fp32 rounding of mul/y: 0.125 and 0.0883883) is folded into q. */
    L->q_ratio = (float)(scale * sqrt((double)head_dim));
    L->ln1_scale = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/layer_prepostprocess/layer_norm/layer_norm_scale/"
                             "ConcatPartitions/concat", l, 1, in, 0, 0, 0);
    L->ln1_bias = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/layer_prepostprocess/layer_norm/layer_norm_bias/"
                            "ConcatPartitions/concat", l, 1, in, 0, 0, 0);
    L->qkv_w = layer_get(&g, USE_VARS "Layer_%u/TransformerLayer/MultiheadAttention/qkv_transform_single/kernel/part_0", l,
                         4, 1, 1, in, 3 * in);
    L->qkv_b = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/MultiheadAttention/qkv_transform_single/bias/"
                         "ConcatPartitions/concat", l, 1, 3 * in, 0, 0, 0);
    L->out_w = layer_get(&g, USE_VARS "Layer_%u/TransformerLayer/MultiheadAttention/output_transform_single/kernel/part_0",
                         l, 4, 1, 1, in, h);
    L->out_b = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/MultiheadAttention/output_transform_single/bias/"
                         "ConcatPartitions/concat", l, 1, h, 0, 0, 0);
    if (in != h) {
      L->res_w = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/dense/kernel/ConcatPartitions/concat", l, 2, in, h, 0, 0);
      L->res_b = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/dense/bias/ConcatPartitions/concat", l, 1, h, 0, 0, 0);
    }
    L->ln2_scale = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/FFN/layer_prepostprocess/layer_norm/"
                             "layer_norm_scale/ConcatPartitions/concat", l, 1, h, 0, 0, 0);
    L->ln2_bias = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/FFN/layer_prepostprocess/layer_norm/"
                            "layer_norm_bias/ConcatPartitions/concat", l, 1, h, 0, 0, 0);
    L->ffn1_w = layer_get(&g, USE_STACK "Layer_%u/TransformerLayer/FFN/conv1/Tensordot/Reshape_1", l, 2, h, f, 0, 0);
    L->ffn1_b = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/FFN/conv1/bias/ConcatPartitions/concat", l, 1, f, 0, 0, 0);
    L->ffn2_w = layer_get(&g, USE_STACK "Layer_%u/TransformerLayer/FFN/conv2/Tensordot/Reshape_1", l, 2, f, h, 0, 0);
    L->ffn2_b = layer_get(&g, USE_ENCODE "Layer_%u/TransformerLayer/FFN/conv2/bias/ConcatPartitions/concat", l, 1, h, 0, 0, 0);
  }
  if (g.failed) return KVQ_ERROR_BAD_FORMAT;
  if (max_tokens < 1 || max_tokens > 4096 || !(m->ln_epsilon > 0) || !(m->l2_epsilon > 0)) {
    use_message(message, size, "model.json: implausible constants (max length %d, epsilons %g, %g)", max_tokens,
                m->ln_epsilon, m->l2_epsilon);
    return KVQ_ERROR_BAD_FORMAT;
  }
  m->max_tokens = (uint32_t)max_tokens;
  return KVQ_OK;
}

kvq_status use_manifest_read(const char *text, size_t bytes, cJSON **manifest, use_weights *w, char *message,
                             size_t size) {
  *manifest = NULL;
  memset(w, 0, sizeof *w);
  cJSON *json = cJSON_ParseWithLength(text, bytes);
  if (!json) {
    use_message(message, size, "model.json: not valid JSON");
    return KVQ_ERROR_BAD_FORMAT;
  }
  kvq_status status = use_wiring_check(json, message, size);
  if (status == KVQ_OK) status = use_weights_layout(json, w, message, size);
  if (status != KVQ_OK) {
    cJSON_Delete(json);
    return status;
  }
  *manifest = json;
  return KVQ_OK;
}

kvq_status kvq_use_load(const char *dir, kvq_use_model **out, char *message, size_t size) {
  use_message(message, size, "%s", "");
  if (!out) return KVQ_ERROR_INVALID_ARGUMENT;
  *out = NULL;
  if (!dir) return KVQ_ERROR_INVALID_ARGUMENT;
  /* the shards are little-endian fp32 and int32, read as they lie */
  const uint32_t one = 1;
  if (*(const unsigned char *)&one != 1) {
    use_message(message, size, "the model's weights are little-endian; this host is not");
    return KVQ_ERROR_UNSUPPORTED;
  }
  kvq_use_model *m = calloc(1, sizeof *m);
  if (!m) return KVQ_ERROR_OUT_OF_MEMORY;
  char path[4096];
  snprintf(path, sizeof path, "%s/model.json", dir);
  char *text;
  size_t bytes;
  kvq_status status = use_read_file(path, &text, &bytes, message, size);
  if (status != KVQ_OK) goto fail;
  cJSON *manifest;
  status = use_manifest_read(text, bytes, &manifest, &m->weights, message, size);
  free(text);
  if (status != KVQ_OK) goto fail;
  status = use_weights_load(dir, manifest, &m->weights, message, size);
  cJSON_Delete(manifest);
  if (status != KVQ_OK) goto fail;
  status = read_layers(m, message, size);
  if (status != KVQ_OK) goto fail;
  snprintf(path, sizeof path, "%s/vocab.json", dir);
  status = use_vocab_read(path, &m->vocab, message, size);
  if (status != KVQ_OK) goto fail;
  *out = m;
  return KVQ_OK;
fail:
  kvq_use_free(m);
  return status;
}

void kvq_use_free(kvq_use_model *m) {
  if (!m) return;
  use_weights_free(&m->weights);
  use_vocab_free(&m->vocab);
  free(m);
}

uint32_t kvq_use_max_tokens(const kvq_use_model *m) { return m ? m->max_tokens : 0; }
