// The CUDA backend's buffers: device memory (cudaMalloc) of kvq's own, or caller device pointers
// (buffer_import). Every operation is enqueued on the backend's stream; reads wait for their data.
// Part of cuda_backend.cu's translation unit.

// The owner check (a buffer of another backend is refused, never read as ours), then the range.
kvq_status check_range(cuda_backend *b, const kvq_buffer *buffer, uint64_t offset, uint64_t bytes, const char *what) {
  if (!kvq_buffer_owned(&b->base, buffer))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "%s: a buffer of another backend was handed to the CUDA backend", what);
  if (!buffer || offset > buffer->size || bytes > buffer->size - offset)
    return fail(b, KVQ_ERROR_INTERNAL, "%s [%llu, +%llu) lies outside a buffer of %llu bytes", what,
                static_cast<unsigned long long>(offset), static_cast<unsigned long long>(bytes),
                static_cast<unsigned long long>(buffer ? buffer->size : 0));
  return KVQ_OK;
}

kvq_status cuda_buffer_create(kvq_backend *backend, uint64_t bytes, kvq_buffer **out) {
  cuda_backend *b = as_cuda(backend);
  *out = nullptr;
  kvq_status st = enter(b);
  if (st != KVQ_OK) return st;
  kvq_buffer *buf = static_cast<kvq_buffer *>(KVQ_CUDA_HOST_ALLOC_FAILS() ? nullptr : std::calloc(1, sizeof *buf));
  if (!buf) return fail(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
  buf->base.owner = &b->base;
  buf->size = bytes;
  // whole 16-byte units, zeroed to the end, so that 16-byte loads near the end read zeros, not garbage
  const size_t rounded = bytes < 16 ? 16 : static_cast<size_t>((bytes + 15) / 16 * 16);
  void *p = nullptr;
  if (bytes > SIZE_MAX - 16) st = fail(b, KVQ_ERROR_DEVICE_MEMORY, "a buffer of %llu bytes", static_cast<unsigned long long>(bytes));
  if (st == KVQ_OK) st = check(b, cudaMalloc(&p, rounded), "cudaMalloc");
  buf->ptr = static_cast<unsigned char *>(p);
  if (st == KVQ_OK) st = check(b, cudaMemsetAsync(p, 0, rounded, b->stream), "zeroing a new buffer (cudaMemsetAsync)");
  if (st != KVQ_OK) {
    if (p) cudaFree(p);
    std::free(buf);
    return st;
  }
  *out = buf;
  return KVQ_OK;
}

// Caller memory: a CUDA device pointer of the backend's device, of at least `bytes` (the caller's
// promise: CUDA cannot tell an allocation's size from a pointer inside it). The wrapper is freed by
// buffer_destroy, the memory never.
kvq_status cuda_buffer_import(kvq_backend *backend, const kvq_device_memory *memory, uint64_t bytes, kvq_buffer **out) {
  cuda_backend *b = as_cuda(backend);
  *out = nullptr;
  if (memory->kind != KVQ_MEMORY_CUDA_DEVICE || !memory->pointer)
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "only CUDA device memory (a non-null device pointer) can be imported");
  kvq_status st = enter(b);
  if (st != KVQ_OK) return st;
  cudaPointerAttributes attributes;
  if ((st = check(b, cudaPointerGetAttributes(&attributes, memory->pointer), "cudaPointerGetAttributes")) != KVQ_OK) return st;
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "the pointer given as CUDA device memory is not device memory");
  if (attributes.device != b->device)
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "the device pointer belongs to CUDA device %d, this context runs on %d",
                attributes.device, b->device);
  kvq_buffer *buf = static_cast<kvq_buffer *>(KVQ_CUDA_HOST_ALLOC_FAILS() ? nullptr : std::calloc(1, sizeof *buf));
  if (!buf) return fail(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
  buf->base.owner = &b->base;
  buf->ptr = static_cast<unsigned char *>(memory->pointer);
  buf->size = bytes;
  buf->imported = 1;
  *out = buf;
  return KVQ_OK;
}

void cuda_buffer_destroy(kvq_backend *backend, kvq_buffer *buffer) {
  cuda_backend *b = as_cuda(backend);
  if (!buffer) return;
  if (!kvq_buffer_owned(backend, buffer)) { // not ours to free: leave it to its owner
    fail(b, KVQ_ERROR_INVALID_ARGUMENT, "a buffer of another backend was handed to the CUDA backend");
    return;
  }
  if (!buffer->imported && enter_device(b) == KVQ_OK) { // not enter: no timing span for a free
    // work in flight may still use it; a lost device frees nothing more (the context is gone). A wait
    // that failed otherwise (not sticky) still frees: cudaFree waits for the device itself.
    if (check(b, cudaStreamSynchronize(b->stream), "waiting before freeing a buffer (cudaStreamSynchronize)") == KVQ_OK ||
        !b->lost)
      cudaFree(buffer->ptr);
  }
  std::free(buffer);
}

