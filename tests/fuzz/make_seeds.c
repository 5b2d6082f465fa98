/*
 * Writes the generated seeds of the fuzz corpora (tests/fuzz/corpus, docs/RELIABILITY.md): small
 * caches of every method and policy (1 or 2 layers, head_dim 16, a few dozen tokens, so that the
 * fuzzers mutate kilobytes, not the golden caches' hundreds), their codebook files and config
 * records, crafted rejects, and .npy files. Deterministic: rerunning it rewrites the same bytes.
 * Usage: fuzz_make_seeds CORPUS_DIR (its subdirectories caches, codebooks_load, config and npy must
 * exist).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/savefile.h"
#include "core/sha256.h"
#include "fuzz.h"
#include "tools/npy.h"

static const char *out_dir;

static void write_file(const char *sub, const char *name, const void *data, size_t size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s/%s", out_dir, sub, name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
}

static void check(kvq_status st, const char *what) {
  if (st != KVQ_OK) {
    fprintf(stderr, "%s: %s (%s)\n", what, kvq_status_string(st), kvq_context_last_error(fuzz_context()));
    exit(1);
  }
}

enum { D = 16, HKV = 1, HQ = 2, P = 16 };

static kvq_layer_config layer(kvq_method_config keys, kvq_method_config values) {
  kvq_layer_config l = {HQ, HKV, D, keys, values};
  return l;
}

static kvq_method_config method(kvq_method m) { return kvq_method_defaults(m, D); }

/* The config record and the policy record: the config target's input. */
static void save_config(const char *name, const kvq_cache_config *c) {
  kvq_writer w = {NULL, 0};
  kvq_put_config(&w, c);
  kvq_put_policy(&w, &c->policy);
  uint8_t *buf = malloc((size_t)w.pos);
  w = (kvq_writer){buf, 0};
  kvq_put_config(&w, c);
  kvq_put_policy(&w, &c->policy);
  char file[256];
  snprintf(file, sizeof file, "%s.conf", name);
  write_file("config", file, buf, (size_t)w.pos);
  free(buf);
}

/* Appends `tokens` synthetic tokens to every layer of `seq`, one call per token, with one attention
 * call after each (so that H2O and Q-Hitter decide on statistics). */
static void fill(kvq_cache *cache, const kvq_cache_config *c, uint32_t seq, uint32_t tokens, uint64_t seed) {
  kvq_synth_config s = kvq_synth_defaults(tokens, HKV, HQ, D, seed);
  s.outliers = 1;
  float *k = malloc(sizeof(float) * tokens * HKV * D), *v = malloc(sizeof(float) * tokens * HKV * D);
  float *q = malloc(sizeof(float) * tokens * HQ * D), out[HQ * D];
  check(kvq_synth_generate(&s, k, v, q), "synth");
  /* in the cache's input dtype */
  float *kc = malloc(sizeof(float) * tokens * HKV * D), *vc = malloc(sizeof(float) * tokens * HKV * D);
  check(kvq_convert(k, KVQ_DTYPE_F32, kc, c->input_dtype, (size_t)tokens * HKV * D), "convert");
  check(kvq_convert(v, KVQ_DTYPE_F32, vc, c->input_dtype, (size_t)tokens * HKV * D), "convert");
  free(k), free(v);
  k = kc, v = vc;
  const size_t e = c->input_dtype == KVQ_DTYPE_F32 ? 4 : 2;
  const int64_t kv_shape[3] = {1, HKV, D}, q_shape[3] = {1, HQ, D};
  for (uint32_t t = 0; t < tokens; t++)
    for (uint32_t l = 0; l < c->layer_count; l++) {
      kvq_tensor kt = kvq_tensor_host((char *)k + (size_t)t * HKV * D * e, c->input_dtype, 3, kv_shape);
      kvq_tensor vt = kvq_tensor_host((char *)v + (size_t)t * HKV * D * e, c->input_dtype, 3, kv_shape);
      check(kvq_append(cache, seq, l, &kt, &vt), "append");
      kvq_attention_request req = {seq, KVQ_MASK_CAUSAL, kvq_tensor_host(q + (size_t)t * HQ * D, KVQ_DTYPE_F32, 3, q_shape),
                                   kvq_tensor_host(out, KVQ_DTYPE_F32, 3, q_shape)};
      check(kvq_attention(cache, l, &req, 1), "attention");
    }
  free(k);
  free(v);
  free(q);
}

/* A cache of `c` with two sequences (one flushed), saved; with learn, its codebooks first learned
 * and saved too. Returns the saved file (malloc'ed) in *file. */
