/* The SentencePiece unigram tokenizer: normalization, then Viterbi over the pieces' scores
 * (docs/MODEL.md, "Tokenizer"). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The byte length of the UTF-8 character at s (s[0] != 0), or 0 when it is invalid. */
static size_t utf8_length(const unsigned char *s) {
  size_t n;
  if (s[0] < 0x80) return 1;
  if ((s[0] & 0xe0) == 0xc0) n = 2;
  else if ((s[0] & 0xf0) == 0xe0) n = 3;
  else if ((s[0] & 0xf8) == 0xf0) n = 4;
  else return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
  }
  return n;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* "▁" (U+2581): SentencePiece's mark of a word's start */
static const char word_mark[] = "\xe2\x96\x81";

/* Normalizes as the pieces expect: whitespace runs become one word mark, leading and trailing
 * whitespace go, and every word starts with the mark. Returns a new string or NULL (memory). */
static char *normalize(const char *text) {
  size_t len = strlen(text);
  char *out = malloc(len * 3 + 4); /* at worst every byte a one-letter word: mark + byte */
  if (!out) return NULL;
  size_t n = 0;
  int in_word = 0;
  for (const char *p = text; *p; p++) {
    if (is_space(*p)) {
      in_word = 0;
      continue;
    }
    if (!in_word) {
      memcpy(out + n, word_mark, 3);
      n += 3;
      in_word = 1;
    }
    out[n++] = *p;
  }
  out[n] = 0;
  return out;
}

kvq_status kvq_use_tokenize(const kvq_use_model *model, const char *text, int32_t *ids, size_t capacity,
                            size_t *count) {
  if (!model || !text || !count || (capacity && !ids)) return KVQ_ERROR_INVALID_ARGUMENT;
  for (const unsigned char *p = (const unsigned char *)text; *p;) {
    size_t n = utf8_length(p);
    if (!n) return KVQ_ERROR_INVALID_ARGUMENT;
    p += n;
  }
  const use_vocab *v = &model->vocab;
  char *s = normalize(text);
  if (!s) return KVQ_ERROR_OUT_OF_MEMORY;
  size_t len = strlen(s);
  /* best[i]: the highest total score of a segmentation of s[0, i); from[i], piece[i]: its last piece */
  double *best = malloc((len + 1) * sizeof *best);
  size_t *from = malloc((len + 1) * sizeof *from);
  int32_t *piece = malloc((len + 1) * sizeof *piece);
  unsigned char *boundary = calloc(len + 1, 1);
  if (!best || !from || !piece || !boundary) {
    free(s), free(best), free(from), free(piece), free(boundary);
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  for (size_t i = 0; i < len; i += utf8_length((const unsigned char *)s + i)) boundary[i] = 1;
  boundary[len] = 1;
  best[0] = 0;
  size_t previous = 0; /* the boundary before end: the last character's start */
  for (size_t end = 1; end <= len; end++) {
    if (!boundary[end]) continue;
    /* an unknown character is always possible, at SentencePiece's penalty */
    best[end] = best[previous] + v->unknown_score;
    from[end] = previous;
    piece[end] = 0;
    /* longest pieces first, and only a strictly better score replaces: ties keep the longer piece */
    size_t longest = end < v->max_bytes ? end : v->max_bytes;
    for (size_t n = longest; n >= 1; n--) {
      size_t start = end - n;
      if (!boundary[start]) continue;
      int32_t id = use_vocab_find(v, s + start, n);
      if (id < 0) continue;
      double total = best[start] + v->scores[id];
      if (total > best[end] || piece[end] == 0) {
        best[end] = total;
        from[end] = start;
        piece[end] = id;
      }
    }
    previous = end;
  }
  size_t n = 0;
  for (size_t i = len; i > 0; i = from[i]) n++;
  kvq_status status = KVQ_OK;
  if (n > capacity) {
    status = KVQ_ERROR_BUFFER_TOO_SMALL;
  } else {
    size_t k = n;
    for (size_t i = len; i > 0; i = from[i]) ids[--k] = piece[i];
  }
  *count = n;
  free(s), free(best), free(from), free(piece), free(boundary);
  return status;
}

const char *kvq_use_piece(const kvq_use_model *model, int32_t id) {
  if (!model || id < 0 || (size_t)id >= model->vocab.count) return NULL;
  return model->vocab.pieces[id];
}
