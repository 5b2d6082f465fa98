/* The README's example: a compressed cache for one layer, decode-style attention over it. */
#include <kvq/kvq.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  enum { TOKENS = 1000, QUERY_HEADS = 8, KV_HEADS = 2, HEAD_DIM = 128 };
  kvq_context *ctx;
  if (kvq_context_create(NULL, &ctx) != KVQ_OK) return 1; /* NULL: the best available backend */

  kvq_layer_config layer = {
      .query_heads = QUERY_HEADS, .kv_heads = KV_HEADS, .head_dim = HEAD_DIM,
      .keys = kvq_method_defaults(KVQ_METHOD_QJL, HEAD_DIM),       /* m 256, 8 outliers, m_o 256 */
      .values = kvq_method_defaults(KVQ_METHOD_UNIFORM, HEAD_DIM), /* 2 bits, groups of 32 */
  };
  kvq_cache_config config = {
      .layer_count = 1, .layers = &layer, .input_dtype = KVQ_DTYPE_F32,
      .page_size = 32, .residual_window = 64,  /* the newest 64 tokens stay full precision */
      .max_pages = 64, .max_sequences = 4, .seed = 42,
  };
  kvq_cache *cache;
  if (kvq_cache_create(ctx, &config, &cache) != KVQ_OK) {
    fprintf(stderr, "%s\n", kvq_context_last_error(ctx));
    return 1;
  }
  uint32_t seq;
  kvq_sequence_add(cache, &seq);

  /* Prefill: append [tokens, kv_heads, head_dim] keys and values (any strides). */
  float *k = malloc(sizeof(float) * TOKENS * KV_HEADS * HEAD_DIM);
  float *v = malloc(sizeof(float) * TOKENS * KV_HEADS * HEAD_DIM);
  for (unsigned i = 0; i < TOKENS * KV_HEADS * HEAD_DIM; i++) { /* stand-ins for a model's K and V */
    k[i] = (float)(i * 7919u % 1000u) / 500.0f - 1.0f;
    v[i] = (float)(i * 104729u % 1000u) / 500.0f - 1.0f;
  }
  int64_t kv_shape[3] = {TOKENS, KV_HEADS, HEAD_DIM};
  kvq_tensor keys = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, kv_shape);
  kvq_tensor values = kvq_tensor_host(v, KVQ_DTYPE_F32, 3, kv_shape);
  kvq_status st = kvq_append(cache, seq, 0, &keys, &values);
  if (st != KVQ_OK) {
    fprintf(stderr, "append: %s: %s\n", kvq_status_string(st), kvq_context_last_error(ctx));
    return 1;
  }

  /* Decode step: one query position, all query heads, attending to every token (causal). */
  float q[QUERY_HEADS * HEAD_DIM], out[QUERY_HEADS * HEAD_DIM];
  for (int i = 0; i < QUERY_HEADS * HEAD_DIM; i++) q[i] = (float)((i * 31) % 17) / 8.0f - 1.0f;
  int64_t q_shape[3] = {1, QUERY_HEADS, HEAD_DIM};
  kvq_attention_request request = {
      .sequence = seq, .mask = KVQ_MASK_CAUSAL,
      .queries = kvq_tensor_host(q, KVQ_DTYPE_F32, 3, q_shape),
      .output = kvq_tensor_host(out, KVQ_DTYPE_F32, 3, q_shape),
  };
  st = kvq_attention(cache, 0, &request, 1);
  if (st != KVQ_OK) {
    fprintf(stderr, "attention: %s: %s\n", kvq_status_string(st), kvq_context_last_error(ctx));
    return 1;
  }

  kvq_memory_report mem;
  kvq_cache_memory(cache, &mem);
  printf("attention output[0..3]: %.4f %.4f %.4f %.4f\n", out[0], out[1], out[2], out[3]);
  printf("%.3f bits per number (keys %.3f, values %.3f), %u pages used\n", mem.bits_per_number,
         mem.key_bits_per_number, mem.value_bits_per_number, mem.pages_used);

  kvq_cache_destroy(cache);
  kvq_context_destroy(ctx);
  free(k);
  free(v);
  return 0;
}
