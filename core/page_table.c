/*
 * Page tables: which pool slots hold a sequence's tokens, which of those tokens are kept, and how
 * a layer of a sequence looks to jobs (internal.h: kvq_layer_view).
 *
 * Entries are in ascending page order. Pages are taken only at the end (the newest positions) and
 * removed anywhere when a policy evicted all their tokens, so page_index stays strictly ascending
 * and lookups are binary searches.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tensor.h"

kvq_status kvq_reserve_page_table(kvq_cache *cache, kvq_sequence *seq, uint32_t pages) {
  if (pages <= seq->page_capacity) return KVQ_OK;
  uint32_t capacity = seq->page_capacity ? seq->page_capacity : 8;
  while (capacity < pages) capacity = capacity > UINT32_MAX / 2 ? pages : capacity * 2;
  if (capacity > cache->config.max_pages) capacity = pages > cache->config.max_pages ? pages : cache->config.max_pages;
  const uint32_t words = cache->alive_words;
  uint32_t *grown = realloc(seq->pages, sizeof *grown * capacity);
  if (grown) seq->pages = grown;
  uint32_t *index = grown ? realloc(seq->page_index, sizeof *index * capacity) : NULL;
  if (index) seq->page_index = index;
  uint32_t *alive = index ? realloc(seq->alive, sizeof *alive * capacity * words) : NULL;
  if (alive) seq->alive = alive;
  if (!alive) return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory for a page table");
  seq->page_capacity = capacity; /* each array now holds at least `capacity` entries */
  return KVQ_OK;
}

/* cache->zeros, at least `bytes` long (zero-filled by buffer_create, never written). */
static kvq_status zeros_ready(kvq_cache *cache, uint64_t bytes) {
  kvq_backend *be = cache->ctx->backend;
  if (cache->zeros && cache->zeros_size >= bytes) return KVQ_OK;
  if (cache->zeros) be->ops->buffer_destroy(be, cache->zeros);
  cache->zeros = NULL;
  cache->zeros_size = 0;
  const kvq_status st = be->ops->buffer_create(be, bytes, &cache->zeros);
  if (st != KVQ_OK) return kvq_fail_backend(cache->ctx, st, "creating a page of zeros");
  cache->zeros_size = bytes;
  return KVQ_OK;
}

kvq_status kvq_take_pages(kvq_cache *cache, kvq_sequence *seq, uint32_t n, kvq_buffer *if_clear, uint32_t free_before) {
  kvq_backend *be = cache->ctx->backend;
  const uint32_t P = cache->config.page_size, words = cache->alive_words;
  for (uint32_t i = 0; i < n; i++) {
    /* a slot above free_before was freed by the call's evictions: it still holds its tokens if the
     * call is refused, so with a check word it is cleared only once the checks passed */
    const int guarded = if_clear && cache->free_count > free_before;
    const uint32_t slot = cache->free_pages[--cache->free_count];
    const uint32_t e = seq->page_count++;
    kvq_page_table_changed(seq, e);
    seq->pages[e] = slot;
    seq->page_index[e] = seq->page_end++;
    for (uint32_t w = 0; w < words; w++) /* every token kept */
      seq->alive[e * words + w] = P - 32 * w >= 32 ? 0xffffffffu : (1u << (P - 32 * w)) - 1u;
    for (uint32_t l = 0; l < cache->config.layer_count; l++)
      for (int s = 0; s < 2; s++) {
        const uint64_t pb = cache->storage[l].side[s].layout.page_bytes;
        kvq_status st = guarded ? zeros_ready(cache, pb)
                                : be->ops->buffer_zero(be, cache->storage[l].pages[s], (uint64_t)slot * pb, pb);
        if (st == KVQ_OK && guarded)
          st = kvq_device_copy_if_clear(cache->ctx, cache->storage[l].pages[s], (uint64_t)slot * pb, cache->zeros, 0, pb);
        if (st != KVQ_OK) return kvq_fail_backend(cache->ctx, st, "clearing a page");
      }
  }
  return KVQ_OK;
}

void kvq_page_table_changed(kvq_sequence *seq, uint32_t from) {
  seq->pt_version++;
  if (from < seq->pt_dirty_from) seq->pt_dirty_from = from;
}

void kvq_page_masks_changed(kvq_sequence *seq, uint32_t from, uint32_t to) {
  seq->pt_version++;
  if (from < seq->pt_masks_from) seq->pt_masks_from = from;
  if (to > seq->pt_masks_to) seq->pt_masks_to = to;
}

