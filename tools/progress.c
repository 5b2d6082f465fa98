/*
 * The tool's progress line (progress.h). One lock guards the state; the ticker thread wakes once a
 * second so that a phase blocked inside one library call (codebook learning) still shows time
 * passing on a terminal, and still writes a line every 30 s to a log.
 */
#include "progress.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { BAR = 20, LOG_EVERY_S = 30 };

struct progress {
  FILE *out;
  int terminal;
  uint32_t rows, row;
  char label[48], phase[64];
  uint32_t done, total;
  double phase_start, last_draw, next_log;
  int quarter; /* counted phases, logs: the last quarter written (0..3) */
  int stop;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  pthread_t ticker;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The whole line, redrawn in place: a terminal. Called with the lock held. */
static void draw(progress *p, double now) {
  const double inside = p->total ? (double)p->done / p->total : 0.0;
  const double whole = p->rows ? (p->row + inside) / p->rows : 1.0;
  char bar[BAR + 1];
  const int filled = (int)(whole * BAR);
  for (int i = 0; i < BAR; i++) bar[i] = i < filled ? '#' : '.';
  bar[BAR] = 0;
  fprintf(p->out, "\r\033[K[%u/%u] %3.0f%% %s %s: %s", p->row + 1, p->rows, 100.0 * whole, bar, p->label, p->phase);
  if (p->total) fprintf(p->out, " %u/%u", p->done, p->total);
  fprintf(p->out, " %.0f s", now - p->phase_start);
  fflush(p->out);
  p->last_draw = now;
}

/* One whole line: a log. Called with the lock held. */
static void log_line(progress *p, const char *what) {
  fprintf(p->out, "[%u/%u] %s: %s%s\n", p->row + 1, p->rows, p->label, p->phase, what);
  fflush(p->out);
}

static void *tick(void *arg) {
  progress *p = arg;
  pthread_mutex_lock(&p->lock);
  while (!p->stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 1;
    pthread_cond_timedwait(&p->wake, &p->lock, &until);
    if (p->stop || !p->phase[0]) continue;
    const double now = now_s();
    if (p->terminal) draw(p, now);
    else if (now - p->phase_start >= p->next_log) {
      char what[64];
      snprintf(what, sizeof what, ", still running after %.0f s", now - p->phase_start);
      log_line(p, what);
      p->next_log += LOG_EVERY_S;
    }
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

progress *progress_start(FILE *out, int terminal, uint32_t rows, int quiet) {
  if (quiet || !out) return NULL;
  progress *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->out = out;
  p->terminal = terminal < 0 ? isatty(fileno(out)) : terminal;
  p->rows = rows;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->wake, NULL);
  if (pthread_create(&p->ticker, NULL, tick, p) != 0) { /* without a ticker: no progress at all */
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
    return NULL;
  }
  return p;
}

void progress_row(progress *p, uint32_t index, const char *label, size_t len) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->row = index;
  snprintf(p->label, sizeof p->label, "%.*s", (int)len, label);
  p->phase[0] = 0;
  pthread_mutex_unlock(&p->lock);
}

void progress_phase(progress *p, const char *phase, uint32_t done, uint32_t total) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  const double now = now_s();
  const int fresh = strcmp(p->phase, phase) != 0;
  if (fresh) {
    snprintf(p->phase, sizeof p->phase, "%s", phase);
    p->phase_start = now;
    p->next_log = LOG_EVERY_S;
    p->quarter = 0;
  }
  p->done = done, p->total = total;
  if (p->terminal) {
    if (fresh || now - p->last_draw >= 0.2 || (total && done == total)) draw(p, now);
  } else if (fresh) {
    log_line(p, "");
  } else if (total && done < total && 4ull * done / total > (unsigned)p->quarter) {
    p->quarter = (int)(4ull * done / total);
    char what[48];
    snprintf(what, sizeof what, " %u%% (%u/%u)", 25 * p->quarter, done, total);
    log_line(p, what);
  }
  pthread_mutex_unlock(&p->lock);
}

void progress_finish(progress *p) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->stop = 1;
  pthread_cond_signal(&p->wake);
  pthread_mutex_unlock(&p->lock);
  pthread_join(p->ticker, NULL);
  if (p->terminal) {
    fprintf(p->out, "\r\033[K");
    fflush(p->out);
  }
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
