/*
 * `kvq eval`: how much each method compresses and how much attention it changes, on given Q/K/V
 * (.npy, [tokens, heads, head_dim]) or on the documented synthetic LLM-like data (core/synth.h).
 * The columns are defined in docs/EVAL.md; in short, after a flush of all tokens:
 *   bits/number of keys, values and both (page layouts: side data and padding included);
 *   inner-product error ||s^ - s|| / ||s|| over all attended (query, key) pairs;
 *   attention-score error: mean and max over queries of max_j |p^_j - p_j|;
 *   output error: mean over queries of ||o^ - o|| / ||o||;
 *   top-k overlap: |topk(p^) & topk(p)| / k with k = max(1, 5% of attended tokens).
 * The reference is exact attention in double on the input numbers. A "query" is one (position,
 * query head) pair; the last N positions (default 64) attend causally unless --mask none.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "core/halfconv.h"
#include "core/synth.h"
#include "npy.h"

typedef struct eval_options {
  const char *keys, *values, *queries; /* .npy paths, all or none */
  uint32_t tokens, query_heads, kv_heads, head_dim, last;
  uint32_t page_size, window;
  uint32_t calibration; /* tokens the codebooks are learned from (the first ones); 0: all but the queries */
  uint64_t seed;
  kvq_mask mask;
  kvq_backend_kind backend;
  const char *methods; /* comma-separated KEYS/VALUES specs, NULL for the default set */
  int json, quiet;
} eval_options;

typedef struct eval_data {
  float *k, *v, *q; /* [tokens][kv_heads][d], [tokens][kv_heads][d], [tokens][query_heads][d] */
  uint32_t tokens, query_heads, kv_heads, head_dim;
  kvq_dtype dtype; /* how the inputs were given: fp16 files stay fp16 in the cache */
  const char *source;
} eval_data;

typedef struct eval_row {
  char spec[96];
  double key_bits, value_bits, bits;
  uint64_t fixed_bytes, window_tokens;
  uint32_t calibration; /* tokens its codebooks were learned from; 0: none learned */
  double ip_error, score_error_mean, score_error_max, output_error, topk_overlap;
} eval_row;

static const char *default_methods =
    "exact-f16/exact-f16,"
    "qjl-m256-k8/uniform-b2,qjl-m256-k0/uniform-b2,"
    "qjl-m512-k8/uniform-b4,qjl-m512-k0/uniform-b4,"
    "qjl-m256-k8/uniform-b4,"
    "uniform-b4/uniform-b4,uniform-b2/uniform-b2,"
    "kivi-b2/uniform-b2,kivi-b4/uniform-b4,"
    "polar-b4222,polar-b2222,polar-b1222,polar-b4222-hadamard-online,"
    "cq-c4-b8,cq-c8-b8,cq-c2-b8/cq-c4-b8";

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvq eval [options]\n"
          "\n"
          "data (default: synthetic LLM-like data, docs/EVAL.md):\n"
          "  --keys K.npy --values V.npy --queries Q.npy   fp32 or fp16, [tokens, heads, head_dim];\n"
          "                      K and V share their heads (kv heads), Q has a multiple of them\n"
          "  --tokens N          synthetic tokens (default 2048)\n"
          "  --heads H           synthetic query heads (default 8)\n"
          "  --kv-heads H        synthetic kv heads (default 2)\n"
          "  --head-dim D        synthetic head_dim (default 128)\n"
          "  --seed S            synthetic data and matrices (default 1)\n"
          "evaluation:\n"
          "  --methods LIST      comma-separated KEYS/VALUES pairs, or one method for both (default: all of\n"
          "                      %s)\n"
          "                      KEYS:   exact-f16|exact-bf16|exact-f32, qjl-m<M>-k<K>[-o<M_o>], uniform-b<B>[-g<G>],\n"
          "                              kivi-b<B>[-t<Gt>], polar-b<bits of levels 1..L>[-hadamard][-online],\n"
          "                              cq-c<C>-b<B>[-i<iterations>]\n"
          "                      VALUES: the same but qjl\n"
          "  --last N            queries: the last N positions of every query head (default 64)\n"
          "  --mask causal|none  (default causal)\n"
          "  --page-size P       (default 32)\n"
          "  --window R          full-precision window: no flush, the newest R..R+P-1 tokens stay exact and are\n"
          "                      reported separately (default 0: flush, every token quantized)\n"
          "  --calibration N     learned codebooks (CQ, online PolarQuant) come from the first N tokens\n"
          "                      (default: every token before the queries, the prefill)\n"
          "  --backend NAME      cpu, vulkan, cuda or auto (default cpu)\n"
          "output:\n"
          "  --json              one JSON document on stdout instead of the table\n"
          "  --quiet             no progress lines on stderr\n",
          default_methods);
}

