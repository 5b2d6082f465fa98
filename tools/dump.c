/*
 * kvq dump: the real Q, K, V of one layer of the Universal Sentence Encoder-lite (model/use.h) on real
 * text, as the .npy files `kvq eval --keys/--values/--queries` reads ([tokens, 4, head_dim] fp32).
 * Each sentence runs through the model alone (the model attends within a sentence); the per-sentence
 * tensors are then concatenated along the token axis into one long pseudo-context, so that kvq eval's
 * decode-style measurements and token policies have a stream to work on. The queries are written
 * WITHOUT the model's 1/sqrt(head_dim): kvq applies it itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "model_input.h"
#include "npy.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvq dump [--layer 0|1] [--sentences N] [--text FILE] [--tokens T] [--out DIR]\n"
          "\n"
          "Writes the real queries, keys and values of one layer of the Universal Sentence Encoder-lite\n"
          "(scripts/fetch-model.sh fetches it) on real text, as .npy files for kvq eval:\n"
          "  DIR/layerL-queries.npy, DIR/layerL-keys.npy, DIR/layerL-values.npy, each [tokens, 4, head_dim]\n"
          "  fp32 (head_dim 64 in layer 0, 128 in layer 1). The queries do NOT carry the model's\n"
          "  1/sqrt(head_dim): kvq eval applies it (do not pass --queries-scaled for these files).\n"
          "\n"
          "  --layer L        the layer (default 0)\n"
          "  --sentences N    the first N sentences of the King James Bible (default 64; with --tokens,\n"
          "                   as many as needed, up to N if given)\n"
          "  --text FILE      one sentence a line instead of the Bible\n"
          "  --tokens T       cut the concatenated context to exactly T tokens (an error if the sentences\n"
          "                   hold fewer); default: all their tokens\n"
          "  --out DIR        where to write (default: the current directory)\n"
          "\n"
          "Each sentence runs through the model alone (at most 128 tokens); their tensors are concatenated\n"
          "along the token axis into one pseudo-context, for decode-style measurements and token policies:\n"
          "  kvq dump --layer 0 --tokens 4096 && kvq eval --keys layer0-keys.npy --values layer0-values.npy \\\n"
          "    --queries layer0-queries.npy --mask none\n");
}

static int parse_u32(const char *s, uint32_t *out) {
  char *end;
  unsigned long v = s ? strtoul(s, &end, 10) : 0;
  if (!s || !*s || *end || v > UINT32_MAX || s[0] == '-') return -1;
  *out = (uint32_t)v;
  return 0;
}

typedef struct tensors {
  float *q, *k, *v;
  size_t tokens, capacity; /* in tokens */
  uint32_t head_dim;
} tensors;

/* Appends `tokens` tokens of q, k, v (row = 4 * head_dim floats); -1 when out of memory. */
static int append(tensors *t, const float *q, const float *k, const float *v, size_t tokens) {
  const size_t row = (size_t)KVQ_USE_HEADS * t->head_dim;
  if (t->tokens + tokens > t->capacity) {
    size_t capacity = t->capacity ? t->capacity : 1024;
    while (capacity < t->tokens + tokens) capacity *= 2;
    float **arrays[3] = {&t->q, &t->k, &t->v};
    for (int a = 0; a < 3; a++) {
      float *grown = realloc(*arrays[a], capacity * row * sizeof(float));
      if (!grown) return -1;
      *arrays[a] = grown;
    }
    t->capacity = capacity;
  }
  memcpy(t->q + t->tokens * row, q, tokens * row * sizeof *q);
  memcpy(t->k + t->tokens * row, k, tokens * row * sizeof *k);
  memcpy(t->v + t->tokens * row, v, tokens * row * sizeof *v);
  t->tokens += tokens;
  return 0;
}

