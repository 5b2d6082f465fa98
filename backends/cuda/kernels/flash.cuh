// The fused decode attention on the GPU (flash-decoding; backends/backend.h, kvq_job_attention), the
// fused plan's two kernels, every sequence of the batch in one launch each, as shaders/flash.glsl,
// flash_logits.comp, flash_values.comp and flash_combine.comp with the same plan, metadata and
// scratch (core/gpu_plan.h): a sequence's n slots are cut into splits of KVQ_FLASH_SPLIT (64)
// tokens, and each block takes one (query row r, kv head, head pass, split) with up to
// KVQ_FLASH_HEADS_PER_PASS (8) query heads of the kv head's GQA group (larger groups take more
// passes), so that each key and each value is decoded once for all of them.
//
// The host (as backends/vulkan does):
//   kvq_gpu_plan_attention(job, 1, &plan, ...)   plan.fused is 1 unless the job's flash scratch lies
//                                                past 4 GiB: then the unfused kernels (score.cuh,
//                                                softmax.cuh, weighted_sum.cuh); jobs with the H2O /
//                                                Q-Hitter sums (job->accumulate) and PolarQuant values
//                                                (plan.rotated_sums) are fused too
//   kvq_gpu_pack_attention(job, &plan, words)    plan.meta_words words, uploaded as they are (`meta`)
//   scratch                                      fp32, plan.scratch_bytes (each sequence's from its
//                                                KVQ_SEQ_SCRATCH, laid out as kvq_flash_*_at say;
//                                                with plan.rotated_sums, the rotated sums from
//                                                float plan.rotated_at)
// then, on one stream, in this order (no launch where units is 0):
//   kvq_cuda_flash<<<plan.units[KVQ_PLAN_FLASH], KVQ_CUDA_ATTENTION_THREADS, 0>>>(
//       a, values, meta, key_pages, key_fixed0, key_fixed1, key_ring, value_pages, value_fixed0,
//       value_fixed1, value_ring, queries, prepared, scratch)
//   kvq_cuda_flash_combine<<<plan.units[KVQ_PLAN_COMBINE], KVQ_CUDA_COMBINE_THREADS (512; any multiple of 64 up to it), 0>>>(
//       a, meta, scratch, output, rotated)    rotated = scratch + plan.rotated_at with rotated sums, else null
//   with plan.rotated_sums only: kvq_cuda_rotate<<<plan.units[KVQ_PLAN_ROTATE], ...>>>(a, meta,
//       value_fixed0, value_fixed1, rotated, output) (weighted_sum.cuh), a the values' constants
// and, only with job->accumulate (after the combine: the normalization overwrites what it reads),
//   kvq_cuda_flash_normalize<<<plan.units[KVQ_PLAN_SOFTMAX], KVQ_CUDA_ATTENTION_THREADS, 0>>>(
//       a, meta, scratch)
//   kvq_cuda_flash_accumulate<<<plan.units[KVQ_PLAN_ACCUMULATE], KVQ_CUDA_ATTENTION_THREADS, 0>>>(
//       a, meta, scratch, accumulate)
// Grids: (units), or any (x, y) with x * y >= units (blocks past the last unit return); blocks of
// KVQ_CUDA_ATTENTION_THREADS (= KVQ_GPU_GROUP_SIZE = KVQ_FLASH_SPLIT, 64) threads but the combine's;
// no dynamic shared memory (static shared memory: kvq_cuda_flash 22160 bytes as ptxas lays it out:
// KVQ_FLASH_HEADS_PER_PASS x 64 floats of logits, then probabilities, as many of QJL's running sums,
// QJL's tables (16 groups of 260 floats; the pass's queries for the other methods), 128 query parts
// and 32 outlier channels, the block reduction's two partials, three words per slot for the values;
// kvq_cuda_flash_combine 8 KiB: the groups' partial maxima and sums).
//
// kvq_cuda_flash: the logits pass and the values pass of Vulkan in one kernel (the same outputs).
//   a          kvq_cuda_attention: side = the keys' layout, query_heads, alive_words, window_dtype, scale
//   values     kvq_cuda_side: the values' layout (any method)
//   meta       the fused plan's metadata words
//   key_pages, key_fixed0, key_fixed1, key_ring, queries, prepared: as kvq_cuda_score's (score.cuh)
//   value_pages, value_fixed0, value_fixed1, value_ring: as kvq_cuda_weighted_sum's (weighted_sum.cuh)
//   scratch    fp32, written: for each (r, h) of the block's heads, from the sequence's KVQ_SEQ_SCRATCH,
//              with R = query_count x query_heads row-heads and row_head = r * query_heads + h:
//     kvq_flash_prob_at(n, row_head, t)       p_t = expf(x_t - m) for the split's slots t < n (0 where
//                                             masked), x_t = scale * q.k_t (kvq_cuda_key_dot, or q
//                                             with the ring's token; summed in kvq_acc, then one float
//                                             product, as SCORE)
//     kvq_flash_max_at(R, n, row_head, s)     m, the split's largest visible x (-inf: none visible)
//     kvq_flash_sum_at(R, n, row_head, s)     l = sum of the split's p_t (float, kvq_cuda_block_sum)
//     kvq_flash_out_at(R, n, d, row_head, s, c)  o_c = sum over the split's slots in order of p_t v_t[c]
//                                             (float), v_t the value method's decode or the ring's token;
//                                             PolarQuant: over the split's page slots only, v_t[c]
//                                             coordinate c of the rotated token (kvq_polar_decode_coord)
//     kvq_flash_window_at(R, n, d, row_head, s, c)  PolarQuant only: the same sum over the split's
//                                             window slots (0 where it has none)
//   Thread i of the block: first slot t = split * 64 + i (its key read once for every head of the
//   pass: QJL's sign words 16 bytes at a time into the heads' lookup tables, qjl_lut.cuh; PolarQuant's
//   coordinates and CQ's codes against each head's prepared query; the other methods' channels
//   decoded once and dotted with each head's query), then channels c = i, i + 64, ... of the split's
//   values (each value decoded once for every head).
//
// kvq_cuda_flash_combine: output ((query_first + r) * query_heads + h) * head_dim + c (fp32 `output`,
//   [rows][query_heads][head_dim]) = sum_s e^(m_s - M) o_s[c] / sum_s e^(m_s - M) l_s, M the largest
//   m_s, splits with m_s = -inf skipped; 0 where no slot of the row is visible or the sequence has
//   no slot (as the CPU and the unfused WEIGHTED_SUM; Vulkan's combine gives 0 / 0 for the first and
//   writes nothing for the second). a: query_heads and side.head_dim (the values'). An output (r, h, c) of a
//   sequence per 64 threads' lane, c fastest (KVQ_PLAN_COMBINE: 64 per block), its splits shared by
//   the block's 8 groups of 64 threads. With `rotated` (PolarQuant values): the
//   same combination of the o_s (rotated page sums) into rotated[] and of the window sums into
//   output[], at the output's element; kvq_cuda_rotate then turns rotated[] back and adds output[].
//
// The H2O / Q-Hitter sums from the flash scratch (as shaders/flash_normalize.comp and the
// accumulate_flash variant of shaders/accumulate.comp), a: query_heads:
// kvq_cuda_flash_normalize: a block per (r, h) of a sequence (KVQ_PLAN_SOFTMAX's units), its threads
//   taking every 64th split: M = the largest m_s, L = sum_s e^(m_s - M) l_s (float, the block sum),
//   then each split sum l_s replaced by f_s = e^(m_s - M) / L (0 where m_s = -inf).
// kvq_cuda_flash_accumulate: a block per slot t (KVQ_PLAN_ACCUMULATE's units), its threads taking
//   every 64th row_head: accumulate[accumulate_offset + t] = the float sum over the sequence's rows
//   and heads of p_t f_(t / 64), the probability of t (the rows in kvq_cuda_accumulate's order).
//   Nothing else of accumulate is written.
#ifndef KVQ_BACKENDS_CUDA_KERNELS_FLASH_CUH
#define KVQ_BACKENDS_CUDA_KERNELS_FLASH_CUH

