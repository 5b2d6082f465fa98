// A runtime's own CUcontext (kvq_cuda_device.context): kvq makes it current on the calling thread for
// every entry point that touches CUDA and restores the caller's context stack afterwards, with the
// driver's cuCtxPushCurrent and cuCtxPopCurrent, which the CUDA runtime hands out
// (cudaGetDriverEntryPointByVersion): kvq never links libcuda. The runtime API then works in that
// context (CUDA uses the current context when one is current), so the backend's calls are the same
// as in the primary context, less cudaSetDevice (which would make the primary context current in its
// place: enter_device skips it). Part of cuda_backend.cu's translation unit.

// The driver's version of the two functions kvq asks for (both exist since CUDA 4.0, as the _v2 entry
// points that cuda.h names).
constexpr unsigned driver_api_version = 12000u;

kvq_status driver_failed(cuda_backend *b, CUresult r, const char *what) {
  return fail(b, KVQ_ERROR_INTERNAL, "%s failed: CUresult %d", what, static_cast<int>(r));
}

// One driver function, by name, from the runtime.
kvq_status driver_function(cuda_backend *b, const char *name, void **fn) {
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  char what[96];
  std::snprintf(what, sizeof what, "cudaGetDriverEntryPointByVersion (%s)", name);
  const kvq_status st = check(b, cudaGetDriverEntryPointByVersion(name, fn, driver_api_version, cudaEnableDefault, &found), what);
  if (st == KVQ_OK && (found != cudaDriverEntryPointSuccess || !*fn))
    return fail(b, KVQ_ERROR_UNSUPPORTED, "the CUDA driver has no %s for CUDA %u (query result %d): a runtime's CUcontext needs it",
                name, driver_api_version, static_cast<int>(found));
  return st;
}

// Takes the runtime's context: its push and pop functions first, then the context.
kvq_status context_take(cuda_backend *b, CUcontext context) {
  void *push = nullptr, *pop = nullptr;
  kvq_status st = driver_function(b, "cuCtxPushCurrent", &push);
  if (st == KVQ_OK) st = driver_function(b, "cuCtxPopCurrent", &pop);
  if (st != KVQ_OK) return st;
  b->ctx_push = reinterpret_cast<CUresult(CUDAAPI *)(CUcontext)>(push);
  b->ctx_pop = reinterpret_cast<CUresult(CUDAAPI *)(CUcontext *)>(pop);
  b->context = context;
  return KVQ_OK;
}

kvq_status context_push(cuda_backend *b) {
  const CUresult r = b->ctx_push(b->context);
  return r == CUDA_SUCCESS ? KVQ_OK : driver_failed(b, r, "making the runtime's CUcontext current (cuCtxPushCurrent)");
}

// Pops the context context_push pushed. `report`: a failure may write the message (not after the
// entry point's own failure, whose message stays).
kvq_status context_pop(cuda_backend *b, bool report) {
  CUcontext popped = nullptr;
  const CUresult r = b->ctx_pop(&popped);
  if (r == CUDA_SUCCESS && popped == b->context) return KVQ_OK;
  if (!report) return KVQ_ERROR_INTERNAL;
  if (r != CUDA_SUCCESS) return driver_failed(b, r, "restoring the caller's current context (cuCtxPopCurrent)");
  return fail(b, KVQ_ERROR_INTERNAL, "cuCtxPopCurrent found another context than the runtime's on top: something changed the "
                                     "current context during a kvq call");
}

// An entry point of the table, run with the runtime's context current (when there is one).
template <class F, F f> struct in_context;
template <class... A, kvq_status (*f)(kvq_backend *, A...)> struct in_context<kvq_status (*)(kvq_backend *, A...), f> {
  static kvq_status call(kvq_backend *backend, A... a) {
    cuda_backend *b = as_cuda(backend);
    if (!b->context) return f(backend, a...);
    kvq_status st = context_push(b);
    if (st != KVQ_OK) return st;
    st = f(backend, a...);
    const kvq_status popped = context_pop(b, st == KVQ_OK);
    return st != KVQ_OK ? st : popped;
  }
};
// Entry points without a status (buffer_destroy): run even when the push failed, so that kvq's host
// memory is freed (their CUDA calls then fail, unreported, as they would in a broken context).
template <class... A, void (*f)(kvq_backend *, A...)> struct in_context<void (*)(kvq_backend *, A...), f> {
  static void call(kvq_backend *backend, A... a) {
    cuda_backend *b = as_cuda(backend);
    const bool pushed = b->context && context_push(b) == KVQ_OK;
    f(backend, a...);
    if (pushed) context_pop(b, true);
  }
};
#define KVQ_CUDA_IN_CONTEXT(f) (&in_context<decltype(&f), &f>::call)
