/*
 * plot.h: data and script written as plain files, gnuplot started with posix_spawnp (no shell, so
 * paths need no shell quoting; gnuplot's own single-quoted strings cannot hold a single quote, hence
 * the check), its output and errors thrown away and its exit status reported.
 */
#include "plot.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* FILE and the two paths next to the PNG. */
static int paths(const char *png, char *data, char *script, size_t size) {
  size_t base = strlen(png);
  if (base > 4 && !strcmp(png + base - 4, ".png")) base -= 4;
  const int a = snprintf(data, size, "%.*s.dat", (int)base, png), b = snprintf(script, size, "%.*s.gp", (int)base, png);
  return a > 0 && (size_t)a < size && b > 0 && (size_t)b < size ? 0 : -1;
}

static int quotable(const char *s) { return s && !strpbrk(s, "'\"\n\r\\"); }
static int one_word(const char *s) { return quotable(s) && *s && !strpbrk(s, " \t"); }

static int write_files(const char *png, const char *data, const char *script, const plot_spec *spec,
                       const plot_point *points, size_t count) {
  FILE *d = fopen(data, "w");
  if (!d) return -1;
  size_t left_out = 0;
  fprintf(d, "# x y label (kvq: %s)\n", spec->title);
  for (size_t i = 0; i < count; i++) {
    if (spec->log_y && !(points[i].y > 0)) {
      left_out++;
      continue;
    }
    fprintf(d, "%.9g %.9g \"%s\"\n", points[i].x, points[i].y, points[i].label);
  }
  const int data_ok = fclose(d) == 0;
  FILE *g = fopen(script, "w");
  if (!g) return -1;
  fprintf(g, "# written by kvq (tools/plot.c); rerun with: gnuplot %s\n", script);
  /* noenhanced: method names and titles hold '_' and '^', which enhanced text would typeset */
  fprintf(g, "set terminal pngcairo noenhanced size 1400,800 font \",11\"\nset output '%s'\n", png);
  if (left_out) fprintf(g, "set title \"%s (left out of the log scale: %zu at 0)\"\n", spec->title, left_out);
  else fprintf(g, "set title \"%s\"\n", spec->title);
  fprintf(g, "set xlabel \"%s\"\nset ylabel \"%s\"\n", spec->x_label, spec->y_label);
  if (spec->log_y) fprintf(g, "set logscale y\n");
  /* one series per point, so that each gets its own marker and colour and its label in the key
   * (labels next to close points would overprint each other); labels hold no spaces (checked) */
  fprintf(g, "labels = \"");
  for (size_t i = 0, first = 1; i < count; i++)
    if (!spec->log_y || points[i].y > 0) fprintf(g, "%s%s", first ? "" : " ", points[i].label), first = 0;
  fprintf(g, "\"\nset grid\nset key outside right top font \",10\"\nset offsets graph 0.03, graph 0.03, graph 0.05, graph 0.05\n"
             "plot for [i=1:words(labels)] '%s' every ::(i-1)::(i-1) using 1:2 with points \\\n"
             "     pointtype ((i-1)%%7+4) linecolor (i) pointsize 1.6 title word(labels, i)\n",
          data);
  return fclose(g) == 0 && data_ok ? 0 : -1;
}

int plot_png(const char *png, const plot_spec *spec, const plot_point *points, size_t count, char *error,
             size_t error_size) {
  char data[4096], script[4096];
  if (!quotable(png) || paths(png, data, script, sizeof data) != 0) {
    snprintf(error, error_size, "cannot plot to '%s': the path must be shorter than 4 kB, without quotes or backslashes",
             png ? png : "(null)");
    return -1;
  }
  if (!quotable(spec->title) || !quotable(spec->x_label) || !quotable(spec->y_label)) {
    snprintf(error, error_size, "a plot title or axis label holds a quote, backslash or newline");
    return -1;
  }
  for (size_t i = 0; i < count; i++)
    if (!one_word(points[i].label)) {
      snprintf(error, error_size, "plot label %zu is empty or holds a space, quote, backslash or newline", i);
      return -1;
    }
  if (write_files(png, data, script, spec, points, count) != 0) {
    snprintf(error, error_size, "cannot write %s and %s: %s", data, script, strerror(errno));
    return -1;
  }
  remove(png); /* a PNG left from an earlier run must not pass for this one's */
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  char *argv[] = {"gnuplot", script, NULL};
  pid_t pid;
  const int spawned = posix_spawnp(&pid, "gnuplot", &actions, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    snprintf(error, error_size,
             "cannot run gnuplot (%s): install Debian's package gnuplot-nox (scripts/install-deps.sh does); the data and "
             "script are in %s and %s",
             strerror(spawned), data, script);
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || access(png, R_OK) != 0) {
    snprintf(error, error_size, "gnuplot did not write %s (exit status %d): run 'gnuplot %s' to see why", png,
             WIFEXITED(status) ? WEXITSTATUS(status) : -1, script);
    return -1;
  }
  return 0;
}
