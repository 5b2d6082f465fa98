/* The forward pass, read off the graph (docs/MODEL.md, "Forward pass"): embeddings, positions,
 * two pre-LayerNorm transformer layers whose attention a callback computes, mean pooling, a tanh
 * layer and L2 normalization. Tokens are rows; one sentence at a time. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* out[t][n] = bias[n] + sum_i x[t][i] w[i][n]: the graph's MatMul, Tensordot and 1x1 Conv2D with
 * row-major [in][out] kernels. The kernel's rows are the outer loop so that each is read from
 * memory once per sentence, not once per token (the weights, 28 MB, do not fit in cache); the
 * same additions in the same order per output either way.
 * Speed (this loop is most of kvq demo's time): eight kernel rows per pass over an output row, so
 * that the output is loaded and stored once per eight products instead of once per product; each
 * output still receives its products one by one in row order, each product and sum rounded on its
 * own (-ffp-contract=off), so the results are the one-row loop's bit for bit. `restrict` lets the
 * compiler vectorize without checking for overlap; on x86-64 an AVX2 copy is built next to the
 * baseline one and chosen at load time where the CPU has it (the same operations, 8 lanes). */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DENSE_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef DENSE_CLONES
#define DENSE_CLONES
#endif

DENSE_CLONES
static void dense(const float *restrict x, uint32_t tokens, uint32_t in, const float *restrict w,
                  const float *restrict bias, uint32_t out_dim, float *restrict out) {
  for (size_t t = 0; t < tokens; t++) memcpy(out + t * out_dim, bias, out_dim * sizeof *out);
  size_t i = 0;
  for (; i + 8 <= in; i += 8) {
    const float *w0 = w + i * out_dim, *w1 = w0 + out_dim, *w2 = w1 + out_dim, *w3 = w2 + out_dim;
    const float *w4 = w3 + out_dim, *w5 = w4 + out_dim, *w6 = w5 + out_dim, *w7 = w6 + out_dim;
    for (size_t t = 0; t < tokens; t++) {
      const float *a = x + t * in + i;
      float *o = out + t * out_dim;
      for (size_t n = 0; n < out_dim; n++)
        o[n] = o[n] + a[0] * w0[n] + a[1] * w1[n] + a[2] * w2[n] + a[3] * w3[n] + a[4] * w4[n] + a[5] * w5[n] +
               a[6] * w6[n] + a[7] * w7[n];
    }
  }
  for (; i < in; i++) {
    const float *wi = w + i * out_dim;
    for (size_t t = 0; t < tokens; t++) {
      const float a = x[t * in + i];
      float *o = out + t * out_dim;
      for (size_t n = 0; n < out_dim; n++) o[n] += a * wi[n];
    }
  }
}

/* The graph's layer_norm: (x - mean) * rsqrt(mean((x - mean)^2) + epsilon) * scale + bias. */
static void layer_norm(const float *x, uint32_t tokens, uint32_t dim, const float *scale, const float *bias,
                       float epsilon, float *out) {
  for (uint32_t t = 0; t < tokens; t++) {
    const float *xt = x + (size_t)t * dim;
    double mean = 0, var = 0;
    for (uint32_t i = 0; i < dim; i++) mean += xt[i];
    mean /= dim;
    for (uint32_t i = 0; i < dim; i++) var += (xt[i] - mean) * (xt[i] - mean);
    var /= dim;
    const double r = 1.0 / sqrt(var + epsilon);
    for (uint32_t i = 0; i < dim; i++) out[(size_t)t * dim + i] = (float)((xt[i] - mean) * r * scale[i] + bias[i]);
  }
}

typedef struct buffers {
  float *x, *norm, *qkv, *att, *y, *ffn, *next;
} buffers;

/* One transformer layer: x [tokens][in] -> next [tokens][USE_HIDDEN]. */
static kvq_status layer_forward(const kvq_use_model *m, uint32_t l, uint32_t tokens, buffers *b,
                                kvq_use_attention_fn attention, void *user) {
  const use_layer *L = &m->layers[l];
  const uint32_t in = L->in, h = USE_HIDDEN;
  layer_norm(b->x, tokens, in, L->ln1_scale, L->ln1_bias, m->ln_epsilon, b->norm);
  dense(b->norm, tokens, in, L->qkv_w, L->qkv_b, 3 * in, b->qkv);
  /* split: q, k, v are consecutive `in`-wide slices of each row, head j at channels j*head_dim.. */
  float *q = b->att + (size_t)tokens * in; /* q, k, v [tokens][in] after the output's room */
  float *k = q + (size_t)tokens * in, *v = k + (size_t)tokens * in;
  for (uint32_t t = 0; t < tokens; t++) {
    const float *row = b->qkv + (size_t)t * 3 * in;
    for (uint32_t c = 0; c < in; c++) {
      q[(size_t)t * in + c] = L->q_ratio == 1.0f ? row[c] : row[c] * L->q_ratio;
      k[(size_t)t * in + c] = row[in + c];
      v[(size_t)t * in + c] = row[2 * in + c];
    }
  }
  kvq_status status = attention(user, l, tokens, L->heads, L->head_dim, q, k, v, b->att);
  if (status != KVQ_OK) return status;
  dense(b->att, tokens, in, L->out_w, L->out_b, h, b->y);
  if (L->res_w) {
    dense(b->x, tokens, in, L->res_w, L->res_b, h, b->next); /* AdjustResidualInput */
    for (size_t i = 0; i < (size_t)tokens * h; i++) b->y[i] += b->next[i];
  } else {
    for (size_t i = 0; i < (size_t)tokens * h; i++) b->y[i] += b->x[i];
  }
  layer_norm(b->y, tokens, h, L->ln2_scale, L->ln2_bias, m->ln_epsilon, b->norm);
  dense(b->norm, tokens, h, L->ffn1_w, L->ffn1_b, USE_FFN, b->ffn);
  for (size_t i = 0; i < (size_t)tokens * USE_FFN; i++) b->ffn[i] = b->ffn[i] > 0 ? b->ffn[i] : 0;
  dense(b->ffn, tokens, USE_FFN, L->ffn2_w, L->ffn2_b, h, b->next);
  for (size_t i = 0; i < (size_t)tokens * h; i++) b->next[i] += b->y[i];
  return KVQ_OK;
}

