/*
 * The King James Bible as sentences (corpus.h): `bible` (package bible-kjv) decompresses the text of
 * bible-kjv-text through a pipe, and each verse line is split into sentences as it arrives, so
 * asking for the first hundred sentences reads only the first verses.
 */
#include "corpus.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

void corpus_free(corpus *c) {
  for (uint32_t i = 0; i < c->count; i++) free(c->sentences[i]);
  free(c->sentences);
  c->sentences = NULL;
  c->count = 0;
}

/* A sentence ends after a word whose last character, past closing brackets and quotes, is one of
 * . ? ! ("light." ends one; "said," does not). */
static int ends_sentence(const char *word, size_t len) {
  while (len > 0 && strchr(")]'\"", word[len - 1])) len--;
  return len > 0 && strchr(".?!", word[len - 1]) != NULL;
}

typedef struct builder {
  corpus *out;
  uint32_t want, capacity;
  char piece[4096];
  size_t length;
  uint32_t words;
} builder;

/* Ends the current piece: a new sentence when it holds any word. -1 when out of memory. */
static int emit(builder *b) {
  if (b->words == 0) return 0;
  if (b->out->count == b->capacity) {
    const uint32_t capacity = b->capacity ? 2 * b->capacity : 256;
    char **grown = realloc(b->out->sentences, sizeof *grown * capacity);
    if (!grown) return -1;
    b->out->sentences = grown;
    b->capacity = capacity;
  }
  b->piece[b->length] = 0;
  if (!(b->out->sentences[b->out->count] = strdup(b->piece))) return -1;
  b->out->count++;
  b->length = 0;
  b->words = 0;
  return 0;
}

/* One verse line: the reference up to the first space is skipped, the rest split into sentences. */
static int split_verse(builder *b, const char *line) {
  const char *p = strchr(line, ' ');
  if (!p) return 0;
  while (*p && b->out->count < b->want) {
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    if (!*p) break;
    size_t len = strcspn(p, " \t\r\n");
    if (len > 1000) len = 1000; /* no English word is longer; the piece buffer stays bounded */
    if (b->words) b->piece[b->length++] = ' ';
    memcpy(b->piece + b->length, p, len);
    b->length += len;
    b->words++;
    const int end = ends_sentence(p, len) || b->words == CORPUS_MAX_WORDS || b->length > sizeof b->piece - 1100;
    p += len;
    if (end && emit(b) != 0) return -1;
  }
  return b->out->count < b->want ? emit(b) : 0; /* a verse boundary ends a sentence */
}

int corpus_bible(const char *data_dir, uint32_t count, corpus *out, char *error, size_t error_size) {
  memset(out, 0, sizeof *out);
  const char *dir = data_dir ? data_dir : "/usr/lib";
  char data[4096];
  snprintf(data, sizeof data, "%s/bible.data", dir);
  if (access(data, R_OK) != 0) {
    snprintf(error, error_size,
             "the King James Bible is not installed (no %s): install Debian's packages bible-kjv and bible-kjv-text "
             "(scripts/install-deps.sh does)",
             data);
    return -1;
  }
  int fd[2];
  if (pipe(fd) != 0) {
    snprintf(error, error_size, "cannot start bible: %s", strerror(errno));
    return -1;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fd[0]);
  posix_spawn_file_actions_addclose(&actions, fd[1]);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  char *argv[] = {"bible", "-f", "-p", (char *)dir, "Genesis1:1-Revelation22:21", NULL};
  pid_t pid;
  const int spawned = posix_spawnp(&pid, "bible", &actions, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fd[1]);
  if (spawned != 0) {
    close(fd[0]);
    snprintf(error, error_size, "cannot run bible (%s): install Debian's package bible-kjv (scripts/install-deps.sh does)",
             strerror(spawned));
    return -1;
  }
  FILE *in = fdopen(fd[0], "r");
  builder *b = calloc(1, sizeof *b);
  char *line = NULL;
  size_t size = 0;
  int failed = !in || !b;
  if (b) b->out = out, b->want = count;
  while (!failed && out->count < count && getline(&line, &size, in) > 0) failed = split_verse(b, line) != 0;
  free(line);
  free(b);
  if (in) fclose(in); /* bible stops at its next write if it has more to say (SIGPIPE, or EPIPE) */
  else close(fd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  /* with every sentence wanted read, how bible ended does not matter (it may die of the closed pipe);
   * short of them, it must have ended normally: the text is then shorter than asked */
  const int complete = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (failed) {
    snprintf(error, error_size, "out of memory for %u sentences", count);
  } else if (count > 0 && (out->count == 0 || (out->count < count && !complete))) {
    snprintf(error, error_size, "bible could not read %s (exit status %d after %u sentences)", data,
             WIFEXITED(status) ? WEXITSTATUS(status) : -1, out->count);
    failed = 1;
  }
  if (failed) corpus_free(out);
  return failed ? -1 : 0;
}
