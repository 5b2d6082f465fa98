/*
 * CPU attention jobs: scaled logits over pages and the full-precision window, a masked softmax, and
 * the probability-weighted sum of values. Accumulation is in double: the reference should carry no
 * error beyond what the stored codes imply.
 *
 * Both SCORE and WEIGHTED_SUM walk a sequence block by block (a page's valid tokens, then the window
 * tokens) per kv head, decode the block once, and use it for every query row and every query head of
 * that kv head's GQA group.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/layout.h"
#include "core/tensor.h"
#include "cpu.h"

/* A run of consecutive tokens of one kv head: up to a page of quantized tokens, or one window token
 * (the ring may wrap, so window tokens go one at a time). */
typedef struct token_block {
  uint32_t first, count;
  const uint8_t *page; /* page head block, or NULL for a window token */
  const uint8_t *raw;  /* window token's head vector in the window dtype */
} token_block;

static uint64_t seq_tokens(const kvq_attention_seq *seq) { return (uint64_t)seq->quantized + seq->window; }

static token_block block_at(const kvq_job_attention *job, const kvq_attention_seq *seq, const kvq_side_layout *s,
                            const kvq_buffer *pages, const kvq_buffer *ring, uint32_t kv_head, uint32_t t) {
  token_block b = {.first = t, .count = 1};
  if (t < seq->quantized) {
    uint32_t slot = job->page_slots[seq->page_first + t / s->page_size];
    b.page = pages->data + (uint64_t)slot * s->page_bytes + (uint64_t)kv_head * s->head_bytes;
    b.count = seq->quantized - t < s->page_size ? seq->quantized - t : s->page_size;
  } else {
    uint64_t esize = job->window_dtype == KVQ_DTYPE_F32 ? 4 : 2;
    uint64_t slot = ((uint64_t)seq->window_first + (t - seq->quantized)) % seq->ring_capacity;
    b.raw = ring->data + seq->ring_offset + (slot * s->kv_heads + kv_head) * s->head_dim * esize;
  }
  return b;
}

/* The position of slot t, and whether the token there is kept (backend.h, kvq_attention_seq). */
static uint64_t slot_position(const kvq_job_attention *job, const kvq_attention_seq *seq, uint32_t P, uint64_t t) {
  if (t >= seq->quantized) return seq->window_first + (t - seq->quantized);
  return (uint64_t)job->page_index[seq->page_first + t / P] * P + t % P;
}
static int slot_kept(const kvq_job_attention *job, const kvq_attention_seq *seq, uint32_t P, uint64_t t) {
  if (t >= seq->quantized) return 1;
  const uint64_t page = seq->page_first + t / P, i = t % P;
  return job->page_alive[page * job->alive_words + i / 32] >> (i % 32) & 1u;
}

/* Decodes a block's tokens into out[count][head_dim]. */
static void decode_block(const kvq_job_attention *job, const cpu_head *head, const token_block *b, float *out) {
  const uint32_t d = head->side->layout.head_dim;
  if (b->page) {
    const cpu_method *method = kvq_cpu_method(head->side->layout.method);
    for (uint32_t i = 0; i < b->count; i++) method->decode(head, b->page, i, out + (size_t)i * d);
  } else {
    kvq_convert_to_f32(job->window_dtype, b->raw, out, d);
  }
}

static double dot_f64(const float *a, const float *b, uint32_t d) {
  double dot = 0.0;
  for (uint32_t c = 0; c < d; c++) dot += (double)a[c] * b[c];
  return dot;
}

/* Whether query row r of a sequence may attend to slot t: a kept token, not in its future. */
static int visible(const kvq_job_attention *job, const kvq_attention_seq *seq, uint32_t P, uint32_t r, uint64_t t) {
  if (!slot_kept(job, seq, P, t)) return 0;
  return seq->mask == KVQ_MASK_NONE || slot_position(job, seq, P, t) <= (uint64_t)seq->query_position + r;
}

static kvq_status no_memory(kvq_backend *b, const char *what) {
  snprintf(b->message, sizeof b->message, "cpu: out of host memory for %s", what);
  return KVQ_ERROR_OUT_OF_MEMORY;
}

/* Whether every buffer of an attention job (the sides' fixed arrays included) is this backend's. */
static int attention_owned(const kvq_backend *b, const kvq_job_attention *job) {
  kvq_buffer *const buffers[] = {job->key_pages, job->value_pages, job->key_ring, job->value_ring, job->queries,
                                 job->prepared,  job->scores,      job->output,   job->accumulate};
  return kvq_buffers_owned(b, job->keys, buffers, sizeof buffers / sizeof buffers[0]) && kvq_buffers_owned(b, job->values, NULL, 0);
}

