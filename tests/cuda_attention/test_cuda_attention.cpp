// The CUDA backend's attention kernels (backends/cuda/kernels/score.cuh, softmax.cuh, weighted_sum.cuh,
// and the fused flash.cuh: test_flash) run on kvq's CUDA emulation against the CPU backend: for every case of the fixture (fixture.h,
// written by reference.c), each kernel runs on the CPU's input of its job (SCORE on the pools and
// the CPU's prepared queries; SOFTMAX on the CPU's logits; ACCUMULATE and WEIGHTED_SUM on the CPU's
// probabilities), so that each check stands apart, with the job's packed metadata as a GPU backend
// uploads it and plan.units[kernel] blocks. Masks, -inf and probabilities 0 must be exact; every
// other value is a float sum on the GPU and a double sum on the CPU ("class 3", docs/ACCURACY.md),
// checked within a bound derived next to its check (u = 2^-24). Entries no sequence owns must keep
// the garbage they held.
// A plain TAP program, run plain, under ThreadSanitizer and under ASan + UBSan (meson.build).
// usage: test_cuda_attention FIXTURE
#include "../cuda_emu/tap.h"
#include "backends/cuda/kernels/flash.cuh"
#include "backends/cuda/kernels/score.cuh"
#include "backends/cuda/kernels/softmax.cuh"
#include "backends/cuda/kernels/weighted_sum.cuh"
#include "../cuda_emu/qjl_bound.h"
#include "fixture.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static_assert(KVQ_ATTENTION_FIXTURE_SIDE_FIELDS == KVQ_SIDE_FIELD_COUNT, "fixture.h: the side fields");
static_assert(KVQ_ATTENTION_FIXTURE_KERNELS == KVQ_PLAN_KERNELS, "fixture.h: the plan's kernels");

static const double u = std::ldexp(1.0, -24);
static const unsigned GARBAGE = 0x7fa5a5a5u; // a NaN: any stray write or read of it shows

struct side_data {
  kvq_cuda_side side;
  std::vector<float> fixed[2];
  std::vector<unsigned> pool, ring; // ring: ring_bytes, as 32-bit words (aligned for every dtype)
  const float *fixed0() const { return fixed[0].empty() ? nullptr : fixed[0].data(); }
  const float *fixed1() const { return fixed[1].empty() ? nullptr : fixed[1].data(); }
};

struct fixture_case {
  kvq_attention_fixture c;
  side_data s[2];
  std::vector<float> queries, prepared, logits, probabilities, sums, output;
  std::vector<unsigned> meta, fused_meta;
};

template <class T> static bool read_into(FILE *f, std::vector<T> &v, size_t count) {
  v.resize(count);
  return count == 0 || std::fread(v.data(), sizeof(T), count, f) == count;
}

static bool read_case(FILE *f, fixture_case &fc) {
  if (std::fread(&fc.c, sizeof fc.c, 1, f) != 1) return false;
  const kvq_attention_fixture &c = fc.c;
  for (int i = 0; i < 2; i++) {
    kvq_cuda_side &s = fc.s[i].side;
    unsigned at = 0;
#define KVQ_TEST_FIELD(name) s.name = c.side[i][at++];
    KVQ_SIDE_FIELDS(KVQ_TEST_FIELD)
#undef KVQ_TEST_FIELD
    s.head_bytes = c.head_bytes[i];
    s.qjl_constant = c.qjl_constant[i];
  }
  bool ok = true;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) ok = ok && read_into(f, fc.s[i].fixed[j], c.fixed_floats[i][j]);
  for (int i = 0; i < 2; i++) ok = ok && read_into(f, fc.s[i].pool, static_cast<size_t>(c.pool_pages) * c.page_bytes[i] / 4u);
  for (int i = 0; i < 2; i++) {
    fc.s[i].ring.assign((c.ring_bytes + 3u) / 4u, 0u);
    ok = ok && std::fread(fc.s[i].ring.data(), 1, c.ring_bytes, f) == c.ring_bytes;
  }
  const size_t rows = static_cast<size_t>(c.query_rows) * c.query_heads;
  return ok && read_into(f, fc.queries, rows * fc.s[0].side.head_dim) && read_into(f, fc.prepared, rows * c.prepared_floats) &&
         read_into(f, fc.meta, c.meta_words) && read_into(f, fc.fused_meta, c.fused_meta_words) && read_into(f, fc.logits, c.score_floats) && read_into(f, fc.probabilities, c.score_floats) &&
         read_into(f, fc.sums, c.accumulate_floats) && read_into(f, fc.output, c.output_floats);
}

static kvq_cuda_attention params(const fixture_case &fc, int side) {
  kvq_cuda_attention a;
  a.side = fc.s[side].side;
  a.query_heads = fc.c.query_heads;
  a.alive_words = fc.c.alive_words;
  a.window_dtype = fc.c.window_dtype;
  a.scale = fc.c.scale;
  return a;
}

static bool is_garbage(float x) {
  unsigned b;
  std::memcpy(&b, &x, 4);
  return b == GARBAGE;
}
static std::vector<float> garbage(size_t n) {
  float g;
  std::memcpy(&g, &GARBAGE, 4);
  return std::vector<float>(n, g);
}

// The sequences' records, read with the shared functions (core/gpu_attention.h) on the host.
struct seq_view {
  unsigned n, quantized, rows, score_offset, accumulate_offset, query_first;
};
static std::vector<seq_view> sequences(const fixture_case &fc) {
  const unsigned *meta = fc.meta.data();
  std::vector<seq_view> v;
  for (unsigned i = 0; i < meta[KVQ_META_SEQS]; i++)
    v.push_back({kvq_gpu_seq_tokens(meta, i), kvq_gpu_seq(meta, i, KVQ_SEQ_QUANTIZED), kvq_gpu_seq(meta, i, KVQ_SEQ_QUERY_COUNT),
                 kvq_gpu_seq(meta, i, KVQ_SEQ_SCORE_OFFSET), kvq_gpu_seq(meta, i, KVQ_SEQ_ACCUMULATE_OFFSET),
                 kvq_gpu_seq(meta, i, KVQ_SEQ_QUERY_FIRST)});
  return v;
}
// Which score entries (and accumulate entries) some sequence owns.
static std::vector<bool> owned_scores(const fixture_case &fc, unsigned H) {
  std::vector<bool> owned(fc.c.score_floats, false);
  for (const seq_view &q : sequences(fc))
    for (size_t i = 0; i < static_cast<size_t>(q.rows) * H * q.n; i++) owned[q.score_offset + i] = true;
  return owned;
}

// A window token's channel c (kv head h, slot t of sequence seq) of side `side`, as the kernels read it.
static float window_value(const fixture_case &fc, int side, unsigned seq, unsigned t, unsigned h, unsigned c) {
  const kvq_cuda_attention a = params(fc, side);
  return kvq_cuda_window_value(a, fc.meta.data(), fc.s[side].ring.data(), seq, t, h, c);
}

