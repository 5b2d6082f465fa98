/* Parts of the kvq tool tested on their own: the progress line (tools/progress.c), the sentences of
 * the King James Bible (tools/corpus.c) and PNG plots (tools/plot.c). */
#include <criterion/criterion.h>

#include "helpers.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corpus.h"
#include "plot.h"
#include "progress.h"

static char text[1 << 14];

static void read_back(FILE *f) {
  rewind(f);
  const size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
}

/* On a terminal the line is redrawn in place (carriage return, erase to the end of the line) with
 * the row, the run's share done and a bar, and cleared at the end; counted phases show done/total. */
Test(tool_parts, progress_terminal_redraws_in_place) {
  FILE *f = tmpfile();
  cr_assert_not_null(f);
  progress *p = progress_start(f, 1, 4, 0);
  cr_assert_not_null(p);
  progress_row(p, 1, "kivi-b2/uniform-b2@h2o and more", 22);
  progress_phase(p, "decoding", 0, 10);
  progress_phase(p, "decoding", 10, 10); /* the end of a counted phase is always drawn */
  progress_finish(p);
  read_back(f);
  cr_assert_not_null(strstr(text, "\r\033[K[2/4]  25% #####............... kivi-b2/uniform-b2@h2o: decoding 0/10 0 s"),
                     "%s", text);
  /* row 2 of 4 with its phase done: half of the run */
  cr_assert_not_null(strstr(text, "\r\033[K[2/4]  50% ##########.......... kivi-b2/uniform-b2@h2o: decoding 10/10"),
                     "%s", text);
  const size_t n = strlen(text);
  cr_assert(n > 4 && !strcmp(text + n - 4, "\r\033[K"), "the line is cleared at the end: %s", text);
  cr_assert_null(strchr(text, '\n'), "%s", text);
}

/* In a log: one line when a phase starts and at each quarter of a counted phase, nothing else. */
Test(tool_parts, progress_log_lines_are_sparse) {
  FILE *f = tmpfile();
  cr_assert_not_null(f);
  progress *p = progress_start(f, 0, 2, 0);
  progress_row(p, 0, "cq-c4-b8", 8);
  progress_phase(p, "learning codebooks", 0, 0);
  progress_row(p, 1, "uniform-b2@qhitter", 18);
  for (uint32_t i = 0; i < 100; i++) progress_phase(p, "decoding", i, 100);
  progress_finish(p);
  read_back(f);
  cr_assert_str_eq(text,
                   "[1/2] cq-c4-b8: learning codebooks\n"
                   "[2/2] uniform-b2@qhitter: decoding\n"
                   "[2/2] uniform-b2@qhitter: decoding 25% (25/100)\n"
                   "[2/2] uniform-b2@qhitter: decoding 50% (50/100)\n"
                   "[2/2] uniform-b2@qhitter: decoding 75% (75/100)\n");
}

/* --quiet: no display at all, and every call accepts the NULL it returns. */
Test(tool_parts, progress_quiet_is_null) {
  progress *p = progress_start(stderr, -1, 3, 1);
  cr_assert_null(p);
  progress_row(p, 0, "x", 1);
  progress_phase(p, "y", 1, 2);
  progress_finish(p);
}

/* ---- The King James Bible as sentences (tools/corpus.c) ---- */

static int bible_installed(void) { return access("/usr/lib/bible.data", R_OK) == 0; }

/* The first sentences are the first verses split at sentence ends and verse boundaries (Genesis
 * 1:2 holds two), the same on every call; a long run keeps every sentence within the word limit. */
Test(tool_parts, corpus_first_sentences) {
  if (!bible_installed()) cr_skip_test("the King James Bible is not installed (Debian's bible-kjv-text)");
  corpus c, again;
  char error[512];
  cr_assert_eq(corpus_bible(NULL, 4, &c, error, sizeof error), 0, "%s", error);
  cr_assert_eq(c.count, 4);
  cr_assert_str_eq(c.sentences[0], "In the beginning God created the heaven and the earth.");
  cr_assert_str_eq(c.sentences[1], "And the earth was without form, and void; and darkness was upon the face of the deep.");
  cr_assert_str_eq(c.sentences[2], "And the Spirit of God moved upon the face of the waters.");
  cr_assert_str_eq(c.sentences[3], "And God said, Let there be light: and there was light.");
  cr_assert_eq(corpus_bible(NULL, 3000, &again, error, sizeof error), 0, "%s", error);
  cr_assert_eq(again.count, 3000);
  for (uint32_t i = 0; i < 4; i++) cr_assert_str_eq(again.sentences[i], c.sentences[i]);
  for (uint32_t i = 0; i < again.count; i++) {
    uint32_t words = 1;
    for (const char *p = again.sentences[i]; *p; p++) {
      cr_assert(*p != '\n' && !(p[0] == ' ' && p[1] == ' '), "sentence %u: %s", i, again.sentences[i]);
      words += *p == ' ';
    }
    cr_assert(words <= CORPUS_MAX_WORDS && again.sentences[i][0] != ' ', "sentence %u: %s", i, again.sentences[i]);
  }
  corpus_free(&c);
  corpus_free(&again);
  cr_assert_eq(c.count, 0);
}

/* Without the text: a message that names the packages, and nothing returned. A data file bible
 * cannot read: a message naming it. */
