/* Pages a failed append or flush wrote in place, put back (core/page_backup.c). */
#ifndef KVQ_CORE_PAGE_BACKUP_H
#define KVQ_CORE_PAGE_BACKUP_H

#include "internal.h"

typedef struct kvq_backed_page kvq_backed_page;

/* The pages a call saved: zero-initialized before the call, filled by kvq_page_backup_add and
 * kvq_page_backup_save, ended by kvq_page_backup_restore (on failure) and kvq_page_backup_free. */
typedef struct kvq_page_backup {
  kvq_backed_page *pages; /* (layer, slot) pairs, both sides of each */
  uint32_t count, capacity;
  kvq_buffer *saved; /* the cache's KVQ_SCRATCH_PAGES, holding the copies (NULL when all are zeros) */
  int ready;         /* saved: a failure puts the pages back */
} kvq_page_backup;

/* Whether the context's backend needs the backup: one that runs each operation as it is issued (CPU,
 * CUDA). A backend that records the call (KVQ_BACKEND_RECORDS: Vulkan) runs none of a failed call's
 * writes, and must not copy back (its copy into the backup would not have run either). */
int kvq_page_backup_wanted(const kvq_context *ctx);

/* Names page slot `slot` of layer `layer` (both sides) as one the call is about to overwrite; a pair
 * named twice is kept once. With `zeros`, the caller knows the layer's bytes of the page to be zeros
 * (a page kvq_take_pages cleared that the layer has not quantized into: one another layer took):
 * nothing is copied, and a failure clears them again. Host memory only: a failure
 * (KVQ_ERROR_OUT_OF_MEMORY, with a message) changes nothing on the device. */
kvq_status kvq_page_backup_add(kvq_cache *cache, kvq_page_backup *backup, uint32_t layer, uint32_t slot, int zeros);

/* Copies the named pages into the cache's scratch, before the call writes any of them (the copies
 * are ordered before those writes on the device). Nothing to do when none is named. */
kvq_status kvq_page_backup_save(kvq_cache *cache, kvq_page_backup *backup);

/* After the call failed with `status` (its message already in the context), once everything it
 * issued: copies the saved pages back over their slots, ordered after the call's writes. Returns
 * `status`; or, when a copy back fails too, KVQ_ERROR_DEVICE_LOST (kvq_undo_failed). A lost device (`status` KVQ_ERROR_DEVICE_LOST) is
 * not copied to: its context is only good for destroying. */
kvq_status kvq_page_backup_restore(kvq_cache *cache, kvq_page_backup *backup, kvq_status status);

/* Frees the list (the scratch stays the cache's). */
void kvq_page_backup_free(kvq_page_backup *backup);

#endif
