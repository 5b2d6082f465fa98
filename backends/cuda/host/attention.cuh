// The CUDA backend's unfused attention jobs: SCORE (kvq_cuda_score), SOFTMAX (kvq_cuda_softmax, and
// kvq_cuda_accumulate for the H2O and Q-Hitter sums) and WEIGHTED_SUM (kvq_cuda_weighted_sum, and
// kvq_cuda_rotate where the plan sums values in a rotated space). What runs, for how many blocks and
// with how much scratch is core's plan (core/gpu_plan.h), made once per job as the Vulkan backend
// makes it (backends/vulkan/vk_attention.c); its packed metadata words go to the device through
// upload(), the rotated sums after them in the same scratch allocation. Every buffer a kernel reads or
// writes is checked against the job's extents before anything is enqueued. ATTENTION (below) runs the fused
// kernels where core's plan takes them, else these three. Part of cuda_backend.cu's
// translation unit.

kvq_status attention_buffers(cuda_backend *b, const kvq_job_attention *job, const char *what) {
  kvq_buffer *const buffers[] = {job->key_pages, job->value_pages, job->key_ring, job->value_ring, job->queries,
                                 job->prepared, job->scores, job->output, job->accumulate};
  if (!kvq_buffers_owned(&b->base, job->keys, buffers, sizeof buffers / sizeof buffers[0]) ||
      !kvq_buffers_owned(&b->base, job->values, nullptr, 0))
    return fail(b, KVQ_ERROR_INVALID_ARGUMENT, "%s: a buffer of another backend was handed to the CUDA backend", what);
  return KVQ_OK;
}

// Bytes of an fp32, fp16 or bf16 element.
uint64_t dtype_bytes(kvq_dtype dtype) { return dtype == KVQ_DTYPE_F32 ? 4u : 2u; }

// One job's plan and where its metadata (and rotated sums) lie on the device.
struct attention_run {
  kvq_gpu_attention_plan plan;
  const unsigned *meta;
  float *rotated; // plan.scratch_bytes after the metadata, or null
};

// The blocks of a kernel's units: a 1-D grid, or (x, y) past CUDA's 2^31 - 1 blocks in x (the kernels
// take either: attention.cuh, kvq_cuda_workgroup).
dim3 attention_grid(uint64_t units) {
  if (units <= 0x7fffffffu) return dim3(static_cast<unsigned>(units));
  return dim3(65536u, static_cast<unsigned>((units + 65535u) / 65536u));
}

// Bytes of one sequence's slots, rows or ring the kernels reach, checked against a buffer.
kvq_status check_side(cuda_backend *b, const kvq_job_attention *job, const kvq_side_desc *side, kvq_buffer *pages,
                      kvq_buffer *ring, const kvq_gpu_attention_plan &plan, const char *what) {
  const kvq_side_layout *s = &side->layout;
  kvq_status st = KVQ_OK;
  if (plan.pages && !pages) return fail(b, KVQ_ERROR_INTERNAL, "%s: the job lists pages but has no page pool", what);
  for (uint64_t p = 0; st == KVQ_OK && p < plan.pages; p++)
    st = check_range(b, pages, static_cast<uint64_t>(job->page_slots[p]) * s->page_bytes, s->page_bytes, "an attention page");
  const uint64_t esize = dtype_bytes(job->window_dtype);
  for (uint32_t i = 0; st == KVQ_OK && i < job->seq_count; i++) {
    const kvq_attention_seq *q = &job->seqs[i];
    if (q->window == 0) continue;
    if (q->ring_capacity == 0 || q->window > q->ring_capacity)
      st = fail(b, KVQ_ERROR_INTERNAL, "%s: sequence %u has a window of %u tokens in a ring of %u", what, i, q->window,
                q->ring_capacity);
    else
      st = check_range(b, ring, q->ring_offset, static_cast<uint64_t>(q->ring_capacity) * s->kv_heads * s->head_dim * esize,
                       "an attention ring");
  }
  return st;
}