Test(tool_parts, corpus_missing_text_is_a_clear_error) {
  corpus c = {(char **)1, 7};
  char error[512];
  cr_assert_eq(corpus_bible("/nonexistent-kvq", 10, &c, error, sizeof error), -1);
  cr_assert_not_null(strstr(error, "bible-kjv-text"), "%s", error);
  cr_assert_null(c.sentences);
  cr_assert_eq(c.count, 0);
  if (access("/usr/bin/bible", X_OK) != 0) cr_skip_test("bible (Debian's bible-kjv) is not installed: the corrupt file case needs it");
  char dir[] = "/tmp/kvq-corpus-XXXXXX", path[64];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/bible.data", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("not the bible\n", f);
  fclose(f);
  cr_assert_eq(corpus_bible(dir, 10, &c, error, sizeof error), -1);
  cr_assert_not_null(strstr(error, "could not read"), "%s", error);
  cr_assert_eq(c.count, 0);
  remove(path), rmdir(dir);
}

/* The splitting rules on a text of our own: a stand-in `bible` first on PATH prints two verse lines,
 * one of 250 words without a sentence end (cut at 100 words), one with three sentence ends and a
 * trailing piece that the verse boundary ends, with doubled spaces collapsed. */
Test(tool_parts, corpus_splits_sentences_and_long_verses) {
  char dir[] = "/tmp/kvq-fakebible-XXXXXX", path[128], error[512];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/bible.data", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fclose(f);
  snprintf(path, sizeof path, "%s/bible", dir);
  f = fopen(path, "w");
  cr_assert_not_null(f);
  fprintf(f, "#!/bin/sh\nprintf 'Xx1:1'\nfor i in $(seq 250); do printf ' w%%s' $i; done\n"
             "printf '\\nXx1:2 One.  Two? (Three!) Four\\n'\n");
  fclose(f);
  cr_assert_eq(chmod(path, 0755), 0);
  char search[4096];
  snprintf(search, sizeof search, "%s:%s", dir, getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
  setenv("PATH", search, 1); /* this test's own process */
  corpus c;
  cr_assert_eq(corpus_bible(dir, 100, &c, error, sizeof error), 0, "%s", error);
  cr_assert_eq(c.count, 7);
  const uint32_t words[3] = {100, 100, 50};
  for (int i = 0; i < 3; i++) {
    uint32_t n = 1;
    for (const char *p = c.sentences[i]; *p; p++) n += *p == ' ';
    cr_assert_eq(n, words[i], "sentence %d: %u words", i, n);
  }
  cr_assert(!strncmp(c.sentences[0], "w1 w2 ", 6) && !strncmp(c.sentences[2], "w201 ", 5), "%s", c.sentences[2]);
  const char *rest[4] = {"One.", "Two?", "(Three!)", "Four"};
  for (int i = 0; i < 4; i++) cr_assert_str_eq(c.sentences[3 + i], rest[i]);
  corpus_free(&c);
  cr_assert_eq(corpus_bible(dir, 2, &c, error, sizeof error), 0, "%s", error); /* stops early: bible's exit does not matter */
  cr_assert_eq(c.count, 2);
  corpus_free(&c);
  remove(path);
  snprintf(path, sizeof path, "%s/bible.data", dir);
  remove(path), rmdir(dir);
}

/* ---- PNG plots through gnuplot (tools/plot.c) ---- */

static const plot_point points[] = {{"exact-f16", 16, 1e-3}, {"kivi-b2/uniform-b2", 3, 0.78}, {"cq-c4-b8", 2, 0.53}};
static const plot_spec spec = {"test plot", "bits per number", "output error", 1};

/* The PNG is written (its 8-byte signature), with its data and script next to it. */
Test(tool_parts, plot_writes_a_png) {
  if (access("/usr/bin/gnuplot", X_OK) != 0) cr_skip_test("gnuplot is not installed (Debian's gnuplot-nox)");
  char dir[] = "/tmp/kvq-plot-XXXXXX", png[64], dat[64], gp[64], error[1024];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(png, sizeof png, "%s/p.png", dir);
  snprintf(dat, sizeof dat, "%s/p.dat", dir);
  snprintf(gp, sizeof gp, "%s/p.gp", dir);
  cr_assert_eq(plot_png(png, &spec, points, 3, error, sizeof error), 0, "%s", error);
  th_assert_png(png);
  FILE *f = fopen(dat, "r");
  cr_assert_not_null(f);
  char text_line[256];
  cr_assert_not_null(fgets(text_line, sizeof text_line, f)); /* the comment */
  cr_assert_not_null(fgets(text_line, sizeof text_line, f));
  fclose(f);
  cr_assert_str_eq(text_line, "16 0.001 \"exact-f16\"\n");
  remove(png), remove(dat), remove(gp), rmdir(dir);
}

/* gnuplot missing (not on PATH), or a label gnuplot cannot quote: a message, no crash. */
Test(tool_parts, plot_errors_are_messages) {
  char dir[] = "/tmp/kvq-plot-XXXXXX", png[64], error[1024];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(png, sizeof png, "%s/p.png", dir);
  const plot_point bad[] = {{"say \"hi\"", 1, 1}};
  cr_assert_eq(plot_png(png, &spec, bad, 1, error, sizeof error), -1);
  cr_assert_not_null(strstr(error, "label 0"), "%s", error);
  FILE *stale = fopen(png, "w"); /* an earlier run's PNG must not pass for this one's */
  cr_assert_not_null(stale);
  fclose(stale);
  setenv("PATH", "/nonexistent-kvq", 1); /* this test's own process (Criterion forks one per test) */
  cr_assert_eq(plot_png(png, &spec, points, 3, error, sizeof error), -1);
  cr_assert_not_null(strstr(error, "gnuplot-nox"), "%s", error);
  cr_assert_eq(access(png, F_OK), -1, "no PNG without gnuplot");
  char path[64];
  snprintf(path, sizeof path, "%s/p.dat", dir);
  cr_assert_eq(access(path, R_OK), 0, "the data are written anyway");
  remove(path);
  snprintf(path, sizeof path, "%s/p.gp", dir);
  remove(path), rmdir(dir);
}