// The bound on |gpu - cpu| of the logit of query row `row`, head h against slot t of sequence i
// (unmasked), derived at test_score: (n + 3) u scale A, or QJL's page logits' own. A: sum |a_i b_i|
// (0 for QJL's page logits). abs_prepared: the prepared queries' absolute values.
struct logit_bound {
  double bound, A;
  bool qjl;
};
static float window_value(const fixture_case &fc, int side, unsigned seq, unsigned t, unsigned h, unsigned c);
static logit_bound score_bound(const fixture_case &fc, const std::vector<float> &abs_prepared, unsigned i, unsigned row, unsigned h,
                               unsigned t) {
  const kvq_cuda_attention a = params(fc, 0);
  const kvq_cuda_side &s = a.side;
  const unsigned H = fc.c.query_heads, d = s.head_dim, P = s.page_size, pf = fc.c.prepared_floats;
  const unsigned *meta = fc.meta.data();
  const unsigned kvh = kvq_cuda_kv_head(a, h);
  const size_t qrow = static_cast<size_t>(kvq_gpu_seq(meta, i, KVQ_SEQ_QUERY_FIRST) + row) * H + h;
  const float *qv = fc.queries.data() + qrow * d;
  const unsigned quantized = kvq_gpu_seq(meta, i, KVQ_SEQ_QUANTIZED);
  double A = 0.0;
  unsigned terms = d;
  double qjl_bound = -1.0;
  if (t >= quantized) {
    for (unsigned ch = 0; ch < d; ch++) A += std::fabs(static_cast<double>(qv[ch]) * window_value(fc, 0, i, t, kvh, ch));
  } else {
    const unsigned block = (kvq_gpu_page_slot(meta, i, t, P) * s.kv_heads + kvh) * s.head_bytes;
    const kvq_io io_value = {const_cast<unsigned *>(fc.s[0].pool.data()), qv, KVQ_LAYOUT_F32, fc.s[0].fixed0(), fc.s[0].fixed1(),
                             pf ? abs_prepared.data() + qrow * pf : nullptr};
    const kvq_io *io = &io_value;
    if (s.method == KVQ_LAYOUT_QJL)
      qjl_bound = qjl_terms_logit_bound(qjl_dot_terms(io, s, qv, fc.prepared.data() + qrow * pf, block, t % P), a.scale);
    else if (s.method == KVQ_LAYOUT_CQ) {
      A = kvq_cq_score(io, block, t % P, 0u, d, s.channels, s.code_bits); // the |entries| summed
      terms = d / s.channels;
    } else if (s.method == KVQ_LAYOUT_POLAR) {
      const unsigned tables = kvq_polar_tables(kvh, s.codebook, s.levels, s.level_bits);
      for (unsigned ch = 0; ch < d; ch++)
        A += std::fabs(static_cast<double>(io->prepared[ch]) * kvq_polar_decode_coord(io, block, t % P, ch, P, d, s.levels, s.level_bits, tables));
    } else
      for (unsigned ch = 0; ch < d; ch++)
        A += std::fabs(static_cast<double>(qv[ch]) * kvq_cuda_decode_channel(io, s, block, kvh, t % P, ch));
  }
  if (qjl_bound >= 0.0) return {qjl_bound, 0.0, true};
  return {(terms + 3.0) * u * a.scale * A, A, false};
}

// SCORE. Every logit the CPU masks (-inf) must be -inf, bit for bit; the others are q.k of n float
// pairs (n = head_dim; CQ: n = head_dim / c table entries) whose factors are the CPU's floats bit for
// bit (the query or prepared query; the decoded key, rotated coordinates, table entries or the ring's
// token: the shared functions, tests/cuda_kernels checks them), summed in float here (within gamma_n
// = n u / (1 - n u) of A = sum |a_i b_i|, Higham 3.1) and in double on the CPU (within n 2^-53 A),
// then scaled: one float product here (u), the double product rounded to float there (u). So
// |gpu - cpu| <= scale (gamma_n + 2 u + n 2^-53) A (1 + u) <= (n + 3) u scale A for n <= 2^10; A
// is computed here from the same factors in double. QJL's page logits (the estimator: signed sums of
// query parts, norms and c_d) have their own bound, tests/cuda_emu/qjl_bound.h's
// qjl_terms_logit_bound (the key dot's derivation, scaled by scale, plus the rounding of the product
// on each side): s (in_float + in_double) + u s (magnitude + in_float) + (u + 2^-53 + u 2^-53) s
// (magnitude + in_double).
static void test_score(const fixture_case &fc) {
  const kvq_attention_fixture &c = fc.c;
  const std::string name = c.name;
  const kvq_cuda_attention a = params(fc, 0);
  const kvq_cuda_side &s = a.side;
  const unsigned H = c.query_heads, pf = c.prepared_floats;
  std::vector<float> scores = garbage(c.score_floats);
  const kvq_emu::Result r = kvq_emu::launch(kvq_cuda_score, dim3(c.units[KVQ_PLAN_SCORE]), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u, a,
                                            static_cast<const unsigned *>(fc.meta.data()), static_cast<const unsigned *>(fc.s[0].pool.data()),
                                            fc.s[0].fixed0(), fc.s[0].fixed1(), static_cast<const void *>(fc.s[0].ring.data()),
                                            static_cast<const float *>(fc.queries.data()), pf ? fc.prepared.data() : nullptr, scores.data());
  std::vector<float> abs_prepared(fc.prepared);
  for (float &x : abs_prepared) x = std::fabs(x);
  const std::vector<seq_view> seqs = sequences(fc);
  size_t masks_wrong = 0, over = 0, checked = 0, qjl_checked = 0, qjl_over = 0, masked = 0;
  double worst = 0.0, worst_qjl = 0.0, worst_qjl_relative = 0.0; // |gpu - cpu| / (scale A); QJL: / its bound, / (1 + |cpu|)
  for (unsigned i = 0; i < seqs.size(); i++) {
    const seq_view &q = seqs[i];
    for (unsigned row = 0; row < q.rows; row++)
      for (unsigned h = 0; h < H; h++) {
        for (unsigned t = 0; t < q.n; t++) {
          const size_t at = q.score_offset + (static_cast<size_t>(row) * H + h) * q.n + t;
          const float cpu = fc.logits[at], gpu = scores[at];
          if (std::isinf(cpu) && cpu < 0) {
            masked++;
            if (!(std::isinf(gpu) && gpu < 0)) masks_wrong++;
            continue;
          }
          if (std::isinf(gpu) || std::isnan(gpu)) {
            masks_wrong++;
            continue;
          }
          const logit_bound lb = score_bound(fc, abs_prepared, i, row, h, t);
          const double A = lb.A, qjl_bound = lb.qjl ? lb.bound : -1.0;
          const double diff = std::fabs(static_cast<double>(gpu) - cpu);
          if (qjl_bound >= 0.0) {
            qjl_checked++;
            if (!(diff <= qjl_bound)) qjl_over++;
            if (qjl_bound > 0.0) worst_qjl = std::max(worst_qjl, diff / qjl_bound);
            worst_qjl_relative = std::max(worst_qjl_relative, diff / (1.0 + std::fabs(static_cast<double>(cpu))));
            continue;
          }
          checked++;
          const double bound = lb.bound;
          if (diff > bound) over++;
          if (A > 0.0) worst = std::max(worst, diff / (a.scale * A));
        }
      }
  }
  const std::vector<bool> owned = owned_scores(fc, H);
  size_t stray = 0;
  for (size_t i = 0; i < owned.size(); i++) stray += !owned[i] && !is_garbage(scores[i]);
  check(r.ok && masks_wrong == 0 && masked > 0, name + ": SCORE masks exactly the CPU's slots (-inf: dead, future)",
        r.ok ? std::to_string(masks_wrong) + " of " + std::to_string(masked) + " masked logits differ" : r.message);
  std::printf("# %s: SCORE's largest |gpu - cpu| / (scale sum |a_i b_i|): %.3g over %zu logits (bound (n + 3) 2^-24)\n", name.c_str(),
              worst, checked);
  check(r.ok && over == 0 && checked > 0, name + ": SCORE's logits are the CPU's within (n + 3) 2^-24 scale sum |a_i b_i|",
        std::to_string(over) + " of " + std::to_string(checked) + " logits past the bound");
  check(r.ok && stray == 0, name + ": SCORE writes no score entry that no sequence owns", std::to_string(stray) + " written");
  if (s.method == KVQ_LAYOUT_QJL) {
    std::printf("# %s: SCORE's QJL page logits: largest |gpu - cpu| / bound %.3g, / (1 + |cpu|) %.3g, over %zu logits\n", name.c_str(),
                worst_qjl, worst_qjl_relative, qjl_checked);
    check(r.ok && qjl_over == 0 && qjl_checked > 0,
          name + ": SCORE's QJL page logits are the CPU's within the estimator's derived bound times scale (qjl_bound.h)",
          std::to_string(qjl_over) + " of " + std::to_string(qjl_checked) + " logits past the bound");
  }
}

