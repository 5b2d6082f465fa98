/*
 * Pages a failed append or flush wrote in place, put back.
 *
 * An append or flush quantizes into the page pool in place. Most pages it writes are new to the
 * sequence (taken from the free stack: a failure gives them back, and nobody reads them), but two kinds
 * hold what the cache was before the call:
 *   - a page an earlier kvq_flush left partly filled, which the next append or flush quantizes again
 *     whole (the window still holds its tokens, internal.h);
 *   - a page the append's own policy step evicted (the step is planned, then applied before the pages
 *     are taken), which kvq_take_pages takes again from the top of the free stack and clears in every
 *     layer; a failed append puts the evicted page back in the sequence's table.
 * On a backend that runs each operation as issued (CPU, CUDA), a failure after such a write (a host
 * allocation, the other side's job, a later layer, the call's last event) would leave the page
 * changed. Those pages are copied into scratch before the first write and copied back when the call
 * fails, after everything it issued (the stream's order on CUDA), as the window's overwritten tokens
 * are (core/append.c). Decoding one token at a time after no flush names none.
 */
#include <stdlib.h>

#include "checked.h"
#include "page_backup.h"

struct kvq_backed_page {
  uint32_t layer, slot;
  int zeros; /* put back by clearing it: nothing saved */
};

int kvq_page_backup_wanted(const kvq_context *ctx) { return !(ctx->backend->features & KVQ_BACKEND_RECORDS); }

kvq_status kvq_page_backup_add(kvq_cache *cache, kvq_page_backup *backup, uint32_t layer, uint32_t slot, int zeros) {
  for (uint32_t i = 0; i < backup->count; i++)
    if (backup->pages[i].layer == layer && backup->pages[i].slot == slot) return KVQ_OK;
  if (backup->count == backup->capacity) {
    const uint32_t capacity = backup->capacity ? 2 * backup->capacity : 8;
    kvq_backed_page *grown = realloc(backup->pages, sizeof *grown * capacity);
    if (!grown) return kvq_fail(cache->ctx, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory listing pages to keep");
    backup->pages = grown;
    backup->capacity = capacity;
  }
  backup->pages[backup->count++] = (kvq_backed_page){layer, slot, zeros};
  return KVQ_OK;
}

/* The bytes both sides of a layer's page take in the backup. */
static uint64_t page_pair_bytes(const kvq_cache *cache, uint32_t layer) {
  return kvq_size_add(cache->storage[layer].side[0].layout.page_bytes, cache->storage[layer].side[1].layout.page_bytes);
}

/* Copies every named page, side by side, between its slot and its place in the backup (`back`: into
 * the slot; a page of zeros is cleared instead, and has no place). */
static kvq_status copy_all(kvq_cache *cache, kvq_page_backup *backup, int back) {
  kvq_backend *be = cache->ctx->backend;
  uint64_t at = 0;
  for (uint32_t i = 0; i < backup->count; i++)
    for (int s = 0; s < 2; s++) {
      const kvq_backed_page *p = &backup->pages[i];
      const uint64_t pb = cache->storage[p->layer].side[s].layout.page_bytes;
      kvq_buffer *pool = cache->storage[p->layer].pages[s];
      kvq_status st = KVQ_OK;
      if (p->zeros) st = back ? be->ops->buffer_zero(be, pool, (uint64_t)p->slot * pb, pb) : KVQ_OK;
      else if (back) st = be->ops->buffer_copy(be, pool, (uint64_t)p->slot * pb, backup->saved, at, pb);
      else st = be->ops->buffer_copy(be, backup->saved, at, pool, (uint64_t)p->slot * pb, pb);
      if (st != KVQ_OK) return st;
      at += p->zeros ? 0 : pb;
    }
  return KVQ_OK;
}

kvq_status kvq_page_backup_save(kvq_cache *cache, kvq_page_backup *backup) {
  if (!backup->count) return KVQ_OK;
  uint64_t total = 0;
  for (uint32_t i = 0; i < backup->count; i++)
    if (!backup->pages[i].zeros) total = kvq_size_add(total, page_pair_bytes(cache, backup->pages[i].layer));
  /* pages of zeros only (decoding several layers): no scratch, which would stay the cache's */
  kvq_status st = total ? kvq_scratch(cache, KVQ_SCRATCH_PAGES, total, &backup->saved) : KVQ_OK;
  if (st == KVQ_OK && (st = copy_all(cache, backup, 0)) != KVQ_OK) st = kvq_fail_backend(cache->ctx, st, "keeping the pages the call overwrites");
  backup->ready = st == KVQ_OK; /* else nothing was overwritten yet: nothing to put back */
  return st;
}

kvq_status kvq_page_backup_restore(kvq_cache *cache, kvq_page_backup *backup, kvq_status status) {
  if (!backup->ready || status == KVQ_OK || status == KVQ_ERROR_DEVICE_LOST) return status;
  return copy_all(cache, backup, 1) == KVQ_OK ? status : kvq_undo_failed(cache->ctx, "the pages it overwrote");
}

void kvq_page_backup_free(kvq_page_backup *backup) {
  free(backup->pages);
  *backup = (kvq_page_backup){0};
}
