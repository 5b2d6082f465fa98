// The CUDA backend's k-means jobs (codebook learning, core/learn.c) and CONVERT (caller tensors in
// place, core/tensor_device.c): kernels/kmeans.cuh and kernels/convert.cuh, whose launch contracts
// fix their block sizes. Every array is checked to lie in its buffer before anything is enqueued.
// Part of cuda_backend.cu's translation unit.

// Largest 1-D grid CUDA launches.
constexpr uint64_t max_grid_x = 0x7fffffffu;

kvq_status kmeans_check(cuda_backend *b, const kvq_job_kmeans *job, const char *what) {
  kvq_buffer *const buffers[] = {job->data, job->weights, job->centroids, job->assignment, job->distance};
  if (!kvq_buffers_owned(&b->base, nullptr, buffers, sizeof buffers / sizeof buffers[0]))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "%s: a buffer of another backend was handed to the CUDA backend", what);
  const uint64_t points = static_cast<uint64_t>(job->problems) * job->points;
  const uint64_t values = points * job->dims, centroid_values = static_cast<uint64_t>(job->problems) * job->clusters * job->dims;
  kvq_status st = check_range(b, job->data, 0, values * 4, "the k-means points");
  if (st == KVQ_OK) st = check_range(b, job->centroids, 0, centroid_values * 4, "the k-means centroids");
  if (st == KVQ_OK) st = check_range(b, job->assignment, 0, points * 4, "the k-means assignment");
  if (st == KVQ_OK && job->weights) st = check_range(b, job->weights, 0, static_cast<uint64_t>(job->points) * 4, "the k-means weights");
  if (st == KVQ_OK && job->distance) st = check_range(b, job->distance, 0, points * 4, "the k-means distances");
  if (st == KVQ_OK && (job->problems > 0 && job->clusters == 0))
    st = fail(b, KVQ_ERROR_INTERNAL, "%s: %u problems of no clusters", what, job->problems);
  return st == KVQ_OK ? enter(b) : st;
}

kvq_status cuda_kmeans_assign(kvq_backend *backend, const kvq_job_kmeans *job) {
  cuda_backend *b = as_cuda(backend);
  kvq_status st = kmeans_check(b, job, "k-means assign");
  const uint64_t points = static_cast<uint64_t>(job->problems) * job->points;
  if (st != KVQ_OK || points == 0) return st;
  // a block per KVQ_CUDA_KMEANS_THREADS points (grid x: points of up to 2^32 * 2^32 would pass 2^31 - 1)
  uint64_t blocks = (points + KVQ_CUDA_KMEANS_THREADS - 1) / KVQ_CUDA_KMEANS_THREADS;
  if (blocks > max_grid_x) return too_large(b, "a k-means assignment");
  const cudaError_t e =
      KVQ_CUDA_LAUNCH(kvq_cuda_kmeans_assign, dim3(static_cast<unsigned>(blocks)), dim3(KVQ_CUDA_KMEANS_THREADS), 0, b->stream,
                      job->problems, job->points, job->dims, job->clusters, static_cast<const float *>(at<float>(job->data)),
                      static_cast<const float *>(at<float>(job->centroids)), at<unsigned>(job->assignment), at<float>(job->distance));
  return launched(b, e, "the KMEANS_ASSIGN kernel (kvq_cuda_kmeans_assign)");
}

kvq_status cuda_kmeans_update(kvq_backend *backend, const kvq_job_kmeans *job) {
  cuda_backend *b = as_cuda(backend);
  kvq_status st = kmeans_check(b, job, "k-means update");
  if (st != KVQ_OK || job->problems == 0 || job->points == 0 || job->dims == 0) return st; // no points: every centroid stays
  // a block per (problem, cluster): problems in launches of at most 2^31 - 1 blocks, pointers moved on
  const uint64_t per_launch = max_grid_x / job->clusters;
  if (per_launch == 0) return too_large(b, "a k-means update");
  for (uint64_t first = 0; st == KVQ_OK && first < job->problems; first += per_launch) {
    const uint64_t count = job->problems - first < per_launch ? job->problems - first : per_launch;
    const cudaError_t e = KVQ_CUDA_LAUNCH(
        kvq_cuda_kmeans_update, dim3(static_cast<unsigned>(count * job->clusters)), dim3(KVQ_CUDA_KMEANS_THREADS), 0, b->stream,
        job->points, job->dims, job->clusters, static_cast<const float *>(at<float>(job->data) + first * job->points * job->dims),
        static_cast<const float *>(at<float>(job->weights)), static_cast<const unsigned *>(at<unsigned>(job->assignment) + first * job->points),
        at<float>(job->centroids) + first * job->clusters * job->dims);
    st = launched(b, e, "the KMEANS_UPDATE kernel (kvq_cuda_kmeans_update)");
  }
  return st;
}