static void make_cache(const char *name, kvq_cache_config c, int learn, uint8_t **file, size_t *file_size) {
  kvq_context *ctx = fuzz_context();
  kvq_cache *cache;
  check(kvq_cache_create(ctx, &c, &cache), name);
  save_config(name, &c);
  char fname[256];
  if (learn) {
    enum { CAL = 64 };
    kvq_synth_config s = kvq_synth_defaults(CAL, HKV, HQ, D, 7);
    float *k = malloc(sizeof(float) * CAL * HKV * D), *v = malloc(sizeof(float) * CAL * HKV * D);
    check(kvq_synth_generate(&s, k, v, NULL), "synth");
    const int64_t shape[3] = {CAL, HKV, D};
    kvq_tensor kt = kvq_tensor_host(k, KVQ_DTYPE_F32, 3, shape), vt = kvq_tensor_host(v, KVQ_DTYPE_F32, 3, shape);
    for (uint32_t l = 0; l < c.layer_count; l++) check(kvq_codebooks_learn(cache, l, &kt, &vt, NULL), "learn");
    free(k);
    free(v);
    uint64_t bytes;
    check(kvq_codebooks_save_size(cache, &bytes), "codebooks size");
    uint8_t *cb = malloc((size_t)bytes);
    size_t written;
    check(kvq_codebooks_save_to_memory(cache, cb, (size_t)bytes, &written), "codebooks save");
    snprintf(fname, sizeof fname, "%s.kvqcb", name);
    write_file("codebooks_load", fname, cb, written);
    free(cb);
  }
  uint32_t s0, s1;
  check(kvq_sequence_add(cache, &s0), "add");
  check(kvq_sequence_add(cache, &s1), "add");
  fill(cache, &c, s0, 56, 11);
  fill(cache, &c, s1, 21, 12);
  check(kvq_flush(cache, s1), "flush");
  uint64_t bytes;
  check(kvq_cache_save_size(cache, &bytes), "save size");
  *file = malloc((size_t)bytes);
  check(kvq_cache_save_to_memory(cache, *file, (size_t)bytes, file_size), "save");
  snprintf(fname, sizeof fname, "%s.kvq", name);
  write_file("caches", fname, *file, *file_size);
  kvq_cache_destroy(cache);
}

static kvq_cache_config config(const kvq_layer_config *layers, uint32_t n, kvq_policy_kind policy) {
  kvq_cache_config c = {0};
  c.layer_count = n;
  c.layers = layers;
  c.input_dtype = KVQ_DTYPE_F16;
  c.page_size = P;
  c.residual_window = P;
  c.max_pages = 8;
  c.max_sequences = 2;
  c.seed = 42;
  if (policy != KVQ_POLICY_KEEP_ALL) {
    c.policy = kvq_policy_defaults(policy);
    c.policy.heavy_fraction = 0;
    c.policy.heavy = 4;
  }
  return c;
}

/* A cache file's CONF payload, where the header and section framing put it. */
static uint8_t *conf_payload(uint8_t *file) { return file + KVQ_FILE_HEADER_BYTES + 16; }

static void put_u32_at(uint8_t *p, uint32_t v) {
  kvq_writer w = {p, 0};
  kvq_put_u32(&w, v);
}

static void crafted_caches(const uint8_t *good, size_t size) {
  uint8_t *f = malloc(size);
  /* truncated: the header and a little */
  write_file("caches", "reject-truncated-100.kvq", good, 100);
  /* wrong magic */
  memcpy(f, good, size);
  memcpy(f, "KVQCACHF", 8);
  write_file("caches", "reject-magic.kvq", f, size);
  /* a file-size field one byte short, checksum recomputed */
  memcpy(f, good, size);
  put_u32_at(f + 16, (uint32_t)size - 1);
  kvq_sha256_digest(f, size - 32, f + size - 32);
  write_file("caches", "reject-file-size.kvq", f, size);
  /* a config of the most pages its page size and window allow (max_pages P + R + P <= 2^31 - 1:
   * 2^27 - 3 here) and 65535 sequences in the file of a tiny cache, checksum recomputed: a valid
   * configuration of tens of GiB, which only the load limit refuses (tests/test_load_limit.c) */
  memcpy(f, good, size);
  put_u32_at(conf_payload(f) + 16, (0x7fffffffu - 2 * P) / P);
  put_u32_at(conf_payload(f) + 20, 65535);
  kvq_sha256_digest(f, size - 32, f + size - 32);
  write_file("caches", "reject-huge-config.kvq", f, size);
  free(f);
}

/* A .npy file of format `version` (1 or 2) with header `dict`, padded with spaces and a newline to a
 * multiple of 64 bytes as numpy pads it, then `size` bytes of data. */
static void write_npy(const char *name, int version, const char *dict, const uint8_t *data, size_t size) {
  uint8_t file[256];
  const size_t prefix = version == 1 ? 10 : 12, len = strlen(dict);
  const size_t header = (prefix + len + 1 + 63) / 64 * 64 - prefix;
  memcpy(file, "\x93NUMPY", 6);
  file[6] = (uint8_t)version, file[7] = 0;
  file[8] = (uint8_t)header, file[9] = (uint8_t)(header >> 8);
  if (version == 2) file[10] = file[11] = 0;
  memcpy(file + prefix, dict, len);
  memset(file + prefix + len, ' ', header - len - 1);
  file[prefix + header - 1] = '\n';
  memcpy(file + prefix + header, data, size);
  write_file("npy", name, file, prefix + header + size);
}