// SOFTMAX on the CPU's logits. Masked entries (-inf) must become 0 bit for bit. Otherwise, per row of
// n entries with maximum m (the same float on both sides): here fl(x_t - m) (within u |x_t - m|, so
// exp's argument moves by that: relative u |x_t - m|), expf (CUDA: within 2 ulp, 4 u relative),
// the row's float sum of n such terms (gamma_n, all terms positive), one division (u); the CPU
// computes in double and rounds once (u). So |gpu - cpu| <= (|x_t - m| + max_t |x_t - m| + n + 10) u
// p_t to first order (the 10: 4 + 4 for expf here and in the sum, 1 + 1 roundings; the second-order
// terms are below u for these n and |x - m|), plus 2^-147 for results near the subnormal range,
// where rounding is absolute.
static void test_softmax(const fixture_case &fc) {
  const kvq_attention_fixture &c = fc.c;
  const std::string name = c.name;
  const kvq_cuda_attention a = params(fc, 0);
  const unsigned H = c.query_heads;
  std::vector<float> scores(fc.logits);
  const kvq_emu::Result r = kvq_emu::launch(kvq_cuda_softmax, dim3(c.units[KVQ_PLAN_SOFTMAX]), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u, a,
                                            static_cast<const unsigned *>(fc.meta.data()), scores.data());
  size_t zeros_wrong = 0, over = 0, checked = 0;
  double worst = 0.0; // |gpu - cpu| / (u p_t (|x_t - m| + max |x - m| + n))
  for (const seq_view &q : sequences(fc))
    for (unsigned row = 0; row < q.rows * H; row++) {
      const size_t base = q.score_offset + static_cast<size_t>(row) * q.n;
      float m = -INFINITY;
      for (unsigned t = 0; t < q.n; t++) m = std::max(m, fc.logits[base + t]);
      double spread = 0.0;
      for (unsigned t = 0; t < q.n; t++)
        if (!std::isinf(fc.logits[base + t])) spread = std::max(spread, static_cast<double>(m) - fc.logits[base + t]);
      for (unsigned t = 0; t < q.n; t++) {
        const float x = fc.logits[base + t], cpu = fc.probabilities[base + t], gpu = scores[base + t];
        if (std::isinf(x)) {
          zeros_wrong += std::memcmp(&gpu, &cpu, 4) != 0;
          continue;
        }
        checked++;
        const double k = (static_cast<double>(m) - x) + spread + q.n + 10.0;
        const double diff = std::fabs(static_cast<double>(gpu) - cpu);
        if (diff > k * u * cpu + std::ldexp(1.0, -147) || std::isnan(gpu)) over++;
        if (cpu > 0.0f) worst = std::max(worst, diff / (u * cpu * (k - 10.0)));
      }
    }
  const std::vector<bool> owned = owned_scores(fc, H);
  size_t stray = 0;
  for (size_t i = 0; i < owned.size(); i++) stray += !owned[i] && std::memcmp(&scores[i], &fc.logits[i], 4) != 0;
  check(r.ok && zeros_wrong == 0, name + ": SOFTMAX gives masked slots probability 0 exactly",
        r.ok ? std::to_string(zeros_wrong) + " differ" : r.message);
  std::printf("# %s: SOFTMAX's largest |gpu - cpu| / (u p (|x - m| + max |x - m| + n)): %.3g over %zu probabilities\n", name.c_str(),
              worst, checked);
  check(r.ok && over == 0 && checked > 0,
        name + ": SOFTMAX gives the CPU's probabilities within (|x - m| + max |x - m| + n + 10) 2^-24 p",
        std::to_string(over) + " of " + std::to_string(checked) + " past the bound");
  check(r.ok && stray == 0, name + ": SOFTMAX changes no score entry that no sequence owns", std::to_string(stray) + " changed");
}

// ACCUMULATE on the CPU's probabilities: per slot a float sum of R = rows x heads probabilities
// (all >= 0: within gamma_R of their sum S), the CPU's double sum rounded once (u): |gpu - cpu| <=
// (R + 2) u S, S computed here in double.
static void test_accumulate(const fixture_case &fc) {
  const kvq_attention_fixture &c = fc.c;
  if (!c.accumulate) return;
  const std::string name = c.name;
  const kvq_cuda_attention a = params(fc, 0);
  const unsigned H = c.query_heads;
  std::vector<float> sums = garbage(c.accumulate_floats);
  const kvq_emu::Result r = kvq_emu::launch(kvq_cuda_accumulate, dim3(c.units[KVQ_PLAN_ACCUMULATE]), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u,
                                            a, static_cast<const unsigned *>(fc.meta.data()),
                                            static_cast<const float *>(fc.probabilities.data()), sums.data());
  std::vector<bool> owned(c.accumulate_floats, false);
  size_t over = 0, checked = 0;
  double worst = 0.0;
  for (const seq_view &q : sequences(fc))
    for (unsigned t = 0; t < q.n; t++) {
      owned[q.accumulate_offset + t] = true;
      double S = 0.0;
      for (unsigned row = 0; row < q.rows * H; row++) S += fc.probabilities[q.score_offset + static_cast<size_t>(row) * q.n + t];
      const double diff = std::fabs(static_cast<double>(sums[q.accumulate_offset + t]) - fc.sums[q.accumulate_offset + t]);
      checked++;
      if (!(diff <= (q.rows * H + 2.0) * u * S)) over++;
      if (S > 0.0) worst = std::max(worst, diff / (u * S));
    }
  size_t stray = 0;
  for (size_t i = 0; i < owned.size(); i++) stray += !owned[i] && !is_garbage(sums[i]);
  std::printf("# %s: ACCUMULATE's largest |gpu - cpu| / (u sum p): %.3g over %zu slots\n", name.c_str(), worst, checked);
  check(r.ok && over == 0 && checked > 0 && stray == 0,
        name + ": ACCUMULATE gives the CPU's probability sums within (R + 2) 2^-24 sum p, and nothing else",
        r.ok ? std::to_string(over) + " past the bound, " + std::to_string(stray) + " stray writes" : r.message);
}