kvq_status kvq_cpu_score(kvq_backend *b, const kvq_job_attention *job) {
  if (!attention_owned(b, job)) return kvq_cpu_foreign(b);
  const kvq_side_layout *ks = &job->keys->layout;
  const cpu_method *method = kvq_cpu_method(ks->method);
  cpu_head head = kvq_cpu_head(job->keys);
  const uint32_t d = ks->head_dim, P = ks->page_size, group = job->query_heads / ks->kv_heads;
  const uint32_t pf = kvq_prepared_floats(ks);
  double *dots = malloc(sizeof(double) * P);
  float *keys = malloc(sizeof(float) * P * d);
  if (!dots || !keys) {
    free(dots);
    free(keys);
    return no_memory(b, "scores");
  }
  const float *queries = (const float *)job->queries->data;
  const float *prepared = job->prepared ? (const float *)job->prepared->data : NULL;
  float *scores = (float *)job->scores->data;
  for (uint32_t si = 0; si < job->seq_count; si++) {
    const kvq_attention_seq *seq = &job->seqs[si];
    const uint64_t n = seq_tokens(seq);
    for (uint32_t kvh = 0; kvh < ks->kv_heads; kvh++) {
      head.kv_head = kvh;
      for (uint64_t t = 0; t < n;) {
        const token_block blk = block_at(job, seq, ks, job->key_pages, job->key_ring, kvh, (uint32_t)t);
        /* QJL scores a page from its codes directly (the paper's estimator); everything else is
         * decoded once and dotted with each query. */
        const int estimator = blk.page && method->dot_page;
        if (!estimator) decode_block(job, &head, &blk, keys);
        for (uint32_t r = 0; r < seq->query_count; r++)
          for (uint32_t h = kvh * group; h < (kvh + 1) * group; h++) {
            const uint64_t row_index = (uint64_t)(seq->query_first + r) * job->query_heads + h;
            const float *q = queries + row_index * d;
            if (estimator) method->dot_page(&head, blk.page, blk.count, q, prepared + row_index * pf, dots);
            else
              for (uint32_t i = 0; i < blk.count; i++) dots[i] = dot_f64(q, keys + (size_t)i * d, d);
            float *row = scores + seq->score_offset + ((uint64_t)r * job->query_heads + h) * n;
            for (uint32_t i = 0; i < blk.count; i++)
              row[t + i] = visible(job, seq, P, r, t + i) ? (float)(dots[i] * job->scale) : -INFINITY;
          }
        t += blk.count;
      }
    }
  }
  free(dots);
  free(keys);
  return KVQ_OK;
}

kvq_status kvq_cpu_softmax(kvq_backend *b, const kvq_job_attention *job) {
  if (!attention_owned(b, job)) return kvq_cpu_foreign(b);
  float *scores = (float *)job->scores->data;
  double *sums = NULL;
  for (uint32_t si = 0; si < job->seq_count; si++) {
    const kvq_attention_seq *seq = &job->seqs[si];
    const uint64_t n = seq_tokens(seq);
    if (job->accumulate) {
      double *grown = realloc(sums, sizeof(double) * (n ? n : 1));
      if (!grown) {
        free(sums);
        return no_memory(b, "attention sums");
      }
      sums = grown;
      memset(sums, 0, sizeof(double) * n);
    }
    for (uint64_t row = 0; row < (uint64_t)seq->query_count * job->query_heads; row++) {
      float *x = scores + seq->score_offset + row * n;
      float max = -INFINITY;
      for (uint64_t t = 0; t < n; t++)
        if (x[t] > max) max = x[t];
      double sum = 0.0;
      for (uint64_t t = 0; t < n; t++) sum += x[t] == -INFINITY ? 0.0 : exp((double)x[t] - max);
      for (uint64_t t = 0; t < n; t++) x[t] = x[t] == -INFINITY ? 0.0f : (float)(exp((double)x[t] - max) / sum);
      if (sums)
        for (uint64_t t = 0; t < n; t++) sums[t] += x[t];
    }
    if (job->accumulate) {
      float *out = (float *)job->accumulate->data + seq->accumulate_offset;
      for (uint64_t t = 0; t < n; t++) out[t] = (float)sums[t];
    }
  }
  free(sums);
  return KVQ_OK;
}

/* Values summed by code (CQ): for one query row and head at a time, the probability mass of every
 * (group, code) over the pages, spread over the centroids once; window tokens are added as vectors. */
