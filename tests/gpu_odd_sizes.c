#include "gpu_odd_sizes.h"

#include <stdio.h>
#include <string.h>

#include "th_configs.h"

uint32_t gpu_odd_size_cases(golden_case cases[GPU_ODD_SIZE_MAX], char names[GPU_ODD_SIZE_MAX][GPU_ODD_SIZE_NAME]) {
  enum { P = 16 };
  static const struct {
    uint32_t kv_heads, ratio, len0, len1, window;
    kvq_dtype input;
  } shapes[] = {
      {1, 1, 1, 2, 0, KVQ_DTYPE_F32},          {2, 4, P + 1, 1, 0, KVQ_DTYPE_F16},
      {1, 7, 7 * P + 3, P + 1, P, KVQ_DTYPE_BF16}, {2, 8, 1, 5 * P - 1, 2 * P, KVQ_DTYPE_F16},
      {3, 1, 9 * P + 5, 2 * P, 0, KVQ_DTYPE_F32},  {1, 12, 3 * P + 7, 40, P, KVQ_DTYPE_F16},
  };
  uint32_t count = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int pair = 0; pair < 7; pair++) {
      golden_case *c = &cases[count];
      memset(c, 0, sizeof *c);
      kvq_method_config keys, values;
      if (pair == 0) keys = th_kivi(2, P), values = th_uniform(2, 32);
      else if (pair == 1) keys = th_exact(KVQ_DTYPE_F16), values = th_uniform(3, 16);
      else if (pair == 2) keys = th_kivi(4, 8), values = th_exact(KVQ_DTYPE_BF16);
      else if (pair == 3) keys = th_qjl(64, 4, 32), values = th_uniform(1, 16);
      else if (pair == 4) keys = th_polar(KVQ_ROTATION_DENSE), values = th_polar(KVQ_ROTATION_HADAMARD);
      else if (pair == 5) /* CQ values of c >= 4 take the value pass's run decode (two groups a run at c = 4),
                            of c < 4 its per-channel path: both, on alternate shapes */
        keys = th_cq(4, 8), values = s % 2 ? th_cq(4, 8) : th_cq(2, 5);
      else keys = th_polar(KVQ_ROTATION_HADAMARD), values = th_uniform(2, 16); /* PolarQuant keys on the fused path */
      snprintf(names[count], GPU_ODD_SIZE_NAME, "odd-%zu-%d", s, pair);
      c->name = names[count];
      c->input = shapes[s].input;
      c->page_size = P;
      c->window = shapes[s].window;
      c->layer_count = 1;
      c->layers[0] = th_layer(shapes[s].kv_heads * shapes[s].ratio, shapes[s].kv_heads, 64, keys, values);
      c->lengths[0] = shapes[s].len0;
      c->lengths[1] = shapes[s].len1;
      c->seed = 1000 + count;
      c->policy = kvq_policy_defaults(KVQ_POLICY_KEEP_ALL);
      count++;
    }
  return count;
}