#include "attention.cuh"
#include "key_dots.cuh"
#include "qjl_lut.cuh"
#include "runs.cuh"

static_assert(KVQ_FLASH_SPLIT == KVQ_CUDA_ATTENTION_THREADS, "flash.cuh: a thread per slot of a split");

// The block's (r, kv head, pass, split) from its unit in the sequence (KVQ_PLAN_FLASH, split fastest);
// false for units past the last row.
static inline __device__ bool kvq_cuda_flash_unit(const kvq_cuda_attention &a, const unsigned *meta, unsigned seq, unsigned unit,
                                                  unsigned n, unsigned &r, unsigned &kvh, unsigned &pass, unsigned &split) {
  const unsigned splits = kvq_flash_splits(n), passes = kvq_flash_passes(a.query_heads / a.side.kv_heads);
  split = unit % splits;
  pass = unit / splits % passes;
  kvh = unit / splits / passes % a.side.kv_heads;
  r = unit / splits / passes / a.side.kv_heads;
  return r < kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT);
}

// The scratch element of sequence seq's flash scratch at offset `at` (a kvq_flash_*_at).
static inline __device__ size_t kvq_cuda_flash_at(const unsigned *meta, unsigned seq, unsigned at) {
  return static_cast<size_t>(kvq_gpu_seq(meta, seq, KVQ_SEQ_SCRATCH)) + at;
}

