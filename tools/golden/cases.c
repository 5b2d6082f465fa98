/*
 * The golden matrix: dtypes, head_dim 64 and 128, m, outliers on and off, value bits, GQA ratios
 * 1, 4 and 8, partial pages, window on and off, and a two-layer cache with more bits early.
 */
#include "cases.h"

#include <stdlib.h>

#include "golden.h"

static kvq_method_config qjl(uint32_t m, uint32_t k, uint32_t mo) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_QJL, 128);
  c.qjl = (kvq_qjl_config){m, k, mo};
  return c;
}
static kvq_method_config uni(uint32_t bits, uint32_t group) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_UNIFORM, 128);
  c.uniform = (kvq_uniform_config){bits, group};
  return c;
}
static kvq_method_config exact(kvq_dtype dtype) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_EXACT, 128);
  c.exact.dtype = dtype;
  return c;
}
#define LAYER(hq, hkv, d, k, v) {.query_heads = hq, .kv_heads = hkv, .head_dim = d, .keys = k, .values = v}

static kvq_method_config kivi(uint32_t bits, uint32_t group_tokens) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_KIVI, 128);
  c.kivi = (kvq_kivi_config){bits, group_tokens};
  return c;
}

/* PolarQuant with levels 1..L of the given bits (level 1 first). */
static kvq_method_config polar(kvq_rotation rotation, kvq_codebook_source codebook, uint32_t levels, uint32_t b1,
                               uint32_t b_rest) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_POLAR, 128);
  c.polar.levels = levels;
  for (uint32_t l = 0; l < levels; l++) c.polar.bits[l] = l ? b_rest : b1;
  c.polar.rotation = rotation;
  c.polar.codebook = codebook;
  return c;
}
static kvq_method_config cq(uint32_t channels, uint32_t bits) {
  kvq_method_config c = kvq_method_defaults(KVQ_METHOD_CQ, 128);
  c.cq.channels = channels;
  c.cq.bits = bits;
  return c;
}
#define DENSE KVQ_ROTATION_DENSE
#define HADAMARD KVQ_ROTATION_HADAMARD
#define OFFLINE KVQ_CODEBOOK_OFFLINE
#define ONLINE KVQ_CODEBOOK_ONLINE

/* A case without a token policy: name, input dtype, P, window, layers, sequence lengths, seed, layers. */
#define CASE(nm, dt, p, r, lc, len0, len1, sd, ...)                                                              \
  {.name = nm, .input = dt, .page_size = p, .window = r, .layer_count = lc, .layers = {__VA_ARGS__},              \
   .lengths = {len0, len1}, .seed = sd}

/* A token-policy case: as CASE, then the policy and the prefill. */
#define POLICY_CASE(nm, dt, p, r, lc, len0, len1, sd, pol, pre, ...)                                              \
  {.name = nm, .input = dt, .page_size = p, .window = r, .layer_count = lc, .layers = {__VA_ARGS__},              \
   .lengths = {len0, len1}, .seed = sd, .policy = pol, .prefill = pre}

static kvq_policy_config policy(kvq_policy_kind kind, uint32_t sinks, uint32_t recent, uint32_t heavy, float lambda) {
  kvq_policy_config p = kvq_policy_defaults(kind);
  p.sinks = sinks, p.recent = recent, p.heavy = heavy, p.heavy_fraction = 0.0f, p.lambda = lambda;
  return p;
}

static golden_case cases[24];
static uint32_t case_count;

