/* CPU jobs that touch pages one at a time: quantize, dequantize, and query preparation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/layout.h"
#include "core/tensor.h"
#include "cpu.h"

static kvq_status bad_range(kvq_backend *b, const char *what) {
  snprintf(b->message, sizeof b->message, "cpu: %s lies outside its buffer", what);
  return KVQ_ERROR_INTERNAL;
}

static int in_buffer(const kvq_buffer *buf, uint64_t offset, uint64_t bytes) {
  return buf && offset <= buf->size && bytes <= buf->size - offset;
}

/* Token t of a head block as DEQUANTIZE returns it (rotated back where the method rotates). */
static void decode_token(const cpu_method *method, const cpu_head *head, const uint8_t *block, uint32_t t, float *out) {
  float decoded[KVQ_MAX_HEAD_DIM];
  method->decode(head, block, t, decoded);
  if (method->unrotate) method->unrotate(head, decoded, out);
  else memcpy(out, decoded, sizeof(float) * head->side->layout.head_dim);
}

/* ||x - x^||_2 of token t, in double (the Q-Hitter policy's quantization error). */
static float token_error(const cpu_method *method, const cpu_head *head, const uint8_t *block, uint32_t t, const float *x) {
  float decoded[KVQ_MAX_HEAD_DIM];
  decode_token(method, head, block, t, decoded);
  double sum = 0.0;
  for (uint32_t c = 0; c < head->side->layout.head_dim; c++) sum += ((double)x[c] - decoded[c]) * ((double)x[c] - decoded[c]);
  return (float)sqrt(sum);
}

kvq_status kvq_cpu_quantize(kvq_backend *b, const kvq_job_quantize *job) {
  KVQ_CPU_OWNS(b, job->side, job->dst, job->errors);
  const kvq_side_layout *s = &job->side->layout;
  const cpu_method *method = kvq_cpu_method(s->method);
  cpu_head head = kvq_cpu_head(job->side);
  const uint64_t per_token = (uint64_t)s->kv_heads * s->head_dim;
  const uint32_t esize = job->input_dtype == KVQ_DTYPE_F32 ? 4 : 2;
  float *x = ((cpu_backend *)b)->page_workspace; /* one kv head of one page, [tokens][head_dim] */
  if (job->errors && !in_buffer(job->errors, 0, (uint64_t)job->count * s->page_size * s->kv_heads * 4))
    return bad_range(b, "the quantization errors");
  for (uint32_t i = 0; i < job->count; i++) { /* check every item before writing any page */
    const kvq_quantize_item *it = &job->items[i];
    if (!kvq_buffer_owned(b, it->src)) return kvq_cpu_foreign(b);
    if (it->tokens == 0 || it->tokens > s->page_size || !in_buffer(it->src, it->src_offset, per_token * esize * it->tokens) ||
        !in_buffer(job->dst, it->dst_offset, s->page_bytes))
      return bad_range(b, "a quantize item");
  }
  for (uint32_t i = 0; i < job->count; i++) {
    const kvq_quantize_item *it = &job->items[i];
    uint8_t *page = job->dst->data + it->dst_offset;
    memset(page, 0, (size_t)s->page_bytes); /* padding and tokens past the valid count are zero */
    for (uint32_t h = 0; h < s->kv_heads; h++) {
      head.kv_head = h;
      for (uint32_t t = 0; t < it->tokens; t++)
        kvq_convert_to_f32(job->input_dtype, it->src->data + it->src_offset + (t * per_token + (uint64_t)h * s->head_dim) * esize,
                           x + (size_t)t * s->head_dim, s->head_dim);
      method->encode(&head, x, s->head_dim, it->tokens, page + (size_t)h * s->head_bytes);
      if (job->errors)
        for (uint32_t t = 0; t < it->tokens; t++) {
          float *e = (float *)job->errors->data + ((uint64_t)i * s->page_size + t) * s->kv_heads + h;
          *e = token_error(method, &head, page + (size_t)h * s->head_bytes, t, x + (size_t)t * s->head_dim);
        }
    }
  }
  return KVQ_OK;
}

kvq_status kvq_cpu_dequantize(kvq_backend *b, const kvq_job_dequantize *job) {
  KVQ_CPU_OWNS(b, job->side, job->pages, job->out);
  const kvq_side_layout *s = &job->side->layout;
  const cpu_method *method = kvq_cpu_method(s->method);
  cpu_head head = kvq_cpu_head(job->side);
  const uint64_t page_floats = (uint64_t)s->page_size * s->kv_heads * s->head_dim;
  if (!in_buffer(job->out, job->out_offset, page_floats * 4 * job->count)) return bad_range(b, "dequantize output");
  float *out = (float *)(job->out->data + job->out_offset);
  for (uint32_t i = 0; i < job->count; i++) {
    uint64_t offset = (uint64_t)job->slots[i] * s->page_bytes;
    if (!in_buffer(job->pages, offset, s->page_bytes)) return bad_range(b, "a dequantized page");
    const uint8_t *page = job->pages->data + offset;
    for (uint32_t t = 0; t < s->page_size; t++)
      for (uint32_t h = 0; h < s->kv_heads; h++) {
        head.kv_head = h;
        decode_token(method, &head, page + (size_t)h * s->head_bytes, t,
                     out + ((i * (uint64_t)s->page_size + t) * s->kv_heads + h) * s->head_dim);
      }
  }
  return KVQ_OK;
}

kvq_status kvq_cpu_prepare(kvq_backend *b, const kvq_job_prepare *job) {
  KVQ_CPU_OWNS(b, job->keys, job->queries, job->out);
  const kvq_side_layout *s = &job->keys->layout;
  const cpu_method *method = kvq_cpu_method(s->method);
  const uint32_t pf = kvq_prepared_floats(s);
  if (!method->prepare || pf == 0) return KVQ_OK;
  if (!in_buffer(job->queries, job->q_offset, (uint64_t)job->rows * s->head_dim * 4) ||
      !in_buffer(job->out, job->out_offset, (uint64_t)job->rows * pf * 4))
    return bad_range(b, "a query preparation");
  cpu_head head = kvq_cpu_head(job->keys);
  const float *q = (const float *)(job->queries->data + job->q_offset);
  float *out = (float *)(job->out->data + job->out_offset);
  const uint32_t group = job->query_heads / s->kv_heads;
  for (uint32_t r = 0; r < job->rows; r++) {
    head.kv_head = (r % job->query_heads) / group; /* rows are [position][query head] */
    method->prepare(&head, q + (size_t)r * s->head_dim, out + (size_t)r * pf);
  }
  return KVQ_OK;
}
