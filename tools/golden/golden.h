/*
 * kvq golden files: write them with the CPU reference, check any backend against them in the three
 * classes of agreement (docs/GOLDEN.md):
 *   1. codes byte-identical, except near-ties each proven from the data (counted);
 *   2. float side data within 1 ulp of its storage type;
 *   3. scores, probabilities and outputs within derived bounds (reference.h).
 * Plus: every matrix's SHA-256, the kept tokens of token-policy cases after every decoding step, a
 * saved cache that must load and re-save identically, and saved files that must be rejected with a
 * given status.
 */
#ifndef KVQ_TOOLS_GOLDEN_GOLDEN_H
#define KVQ_TOOLS_GOLDEN_GOLDEN_H

#include <stdint.h>
#include <stdio.h>

#include "kvq/kvq.h"

typedef struct golden_totals {
  uint32_t configurations, configurations_failed;
  uint64_t matrices, matrix_mismatches;
  uint64_t code_bytes, code_bytes_differing, near_ties, unexplained;
  uint64_t implied;    /* sign bits that differ only because a proven outlier near-tie changed the mask */
  uint64_t side_values, side_one_ulp, side_beyond;
  uint64_t class3_values, class3_beyond;
  uint64_t decisions, decisions_differing; /* token policies: kept sets compared after each decoding step */
  double class3_worst; /* largest |difference| / bound seen */
  uint32_t files_checked, files_failed;
  uint32_t errors;     /* could not run a check at all (I/O, backend) */
} golden_totals;

/* The configurations of the golden matrix. */
uint32_t kvq_golden_case_count(void);
const char *kvq_golden_case_name(uint32_t index);

/* Writes every golden file into dir with the CPU backend. Returns 0 or prints why and returns 1. */
int kvq_golden_write(const char *dir, FILE *log);

/* Saved caches of one H2O sequence that decoded 2^31 - 16 tokens (crafted: a short stream's file with
 * its positions moved, checksum recomputed), a few KB each. Loading them must cost work in
 * proportion to the file and the configuration, never to the positions (docs/GOLDEN.md). */
typedef enum golden_long_stream {
  GOLDEN_LONG_WITH_SINKS,    /* sinks 4: the sinks' page and the last page; loads */
  GOLDEN_LONG_HUGE_COUNT,    /* the same, its statistics count claiming 2^31 - 16 records: refused */
  GOLDEN_LONG_WITHOUT_SINKS, /* sinks 0: only the last page; loads */
  GOLDEN_LONG_FAR_POSITION,  /* the same with sinks 4: no page holds the sinks, refused */
} golden_long_stream;
/* The file (malloc'ed; NULL when out of memory or the CPU backend fails), its size in *size. */
uint8_t *kvq_golden_long_stream(golden_long_stream which, size_t *size);

struct golden_case;
/* Writes the golden file of one configuration (any, not only the matrix's: tests build their own)
 * into dir with the CPU reference. Returns 0, or prints why to log and returns 1. */
int kvq_golden_write_case(const struct golden_case *c, const char *dir, FILE *log);

struct golden_file;
/* Adds to a golden file holding only inputs (config, schedule, sequences, keys/values, queries) the
 * results computed on a context: matrix SHA-256s, page images, logits, probabilities, outputs.
 * With keep, the replayed cache is returned. For --write, and for tests that build their own files. */
int kvq_golden_record_results(struct golden_file *g, kvq_context *ctx, kvq_cache **keep, char *error, size_t error_size);

/* Checks a backend against the golden files in dir. Prints one line per failure (to `out`) and the
 * summary lines. Returns 0 when everything agrees, 1 when something disagrees, 2 when the check
 * could not run (missing files, backend unavailable). */
int kvq_golden_check(const char *dir, kvq_backend_kind backend, FILE *out, golden_totals *totals);

#endif
