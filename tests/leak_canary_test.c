/*
 * The Criterion half of tests/leak_check.sh: one test that leaks a cache of kvq's and one that
 * frees everything. Not part of the suite (the first must fail): leak_check.sh runs it and expects
 * "not ok" for the first and "ok" for the second, proving that tests/helpers.h's per-test leak
 * check catches what LeakSanitizer's exit-time check cannot see in Criterion's workers.
 */
#include <criterion/criterion.h>

#include "helpers.h"

static kvq_cache *make_cache(kvq_context **ctx) {
  *ctx = th_cpu_context();
  kvq_layer_config layer = th_layer(2, 1, 64, th_uniform(2, 32), th_uniform(2, 32));
  kvq_cache_config config = th_config(&layer, 1, KVQ_DTYPE_F32, 32, 0, 4, 1, 1);
  kvq_cache *cache;
  KVQ_CHECK(*ctx, kvq_cache_create(*ctx, &config, &cache));
  return cache;
}

Test(leak_canary, leaks_a_cache) {
  kvq_context *ctx;
  make_cache(&ctx); /* never destroyed: the cache, and the context it holds, leak */
  kvq_context_destroy(ctx);
}

Test(leak_canary, frees_everything) {
  kvq_context *ctx;
  kvq_cache *cache = make_cache(&ctx);
  kvq_context_destroy(ctx);
  kvq_cache_destroy(cache);
}
