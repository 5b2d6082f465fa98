/* Caller device outputs put back after a failed call, on a backend that runs its work as it is
 * issued (core/output_undo.c). */
#ifndef KVQ_CORE_OUTPUT_UNDO_H
#define KVQ_CORE_OUTPUT_UNDO_H

#include "internal.h"

typedef struct kvq_saved_output kvq_saved_output;

/* What a call saved of its device outputs: zero-initialized before the call, filled by
 * kvq_output_undo_save, ended (restored or released) by kvq_output_undo_end. */
typedef struct kvq_output_undo {
  kvq_context *ctx;        /* NULL: nothing saved */
  kvq_buffer *saved;       /* the cache's KVQ_SCRATCH_SAVED_OUTPUTS, holding the spans */
  kvq_saved_output *spans; /* one per device output, `count` of them imported */
  size_t count;
} kvq_output_undo;

/* Whether a failed call could leave `t` written, so that kvq_output_undo_save saves it: a device
 * tensor on a backend without KVQ_BACKEND_RECORDS. */
int kvq_output_undo_needed(const kvq_context *ctx, const kvq_tensor *t);

/* Copies the bytes each tensor of `outputs` that kvq_output_undo_needed names spans (NULL entries
 * skipped) into the cache's scratch; called before the call writes any output. Nothing to do on a
 * backend that records (Vulkan: a failed call's writes never run). A failure here has written no
 * output (the message is in the context) and leaves nothing to end. Not thread-safe: the cache's. */
kvq_status kvq_output_undo_save(kvq_cache *cache, const kvq_tensor *const *outputs, size_t count, kvq_output_undo *undo);

/* Ends what kvq_output_undo_save began, after kvq_call_end (whose own failure counts): with `status`
 * an error, copies the saved bytes back over the outputs (after everything the call issued, in stream
 * order) and waits for them; then frees what was saved. Returns `status`; a copy back, or its wait, that
 * fails too (a second failure) leaves outputs as the failed call left them and returns
 * KVQ_ERROR_DEVICE_LOST (kvq_undo_failed). A lost device's outputs are not copied to. */
kvq_status kvq_output_undo_end(kvq_output_undo *undo, kvq_status status);

#endif