// Plans the job, checks every buffer the kernels of `kernels` (KVQ_PLAN_* bits) reach, uploads the
// metadata and, with `rotated`, places the plan's rotated sums: all before anything is launched.
// RUN_FUSED: the fused kernels where the plan takes them (the plan's flash scratch after the metadata).
enum : unsigned { RUN_SCORE = 1u, RUN_SOFTMAX = 2u, RUN_WEIGHTED_SUM = 4u, RUN_FUSED = 8u };
kvq_status attention_prepare(cuda_backend *b, const kvq_job_attention *job, unsigned kernels, const char *what,
                             attention_run *run) {
  *run = attention_run{};
  kvq_status st = attention_buffers(b, job, what);
  if (st != KVQ_OK) return st;
  if (!job->keys || !job->values || job->query_heads == 0 || job->query_heads % job->keys->layout.kv_heads ||
      job->keys->layout.kv_heads != job->values->layout.kv_heads || job->alive_words * 32u < job->keys->layout.page_size ||
      (job->window_dtype != KVQ_DTYPE_F32 && job->window_dtype != KVQ_DTYPE_F16 && job->window_dtype != KVQ_DTYPE_BF16))
    return fail(b, KVQ_ERROR_INTERNAL, "%s: a job of %u query heads over %u kv heads, %u mask words, window dtype %d", what,
                job->query_heads, job->keys ? job->keys->layout.kv_heads : 0u, job->alive_words,
                static_cast<int>(job->window_dtype));
  if (!known_method(job->keys->layout.method) || !known_method(job->values->layout.method))
    return unknown_method(b, what, !known_method(job->keys->layout.method) ? job->keys->layout.method : job->values->layout.method);
  char why[200];
  st = kvq_gpu_plan_attention(job, (kernels & RUN_FUSED) != 0, &run->plan, why, sizeof why);
  if (st != KVQ_OK) return fail(b, st, "%s: %s", what, why);
  const kvq_gpu_attention_plan &plan = run->plan;
  const uint32_t H = job->query_heads, d_keys = job->keys->layout.head_dim, d_values = job->values->layout.head_dim;
  const uint32_t pf = kvq_cuda_prepared_floats(side_of(job->keys));
  for (uint32_t i = 0; st == KVQ_OK && i < job->seq_count; i++) {
    const kvq_attention_seq *q = &job->seqs[i];
    const uint64_t n = static_cast<uint64_t>(q->quantized) + q->window, rows_end = static_cast<uint64_t>(q->query_first) + q->query_count;
    if (q->query_count == 0) continue;
    st = check_range(b, job->scores, q->score_offset * 4, q->query_count * H * n * 4, "an attention sequence's scores");
    if (st == KVQ_OK && (kernels & RUN_SCORE)) {
      st = check_range(b, job->queries, 0, rows_end * H * d_keys * 4, "an attention sequence's queries");
      if (st == KVQ_OK && pf) st = check_range(b, job->prepared, 0, rows_end * H * pf * 4, "an attention sequence's prepared queries");
    }
    if (st == KVQ_OK && (kernels & RUN_SOFTMAX) && job->accumulate)
      st = check_range(b, job->accumulate, q->accumulate_offset * 4, n * 4, "an attention sequence's probability sums");
    if (st == KVQ_OK && (kernels & RUN_WEIGHTED_SUM))
      st = check_range(b, job->output, 0, rows_end * H * d_values * 4, "an attention sequence's outputs");
  }
  if (st == KVQ_OK && (kernels & RUN_SCORE)) st = check_side(b, job, job->keys, job->key_pages, job->key_ring, plan, "score");
  if (st == KVQ_OK && (kernels & RUN_WEIGHTED_SUM))
    st = check_side(b, job, job->values, job->value_pages, job->value_ring, plan, "weighted sum");
  std::vector<unsigned> words;
  if (st == KVQ_OK && !reserve(words, static_cast<size_t>(plan.meta_words))) st = fail(b, KVQ_ERROR_OUT_OF_MEMORY, "out of host memory");
  if (st == KVQ_OK) st = enter(b);
  if (st != KVQ_OK) return st;
  words.resize(static_cast<size_t>(plan.meta_words));
  kvq_gpu_pack_attention(job, &plan, words.data());
  // the rotated sums follow the metadata (16-byte aligned) in the one scratch allocation
  const size_t meta_bytes = (words.size() * sizeof(unsigned) + 15) / 16 * 16;
  // the plan's scratch: the rotated sums of the unfused weighted sum, or the fused kernels' splits
  const uint64_t rotated_bytes = ((kernels & RUN_WEIGHTED_SUM) && plan.rotated_sums) || plan.fused ? plan.scratch_bytes : 0;
  if (rotated_bytes > SIZE_MAX - meta_bytes) return fail(b, KVQ_ERROR_DEVICE_MEMORY, "%s: scratch of %llu bytes", what,
                                                         static_cast<unsigned long long>(rotated_bytes));
  st = scratch(b, meta_bytes + static_cast<size_t>(rotated_bytes));
  const void *meta = nullptr;
  if (st == KVQ_OK) st = upload(b, words.data(), words.size() * sizeof(unsigned), &meta);
  run->meta = static_cast<const unsigned *>(meta);
  run->rotated = rotated_bytes ? reinterpret_cast<float *>(b->scratch + meta_bytes) : nullptr;
  return st;
}