static kvq_status weighted_sum_by_code(kvq_backend *b, const kvq_job_attention *job) {
  const kvq_side_layout *vs = &job->values->layout;
  const cpu_method *method = kvq_cpu_method(vs->method);
  cpu_head head = kvq_cpu_head(job->values);
  const uint32_t d = vs->head_dim, group = job->query_heads / vs->kv_heads;
  const size_t mass_size = (size_t)(d / vs->channels) << vs->code_bits;
  double *mass = malloc(sizeof(double) * mass_size), *spread = malloc(sizeof(double) * d);
  float *value = malloc(sizeof(float) * d);
  if (!mass || !spread || !value) {
    free(mass), free(spread), free(value);
    return no_memory(b, "the weighted sum");
  }
  const float *scores = (const float *)job->scores->data;
  float *output = (float *)job->output->data;
  for (uint32_t si = 0; si < job->seq_count; si++) {
    const kvq_attention_seq *seq = &job->seqs[si];
    const uint64_t n = seq_tokens(seq);
    for (uint32_t r = 0; r < seq->query_count; r++)
      for (uint32_t h = 0; h < job->query_heads; h++) {
        const uint32_t kvh = h / group;
        head.kv_head = kvh;
        const float *p = scores + seq->score_offset + ((uint64_t)r * job->query_heads + h) * n;
        double window[KVQ_MAX_HEAD_DIM] = {0};
        memset(mass, 0, sizeof(double) * mass_size);
        for (uint64_t t = 0; t < n;) {
          const token_block blk = block_at(job, seq, vs, job->value_pages, job->value_ring, kvh, (uint32_t)t);
          if (blk.page) {
            method->gather(&head, blk.page, blk.count, p + t, mass);
          } else if (p[t] != 0.0f) {
            decode_block(job, &head, &blk, value);
            for (uint32_t c = 0; c < d; c++) window[c] += (double)p[t] * value[c];
          }
          t += blk.count;
        }
        method->spread(&head, mass, spread);
        float *o = output + ((uint64_t)(seq->query_first + r) * job->query_heads + h) * d;
        for (uint32_t c = 0; c < d; c++) o[c] = (float)(spread[c] + window[c]);
      }
  }
  free(mass), free(spread), free(value);
  return KVQ_OK;
}

kvq_status kvq_cpu_weighted_sum(kvq_backend *b, const kvq_job_attention *job) {
  if (!attention_owned(b, job)) return kvq_cpu_foreign(b);
  const kvq_side_layout *vs = &job->values->layout;
  const cpu_method *method = kvq_cpu_method(vs->method);
  if (method->gather) return weighted_sum_by_code(b, job);
  cpu_head head = kvq_cpu_head(job->values);
  const uint32_t d = vs->head_dim, P = vs->page_size, group = job->query_heads / vs->kv_heads;
  const float *scores = (const float *)job->scores->data;
  float *output = (float *)job->output->data;
  uint32_t max_rows = 0;
  for (uint32_t si = 0; si < job->seq_count; si++)
    max_rows = job->seqs[si].query_count > max_rows ? job->seqs[si].query_count : max_rows;
  /* [row][head in group][channel], for page tokens and for window tokens: methods that decode into
   * a rotated space sum pages there and rotate back once, while the window holds plain vectors */
  const size_t acc_size = (size_t)max_rows * group * d;
  double *acc = malloc(sizeof(double) * acc_size * 2);
  float *values = malloc(sizeof(float) * P * d);
  if (!acc || !values) {
    free(acc);
    free(values);
    return no_memory(b, "the weighted sum");
  }
  for (uint32_t si = 0; si < job->seq_count; si++) {
    const kvq_attention_seq *seq = &job->seqs[si];
    const uint64_t n = seq_tokens(seq);
    for (uint32_t kvh = 0; kvh < vs->kv_heads; kvh++) {
      head.kv_head = kvh;
      memset(acc, 0, sizeof(double) * acc_size * 2);
      for (uint64_t t = 0; t < n;) {
        const token_block blk = block_at(job, seq, vs, job->value_pages, job->value_ring, kvh, (uint32_t)t);
        decode_block(job, &head, &blk, values);
        double *target = blk.page ? acc : acc + acc_size;
        for (uint32_t r = 0; r < seq->query_count; r++)
          for (uint32_t g = 0; g < group; g++) {
            const float *p = scores + seq->score_offset + ((uint64_t)r * job->query_heads + kvh * group + g) * n + t;
            double *a = target + ((size_t)r * group + g) * d;
            for (uint32_t i = 0; i < blk.count; i++) {
              if (p[i] == 0.0f) continue; /* masked (or underflowed) tokens add nothing */
              for (uint32_t c = 0; c < d; c++) a[c] += (double)p[i] * values[(size_t)i * d + c];
            }
          }
        t += blk.count;
      }
      for (uint32_t r = 0; r < seq->query_count; r++)
        for (uint32_t g = 0; g < group; g++) {
          float *o = output + ((uint64_t)(seq->query_first + r) * job->query_heads + kvh * group + g) * d;
          const double *pages = acc + ((size_t)r * group + g) * d, *window = pages + acc_size;
          float rotated[KVQ_MAX_HEAD_DIM], plain[KVQ_MAX_HEAD_DIM];
          for (uint32_t c = 0; c < d; c++) rotated[c] = (float)pages[c];
          if (method->unrotate) method->unrotate(&head, rotated, plain);
          else
            for (uint32_t c = 0; c < d; c++) plain[c] = rotated[c];
          for (uint32_t c = 0; c < d; c++) o[c] = (float)((double)plain[c] + window[c]);
        }
    }
  }
  free(acc);
  free(values);
  return KVQ_OK;
}
