// The CUDA backend's TOKEN_CHECK (backends/backend.h, kvq_job_token_check): the range checks of the
// keys and values an append of caller device tensors gathered on the device (core/append.c), run
// there by kvq_cuda_token_check (kernels/token_check.cuh) into the context's flag word, so that
// device tokens are checked and then quantized without a copy to the host. Part of cuda_backend.cu's
// translation unit.

static_assert(KVQ_CUDA_CHECK_RANGE == KVQ_JOB_CHECK_RANGE, "the kernel's range bit is the job's");

kvq_status cuda_check_tokens(kvq_backend *backend, const kvq_job_token_check *job) {
  cuda_backend *b = as_cuda(backend);
  if (!kvq_buffer_owned(backend, job->src) || !kvq_buffer_owned(backend, job->flags))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "check_tokens: a buffer of another backend was handed to the CUDA backend");
  const kvq_side_layout *s = &job->side->layout;
  if (!known_method(s->method)) return unknown_method(b, "check_tokens", s->method);
  if (job->dtype != KVQ_DTYPE_F32 && job->dtype != KVQ_DTYPE_F16 && job->dtype != KVQ_DTYPE_BF16)
    return fail(b, KVQ_ERROR_INTERNAL, "check_tokens: input dtype %d", static_cast<int>(job->dtype));
  const uint64_t esize = dtype_bytes(job->dtype), vectors = static_cast<uint64_t>(job->count) * s->kv_heads;
  if (vectors == 0) return KVQ_OK;
  if (vectors * s->head_dim >= UINT32_MAX) return too_large(b, "the tokens to check");
  kvq_status st = check_range(b, job->src, job->src_offset, vectors * s->head_dim * esize, "the tokens to check");
  if (st == KVQ_OK) st = check_range(b, job->flags, job->flag_offset, 4, "a token check's flag word");
  if (st == KVQ_OK && (job->src_offset % esize || job->flag_offset % 4))
    st = fail(b, KVQ_ERROR_INTERNAL, "check_tokens: misaligned tokens (byte %llu) or flag word (byte %llu)",
              static_cast<unsigned long long>(job->src_offset), static_cast<unsigned long long>(job->flag_offset));
  if (st == KVQ_OK) st = enter(b);
  if (st != KVQ_OK) return st;
  const unsigned threads = block_threads(KVQ_CUDA_TOKEN_CHECK_THREADS); // any block size will do: a warp in the emulator
  const cudaError_t e = KVQ_CUDA_LAUNCH(
      kvq_cuda_token_check, dim3(static_cast<unsigned>((vectors + threads - 1) / threads)), dim3(threads), 0, b->stream, side_of(job->side), static_cast<const void *>(job->src->ptr + job->src_offset),
      static_cast<unsigned>(job->dtype), static_cast<unsigned>(vectors), reinterpret_cast<unsigned *>(job->flags->ptr + job->flag_offset));
  return launched(b, e, "the TOKEN_CHECK kernel (kvq_cuda_token_check)");
}