kvq_status cuda_buffer_write(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, const void *src, uint64_t bytes) {
  cuda_backend *b = as_cuda(backend);
  kvq_status st = check_range(b, buffer, offset, bytes, "a write");
  if (st != KVQ_OK || bytes == 0 || (st = enter(b)) != KVQ_OK) return st;
  // from pageable host memory: the runtime has copied src before the call returns (src may be reused)
  st = check(b, cudaMemcpyAsync(buffer->ptr + offset, src, bytes, cudaMemcpyHostToDevice, b->stream), "cudaMemcpyAsync (write)");
  if (st == KVQ_OK) b->stats.bytes_to_device += bytes;
  return st;
}

kvq_status cuda_buffer_read(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, void *dst, uint64_t bytes) {
  cuda_backend *b = as_cuda(backend);
  kvq_status st = check_range(b, buffer, offset, bytes, "a read");
  if (st != KVQ_OK || bytes == 0 || (st = enter(b)) != KVQ_OK) return st;
  st = check(b, cudaMemcpyAsync(dst, buffer->ptr + offset, bytes, cudaMemcpyDeviceToHost, b->stream), "cudaMemcpyAsync (read)");
  if (st == KVQ_OK) st = check(b, cudaStreamSynchronize(b->stream), "waiting for a read (cudaStreamSynchronize)");
  if (st == KVQ_OK) b->stats.bytes_to_host += bytes, b->stats.waits++;
  return st;
}

// The scratch allocation, grown to `bytes` (a wait first: work in flight may read the old one).
kvq_status scratch(cuda_backend *b, size_t bytes) {
  if (bytes <= b->scratch_bytes) return KVQ_OK;
  kvq_status st = check(b, cudaStreamSynchronize(b->stream), "waiting to grow the scratch buffer (cudaStreamSynchronize)");
  if (st != KVQ_OK) return st;
  cudaFree(b->scratch);
  b->scratch = nullptr;
  b->scratch_bytes = 0;
  const size_t grown = bytes < 4096 ? 4096 : bytes;
  void *p = nullptr;
  if ((st = check(b, cudaMalloc(&p, grown), "cudaMalloc (scratch)")) != KVQ_OK) return st;
  b->scratch = static_cast<unsigned char *>(p);
  b->scratch_bytes = grown;
  return KVQ_OK;
}

kvq_status cuda_buffer_copy(kvq_backend *backend, kvq_buffer *dst, uint64_t dst_offset, kvq_buffer *src, uint64_t src_offset,
                            uint64_t bytes) {
  cuda_backend *b = as_cuda(backend);
  kvq_status st = check_range(b, dst, dst_offset, bytes, "a copy's destination");
  if (st == KVQ_OK) st = check_range(b, src, src_offset, bytes, "a copy's source");
  if (st != KVQ_OK || bytes == 0 || (st = enter(b)) != KVQ_OK) return st;
  unsigned char *to = dst->ptr + dst_offset;
  const unsigned char *from = src->ptr + src_offset;
  // CUDA's copies may not overlap: overlapping ranges go through the scratch buffer
  if (to < from + bytes && from < to + bytes) {
    if ((st = scratch(b, bytes)) != KVQ_OK) return st;
    st = check(b, cudaMemcpyAsync(b->scratch, from, bytes, cudaMemcpyDeviceToDevice, b->stream), "cudaMemcpyAsync (copy)");
    from = b->scratch;
  }
  if (st == KVQ_OK) st = check(b, cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, b->stream), "cudaMemcpyAsync (copy)");
  return st;
}

kvq_status cuda_buffer_zero(kvq_backend *backend, kvq_buffer *buffer, uint64_t offset, uint64_t bytes) {
  cuda_backend *b = as_cuda(backend);
  kvq_status st = check_range(b, buffer, offset, bytes, "a zero fill");
  if (st != KVQ_OK || bytes == 0 || (st = enter(b)) != KVQ_OK) return st;
  return check(b, cudaMemsetAsync(buffer->ptr + offset, 0, bytes, b->stream), "cudaMemsetAsync");
}

// A job's host array on the device (in the scratch buffer), ordered on the stream before its kernels.
kvq_status upload(cuda_backend *b, const void *host, size_t bytes, const void **device) {
  kvq_status st = scratch(b, bytes);
  if (st == KVQ_OK)
    st = check(b, cudaMemcpyAsync(b->scratch, host, bytes, cudaMemcpyHostToDevice, b->stream), "cudaMemcpyAsync (job metadata)");
  if (st == KVQ_OK) b->stats.bytes_to_device += bytes;
  *device = b->scratch;
  return st;
}