// The kernel's place of a job's tensor: offsets and strides as 32-bit elements (two's complement for
// negative strides, convert.cuh), once every element is known to lie in its buffer below 2^32.
kvq_status convert_place(cuda_backend *b, const kvq_job_convert *job, const kvq_tensor_place &p, const char *what,
                         kvq_cuda_place *out) {
  if (p.dtype != KVQ_DTYPE_F32 && p.dtype != KVQ_DTYPE_F16 && p.dtype != KVQ_DTYPE_BF16)
    return fail(b, KVQ_ERROR_INTERNAL, "convert: %s of dtype %d", what, static_cast<int>(p.dtype));
  // the lowest and highest element the shape reaches
  int64_t low = static_cast<int64_t>(p.offset), high = low;
  for (int i = 0; i < 3; i++) {
    const int64_t reach = static_cast<int64_t>(job->shape[i] - 1) * p.strides[i];
    if (reach < 0) low += reach;
    else high += reach;
  }
  const uint64_t esize = dtype_bytes(p.dtype);
  if (p.offset > UINT32_MAX || low < 0 || high >= static_cast<int64_t>(UINT32_MAX)) return too_large(b, "a tensor to convert");
  kvq_status st = check_range(b, p.buffer, static_cast<uint64_t>(low) * esize, static_cast<uint64_t>(high - low + 1) * esize, what);
  if (st != KVQ_OK) return st;
  out->base = p.buffer->ptr;
  out->dtype = static_cast<unsigned>(p.dtype);
  out->offset = static_cast<unsigned>(p.offset);
  for (int i = 0; i < 3; i++) out->strides[i] = static_cast<unsigned>(static_cast<uint64_t>(p.strides[i]));
  return KVQ_OK;
}

kvq_status cuda_convert(kvq_backend *backend, const kvq_job_convert *job) {
  cuda_backend *b = as_cuda(backend);
  if (!kvq_buffer_owned(backend, job->src.buffer) || !kvq_buffer_owned(backend, job->dst.buffer) ||
      !kvq_buffer_owned(backend, job->flags))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "convert: a buffer of another backend was handed to the CUDA backend");
  const uint64_t count = static_cast<uint64_t>(job->shape[0]) * job->shape[1] * job->shape[2];
  if (count == 0) return KVQ_OK;
  if (count >= UINT32_MAX) return too_large(b, "a tensor to convert");
  kvq_cuda_place src{}, dst{};
  kvq_status st = convert_place(b, job, job->src, "the tensor to convert", &src);
  if (st == KVQ_OK) st = convert_place(b, job, job->dst, "the converted tensor", &dst);
  if (st == KVQ_OK && job->checks) {
    st = check_range(b, job->flags, job->flag_offset, 4, "the convert flag word");
    if (st == KVQ_OK && job->flag_offset % 4) st = fail(b, KVQ_ERROR_INTERNAL, "convert: a flag word at byte %llu",
                                                         static_cast<unsigned long long>(job->flag_offset));
  }
  if (st == KVQ_OK) st = enter(b);
  if (st != KVQ_OK) return st;
  unsigned *flag = job->checks ? reinterpret_cast<unsigned *>(job->flags->ptr + job->flag_offset) : nullptr;
  const cudaError_t e =
      KVQ_CUDA_LAUNCH(kvq_cuda_convert, dim3(static_cast<unsigned>((count + KVQ_CUDA_CONVERT_THREADS - 1) / KVQ_CUDA_CONVERT_THREADS)),
                      dim3(KVQ_CUDA_CONVERT_THREADS), 0, b->stream, job->shape[0], job->shape[1], job->shape[2], src, dst, job->checks, flag);
  return launched(b, e, "the CONVERT kernel (kvq_cuda_convert)");
}
