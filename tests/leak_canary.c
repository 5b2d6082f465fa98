/*
 * The leak canary of tests/leak_check.sh: a process that loads every backend kvq has (Vulkan's
 * driver included, which is where the suppressed third-party leak comes from) and, when asked,
 * leaks one cache of kvq's own. Run under LeakSanitizer with the suite's suppressions, "clean" must
 * exit 0 and "leak" must be reported: the suppressions hide the driver's block, never kvq's.
 * usage: leak_canary clean|leak
 */
#include <stdio.h>
#include <string.h>

#include "kvq/kvq.h"

int main(int argc, char **argv) {
  if (argc != 2 || (strcmp(argv[1], "clean") && strcmp(argv[1], "leak"))) {
    fprintf(stderr, "usage: leak_canary clean|leak\n");
    return 2;
  }
  /* Listing the backends starts each one (the Vulkan loader enumerates its devices), whichever the
   * context below ends up on. */
  kvq_backend_info infos[4];
  size_t count = 0;
  if (kvq_backends_list(infos, 4, &count) != KVQ_OK) return 3;
  kvq_context *ctx;
  if (kvq_context_create(NULL, &ctx) != KVQ_OK) return 3;
  kvq_layer_config layer = {.query_heads = 2, .kv_heads = 1, .head_dim = 64,
                            .keys = kvq_method_defaults(KVQ_METHOD_UNIFORM, 64),
                            .values = kvq_method_defaults(KVQ_METHOD_UNIFORM, 64)};
  kvq_cache_config config = {.layer_count = 1, .layers = &layer, .input_dtype = KVQ_DTYPE_F32, .page_size = 32,
                             .max_pages = 4, .max_sequences = 1, .seed = 1};
  kvq_cache *cache;
  if (kvq_cache_create(ctx, &config, &cache) != KVQ_OK) {
    fprintf(stderr, "%s\n", kvq_context_last_error(ctx));
    return 3;
  }
  for (size_t i = 0; i < count; i++) printf("%s: %s\n", infos[i].name, infos[i].availability == KVQ_AVAILABLE ? "available" : infos[i].reason);
  kvq_context_destroy(ctx);
  if (!strcmp(argv[1], "clean")) kvq_cache_destroy(cache); /* "leak": the cache (and with it the context) stays */
  return 0;
}
