// The jobs whose CUDA kernels are not written yet (issue 10): each is its own function, with the
// checks its kernel will need already done, so that wiring a kernel in is one launch where the
// KVQ_ERROR_UNSUPPORTED is. Until then a cache on this backend can be created, appended to, saved,
// loaded and dequantized, but kvq_attention, kvq_scores and codebook learning fail with the message
// below. Part of cuda_backend.cu's translation unit.

kvq_status not_written(cuda_backend *b, const char *job) {
  return fail(b, KVQ_ERROR_UNSUPPORTED, "the %s kernel is not written yet (issue 10): this job cannot run on the CUDA backend",
              job);
}

kvq_status attention_buffers(cuda_backend *b, const kvq_job_attention *job, const char *what) {
  kvq_buffer *const buffers[] = {job->key_pages, job->value_pages, job->key_ring, job->value_ring, job->queries,
                                 job->prepared, job->scores, job->output, job->accumulate};
  if (!kvq_buffers_owned(&b->base, job->keys, buffers, sizeof buffers / sizeof buffers[0]) ||
      !kvq_buffers_owned(&b->base, job->values, nullptr, 0))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "%s: a buffer of another backend was handed to the CUDA backend", what);
  return enter(b);
}

// SCORE: the key-dots kernel (kernels/key_dots.cuh) plus scaling, masks, several sequences, the ring.
kvq_status cuda_score(kvq_backend *backend, const kvq_job_attention *job) {
  cuda_backend *b = as_cuda(backend);
  const kvq_status st = attention_buffers(b, job, "score");
  return st != KVQ_OK ? st : not_written(b, "SCORE");
}

kvq_status cuda_softmax(kvq_backend *backend, const kvq_job_attention *job) {
  cuda_backend *b = as_cuda(backend);
  const kvq_status st = attention_buffers(b, job, "softmax");
  return st != KVQ_OK ? st : not_written(b, "SOFTMAX");
}

kvq_status cuda_weighted_sum(kvq_backend *backend, const kvq_job_attention *job) {
  cuda_backend *b = as_cuda(backend);
  const kvq_status st = attention_buffers(b, job, "weighted sum");
  return st != KVQ_OK ? st : not_written(b, "WEIGHTED_SUM");
}

kvq_status kmeans_buffers(cuda_backend *b, const kvq_job_kmeans *job, const char *what) {
  kvq_buffer *const buffers[] = {job->data, job->weights, job->centroids, job->assignment, job->distance};
  if (!kvq_buffers_owned(&b->base, nullptr, buffers, sizeof buffers / sizeof buffers[0]))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "%s: a buffer of another backend was handed to the CUDA backend", what);
  return enter(b);
}

kvq_status cuda_kmeans_assign(kvq_backend *backend, const kvq_job_kmeans *job) {
  cuda_backend *b = as_cuda(backend);
  const kvq_status st = kmeans_buffers(b, job, "k-means assign");
  return st != KVQ_OK ? st : not_written(b, "K-MEANS ASSIGN");
}

kvq_status cuda_kmeans_update(kvq_backend *backend, const kvq_job_kmeans *job) {
  cuda_backend *b = as_cuda(backend);
  const kvq_status st = kmeans_buffers(b, job, "k-means update");
  return st != KVQ_OK ? st : not_written(b, "K-MEANS UPDATE");
}

// CONVERT (caller tensors in place). Core uses the op for VkBuffer tensors only so far
// (core/tensor_device.c); CUDA device tensors are staged through host memory until this kernel lands
// and core sends them here.
kvq_status cuda_convert(kvq_backend *backend, const kvq_job_convert *job) {
  cuda_backend *b = as_cuda(backend);
  if (!kvq_buffer_owned(backend, job->src.buffer) || !kvq_buffer_owned(backend, job->dst.buffer) ||
      !kvq_buffer_owned(backend, job->flags))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "convert: a buffer of another backend was handed to the CUDA backend");
  const kvq_status st = enter(b);
  return st != KVQ_OK ? st : not_written(b, "CONVERT");
}
