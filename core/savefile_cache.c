/*
 * Cache files (docs/FORMAT.md, "Saved caches"):
 *   header (64 bytes): "KVQCACHE", u32 version, u32 header bytes, u64 file bytes, u32 flags,
 *                      u32 section count, 32 zero bytes
 *   sections:          CONF config, MATX matrices, SEQS sequences, PLCY policy state (with a token
 *                      policy), PAGE pages in use, WIND windows
 *   trailer:           SHA-256 of everything before it
 * Loading checks magic, version, length and checksum, then validates every field, so a file with a
 * correct checksum but inconsistent content is still rejected (KVQ_ERROR_BAD_FORMAT) rather than
 * trusted. What the cache and codebook files share is core/savefile_sections.c.
 */
#include "savefile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "page_check.h"
#include "token_check.h"

/* Header flags: bit 0 = a PLCY section follows SEQS (the cache has a token policy). */
#define FLAG_POLICY 1u

static kvq_status bad(kvq_context *ctx, const char *what) {
  return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: %s", what);
}

/* ---- Writing ------------------------------------------------------------------------------------ */

/* Writes (or, with w->data == NULL, measures) the whole file. Pages and window tokens are read
 * from the device straight into their place in the file image (kvq_read_later, *later), all with one
 * wait before the checksum covers them: one submission where the backend batches. */
static kvq_status write_contents(kvq_cache *cache, kvq_writer *w, int *later) {
  kvq_context *ctx = cache->ctx;
  const kvq_cache_config *c = &cache->config;
  kvq_status st = KVQ_OK;

  const int policy = c->policy.kind != KVQ_POLICY_KEEP_ALL;
  const uint64_t file_bytes_at = kvq_file_begin(w, KVQ_FILE_MAGIC, policy ? FLAG_POLICY : 0, policy ? 6 : 5);

  uint64_t at = kvq_section_begin(w, KVQ_TAG_CONF);
  kvq_put_config(w, c);
  kvq_section_end(w, at);

  at = kvq_section_begin(w, KVQ_TAG_MATX);
  kvq_put_fixed(w, cache, 0);
  kvq_section_end(w, at);

  at = kvq_section_begin(w, KVQ_TAG_SEQS);
  kvq_put_u32(w, c->max_sequences);
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    kvq_put_u32(w, seq->generation); /* kept for free slots too, so freed ids stay invalid */
    kvq_put_u32(w, seq->live);
    if (!seq->live) continue;
    kvq_put_u32(w, seq->page_count);
    for (uint32_t l = 0; l < c->layer_count; l++) {
      kvq_put_u32(w, seq->layers[l].tokens);
      kvq_put_u32(w, seq->layers[l].ring_start);
      kvq_put_u32(w, seq->layers[l].quantized);
    }
    for (uint32_t j = 0; j < seq->page_count; j++) kvq_put_u32(w, seq->pages[j]);
  }
  kvq_section_end(w, at);

  if (policy) {
    at = kvq_section_begin(w, KVQ_TAG_PLCY);
    kvq_put_policy_section(w, cache);
    kvq_section_end(w, at);
  }

  /* Pages in use, in ascending slot order: for each, every layer's key then value image. */
  at = kvq_section_begin(w, KVQ_TAG_PAGE);
  uint8_t *used = calloc(c->max_pages, 1);
  if (!used) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "saving: out of host memory");
  uint32_t used_count = 0;
  for (uint32_t slot = 0; used && slot < c->max_sequences; slot++)
    if (cache->seqs[slot].live)
      for (uint32_t j = 0; j < cache->seqs[slot].page_count; j++) used[cache->seqs[slot].pages[j]] = 1, used_count++;
  kvq_put_u32(w, used_count);
  for (uint32_t p = 0; used && p < c->max_pages; p++)
    if (used[p]) kvq_put_u32(w, p);
  for (uint32_t p = 0; used && st == KVQ_OK && p < c->max_pages; p++) {
    if (!used[p]) continue;
    for (uint32_t l = 0; l < c->layer_count && st == KVQ_OK; l++)
      for (int s = 0; s < 2 && st == KVQ_OK; s++) {
        const uint64_t pb = cache->storage[l].side[s].layout.page_bytes;
        uint8_t *at = kvq_put_later(w, pb);
        if (at && (st = kvq_read_later(ctx, cache->storage[l].pages[s], (uint64_t)p * pb, at, pb, later)) != KVQ_OK)
          st = kvq_fail_backend(ctx, st, "saving: reading a page");
      }
  }
  free(used);
  kvq_section_end(w, at);

  /* Window tokens [ring_start, tokens) of each live sequence, per layer, keys then values. */
  at = kvq_section_begin(w, KVQ_TAG_WIND);
  for (uint32_t slot = 0; st == KVQ_OK && slot < c->max_sequences; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    if (!seq->live) continue;
    for (uint32_t l = 0; l < c->layer_count && st == KVQ_OK; l++) {
      const uint64_t tb = kvq_token_bytes(c->input_dtype, cache->layers[l].kv_heads, cache->layers[l].head_dim);
      const uint64_t ring_offset = kvq_ring_offset(cache, l, slot);
      for (int s = 0; s < 2 && st == KVQ_OK; s++)
        for (uint32_t t = seq->layers[l].ring_start; t < seq->layers[l].tokens && st == KVQ_OK; t++) {
          uint8_t *at = kvq_put_later(w, tb);
          if (at && (st = kvq_read_later(ctx, cache->storage[l].ring[s], ring_offset + (t % cache->ring_capacity) * tb, at,
                                         tb, later)) != KVQ_OK)
            st = kvq_fail_backend(ctx, st, "saving: reading the window");
        }
    }
  }
  kvq_section_end(w, at);

  if (st != KVQ_OK) kvq_reads_drop(ctx, later); /* a failed save's reads never land */
  const kvq_status waited = kvq_reads_wait(ctx, later); /* the image complete before its checksum */
  if (st == KVQ_OK && waited != KVQ_OK) st = kvq_fail_backend(ctx, waited, "saving: reading the pool");
  kvq_file_end(w, file_bytes_at);
  return st;
}

