/* One layer's real Q, K, V for a text (what `kvq dump` writes): the exact forward pass with a
 * callback that copies the layer's inputs on their way to the reference attention. */
#include <string.h>

#include "internal.h"

typedef struct capture {
  uint32_t layer;
  float *q, *k, *v;
  size_t capacity;
  uint32_t tokens, head_dim;
  int too_small;
} capture;

static kvq_status capture_attention(void *user, uint32_t layer, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                                    const float *q, const float *k, const float *v, float *out) {
  capture *c = user;
  if (layer == c->layer) {
    const size_t n = (size_t)tokens * heads * head_dim;
    c->tokens = tokens;
    c->head_dim = head_dim;
    if (n > c->capacity) {
      c->too_small = 1;
      return KVQ_ERROR_BUFFER_TOO_SMALL; /* the rest of the pass is not needed */
    }
    memcpy(c->q, q, n * sizeof *q);
    memcpy(c->k, k, n * sizeof *k);
    memcpy(c->v, v, n * sizeof *v);
  }
  return kvq_use_attention_exact(NULL, layer, tokens, heads, head_dim, q, k, v, out);
}

kvq_status kvq_use_layer_qkv(const kvq_use_model *m, const int32_t *ids, size_t count, uint32_t layer, float *q,
                             float *k, float *v, size_t capacity, uint32_t *tokens, uint32_t *head_dim, char *message,
                             size_t size) {
  use_message(message, size, "%s", "");
  if (!m || !q || !k || !v || !tokens || !head_dim || layer >= KVQ_USE_LAYERS) {
    use_message(message, size, "kvq_use_layer_qkv: NULL argument or no layer %u", layer);
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  capture c = {.layer = layer, .q = q, .k = k, .v = v, .capacity = capacity};
  float embedding[KVQ_USE_EMBEDDING_DIM];
  kvq_status status = kvq_use_embed_ids(m, ids, count, capture_attention, &c, embedding, message, size);
  if (c.too_small) {
    use_message(message, size, "layer %u's q, k, v need %zu floats each, the buffers hold %zu", layer,
                (size_t)c.tokens * KVQ_USE_HEADS * c.head_dim, capacity);
    *tokens = c.tokens;
    *head_dim = c.head_dim;
    return KVQ_ERROR_BUFFER_TOO_SMALL;
  }
  if (status != KVQ_OK) return status;
  *tokens = c.tokens;
  *head_dim = c.head_dim;
  return KVQ_OK;
}