static int parse_u32(const char *s, uint32_t *out) {
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (!*s || *end || v > 0xffffffffUL) return -1;
  *out = (uint32_t)v;
  return 0;
}

/* Parses one side's spec ("qjl-m256-k8", "uniform-b4-g32", "exact-f16"). */
static int parse_method(const char *spec, size_t len, uint32_t d, int values, kvq_method_config *m) {
  char buf[64];
  if (len >= sizeof buf) return -1;
  memcpy(buf, spec, len);
  buf[len] = 0;
  if (!strncmp(buf, "exact-", 6)) {
    *m = kvq_method_defaults(KVQ_METHOD_EXACT, d);
    if (!strcmp(buf + 6, "f16")) m->exact.dtype = KVQ_DTYPE_F16;
    else if (!strcmp(buf + 6, "bf16")) m->exact.dtype = KVQ_DTYPE_BF16;
    else if (!strcmp(buf + 6, "f32")) m->exact.dtype = KVQ_DTYPE_F32;
    else return -1;
    return 0;
  }
  char *part = strtok(buf, "-");
  if (!part) return -1;
  if (!strcmp(part, "qjl") && !values) {
    *m = kvq_method_defaults(KVQ_METHOD_QJL, d);
    while ((part = strtok(NULL, "-"))) {
      uint32_t *field = part[0] == 'm' ? &m->qjl.sketch_dim : part[0] == 'k' ? &m->qjl.outlier_count
                        : part[0] == 'o'                    ? &m->qjl.outlier_sketch_dim
                                                            : NULL;
      if (!field || parse_u32(part + 1, field) != 0) return -1;
    }
    return 0;
  }
  if (!strcmp(part, "kivi")) {
    *m = kvq_method_defaults(KVQ_METHOD_KIVI, d);
    while ((part = strtok(NULL, "-"))) {
      uint32_t *field = part[0] == 'b' ? &m->kivi.bits : part[0] == 't' ? &m->kivi.group_tokens : NULL;
      if (!field || parse_u32(part + 1, field) != 0) return -1;
    }
    return 0;
  }
  if (!strcmp(part, "polar")) { /* polar-b4222-hadamard-online: one digit of bits per level */
    *m = kvq_method_defaults(KVQ_METHOD_POLAR, d);
    while ((part = strtok(NULL, "-"))) {
      if (!strcmp(part, "hadamard")) m->polar.rotation = KVQ_ROTATION_HADAMARD;
      else if (!strcmp(part, "dense")) m->polar.rotation = KVQ_ROTATION_DENSE;
      else if (!strcmp(part, "online")) m->polar.codebook = KVQ_CODEBOOK_ONLINE;
      else if (!strcmp(part, "offline")) m->polar.codebook = KVQ_CODEBOOK_OFFLINE;
      else if (part[0] == 'b' && part[1] && strlen(part + 1) <= KVQ_POLAR_MAX_LEVELS) {
        m->polar.levels = (uint32_t)strlen(part + 1);
        for (uint32_t l = 0; l < m->polar.levels; l++) {
          if (part[1 + l] < '1' || part[1 + l] > '8') return -1;
          m->polar.bits[l] = (uint32_t)(part[1 + l] - '0');
        }
      } else return -1;
    }
    return 0;
  }
  if (!strcmp(part, "cq")) {
    *m = kvq_method_defaults(KVQ_METHOD_CQ, d);
    while ((part = strtok(NULL, "-"))) {
      uint32_t *field = part[0] == 'c' ? &m->cq.channels : part[0] == 'b' ? &m->cq.bits
                        : part[0] == 'i'                   ? &m->cq.iterations
                                                           : NULL;
      if (!field || parse_u32(part + 1, field) != 0) return -1;
    }
    return 0;
  }
  if (!strcmp(part, "uniform")) {
    *m = kvq_method_defaults(KVQ_METHOD_UNIFORM, d);
    while ((part = strtok(NULL, "-"))) {
      uint32_t *field = part[0] == 'b' ? &m->uniform.bits : part[0] == 'g' ? &m->uniform.group_size : NULL;
      if (!field || parse_u32(part + 1, field) != 0) return -1;
    }
    return 0;
  }
  return -1;
}