kvq_status kvq_use_embed_ids(const kvq_use_model *m, const int32_t *ids, size_t count, kvq_use_attention_fn attention,
                             void *user, float *embedding, char *message, size_t size) {
  use_message(message, size, "%s", "");
  if (!m || !ids || !attention || !embedding || count == 0) {
    use_message(message, size, "kvq_use_embed_ids: NULL argument or no tokens");
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  for (size_t t = 0; t < count; t++) {
    if (ids[t] < 0 || ids[t] >= USE_VOCAB_ROWS) {
      use_message(message, size, "token %zu: id %d is outside the embedding table", t, ids[t]);
      return KVQ_ERROR_OUT_OF_RANGE;
    }
  }
  const uint32_t tokens = count < m->max_tokens ? (uint32_t)count : m->max_tokens; /* ClipToMaxLength */
  const size_t rows = tokens, h = USE_HIDDEN;
  buffers b;
  float *all = malloc(sizeof(float) * rows * (h + h + 3 * h + 4 * h + h + USE_FFN + h));
  if (!all) return KVQ_ERROR_OUT_OF_MEMORY;
  b.x = all;
  b.norm = b.x + rows * h;
  b.qkv = b.norm + rows * h;
  b.att = b.qkv + rows * 3 * h; /* output, then q, k, v */
  b.y = b.att + rows * 4 * h;
  b.ffn = b.y + rows * h;
  b.next = b.ffn + rows * USE_FFN;
  /* Layer_0/add: the embedding plus (the embedding plus the timing signal) -- the graph adds the
   * looked-up embedding twice (docs/MODEL.md) */
  for (uint32_t t = 0; t < tokens; t++) {
    const float *e = m->embeddings + (size_t)ids[t] * USE_INPUT_DIM;
    float *x = b.x + (size_t)t * USE_INPUT_DIM;
    for (uint32_t c = 0; c < USE_TIMESCALES; c++) {
      const float angle = (float)t * m->timescales[c]; /* TimingSignal/mul_2 in fp32 */
      const float timing_sin = sinf(angle), timing_cos = cosf(angle);
      x[c] = e[c] + (e[c] + timing_sin);
      x[USE_TIMESCALES + c] = e[USE_TIMESCALES + c] + (e[USE_TIMESCALES + c] + timing_cos);
    }
  }
  kvq_status status = KVQ_OK;
  for (uint32_t l = 0; l < KVQ_USE_LAYERS && status == KVQ_OK; l++) {
    status = layer_forward(m, l, tokens, &b, attention, user);
    if (status != KVQ_OK) {
      use_message(message, size, "layer %u: the attention callback failed: %s", l, kvq_status_string(status));
    } else {
      float *swap = b.x;
      b.x = b.next;
      b.next = swap;
    }
  }
  if (status == KVQ_OK) {
    /* mean over the tokens (SequenceMask, Sum, div by max(length, 1)), tanh layer, L2 norm */
    float pooled[USE_HIDDEN], hidden[USE_HIDDEN];
    for (size_t c = 0; c < h; c++) {
      double sum = 0;
      for (size_t t = 0; t < rows; t++) sum += b.x[t * h + c];
      pooled[c] = (float)(sum / (double)rows);
    }
    dense(pooled, 1, USE_HIDDEN, m->tanh_w, m->tanh_b, USE_HIDDEN, hidden);
    double norm = 0;
    for (size_t c = 0; c < h; c++) {
      hidden[c] = tanhf(hidden[c]);
      norm += (double)hidden[c] * hidden[c];
    }
    const double r = 1.0 / sqrt(norm > m->l2_epsilon ? norm : m->l2_epsilon);
    for (size_t c = 0; c < h; c++) embedding[c] = (float)(hidden[c] * r);
  }
  free(all);
  return status;
}

kvq_status kvq_use_embed(const kvq_use_model *m, const char *text, kvq_use_attention_fn attention, void *user,
                         float *embedding, char *message, size_t size) {
  use_message(message, size, "%s", "");
  if (!m || !text) return KVQ_ERROR_INVALID_ARGUMENT;
  size_t count = 0;
  kvq_status status = kvq_use_tokenize(m, text, NULL, 0, &count);
  if (status != KVQ_OK && status != KVQ_ERROR_BUFFER_TOO_SMALL) {
    use_message(message, size, "cannot tokenize the text: %s", kvq_status_string(status));
    return status;
  }
  if (count == 0) {
    use_message(message, size, "the text has no tokens");
    return KVQ_ERROR_INVALID_ARGUMENT;
  }
  int32_t *ids = malloc(count * sizeof *ids);
  if (!ids) return KVQ_ERROR_OUT_OF_MEMORY;
  status = kvq_use_tokenize(m, text, ids, count, &count);
  if (status == KVQ_OK) status = kvq_use_embed_ids(m, ids, count, attention, user, embedding, message, size);
  free(ids);
  return status;
}