/* The reads of one save are one deferred call (kvq_call_begin_parts: a save only reads, so running
 * out of staging space may submit part way): they share one submission. */
static kvq_status write_file(kvq_cache *cache, kvq_writer *w) {
  int later = 0;
  if (!w->data) return write_contents(cache, w, &later); /* measuring reads nothing */
  kvq_call_begin_parts(cache->ctx);
  return kvq_call_end_waiting(cache->ctx, write_contents(cache, w, &later));
}

kvq_status kvq_cache_save_size(kvq_cache *cache, uint64_t *bytes) {
  return kvq_file_save_size(cache, write_file, bytes, "kvq_cache_save_size");
}

kvq_status kvq_cache_save_to_memory(kvq_cache *cache, void *buffer, size_t capacity, size_t *written) {
  return kvq_file_save_to_memory(cache, write_file, buffer, capacity, written, "kvq_cache_save_to_memory");
}

kvq_status kvq_cache_save(kvq_cache *cache, const char *path) { return kvq_file_save(cache, write_file, path, "kvq_cache_save"); }

/* ---- Reading ------------------------------------------------------------------------------------ */

static kvq_status load_sequences(kvq_cache *cache, kvq_reader *r, uint8_t *page_owner, int has_policy) {
  kvq_context *ctx = cache->ctx;
  const kvq_cache_config *c = &cache->config;
  const uint32_t P = c->page_size;
  if (kvq_get_u32(r) != c->max_sequences) return bad(ctx, "sequence section does not match max_sequences");
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    kvq_sequence *seq = &cache->seqs[slot];
    const uint32_t generation = kvq_get_u32(r), live = kvq_get_u32(r);
    if (r->short_read || generation > 0xffff || live > 1 || (live && generation == 0))
      return bad(ctx, "a sequence record is out of range");
    seq->generation = (uint16_t)generation;
    if (!live) continue;
    const uint32_t pages = kvq_get_u32(r);
    if (r->short_read || pages > c->max_pages) return bad(ctx, "a page table is longer than the pool");
    for (uint32_t l = 0; l < c->layer_count; l++) {
      kvq_seq_layer *sl = &seq->layers[l];
      sl->tokens = kvq_get_u32(r);
      sl->ring_start = kvq_get_u32(r);
      sl->quantized = kvq_get_u32(r);
      if (sl->ring_start > sl->quantized || sl->quantized > sl->tokens || sl->ring_start % P ||
          sl->tokens - sl->ring_start >= cache->ring_capacity || sl->tokens > KVQ_MAX_POSITIONS ||
          (!has_policy && (sl->quantized + P - 1) / P > pages)) /* with a policy: checked with its section */
        return bad(ctx, "a sequence's token counts break the cache invariants");
    }
    if ((uint64_t)pages * 4 > r->size - r->pos) return bad(ctx, "sequence section too short for its page tables");
    kvq_status st = kvq_reserve_page_table(cache, seq, pages);
    if (st != KVQ_OK) return st;
    for (uint32_t j = 0; j < pages; j++) {
      ctx->load_work.steps++;
      const uint32_t p = kvq_get_u32(r);
      if (r->short_read || p >= c->max_pages || page_owner[p]) return bad(ctx, "a page table names a page out of range or twice");
      page_owner[p] = 1;
      seq->pages[j] = p;
    }
    seq->page_count = pages;
    seq->live = 1;
    kvq_default_page_numbers(cache, seq); /* a PLCY section, if any, replaces them */
    cache->live_sequences++;
  }
  if (!kvq_section_finished(r)) return bad(ctx, "sequence section has the wrong length");
  /* the free stack: unused pages, lowest slot on top */
  cache->free_count = 0;
  for (uint32_t p = c->max_pages; p-- > 0;)
    if (!page_owner[p]) cache->free_pages[cache->free_count++] = p;
  return KVQ_OK;
}

