/* The model and the sentences for `kvq dump` and `kvq demo` (model_input.h). */
#include "model_input.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int model_input_load(kvq_use_model **out, char *error, size_t size) {
  char dir[4096], message[1024];
  *out = NULL;
  if (kvq_use_default_dir(dir, sizeof dir) != KVQ_OK) {
    snprintf(error, size, "no folder for the model: set KVQ_MODEL_DIR or HOME, then run scripts/fetch-model.sh");
    return -1;
  }
  if (kvq_use_load(dir, out, message, sizeof message) != KVQ_OK) {
    /* kvq_use_load's message names the file and says how to fetch the model */
    snprintf(error, size, "the model in %s: %s", dir, message);
    return -1;
  }
  return 0;
}

/* Appends a copy of `line` to *out, growing its array. -1 when out of memory. */
static int add_sentence(corpus *out, uint32_t *capacity, const char *line) {
  if (out->count == *capacity) {
    const uint32_t grown_capacity = *capacity ? 2 * *capacity : 64;
    char **grown = realloc(out->sentences, sizeof *grown * grown_capacity);
    if (!grown) return -1;
    out->sentences = grown;
    *capacity = grown_capacity;
  }
  if (!(out->sentences[out->count] = strdup(line))) return -1;
  out->count++;
  return 0;
}

int model_input_sentences(const char *text_file, uint32_t count, corpus *out, char *error, size_t size) {
  *out = (corpus){0};
  if (!text_file) return corpus_bible(NULL, count, out, error, size);
  FILE *f = fopen(text_file, "r");
  if (!f) {
    snprintf(error, size, "%s: %s", text_file, strerror(errno));
    return -1;
  }
  static char line[65536];
  uint32_t capacity = 0;
  int failed = 0;
  while (out->count < count && fgets(line, sizeof line, f)) {
    size_t n = strlen(line);
    if (n == sizeof line - 1 && line[n - 1] != '\n') {
      snprintf(error, size, "%s: line %u is longer than 64 KiB", text_file, out->count + 1);
      failed = 1;
      break;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = 0;
    if (n == 0) continue;
    if (add_sentence(out, &capacity, line) != 0) {
      snprintf(error, size, "%s: out of memory", text_file);
      failed = 1;
      break;
    }
  }
  if (!failed && ferror(f)) {
    snprintf(error, size, "%s: read error", text_file);
    failed = 1;
  }
  fclose(f);
  if (failed) corpus_free(out);
  return failed ? -1 : 0;
}
