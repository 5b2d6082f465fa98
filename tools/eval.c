/*
 * `kvq eval`: how much each method compresses and how much attention it changes, on given Q/K/V
 * (.npy, [tokens, heads, head_dim]) or on the documented synthetic LLM-like data (kvq_synth_generate).
 * The columns are defined in docs/EVAL.md; in short:
 *   bits/number of keys, values and both (page layouts: side data and padding included);
 *   inner-product error ||s^ - s|| / ||s|| over all attended (query, key) pairs;
 *   attention-score error: mean and max over queries of max_j |p^_j - p_j|;
 *   output error: mean over queries of ||o^ - o|| / ||o||;
 *   top-k overlap: |topk(p^) & topk(p)| / k with k = max(1, 5% of attended tokens);
 *   token-policy rows (SPEC@POLICY, eval_policy.c): tokens kept, and the overlap of the kept set
 *   with H2O's on the exact keys.
 * The reference is exact attention in double on the input numbers. A "query" is one (position,
 * query head) pair; the last N positions (default 64) attend causally unless --mask none. This
 * file: options, data, the reference, the output.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "eval.h"
#include <kvq/kvq.h>
#include "npy.h"
#include "plot.h"

static const char *default_methods =
    "exact-f16/exact-f16,"
    "qjl-m256-k8/uniform-b2,qjl-m256-k0/uniform-b2,"
    "qjl-m512-k8/uniform-b4,qjl-m512-k0/uniform-b4,"
    "qjl-m256-k8/uniform-b4,"
    "uniform-b4/uniform-b4,uniform-b2/uniform-b2,"
    "kivi-b2/uniform-b2,kivi-b4/uniform-b4,"
    "polar-b4222,polar-b2222,polar-b1222,polar-b4222-hadamard-online,"
    "cq-c4-b8,cq-c8-b8,cq-c2-b8/cq-c4-b8,"
    "kivi-b2/uniform-b2@streaming,kivi-b2/uniform-b2@h2o,kivi-b2/uniform-b2@qhitter";

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
          "                      SPEC@POLICY: decode the last N positions token by token under a token policy:\n"
          "                      streaming, h2o, qhitter (lambda from --lambda) or qhitter-l<lambda>\n"
          "  --last N            queries: the last N positions of every query head (default 64)\n"
          "  --mask causal|none  (default causal)\n"
          "  --page-size P       (default 32)\n"
          "  --window R          full-precision window: no flush, the newest R..R+P-1 tokens stay exact and are\n"
          "                      reported separately (default 0: flush, every token quantized)\n"
          "  --calibration N     learned codebooks (CQ, online PolarQuant) come from N tokens (default: as many\n"
          "                      as precede the queries): with synthetic data, other tokens of the same model;\n"
          "                      with files, the first N tokens of the files\n"
          "  --in-sample         (synthetic data) calibrate on the first N evaluated tokens instead\n"
          "                      (default: every token before the queries, the prefill)\n"
          "  --budget N          token policies: tokens kept (default: a fifth of the tokens)\n"
          "  --sinks N           token policies: first tokens always kept (default 4)\n"
          "  --recent N          H2O, Q-Hitter: newest tokens always kept (default 64, at least window + page);\n"
          "                      the rest of the budget are heavy hitters; StreamingLLM spends it all on recent\n"
          "  --lambda L          Q-Hitter's balance (default 0.5)\n"
          "  --queries-scaled    the queries already carry the model's 1/sqrt(head_dim) (kvq applies it\n"
          "                      itself): multiply them by sqrt(head_dim) first. kvq eval warns when the exact\n"
          "                      attention is so flat that this looks likely\n"
          "  --backend NAME      cpu, vulkan, cuda or auto (default cpu)\n"
          "output:\n"
          "  --json              one JSON document on stdout instead of the table\n"
          "  --quiet             no progress lines on stderr\n"
          "  --plot FILE.png     also plot output-err against bits per number (one labelled point per row)\n"
          "                      with gnuplot; FILE.dat and FILE.gp are written next to it\n",
          default_methods);
}

static int parse_u32(const char *s, uint32_t *out) {
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (!*s || *end || v > 0xffffffffUL) return -1;
  *out = (uint32_t)v;
  return 0;
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

/* Exact reference for the evaluated queries (eval.h), in double. */
static void exact_reference(const eval_data *x, uint32_t last, kvq_mask mask, eval_reference *ref) {
  const uint32_t n = x->tokens, hq = x->query_heads, d = x->head_dim, group = hq / x->kv_heads;
  const double scale = 1.0 / sqrt((double)d);
  for (uint32_t i = 0; i < last; i++)
    for (uint32_t h = 0; h < hq; h++) {
      const float *q = x->q + ((size_t)(n - last + i) * hq + h) * d;
      const uint32_t visible = mask == KVQ_MASK_CAUSAL ? n - last + i + 1 : n;
      double *srow = ref->s + ((size_t)i * hq + h) * n, *prow = ref->p + ((size_t)i * hq + h) * n;
      double *orow = ref->o + ((size_t)i * hq + h) * d;
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

/* The keys and values in the cache's input dtype: fp16 inputs go in as fp16, exactly as given. */
static int input_buffers(eval_data *x) {
  const size_t kv = (size_t)x->tokens * x->kv_heads * x->head_dim;
  if (x->dtype != KVQ_DTYPE_F16) {
    x->k_input = x->k, x->v_input = x->v;
    return 0;
  }
  uint16_t *kh = malloc(2 * kv), *vh = malloc(2 * kv);
  if (!kh || !vh) {
    free(kh), free(vh);
    return -1;
  }
  kvq_convert(x->k, KVQ_DTYPE_F32, kh, KVQ_DTYPE_F16, kv);
  kvq_convert(x->v, KVQ_DTYPE_F32, vh, KVQ_DTYPE_F16, kv);
  x->k_input = kh, x->v_input = vh;
  return 0;
}

/* --held-out: calibration tokens that are not evaluated but come from the same "model": the
 * generator draws each head's channel scales and means first and then independent tokens, so the
 * tokens after the evaluated ones of a longer draw with the same seed are new text of the same
 * model, as calibration data would be. */
static int held_out_data(const eval_options *o, eval_data *x) {
  if (o->in_sample || o->keys) return 0; /* files: their first tokens */
  const uint32_t n = x->tokens, total = 2 * n;
  const size_t kv = (size_t)n * x->kv_heads * x->head_dim;
  float *k = malloc(sizeof(float) * kv * 2), *v = malloc(sizeof(float) * kv * 2);
  x->k_held_out = malloc(sizeof(float) * kv);
  x->v_held_out = malloc(sizeof(float) * kv);
  kvq_synth_config sc = kvq_synth_defaults(total, x->kv_heads, x->query_heads, x->head_dim, o->seed);
  const int ok = k && v && x->k_held_out && x->v_held_out && kvq_synth_generate(&sc, k, v, NULL) == 0;
  if (ok) {
    memcpy(x->k_held_out, k + kv, sizeof(float) * kv);
    memcpy(x->v_held_out, v + kv, sizeof(float) * kv);
  }
  free(k), free(v);
  if (!ok) fprintf(stderr, "kvq eval: out of memory\n");
  return ok ? 0 : -1;
}

static void free_data(eval_data *x) {
  free(x->k_held_out), free(x->v_held_out);
  if (x->k_input != x->k) free(x->k_input);
  if (x->v_input != x->v) free(x->v_input);
  free(x->k), free(x->v), free(x->q);
}

static void print_table(const eval_options *o, const eval_data *x, const eval_row *rows, uint32_t count) {
  printf("kvq eval: %s data, %u tokens, %u query heads, %u kv heads, head_dim %u, page %u, window %u;\n"
         "queries: the last %u positions x %u heads (%s mask%s); reference: exact attention in double\n"
         "exact attention: median logit standard deviation %.3f, entropy %.1f%% of log n\n\n",
         x->source, x->tokens, x->query_heads, x->kv_heads, x->head_dim, o->page_size, o->window, o->last,
         x->query_heads, o->mask == KVQ_MASK_CAUSAL ? "causal" : "no",
         o->queries_scaled ? ", multiplied by sqrt(head_dim): --queries-scaled" : "", x->logit_std, 100.0 * x->entropy_ratio);
  int policies = 0;
  for (uint32_t i = 0; i < count; i++) policies |= rows[i].has_policy;
  printf("%-32s %6s %6s %6s %9s %10s %10s %10s %8s %8s", "keys/values[@policy]", "k-bits", "v-bits", "bits", "ip-err",
         "score-mean", "score-max", "output-err", "top5%", "fixed-kB");
  if (policies) printf(" %6s %8s %7s", "kept", "h2o-ovl", "mass");
  printf("\n");
  for (uint32_t i = 0; i < count; i++) {
    const eval_row *r = &rows[i];
    printf("%-32s %6.3f %6.3f %6.3f %9.2e %10.2e %10.2e %10.2e %8.4f %8.1f", r->spec, r->key_bits, r->value_bits, r->bits,
           r->ip_error, r->score_error_mean, r->score_error_max, r->output_error, r->topk_overlap, r->fixed_bytes / 1024.0);
    if (r->has_policy) printf(" %6u %8.4f %7.4f", r->kept, r->h2o_overlap, r->kept_mass);
    else if (policies) printf(" %6s %8s %7s", "-", "-", "-");
    printf("\n");
  }
  printf("\nbits: per stored number, side data and padding included; fixed-kB: matrices and codebooks stored once\n"
         "per layer.\n");
  for (uint32_t i = 0; i < count; i++)
    if (rows[i].calibration) {
      printf(x->k_held_out ? "learned codebooks (CQ, online PolarQuant): k-means on %u other tokens of the same synthetic "
                             "model.\n"
                           : "learned codebooks (CQ, online PolarQuant): k-means on the first %u evaluated tokens (in-sample).\n",
             rows[i].calibration);
      break;
    }
  if (o->window)
    printf("window: the newest tokens stay in full precision (not in the bits; they make the errors smaller).\n");
  else
    printf("every token is quantized (a flush after the append).\n");
  if (policies) {
    const kvq_policy_config h2o = eval_policy(o, KVQ_POLICY_H2O, 0.0f), stream = eval_policy(o, KVQ_POLICY_STREAMING, 0.0f);
    printf("@policy rows decode the last %u positions token by token (the newest partial page stays in full precision);\n"
           "budget %u tokens: sinks %u + recent %u + heavy hitters %u (StreamingLLM: recent %u); kept: tokens kept at the\n"
           "end; h2o-ovl: share of the tokens H2O keeps on the exact keys (outside sinks and recent) that the row keeps;\n"
           "mass: the exact attention's share on the kept tokens (mean over queries).\n",
           o->last, o->budget, h2o.sinks, h2o.recent, h2o.heavy, stream.recent);
  }
}

static void print_json(const eval_options *o, const eval_data *x, const eval_row *rows, uint32_t count) {
  printf("{\n  \"kvq_version\": \"%s\",\n  \"data\": {\"source\": \"%s\", \"tokens\": %u, \"query_heads\": %u, "
         "\"kv_heads\": %u, \"head_dim\": %u, \"logit_std_median\": %.6f, \"entropy_ratio\": %.6f},\n",
         kvq_version(), x->source, x->tokens, x->query_heads, x->kv_heads, x->head_dim, x->logit_std, x->entropy_ratio);
  const kvq_policy_config h2o = eval_policy(o, KVQ_POLICY_H2O, 0.0f);
  printf("  \"settings\": {\"page_size\": %u, \"window\": %u, \"queries\": %u, \"mask\": \"%s\", \"seed\": %llu, "
         "\"budget\": %u, \"sinks\": %u, \"recent\": %u, \"heavy\": %u, \"lambda\": %g, \"queries_scaled\": %s},\n",
         o->page_size, o->window, o->last, o->mask == KVQ_MASK_CAUSAL ? "causal" : "none", (unsigned long long)o->seed,
         o->budget, h2o.sinks, h2o.recent, h2o.heavy, (double)o->lambda, o->queries_scaled ? "true" : "false");
  printf("  \"methods\": [\n");
  for (uint32_t i = 0; i < count; i++) {
    const eval_row *r = &rows[i];
    printf("    {\"method\": \"%s\", \"key_bits\": %.6f, \"value_bits\": %.6f, \"bits\": %.6f, \"fixed_bytes\": %llu, "
           "\"window_tokens\": %llu, \"calibration_tokens\": %u, \"inner_product_error\": %.6e, "
           "\"score_error_mean\": %.6e, \"score_error_max\": %.6e, \"output_error\": %.6e, \"topk_overlap\": %.6f",
           r->spec, r->key_bits, r->value_bits, r->bits, (unsigned long long)r->fixed_bytes,
           (unsigned long long)r->window_tokens, r->calibration, r->ip_error, r->score_error_mean, r->score_error_max,
           r->output_error, r->topk_overlap);
    if (r->has_policy)
      printf(", \"kept_tokens\": %u, \"h2o_overlap\": %.6f, \"kept_mass\": %.6f", r->kept, r->h2o_overlap, r->kept_mass);
    printf("}%s\n", i + 1 < count ? "," : "");
  }
  printf("  ]\n}\n");
}

/* --plot: each row's output error against its bits per number (keys and values together). */
static int write_plot(const char *png, const eval_data *x, const eval_row *rows, uint32_t count) {
  plot_point *points = malloc(sizeof *points * count);
  if (!points) {
    fprintf(stderr, "kvq eval: out of memory for the plot\n");
    return -1;
  }
  for (uint32_t i = 0; i < count; i++) points[i] = (plot_point){rows[i].spec, rows[i].bits, rows[i].output_error};
  char title[160], error[1024];
  snprintf(title, sizeof title, "kvq eval: output error against size, %s data, %u tokens, head_dim %u",
           strcmp(x->source, "synthetic") ? ".npy" : "synthetic", x->tokens, x->head_dim); /* paths may not quote */
  const plot_spec spec = {title, "bits per number (keys and values, side data included)",
                          "output error: mean ||o^ - o|| / ||o||", 1};
  const int rc = plot_png(png, &spec, points, count, error, sizeof error);
  if (rc != 0) fprintf(stderr, "kvq eval: --plot: %s\n", error);
  free(points);
  return rc;
}

int kvq_cmd_eval(int argc, char **argv) {
  eval_options o = {.tokens = 2048, .query_heads = 8, .kv_heads = 2, .head_dim = 128, .last = 64, .page_size = 32,
                    .sinks = 4, .recent = 64, .lambda = 0.5f, .seed = 1, .mask = KVQ_MASK_CAUSAL,
                    .backend = KVQ_BACKEND_CPU};
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
                       : !strcmp(a, "--budget")    ? &o.budget
                       : !strcmp(a, "--sinks")     ? &o.sinks
                       : !strcmp(a, "--recent")    ? &o.recent
                                                   : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      o.json = 1;
    } else if (!strcmp(a, "--quiet")) {
      o.quiet = 1;
    } else if (!strcmp(a, "--queries-scaled")) {
      o.queries_scaled = 1;
    } else if (!strcmp(a, "--in-sample")) {
      o.in_sample = 1;
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
    } else if (!strcmp(a, "--lambda")) {
      char *end;
      const double lambda = strtod(value, &end);
      if (end == value || *end || !(lambda >= 0.0 && lambda <= 1.0)) {
        fprintf(stderr, "kvq eval: --lambda %s: a number from 0 to 1\n", value);
        return 2;
      }
      o.lambda = (float)lambda;
      i++;
    } else if (!strcmp(a, "--keys")) o.keys = argv[++i];
    else if (!strcmp(a, "--values")) o.values = argv[++i];
    else if (!strcmp(a, "--queries")) o.queries = argv[++i];
    else if (!strcmp(a, "--methods")) o.methods = argv[++i];
    else if (!strcmp(a, "--plot")) o.plot = argv[++i];
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
  const int loaded = load_data(&o, &x) == 0;
  if (loaded && o.queries_scaled) eval_scale_queries(&x); /* before anything reads them */
  if (!loaded || input_buffers(&x) != 0 || held_out_data(&o, &x) != 0) {
    free_data(&x);
    return 2;
  }
  const char *why = o.last == 0 ? "--last must be at least 1"
                    : o.calibration > x.tokens ? "--calibration is more than the data's tokens"
                                               : NULL;
  if (why) {
    fprintf(stderr, "kvq eval: %s\n", why);
    free_data(&x);
    return 2;
  }
  if (o.last > x.tokens) o.last = x.tokens; /* every position is a query */
  if (o.budget == 0) o.budget = x.tokens / 5;
  kvq_context_options copt = kvq_context_options_default();
  copt.backend = o.backend;
  kvq_context *ctx = NULL;
  if (kvq_context_create(&copt, &ctx) != KVQ_OK) {
    fprintf(stderr, "kvq eval: the requested backend is unavailable (see kvq info)\n");
    free_data(&x);
    return 2;
  }
  const size_t ns = (size_t)o.last * x.query_heads * x.tokens, no = (size_t)o.last * x.query_heads * x.head_dim;
  eval_reference ref = {malloc(sizeof(double) * ns), malloc(sizeof(double) * ns), malloc(sizeof(double) * no), NULL, 0, 0};
  const char *list = o.methods ? o.methods : default_methods;
  uint32_t count = 1;
  for (const char *c = list; *c; c++) count += *c == ',';
  eval_row *rows = calloc(count, sizeof *rows);
  int rc = 0;
  if (!ref.s || !ref.p || !ref.o || !rows) {
    fprintf(stderr, "kvq eval: out of memory for %zu scores\n", ns);
    rc = 1;
  } else {
    o.progress = progress_start(stderr, -1, count, o.quiet);
    progress_row(o.progress, 0, "exact reference", 15);
    progress_phase(o.progress, "attention in double", 0, 0);
    exact_reference(&x, o.last, o.mask, &ref);
    if (eval_logit_spread(&o, &x, &ref, &x.logit_std, &x.entropy_ratio) != 0) x.logit_std = x.entropy_ratio = NAN;
    if (x.logit_std < EVAL_FLAT_LOGIT_STD) /* eval_check.c: why 1 */
      fprintf(stderr,
              "kvq eval: warning: the attention is nearly uniform (median logit standard deviation %.3f, entropy %.1f%% "
              "of log n): do the queries already carry 1/sqrt(head_dim)? kvq applies it itself; if they do, rerun "
              "with --queries-scaled (docs/EVAL.md)\n",
              x.logit_std, 100.0 * x.entropy_ratio);
    const char *spec = list;
    for (uint32_t i = 0; i < count && rc == 0; i++) {
      const char *end = strchr(spec, ',');
      const size_t len = end ? (size_t)(end - spec) : strlen(spec);
      progress_row(o.progress, i, spec, len);
      const int policy = memchr(spec, '@', len) != NULL;
      if ((policy ? eval_run_policy_row(ctx, &o, &x, spec, len, &ref, &rows[i])
                  : eval_run_row(ctx, &o, &x, spec, len, &ref, &rows[i])) != 0)
        rc = 2;
      spec = end ? end + 1 : spec + len;
    }
    progress_finish(o.progress);
    o.progress = NULL;
    if (rc == 0) {
      if (o.json) print_json(&o, &x, rows, count);
      else print_table(&o, &x, rows, count);
    }
    if (rc == 0 && o.plot && write_plot(o.plot, &x, rows, count) != 0) rc = 1;
    else if (rc == 0 && o.plot && !o.json) printf("plot: %s (gnuplot; its data and script next to it)\n", o.plot);
  }
  free(rows), free(ref.s), free(ref.p), free(ref.o), free(ref.h2o_kept);
  free_data(&x);
  kvq_context_destroy(ctx);
  return rc;
}