// QJL keys of the split's quantized slots through lookup tables (qjl_lut.cuh), for each head g <
// heads of the pass: logit[g][lane] = the estimate of slot first + lane where `mine` (visible and
// quantized), else 0. Called by every thread of the block (barriers). A page segment at a time (the
// split's slots of one page: the whole split where P >= 64, else 64 / P pages): the page's outlier
// list into shared memory, then per sketch part and 128 rows, each slot's 4 sign words loaded once
// (16 bytes) for every head g: the head's 128 query parts (kvq_cuda_qjl_query_part), their tables,
// and each slot's 16 lookups added to its running sum sums[g][lane] (shared memory, each thread its
// own column: no per-thread arrays). The estimate from each part's sum as kvq_qjl_score_part's.
static inline __device__ void kvq_cuda_flash_qjl(const kvq_cuda_attention &a, const unsigned *meta, unsigned seq, unsigned kvh,
                                                 unsigned first, unsigned quantized, bool visible, unsigned heads,
                                                 const unsigned *key_pages, const float *key_fixed0, const float *key_fixed1,
                                                 const float *queries, const float *prepared, size_t row0,
                                                 float (*logit)[KVQ_FLASH_SPLIT], float (*sums)[KVQ_FLASH_SPLIT], float *lut,
                                                 float *qparts, unsigned *outliers) {
  const kvq_cuda_side &s = a.side;
  const unsigned lane = threadIdx.x, t = first + lane, P = s.page_size, d = s.head_dim, m = s.sketch_dim, mo = s.outlier_sketch_dim,
                 k = s.outliers, pf = kvq_cuda_prepared_floats(s);
  const unsigned segment = P < KVQ_FLASH_SPLIT ? P : KVQ_FLASH_SPLIT;
  const unsigned end = quantized < first + KVQ_FLASH_SPLIT ? quantized : first + KVQ_FLASH_SPLIT;
  const kvq_io page_io = {const_cast<unsigned *>(key_pages), nullptr, KVQ_LAYOUT_F32, key_fixed0, key_fixed1, nullptr};
  const auto list = [outliers](unsigned j) { return outliers[j]; };
  for (unsigned g = 0; g < heads; g++) logit[g][lane] = 0.0f;
  for (unsigned s0 = first; s0 < end; s0 += segment) { // s0 < quantized: the segment's page is quantized
    const unsigned block = kvq_cuda_slot_block(a, meta, seq, s0, kvh), tp = t % P;
    const bool mine = visible && t >= s0 && t < s0 + segment && t < quantized;
    __syncthreads(); // the previous segment's readers of outliers are done
    if (lane < k) outliers[lane] = kvq_io_u8(&page_io, kvq_qjl_list_at(block, P, m, mo, k) + lane);
    for (unsigned outer = 0; outer < (k > 0u ? 2u : 1u); outer++) {
      const unsigned rows = outer != 0u ? mo : m, words0 = kvq_qjl_sign_word_at(block, outer, tp, 0u, P, m, mo);
      for (unsigned g = 0; g < heads; g++) sums[g][lane] = 0.0f;
      for (unsigned c0 = 0; c0 < rows; c0 += KVQ_QJL_LUT_ROWS) {
        const unsigned chunk = rows - c0 < KVQ_QJL_LUT_ROWS ? rows - c0 : KVQ_QJL_LUT_ROWS, groups = chunk / 8u;
        unsigned words[4] = {0u, 0u, 0u, 0u};
        if (mine) kvq_cuda_load_words4(key_pages, words0 + c0 / 32u, words0 + rows / 32u, words);
        for (unsigned g = 0; g < heads; g++) {
          const kvq_io io_value = {const_cast<unsigned *>(key_pages), queries + (row0 + g) * d, KVQ_LAYOUT_F32, key_fixed0, key_fixed1,
                                   prepared + (row0 + g) * pf};
          __syncthreads(); // the previous tables' readers are done (and the outlier list is in place)
          for (unsigned i = lane; i < chunk; i += KVQ_CUDA_ATTENTION_THREADS)
            qparts[i] = kvq_cuda_qjl_query_part(&io_value, outer, c0 + i, list, d, k);
          __syncthreads();
          kvq_cuda_qjl_lut_build(qparts, groups, lut);
          __syncthreads();
          if (mine) sums[g][lane] = kvq_cuda_qjl_lut_sum(lut, groups, words, sums[g][lane]);
        }
      }
      if (mine) {
        const float norm = kvq_qjl_norm(&page_io, block, outer, tp, P, m, mo, k);
        for (unsigned g = 0; g < heads; g++) {
          const float e = kvq_qjl_estimate(s.qjl_constant, rows, norm, sums[g][lane]);
          logit[g][lane] = outer == 0u ? e : logit[g][lane] + e;
        }
      }
    }
  }
}