kvq_cuda_attention attention_constants(const kvq_job_attention *job, const kvq_side_desc *side) {
  kvq_cuda_attention a{};
  a.side = side_of(side);
  a.query_heads = job->query_heads;
  a.alive_words = job->alive_words;
  a.window_dtype = static_cast<unsigned>(job->window_dtype); // kvq_dtype's numbers are KVQ_LAYOUT_F32 / F16 / BF16
  a.scale = job->scale;
  return a;
}

template <class T> T *at(kvq_buffer *buffer) { return buffer ? reinterpret_cast<T *>(buffer->ptr) : nullptr; }

// One unfused job called on its own: its plan and metadata (attention_prepare), then its kernels.
template <class Launch>
kvq_status run_alone(kvq_backend *backend, const kvq_job_attention *job, unsigned kernels, const char *what, Launch launch) {
  cuda_backend *b = as_cuda(backend);
  attention_run run;
  const kvq_status st = attention_prepare(b, job, kernels, what, &run);
  return st != KVQ_OK ? st : launch(b, job, run);
}

// The unfused kernels of a prepared run (attention_prepare), one job each; cuda_score, cuda_softmax and
// cuda_weighted_sum prepare their own run, cuda_attention one run for all three.
kvq_status launch_score(cuda_backend *b, const kvq_job_attention *job, const attention_run &run) {
  if (run.plan.units[KVQ_PLAN_SCORE] == 0) return KVQ_OK;
  const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_score, attention_grid(run.plan.units[KVQ_PLAN_SCORE]), dim3(KVQ_CUDA_ATTENTION_THREADS),
                                        0, b->stream, attention_constants(job, job->keys), run.meta,
                                        static_cast<const unsigned *>(at<unsigned>(job->key_pages)), fixed(job->keys, 0),
                                        fixed(job->keys, 1), static_cast<const void *>(at<unsigned char>(job->key_ring)),
                                        static_cast<const float *>(at<float>(job->queries)),
                                        static_cast<const float *>(at<float>(job->prepared)), at<float>(job->scores));
  return launched(b, e, "the SCORE kernel (kvq_cuda_score)");
}

kvq_status cuda_score(kvq_backend *backend, const kvq_job_attention *job) {
  return run_alone(backend, job, RUN_SCORE, "score", launch_score);
}

kvq_status launch_softmax(cuda_backend *b, const kvq_job_attention *job, const attention_run &run) {
  kvq_status st = KVQ_OK;
  const kvq_cuda_attention a = attention_constants(job, job->keys);
  if (st == KVQ_OK && run.plan.units[KVQ_PLAN_SOFTMAX]) {
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_softmax, attention_grid(run.plan.units[KVQ_PLAN_SOFTMAX]),
                                          dim3(KVQ_CUDA_ATTENTION_THREADS), 0, b->stream, a, run.meta, at<float>(job->scores));
    st = launched(b, e, "the SOFTMAX kernel (kvq_cuda_softmax)");
  }
  if (st == KVQ_OK && job->accumulate && run.plan.units[KVQ_PLAN_ACCUMULATE]) {
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_accumulate, attention_grid(run.plan.units[KVQ_PLAN_ACCUMULATE]),
                                          dim3(KVQ_CUDA_ATTENTION_THREADS), 0, b->stream, a, run.meta,
                                          static_cast<const float *>(at<float>(job->scores)), at<float>(job->accumulate));
    st = launched(b, e, "the ACCUMULATE kernel (kvq_cuda_accumulate)");
  }
  return st;
}