static int load_npy(const char *path, kvq_npy *out, uint32_t *tokens, uint32_t *heads, uint32_t *dim) {
  char error[512];
  if (kvq_npy_read(path, out, error, sizeof error) != 0) {
    fprintf(stderr, "kvq eval: %s\n", error);
    return -1;
  }
  if (out->rank != 3 || out->shape[0] < 1 || out->shape[1] < 1 || out->shape[2] < 1 || out->shape[0] > 0x7fffffff ||
      out->shape[1] > 65536 || out->shape[2] > 65536) {
    fprintf(stderr, "kvq eval: %s: need a [tokens, heads, head_dim] array\n", path);
    kvq_npy_free(out);
    return -1;
  }
  *tokens = (uint32_t)out->shape[0];
  *heads = (uint32_t)out->shape[1];
  *dim = (uint32_t)out->shape[2];
  return 0;
}

static int load_data(const eval_options *o, eval_data *data) {
  memset(data, 0, sizeof *data);
  if (!o->keys && !o->values && !o->queries) {
    data->tokens = o->tokens, data->query_heads = o->query_heads, data->kv_heads = o->kv_heads, data->head_dim = o->head_dim;
    if (!data->kv_heads || !data->query_heads || data->query_heads % data->kv_heads || !data->tokens || !data->head_dim) {
      fprintf(stderr, "kvq eval: --heads must be a positive multiple of --kv-heads, and sizes positive\n");
      return -1;
    }
    const size_t kv = (size_t)data->tokens * data->kv_heads * data->head_dim;
    data->k = malloc(sizeof(float) * kv);
    data->v = malloc(sizeof(float) * kv);
    data->q = malloc(sizeof(float) * (size_t)data->tokens * data->query_heads * data->head_dim);
    kvq_synth_config sc = kvq_synth_defaults(data->tokens, data->kv_heads, data->query_heads, data->head_dim, o->seed);
    if (!data->k || !data->v || !data->q || kvq_synth_generate(&sc, data->k, data->v, data->q) != 0) {
      fprintf(stderr, "kvq eval: cannot generate synthetic data of that size\n");
      return -1;
    }
    data->dtype = KVQ_DTYPE_F32;
    data->source = "synthetic";
    return 0;
  }
  if (!o->keys || !o->values || !o->queries) {
    fprintf(stderr, "kvq eval: give all of --keys, --values and --queries, or none for synthetic data\n");
    return -1;
  }
  kvq_npy k, v, q;
  uint32_t nk, hk, dk, nv, hv, dv, nq, hq, dq;
  if (load_npy(o->keys, &k, &nk, &hk, &dk) != 0) return -1;
  if (load_npy(o->values, &v, &nv, &hv, &dv) != 0) {
    kvq_npy_free(&k);
    return -1;
  }
  if (load_npy(o->queries, &q, &nq, &hq, &dq) != 0) {
    kvq_npy_free(&k), kvq_npy_free(&v);
    return -1;
  }
  if (nk != nv || nk != nq || hk != hv || dk != dv || dk != dq || hq % hk) {
    fprintf(stderr,
            "kvq eval: shapes disagree: keys [%u, %u, %u], values [%u, %u, %u], queries [%u, %u, %u] "
            "(same tokens and head_dim; values share the keys' heads; query heads a multiple of them)\n",
            nk, hk, dk, nv, hv, dv, nq, hq, dq);
    kvq_npy_free(&k), kvq_npy_free(&v), kvq_npy_free(&q);
    return -1;
  }
  data->k = k.data, data->v = v.data, data->q = q.data;
  data->tokens = nk, data->kv_heads = hk, data->query_heads = hq, data->head_dim = dk;
  data->dtype = k.source_fp16 && v.source_fp16 ? KVQ_DTYPE_F16 : KVQ_DTYPE_F32;
  data->source = o->keys;
  return 0;
}