// 8 blocks per multiprocessor (__launch_bounds__'s second argument): 128 registers a thread; with
// the block size alone ptxas aims at more blocks, keeps 96 registers and spills. The shared memory
// (about 21 KiB a block, mostly the QJL tables) lets 10 blocks reside on sm_90, 7 on sm_80, 4 on
// sm_86 and sm_89.
#define KVQ_CUDA_FLASH_MIN_BLOCKS 8
__global__ void __launch_bounds__(KVQ_CUDA_ATTENTION_THREADS, KVQ_CUDA_FLASH_MIN_BLOCKS)
    kvq_cuda_flash(const kvq_cuda_attention a, const kvq_cuda_side values, const unsigned *__restrict__ meta,
                   const unsigned *__restrict__ key_pages, const float *__restrict__ key_fixed0, const float *__restrict__ key_fixed1,
                   const void *__restrict__ key_ring, const unsigned *__restrict__ value_pages, const float *__restrict__ value_fixed0,
                   const float *__restrict__ value_fixed1, const void *__restrict__ value_ring, const float *__restrict__ queries,
                   const float *__restrict__ prepared, float *__restrict__ scratch) {
  KVQ_SHARED(float, part, KVQ_CUDA_BLOCK_WARPS);
  KVQ_SHARED_2D(float, prob, KVQ_FLASH_HEADS_PER_PASS, KVQ_FLASH_SPLIT); // the logits, then the probabilities
  KVQ_SHARED_2D(float, sums, KVQ_FLASH_HEADS_PER_PASS, KVQ_FLASH_SPLIT); // QJL: the slots' signed sums
  KVQ_SHARED(float, lut, KVQ_QJL_LUT_FLOATS);                            // QJL: the tables
  KVQ_SHARED(float, qparts, KVQ_QJL_LUT_ROWS);                           // QJL: the query parts of 128 rows
  KVQ_SHARED(unsigned, outliers, KVQ_MAX_OUTLIERS);                      // QJL: the page's outlier list
  KVQ_SHARED(unsigned, value_block, KVQ_FLASH_SPLIT); // the values' head block of each paged slot of the split
  KVQ_SHARED(unsigned, value_seen, KVQ_FLASH_SPLIT);  // whether a head of the pass sees the slot (p != 0)
  KVQ_SHARED(unsigned, value_token, KVQ_FLASH_SPLIT); // the paged slot's token in its page (t % P)
  const unsigned wg = kvq_cuda_workgroup(), seq = kvq_gpu_locate(meta, KVQ_PLAN_FLASH, wg);
  if (seq == meta[KVQ_META_SEQS]) return; // uniform over the block, before any barrier
  const unsigned n = kvq_gpu_seq_tokens(meta, seq);
  unsigned r, kvh, pass, split;
  if (n == 0u || !kvq_cuda_flash_unit(a, meta, seq, kvq_gpu_unit(meta, KVQ_PLAN_FLASH, seq, wg), n, r, kvh, pass, split))
    return; // uniform too
  const unsigned lane = threadIdx.x, d = a.side.head_dim, P = a.side.page_size, H = a.query_heads, group = H / a.side.kv_heads;
  const unsigned h0 = kvh * group + pass * KVQ_FLASH_HEADS_PER_PASS;
  const unsigned heads = group - pass * KVQ_FLASH_HEADS_PER_PASS < KVQ_FLASH_HEADS_PER_PASS ? group - pass * KVQ_FLASH_HEADS_PER_PASS
                                                                                            : KVQ_FLASH_HEADS_PER_PASS;
  const unsigned quantized = kvq_gpu_seq(meta, seq, KVQ_SEQ_QUANTIZED), first = split * KVQ_FLASH_SPLIT;
  const unsigned count = n - first < KVQ_FLASH_SPLIT ? n - first : KVQ_FLASH_SPLIT, t = first + lane;
  const unsigned R = kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT) * H;
  const size_t row0 = static_cast<size_t>(kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_FIRST) + r) * H + h0; // the pass's first query row

  // Logits into prob[g][lane]: thread `lane` scores slot t against each head of the pass, each key
  // read once for all of them. Per-head sums in registers only in loops of constant trip count
  // (unrolled: no local memory), or in shared memory (QJL).
  const bool visible = t < n && kvq_gpu_visible(meta, seq, r, t, P, a.alive_words) != 0u;
  const kvq_cuda_side &ks = a.side;
  // The pass's queries in shared memory (in QJL's tables, which the other methods leave unused):
  // query[g * d + c] = channel c of head g, read by every thread from there instead of from global
  // memory per channel and head.
  static_assert(KVQ_FLASH_HEADS_PER_PASS * KVQ_MAX_HEAD_DIM <= KVQ_QJL_LUT_FLOATS, "flash.cuh: the queries fit QJL's tables");
  const bool staged = ks.method != KVQ_LAYOUT_QJL;
  const float *query = staged ? lut : queries + row0 * d;
  if (staged) {
    for (unsigned i = lane; i < heads * d; i += KVQ_CUDA_ATTENTION_THREADS) lut[i] = queries[row0 * d + i];
    __syncthreads(); // uniform: ks.method is the job's
  }
  if (ks.method == KVQ_LAYOUT_QJL) // every thread: barriers
    kvq_cuda_flash_qjl(a, meta, seq, kvh, first, quantized, visible, heads, key_pages, key_fixed0, key_fixed1, queries, prepared, row0,
                       prob, sums, lut, qparts, outliers);
  if (visible && (t >= quantized || ks.method != KVQ_LAYOUT_QJL)) {
    kvq_acc logit[KVQ_FLASH_HEADS_PER_PASS];
    KVQ_UNROLL
    for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++) logit[g] = KVQ_ACC(0.0f);
    const unsigned block = t < quantized ? kvq_cuda_slot_block(a, meta, seq, t, kvh) : 0u, tp = t % P;
    const kvq_io io_value = {const_cast<unsigned *>(key_pages), nullptr, KVQ_LAYOUT_F32, key_fixed0, key_fixed1, nullptr};
    const size_t pf = kvq_cuda_prepared_floats(ks);
    if (t < quantized && ks.method == KVQ_LAYOUT_POLAR) { // against R q: kvq_polar_score's sum, each coordinate decoded once
      // by runs of 8 rotated coordinates (kvq_polar_decode_run, as the Vulkan shaders: a level's
      // codes and the radii read once per run, not once per coordinate and level as
      // kvq_polar_decode_coord does; the same products in the same order, so the same floats)
      const unsigned tables = kvq_polar_tables(kvh, ks.codebook, ks.levels, ks.level_bits);
      for (unsigned c0 = 0; c0 < d; c0 += KVQ_POLAR_RUN) {
        float y[KVQ_POLAR_RUN];
        kvq_polar_decode_run(&io_value, block, tp, c0, P, d, ks.levels, ks.level_bits, tables, y);
        KVQ_UNROLL
        for (unsigned j = 0; j < KVQ_POLAR_RUN; j++) {
          KVQ_UNROLL
          for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
            if (g < heads) logit[g] += KVQ_ACC(prepared[(row0 + g) * pf + c0 + j]) * KVQ_ACC(y[j]);
        }
      }
    } else if (t < quantized && ks.method == KVQ_LAYOUT_CQ) { // the prepared tables: kvq_cq_score's sum, each code read once
      for (unsigned j = 0; j < d / ks.channels; j++) {
        const unsigned code = (j << ks.code_bits) + kvq_cq_code(&io_value, block, tp, j, d, ks.channels, ks.code_bits);
        KVQ_UNROLL
        for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
          if (g < heads) logit[g] += KVQ_ACC(prepared[(row0 + g) * pf + code]);
      }
    } else if (t < quantized && kvq_cuda_decodes_runs(ks)) { // runs of 8 channels (runs.cuh): the same floats, the same order
      for (unsigned c0 = 0; c0 < d; c0 += KVQ_CUDA_RUN) {
        float k[KVQ_CUDA_RUN];
        kvq_cuda_decode_run(&io_value, ks, block, tp, c0, k);
        KVQ_UNROLL
        for (unsigned j = 0; j < KVQ_CUDA_RUN; j++) {
          KVQ_UNROLL
          for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
            if (g < heads) logit[g] += KVQ_ACC(query[g * d + c0 + j]) * KVQ_ACC(k[j]);
        }
      }
    } else { // EXACT, UNIFORM, KIVI (3-bit) and the window: each channel decoded once for every head
      for (unsigned c = 0; c < d; c++) {
        const float k = t < quantized ? kvq_cuda_decode_channel(&io_value, ks, block, kvh, tp, c)
                                      : kvq_cuda_window_value(a, meta, key_ring, seq, t, kvh, c);
        KVQ_UNROLL
        for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
          if (g < heads) logit[g] += KVQ_ACC(query[g * d + c]) * KVQ_ACC(k);
      }
    }
    KVQ_UNROLL
    for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
      if (g < heads) prob[g][lane] = static_cast<float>(logit[g]);
  }
  for (unsigned g = 0; g < heads; g++) {
    const float x = visible ? prob[g][lane] * a.scale : -INFINITY; // each thread its own column of prob
    const float m = kvq_cuda_block_max(x, part);
    const float p = visible ? expf(x - m) : 0.0f;
    const float l = kvq_cuda_block_sum(p, part);
    const unsigned row_head = r * H + h0 + g;
    prob[g][lane] = p;
    if (t < n) scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_prob_at(n, row_head, t))] = p;
    if (lane == 0) {
      scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_max_at(R, n, row_head, split))] = m;
      scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_sum_at(R, n, row_head, split))] = l;
    }
  }
  kvq_cuda_attention av = a; // the values' layout for their page blocks and the ring
  av.side = values;
  { // what the value loop asks per slot, found once by the slot's own thread
    bool seen = false; // a slot no head of the pass sees adds nothing
    for (unsigned g = 0; g < heads; g++) seen = seen || prob[g][lane] != 0.0f;
    value_seen[lane] = seen ? 1u : 0u;
    value_block[lane] = seen && t < quantized ? kvq_cuda_slot_block(av, meta, seq, t, kvh) : 0u;
    value_token[lane] = t % P;
  }
  __syncthreads(); // every thread's probabilities in prob, the slots' blocks in value_block

  const kvq_io io_value = {const_cast<unsigned *>(value_pages), nullptr, KVQ_LAYOUT_F32, value_fixed0, value_fixed1, nullptr};
  if (kvq_cuda_decodes_runs(values)) { // uniform over the block: its own loop, its own registers
    // Thread `lane` sums the channel pairs (c, c + 1), c = 2 lane + 128 i, over the split's slots in
    // order, each pair decoded at once (kvq_cuda_decode_pair): each channel's sum as below.
    for (unsigned c = 2u * lane; c < d; c += 2u * KVQ_CUDA_ATTENTION_THREADS) {
      float acc0[KVQ_FLASH_HEADS_PER_PASS], acc1[KVQ_FLASH_HEADS_PER_PASS];
      KVQ_UNROLL
      for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++) acc0[g] = acc1[g] = 0.0f;
      for (unsigned i = 0; i < count; i++) {
        if (value_seen[i] == 0u) continue;
        const unsigned ti = first + i;
        float v0, v1;
        if (ti >= quantized) {
          v0 = kvq_cuda_window_value(av, meta, value_ring, seq, ti, kvh, c);
          v1 = kvq_cuda_window_value(av, meta, value_ring, seq, ti, kvh, c + 1u);
        } else {
          kvq_cuda_decode_pair(&io_value, values, value_block[i], value_token[i], c, v0, v1);
        }
        KVQ_UNROLL
        for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
          if (g < heads) {
            const float p = prob[g][i];
            acc0[g] += p * v0;
            acc1[g] += p * v1;
          }
      }
      KVQ_UNROLL
      for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
        if (g < heads) {
          const unsigned row_head = r * H + h0 + g;
          scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_out_at(R, n, d, row_head, split, c))] = acc0[g];
          scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_out_at(R, n, d, row_head, split, c + 1u))] = acc1[g];
        }
    }
    return;
  }
  // Values: thread `lane` sums channels c = lane, lane + 64, ... over the split's slots, in order.
  // PolarQuant sums the page slots in its rotated space (coordinate c of y_t, kvq_polar_decode_coord)
  // and the window slots apart (kvq_flash_window_at): the combine keeps the two apart and only the
  // page part is rotated back, once per output row (kvq_cuda_rotate).
  const bool polar = values.method == KVQ_LAYOUT_POLAR;
  const unsigned tables = polar ? kvq_polar_tables(kvh, values.codebook, values.levels, values.level_bits) : 0u;
  for (unsigned c = lane; c < d; c += KVQ_CUDA_ATTENTION_THREADS) {
    float acc[KVQ_FLASH_HEADS_PER_PASS];
    KVQ_UNROLL
    for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++) acc[g] = 0.0f;
    for (unsigned i = 0; i < count; i++) {
      const unsigned ti = first + i;
      if (polar && ti == quantized) { // the page part is complete (before any slot is skipped below)
        KVQ_UNROLL
        for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
          if (g < heads) {
            scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_out_at(R, n, d, r * H + h0 + g, split, c))] = acc[g];
            acc[g] = 0.0f;
          }
      }
      if (value_seen[i] == 0u) continue;
      float v;
      if (ti >= quantized)
        v = kvq_cuda_window_value(av, meta, value_ring, seq, ti, kvh, c);
      else if (polar)
        v = kvq_polar_decode_coord(&io_value, value_block[i], value_token[i], c, P, d, values.levels, values.level_bits, tables);
      else
        v = kvq_cuda_decode_channel(&io_value, values, value_block[i], kvh, value_token[i], c);
      KVQ_UNROLL
      for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
        if (g < heads) acc[g] += prob[g][i] * v;
    }
    // acc: the window part where a PolarQuant split reached the window (its page part was stored at
    // quantized), else the (page) sum; a split's missing part is 0
    const bool windowed = polar && first + count > quantized;
    KVQ_UNROLL
    for (unsigned g = 0; g < KVQ_FLASH_HEADS_PER_PASS; g++)
      if (g < heads) {
        const unsigned row_head = r * H + h0 + g;
        if (polar && first >= quantized) scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_out_at(R, n, d, row_head, split, c))] = 0.0f;
        scratch[kvq_cuda_flash_at(meta, seq, windowed ? kvq_flash_window_at(R, n, d, row_head, split, c)
                                                      : kvq_flash_out_at(R, n, d, row_head, split, c))] = acc[g];
        if (polar && !windowed) scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_window_at(R, n, d, row_head, split, c))] = 0.0f;
      }
  }
}