kvq_status cuda_softmax(kvq_backend *backend, const kvq_job_attention *job) {
  return run_alone(backend, job, RUN_SOFTMAX, "softmax", launch_softmax);
}

kvq_status launch_weighted_sum(cuda_backend *b, const kvq_job_attention *job, const attention_run &run) {
  kvq_status st = KVQ_OK;
  const kvq_cuda_attention a = attention_constants(job, job->values);
  if (st == KVQ_OK && run.plan.rotated_sums && !run.rotated && run.plan.units[KVQ_PLAN_WEIGHTED_SUM])
    st = fail(b, KVQ_ERROR_INTERNAL, "weighted sum: rotated sums without scratch");
  if (st == KVQ_OK && run.plan.units[KVQ_PLAN_WEIGHTED_SUM]) {
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_weighted_sum, attention_grid(run.plan.units[KVQ_PLAN_WEIGHTED_SUM]),
                                          dim3(KVQ_CUDA_ATTENTION_THREADS), 0, b->stream, a, run.meta,
                                          static_cast<const unsigned *>(at<unsigned>(job->value_pages)), fixed(job->values, 0),
                                          fixed(job->values, 1), static_cast<const void *>(at<unsigned char>(job->value_ring)),
                                          static_cast<const float *>(at<float>(job->scores)), at<float>(job->output), run.rotated);
    st = launched(b, e, "the WEIGHTED_SUM kernel (kvq_cuda_weighted_sum)");
  }
  if (st == KVQ_OK && run.plan.rotated_sums && run.plan.units[KVQ_PLAN_ROTATE]) {
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_rotate, attention_grid(run.plan.units[KVQ_PLAN_ROTATE]),
                                          dim3(KVQ_CUDA_ATTENTION_THREADS), 0, b->stream, a, run.meta, fixed(job->values, 0),
                                          fixed(job->values, 1), run.rotated, at<float>(job->output));
    st = launched(b, e, "the ROTATE kernel (kvq_cuda_rotate)");
  }
  return st;
}

kvq_status cuda_weighted_sum(kvq_backend *backend, const kvq_job_attention *job) {
  return run_alone(backend, job, RUN_WEIGHTED_SUM, "weighted sum", launch_weighted_sum);
}

// The combine's block (kernels/flash.cuh): 8 groups of 64 threads sharing the splits on a GPU; one
// group in the emulated backend (tests without a GPU), where every thread is a fiber and 512-thread
// blocks made gpu_cuda_emulated's ThreadSanitizer run 5x slower (65 -> 353 s) for no other check:
// tests/cuda_attention runs the combine with both, over many splits.
#if defined(KVQ_CUDA_EMU)
#define KVQ_CUDA_COMBINE_LAUNCH_THREADS KVQ_CUDA_ATTENTION_THREADS
#else
#define KVQ_CUDA_COMBINE_LAUNCH_THREADS KVQ_CUDA_COMBINE_THREADS
#endif

