/*
 * CPU attention jobs: scaled logits over pages and the full-precision window, a masked softmax, and
 * the probability-weighted sum of values. Accumulation is in double: the reference should carry no
 * error beyond what the stored codes imply.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/layout.h"
#include "core/tensor.h"
#include "cpu.h"

/* Where token t of a sequence lives, for one kv head of one side. */
typedef struct token_source {
  const uint8_t *block; /* page head block, or NULL for a window token */
  uint32_t index;       /* token index inside the page */
  const uint8_t *raw;   /* window token's head vector in the window dtype */
} token_source;

static token_source locate(const kvq_job_attention *job, const kvq_attention_seq *seq, const kvq_side_desc *side,
                           const kvq_buffer *pages, const kvq_buffer *ring, uint32_t kv_head, uint32_t t) {
  const kvq_side_layout *s = &side->layout;
  token_source src = {0};
  if (t < seq->quantized) {
    uint32_t slot = job->page_slots[seq->page_first + t / s->page_size];
    src.block = pages->data + (uint64_t)slot * s->page_bytes + (uint64_t)kv_head * s->head_bytes;
    src.index = t % s->page_size;
  } else {
    uint64_t esize = job->window_dtype == KVQ_DTYPE_F32 ? 4 : 2;
    uint64_t slot = t % seq->ring_capacity;
    src.raw = ring->data + seq->ring_offset + (slot * s->kv_heads + kv_head) * s->head_dim * esize;
  }
  return src;
}

static void load_token(const kvq_job_attention *job, const cpu_head *head, const token_source *src, float *out) {
  if (src->block)
    kvq_cpu_method(head->side->layout.method)->decode(head, src->block, src->index, out);
  else
    kvq_convert_to_f32(job->window_dtype, src->raw, out, head->side->layout.head_dim);
}

static double dot_f64(const float *a, const float *b, uint32_t d) {
  double dot = 0.0;
  for (uint32_t c = 0; c < d; c++) dot += (double)a[c] * b[c];
  return dot;
}

static uint64_t seq_tokens(const kvq_attention_seq *seq) { return (uint64_t)seq->quantized + seq->window; }

/* Whether query row r of a sequence may attend to token t. */
static int visible(const kvq_attention_seq *seq, uint32_t r, uint64_t t) {
  if (seq->mask == KVQ_MASK_NONE) return 1;
  return t <= (uint64_t)seq->query_position + r;
}

