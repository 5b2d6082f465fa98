/*
 * A progress line on stderr for the tool's long commands (`kvq eval`): which row of how many, the
 * phase inside the row, a bar of the whole run and the phase's elapsed time.
 *
 * On a terminal the line is redrawn in place, at most every 0.2 s and once a second while a
 * phase blocks (a ticker thread: codebook learning is one library call that reports nothing for
 * minutes on 2 cores). When stderr is not a terminal (a log, a pipe) it writes sparse whole
 * lines instead: one when a phase starts, one every 30 s while it runs, and one at 25/50/75% of a
 * counted phase. The functions are safe to call from the thread that owns the progress only
 * (the ticker thread takes the same lock).
 */
#ifndef KVQ_TOOLS_PROGRESS_H
#define KVQ_TOOLS_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct progress progress;

/* Starts a progress display of `rows` rows on `out` (borrowed; never closed). `terminal` 1 redraws in
 * place, 0 writes sparse lines, -1 asks isatty(). NULL when `quiet` (every call below accepts NULL and
 * does nothing) or out of memory (progress is then silently off). */
progress *progress_start(FILE *out, int terminal, uint32_t rows, int quiet);

/* Row `index` (0-based) begins; `label` (len bytes, not NUL-terminated) names it. */
void progress_row(progress *p, uint32_t index, const char *label, size_t len);

/* A phase of the current row begins or advances: `done` of `total` steps (total 0: not counted,
 * only its elapsed time is shown). A new `phase` string (compared by content) restarts the clock. */
void progress_phase(progress *p, const char *phase, uint32_t done, uint32_t total);

/* Ends the display (clears the line on a terminal), stops the ticker and frees p. */
void progress_finish(progress *p);

#endif