// ATTENTION: the fused split-token kernels (kernels/flash.cuh) where the plan takes them, one
// kvq_cuda_flash launch (logits and value sums of every split) and one kvq_cuda_flash_combine (then
// kvq_cuda_rotate where the values sum rotated, and with the H2O / Q-Hitter sums
// kvq_cuda_flash_normalize and kvq_cuda_flash_accumulate); else,
// as on Vulkan, the three unfused kernels above on the same plan and metadata.
kvq_status cuda_attention(kvq_backend *backend, const kvq_job_attention *job) {
  cuda_backend *b = as_cuda(backend);
  attention_run run;
  kvq_status st = attention_prepare(b, job, RUN_SCORE | RUN_SOFTMAX | RUN_WEIGHTED_SUM | RUN_FUSED, "attention", &run);
  if (st != KVQ_OK) return st;
  if (!run.plan.fused) {
    st = launch_score(b, job, run);
    if (st == KVQ_OK) st = launch_softmax(b, job, run);
    if (st == KVQ_OK) st = launch_weighted_sum(b, job, run);
    return st;
  }
  float *splits = run.rotated; // the plan's scratch (attention_prepare places it after the metadata)
  if (run.plan.scratch_bytes && !splits) return fail(b, KVQ_ERROR_INTERNAL, "attention: a fused plan without scratch");
  // values summed rotated (PolarQuant): the combine leaves the rotated page sums past the flash
  // scratch, for kvq_cuda_rotate
  float *const rotated = run.plan.rotated_sums && splits ? splits + run.plan.rotated_at : nullptr;
  const kvq_cuda_attention keys = attention_constants(job, job->keys), values = attention_constants(job, job->values);
  if (run.plan.units[KVQ_PLAN_FLASH]) {
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_flash, attention_grid(run.plan.units[KVQ_PLAN_FLASH]), dim3(KVQ_CUDA_ATTENTION_THREADS),
                                          0, b->stream, keys, values.side, run.meta,
                                          static_cast<const unsigned *>(at<unsigned>(job->key_pages)), fixed(job->keys, 0),
                                          fixed(job->keys, 1), static_cast<const void *>(at<unsigned char>(job->key_ring)),
                                          static_cast<const unsigned *>(at<unsigned>(job->value_pages)), fixed(job->values, 0),
                                          fixed(job->values, 1), static_cast<const void *>(at<unsigned char>(job->value_ring)),
                                          static_cast<const float *>(at<float>(job->queries)),
                                          static_cast<const float *>(at<float>(job->prepared)), splits);
    st = launched(b, e, "the fused attention kernel (kvq_cuda_flash)");
  }
  if (st == KVQ_OK && run.plan.units[KVQ_PLAN_COMBINE]) {
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_flash_combine, attention_grid(run.plan.units[KVQ_PLAN_COMBINE]),
                                          dim3(KVQ_CUDA_COMBINE_LAUNCH_THREADS), 0, b->stream, values, run.meta,
                                          static_cast<const float *>(splits), at<float>(job->output), rotated);
    st = launched(b, e, "the fused attention's combine (kvq_cuda_flash_combine)");
  }
  if (st == KVQ_OK && rotated && run.plan.units[KVQ_PLAN_ROTATE]) {
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_rotate, attention_grid(run.plan.units[KVQ_PLAN_ROTATE]),
                                          dim3(KVQ_CUDA_ATTENTION_THREADS), 0, b->stream, values, run.meta, fixed(job->values, 0),
                                          fixed(job->values, 1), rotated, at<float>(job->output));
    st = launched(b, e, "the fused attention's ROTATE kernel (kvq_cuda_rotate)");
  }
  // H2O / Q-Hitter: the probability sums from the scratch, after the combine has read the split
  // sums that the normalization replaces (one stream: in order)
  if (st == KVQ_OK && job->accumulate && run.plan.units[KVQ_PLAN_SOFTMAX]) {
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_flash_normalize, attention_grid(run.plan.units[KVQ_PLAN_SOFTMAX]),
                                          dim3(KVQ_CUDA_ATTENTION_THREADS), 0, b->stream, values, run.meta, splits);
    st = launched(b, e, "the fused attention's split normalization (kvq_cuda_flash_normalize)");
  }
  if (st == KVQ_OK && job->accumulate && run.plan.units[KVQ_PLAN_ACCUMULATE]) {
    const cudaError_t e = KVQ_CUDA_LAUNCH(kvq_cuda_flash_accumulate, attention_grid(run.plan.units[KVQ_PLAN_ACCUMULATE]),
                                          dim3(KVQ_CUDA_ATTENTION_THREADS), 0, b->stream, values, run.meta,
                                          static_cast<const float *>(splits), at<float>(job->accumulate));
    st = launched(b, e, "the fused attention's probability sums (kvq_cuda_flash_accumulate)");
  }
  return st;
}