/* Exact reference for the evaluated queries: logits s and probabilities p [last][hq][n], outputs
 * o [last][hq][d], in double. */
static void exact_reference(const eval_data *x, uint32_t last, kvq_mask mask, double *s, double *p, double *o) {
  const uint32_t n = x->tokens, hq = x->query_heads, d = x->head_dim, group = hq / x->kv_heads;
  const double scale = 1.0 / sqrt((double)d);
  for (uint32_t i = 0; i < last; i++)
    for (uint32_t h = 0; h < hq; h++) {
      const float *q = x->q + ((size_t)(n - last + i) * hq + h) * d;
      const uint32_t visible = mask == KVQ_MASK_CAUSAL ? n - last + i + 1 : n;
      double *srow = s + ((size_t)i * hq + h) * n, *prow = p + ((size_t)i * hq + h) * n, *orow = o + ((size_t)i * hq + h) * d;
      double max = -INFINITY, z = 0;
      for (uint32_t t = 0; t < visible; t++) {
        const float *k = x->k + ((size_t)t * x->kv_heads + h / group) * d;
        double dot = 0;
        for (uint32_t c = 0; c < d; c++) dot += (double)q[c] * k[c];
        srow[t] = dot * scale;
        max = srow[t] > max ? srow[t] : max;
      }
      for (uint32_t t = 0; t < visible; t++) z += exp(srow[t] - max);
      for (uint32_t c = 0; c < d; c++) orow[c] = 0;
      for (uint32_t t = 0; t < n; t++) {
        prow[t] = t < visible ? exp(srow[t] - max) / z : 0;
        if (t >= visible) continue;
        const float *v = x->v + ((size_t)t * x->kv_heads + h / group) * d;
        for (uint32_t c = 0; c < d; c++) orow[c] += prow[t] * v[c];
      }
    }
}

/* |topk(a) & topk(b)| / k over the first n entries; ties broken towards the lower index. */
static double topk_overlap(const double *a, const float *b, uint32_t n, uint32_t k, uint32_t *ia, uint32_t *ib,
                           uint8_t *mark) {
  for (uint32_t j = 0; j < n; j++) ia[j] = ib[j] = j, mark[j] = 0;
  for (uint32_t r = 0; r < k; r++) { /* partial selection sort: k is 5% of n */
    uint32_t best_a = r, best_b = r;
    for (uint32_t j = r + 1; j < n; j++) {
      if (a[ia[j]] > a[ia[best_a]] || (a[ia[j]] == a[ia[best_a]] && ia[j] < ia[best_a])) best_a = j;
      if (b[ib[j]] > b[ib[best_b]] || (b[ib[j]] == b[ib[best_b]] && ib[j] < ib[best_b])) best_b = j;
    }
    uint32_t t = ia[r];
    ia[r] = ia[best_a], ia[best_a] = t;
    t = ib[r];
    ib[r] = ib[best_b], ib[best_b] = t;
    mark[ia[r]] |= 1;
  }
  uint32_t both = 0;
  for (uint32_t r = 0; r < k; r++) both += mark[ib[r]] & 1;
  return (double)both / k;
}

static int needs_codebooks(const kvq_method_config *m) {
  return m->method == KVQ_METHOD_CQ || (m->method == KVQ_METHOD_POLAR && m->polar.codebook == KVQ_CODEBOOK_ONLINE);
}