// The combine's block: G = blockDim.x / 64 groups of 64 threads (at most KVQ_CUDA_COMBINE_GROUPS;
// the host launches KVQ_CUDA_COMBINE_THREADS), the same 64 outputs each (its unit of
// KVQ_PLAN_COMBINE), group g reading splits g, g + G, ... (a thread per output reading all
// 4096 splits at 256k tokens, one dependent round trip after another, took 1.8 ms on an H200 for
// 64 MB: docs/BENCH.md). The partial sums are added in group order; no term goes through more
// than S additions (ceil(S / G) in its group, then at most min(G, S) - 1 groups', the empty ones'
// zeros exact), which is what tests/cuda_attention's bound allows the sum over the S splits.
#define KVQ_CUDA_COMBINE_GROUPS KVQ_FLASH_COMBINE_GROUPS
#define KVQ_CUDA_COMBINE_THREADS (KVQ_CUDA_COMBINE_GROUPS * KVQ_CUDA_ATTENTION_THREADS)
__global__ void __launch_bounds__(KVQ_CUDA_COMBINE_THREADS)
    kvq_cuda_flash_combine(const kvq_cuda_attention a, const unsigned *__restrict__ meta, const float *__restrict__ scratch,
                           float *__restrict__ output, float *__restrict__ rotated) {
  KVQ_SHARED_2D(float, part_max, KVQ_CUDA_COMBINE_GROUPS, KVQ_CUDA_ATTENTION_THREADS);
  KVQ_SHARED_2D(float, part_sum, KVQ_CUDA_COMBINE_GROUPS, KVQ_CUDA_ATTENTION_THREADS);
  KVQ_SHARED_2D(float, part_out, KVQ_CUDA_COMBINE_GROUPS, KVQ_CUDA_ATTENTION_THREADS);
  KVQ_SHARED_2D(float, part_window, KVQ_CUDA_COMBINE_GROUPS, KVQ_CUDA_ATTENTION_THREADS);
  const unsigned wg = kvq_cuda_workgroup(), seq = kvq_gpu_locate(meta, KVQ_PLAN_COMBINE, wg);
  if (seq == meta[KVQ_META_SEQS]) return; // uniform over the block, before any barrier
  const unsigned lane = threadIdx.x % KVQ_CUDA_ATTENTION_THREADS, group = threadIdx.x / KVQ_CUDA_ATTENTION_THREADS;
  const unsigned groups = blockDim.x / KVQ_CUDA_ATTENTION_THREADS;
  const unsigned id = kvq_gpu_unit(meta, KVQ_PLAN_COMBINE, seq, wg) * KVQ_CUDA_ATTENTION_THREADS + lane;
  const unsigned d = a.side.head_dim, H = a.query_heads, n = kvq_gpu_seq_tokens(meta, seq);
  const unsigned R = kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT) * H, c = id % d, row_head = id / d;
  const bool live = row_head < R; // not a return: the barriers below are the whole block's
  const unsigned splits = live ? kvq_flash_splits(n) : 0u;
  // M, the row's largest split maximum: the groups' own, then theirs (a maximum in any order). The
  // loops are unrolled by 8 so that 8 loads are in flight; every entry is loaded before the test
  // that may skip it (the flash kernel writes all of a split's entries, 0 where none is visible).
  float M = -INFINITY;
  KVQ_UNROLL_BY_8
  for (unsigned s = group; s < splits; s += groups)
    M = fmaxf(M, scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_max_at(R, n, row_head, s))]);
  part_max[group][lane] = M;
  __syncthreads();
  for (unsigned g = 0; g < groups; g++) M = fmaxf(M, part_max[g][lane]);
  float sum = 0.0f, out = 0.0f, window = 0.0f;
  KVQ_UNROLL_BY_8
  for (unsigned s = group; s < splits; s += groups) {
    const float m = scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_max_at(R, n, row_head, s))];
    const float l = scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_sum_at(R, n, row_head, s))];
    const float o = scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_out_at(R, n, d, row_head, s, c))];
    const float ow = rotated ? scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_window_at(R, n, d, row_head, s, c))] : 0.0f;
    if (m == -INFINITY) continue; // a split without a visible slot
    const float w = expf(m - M);
    sum += w * l;
    out += w * o;
    if (rotated) window += w * ow;
  }
  part_sum[group][lane] = sum, part_out[group][lane] = out, part_window[group][lane] = window;
  __syncthreads();
  if (group != 0u || !live) return;
  sum = part_sum[0][lane], out = part_out[0][lane], window = part_window[0][lane];
  for (unsigned g = 1; g < groups; g++) sum += part_sum[g][lane], out += part_out[g][lane], window += part_window[g][lane];
  const unsigned r = row_head / H, h = row_head % H;
  const size_t o = (static_cast<size_t>(kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_FIRST) + r) * H + h) * d + c;
  if (rotated) { // the page part for kvq_cuda_rotate, which adds the window part it finds in output
    rotated[o] = sum > 0.0f ? out / sum : 0.0f;
    output[o] = sum > 0.0f ? window / sum : 0.0f;
  } else {
    output[o] = sum > 0.0f ? out / sum : 0.0f;
  }
}

