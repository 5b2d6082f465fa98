/* vocab.json: the SentencePiece pieces with their unigram log-probabilities, and a hash table
 * from piece bytes to id for the tokenizer's lookups. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static uint32_t fnv1a(const char *bytes, size_t len) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)bytes[i]) * 16777619u;
  return h;
}

static void insert(use_vocab *v, int32_t id) {
  uint32_t h = fnv1a(v->pieces[id], strlen(v->pieces[id]));
  size_t mask = v->slot_count - 1;
  size_t i = h & mask;
  while (v->slots[i].id >= 0) i = (i + 1) & mask;
  v->slots[i].hash = h;
  v->slots[i].id = id;
}

int32_t use_vocab_find(const use_vocab *v, const char *bytes, size_t len) {
  uint32_t h = fnv1a(bytes, len);
  size_t mask = v->slot_count - 1;
  for (size_t i = h & mask; v->slots[i].id >= 0; i = (i + 1) & mask) {
    const char *p = v->pieces[v->slots[i].id];
    if (v->slots[i].hash == h && strlen(p) == len && !memcmp(p, bytes, len)) return v->slots[i].id;
  }
  return -1;
}

kvq_status use_vocab_read(const char *path, use_vocab *v, char *message, size_t size) {
  memset(v, 0, sizeof *v);
  char *text;
  size_t bytes;
  kvq_status status = use_read_file(path, &text, &bytes, message, size);
  if (status != KVQ_OK) return status;
  status = use_vocab_parse(text, bytes, path, v, message, size);
  free(text);
  return status;
}

kvq_status use_vocab_parse(const char *text, size_t bytes, const char *path, use_vocab *v, char *message,
                           size_t size) {
  memset(v, 0, sizeof *v);
  kvq_status status = KVQ_OK;
  cJSON *root = cJSON_ParseWithLength(text, bytes);
  if (!cJSON_IsArray(root) || cJSON_GetArraySize(root) < 2) {
    use_message(message, size, "%s: not a JSON array of [piece, score] pairs", path);
    cJSON_Delete(root);
    return KVQ_ERROR_BAD_FORMAT;
  }
  size_t count = (size_t)cJSON_GetArraySize(root);
  v->pieces = calloc(count, sizeof *v->pieces);
  v->scores = calloc(count, sizeof *v->scores);
  v->slot_count = 16;
  while (v->slot_count < 2 * count) v->slot_count *= 2; /* at most half full */
  v->slots = malloc(v->slot_count * sizeof *v->slots);
  if (!v->pieces || !v->scores || !v->slots) {
    use_message(message, size, "out of memory");
    status = KVQ_ERROR_OUT_OF_MEMORY;
    goto fail;
  }
  for (size_t i = 0; i < v->slot_count; i++) v->slots[i].id = -1;
  float lowest = 0;
  const cJSON *pair;
  cJSON_ArrayForEach(pair, root) {
    const cJSON *piece = cJSON_GetArrayItem(pair, 0), *score = cJSON_GetArrayItem(pair, 1);
    /* Seven pieces (all those holding ':') have a null score in this package. JavaScript, which
     * the package is made for, adds null as 0; so do we (docs/MODEL.md, "Tokenizer"). */
    if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 || !cJSON_IsString(piece) || !piece->valuestring[0] ||
        !(cJSON_IsNumber(score) || cJSON_IsNull(score))) {
      use_message(message, size, "%s: entry %zu is not a [piece, score] pair", path, v->count);
      status = KVQ_ERROR_BAD_FORMAT;
      goto fail;
    }
    v->pieces[v->count] = strdup(piece->valuestring);
    if (!v->pieces[v->count]) {
      use_message(message, size, "out of memory");
      status = KVQ_ERROR_OUT_OF_MEMORY;
      goto fail;
    }
    v->scores[v->count] = cJSON_IsNull(score) ? 0.0f : (float)score->valuedouble;
    if (v->scores[v->count] < lowest) lowest = v->scores[v->count];
    size_t len = strlen(piece->valuestring);
    if (len > v->max_bytes) v->max_bytes = len;
    v->count++;
  }
  /* The leading pieces of score exactly 0 are SentencePiece's reserved ones (here: the unknown
   * piece, <s>, </s> and three extra ids): never matched in text. Id 0 is the unknown piece. */
  size_t reserved = 0;
  while (reserved < v->count && v->scores[reserved] == 0.0f) reserved++;
  if (reserved == 0 || reserved == v->count) {
    use_message(message, size, "%s: no reserved pieces before the scored ones", path);
    status = KVQ_ERROR_BAD_FORMAT;
    goto fail;
  }
  for (size_t i = reserved; i < v->count; i++) {
    if (use_vocab_find(v, v->pieces[i], strlen(v->pieces[i])) < 0) insert(v, (int32_t)i);
  }
  v->unknown_score = lowest - 10.0f; /* SentencePiece's penalty for an unknown character */
  cJSON_Delete(root);
  return KVQ_OK;
fail:
  cJSON_Delete(root);
  use_vocab_free(v);
  return status;
}

void use_vocab_free(use_vocab *v) {
  if (v->pieces) {
    for (size_t i = 0; i < v->count; i++) free(v->pieces[i]);
  }
  free(v->pieces);
  free(v->scores);
  free(v->slots);
  memset(v, 0, sizeof *v);
}
