#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/config.h"
#include "core/savefile.h"
#include "core/tensor.h"

void golden_name(char *out, size_t size, const char *what, int a, int b, int c) {
  if (c >= 0) snprintf(out, size, "%s/%d/%d/%d", what, a, b, c);
  else if (b >= 0) snprintf(out, size, "%s/%d/%d", what, a, b);
  else if (a >= 0) snprintf(out, size, "%s/%d", what, a);
  else snprintf(out, size, "%s", what);
}

int golden_inputs_parse(const golden_file *g, golden_inputs *in, char *error, size_t error_size) {
  memset(in, 0, sizeof *in);
  const golden_record *conf = golden_find(g, "config");
  if (!conf) {
    snprintf(error, error_size, "no config record");
    return -1;
  }
  kvq_reader r = {conf->data, conf->bytes, 0, 0};
  if (kvq_get_config(&r, &in->config, &in->layers) != 0 || kvq_config_validate(&in->config, error, error_size) != KVQ_OK ||
      in->config.layer_count > GOLDEN_MAX_LAYERS) {
    if (!error[0]) snprintf(error, error_size, "malformed config record");
    golden_inputs_free(in);
    return -1;
  }
  uint64_t count = 0;
  in->schedule = golden_u32(golden_find(g, "schedule"), &in->steps);
  in->sequences = golden_u32(golden_find(g, "sequences"), &count);
  if (!in->schedule || in->steps % 4 || !in->sequences || count != 2 * GOLDEN_SEQUENCES) {
    snprintf(error, error_size, "malformed schedule or sequences record");
    golden_inputs_free(in);
    return -1;
  }
  in->steps /= 4;
  const golden_record *policy = golden_find(g, "policy");
  if (policy) {
    kvq_reader pr = {policy->data, policy->bytes, 0, 0};
    kvq_get_policy(&pr, &in->config.policy);
    if (pr.short_read || pr.pos != pr.size ||
        kvq_config_validate(&in->config, error, error_size) != KVQ_OK) {
      if (!error[0]) snprintf(error, error_size, "malformed policy record");
      golden_inputs_free(in);
      return -1;
    }
  }
  const golden_record *codebooks = golden_find(g, "codebooks");
  if (codebooks) in->codebooks = codebooks->data, in->codebooks_bytes = codebooks->bytes;
  uint64_t total = 0;
  for (int s = 0; s < GOLDEN_SEQUENCES; s++)
    total = (uint64_t)in->sequences[2 * s] + in->sequences[2 * s + 1] > total
                ? (uint64_t)in->sequences[2 * s] + in->sequences[2 * s + 1]
                : total;
  if (total > ((uint64_t)1 << 24)) { /* golden files are small; refuse absurd streams before allocating */
    snprintf(error, error_size, "sequences record out of range");
    golden_inputs_free(in);
    return -1;
  }
  for (uint32_t l = 0; l < in->config.layer_count; l++) {
    const kvq_layer_config *L = &in->layers[l];
    const uint64_t floats = total * L->kv_heads * L->head_dim;
    const uint64_t bytes = floats * kvq_dtype_size(in->config.input_dtype);
    char name[64];
    for (int side = 0; side < 2; side++) {
      golden_name(name, sizeof name, side ? "values" : "keys", (int)l, -1, -1);
      const golden_record *rec = golden_find(g, name);
      if (!rec || rec->bytes != bytes) {
        snprintf(error, error_size, "record %s missing or of the wrong size", name);
        golden_inputs_free(in);
        return -1;
      }
      float *f = malloc(sizeof(float) * (floats ? floats : 1));
      if (!f) {
        snprintf(error, error_size, "out of memory");
        golden_inputs_free(in);
        return -1;
      }
      kvq_convert_to_f32(in->config.input_dtype, rec->data, f, floats);
      if (side) in->values[l] = rec->data, in->values_f32[l] = f;
      else in->keys[l] = rec->data, in->keys_f32[l] = f;
    }
    golden_name(name, sizeof name, "stream_queries", (int)l, -1, -1);
    uint64_t count = 0;
    in->stream_queries[l] = golden_f32(golden_find(g, name), &count);
    if (in->stream_queries[l] && count != total * L->query_heads * L->head_dim) {
      snprintf(error, error_size, "record %s has the wrong size", name);
      golden_inputs_free(in);
      return -1;
    }
  }
  for (uint64_t i = 0; i < in->steps; i++) {
    const uint32_t *st = in->schedule + 4 * i;
    const int attend = (st[3] & GOLDEN_ATTEND) != 0;
    const uint32_t count = st[3] & ~GOLDEN_ATTEND;
    if (st[0] >= GOLDEN_SEQUENCES || st[1] >= in->config.layer_count ||
        (uint64_t)st[2] + count > in->sequences[2 * st[0] + 1] ||
        (attend && (count == 0 || !in->stream_queries[st[1]]))) {
      snprintf(error, error_size, "schedule step %llu out of range", (unsigned long long)i);
      golden_inputs_free(in);
      return -1;
    }
  }
  return 0;
}

