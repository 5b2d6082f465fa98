/*
 * Real English sentences for the tool's model runs: the King James Bible of Debian's bible-kjv and
 * bible-kjv-text packages (scripts/install-deps.sh installs them). bible-kjv-text holds the text,
 * compressed, in /usr/lib/bible.data; bible-kjv's `bible` program is its only reader, so the corpus
 * runs `bible -f Genesis1:1-Revelation22:21`, which prints one verse a line after its reference
 * ("Ge1:1 In the beginning God created the heaven and the earth.").
 *
 * Sentences: each verse is split after every '.', '?' or '!' that ends a word, and at its end (a verse
 * boundary ends a sentence even after ',' or ':'); a piece of more than CORPUS_MAX_WORDS words is
 * cut into pieces of at most that many. Spaces are collapsed to one, and empty pieces dropped. The
 * result depends only on the text, so the first N sentences are the same on every machine.
 */
#ifndef KVQ_TOOLS_CORPUS_H
#define KVQ_TOOLS_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#define CORPUS_MAX_WORDS 100

typedef struct corpus {
  char **sentences; /* count NUL-terminated sentences, owned by the corpus */
  uint32_t count;
} corpus;

/*
 * The first `count` sentences of the King James Bible (fewer only if the text has fewer: it
 * has 35,049). `data_dir`: the folder holding bible.data (NULL: /usr/lib, where Debian installs it).
 * Returns 0, or -1 with a message in `error` (for instance that the packages are not installed:
 * which ones, and how to install them) and *out left empty. Not thread-safe (it starts a process).
 */
int corpus_bible(const char *data_dir, uint32_t count, corpus *out, char *error, size_t error_size);

/* Frees the sentences; *c is empty afterwards. */
void corpus_free(corpus *c);

#endif
