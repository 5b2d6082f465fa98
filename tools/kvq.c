/* kvq: the command-line tool. Subcommands live in their own files (info.c, eval.c, dump.c, demo.c, golden_cmd.c). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kvq/kvq.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvq <command> [options]\n"
          "\n"
          "commands:\n"
          "  info                 version, backends (and why one is unavailable), devices\n"
          "  eval [options]       compression and accuracy of each method on given or synthetic Q/K/V\n"
          "  dump [options]       the real Q/K/V of a layer of the sentence encoder on real text, as .npy\n"
          "  demo [options]       the sentence encoder with its attention through every kvq method\n"
          "  golden --check|--write [--backend NAME] [--dir DIR]\n"
          "                       check a backend against the golden files, or regenerate them\n"
          "  help                 this text; `kvq <command> --help` for a command's options\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "info")) return kvq_cmd_info(argc - 1, argv + 1);
  if (!strcmp(cmd, "eval")) return kvq_cmd_eval(argc - 1, argv + 1);
  if (!strcmp(cmd, "dump")) return kvq_cmd_dump(argc - 1, argv + 1);
  if (!strcmp(cmd, "demo")) return kvq_cmd_demo(argc - 1, argv + 1);
  if (!strcmp(cmd, "golden")) return kvq_cmd_golden(argc - 1, argv + 1);
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("kvq %s\n", kvq_version());
    return 0;
  }
  fprintf(stderr, "kvq: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
