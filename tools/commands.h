/* The tool's subcommands: each returns the process exit status (0 ok, 1 failure, 2 usage or setup). */
#ifndef KVQ_TOOLS_COMMANDS_H
#define KVQ_TOOLS_COMMANDS_H

#include "kvq/kvq.h"

int kvq_cmd_info(int argc, char **argv);
int kvq_cmd_eval(int argc, char **argv);
int kvq_cmd_golden(int argc, char **argv);
int kvq_cmd_dump(int argc, char **argv);
int kvq_cmd_demo(int argc, char **argv);

/* "cpu", "vulkan", "cuda", "auto" -> kind; returns 0, or -1 for an unknown name. */
int kvq_parse_backend(const char *name, kvq_backend_kind *kind);

#endif