// WEIGHTED_SUM (and ROTATE) on the CPU's probabilities. Value methods that decode channel by
// channel: output c = page part + window part, float sums of nq and nw products p_t v_t[c] here
// (within gamma_nq and gamma_nw of A = sum |p_t v_t[c]|), added (u); the CPU sums in double and
// rounds once (u): |gpu - cpu| <= (n + 3) u A, n = nq + nw, the v_t[c] the CPU's floats bit for bit.
// PolarQuant: the rotated page sum z (coordinate i: nq products of p_t and the rotated coordinate
// y_t[i], the CPU's floats) is within (nq + 1) u Z_i of the CPU's float z (Z_i = sum |p_t y_t[i]|),
// then turned back, x = R^T z: the propagated error sum_i |R[i][c]| |dz_i| <= C (nq + 1) u ||Z||_2
// (Cauchy-Schwarz; C = the largest column norm of R^T, measured here by turning back unit vectors),
// plus the rotation's own rounding on both sides, within (d + 2) u C ||z||_2 (dense: a float sum of
// d products here, double there, each rounded to float once; Hadamard: log2 d butterfly stages on
// both sides plus the scale and sign products, 2 log2 d + 4 <= d + 2); then the window part, a float
// sum of nw products (nw u W_c, W_c = sum |p_t v_t[c]| over the window), and the final additions (2 u
// |out|). So |gpu - cpu| <= C u ((nq + 2) ||Z||_2 + (d + 3) ||z||_2) + (nw + 1) u W_c + 3 u |cpu|, the
// +1s covering second-order terms.
// The largest column norm of R^T (turning back unit vectors), the C of the PolarQuant bounds.
static double rotation_column_norm(const kvq_io *io, const kvq_cuda_side &s) {
  const unsigned d = s.head_dim;
  std::vector<double> norm2(d, 0.0);
  for (unsigned i = 0; i < d; i++) {
    float e[KVQ_MAX_HEAD_DIM] = {0.0f}, x[KVQ_MAX_HEAD_DIM];
    e[i] = 1.0f;
    kvq_polar_unrotate(io, e, d, s.rotation, x);
    for (unsigned ch = 0; ch < d; ch++) norm2[ch] += static_cast<double>(x[ch]) * x[ch];
  }
  double C = 0.0;
  for (double n2 : norm2) C = std::max(C, std::sqrt(n2));
  return C;
}

static void test_weighted_sum(const fixture_case &fc) {
  const kvq_attention_fixture &c = fc.c;
  const std::string name = c.name;
  const kvq_cuda_attention a = params(fc, 1);
  const kvq_cuda_side &s = a.side;
  const unsigned H = c.query_heads, d = s.head_dim, P = s.page_size;
  const bool polar = s.method == KVQ_LAYOUT_POLAR;
  if (polar != (c.rotated_sums != 0)) {
    check(false, name + ": the plan's rotated sums are PolarQuant's");
    return;
  }
  std::vector<float> output = garbage(c.output_floats), rotated = garbage(c.scratch_bytes / 4u);
  // a 2-D grid with blocks past the last unit, which must return
  const unsigned units = c.units[KVQ_PLAN_WEIGHTED_SUM];
  kvq_emu::Result r = kvq_emu::launch(kvq_cuda_weighted_sum, dim3((units + 2u) / 3u, 3u), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u, a,
                                      static_cast<const unsigned *>(fc.meta.data()), static_cast<const unsigned *>(fc.s[1].pool.data()),
                                      fc.s[1].fixed0(), fc.s[1].fixed1(), static_cast<const void *>(fc.s[1].ring.data()),
                                      static_cast<const float *>(fc.probabilities.data()), output.data(), polar ? rotated.data() : nullptr);
  if (r.ok && polar)
    r = kvq_emu::launch(kvq_cuda_rotate, dim3(c.units[KVQ_PLAN_ROTATE]), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u, a,
                        static_cast<const unsigned *>(fc.meta.data()), fc.s[1].fixed0(), fc.s[1].fixed1(),
                        rotated.data(), output.data());
  const kvq_io io_value = {const_cast<unsigned *>(fc.s[1].pool.data()), nullptr, KVQ_LAYOUT_F32, fc.s[1].fixed0(), fc.s[1].fixed1(), nullptr};
  const kvq_io *io = &io_value;
  const double C = polar ? rotation_column_norm(io, s) : 0.0;
  const unsigned *meta = fc.meta.data();
  const std::vector<seq_view> seqs = sequences(fc);
  std::vector<bool> owned(c.output_floats, false);
  size_t over = 0, checked = 0;
  double worst = 0.0; // |gpu - cpu| / bound
  for (unsigned i = 0; i < seqs.size(); i++) {
    const seq_view &q = seqs[i];
    const unsigned nw = q.n - q.quantized;
    for (unsigned row = 0; row < q.rows; row++)
      for (unsigned h = 0; h < H; h++) {
        const unsigned kvh = kvq_cuda_kv_head(a, h);
        const float *p = fc.probabilities.data() + q.score_offset + (static_cast<size_t>(row) * H + h) * q.n;
        const size_t o = (static_cast<size_t>(q.query_first + row) * H + h) * d;
        std::vector<double> Ap(d, 0.0), Aw(d, 0.0), z(d, 0.0);
        const unsigned tables = polar ? kvq_polar_tables(kvh, s.codebook, s.levels, s.level_bits) : 0u;
        for (unsigned t = 0; t < q.n; t++) {
          if (p[t] == 0.0f) continue;
          const unsigned block = t < q.quantized ? (kvq_gpu_page_slot(meta, i, t, P) * s.kv_heads + kvh) * s.head_bytes : 0u;
          for (unsigned ch = 0; ch < d; ch++) {
            if (t >= q.quantized) {
              Aw[ch] += std::fabs(static_cast<double>(p[t]) * window_value(fc, 1, i, t, kvh, ch));
            } else {
              const double v = polar ? kvq_polar_decode_coord(io, block, t % P, ch, P, d, s.levels, s.level_bits, tables)
                                     : kvq_cuda_decode_channel(io, s, block, kvh, t % P, ch);
              Ap[ch] += std::fabs(p[t] * v);
              z[ch] += p[t] * v;
            }
          }
        }
        double Z2 = 0.0, z2 = 0.0;
        for (unsigned ch = 0; ch < d; ch++) Z2 += Ap[ch] * Ap[ch], z2 += z[ch] * z[ch];
        for (unsigned ch = 0; ch < d; ch++) {
          owned[o + ch] = true;
          const float cpu = fc.output[o + ch], gpu = output[o + ch];
          const double bound = polar ? C * u * ((q.quantized + 2.0) * std::sqrt(Z2) + (d + 3.0) * std::sqrt(z2)) + (nw + 1.0) * u * Aw[ch] +
                                           3.0 * u * std::fabs(cpu)
                                     : (q.n + 3.0) * u * (Ap[ch] + Aw[ch]);
          const double diff = std::fabs(static_cast<double>(gpu) - cpu);
          checked++;
          if (!(diff <= bound)) over++;
          if (bound > 0.0) worst = std::max(worst, diff / bound);
        }
      }
  }
  size_t stray = 0;
  for (size_t i = 0; i < owned.size(); i++) stray += !owned[i] && !is_garbage(output[i]);
  std::printf("# %s: WEIGHTED_SUM's largest |gpu - cpu| / bound: %.3g over %zu outputs\n", name.c_str(), worst, checked);
  check(r.ok && over == 0 && checked > 0,
        name + (polar ? ": WEIGHTED_SUM and ROTATE give the CPU's output within the rotated sums' derived bound"
                      : ": WEIGHTED_SUM gives the CPU's output within (n + 3) 2^-24 sum |p_t v_t[c]|"),
        r.ok ? std::to_string(over) + " of " + std::to_string(checked) + " outputs past the bound" : r.message);
  check(r.ok && stray == 0, name + ": WEIGHTED_SUM writes no output row that no sequence owns", std::to_string(stray) + " written");
}

// What test_flash and test_flash_sums need of the CPU's float logits of row (row, h) of sequence i,
// from element base of the logits (n slots, masked ones -inf): M their largest, D = max (M - x_t),
// B_t SCORE's bound on slot t's logit (score_bound; 0 where masked) and Bmax the largest B_t.
struct row_logits {
  double M = -INFINITY, D = 0.0, Bmax = 0.0;
  std::vector<double> B;
};
static row_logits row_logit_bounds(const fixture_case &fc, const std::vector<float> &abs_prepared, unsigned i, unsigned row,
                                   unsigned h, size_t base, unsigned n) {
  row_logits r;
  r.B.assign(n, 0.0);
  for (unsigned t = 0; t < n; t++)
    if (!std::isinf(fc.logits[base + t])) r.M = std::max(r.M, static_cast<double>(fc.logits[base + t]));
  for (unsigned t = 0; t < n; t++) {
    if (std::isinf(fc.logits[base + t])) continue;
    r.D = std::max(r.D, r.M - fc.logits[base + t]);
    r.B[t] = score_bound(fc, abs_prepared, i, row, h, t).bound;
    r.Bmax = std::max(r.Bmax, r.B[t]);
  }
  return r;
}

