/* `kvq golden`: check a backend against the golden files, or write them. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "golden/golden.h"

/* Where the golden files are: the installed copy (tools/meson.build passes <prefix>/share/kvq/golden)
 * for an installed kvq, and the source tree's tests/golden for the kvq of a build tree, which is
 * what the README's commands run before anything is installed. */
#ifndef KVQ_GOLDEN_DIR
#define KVQ_GOLDEN_DIR "tests/golden"
#endif
#ifndef KVQ_SOURCE_GOLDEN_DIR
#define KVQ_SOURCE_GOLDEN_DIR KVQ_GOLDEN_DIR
#endif
#ifndef KVQ_BUILD_ROOT
#define KVQ_BUILD_ROOT ""
#endif

/* Whether this executable is the one in the build tree it was built in (Linux: /proc/self/exe);
 * `meson install` copies it elsewhere, and a copy uses the installed files. */
static int running_from_build_tree(void) {
  char exe[PATH_MAX], root[PATH_MAX];
  if (!KVQ_BUILD_ROOT[0] || !realpath("/proc/self/exe", exe) || !realpath(KVQ_BUILD_ROOT, root)) return 0;
  const size_t n = strlen(root);
  return strncmp(exe, root, n) == 0 && exe[n] == '/';
}

static const char *default_dir(void) {
  return running_from_build_tree() ? KVQ_SOURCE_GOLDEN_DIR : KVQ_GOLDEN_DIR;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvq golden --check [--backend NAME] [--dir DIR]\n"
          "       kvq golden --write [--dir DIR]\n"
          "\n"
          "--check   replays every golden file on a backend (cpu, vulkan, cuda; default cpu) and compares\n"
          "          codes (class 1: byte-identical, proven near-ties allowed), side data (class 2: within\n"
          "          1 ulp) and scores, probabilities and outputs (class 3: within derived bounds); prints\n"
          "          one summary line per class. Exit status 0: all agree; 1: something disagrees;\n"
          "          2: the check could not run (no files, backend unavailable).\n"
          "--write   regenerates the golden files with the CPU reference (for kvq developers).\n"
          "--dir     where the files are (default: %s)\n",
          default_dir());
}

int kvq_cmd_golden(int argc, char **argv) {
  int check = 0, write = 0;
  const char *dir = default_dir();
  kvq_backend_kind backend = KVQ_BACKEND_CPU;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check")) check = 1;
    else if (!strcmp(argv[i], "--write")) write = 1;
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
      if (kvq_parse_backend(argv[++i], &backend) != 0 || backend == KVQ_BACKEND_AUTO) {
        fprintf(stderr, "kvq golden: unknown backend '%s' (cpu, vulkan, cuda)\n", argv[i]);
        return 2;
      }
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "kvq golden: unexpected argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (check == write) {
    fprintf(stderr, "kvq golden: give exactly one of --check and --write\n");
    usage(stderr);
    return 2;
  }
  if (write) return kvq_golden_write(dir, stdout);
  golden_totals totals;
  return kvq_golden_check(dir, backend, stdout, &totals);
}