void golden_inputs_free(golden_inputs *in) {
  free(in->layers);
  for (int l = 0; l < GOLDEN_MAX_LAYERS; l++) {
    free(in->keys_f32[l]);
    free(in->values_f32[l]);
  }
  memset(in, 0, sizeof *in);
}

/* Tokens [first, first + count) of a sequence appended to a layer (an append step). */
static kvq_status append_step(kvq_cache *cache, const golden_inputs *in, uint32_t id, uint32_t seq, uint32_t layer,
                              uint32_t first, uint32_t count) {
  const kvq_layer_config *L = &in->layers[layer];
  const size_t esize = kvq_dtype_size(in->config.input_dtype);
  const uint64_t offset = ((uint64_t)in->sequences[2 * seq] + first) * L->kv_heads * L->head_dim * esize;
  int64_t shape[3] = {count, L->kv_heads, L->head_dim};
  kvq_tensor k = kvq_tensor_host((void *)(in->keys[layer] + offset), in->config.input_dtype, 3, shape);
  kvq_tensor v = kvq_tensor_host((void *)(in->values[layer] + offset), in->config.input_dtype, 3, shape);
  return kvq_append(cache, id, layer, &k, &v);
}

/* The attention of queries [first, first + rows) of a sequence in a layer (an attend step). */
static kvq_status attend_step(kvq_cache *cache, const golden_inputs *in, uint32_t id, uint32_t seq, uint32_t layer,
                              uint32_t first, uint32_t rows) {
  const kvq_layer_config *L = &in->layers[layer];
  const uint64_t row_floats = (uint64_t)L->query_heads * L->head_dim;
  float *out = malloc(sizeof(float) * rows * row_floats);
  if (!out) return KVQ_ERROR_OUT_OF_MEMORY;
  int64_t shape[3] = {rows, L->query_heads, L->head_dim};
  const float *q = in->stream_queries[layer] + ((uint64_t)in->sequences[2 * seq] + first) * row_floats;
  kvq_attention_request r = {id, KVQ_MASK_CAUSAL, kvq_tensor_host((void *)q, KVQ_DTYPE_F32, 3, shape),
                             kvq_tensor_host(out, KVQ_DTYPE_F32, 3, shape)};
  kvq_status st = kvq_attention(cache, layer, &r, 1);
  free(out);
  return st;
}

kvq_status golden_replay(kvq_context *ctx, const golden_inputs *in, kvq_cache **cache, uint32_t ids[GOLDEN_SEQUENCES],
                         golden_step_hook hook, void *arg) {
  kvq_status st = kvq_cache_create(ctx, &in->config, cache);
  if (st != KVQ_OK) return st;
  if (in->codebooks) st = kvq_codebooks_load_from_memory(*cache, in->codebooks, (size_t)in->codebooks_bytes);
  for (int s = 0; s < GOLDEN_SEQUENCES && st == KVQ_OK; s++) st = kvq_sequence_add(*cache, &ids[s]);
  for (uint64_t i = 0; i < in->steps && st == KVQ_OK; i++) {
    const uint32_t *step = in->schedule + 4 * i;
    const uint32_t seq = step[0], layer = step[1], first = step[2], count = step[3];
    if (hook && hook(arg, *cache, ids, step, 0) != 0) {
      st = KVQ_ERROR_INTERNAL;
      break;
    }
    if (count == 0) st = kvq_flush(*cache, ids[seq]);
    else if (count & GOLDEN_ATTEND) st = attend_step(*cache, in, ids[seq], seq, layer, first, count & ~GOLDEN_ATTEND);
    else st = append_step(*cache, in, ids[seq], seq, layer, first, count);
    if (st == KVQ_OK && hook && hook(arg, *cache, ids, step, 1) != 0) st = KVQ_ERROR_INTERNAL;
  }
  if (st != KVQ_OK) {
    kvq_cache_destroy(*cache);
    *cache = NULL;
  }
  return st;
}

kvq_status golden_run_block(kvq_cache *cache, uint32_t id, uint32_t layer, const kvq_layer_config *L, const float *queries,
                            uint32_t nq, kvq_mask mask, uint32_t n, float *logits, float *probs, float *out) {
  int64_t qshape[3] = {nq, L->query_heads, L->head_dim}, sshape[3] = {nq, L->query_heads, n};
  kvq_tensor qt = kvq_tensor_host((void *)queries, KVQ_DTYPE_F32, 3, qshape);
  kvq_tensor lt = kvq_tensor_host(logits, KVQ_DTYPE_F32, 3, sshape), pt = kvq_tensor_host(probs, KVQ_DTYPE_F32, 3, sshape);
  kvq_attention_request req = {id, mask, qt, kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape)};
  kvq_status st = kvq_scores(cache, id, layer, &qt, mask, KVQ_SCORES_LOGITS, &lt);
  if (st == KVQ_OK) st = kvq_scores(cache, id, layer, &qt, mask, KVQ_SCORES_PROBABILITIES, &pt);
  if (st == KVQ_OK) st = kvq_attention(cache, layer, &req, 1);
  return st;
}