int kvq_cmd_dump(int argc, char **argv) {
  uint32_t layer = 0, sentences = 0, tokens = 0;
  const char *text = NULL, *out_dir = ".";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    int bad = !value;
    if (!strcmp(a, "--layer")) bad = bad || parse_u32(value, &layer) || layer >= KVQ_USE_LAYERS;
    else if (!strcmp(a, "--sentences")) bad = bad || parse_u32(value, &sentences) || sentences == 0;
    else if (!strcmp(a, "--tokens")) bad = bad || parse_u32(value, &tokens) || tokens == 0;
    else if (!strcmp(a, "--text")) text = value;
    else if (!strcmp(a, "--out")) out_dir = value;
    else {
      fprintf(stderr, "kvq dump: unknown option '%s'\n\n", a);
      usage(stderr);
      return 2;
    }
    if (bad) {
      fprintf(stderr, "kvq dump: %s needs a valid value (kvq dump --help)\n", a);
      return 2;
    }
    i++;
  }
  /* sentences of the Bible hold about 20-30 tokens; asking for T/2 covers T tokens with room to spare */
  const uint32_t want = sentences ? sentences : tokens ? tokens / 2 + 16 : 64;
  char error[2048];
  kvq_use_model *model = NULL;
  if (model_input_load(&model, error, sizeof error) != 0) {
    fprintf(stderr, "kvq dump: %s\n", error);
    return 2;
  }
  corpus text_sentences;
  if (model_input_sentences(text, want, &text_sentences, error, sizeof error) != 0) {
    fprintf(stderr, "kvq dump: %s\n", error);
    kvq_use_free(model);
    return 2;
  }
  const uint32_t max_tokens = kvq_use_max_tokens(model);
  const size_t capacity = (size_t)max_tokens * KVQ_USE_HEADS * 128; /* the widest layer */
  float *q = malloc(capacity * sizeof *q), *k = malloc(capacity * sizeof *k), *v = malloc(capacity * sizeof *v);
  int32_t *ids = NULL;
  tensors all = {0};
  int status = 1;
  if (!q || !k || !v) {
    fprintf(stderr, "kvq dump: out of memory\n");
    goto done;
  }
  for (uint32_t s = 0; s < text_sentences.count && (tokens == 0 || all.tokens < tokens); s++) {
    size_t count = 0;
    kvq_status st = kvq_use_tokenize(model, text_sentences.sentences[s], NULL, 0, &count);
    if (st != KVQ_OK && st != KVQ_ERROR_BUFFER_TOO_SMALL) {
      fprintf(stderr, "kvq dump: sentence %u cannot be tokenized (%s): %s\n", s + 1, kvq_status_string(st),
              text_sentences.sentences[s]);
      goto done;
    }
    if (count == 0) continue;
    int32_t *grown = realloc(ids, count * sizeof *ids);
    if (!grown) {
      fprintf(stderr, "kvq dump: out of memory\n");
      goto done;
    }
    ids = grown;
    if (kvq_use_tokenize(model, text_sentences.sentences[s], ids, count, &count) != KVQ_OK) goto done;
    uint32_t sentence_tokens, head_dim;
    char message[1024];
    st = kvq_use_layer_qkv(model, ids, count, layer, q, k, v, capacity, &sentence_tokens, &head_dim, message,
                           sizeof message);
    if (st != KVQ_OK) {
      fprintf(stderr, "kvq dump: sentence %u: %s: %s\n", s + 1, kvq_status_string(st), message);
      goto done;
    }
    all.head_dim = head_dim;
    size_t take = sentence_tokens;
    if (tokens && all.tokens + take > tokens) take = tokens - all.tokens;
    if (append(&all, q, k, v, take) != 0) {
      fprintf(stderr, "kvq dump: out of memory\n");
      goto done;
    }
  }
  if (all.tokens == 0 || (tokens && all.tokens < tokens)) {
    fprintf(stderr, "kvq dump: the %u sentences hold %zu tokens, fewer than the %u asked for (raise --sentences)\n",
            text_sentences.count, all.tokens, tokens);
    goto done;
  }
  const int64_t shape[3] = {(int64_t)all.tokens, KVQ_USE_HEADS, all.head_dim};
  const char *names[3] = {"queries", "keys", "values"};
  const float *data[3] = {all.q, all.k, all.v};
  for (int a = 0; a < 3; a++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/layer%u-%s.npy", out_dir, layer, names[a]);
    if (kvq_npy_write(path, data[a], 3, shape, 0, error, sizeof error) != 0) {
      fprintf(stderr, "kvq dump: %s\n", error);
      goto done;
    }
    printf("%s: [%zu, %d, %u] fp32%s\n", path, all.tokens, KVQ_USE_HEADS, all.head_dim,
           a == 0 ? " (without 1/sqrt(head_dim): kvq applies it)" : "");
  }
  printf("layer %u of %u sentences (%s), concatenated: %zu tokens\n", layer, text_sentences.count,
         text ? text : "King James Bible", all.tokens);
  status = 0;
done:
  free(all.q);
  free(all.k);
  free(all.v);
  free(ids);
  free(q);
  free(k);
  free(v);
  corpus_free(&text_sentences);
  kvq_use_free(model);
  return status;
}