__global__ void __launch_bounds__(KVQ_CUDA_ATTENTION_THREADS)
    kvq_cuda_flash_normalize(const kvq_cuda_attention a, const unsigned *__restrict__ meta, float *__restrict__ scratch) {
  KVQ_SHARED(float, part, KVQ_CUDA_BLOCK_WARPS);
  const unsigned wg = kvq_cuda_workgroup(), seq = kvq_gpu_locate(meta, KVQ_PLAN_SOFTMAX, wg);
  if (seq == meta[KVQ_META_SEQS]) return; // uniform over the block, before any barrier
  const unsigned row_head = kvq_gpu_unit(meta, KVQ_PLAN_SOFTMAX, seq, wg), n = kvq_gpu_seq_tokens(meta, seq);
  const unsigned R = kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT) * a.query_heads, splits = kvq_flash_splits(n);
  if (n == 0 || row_head >= R) return; // uniform too
  float M = -INFINITY;
  for (unsigned s = threadIdx.x; s < splits; s += KVQ_CUDA_ATTENTION_THREADS)
    M = fmaxf(M, scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_max_at(R, n, row_head, s))]);
  M = kvq_cuda_block_max(M, part);
  float L = 0.0f;
  for (unsigned s = threadIdx.x; s < splits; s += KVQ_CUDA_ATTENTION_THREADS) {
    const float m = scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_max_at(R, n, row_head, s))];
    if (m != -INFINITY) L += expf(m - M) * scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_sum_at(R, n, row_head, s))];
  }
  L = kvq_cuda_block_sum(L, part);
  for (unsigned s = threadIdx.x; s < splits; s += KVQ_CUDA_ATTENTION_THREADS) { // each thread the splits it read
    const float m = scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_max_at(R, n, row_head, s))];
    scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_sum_at(R, n, row_head, s))] = m == -INFINITY ? 0.0f : expf(m - M) / L;
  }
}

