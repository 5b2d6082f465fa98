#include "model_tap.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>

int test_number = 0, failures = 0;

void check(int ok, const char *format, ...) {
  va_list args;
  va_start(args, format);
  printf("%s %d - ", ok ? "ok" : "not ok", ++test_number);
  vprintf(format, args);
  printf("\n");
  va_end(args);
  if (!ok) failures++;
}

kvq_use_model *model_tap_load(char *dir, size_t dir_size, int *exit_code) {
  char probe[4200];
  struct stat st;
  if (kvq_use_default_dir(dir, dir_size) != KVQ_OK ||
      (snprintf(probe, sizeof probe, "%s/model.json", dir), stat(probe, &st) != 0)) {
    printf("1..1\nok 1 # SKIP model not fetched (scripts/fetch-model.sh)\n");
    *exit_code = 0;
    return NULL;
  }
  kvq_use_model *m = NULL;
  char message[1024];
  if (kvq_use_load(dir, &m, message, sizeof message) != KVQ_OK) {
    printf("1..1\nnot ok 1 - loading the model from %s: %s\n", dir, message);
    *exit_code = 1;
    return NULL;
  }
  return m;
}

int model_tap_finish(void) {
  printf("1..%d\n", test_number);
  return failures ? 1 : 0;
}
