/* TAP output shared by the tests on the real model (test_model.c, test_model_policy.c,
 * test_model_bounds.c): numbered ok / not ok lines, and the model loaded or the run skipped. */
#ifndef KVQ_TESTS_MODEL_TAP_H
#define KVQ_TESTS_MODEL_TAP_H

#include "use.h"

extern int test_number, failures; /* lines printed so far; of them, not ok */

/* Prints "ok N - ..." or "not ok N - ..." and counts a failure. */
void check(int ok, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* The model from its default folder (written to dir), or NULL with *exit_code set after printing the whole TAP run:
 * a visible skip when it was not fetched (0), a failure when it does not load (1). */
kvq_use_model *model_tap_load(char *dir, size_t dir_size, int *exit_code);

/* Prints the plan and gives the exit status of the run. */
int model_tap_finish(void);

#endif