// The H2O / Q-Hitter sums of the fused attention (flash.cuh): kvq_cuda_flash_normalize, then
// kvq_cuda_flash_accumulate, on the scratch that test_flash's FLASH and COMBINE left, into sums full of
// garbage, against the CPU's sums of the same job (its float probabilities p_jt summed in double and
// rounded once). Slots no row sees must be 0 exactly (as the CPU's); entries no sequence owns keep
// their garbage. The bound, per slot t, over the row-heads j that see it, with test_flash's notation
// per row-head (the CPU's float logits x_jt, M_j their largest, D_j = max (M_j - x_jt), B_jt SCORE's
// bound, S the sequence's splits, R its row-heads), to first order:
//   - the GPU's logits: the normalized probability moves by the relative B_jt + B_max,j (test_flash);
//   - the GPU's probability fl(P_jt f_s), P_jt = expf(fl(x_jt - m_s)) from FLASH and
//     f_s = expf(fl(m_s - M)) / L from the normalization: the two exponents' roundings and expfs
//     (M - x_jt + 8) u (as test_flash's weights), L's relative (D + 72 + S) u (test_flash's
//     denominator: the weights, FLASH's block sum, w l_s, and the normalization's sum of S terms,
//     zeros added exactly), the division (u) and the product (u): (M_j - x_jt + D_j + S + 82) u;
//   - the GPU's float sum of R terms, all >= 0: (R - 1) u sum_j p_jt; the CPU's float probabilities
//     (u each), its double sum rounded once (u) and its double exps and sums (n 2^-53, below u): 3 u.
// So |gpu - cpu| <= sum_j p_jt (B_jt + B_max,j + u (M_j - x_jt + D_j + S + 82)) + (R + 2) u sum_j p_jt,
// times 1 + 2^-9 for the second-order terms while every row's relative terms stay below 2^-10
// (checked per row, as test_flash does).
static void test_flash_sums(const fixture_case &fc, std::vector<float> &scratch, bool ran) {
  const kvq_attention_fixture &c = fc.c;
  const std::string name = c.name;
  const kvq_cuda_attention av = params(fc, 1); // the values' side: query_heads is all the two kernels read
  const unsigned H = c.query_heads, *meta = fc.fused_meta.data();
  std::vector<float> sums = garbage(c.accumulate_floats);
  kvq_emu::Result r = {ran, ran ? std::string() : std::string("FLASH or COMBINE failed")};
  if (r.ok)
    r = kvq_emu::launch(kvq_cuda_flash_normalize, dim3(c.fused_units[KVQ_PLAN_SOFTMAX]), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u, av, meta,
                        scratch.data());
  if (r.ok)
    r = kvq_emu::launch(kvq_cuda_flash_accumulate, dim3(c.fused_units[KVQ_PLAN_ACCUMULATE]), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u, av,
                        meta, static_cast<const float *>(scratch.data()), sums.data());
  std::vector<float> abs_prepared(fc.prepared);
  for (float &x : abs_prepared) x = std::fabs(x);
  const std::vector<seq_view> seqs = sequences(fc);
  std::vector<bool> owned(c.accumulate_floats, false);
  size_t over = 0, checked = 0, zeros_wrong = 0, zero_slots = 0, too_coarse = 0;
  double worst = 0.0; // |gpu - cpu| / bound
  for (unsigned i = 0; i < seqs.size(); i++) {
    const seq_view &q = seqs[i];
    const unsigned S = kvq_flash_splits(q.n), R = q.rows * H;
    std::vector<double> first(q.n, 0.0), mass(q.n, 0.0);
    for (unsigned row_head = 0; row_head < R; row_head++) {
      const unsigned row = row_head / H, h = row_head % H;
      const size_t base = q.score_offset + static_cast<size_t>(row_head) * q.n;
      const row_logits rl = row_logit_bounds(fc, abs_prepared, i, row, h, base, q.n);
      const double M = rl.M, D = rl.D, Bmax = rl.Bmax;
      const std::vector<double> &B = rl.B;
      if (!(2.0 * Bmax + u * (2.0 * D + S + 82.0) < std::ldexp(1.0, -10))) too_coarse++;
      for (unsigned t = 0; t < q.n; t++) {
        const double p = fc.probabilities[base + t];
        if (std::isinf(fc.logits[base + t]) || p == 0.0) continue;
        mass[t] += p;
        first[t] += p * (B[t] + Bmax + u * (M - fc.logits[base + t] + D + S + 82.0));
      }
    }
    for (unsigned t = 0; t < q.n; t++) {
      owned[q.accumulate_offset + t] = true;
      const float cpu = fc.sums[q.accumulate_offset + t], gpu = sums[q.accumulate_offset + t];
      if (mass[t] == 0.0) { // no row sees t: 0 exactly
        zero_slots++;
        zeros_wrong += !(gpu == 0.0f && cpu == 0.0f);
        continue;
      }
      const double bound = (first[t] + (R + 2.0) * u * mass[t]) * (1.0 + std::ldexp(1.0, -9));
      const double diff = std::fabs(static_cast<double>(gpu) - cpu);
      checked++;
      if (!(diff <= bound)) over++;
      worst = std::max(worst, diff / bound);
    }
  }
  size_t stray = 0;
  for (size_t k = 0; k < owned.size(); k++) stray += !owned[k] && !is_garbage(sums[k]);
  std::printf("# %s: the fused attention's sums, largest |gpu - cpu| / bound: %.3g over %zu slots (and %zu no row sees)\n",
              name.c_str(), worst, checked, zero_slots);
  check(r.ok && over == 0 && too_coarse == 0 && checked > 0,
        name + ": the fused attention's H2O sums (FLASH, COMBINE, NORMALIZE, ACCUMULATE) give the CPU's within the derived bound",
        r.ok ? std::to_string(over) + " of " + std::to_string(checked) + " slots past the bound, " + std::to_string(too_coarse) +
                   " rows past the first-order condition"
             : r.message);
  check(r.ok && zeros_wrong == 0, name + ": the fused attention's sums are 0 where no row sees the slot (as the CPU's)",
        std::to_string(zeros_wrong) + " of " + std::to_string(zero_slots) + " differ");
  check(r.ok && stray == 0, name + ": the fused attention's sums write no entry that no sequence owns", std::to_string(stray) + " written");
}

