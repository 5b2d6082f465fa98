// The CUDA backend's page jobs: QUANTIZE, DEQUANTIZE, PREPARE_QUERY. Each checks its buffers and
// items before anything is enqueued, uploads its host arrays, and launches its kernel (kernels/*.cuh,
// whose "Launch:" comments say the grid) once per batch of items. Part of cuda_backend.cu's
// translation unit.

// Threads per block: the kernels take any block size. On the GPU the kernels' own (their
// __launch_bounds__); in the emulator, where the threads take turns on one core, one warp, so that the tests
// stay fast while the threads still stride over work units and channels.
constexpr unsigned block_threads(unsigned gpu_threads) { return KVQ_CUDA_EMULATED ? 32u : gpu_threads; }

// Grid y (items, pages) is at most 65535 per launch; larger jobs launch again for the rest.
constexpr uint32_t max_grid_y = 65535u;

// std::vector's reserve without its exception: false when host memory runs out.
template <class T> bool reserve(std::vector<T> &v, size_t n) {
  if (KVQ_CUDA_HOST_ALLOC_FAILS()) return false; // a fault point, as the allocation that throws
  try {
    v.reserve(n);
    return true;
  } catch (const std::bad_alloc &) {
    return false;
  }
}

bool known_method(uint32_t method) { return method <= KVQ_LAYOUT_CQ; }

kvq_cuda_side side_of(const kvq_side_desc *desc) {
  kvq_cuda_side s{};
#define KVQ_CUDA_SIDE_COPY(name) s.name = desc->layout.name;
  KVQ_SIDE_FIELDS(KVQ_CUDA_SIDE_COPY)
#undef KVQ_CUDA_SIDE_COPY
  s.head_bytes = desc->layout.head_bytes;
  s.qjl_constant = static_cast<float>(desc->qjl_constant);
  return s;
}

const float *fixed(const kvq_side_desc *desc, int i) {
  return desc->fixed[i] ? reinterpret_cast<const float *>(desc->fixed[i]->ptr) : nullptr;
}

kvq_status unknown_method(cuda_backend *b, const char *job, uint32_t method) {
  return fail(b, KVQ_ERROR_UNSUPPORTED, "no %s kernel for layout method %u", job, method);
}

// Kernels address pools and outputs with 32-bit indices, as the Vulkan shaders do.
kvq_status too_large(cuda_backend *b, const char *what) {
  return fail(b, KVQ_ERROR_UNSUPPORTED, "%s lies beyond the 4 GiB kvq's CUDA kernels address", what);
}

kvq_status launched(cuda_backend *b, cudaError_t e, const char *kernel) {
  if (e == cudaSuccess) b->stats.submissions++;
  return check(b, e, kernel);
}

kvq_status cuda_quantize(kvq_backend *backend, const kvq_job_quantize *job) {
  cuda_backend *b = as_cuda(backend);
  const kvq_side_layout *s = &job->side->layout;
  if (!known_method(s->method)) return unknown_method(b, "quantize", s->method);
  if (job->input_dtype != KVQ_DTYPE_F32 && job->input_dtype != KVQ_DTYPE_F16 && job->input_dtype != KVQ_DTYPE_BF16)
    return fail(b, KVQ_ERROR_INTERNAL, "quantize: input dtype %d", static_cast<int>(job->input_dtype));
  if (job->count == 0) return KVQ_OK;
  if (!kvq_buffers_owned(&b->base, job->side, &job->dst, 1) || !kvq_buffer_owned(&b->base, job->errors))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "quantize: a buffer of another backend was handed to the CUDA backend");
  const uint64_t per_token = static_cast<uint64_t>(s->kv_heads) * s->head_dim;
  const uint32_t esize = job->input_dtype == KVQ_DTYPE_F32 ? 4u : 2u;
  const uint64_t error_floats = static_cast<uint64_t>(s->page_size) * s->kv_heads;
  kvq_status st = KVQ_OK;
  if (job->errors) st = check_range(b, job->errors, 0, job->count * error_floats * 4, "the quantization errors");
  std::vector<unsigned> words;
  if (st == KVQ_OK && !reserve(words, static_cast<size_t>(job->count) * KVQ_CUDA_ITEM_WORDS))
    st = fail(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
  for (uint32_t i = 0; st == KVQ_OK && i < job->count; i++) { // every item is checked before any page is written
    const kvq_quantize_item *it = &job->items[i];
    if (it->tokens == 0 || it->tokens > s->page_size || it->src_offset % esize || it->dst_offset % 4)
      st = fail(b, KVQ_ERROR_INTERNAL, "quantize item %u: %u tokens from byte %llu to byte %llu", i, it->tokens,
                static_cast<unsigned long long>(it->src_offset), static_cast<unsigned long long>(it->dst_offset));
    if (st == KVQ_OK) st = check_range(b, it->src, it->src_offset, per_token * esize * it->tokens, "a quantize item's tokens");
    if (st == KVQ_OK) st = check_range(b, job->dst, it->dst_offset, s->page_bytes, "a quantized page");
    if (st == KVQ_OK && (it->src_offset / esize + per_token * it->tokens > UINT32_MAX || it->dst_offset + s->page_bytes > UINT32_MAX))
      st = too_large(b, "a quantize item");
    words.push_back(static_cast<unsigned>(it->src_offset / esize));
    words.push_back(static_cast<unsigned>(it->dst_offset));
    words.push_back(it->tokens);
  }
  if (st == KVQ_OK) st = enter(b);
  const void *items = nullptr;
  if (st == KVQ_OK) st = upload(b, words.data(), words.size() * sizeof(unsigned), &items);
  const kvq_cuda_side side = side_of(job->side);
  // Items that share a source buffer run in one launch (the kernel takes one source pointer).
  for (uint32_t first = 0; st == KVQ_OK && first < job->count;) {
    uint32_t count = 1;
    while (first + count < job->count && count < max_grid_y && job->items[first + count].src == job->items[first].src) count++;
    float *errors = job->errors ? reinterpret_cast<float *>(job->errors->ptr) + first * error_floats : nullptr;
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_quantize, dim3(s->kv_heads, count), dim3(block_threads(KVQ_CUDA_QUANTIZE_THREADS)),
                                          kvq_cuda_decode_shared_bytes(side), b->stream, side,
                                          static_cast<const unsigned *>(items) + first * KVQ_CUDA_ITEM_WORDS,
                                          static_cast<const void *>(job->items[first].src->ptr), static_cast<unsigned>(job->input_dtype),
                                          reinterpret_cast<unsigned *>(job->dst->ptr), fixed(job->side, 0), fixed(job->side, 1), errors);
    st = launched(b, e, "the QUANTIZE kernel (kvq_cuda_quantize)");
    first += count;
  }
  return st;
}