static int run_row(kvq_context *ctx, const eval_options *o, const eval_data *x, const char *spec, size_t spec_len,
                   const double *s_ref, const double *p_ref, const double *o_ref, eval_row *row) {
  memset(row, 0, sizeof *row);
  snprintf(row->spec, sizeof row->spec, "%.*s", (int)spec_len, spec);
  const char *slash = memchr(spec, '/', spec_len);
  kvq_layer_config layer = {.query_heads = x->query_heads, .kv_heads = x->kv_heads, .head_dim = x->head_dim};
  const size_t key_len = slash ? (size_t)(slash - spec) : spec_len; /* no slash: the same method for both */
  const char *value_spec = slash ? slash + 1 : spec;
  if (parse_method(spec, key_len, x->head_dim, 0, &layer.keys) != 0 ||
      parse_method(value_spec, spec_len - (size_t)(value_spec - spec), x->head_dim, 1, &layer.values) != 0) {
    fprintf(stderr, "kvq eval: cannot read method '%s' (see kvq eval --help)\n", row->spec);
    return -1;
  }
  const uint32_t n = x->tokens, hq = x->query_heads, hkv = x->kv_heads, d = x->head_dim, P = o->page_size;
  kvq_cache_config config = {.layer_count = 1, .layers = &layer, .input_dtype = x->dtype, .page_size = P,
                             .residual_window = o->window, .max_pages = (n + P - 1) / P + 1, .max_sequences = 1,
                             .seed = o->seed};
  char why[512];
  if (kvq_cache_config_check(&config, why, sizeof why) != KVQ_OK) {
    fprintf(stderr, "kvq eval: %s: %s\n", row->spec, why);
    return -1;
  }
  kvq_cache *cache = NULL;
  uint32_t seq;
  int rc = -1;
  const size_t kv = (size_t)n * hkv * d;
  void *kbuf = NULL, *vbuf = NULL;
  float *logits = malloc(sizeof(float) * o->last * hq * n), *probs = malloc(sizeof(float) * o->last * hq * n);
  float *out = malloc(sizeof(float) * o->last * hq * d);
  uint32_t *ia = malloc(sizeof(uint32_t) * n), *ib = malloc(sizeof(uint32_t) * n);
  uint8_t *mark = malloc(n);
  if (!logits || !probs || !out || !ia || !ib || !mark) {
    fprintf(stderr, "kvq eval: out of memory\n");
    goto done;
  }
  if (x->dtype == KVQ_DTYPE_F16) { /* fp16 inputs go in as fp16, exactly as given */
    uint16_t *kh = malloc(2 * kv), *vh = malloc(2 * kv);
    if (!kh || !vh) {
      free(kh), free(vh);
      goto done;
    }
    for (size_t i = 0; i < kv; i++) kh[i] = (uint16_t)kvq_f32_to_f16_bits(x->k[i]), vh[i] = (uint16_t)kvq_f32_to_f16_bits(x->v[i]);
    kbuf = kh, vbuf = vh;
  }
  int64_t kshape[3] = {n, hkv, d}, qshape[3] = {o->last, hq, d}, sshape[3] = {o->last, hq, n};
  kvq_tensor kt = kvq_tensor_host(kbuf ? kbuf : x->k, x->dtype, 3, kshape);
  kvq_tensor vt = kvq_tensor_host(vbuf ? vbuf : x->v, x->dtype, 3, kshape);
  kvq_tensor qt = kvq_tensor_host(x->q + (size_t)(n - o->last) * hq * d, KVQ_DTYPE_F32, 3, qshape);
  kvq_tensor lt = kvq_tensor_host(logits, KVQ_DTYPE_F32, 3, sshape);
  kvq_attention_request req = {0, o->mask, qt, kvq_tensor_host(out, KVQ_DTYPE_F32, 3, qshape)};
  kvq_status st;
  /* learned codebooks come from the first tokens (the prefill), as PolarQuant's online mode does */
  const uint32_t cal = o->calibration ? o->calibration : (n > o->last ? n - o->last : n);
  int64_t cshape[3] = {cal, hkv, d};
  kvq_tensor kc = kvq_tensor_host(kt.data, x->dtype, 3, cshape), vc = kvq_tensor_host(vt.data, x->dtype, 3, cshape);
  row->calibration = needs_codebooks(&layer.keys) || needs_codebooks(&layer.values) ? cal : 0;
  if ((st = kvq_cache_create(ctx, &config, &cache)) != KVQ_OK ||
      (row->calibration && (st = kvq_codebooks_learn(cache, 0, &kc, &vc, NULL)) != KVQ_OK) ||
      (st = kvq_sequence_add(cache, &seq)) != KVQ_OK ||
      (st = kvq_append(cache, seq, 0, &kt, &vt)) != KVQ_OK ||
      /* without a window every token is quantized; with one, the newest stay in full precision */
      (o->window == 0 && (st = kvq_flush(cache, seq)) != KVQ_OK) ||
      (st = kvq_scores(cache, seq, 0, &qt, o->mask, KVQ_SCORES_LOGITS, &lt)) != KVQ_OK) {
    fprintf(stderr, "kvq eval: %s: %s: %s\n", row->spec, kvq_status_string(st), kvq_context_last_error(ctx));
    goto done;
  }
  req.sequence = seq;
  if ((st = kvq_attention(cache, 0, &req, 1)) != KVQ_OK) {
    fprintf(stderr, "kvq eval: %s: %s: %s\n", row->spec, kvq_status_string(st), kvq_context_last_error(ctx));
    goto done;
  }
  kvq_layer_bits_per_number(&layer, P, &row->key_bits, &row->value_bits);
  row->bits = (row->key_bits + row->value_bits) / 2;
  kvq_memory_report mem;
  kvq_cache_memory(cache, &mem);
  row->fixed_bytes = mem.fixed_bytes;
  kvq_sequence_info info;
  kvq_sequence_info_get(cache, seq, 0, &info);
  row->window_tokens = info.tokens - info.quantized_tokens;
  /* probabilities from the returned logits: the same softmax the library applies, without a
   * second scoring pass */
  const uint64_t rows = (uint64_t)o->last * hq;
  for (uint64_t r = 0; r < rows; r++) {
    const uint32_t visible = o->mask == KVQ_MASK_CAUSAL ? n - o->last + (uint32_t)(r / hq) + 1 : n;
    const float *s = logits + (size_t)r * n;
    float *p = probs + (size_t)r * n;
    double max = -INFINITY, z = 0;
    for (uint32_t t = 0; t < visible; t++) max = s[t] > max ? s[t] : max;
    for (uint32_t t = 0; t < visible; t++) z += exp(s[t] - max);
    for (uint32_t t = 0; t < n; t++) p[t] = t < visible ? (float)(exp(s[t] - max) / z) : 0.0f;
  }
  double ip_num = 0, ip_den = 0, score_sum = 0, out_sum = 0, topk_sum = 0;
  for (uint64_t r = 0; r < rows; r++) {
    const uint32_t i = (uint32_t)(r / hq);
    const uint32_t visible = o->mask == KVQ_MASK_CAUSAL ? n - o->last + i + 1 : n;
    double worst = 0, on = 0, od = 0;
    for (uint32_t t = 0; t < visible; t++) {
      const size_t at = (size_t)r * n + t;
      ip_num += (logits[at] - s_ref[at]) * (logits[at] - s_ref[at]);
      ip_den += s_ref[at] * s_ref[at];
      const double diff = fabs(probs[at] - p_ref[at]);
      worst = diff > worst ? diff : worst;
    }
    score_sum += worst;
    row->score_error_max = worst > row->score_error_max ? worst : row->score_error_max;
    for (uint32_t c = 0; c < d; c++) {
      const size_t at = (size_t)r * d + c;
      on += (out[at] - o_ref[at]) * (out[at] - o_ref[at]);
      od += o_ref[at] * o_ref[at];
    }
    out_sum += od > 0 ? sqrt(on / od) : sqrt(on);
    const uint32_t k = visible / 20 > 1 ? visible / 20 : 1;
    topk_sum += topk_overlap(p_ref + (size_t)r * n, probs + (size_t)r * n, visible, k, ia, ib, mark);
  }
  row->ip_error = ip_den > 0 ? sqrt(ip_num / ip_den) : 0;
  row->score_error_mean = score_sum / rows;
  row->output_error = out_sum / rows;
  row->topk_overlap = topk_sum / rows;
  rc = 0;
done:
  kvq_cache_destroy(cache);
  free(kbuf), free(vbuf), free(logits), free(probs), free(out), free(ia), free(ib), free(mark);
  return rc;
}