// The fused attention (flash.cuh): kvq_cuda_flash, then kvq_cuda_flash_combine (then kvq_cuda_rotate
// for PolarQuant values), with the fused plan's metadata and units (reference.c: the same job, its
// H2O sums included, which every case's plan fuses; test_flash_sums then checks the sums), into
// scratch and output full of garbage, against the CPU's output of
// the same job (SCORE, SOFTMAX, WEIGHTED_SUM in double). The combine runs on a 2-D grid with spare
// blocks. Output rows that see no slot must be 0 exactly (as the CPU's); rows no sequence owns keep
// their garbage. The bound, per output (r, h, c), with the CPU's float logits x_t and probabilities
// p_t over the row's visible slots, M = max x_t, D = max (M - x_t), v_t the value channel (the same
// floats on both sides: the shared decoders, or the ring's token), V = sum_t p_t |v_t|, S the
// sequence's splits, u = 2^-24, to first order:
//   - the GPU's logits differ from the CPU's by at most B_t (SCORE's bound, score_bound): that moves
//     the normalized probabilities to p_t e^(delta_t - delta_bar) (delta_bar their p-weighted mean),
//     so the output by at most sum_t p_t |v_t| (B_t + B_max);
//   - the GPU's unnormalized weight of slot t is expf(fl(x_t - m_s)) expf(fl(m_s - M)) (m_s its
//     split's maximum, exact): relative error at most
//     u |x_t - m_s| + 4 u + u |m_s - M| + 4 u = (|x_t - M| + 8) u (CUDA's expf within 2 ulp, 4 u
//     relative, as in test_softmax; the emulator's is correctly rounded), which moves
//     the numerator's term by at most (M - x_t + 8) u;
//   - the numerator: the split's float sum of count <= 64 products p v (at most 65 roundings on each
//     term: the product and the additions, or FMAs), the combine's w o_s (1) and its sum over the S
//     splits (S): (64 + S + 2) u on V;
//   - the denominator (sum p = 1 exactly): the weights' (D + 8) u, the split's block sum (fewer than
//     64 roundings on each term), w l_s (1) and the sum over the splits (S): relative (D + 72 + S) u,
//     which moves out = num / den by at most |o| (D + 72 + S) u <= V (D + 72 + S) u;
//   - the division (u |o| <= u V), and the CPU: its probabilities rounded to float (u V), its double
//     sum (below n 2^-53 V <= u V) and its output rounded to float (u V): 4 u V.
// So |gpu - cpu| <= sum_t p_t |v_t| (B_t + B_max + u (M - x_t)) + V u (D + 2 (64 + S) + 22), with
// 22 = 8 + 2 (the numerator) + 8 (the denominator) + 4. The second-order terms (products of these
// relative errors, e^delta - 1 - delta) are below 2^-10 of the first-order ones while the relative
// terms sum to less than 2^-10 (checked per row), so the bound is taken times 1 + 2^-9.
// PolarQuant values (rotated sums): the flash kernel sums the page slots' rotated coordinates y_t[i]
// and the window slots apart, the combine normalizes both, kvq_cuda_rotate turns the page part back
// and adds the window part. The bound above, E(slots, v), holds for each part on its own slots (its
// terms are sums over slots; |part| <= its V): E_i = E(page slots, y_t[i]) on rotated coordinate i,
// E_w = E(window slots, v_t[c]) on the window part. Then as WEIGHTED_SUM's bound (test_weighted_sum):
// the rotation back propagates the rotated errors by at most C ||(E_i)||_2 (Cauchy-Schwarz, C the
// largest column norm of R^T), rounds within (d + 2) u C ||z||_2 on both sides (z the exact rotated
// page sum), the CPU rounds its z to float (u C ||z||_2) and both add the parts (3 u |out|):
//   |gpu - cpu| <= C ||(E_i)||_2 + (d + 3) u C ||z||_2 + E_w + 3 u |cpu|.
static void test_flash(const fixture_case &fc) {
  const kvq_attention_fixture &c = fc.c;
  const std::string name = c.name;
  if (!c.fused) { // every case's plan fuses (H2O sums and PolarQuant values included); none lies past 32-bit scratch
    check(false, name + ": the fused plan fuses the job (PolarQuant values and H2O sums included)", "declined");
    return;
  }
  const kvq_cuda_attention a = params(fc, 0), av = params(fc, 1);
  const kvq_cuda_side &vs = av.side;
  const unsigned H = c.query_heads, d = vs.head_dim, P = vs.page_size, pf = c.prepared_floats;
  const bool polar = vs.method == KVQ_LAYOUT_POLAR;
  if (polar != (c.rotated_sums != 0)) {
    check(false, name + ": the plan's rotated sums are PolarQuant's");
    return;
  }
  std::vector<float> scratch = garbage(c.fused_scratch_bytes / 4u), output = garbage(c.output_floats);
  const unsigned *meta = fc.fused_meta.data();
  kvq_emu::Result r = kvq_emu::launch(
      kvq_cuda_flash, dim3(c.fused_units[KVQ_PLAN_FLASH]), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u, a, vs, meta,
      static_cast<const unsigned *>(fc.s[0].pool.data()), fc.s[0].fixed0(), fc.s[0].fixed1(), static_cast<const void *>(fc.s[0].ring.data()),
      static_cast<const unsigned *>(fc.s[1].pool.data()), fc.s[1].fixed0(), fc.s[1].fixed1(), static_cast<const void *>(fc.s[1].ring.data()),
      static_cast<const float *>(fc.queries.data()), pf ? static_cast<const float *>(fc.prepared.data()) : nullptr, scratch.data());
  const unsigned combine = c.fused_units[KVQ_PLAN_COMBINE], gx = 3u;
  float *const rotated = polar ? scratch.data() + c.fused_rotated_at : nullptr;
  if (r.ok)
    r = kvq_emu::launch(kvq_cuda_flash_combine, dim3(gx, (combine + gx - 1u) / gx + 1u), dim3(KVQ_CUDA_COMBINE_THREADS), 0u, av, meta,
                        static_cast<const float *>(scratch.data()), output.data(), rotated);
  if (r.ok && polar)
    r = kvq_emu::launch(kvq_cuda_rotate, dim3(c.fused_units[KVQ_PLAN_ROTATE]), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u, av, meta,
                        fc.s[1].fixed0(), fc.s[1].fixed1(), rotated, output.data());
  std::vector<float> abs_prepared(fc.prepared);
  for (float &x : abs_prepared) x = std::fabs(x);
  const std::vector<seq_view> seqs = sequences(fc);
  const kvq_io io_value = {const_cast<unsigned *>(fc.s[1].pool.data()), nullptr, KVQ_LAYOUT_F32, fc.s[1].fixed0(), fc.s[1].fixed1(), nullptr};
  const double C = polar ? rotation_column_norm(&io_value, vs) : 0.0;
  std::vector<bool> owned(c.output_floats, false);
  size_t over = 0, checked = 0, zeros_wrong = 0, zero_rows = 0, too_coarse = 0;
  double worst = 0.0; // |gpu - cpu| / bound
  for (unsigned i = 0; i < seqs.size(); i++) {
    const seq_view &q = seqs[i];
    const unsigned S = kvq_flash_splits(q.n);
    for (unsigned row = 0; row < q.rows; row++)
      for (unsigned h = 0; h < H; h++) {
        const unsigned kvh = kvq_cuda_kv_head(a, h);
        const size_t base = q.score_offset + (static_cast<size_t>(row) * H + h) * q.n, o = (static_cast<size_t>(q.query_first + row) * H + h) * d;
        const row_logits rl = row_logit_bounds(fc, abs_prepared, i, row, h, base, q.n);
        const double M = rl.M, D = rl.D, Bmax = rl.Bmax;
        const std::vector<double> &B = rl.B;
        const double relative = 2.0 * Bmax + u * (2.0 * D + 2.0 * (64.0 + S) + 22.0);
        if (!(relative < std::ldexp(1.0, -10))) too_coarse++;
        // E(slots, v) of the comment above, channel or rotated coordinate ch, over the page slots
        // (t < quantized) or the window slots; `rotated_space`: v the page slots' rotated coordinate
        const auto part_bound = [&](unsigned ch, bool pages, bool rotated_space, double *sum) {
          double V = 0.0, first = 0.0, z = 0.0;
          const unsigned tables = rotated_space ? kvq_polar_tables(kvh, vs.codebook, vs.levels, vs.level_bits) : 0u;
          for (unsigned t = pages ? 0u : q.quantized; t < (pages ? q.quantized : q.n); t++) {
            const float p = fc.probabilities[base + t];
            if (std::isinf(fc.logits[base + t]) || p == 0.0f) continue;
            const unsigned block = t < q.quantized ? (kvq_gpu_page_slot(fc.meta.data(), i, t, P) * vs.kv_heads + kvh) * vs.head_bytes : 0u;
            const double v = t >= q.quantized ? window_value(fc, 1, i, t, kvh, ch)
                             : rotated_space  ? kvq_polar_decode_coord(&io_value, block, t % P, ch, P, d, vs.levels, vs.level_bits, tables)
                                              : kvq_cuda_decode_channel(&io_value, vs, block, kvh, t % P, ch);
            V += p * std::fabs(v);
            z += p * v;
            first += p * std::fabs(v) * (B[t] + Bmax + u * (M - fc.logits[base + t]));
          }
          if (sum) *sum = z;
          return (first + V * u * (D + 2.0 * (64.0 + S) + 22.0)) * (1.0 + std::ldexp(1.0, -9));
        };
        double rotated_error = 0.0, z2 = 0.0; // ||(E_i)||_2 and ||z||_2, squared
        if (polar)
          for (unsigned ch = 0; ch < d; ch++) {
            double z = 0.0;
            const double e = part_bound(ch, true, true, &z);
            rotated_error += e * e, z2 += z * z;
          }
        for (unsigned ch = 0; ch < d; ch++) {
          owned[o + ch] = true;
          const float cpu = fc.output[o + ch];
          const double bound = polar ? C * std::sqrt(rotated_error) + (d + 3.0) * u * C * std::sqrt(z2) + part_bound(ch, false, false, nullptr) +
                                           3.0 * u * std::fabs(cpu)
                                     : part_bound(ch, true, false, nullptr) + part_bound(ch, false, false, nullptr);
          const float gpu = output[o + ch];
          if (M == -INFINITY) { // nothing visible: 0 exactly
            zero_rows++;
            zeros_wrong += !(gpu == 0.0f && cpu == 0.0f);
            continue;
          }
          const double diff = std::fabs(static_cast<double>(gpu) - cpu);
          checked++;
          if (!(diff <= bound)) over++;
          if (bound > 0.0) worst = std::max(worst, diff / bound);
        }
      }
  }
  size_t stray = 0;
  for (size_t k = 0; k < owned.size(); k++) stray += !owned[k] && !is_garbage(output[k]);
  std::printf("# %s: the fused attention's largest |gpu - cpu| / bound: %.3g over %zu outputs (and %zu in rows that see nothing)\n",
              name.c_str(), worst, checked, zero_rows);
  check(r.ok && over == 0 && too_coarse == 0 && checked > 0,
        name + (polar ? ": the fused attention (FLASH, COMBINE, ROTATE) gives the CPU's output within the derived bound"
                      : ": the fused attention (FLASH, COMBINE) gives the CPU's output within the derived bound"),
        r.ok ? std::to_string(over) + " of " + std::to_string(checked) + " outputs past the bound, " + std::to_string(too_coarse) +
                   " rows past the first-order condition"
             : r.message);
  check(r.ok && zeros_wrong == 0, name + ": the fused attention gives 0 where a row sees no slot (as the CPU)",
        std::to_string(zeros_wrong) + " of " + std::to_string(zero_rows) + " differ");
  check(r.ok && stray == 0, name + ": the fused attention writes no output row that no sequence owns", std::to_string(stray) + " written");
  if (c.accumulate) test_flash_sums(fc, scratch, r.ok);
}

