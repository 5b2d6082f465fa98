/* Fuzz target: the model's readers (model/, docs/MODEL.md) on bytes. Each input is given to both,
 * as model.json's text (use_manifest_read: cJSON, the graph's wiring check, the weights' layout;
 * the shards are not read) and as vocab.json's text (use_vocab_parse, then the tokenizer over a few
 * sentences). A corpus file is meant for one of them; the other refuses it early. Properties: no
 * crash, leak or out-of-bounds access; a refusal has a message and leaves nothing allocated (the
 * outputs zeroed); an accepted manifest lays its tensors end to end (each one's element count the
 * product of its shape, at most 2^30, its offset the sum of those before) and its lookup refuses a
 * wrong shape with a message; an accepted vocabulary finds every scored piece again by its bytes,
 * and the tokenizer gives ids within it. */
#include <string.h>

#include "fuzz.h"
#include "model/internal.h"

static void check_manifest(const uint8_t *data, size_t size) {
  cJSON *manifest = NULL;
  use_weights w;
  char why[512] = "";
  if (use_manifest_read((const char *)data, size, &manifest, &w, why, sizeof why) != KVQ_OK) {
    if (!why[0]) fuzz_fail("a refused manifest without a message");
    if (manifest || w.tensors || w.count || w.data || w.words) fuzz_fail("a refused manifest left its outputs set");
    return;
  }
  if (!manifest || w.data || (w.count && !w.tensors)) fuzz_fail("an accepted manifest without its layout");
  size_t words = 0;
  for (size_t i = 0; i < w.count; i++) {
    const use_tensor *t = &w.tensors[i];
    if (!t->name || t->rank > 4) fuzz_fail("tensor %zu has no name or rank %u", i, t->rank);
    size_t count = 1;
    for (uint32_t d = 0; d < t->rank; d++) {
      if (t->shape[d] < 0) fuzz_fail("tensor %s has a negative dimension", t->name);
      count *= (size_t)t->shape[d];
    }
    if (t->count != count || count > ((size_t)1 << 30)) fuzz_fail("tensor %s counts %zu elements", t->name, t->count);
    if (t->offset != words) fuzz_fail("tensor %s at %zu, expected %zu", t->name, t->offset, words);
    words += count;
  }
  if (w.words != words) fuzz_fail("the layout holds %zu words, its tensors %zu", w.words, words);
  if (w.count) {
    /* the first tensor of its name asked for at another rank: refused before its data is read */
    const use_tensor *t = &w.tensors[0];
    const int64_t shape[4] = {0, 0, 0, 0};
    uint32_t rank = t->rank ? t->rank - 1 : 1;
    why[0] = 0;
    if (use_weights_get(&w, t->name, t->is_int, rank, shape, why, sizeof why) || !why[0])
      fuzz_fail("tensor %s found at rank %u", t->name, rank);
  }
  use_weights_free(&w);
  cJSON_Delete(manifest);
}

static void check_tokens(const use_vocab *v) {
  kvq_use_model model;
  memset(&model, 0, sizeof model);
  model.vocab = *v;
  static const char *const sentences[] = {"", "Hello world.", "  the KV cache, compressed:  2x\tsmaller  ",
                                          "\xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"};
  int32_t ids[128];
  for (size_t s = 0; s < sizeof sentences / sizeof sentences[0]; s++) {
    size_t count = 0;
    kvq_status status = kvq_use_tokenize(&model, sentences[s], ids, 128, &count);
    if (status != KVQ_OK) fuzz_fail("sentence %zu: status %d", s, (int)status);
    for (size_t i = 0; i < count; i++)
      if (ids[i] < 0 || (size_t)ids[i] >= v->count) fuzz_fail("sentence %zu: id %d of %zu", s, ids[i], v->count);
  }
}

static void check_vocab(const uint8_t *data, size_t size) {
  use_vocab v;
  char why[512] = "";
  if (use_vocab_parse((const char *)data, size, "vocab.json", &v, why, sizeof why) != KVQ_OK) {
    if (!why[0]) fuzz_fail("a refused vocabulary without a message");
    if (v.pieces || v.scores || v.slots || v.count) fuzz_fail("a refused vocabulary left its outputs set");
    return;
  }
  if (v.count < 2 || !v.slot_count || (v.slot_count & (v.slot_count - 1)) || v.slot_count < 2 * v.count)
    fuzz_fail("%zu pieces in %zu slots", v.count, v.slot_count);
  size_t reserved = 0;
  while (reserved < v.count && v.scores[reserved] == 0.0f) reserved++;
  for (size_t i = 0; i < v.count; i++) {
    size_t len = v.pieces[i] ? strlen(v.pieces[i]) : 0;
    if (!len || len > v.max_bytes) fuzz_fail("piece %zu of %zu bytes (longest %zu)", i, len, v.max_bytes);
    if (i < reserved) continue;
    int32_t id = use_vocab_find(&v, v.pieces[i], len);
    if (id < (int32_t)reserved || (size_t)id > i || strcmp(v.pieces[id], v.pieces[i]))
      fuzz_fail("piece %zu found as %d", i, id);
  }
  check_tokens(&v);
  use_vocab_free(&v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_manifest(data, size);
  check_vocab(data, size);
  return 0;
}
