/*
 * The fuzz targets' regression driver: feeds every file of the given corpus directories (or files)
 * to LLVMFuzzerTestOneInput, one TAP line per file, so that the ordinary test build (gcc, ASan and
 * UBSan, no libFuzzer) replays every committed input in CI. A target that crashes, trips a
 * sanitizer or calls fuzz_fail ends the process before its "ok" line: meson then fails the test
 * (a plan of N lines with fewer printed, and a non-zero exit status). A directory that cannot be read
 * is a failure too, never an empty pass.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

typedef struct names {
  char **v;
  size_t n, cap;
} names;

static int add(names *list, const char *path) {
  if (list->n == list->cap) {
    size_t cap = list->cap ? 2 * list->cap : 64;
    char **v = realloc(list->v, cap * sizeof *v);
    if (!v) return -1;
    list->v = v, list->cap = cap;
  }
  list->v[list->n] = strdup(path);
  return list->v[list->n++] ? 0 : -1;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every regular file of `dir` whose name ends with `suffix` (all with ""), hidden ones excepted. */
static int list_dir(names *list, const char *dir, const char *suffix) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  const size_t first = list->n;
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    const size_t len = strlen(e->d_name), slen = strlen(suffix);
    if (e->d_name[0] == '.' || len < slen || strcmp(e->d_name + len - slen, suffix) != 0) continue;
    const size_t need = strlen(dir) + len + 2;
    char *path = malloc(need);
    struct stat st;
    if (!path) {
      rc = -1;
      break;
    }
    snprintf(path, need, "%s/%s", dir, e->d_name);
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) rc = add(list, path);
    free(path);
  }
  closedir(d);
  qsort(list->v + first, list->n - first, sizeof *list->v, by_name);
  return rc;
}

static uint8_t *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  uint8_t *data = NULL;
  size_t n = 0, cap = 0, got;
  do {
    if (n == cap) {
      cap = cap ? 2 * cap : 1 << 16;
      uint8_t *grown = realloc(data, cap);
      if (!grown) {
        free(data);
        fclose(f);
        return NULL;
      }
      data = grown;
    }
    got = fread(data + n, 1, cap - n, f);
    n += got;
  } while (got > 0);
  const int failed = ferror(f);
  fclose(f);
  if (failed) {
    free(data);
    return NULL;
  }
  *size = n;
  return data;
}

/* Arguments: directories (with an optional ":SUFFIX" selecting file names, e.g. golden:.kvq) or files. */
int main(int argc, char **argv) {
  names list = {0};
  int bad = 0;
  for (int i = 1; i < argc; i++) {
    char *arg = strdup(argv[i]);
    if (!arg) return 1;
    char *colon = strrchr(arg, ':');
    const char *suffix = "";
    if (colon) *colon = '\0', suffix = colon + 1;
    struct stat st;
    if (stat(arg, &st) != 0) {
      printf("# cannot read %s\n", arg);
      bad = 1;
    } else if (S_ISDIR(st.st_mode) ? list_dir(&list, arg, suffix) != 0 : add(&list, arg) != 0) {
      printf("# cannot list %s\n", arg);
      bad = 1;
    }
    free(arg);
  }
  if (list.n == 0) bad = 1;
  const int bad_arguments = bad;
  printf("1..%zu\n", list.n + (size_t)bad_arguments);
  fflush(stdout);
  for (size_t i = 0; i < list.n; i++) {
    size_t size = 0;
    uint8_t *data = read_file(list.v[i], &size);
    if (!data) {
      printf("not ok %zu - %s: cannot read\n", i + 1, list.v[i]);
      bad = 1;
    } else {
      LLVMFuzzerTestOneInput(data, size);
      printf("ok %zu - %s (%zu bytes)\n", i + 1, list.v[i], size);
    }
    fflush(stdout);
    free(data);
    free(list.v[i]);
  }
  free(list.v);
  if (bad_arguments) printf("not ok %zu - every corpus argument names readable inputs, at least one\n", list.n + 1);
  return bad;
}