/* Reads the page images: exactly the owned pages, ascending, each checked before it is stored. */
static kvq_status load_pages(kvq_cache *cache, kvq_reader *r, const uint8_t *page_owner) {
  kvq_context *ctx = cache->ctx;
  kvq_backend *be = ctx->backend;
  const kvq_cache_config *c = &cache->config;
  /* valid tokens of each (slot, layer): from the page tables */
  uint32_t *valid = calloc((size_t)c->max_pages * c->layer_count, sizeof *valid);
  if (!valid) return kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory");
  for (uint32_t slot = 0; slot < c->max_sequences; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    for (uint32_t j = 0; seq->live && j < seq->page_count; j++)
      for (uint32_t l = 0; l < c->layer_count; l++) {
        const uint32_t q = seq->layers[l].quantized, first = seq->page_index[j] * c->page_size;
        valid[(size_t)seq->pages[j] * c->layer_count + l] = q <= first ? 0 : q - first < c->page_size ? q - first : c->page_size;
      }
  }
  kvq_status st = KVQ_OK;
  const uint32_t used = kvq_get_u32(r);
  if (used != c->max_pages - cache->free_count) st = bad(ctx, "page section does not match the page tables");
  uint32_t previous = 0;
  const uint8_t *slots = st == KVQ_OK ? kvq_get_bytes(r, (uint64_t)used * 4) : NULL;
  for (uint32_t k = 0; slots && k < used && st == KVQ_OK; k++) {
    const uint32_t p = (uint32_t)slots[4 * k] | (uint32_t)slots[4 * k + 1] << 8 | (uint32_t)slots[4 * k + 2] << 16 |
                       (uint32_t)slots[4 * k + 3] << 24;
    if (p >= c->max_pages || !page_owner[p] || (k > 0 && p <= previous)) st = bad(ctx, "page section lists pages that no sequence owns");
    previous = p;
  }
  if (st == KVQ_OK && !slots) st = bad(ctx, "page section too short");
  char why[256];
  for (uint32_t k = 0; k < used && st == KVQ_OK; k++) {
    const uint32_t p = (uint32_t)slots[4 * k] | (uint32_t)slots[4 * k + 1] << 8 | (uint32_t)slots[4 * k + 2] << 16 |
                       (uint32_t)slots[4 * k + 3] << 24;
    for (uint32_t l = 0; l < c->layer_count && st == KVQ_OK; l++)
      for (int s = 0; s < 2 && st == KVQ_OK; s++) {
        const kvq_side_layout *layout = &cache->storage[l].side[s].layout;
        const uint8_t *img = kvq_get_bytes(r, layout->page_bytes);
        if (!img) st = bad(ctx, "page section too short");
        else if (kvq_page_image_check(layout, img, valid[(size_t)p * c->layer_count + l], why, sizeof why) != 0)
          st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: page %u, layer %u, %s: %s", p, l, s ? "values" : "keys", why);
        else if ((st = be->ops->buffer_write(be, cache->storage[l].pages[s], (uint64_t)p * layout->page_bytes, img,
                                             layout->page_bytes)) != KVQ_OK)
          st = kvq_fail_backend(ctx, st, "loading pages");
      }
  }
  free(valid);
  if (st == KVQ_OK && !kvq_section_finished(r)) st = bad(ctx, "page section has the wrong length");
  return st;
}

/* The context's load limit for a file of `size` bytes: its own, or the automatic one (kvq.h). */
static uint64_t load_limit(const kvq_context *ctx, size_t size) {
  if (ctx->load_limit) return ctx->load_limit;
  const uint64_t scaled = (uint64_t)size > UINT64_MAX / KVQ_LOAD_LIMIT_PER_FILE_BYTE ? UINT64_MAX
                                                                                    : (uint64_t)size * KVQ_LOAD_LIMIT_PER_FILE_BYTE;
  return scaled > KVQ_LOAD_LIMIT_FLOOR ? scaled : KVQ_LOAD_LIMIT_FLOOR;
}

