/*
 * A PNG scatter plot of labelled points (each its own marker and colour, named in the key) through
 * gnuplot (Debian's gnuplot-nox; scripts/install-deps.sh installs it): for `kvq eval --plot`, quality
 * against bits per number, one point per method.
 *
 * The data and the gnuplot script are written next to the PNG (FILE.png: FILE.dat and FILE.gp), so a
 * plot can be restyled by editing the script and running `gnuplot FILE.gp`, and so that they are there
 * even when gnuplot is not.
 */
#ifndef KVQ_TOOLS_PLOT_H
#define KVQ_TOOLS_PLOT_H

#include <stddef.h>

typedef struct plot_point {
  const char *label; /* the point's entry in the key: one word (no space, quote, backslash or newline) */
  double x, y;
} plot_point;

typedef struct plot_spec {
  const char *title, *x_label, *y_label;
  int log_y; /* a logarithmic y axis (points with y <= 0 are then left out, and counted in the title) */
} plot_spec;

/*
 * Writes FILE.dat and FILE.gp next to `png` (FILE: `png` without its ".png") and runs gnuplot on the
 * script, which writes `png` (an older file of that name is removed first). Returns 0, or -1 with a message in `error`: gnuplot missing (which
 * package installs it), gnuplot failing (its exit status; the script to rerun), a path or label it
 * cannot quote, or a file it cannot write. Not thread-safe (it starts a process).
 */
int plot_png(const char *png, const plot_spec *spec, const plot_point *points, size_t count, char *error,
             size_t error_size);

#endif