kvq_status cuda_dequantize(kvq_backend *backend, const kvq_job_dequantize *job) {
  cuda_backend *b = as_cuda(backend);
  const kvq_side_layout *s = &job->side->layout;
  if (!known_method(s->method)) return unknown_method(b, "dequantize", s->method);
  if (job->count == 0) return KVQ_OK;
  if (!kvq_buffers_owned(&b->base, job->side, &job->pages, 1))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "dequantize: a buffer of another backend was handed to the CUDA backend");
  const uint64_t page_floats = static_cast<uint64_t>(s->page_size) * s->kv_heads * s->head_dim;
  kvq_status st = check_range(b, job->out, job->out_offset, page_floats * 4 * job->count, "dequantize output");
  if (st == KVQ_OK && job->out_offset % 4) st = fail(b, KVQ_ERROR_INTERNAL, "dequantize output at byte %llu", static_cast<unsigned long long>(job->out_offset));
  if (st == KVQ_OK && page_floats * job->count > UINT32_MAX) st = too_large(b, "the dequantize output");
  for (uint32_t i = 0; st == KVQ_OK && i < job->count; i++) {
    st = check_range(b, job->pages, static_cast<uint64_t>(job->slots[i]) * s->page_bytes, s->page_bytes, "a dequantized page");
    if (st == KVQ_OK && (static_cast<uint64_t>(job->slots[i]) + 1) * s->page_bytes > UINT32_MAX) st = too_large(b, "a dequantized page");
  }
  if (st == KVQ_OK) st = enter(b);
  const void *slots = nullptr;
  if (st == KVQ_OK) st = upload(b, job->slots, static_cast<size_t>(job->count) * sizeof(uint32_t), &slots);
  const kvq_cuda_side side = side_of(job->side);
  float *out = reinterpret_cast<float *>(job->out->ptr + job->out_offset);
  for (uint32_t first = 0; st == KVQ_OK && first < job->count; first += max_grid_y) {
    const uint32_t count = job->count - first < max_grid_y ? job->count - first : max_grid_y;
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_dequantize, dim3(s->kv_heads, count), dim3(block_threads(KVQ_CUDA_DEQUANTIZE_THREADS)),
                                          kvq_cuda_decode_shared_bytes(side), b->stream, side,
                                          static_cast<const unsigned *>(slots) + first,
                                          reinterpret_cast<const unsigned *>(job->pages->ptr), fixed(job->side, 0),
                                          fixed(job->side, 1), out + first * page_floats);
    st = launched(b, e, "the DEQUANTIZE kernel (kvq_cuda_dequantize)");
  }
  return st;
}

kvq_status cuda_prepare(kvq_backend *backend, const kvq_job_prepare *job) {
  cuda_backend *b = as_cuda(backend);
  const kvq_side_layout *s = &job->keys->layout;
  if (!known_method(s->method)) return unknown_method(b, "query preparation", s->method);
  const kvq_cuda_side side = side_of(job->keys);
  const uint32_t pf = kvq_cuda_prepared_floats(side);
  if (pf == 0 || job->rows == 0) return KVQ_OK; // the method scores the query itself
  if (!kvq_buffers_owned(&b->base, job->keys, nullptr, 0))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "query preparation: a buffer of another backend was handed to the CUDA backend");
  const uint64_t in_bytes = static_cast<uint64_t>(job->rows) * s->head_dim * 4, out_bytes = static_cast<uint64_t>(job->rows) * pf * 4;
  kvq_status st = check_range(b, job->queries, job->q_offset, in_bytes, "the queries to prepare");
  if (st == KVQ_OK) st = check_range(b, job->out, job->out_offset, out_bytes, "the prepared queries");
  if (st == KVQ_OK && (job->q_offset % 4 || job->out_offset % 4 || job->query_heads == 0 || job->query_heads % s->kv_heads))
    st = fail(b, KVQ_ERROR_INTERNAL, "a query preparation with misaligned buffers or %u query heads for %u kv heads",
              job->query_heads, s->kv_heads);
  if (st == KVQ_OK && job->rows > 0x7fffffffu) st = too_large(b, "a query preparation");
  if (st == KVQ_OK) st = enter(b);
  if (st != KVQ_OK) return st;
  const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_prepare, dim3(job->rows), dim3(block_threads(KVQ_CUDA_PREPARE_THREADS)), 0, b->stream,
                                        side, job->query_heads, reinterpret_cast<const float *>(job->queries->ptr + job->q_offset),
                                        fixed(job->keys, 0), fixed(job->keys, 1),
                                        reinterpret_cast<float *>(job->out->ptr + job->out_offset));
  return launched(b, e, "the PREPARE_QUERY kernel (kvq_cuda_prepare)");
}