static void print_table(const eval_options *o, const eval_data *x, const eval_row *rows, uint32_t count) {
  printf("kvq eval: %s data, %u tokens, %u query heads, %u kv heads, head_dim %u, page %u, window %u;\n"
         "queries: the last %u positions x %u heads (%s mask); reference: exact attention in double\n\n",
         x->source, x->tokens, x->query_heads, x->kv_heads, x->head_dim, o->page_size, o->window, o->last,
         x->query_heads, o->mask == KVQ_MASK_CAUSAL ? "causal" : "no");
  printf("%-30s %6s %6s %6s %9s %10s %10s %10s %10s %8s\n", "keys/values", "k-bits", "v-bits", "bits", "ip-err",
         "score-mean", "score-max", "output-err", "top5%", "fixed-kB");
  for (uint32_t i = 0; i < count; i++) {
    const eval_row *r = &rows[i];
    printf("%-30s %6.3f %6.3f %6.3f %9.2e %10.2e %10.2e %10.2e %10.4f %8.1f\n", r->spec, r->key_bits, r->value_bits,
           r->bits, r->ip_error, r->score_error_mean, r->score_error_max, r->output_error, r->topk_overlap,
           r->fixed_bytes / 1024.0);
  }
  printf("\nbits: per stored number, side data and padding included; fixed-kB: matrices and codebooks stored once\n"
         "per layer.\n");
  for (uint32_t i = 0; i < count; i++)
    if (rows[i].calibration) {
      printf("learned codebooks (CQ, online PolarQuant): k-means on the first %u tokens (--calibration).\n",
             rows[i].calibration);
      break;
    }
  if (o->window)
    printf("window: the newest %u tokens stay in full precision (not in the bits; they make the errors smaller).\n",
           count ? (unsigned)rows[0].window_tokens : 0);
  else
    printf("every token is quantized (a flush after the append).\n");
}