static void npy_seeds(void) {
  char path[1024], why[256];
  float data[24];
  for (int i = 0; i < 24; i++) data[i] = (float)i * 0.5f - 3.0f;
  const int64_t s2[2] = {3, 4}, s1[1] = {5}, s4[4] = {1, 2, 0, 3}, s3[3] = {2, 3, 4};
  struct { const char *name; uint32_t rank; const int64_t *shape; int fp16; } w[] = {
      {"f32-3x4.npy", 2, s2, 0}, {"f16-5.npy", 1, s1, 1}, {"f32-empty-rank4.npy", 4, s4, 0}, {"f16-2x3x4.npy", 3, s3, 1}};
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
    snprintf(path, sizeof path, "%s/npy/%s", out_dir, w[i].name);
    if (kvq_npy_write(path, data, w[i].rank, w[i].shape, w[i].fp16, why, sizeof why) != 0) {
      fprintf(stderr, "%s\n", why);
      exit(1);
    }
  }
  /* hand-made headers: version 2.0, a big-endian dtype, Fortran order, a body shorter than the shape */
  static const uint8_t one[4] = {0x00, 0x00, 0x80, 0x3f}, two[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40};
  write_npy("v2-f32-2.npy", 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", two, 8);
  write_npy("reject-big-endian.npy", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", one, 4);
  write_npy("reject-fortran.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 1), }", one, 4);
  write_npy("reject-short-data.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (9,), }", one, 4);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  uint8_t *file = NULL, *first = NULL;
  size_t size = 0, first_size = 0;

  kvq_method_config qjl = method(KVQ_METHOD_QJL), qjl0 = method(KVQ_METHOD_QJL), exact = method(KVQ_METHOD_EXACT);
  qjl.qjl.sketch_dim = 32, qjl.qjl.outlier_count = 2, qjl.qjl.outlier_sketch_dim = 32;
  qjl0.qjl.sketch_dim = 64, qjl0.qjl.outlier_count = 0;
  kvq_method_config bf16 = exact, u2 = method(KVQ_METHOD_UNIFORM), u3 = method(KVQ_METHOD_UNIFORM), kivi = method(KVQ_METHOD_KIVI);
  bf16.exact.dtype = KVQ_DTYPE_BF16;
  u3.uniform.bits = 3, u3.uniform.group_size = 4;
  kivi.kivi.group_tokens = 4;
  kvq_method_config polar = method(KVQ_METHOD_POLAR), polar_h = method(KVQ_METHOD_POLAR), polar_on = method(KVQ_METHOD_POLAR);
  polar.polar.levels = 2, polar.polar.bits[0] = 2, polar.polar.bits[1] = 1;
  polar_h.polar.levels = 1, polar_h.polar.bits[0] = 3, polar_h.polar.rotation = KVQ_ROTATION_HADAMARD;
  polar_on.polar.levels = 2, polar_on.polar.bits[0] = 2, polar_on.polar.bits[1] = 2;
  polar_on.polar.rotation = KVQ_ROTATION_HADAMARD, polar_on.polar.codebook = KVQ_CODEBOOK_ONLINE;
  kvq_method_config cq = method(KVQ_METHOD_CQ);
  cq.cq.channels = 4, cq.cq.bits = 3, cq.cq.iterations = 10;

  const kvq_layer_config l_exact[1] = {layer(exact, bf16)}, l_qjl[1] = {layer(qjl, u2)}, l_kivi[1] = {layer(kivi, u3)},
                         l_polar[1] = {layer(polar, polar_h)}, l_learned[1] = {layer(polar_on, cq)},
                         l_two[2] = {layer(u2, u2), layer(qjl0, exact)}, l_qh[2] = {layer(kivi, polar), layer(qjl, u3)};

  make_cache("qjl-k2-u2", config(l_qjl, 1, KVQ_POLICY_KEEP_ALL), 0, &first, &first_size);
  make_cache("exact-f16-bf16", config(l_exact, 1, KVQ_POLICY_KEEP_ALL), 0, &file, &size), free(file);
  make_cache("kivi-g4-u3-g4", config(l_kivi, 1, KVQ_POLICY_KEEP_ALL), 0, &file, &size), free(file);
  make_cache("polar-dense-hadamard", config(l_polar, 1, KVQ_POLICY_KEEP_ALL), 0, &file, &size), free(file);
  make_cache("polar-online-cq", config(l_learned, 1, KVQ_POLICY_KEEP_ALL), 1, &file, &size), free(file);
  make_cache("streaming-two-layers", config(l_two, 2, KVQ_POLICY_STREAMING), 0, &file, &size), free(file);
  make_cache("h2o-two-layers", config(l_two, 2, KVQ_POLICY_H2O), 0, &file, &size), free(file);
  make_cache("qhitter-two-layers", config(l_qh, 2, KVQ_POLICY_QHITTER), 0, &file, &size), free(file);
  crafted_caches(first, first_size);
  free(first);
  npy_seeds();
  return 0;
}