static void build_cases(void) {
  if (case_count) return;
  const golden_case all[] = {
      CASE("qjl-d128-m256-k8-u2-f16-gqa4", KVQ_DTYPE_F16, 32, 0, 1, 70, 45, 1,
           LAYER(8, 2, 128, qjl(256, 8, 256), uni(2, 32))),
      CASE("qjl-d128-m512-k8-u4-f32-gqa1-window", KVQ_DTYPE_F32, 16, 32, 1, 75, 50, 2,
           LAYER(2, 2, 128, qjl(512, 8, 256), uni(4, 32))),
      CASE("qjl-d64-m256-k0-u2-bf16-gqa8", KVQ_DTYPE_BF16, 16, 0, 1, 53, 40, 3,
           LAYER(8, 1, 64, qjl(256, 0, 32), uni(2, 16))),
      CASE("qjl-d64-m128-k4-u1-f16-gqa4-window", KVQ_DTYPE_F16, 16, 16, 1, 61, 33, 4,
           LAYER(4, 1, 64, qjl(128, 4, 64), uni(1, 32))),
      CASE("qjl-d128-m256-k0-u3-f32-gqa1", KVQ_DTYPE_F32, 16, 0, 1, 40, 27, 5,
           LAYER(1, 1, 128, qjl(256, 0, 32), uni(3, 32))),
      CASE("qjl-d64-m64-k8-u8-f16-gqa8", KVQ_DTYPE_F16, 32, 0, 1, 66, 35, 6,
           LAYER(8, 1, 64, qjl(64, 8, 64), uni(8, 64))),
      CASE("exact-f16-f16-d128-gqa4", KVQ_DTYPE_F16, 16, 0, 1, 37, 20, 7,
           LAYER(4, 1, 128, exact(KVQ_DTYPE_F16), exact(KVQ_DTYPE_F16))),
      CASE("exact-bf16-f32-d64-gqa1-window", KVQ_DTYPE_BF16, 16, 32, 1, 60, 17, 8,
           LAYER(2, 2, 64, exact(KVQ_DTYPE_BF16), exact(KVQ_DTYPE_F32))),
      CASE("uniform4-keys-u4-d128-f32-gqa8", KVQ_DTYPE_F32, 16, 0, 1, 35, 22, 9,
           LAYER(8, 1, 128, uni(4, 32), uni(4, 32))),
      CASE("two-layers-qjl-m512-then-m256-f16-gqa4", KVQ_DTYPE_F16, 16, 16, 2, 50, 29, 10,
           LAYER(4, 1, 128, qjl(512, 8, 256), uni(4, 32)), LAYER(4, 1, 128, qjl(256, 8, 256), uni(2, 32))),
      CASE("kivi2-keys-u2-d64-f16-gqa4-window", KVQ_DTYPE_F16, 32, 32, 1, 90, 45, 11,
           LAYER(4, 1, 64, kivi(2, 0), uni(2, 32))),
      CASE("kivi4-g8-keys-kivi3-values-d128-bf16-gqa1", KVQ_DTYPE_BF16, 16, 0, 1, 41, 23, 12,
           LAYER(2, 2, 128, kivi(4, 8), kivi(3, 16))),
      CASE("polar-4222-dense-d128-f16-gqa4-window", KVQ_DTYPE_F16, 16, 16, 1, 45, 30, 13,
           LAYER(4, 1, 128, polar(DENSE, OFFLINE, 4, 4, 2), polar(DENSE, OFFLINE, 4, 4, 2))),
      CASE("polar-2222-hadamard-values-qjl-keys-d64-bf16-gqa8", KVQ_DTYPE_BF16, 16, 0, 1, 40, 27, 14,
           LAYER(8, 1, 64, qjl(128, 4, 64), polar(HADAMARD, OFFLINE, 4, 2, 2))),
      CASE("polar-online-322-hadamard-keys-cq-8c8b-values-d64-f32-gqa2", KVQ_DTYPE_F32, 16, 0, 1, 90, 35, 15,
           LAYER(4, 2, 64, polar(HADAMARD, ONLINE, 3, 3, 2), cq(8, 8))),
      CASE("cq-4c6b-keys-1c3b-values-d128-f16-gqa4-window", KVQ_DTYPE_F16, 16, 16, 1, 80, 40, 16,
           LAYER(4, 1, 128, cq(4, 6), cq(1, 3))),
      /* token policies: two sequences decode token by token with attention, sharing the pool */
      POLICY_CASE("h2o-u2-keys-u2-values-d64-f16-gqa4-stream", KVQ_DTYPE_F16, 16, 16, 1, 150, 110, 17,
                  policy(KVQ_POLICY_H2O, 2, 32, 8, 0.5f), 40, LAYER(4, 1, 64, uni(2, 32), uni(2, 32))),
      POLICY_CASE("qhitter-kivi2-keys-polar-values-two-layers-f16-stream", KVQ_DTYPE_F16, 16, 0, 2, 110, 80, 18,
                  policy(KVQ_POLICY_QHITTER, 4, 16, 10, 0.5f), 40,
                  LAYER(2, 2, 64, kivi(2, 0), polar(HADAMARD, OFFLINE, 4, 2, 2)),
                  LAYER(2, 2, 64, qjl(128, 4, 64), uni(3, 32))),
      POLICY_CASE("streaming-qjl-keys-cq-values-d64-bf16-stream", KVQ_DTYPE_BF16, 16, 16, 1, 120, 90, 19,
                  policy(KVQ_POLICY_STREAMING, 4, 48, 0, 0.5f), 32, LAYER(4, 1, 64, qjl(128, 0, 32), cq(4, 6))),
  };
  case_count = sizeof all / sizeof all[0];
  for (uint32_t i = 0; i < case_count; i++) cases[i] = all[i];
}