// QJL's lookup tables alone (backends/cuda/kernels/qjl_lut.cuh, the fused attention's QJL scoring):
// 64 threads build the tables of `rows` random query parts 128 rows at a time, as kvq_cuda_flash does,
// and each adds the entries its random sign words select (kvq_cuda_load_words4, kvq_cuda_qjl_lut_sum).
static __global__ void qjl_tables_kernel(unsigned rows, const float *parts, const unsigned *words, float *sums) {
  KVQ_SHARED(float, lut, KVQ_QJL_LUT_FLOATS);
  KVQ_SHARED(float, qparts, KVQ_QJL_LUT_ROWS);
  const unsigned lane = threadIdx.x, per_token = rows / 32u;
  float sum = 0.0f;
  for (unsigned c0 = 0; c0 < rows; c0 += KVQ_QJL_LUT_ROWS) {
    const unsigned chunk = rows - c0 < KVQ_QJL_LUT_ROWS ? rows - c0 : KVQ_QJL_LUT_ROWS;
    unsigned w[4];
    kvq_cuda_load_words4(words, lane * per_token + c0 / 32u, (lane + 1u) * per_token, w);
    __syncthreads(); // the previous tables' readers are done
    for (unsigned i = lane; i < chunk; i += KVQ_CUDA_ATTENTION_THREADS) qparts[i] = parts[c0 + i];
    __syncthreads();
    kvq_cuda_qjl_lut_build(qparts, chunk / 8u, lut);
    __syncthreads();
    sum = kvq_cuda_qjl_lut_sum(lut, chunk / 8u, w, sum);
  }
  sums[lane] = sum;
}

