/* `kvq info`: what this kvq is and what it can run on. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

int kvq_parse_backend(const char *name, kvq_backend_kind *kind) {
  static const struct {
    const char *name;
    kvq_backend_kind kind;
  } names[] = {{"auto", KVQ_BACKEND_AUTO}, {"cpu", KVQ_BACKEND_CPU}, {"vulkan", KVQ_BACKEND_VULKAN}, {"cuda", KVQ_BACKEND_CUDA}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i].name)) {
      *kind = names[i].kind;
      return 0;
    }
  return -1;
}

int kvq_cmd_info(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    printf("usage: kvq info\n\nPrints the version, every backend with its availability (and the reason when it is\n"
           "unavailable) and the device each would use.\n");
    return 0;
  }
  if (argc > 1) {
    fprintf(stderr, "kvq info: unexpected argument '%s'\n", argv[1]);
    return 2;
  }
  printf("kvq %s (library %s)\n", KVQ_VERSION_STRING, kvq_version());
  kvq_backend_info infos[8];
  size_t count = 0;
  if (kvq_backends_list(infos, 8, &count) != KVQ_OK) {
    fprintf(stderr, "kvq info: cannot list backends\n");
    return 1;
  }
  printf("backends:\n");
  for (size_t i = 0; i < count && i < 8; i++) {
    if (infos[i].availability == KVQ_AVAILABLE) printf("  %-7s available: %s\n", infos[i].name, infos[i].device);
    else printf("  %-7s unavailable: %s\n", infos[i].name, infos[i].reason);
  }
  kvq_context *ctx = NULL;
  if (kvq_context_create(NULL, &ctx) == KVQ_OK) {
    const kvq_backend_kind kind = kvq_context_backend(ctx);
    printf("default (auto): %s\n", kind == KVQ_BACKEND_CPU ? "cpu" : kind == KVQ_BACKEND_VULKAN ? "vulkan" : "cuda");
    kvq_context_destroy(ctx);
  }
  return 0;
}