uint32_t kvq_page_entry(const kvq_sequence *seq, uint32_t index) {
  uint32_t lo = 0, hi = seq->page_count;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (seq->page_index[mid] < index) lo = mid + 1;
    else hi = mid;
  }
  return lo < seq->page_count && seq->page_index[lo] == index ? lo : UINT32_MAX;
}

int kvq_token_kept(const kvq_cache *cache, const kvq_sequence *seq, uint32_t e, uint32_t i) {
  return seq->alive[e * cache->alive_words + i / 32] >> (i % 32) & 1u;
}

void kvq_release_entry(kvq_cache *cache, kvq_sequence *seq, uint32_t e) {
  const uint32_t words = cache->alive_words, after = seq->page_count - e - 1;
  cache->free_pages[cache->free_count++] = seq->pages[e];
  kvq_page_table_changed(seq, e); /* the entries after it move down */
  memmove(seq->pages + e, seq->pages + e + 1, sizeof(uint32_t) * after);
  memmove(seq->page_index + e, seq->page_index + e + 1, sizeof(uint32_t) * after);
  memmove(seq->alive + (size_t)e * words, seq->alive + (size_t)(e + 1) * words, sizeof(uint32_t) * after * words);
  seq->page_count--;
}

void kvq_layer_view_get(const kvq_cache *cache, const kvq_sequence *seq, uint32_t layer, kvq_layer_view *view) {
  const uint32_t P = cache->config.page_size, q = seq->layers[layer].quantized;
  const uint32_t page_limit = (q + P - 1) / P; /* pages below it hold quantized tokens of this layer */
  uint32_t pages = 0;
  while (pages < seq->page_count && seq->page_index[pages] < page_limit) pages++;
  view->pages = pages;
  view->slots = pages ? (pages - 1) * P + (q - seq->page_index[pages - 1] * P) : 0;
  view->window_first = q;
  view->window = seq->layers[layer].tokens - q;
  uint32_t kept = view->window;
  for (uint32_t e = 0; e < pages; e++) {
    const uint32_t valid = e + 1 == pages ? view->slots - e * P : P;
    for (uint32_t i = 0; i < valid; i++) kept += (uint32_t)kvq_token_kept(cache, seq, e, i);
  }
  view->kept = kept;
}

void kvq_layer_view_kept(const kvq_cache *cache, const kvq_sequence *seq, const kvq_layer_view *view, uint32_t *slot,
                         uint32_t *position) {
  const uint32_t P = cache->config.page_size;
  uint32_t k = 0;
  for (uint32_t e = 0; e < view->pages; e++) {
    const uint32_t valid = e + 1 == view->pages ? view->slots - e * P : P;
    for (uint32_t i = 0; i < valid; i++) {
      if (!kvq_token_kept(cache, seq, e, i)) continue;
      if (slot) slot[k] = e * P + i;
      if (position) position[k] = seq->page_index[e] * P + i;
      k++;
    }
  }
  for (uint32_t w = 0; w < view->window; w++, k++) {
    if (slot) slot[k] = view->slots + w;
    if (position) position[k] = view->window_first + w;
  }
}

kvq_status kvq_cache_read_pages(kvq_cache *cache, uint32_t id, uint32_t layer, int side, void *dst, uint32_t *pages) {
  kvq_status st;
  const kvq_sequence *seq = kvq_sequence_layer_lookup(cache, id, layer, "kvq_cache_read_pages", &st);
  if (!seq) return st;
  if (side < 0 || side > 1) return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_RANGE, "kvq_cache_read_pages: side %d", side);
  kvq_layer_view view;
  kvq_layer_view_get(cache, seq, layer, &view);
  *pages = view.pages;
  if (!dst) return KVQ_OK;
  kvq_backend *be = cache->ctx->backend;
  const uint64_t pb = cache->storage[layer].side[side].layout.page_bytes;
  for (uint32_t e = 0; e < view.pages; e++) {
    st = be->ops->buffer_read(be, cache->storage[layer].pages[side], (uint64_t)seq->pages[e] * pb, (uint8_t *)dst + e * pb, pb);
    if (st != KVQ_OK) return kvq_fail_backend(cache->ctx, st, "reading pages");
  }
  return KVQ_OK;
}