// The tables' signed sums T = sum_i sigma_i P_i against the exact sum (double: within gamma'_n A,
// A = sum_i |P_i|, of it), on random parts of magnitudes 2^-12 .. 2^12 (so that roundings happen) and
// random bits, for sketch dimensions of one partial, one whole and several tables. The bound is
// qjl_lut.cuh's derivation: no term goes through more than 7 + n / 8 float roundings, so |T_gpu -
// T| <= gamma_(7 + n/8) A; and 7 + n / 8 <= n - 1 (what qjl_bound.h's bound assumes of the signed
// sum, gamma_(n-1)) for every allowed n. A table entry of the wrong bits, sign or group is off by
// about 2 |P_i| for some i, far past the bound.
static void test_qjl_tables() {
  bool depth_ok = true;
  for (unsigned n = KVQ_SKETCH_MULTIPLE; n <= KVQ_MAX_SKETCH_DIM; n += KVQ_SKETCH_MULTIPLE) depth_ok = depth_ok && 7u + n / 8u <= n - 1u;
  check(depth_ok, "QJL tables: 7 + n / 8 roundings per term are at most the n - 1 of qjl_bound.h for every sketch dimension");
  uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto next = [&state]() {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  for (unsigned rows : {32u, 96u, 128u, 352u, 1024u}) {
    std::vector<float> parts(rows), sums(KVQ_CUDA_ATTENTION_THREADS, 0.0f);
    std::vector<unsigned> words(KVQ_CUDA_ATTENTION_THREADS * rows / 32u);
    for (float &p : parts) p = std::ldexp(static_cast<float>(next() % 2000001u) / 1000000.0f - 1.0f, static_cast<int>(next() % 25u) - 12);
    for (unsigned &w : words) w = static_cast<unsigned>(next());
    const kvq_emu::Result r = kvq_emu::launch(qjl_tables_kernel, dim3(1), dim3(KVQ_CUDA_ATTENTION_THREADS), 0u, rows,
                                              static_cast<const float *>(parts.data()), static_cast<const unsigned *>(words.data()), sums.data());
    const double ud = std::ldexp(1.0, -53), gamma = qjl_gamma(7.0 + rows / 8.0, u), gamma_d = qjl_gamma(rows, ud);
    size_t over = 0;
    double worst = 0.0;
    for (unsigned lane = 0; lane < KVQ_CUDA_ATTENTION_THREADS; lane++) {
      double exact = 0.0, A = 0.0;
      for (unsigned i = 0; i < rows; i++) {
        const bool bit = (words[lane * rows / 32u + i / 32u] >> (i % 32u)) & 1u;
        exact += bit ? parts[i] : -static_cast<double>(parts[i]);
        A += std::fabs(static_cast<double>(parts[i]));
      }
      const double bound = (gamma + gamma_d) * A, diff = std::fabs(sums[lane] - exact);
      if (!(diff <= bound)) over++;
      worst = std::max(worst, diff / bound);
    }
    std::printf("# QJL tables, %u rows: largest |gpu - exact| / bound %.3g\n", rows, worst);
    check(r.ok && over == 0, "QJL tables of " + std::to_string(rows) + " rows give the signed sums within gamma_(7 + n/8) sum |P_i|",
          r.ok ? std::to_string(over) + " of 64 sums past the bound" : r.message);
  }
}

// The combine (kvq_cuda_flash_combine) over many splits, which the fixture's short sequences never
// have (at most 2 splits): a block's 8 groups of threads then each take several splits (S = 37 with
// groups of 4 and 5), and the groups' partial sums are added; and with one group of 64 threads, as
// the emulated backend launches it (backends/cuda/host/attention.cuh). One sequence of n = 37 * 64 - 5 slots,
// 3 row-heads of d = 32 (96 outputs: two blocks, the second one's lanes past the last output idle),
// hand-made metadata (core/gpu_plan.h) and scratch: split maxima m_s in [-4, 4] with every 7th split
// seeing no slot (-inf, skipped), sums l_s in [1, 64], outputs o_s in [-l_s, l_s]. Against the exact
// combination out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s (double), the bound to first order
// (u = 2^-24, D_s = M - m_s): a weight expf(fl(m_s - M)) within (D_s + 4) u of e^(m_s - M)
// (relative: the subtraction's rounding u D_s, expf's 2 ulp), its product with l_s or o_s one more
// rounding, and no term through more than S additions (flash.cuh: ceil(S / 8) in its group, then
// the groups'): the numerator within sum_s w_s |o_s| (D_s + S + 5) u, the denominator within
// sum_s w_s l_s (D_s + S + 5) u relative, so |gpu - exact| <= (N + |out| L) / den + u |out|, N and L
// those two sums, times 1 + 2^-9 for the second-order terms. A group that kept only its last split,
// or a partial sum left out, is off by whole terms.
static void test_combine_many_splits(unsigned threads) {
  const unsigned S = 37u, n = S * KVQ_FLASH_SPLIT - 5u, H = 3u, d = 32u, R = H, outputs = R * d;
  const unsigned units = (outputs + KVQ_CUDA_ATTENTION_THREADS - 1u) / KVQ_CUDA_ATTENTION_THREADS;
  // metadata: the header, one record, each kernel's unit table (2 words); no pages
  std::vector<unsigned> meta(KVQ_META_RECORDS + KVQ_SEQ_WORDS + 2u * KVQ_PLAN_KERNELS, 0u);
  meta[KVQ_META_SEQS] = 1u;
  for (unsigned k = 0; k < KVQ_PLAN_KERNELS; k++) {
    const unsigned table = KVQ_META_RECORDS + KVQ_SEQ_WORDS + 2u * k;
    meta[KVQ_META_UNITS + k] = table;
    meta[table + 1u] = k == KVQ_PLAN_COMBINE ? units : 0u;
  }
  unsigned *record = meta.data() + KVQ_META_RECORDS;
  record[KVQ_SEQ_QUANTIZED] = n, record[KVQ_SEQ_QUERY_COUNT] = 1u, record[KVQ_SEQ_SCRATCH] = 0u;
  std::vector<float> scratch(kvq_flash_out_at(R, n, d, R - 1u, S - 1u, d - 1u) + 1u, 0.0f), output = garbage(outputs);
  uint64_t state = 0x2545f4914f6cdd1dull;
  const auto uniform = [&state](double lo, double hi) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return static_cast<float>(lo + (hi - lo) * static_cast<double>(state >> 11) / 9007199254740992.0);
  };
  for (unsigned rh = 0; rh < R; rh++)
    for (unsigned sp = 0; sp < S; sp++) {
      const bool empty = sp % 7u == 3u;
      const float l = uniform(1.0, 64.0);
      scratch[kvq_flash_max_at(R, n, rh, sp)] = empty ? -INFINITY : uniform(-4.0, 4.0);
      scratch[kvq_flash_sum_at(R, n, rh, sp)] = empty ? 0.0f : l;
      for (unsigned c = 0; c < d; c++) scratch[kvq_flash_out_at(R, n, d, rh, sp, c)] = empty ? 0.0f : uniform(-l, l);
    }
  kvq_cuda_attention a = {};
  a.side.head_dim = d, a.query_heads = H;
  const kvq_emu::Result r = kvq_emu::launch(kvq_cuda_flash_combine, dim3(units), dim3(threads), 0u, a,
                                            static_cast<const unsigned *>(meta.data()), static_cast<const float *>(scratch.data()),
                                            output.data(), static_cast<float *>(nullptr));
  size_t over = 0;
  double worst = 0.0;
  for (unsigned rh = 0; rh < R && r.ok; rh++) {
    double M = -INFINITY;
    for (unsigned sp = 0; sp < S; sp++) M = std::max(M, static_cast<double>(scratch[kvq_flash_max_at(R, n, rh, sp)]));
    for (unsigned c = 0; c < d; c++) {
      double num = 0.0, den = 0.0, N = 0.0, L = 0.0;
      for (unsigned sp = 0; sp < S; sp++) {
        const double m = scratch[kvq_flash_max_at(R, n, rh, sp)];
        if (std::isinf(m)) continue;
        const double w = std::exp(m - M), l = scratch[kvq_flash_sum_at(R, n, rh, sp)], o = scratch[kvq_flash_out_at(R, n, d, rh, sp, c)];
        const double k = (M - m + S + 5.0) * u; // S additions at most, with any number of groups
        num += w * o, den += w * l, N += w * std::fabs(o) * k, L += w * l * k;
      }
      const double exact = num / den, bound = ((N + std::fabs(exact) * L) / den + u * std::fabs(exact)) * (1.0 + std::ldexp(1.0, -9));
      const double diff = std::fabs(output[rh * d + c] - exact);
      if (!(diff <= bound)) over++;
      worst = std::max(worst, diff / bound);
    }
  }
  const std::string groups = std::to_string(threads / KVQ_CUDA_ATTENTION_THREADS);
  std::printf("# the combine over %u splits in %s groups: largest |gpu - exact| / bound %.3g\n", S, groups.c_str(), worst);
  check(r.ok && over == 0, "the combine over 37 splits in " + groups + " groups gives sum_s w_s o_s / sum_s w_s l_s within the derived bound",
        r.ok ? std::to_string(over) + " of " + std::to_string(outputs) + " outputs past the bound" : r.message);
}

int main(int argc, char **argv) {
  FILE *f = argc == 2 ? std::fopen(argv[1], "rb") : nullptr;
  if (!f) {
    std::printf("1..1\nnot ok 1 - cannot read the fixture %s\n", argc == 2 ? argv[1] : "(usage: test_cuda_attention FIXTURE)");
    return 1;
  }
  test_qjl_tables();
  test_combine_many_splits(KVQ_CUDA_COMBINE_THREADS);
  test_combine_many_splits(KVQ_CUDA_ATTENTION_THREADS);
  unsigned cases = 0;
  for (fixture_case fc; read_case(f, fc); cases++) {
    test_score(fc);
    test_softmax(fc);
    test_accumulate(fc);
    test_weighted_sum(fc);
    test_flash(fc);
  }
  const bool complete = std::feof(f) != 0;
  std::fclose(f);
  check(complete && cases == 18, "the fixture holds the 18 cases, read to its end");
  std::printf("1..%d\n", tap_number);
  return tap_failures ? 1 : 0;
}
