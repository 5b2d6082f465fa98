/* The reference attention: plain C, fp32 inputs, double sums, every query over every token. */
#include <math.h>
#include <stdlib.h>

#include "use.h"

kvq_status kvq_use_attention_exact(void *user, uint32_t layer, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                                   const float *q, const float *k, const float *v, float *out) {
  (void)user, (void)layer;
  if (!q || !k || !v || !out || !tokens || !heads || !head_dim) return KVQ_ERROR_INVALID_ARGUMENT;
  double *p = malloc(tokens * sizeof *p);
  if (!p) return KVQ_ERROR_OUT_OF_MEMORY;
  const size_t row = (size_t)heads * head_dim;
  const double scale = 1.0 / sqrt((double)head_dim);
  for (uint32_t h = 0; h < heads; h++) {
    for (uint32_t i = 0; i < tokens; i++) {
      const float *qi = q + i * row + (size_t)h * head_dim;
      double largest = -INFINITY;
      for (uint32_t j = 0; j < tokens; j++) {
        const float *kj = k + j * row + (size_t)h * head_dim;
        double s = 0;
        for (uint32_t c = 0; c < head_dim; c++) s += (double)qi[c] * kj[c];
        p[j] = s * scale;
        if (p[j] > largest) largest = p[j];
      }
      double sum = 0;
      for (uint32_t j = 0; j < tokens; j++) sum += p[j] = exp(p[j] - largest);
      for (uint32_t c = 0; c < head_dim; c++) {
        double o = 0;
        for (uint32_t j = 0; j < tokens; j++) o += p[j] * v[j * row + (size_t)h * head_dim + c];
        out[i * row + (size_t)h * head_dim + c] = (float)(o / sum);
      }
    }
  }
  free(p);
  return KVQ_OK;
}