__global__ void __launch_bounds__(KVQ_CUDA_ATTENTION_THREADS)
    kvq_cuda_flash_accumulate(const kvq_cuda_attention a, const unsigned *__restrict__ meta, const float *__restrict__ scratch,
                              float *__restrict__ accumulate) {
  KVQ_SHARED(float, part, KVQ_CUDA_BLOCK_WARPS);
  const unsigned wg = kvq_cuda_workgroup(), seq = kvq_gpu_locate(meta, KVQ_PLAN_ACCUMULATE, wg);
  if (seq == meta[KVQ_META_SEQS]) return; // uniform over the block
  const unsigned t = kvq_gpu_unit(meta, KVQ_PLAN_ACCUMULATE, seq, wg), n = kvq_gpu_seq_tokens(meta, seq);
  if (t >= n) return; // uniform over the block
  const unsigned R = kvq_gpu_seq(meta, seq, KVQ_SEQ_QUERY_COUNT) * a.query_heads, split = t / KVQ_FLASH_SPLIT;
  float sum = 0.0f;
  for (unsigned row_head = threadIdx.x; row_head < R; row_head += KVQ_CUDA_ATTENTION_THREADS)
    sum += scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_prob_at(n, row_head, t))] *
           scratch[kvq_cuda_flash_at(meta, seq, kvq_flash_sum_at(R, n, row_head, split))];
  sum = kvq_cuda_block_sum(sum, part);
  if (threadIdx.x == 0) accumulate[kvq_gpu_seq(meta, seq, KVQ_SEQ_ACCUMULATE_OFFSET) + t] = sum;
}

#endif // KVQ_BACKENDS_CUDA_KERNELS_FLASH_CUH
