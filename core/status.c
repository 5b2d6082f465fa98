/* Versions, status strings and the context's last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

unsigned kvq_version_number(void) { return KVQ_VERSION_NUMBER; }
const char *kvq_version(void) { return KVQ_VERSION_STRING; }

const char *kvq_status_string(kvq_status status) {
  switch (status) {
  case KVQ_OK: return "ok";
  case KVQ_ERROR_INVALID_ARGUMENT: return "invalid argument";
  case KVQ_ERROR_OUT_OF_RANGE: return "parameter out of range";
  case KVQ_ERROR_DTYPE_MISMATCH: return "dtype mismatch";
  case KVQ_ERROR_NON_FINITE: return "non-finite or unrepresentable value";
  case KVQ_ERROR_CAPACITY: return "capacity exhausted";
  case KVQ_ERROR_NOT_FOUND: return "no such sequence";
  case KVQ_ERROR_OUT_OF_MEMORY: return "out of host memory";
  case KVQ_ERROR_UNSUPPORTED: return "unsupported";
  case KVQ_ERROR_BACKEND_UNAVAILABLE: return "backend unavailable";
  case KVQ_ERROR_BUFFER_TOO_SMALL: return "buffer too small";
  case KVQ_ERROR_IO: return "i/o error";
  case KVQ_ERROR_BAD_FORMAT: return "bad format";
  case KVQ_ERROR_TRUNCATED: return "truncated data";
  case KVQ_ERROR_CHECKSUM: return "checksum mismatch";
  case KVQ_ERROR_VERSION: return "unsupported format version";
  case KVQ_ERROR_DEVICE_LOST: return "device lost";
  case KVQ_ERROR_DEVICE_MEMORY: return "out of device memory";
  case KVQ_ERROR_INTERNAL: return "internal error";
  case KVQ_ERROR_NO_CODEBOOK: return "codebooks not learned";
  }
  return "unknown status";
}

kvq_status kvq_fail(kvq_context *ctx, kvq_status status, const char *format, ...) {
  if (ctx) {
    va_list args;
    va_start(args, format);
    vsnprintf(ctx->error, sizeof ctx->error, format, args);
    va_end(args);
  }
  return status;
}

kvq_status kvq_fail_backend(kvq_context *ctx, kvq_status status, const char *what) {
  if (ctx && ctx->backend)
    return kvq_fail(ctx, status, "%s: %s (%s)", what, ctx->backend->message, kvq_status_string(status));
  return status;
}

kvq_status kvq_undo_failed(kvq_context *ctx, const char *what) {
  char first[sizeof ctx->error];
  snprintf(first, sizeof first, "%s", ctx->error); /* the call's own failure, kept at the front */
  return kvq_fail(ctx, KVQ_ERROR_DEVICE_LOST,
                  "%s; then putting back %s failed too (%s): the cache and the outputs are no longer as they were "
                  "before the call; destroy the cache and the context",
                  first, what, ctx->backend ? ctx->backend->message : "");
}

void kvq_clear_error(kvq_context *ctx) {
  if (ctx) ctx->error[0] = 0;
}