static void print_json(const eval_options *o, const eval_data *x, const eval_row *rows, uint32_t count) {
  printf("{\n  \"kvq_version\": \"%s\",\n  \"data\": {\"source\": \"%s\", \"tokens\": %u, \"query_heads\": %u, "
         "\"kv_heads\": %u, \"head_dim\": %u},\n",
         kvq_version(), x->source, x->tokens, x->query_heads, x->kv_heads, x->head_dim);
  printf("  \"settings\": {\"page_size\": %u, \"window\": %u, \"queries\": %u, \"mask\": \"%s\", \"seed\": %llu},\n",
         o->page_size, o->window, o->last, o->mask == KVQ_MASK_CAUSAL ? "causal" : "none", (unsigned long long)o->seed);
  printf("  \"methods\": [\n");
  for (uint32_t i = 0; i < count; i++) {
    const eval_row *r = &rows[i];
    printf("    {\"method\": \"%s\", \"key_bits\": %.6f, \"value_bits\": %.6f, \"bits\": %.6f, \"fixed_bytes\": %llu, "
           "\"window_tokens\": %llu, \"calibration_tokens\": %u, \"inner_product_error\": %.6e, \"score_error_mean\": %.6e, \"score_error_max\": %.6e, "
           "\"output_error\": %.6e, \"topk_overlap\": %.6f}%s\n",
           r->spec, r->key_bits, r->value_bits, r->bits, (unsigned long long)r->fixed_bytes,
           (unsigned long long)r->window_tokens, r->calibration, r->ip_error, r->score_error_mean, r->score_error_max, r->output_error,
           r->topk_overlap, i + 1 < count ? "," : "");
  }
  printf("  ]\n}\n");
}