static kvq_status load_call(kvq_context *ctx, const void *buffer, size_t size, kvq_cache **out) {
  if (!buffer || !out) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_load: buffer or out is NULL");
  ctx->load_work = (kvq_load_work){0, 0};
  uint32_t flags, sections;
  kvq_reader file;
  kvq_status st = kvq_file_open(ctx, buffer, size, KVQ_FILE_MAGIC, "cache", "kvq_cache_load", &flags, &sections, &file);
  if (st != KVQ_OK) return st;
  if (flags & ~FLAG_POLICY) return bad(ctx, "unknown flags in the header (a newer kvq wrote this file?)");
  if (sections != (flags & FLAG_POLICY ? 6u : 5u)) return bad(ctx, "wrong number of sections");

  /* CONF */
  kvq_reader r;
  if (!kvq_next_section(&file, KVQ_TAG_CONF, &r)) return bad(ctx, "expected the config section");
  kvq_cache_config config;
  kvq_layer_config *layers = NULL;
  if (kvq_get_config(&r, &config, &layers) != 0 || !kvq_section_finished(&r)) {
    free(layers);
    return bad(ctx, "malformed config section");
  }
  char why[512];
  st = kvq_config_validate(&config, why, sizeof why);
  uint64_t bytes = 0;
  if (st == KVQ_OK && (kvq_cache_config_bytes(&config, &bytes) != KVQ_OK || bytes > KVQ_MAX_CACHE_BYTES)) {
    snprintf(why, sizeof why, "the cache would need more than 2^46 bytes");
    st = KVQ_ERROR_OUT_OF_RANGE;
  }
  if (st != KVQ_OK) {
    free(layers);
    return kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: invalid config: %s", why);
  }
  /* The caller's cap on what an untrusted file may make kvq reserve, before anything is allocated
   * (kvq_context_set_load_limit): a configuration's capacity is not bounded by the file's size. */
  const uint64_t limit = load_limit(ctx, size);
  if (bytes > limit) {
    free(layers);
    return kvq_fail(ctx, KVQ_ERROR_OUT_OF_RANGE,
                    "kvq_cache_load: the file's configuration would allocate %llu bytes, above this context's load limit of "
                    "%llu (a %zu-byte file; kvq_context_set_load_limit raises it)",
                    (unsigned long long)bytes, (unsigned long long)limit, size);
  }
  kvq_cache *cache = NULL;
  st = kvq_cache_build(ctx, &config, &cache); /* with its matrices: the file's must equal them */
  free(layers);
  if (st != KVQ_OK) return st;
  const uint32_t L = config.layer_count;
  uint8_t *page_owner = NULL;

  /* MATX: every matrix and codebook the layers need, once each, each with a matching SHA-256 */
  if (!kvq_next_section(&file, KVQ_TAG_MATX, &r)) {
    st = bad(ctx, "expected the matrix section");
    goto fail;
  }
  {
    float **dest = malloc(sizeof(float *) * L * 2 * KVQ_SIDE_FIXED);
    int *ready = malloc(sizeof(int) * L * 2);
    if (!dest || !ready) st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory");
    for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
      for (int s = 0; s < 2; s++) {
        ready[l * 2 + s] = cache->storage[l].learned[s];
        for (int i = 0; i < KVQ_SIDE_FIXED; i++) dest[(l * 2 + s) * KVQ_SIDE_FIXED + i] = cache->storage[l].fixed_host[s][i];
      }
    if (st == KVQ_OK) st = kvq_get_fixed(ctx, cache, &r, 0, dest, ready, "kvq_cache_load");
    for (uint32_t l = 0; l < L && st == KVQ_OK; l++)
      for (int s = 0; s < 2; s++) cache->storage[l].learned[s] = ready[l * 2 + s];
    free(dest);
    free(ready);
    if (st != KVQ_OK) goto fail;
  }
  if ((st = kvq_upload_fixed(cache)) != KVQ_OK) goto fail;

  /* SEQS, PAGE */
  page_owner = calloc(config.max_pages, 1);
  if (!page_owner) {
    st = kvq_fail(ctx, KVQ_ERROR_OUT_OF_MEMORY, "kvq_cache_load: out of host memory");
    goto fail;
  }
  if (!kvq_next_section(&file, KVQ_TAG_SEQS, &r)) {
    st = bad(ctx, "expected the sequence section");
    goto fail;
  }
  if ((st = load_sequences(cache, &r, page_owner, (flags & FLAG_POLICY) != 0)) != KVQ_OK) goto fail;
  for (uint32_t l = 0; l < L; l++) /* tokens are only ever coded with learned codebooks */
    for (uint32_t slot = 0; slot < config.max_sequences; slot++)
      if (cache->seqs[slot].live && cache->seqs[slot].layers[l].tokens > 0 &&
          (!cache->storage[l].learned[0] || !cache->storage[l].learned[1])) {
        st = bad(ctx, "a layer holds tokens but its codebooks are not learned");
        goto fail;
      }
  if (flags & FLAG_POLICY) {
    if (!kvq_next_section(&file, KVQ_TAG_PLCY, &r)) {
      st = bad(ctx, "expected the policy section");
      goto fail;
    }
    if ((st = kvq_get_policy_section(cache, &r)) != KVQ_OK) goto fail;
    if (!kvq_section_finished(&r)) {
      st = bad(ctx, "policy section has the wrong length");
      goto fail;
    }
  }
  if (!kvq_next_section(&file, KVQ_TAG_PAGE, &r)) {
    st = bad(ctx, "expected the page section");
    goto fail;
  }
  if ((st = load_pages(cache, &r, page_owner)) != KVQ_OK) goto fail;

  /* WIND */
  kvq_backend *be = ctx->backend;
  if (!kvq_next_section(&file, KVQ_TAG_WIND, &r)) {
    st = bad(ctx, "expected the window section");
    goto fail;
  }
  for (uint32_t slot = 0; slot < config.max_sequences && st == KVQ_OK; slot++) {
    const kvq_sequence *seq = &cache->seqs[slot];
    if (!seq->live) continue;
    for (uint32_t l = 0; l < L && st == KVQ_OK; l++) {
      const kvq_layer_config *lc = &cache->layers[l];
      const uint64_t tb = kvq_token_bytes(config.input_dtype, lc->kv_heads, lc->head_dim);
      const uint64_t ring_offset = kvq_ring_offset(cache, l, slot);
      for (int s = 0; s < 2 && st == KVQ_OK; s++)
        for (uint32_t t = seq->layers[l].ring_start; t < seq->layers[l].tokens && st == KVQ_OK; t++) {
          const uint8_t *tok = kvq_get_bytes(&r, tb);
          if (!tok) st = bad(ctx, "window section too short");
          else if (kvq_check_tokens(ctx, &cache->storage[l].side[s].layout, config.input_dtype, tok, 1, "kvq_cache_load window", t) != KVQ_OK)
            st = kvq_fail(ctx, KVQ_ERROR_BAD_FORMAT, "kvq_cache_load: window token %u of layer %u cannot be stored", t, l);
          else if ((st = be->ops->buffer_write(be, cache->storage[l].ring[s], ring_offset + (t % cache->ring_capacity) * tb,
                                               tok, tb)) != KVQ_OK)
            st = kvq_fail_backend(ctx, st, "loading the window");
        }
    }
  }
  if (st == KVQ_OK && !kvq_section_finished(&r)) st = bad(ctx, "window section has the wrong length");
  if (st == KVQ_OK && file.pos != file.size) st = bad(ctx, "bytes after the last section");
  if (st == KVQ_OK && (st = be->ops->finish(be)) != KVQ_OK) st = kvq_fail_backend(ctx, st, "loading");
fail:
  free(page_owner);
  if (st != KVQ_OK) { /* nothing of a refused file stays */
    kvq_cache_destroy(cache);
    return st;
  }
  kvq_clear_error(ctx);
  *out = cache;
  return KVQ_OK;
}

kvq_status kvq_cache_load_from_memory(kvq_context *ctx, const void *buffer, size_t size, kvq_cache **out) {
  if (out) *out = NULL;
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  kvq_call_begin_parts(ctx); /* every upload of the file's contents: one submission */
  return kvq_call_end_waiting(ctx, load_call(ctx, buffer, size, out));
}

kvq_status kvq_cache_load(kvq_context *ctx, const char *path, kvq_cache **out) {
  if (out) *out = NULL;
  if (!ctx) return KVQ_ERROR_INVALID_ARGUMENT;
  if (!path || !out) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_load: path or out is NULL");
  if (!*path) return kvq_fail(ctx, KVQ_ERROR_INVALID_ARGUMENT, "kvq_cache_load: path is empty");
  uint8_t *data = NULL;
  size_t size = 0;
  kvq_status st = kvq_file_read(ctx, path, &data, &size, "kvq_cache_load");
  if (st == KVQ_OK) st = kvq_cache_load_from_memory(ctx, data, size, out);
  free(data);
  return st;
}