kvq_status kvq_cpu_score(kvq_backend *b, const kvq_job_attention *job) {
  const kvq_side_layout *ks = &job->keys->layout;
  const cpu_method *method = kvq_cpu_method(ks->method);
  const cpu_head head = kvq_cpu_head(job->keys);
  const uint32_t d = ks->head_dim, P = ks->page_size, group = job->query_heads / ks->kv_heads;
  const uint32_t pf = kvq_prepared_floats(ks);
  double *dots = malloc(sizeof(double) * P);
  float *key = malloc(sizeof(float) * d);
  if (!dots || !key) {
    free(dots);
    free(key);
    snprintf(b->message, sizeof b->message, "cpu: out of host memory for scores");
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  const float *queries = (const float *)job->queries->data;
  const float *prepared = job->prepared ? (const float *)job->prepared->data : NULL;
  float *scores = (float *)job->scores->data;
  for (uint32_t si = 0; si < job->seq_count; si++) {
    const kvq_attention_seq *seq = &job->seqs[si];
    const uint64_t n = seq_tokens(seq);
    for (uint32_t r = 0; r < seq->query_count; r++) {
      for (uint32_t h = 0; h < job->query_heads; h++) {
        const uint64_t row_index = (uint64_t)(seq->query_first + r) * job->query_heads + h;
        const float *q = queries + row_index * d;
        const float *prep = pf ? prepared + row_index * pf : NULL;
        float *row = scores + seq->score_offset + ((uint64_t)r * job->query_heads + h) * n;
        const uint32_t kvh = h / group;
        uint64_t t = 0;
        while (t < n) { /* a page's valid tokens at a time, then window tokens one by one */
          token_source src = locate(job, seq, job->keys, job->key_pages, job->key_ring, kvh, (uint32_t)t);
          uint32_t count = 1;
          if (src.block) {
            count = seq->quantized - (uint32_t)t < P ? seq->quantized - (uint32_t)t : P;
            if (method->dot_page) {
              method->dot_page(&head, src.block, count, q, prep, dots);
            } else {
              for (uint32_t i = 0; i < count; i++) {
                method->decode(&head, src.block, i, key);
                dots[i] = dot_f64(q, key, d);
              }
            }
          } else {
            load_token(job, &head, &src, key);
            dots[0] = dot_f64(q, key, d);
          }
          for (uint32_t i = 0; i < count; i++)
            row[t + i] = visible(seq, r, t + i) ? (float)(dots[i] * job->scale) : -INFINITY;
          t += count;
        }
      }
    }
  }
  free(dots);
  free(key);
  return KVQ_OK;
}

kvq_status kvq_cpu_softmax(kvq_backend *b, const kvq_job_attention *job) {
  (void)b;
  float *scores = (float *)job->scores->data;
  for (uint32_t si = 0; si < job->seq_count; si++) {
    const kvq_attention_seq *seq = &job->seqs[si];
    const uint64_t n = seq_tokens(seq);
    for (uint64_t row = 0; row < (uint64_t)seq->query_count * job->query_heads; row++) {
      float *x = scores + seq->score_offset + row * n;
      float max = -INFINITY;
      for (uint64_t t = 0; t < n; t++)
        if (x[t] > max) max = x[t];
      double sum = 0.0;
      for (uint64_t t = 0; t < n; t++) sum += x[t] == -INFINITY ? 0.0 : exp((double)x[t] - max);
      for (uint64_t t = 0; t < n; t++) x[t] = x[t] == -INFINITY ? 0.0f : (float)(exp((double)x[t] - max) / sum);
    }
  }
  return KVQ_OK;
}

kvq_status kvq_cpu_weighted_sum(kvq_backend *b, const kvq_job_attention *job) {
  const kvq_side_layout *vs = &job->values->layout;
  const cpu_head head = kvq_cpu_head(job->values);
  const uint32_t d = vs->head_dim, group = job->query_heads / vs->kv_heads;
  const float *scores = (const float *)job->scores->data;
  float *output = (float *)job->output->data;
  double *acc = malloc(sizeof(double) * d);
  float *value = malloc(sizeof(float) * d);
  if (!acc || !value) {
    free(acc);
    free(value);
    snprintf(b->message, sizeof b->message, "cpu: out of host memory for the weighted sum");
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  for (uint32_t si = 0; si < job->seq_count; si++) {
    const kvq_attention_seq *seq = &job->seqs[si];
    const uint64_t n = seq_tokens(seq);
    for (uint32_t r = 0; r < seq->query_count; r++) {
      for (uint32_t h = 0; h < job->query_heads; h++) {
        const float *p = scores + seq->score_offset + ((uint64_t)r * job->query_heads + h) * n;
        memset(acc, 0, sizeof(double) * d);
        for (uint64_t t = 0; t < n; t++) {
          if (p[t] == 0.0f) continue; /* masked (or underflowed) tokens add nothing */
          token_source src = locate(job, seq, job->values, job->value_pages, job->value_ring, h / group, (uint32_t)t);
          load_token(job, &head, &src, value);
          for (uint32_t c = 0; c < d; c++) acc[c] += (double)p[t] * value[c];
        }
        float *o = output + ((uint64_t)(seq->query_first + r) * job->query_heads + h) * d;
        for (uint32_t c = 0; c < d; c++) o[c] = (float)acc[c];
      }
    }
  }
  free(acc);
  free(value);
  return KVQ_OK;
}