int kvq_cmd_eval(int argc, char **argv) {
  eval_options o = {.tokens = 2048, .query_heads = 8, .kv_heads = 2, .head_dim = 128, .last = 64, .page_size = 32,
                    .seed = 1, .mask = KVQ_MASK_CAUSAL, .backend = KVQ_BACKEND_CPU};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
    uint32_t *number = !strcmp(a, "--tokens")      ? &o.tokens
                       : !strcmp(a, "--heads")     ? &o.query_heads
                       : !strcmp(a, "--kv-heads")  ? &o.kv_heads
                       : !strcmp(a, "--head-dim")  ? &o.head_dim
                       : !strcmp(a, "--last")      ? &o.last
                       : !strcmp(a, "--page-size") ? &o.page_size
                       : !strcmp(a, "--window")    ? &o.window
                       : !strcmp(a, "--calibration") ? &o.calibration
                                                   : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      o.json = 1;
    } else if (!strcmp(a, "--quiet")) {
      o.quiet = 1;
    } else if (!value) {
      fprintf(stderr, "kvq eval: %s needs a value (or is unknown)\n", a);
      return 2;
    } else if (number) {
      if (parse_u32(value, number) != 0) {
        fprintf(stderr, "kvq eval: %s %s: not a number\n", a, value);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--seed")) {
      char *end;
      o.seed = strtoull(value, &end, 10);
      if (*end) {
        fprintf(stderr, "kvq eval: --seed %s: not a number\n", value);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--keys")) o.keys = argv[++i];
    else if (!strcmp(a, "--values")) o.values = argv[++i];
    else if (!strcmp(a, "--queries")) o.queries = argv[++i];
    else if (!strcmp(a, "--methods")) o.methods = argv[++i];
    else if (!strcmp(a, "--mask")) {
      if (!strcmp(value, "causal")) o.mask = KVQ_MASK_CAUSAL;
      else if (!strcmp(value, "none")) o.mask = KVQ_MASK_NONE;
      else {
        fprintf(stderr, "kvq eval: --mask %s: causal or none\n", value);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--backend")) {
      if (kvq_parse_backend(value, &o.backend) != 0) {
        fprintf(stderr, "kvq eval: unknown backend '%s'\n", value);
        return 2;
      }
      i++;
    } else {
      fprintf(stderr, "kvq eval: unknown option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  eval_data x;
  if (load_data(&o, &x) != 0) {
    free(x.k), free(x.v), free(x.q);
    return 2;
  }
  if (o.last == 0) {
    fprintf(stderr, "kvq eval: --last must be at least 1\n");
    free(x.k), free(x.v), free(x.q);
    return 2;
  }
  if (o.last > x.tokens) o.last = x.tokens; /* every position is a query */
  if (o.calibration > x.tokens) {
    fprintf(stderr, "kvq eval: --calibration %u: the data has %u tokens\n", o.calibration, x.tokens);
    free(x.k), free(x.v), free(x.q);
    return 2;
  }
  kvq_context_options copt = kvq_context_options_default();
  copt.backend = o.backend;
  kvq_context *ctx = NULL;
  if (kvq_context_create(&copt, &ctx) != KVQ_OK) {
    fprintf(stderr, "kvq eval: the requested backend is unavailable (see kvq info)\n");
    free(x.k), free(x.v), free(x.q);
    return 2;
  }
  const size_t ns = (size_t)o.last * x.query_heads * x.tokens, no = (size_t)o.last * x.query_heads * x.head_dim;
  double *s_ref = malloc(sizeof(double) * ns), *p_ref = malloc(sizeof(double) * ns), *o_ref = malloc(sizeof(double) * no);
  const char *list = o.methods ? o.methods : default_methods;
  uint32_t count = 1;
  for (const char *c = list; *c; c++) count += *c == ',';
  eval_row *rows = calloc(count, sizeof *rows);
  int rc = 0;
  if (!s_ref || !p_ref || !o_ref || !rows) {
    fprintf(stderr, "kvq eval: out of memory for %zu scores\n", ns);
    rc = 1;
  } else {
    exact_reference(&x, o.last, o.mask, s_ref, p_ref, o_ref);
    const char *spec = list;
    for (uint32_t i = 0; i < count && rc == 0; i++) {
      const char *end = strchr(spec, ',');
      const size_t len = end ? (size_t)(end - spec) : strlen(spec);
      if (!o.quiet) fprintf(stderr, "[%u/%u] %.*s\n", i + 1, count, (int)len, spec);
      if (run_row(ctx, &o, &x, spec, len, s_ref, p_ref, o_ref, &rows[i]) != 0) rc = 2;
      spec = end ? end + 1 : spec + len;
    }
    if (rc == 0) {
      if (o.json) print_json(&o, &x, rows, count);
      else print_table(&o, &x, rows, count);
    }
  }
  free(rows), free(s_ref), free(p_ref), free(o_ref);
  free(x.k), free(x.v), free(x.q);
  kvq_context_destroy(ctx);
  return rc;
}
