// The CUDA backend's state and how CUDA errors become kvq statuses. Part of cuda_backend.cu's one
// translation unit (inside its anonymous namespace): included there only.

// A backend: kvq's or the runtime's device and stream. Work is enqueued on `stream` in submission
// order and left in flight; reads and finish wait for it (backends/backend.h's model).
struct cuda_backend {
  kvq_backend base;
  int device;
  cudaStream_t stream;
  bool owns_stream;
  bool lost;      // a sticky error was seen: every later call fails with KVQ_ERROR_DEVICE_LOST
  char lost_because[sizeof(kvq_backend::message)]; // the sentence of the failure that lost it
  bool deferred;  // inside defer / end_deferred (nothing changes: a stream never needs a flush)
  // Device copy of a job's host arrays (items, slots). One allocation, reused by every job: a job's
  // upload is ordered on the stream after the previous job's kernels, which are done reading it.
  unsigned char *scratch;
  size_t scratch_bytes;
  kvq_backend_stats stats;
  // Device time (device_time): each span of work, from the first entry point after the previous
  // span ended to the end of the public call (end_deferred), finish or device_time, is bracketed by
  // two events on the stream; ended spans wait in a ring until device_time (or a full ring) reads
  // them. Events are created when first needed and destroyed with the backend.
  static constexpr unsigned spans = 16;
  cudaEvent_t span_start[spans], span_end[spans];
  unsigned span_first, span_count; // the ended spans not read yet: span_first, ... (a ring)
  bool span_open;                  // span (span_first + span_count) % spans has started
  uint64_t device_ns;              // the time of the spans read since device_time last returned it
  // A runtime's CUcontext (kvq_cuda_device.context), made current around every entry point that
  // touches CUDA (host/context.cuh), with the driver's functions the runtime handed out; null: the
  // device's primary context, which cudaSetDevice makes current.
  CUcontext context;
  CUresult(CUDAAPI *ctx_push)(CUcontext);
  CUresult(CUDAAPI *ctx_pop)(CUcontext *);
};

cuda_backend *as_cuda(kvq_backend *backend) { return reinterpret_cast<cuda_backend *>(backend); }

// "cuda: " + the sentence, in backend->message; returns status.
KVQ_CUDA_PRINTF(3, 4) kvq_status fail(cuda_backend *b, kvq_status status, const char *format, ...) {
  const int n = std::snprintf(b->base.message, sizeof b->base.message, "cuda: ");
  va_list args;
  va_start(args, format);
  std::vsnprintf(b->base.message + n, sizeof b->base.message - static_cast<size_t>(n), format, args);
  va_end(args);
  return status;
}

// Errors after which the CUDA context is unusable (the runtime reports them to every later call):
// kvq reports the device as lost, as backends/backend.h asks.
bool sticky(cudaError_t e) {
  switch (e) {
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchFailure:
  case cudaErrorLaunchTimeout:
  case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc:
  case cudaErrorAssert:
  case cudaErrorECCUncorrectable:
  case cudaErrorContextIsDestroyed:
  case cudaErrorCudartUnloading:
  case cudaErrorDevicesUnavailable: return true;
  default: return false;
  }
}

kvq_status status_of(cudaError_t e) {
  if (e == cudaErrorMemoryAllocation) return KVQ_ERROR_DEVICE_MEMORY;
  if (sticky(e)) return KVQ_ERROR_DEVICE_LOST;
  return KVQ_ERROR_INTERNAL; // an argument kvq got wrong, or a runtime state it did not expect
}

// KVQ_OK for cudaSuccess; else the status of e, with "cuda: <what> failed: <CUDA's words> (<name>)".
kvq_status check(cuda_backend *b, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return KVQ_OK;
  const kvq_status st = status_of(e);
  const char *detail = kvq_cuda_error_detail(e);
  fail(b, st, "%s failed: %s (%s)%s%.300s", what, cudaGetErrorString(e), cudaGetErrorName(e), *detail ? ": " : "", detail);
  if (st == KVQ_ERROR_DEVICE_LOST && !b->lost) {
    b->lost = true;
    std::snprintf(b->lost_because, sizeof b->lost_because, "%s", b->base.message);
  }
  return st;
}

// What every entry point does first: a lost device stays lost, and the runtime's current device is
// per host thread, so it is set for the calling thread each time. With a runtime's CUcontext, the
// entry point's wrapper (host/context.cuh) made it current: cudaSetDevice would put the primary
// context in its place.
kvq_status enter_device(cuda_backend *b) {
  if (b->lost)
    return fail(b, KVQ_ERROR_DEVICE_LOST, "the device was lost earlier (%.200s); the cache must be recreated", b->lost_because);
  if (b->context) return KVQ_OK;
  return check(b, cudaSetDevice(b->device), "cudaSetDevice");
}

// Reads the oldest ended span (waiting for its end event) into device_ns.
kvq_status span_read(cuda_backend *b) {
  const unsigned i = b->span_first;
  float ms = 0.0f;
  kvq_status st = check(b, cudaEventSynchronize(b->span_end[i]), "waiting for a timing event (cudaEventSynchronize)");
  if (st == KVQ_OK) st = check(b, cudaEventElapsedTime(&ms, b->span_start[i], b->span_end[i]), "cudaEventElapsedTime");
  if (st != KVQ_OK) return st;
  if (ms > 0.0f) b->device_ns += static_cast<uint64_t>(static_cast<double>(ms) * 1e6);
  b->span_first = (b->span_first + 1) % cuda_backend::spans;
  b->span_count--;
  return KVQ_OK;
}

// Starts a span of device time (an event recorded on the stream) unless one is open; with the ring
// full, the oldest ended span is read first.
kvq_status span_begin(cuda_backend *b) {
  if (b->span_open) return KVQ_OK;
  kvq_status st = b->span_count == cuda_backend::spans ? span_read(b) : KVQ_OK;
  const unsigned i = (b->span_first + b->span_count) % cuda_backend::spans;
  if (st == KVQ_OK && !b->span_start[i]) st = check(b, cudaEventCreate(&b->span_start[i]), "cudaEventCreate");
  if (st == KVQ_OK && !b->span_end[i]) st = check(b, cudaEventCreate(&b->span_end[i]), "cudaEventCreate");
  if (st == KVQ_OK) st = check(b, cudaEventRecord(b->span_start[i], b->stream), "cudaEventRecord (timing)");
  b->span_open = st == KVQ_OK;
  return st;
}

// Ends the open span (an event recorded after the work enqueued in it), if any.
kvq_status span_end(cuda_backend *b) {
  if (!b->span_open) return KVQ_OK;
  b->span_open = false;
  const unsigned i = (b->span_first + b->span_count) % cuda_backend::spans;
  const kvq_status st = check(b, cudaEventRecord(b->span_end[i], b->stream), "cudaEventRecord (timing)");
  if (st == KVQ_OK) b->span_count++;
  return st;
}

// enter_device, then the device-time span that the entry point's work belongs to.
kvq_status enter(cuda_backend *b) {
  kvq_status st = enter_device(b);
  return st == KVQ_OK ? span_begin(b) : st;
}