const golden_case *golden_case_get(uint32_t index) {
  build_cases();
  return index < case_count ? &cases[index] : NULL;
}

uint32_t golden_case_total(void) {
  build_cases();
  return case_count;
}

uint32_t kvq_golden_case_count(void) { return golden_case_total(); }
const char *kvq_golden_case_name(uint32_t index) {
  const golden_case *c = golden_case_get(index);
  return c ? c->name : NULL;
}

/* Round robin over the sequences, each step appending the next chunk (sizes cycling through
 * 1, 5, 16, 3, 40, 2, 7: single tokens, partial and whole pages) to every layer; sequence 1 is
 * flushed once it has 20 tokens and again at its end, so it ends with a flushed partial page. */
static uint32_t *decode_schedule(const golden_case *c, uint32_t *steps) {
  const uint32_t L = c->layer_count, tokens = c->lengths[0] + c->lengths[1];
  uint32_t *s = malloc(sizeof(uint32_t) * 4 * (2 * L * (tokens + 2) + 1)), n = 0;
  if (!s) return NULL;
#define STEP(q, l, first, count)                                                                                 \
  (s[4 * n] = (q), s[4 * n + 1] = (l), s[4 * n + 2] = (first), s[4 * n + 3] = (count), n++)
  for (uint32_t q = 0; q < GOLDEN_SEQUENCES; q++)
    for (uint32_t l = 0; l < L; l++) {
      STEP(q, l, 0, c->prefill);
      STEP(q, l, 0, GOLDEN_ATTEND | c->prefill);
    }
  for (uint32_t t = c->prefill; t < c->lengths[0] || t < c->lengths[1]; t++)
    for (uint32_t q = 0; q < GOLDEN_SEQUENCES; q++)
      for (uint32_t l = 0; t < c->lengths[q] && l < L; l++) {
        STEP(q, l, t, 1);
        STEP(q, l, t, GOLDEN_ATTEND | 1);
      }
#undef STEP
  *steps = n;
  return s;
}

uint32_t *golden_schedule(const golden_case *c, uint32_t *steps) {
  if (c->prefill) return decode_schedule(c, steps);
  static const uint32_t chunks[] = {1, 5, 16, 3, 40, 2, 7};
  uint32_t capacity = 4 * (c->lengths[0] + c->lengths[1] + 8) * c->layer_count;
  uint32_t *s = malloc(sizeof(uint32_t) * 4 * capacity), n = 0, done[GOLDEN_SEQUENCES] = {0}, k = 0;
  if (!s) return NULL;
  int flushed_early = 0;
  while (done[0] < c->lengths[0] || done[1] < c->lengths[1]) {
    for (uint32_t q = 0; q < GOLDEN_SEQUENCES; q++) {
      if (done[q] >= c->lengths[q]) continue;
      uint32_t count = chunks[k++ % 7];
      if (count > c->lengths[q] - done[q]) count = c->lengths[q] - done[q];
      for (uint32_t l = 0; l < c->layer_count; l++) {
        uint32_t *step = s + 4 * n++;
        step[0] = q, step[1] = l, step[2] = done[q], step[3] = count;
      }
      done[q] += count;
      if (q == 1 && ((!flushed_early && done[q] >= 20) || done[q] == c->lengths[q])) {
        flushed_early = 1;
        uint32_t *step = s + 4 * n++;
        step[0] = q, step[1] = 0, step[2] = 0, step[3] = 0;
      }
    }
  }
  *steps = n;
  return s;
}
