// The CUDA backend's kernels (backends/cuda/kernels/: QUANTIZE, DEQUANTIZE, PREPARE_QUERY, SCORE's
// key dots) run on kvq's CUDA
// emulation against the CPU backend: for every case of the fixture (fixture.h, written by
// reference.c), the emulated QUANTIZE of the same tokens with the same fixed arrays must give the
// CPU's pages byte for byte and its per-token errors; the emulated DEQUANTIZE of those pages the CPU's
// kvq_dequantize, bit for bit where the decode sums nothing in kvq_acc (float on GPUs, double on the
// CPU: core/shared_lang.h), within a stated bound where it does (QJL; PolarQuant's dense rotation);
// PREPARE_QUERY of a few query rows and the key dots of those rows the CPU backend's (test_prepare,
// test_dots: bit for bit, or within the bound derived there).
// A plain TAP program, run plain, under ThreadSanitizer and under ASan + UBSan (meson.build).
// usage: test_cuda_kernels FIXTURE
#include "../cuda_emu/tap.h"
#include "backends/cuda/kernels/dequantize.cuh"
#include "backends/cuda/kernels/key_dots.cuh"
#include "backends/cuda/kernels/quantize.cuh"
#include "../cuda_emu/qjl_bound.h"
#include "fixture.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static_assert(KVQ_FIXTURE_SIDE_FIELDS == KVQ_SIDE_FIELD_COUNT, "fixture.h: the side fields");

struct fixture_case {
  kvq_fixture_case c;
  kvq_cuda_side side;
  std::vector<unsigned char> input, pages;
  std::vector<float> fixed[2], decoded, errors, whole_pages, queries, prepared, dots;
};

template <class T> static bool read_into(FILE *f, std::vector<T> &v, size_t count) {
  v.resize(count);
  return count == 0 || std::fread(v.data(), sizeof(T), count, f) == count;
}

static bool read_case(FILE *f, fixture_case &fc) {
  if (std::fread(&fc.c, sizeof fc.c, 1, f) != 1) return false;
  const kvq_fixture_case &c = fc.c;
  unsigned at = 0;
#define KVQ_TEST_FIELD(name) fc.side.name = c.side[at++];
  KVQ_SIDE_FIELDS(KVQ_TEST_FIELD)
#undef KVQ_TEST_FIELD
  fc.side.head_bytes = c.head_bytes;
  fc.side.qjl_constant = c.qjl_constant;
  const size_t elements = static_cast<size_t>(c.tokens) * fc.side.kv_heads * fc.side.head_dim;
  return read_into(f, fc.input, elements * (c.input_dtype == KVQ_LAYOUT_F32 ? 4u : 2u)) && read_into(f, fc.fixed[0], c.fixed_floats[0]) &&
         read_into(f, fc.fixed[1], c.fixed_floats[1]) && read_into(f, fc.pages, static_cast<size_t>(c.pages) * c.page_bytes) &&
         read_into(f, fc.decoded, elements) &&
         read_into(f, fc.errors, static_cast<size_t>(c.pages) * fc.side.page_size * fc.side.kv_heads) &&
         read_into(f, fc.whole_pages, static_cast<size_t>(c.pages) * fc.side.page_size * fc.side.kv_heads * fc.side.head_dim) &&
         read_into(f, fc.queries, static_cast<size_t>(c.query_rows) * fc.side.head_dim) &&
         read_into(f, fc.prepared, static_cast<size_t>(c.query_rows) * c.prepared_floats) &&
         read_into(f, fc.dots, static_cast<size_t>(c.query_rows) * c.tokens);
}

static const float *fixed_or_null(const std::vector<float> &v) { return v.empty() ? nullptr : v.data(); }

// Whether DEQUANTIZE sums in kvq_acc (core/methods: QJL's reconstruction, PolarQuant's dense rotation
// back): then the GPU's float sum and the CPU's double sum may differ in the last bits.
static bool sums_in_acc(const kvq_cuda_side &s) {
  return s.method == KVQ_LAYOUT_QJL || (s.method == KVQ_LAYOUT_POLAR && s.rotation == KVQ_LAYOUT_ROTATION_DENSE);
}

// Largest |a - b| / (1 + |b|), and the first index that differs at all.
struct difference {
  double worst = 0.0;
  size_t first = SIZE_MAX;
};
static difference compare(const float *a, const float *b, size_t n) {
  difference d;
  for (size_t i = 0; i < n; i++) {
    if (std::memcmp(&a[i], &b[i], 4) != 0 && d.first == SIZE_MAX) d.first = i;
    d.worst = std::max(d.worst, std::fabs(static_cast<double>(a[i]) - b[i]) / (1.0 + std::fabs(static_cast<double>(b[i]))));
  }
  return d;
}

static void test_case(const fixture_case &fc) {
  const kvq_fixture_case &c = fc.c;
  const kvq_cuda_side &s = fc.side;
  const std::string name = c.name;
  const unsigned P = s.page_size, hkv = s.kv_heads, d = s.head_dim;

  // QUANTIZE every page in one launch, into a pool full of garbage (the kernel zeroes what it encodes),
  // item e at slot pages - e: slot 0 must keep its garbage, and each item must land on its own slot.
  const size_t page_words = c.page_bytes / 4u;
  std::vector<unsigned> items;
  for (unsigned e = 0; e < c.pages; e++)
    items.insert(items.end(), {e * P * hkv * d, (c.pages - e) * c.page_bytes, std::min(P, c.tokens - e * P)});
  std::vector<unsigned> pool((c.pages + 1u) * page_words, 0xa5a5a5a5u);
  std::vector<float> errors(fc.errors.size(), 0.0f);
  kvq_emu::Result r = kvq_emu::launch(kvq_cuda_quantize, dim3(hkv, c.pages), dim3(KVQ_CUDA_QUANTIZE_THREADS),
                                      kvq_cuda_decode_shared_bytes(s), s, items.data(), static_cast<const void *>(fc.input.data()),
                                      c.input_dtype, pool.data(), fixed_or_null(fc.fixed[0]), fixed_or_null(fc.fixed[1]), errors.data());
  std::string detail = r.message;
  size_t first = fc.pages.size();
  for (size_t b = 0; r.ok && b < fc.pages.size() && first == fc.pages.size(); b++) {
    const size_t slot = c.pages - b / c.page_bytes;
    if (reinterpret_cast<const unsigned char *>(pool.data())[slot * c.page_bytes + b % c.page_bytes] != fc.pages[b]) first = b;
  }
  if (r.ok && first < fc.pages.size())
    detail = "first different byte " + std::to_string(first) + " (page " + std::to_string(first / c.page_bytes) + ", kv head " +
             std::to_string(first % c.page_bytes / c.head_bytes) + ", byte " + std::to_string(first % c.head_bytes) + " of the head block)";
  bool untouched = true;
  for (size_t w = 0; w < page_words; w++) untouched = untouched && pool[w] == 0xa5a5a5a5u;
  if (r.ok && !untouched) detail = "slot 0, which no item names, was written";
  check(r.ok && first == fc.pages.size() && untouched, name + ": QUANTIZE gives the CPU's pages byte for byte, at the items' offsets", detail);

  const difference e = compare(errors.data(), fc.errors.data(), errors.size());
  const bool errors_exact = !sums_in_acc(s);
  check(r.ok && (errors_exact ? e.first == SIZE_MAX : e.worst <= 1e-5),
        name + ": QUANTIZE's per-token errors are the CPU's" + (errors_exact ? " bit for bit" : " within 1e-5"),
        "largest relative difference " + std::to_string(e.worst) + ", first differing entry " + std::to_string(e.first));

  // DEQUANTIZE the CPU's pages (so that this check stands apart from QUANTIZE's), all in one launch,
  // page e at slot pages - e of a pool whose slot 0 holds garbage.
  std::vector<unsigned> cpu_pool((c.pages + 1u) * page_words, 0xa5a5a5a5u), slots;
  for (unsigned e = 0; e < c.pages; e++) {
    std::memcpy(cpu_pool.data() + (c.pages - e) * page_words, fc.pages.data() + static_cast<size_t>(e) * c.page_bytes, c.page_bytes);
    slots.push_back(c.pages - e);
  }
  std::vector<float> out(static_cast<size_t>(c.pages) * P * hkv * d, -1.0f);
  r = kvq_emu::launch(kvq_cuda_dequantize, dim3(hkv, c.pages), dim3(KVQ_CUDA_DEQUANTIZE_THREADS), kvq_cuda_decode_shared_bytes(s), s,
                      slots.data(), cpu_pool.data(), fixed_or_null(fc.fixed[0]), fixed_or_null(fc.fixed[1]), out.data());
  const difference o = compare(out.data(), fc.decoded.data(), fc.decoded.size()); // the valid tokens lead
  const difference w = compare(out.data(), fc.whole_pages.data(), out.size());
  const bool exact = !sums_in_acc(s);
  if (!exact)
    std::printf("# %s: largest relative difference from the CPU: errors %.3g, DEQUANTIZE %.3g\n", name.c_str(), e.worst,
                std::max(o.worst, w.worst));
  const std::string how = exact ? " bit for bit" : " within 1e-5 (float sums, CPU double)";
  check(r.ok && (exact ? o.first == SIZE_MAX : o.worst <= 1e-5), name + ": DEQUANTIZE gives the CPU's kvq_dequantize" + how,
        r.ok ? "largest relative difference " + std::to_string(o.worst) + ", first differing value " + std::to_string(o.first) : r.message);
  check(r.ok && (exact ? w.first == SIZE_MAX : w.worst <= 1e-5),
        name + ": DEQUANTIZE gives the CPU backend's whole pages (tokens past the valid count too)" + how,
        r.ok ? "largest relative difference " + std::to_string(w.worst) + ", first differing value " + std::to_string(w.first) : r.message);
}

// PREPARE_QUERY of the fixture's query rows against the case's side, one launch, into a buffer of
// garbage. PolarQuant's R q is fp32 on both sides (kvq_polar_rotate): bit for bit. QJL's S q rows and
// CQ's table entries are dot products of n float pairs (n = head_dim, or c channels) summed in kvq_acc:
// double on the CPU (the products exact, the sum within n 2^-53 of sum |a_i b_i|, then one rounding
// to float, 2^-24 relative), float here (each of the n additions, or FMAs on a GPU, rounds once:
// within gamma_n = n u / (1 - n u) of sum |a_i b_i|, u = 2^-24; Higham, Accuracy and Stability,
// 3.1). So |gpu - cpu| <= (gamma_n + u (1 + gamma_n) + n 2^-53) sum |a_i b_i|, below (n + 2) u sum
// |a_i b_i| for n <= 2^10. sum |a_i b_i| is the same shared function run on |q| and |fixed arrays|
// (in float: within gamma_n of the exact, which the bound absorbs at (n + 2) u (1 + gamma_n)).
static void test_prepare(const fixture_case &fc) {
  const kvq_fixture_case &c = fc.c;
  const kvq_cuda_side &s = fc.side;
  const std::string name = c.name;
  const unsigned pf = kvq_cuda_prepared_floats(s), d = s.head_dim, rows = c.query_rows;
  if (pf != c.prepared_floats) {
    check(false, name + ": the kernel's prepared floats are the CPU's", std::to_string(pf) + " against " + std::to_string(c.prepared_floats));
    return;
  }
  if (pf == 0) return;
  std::vector<float> out(static_cast<size_t>(rows) * pf, -7.0f);
  const kvq_emu::Result r = kvq_emu::launch(kvq_cuda_prepare, dim3(rows), dim3(KVQ_CUDA_PREPARE_THREADS), 0u, s, c.query_heads,
                                            fc.queries.data(), fixed_or_null(fc.fixed[0]), fixed_or_null(fc.fixed[1]), out.data());
  if (s.method == KVQ_LAYOUT_POLAR) {
    const difference p = compare(out.data(), fc.prepared.data(), out.size());
    check(r.ok && p.first == SIZE_MAX, name + ": PREPARE_QUERY gives the CPU's R q bit for bit",
          r.ok ? "first differing value " + std::to_string(p.first) : r.message);
    return;
  }
  // sum |a_i b_i| for every prepared float: the same function on |q| and the absolute fixed arrays
  std::vector<float> aq(fc.queries), a0(fc.fixed[0]), a1(fc.fixed[1]);
  for (std::vector<float> *v : {&aq, &a0, &a1})
    for (float &x : *v) x = std::fabs(x);
  const unsigned n = s.method == KVQ_LAYOUT_QJL ? d : s.channels;
  const double u = std::ldexp(1.0, -24), bound = (n + 2.0) * u;
  double worst = 0.0; // largest |gpu - cpu| / sum |a_i b_i|
  size_t over = SIZE_MAX;
  for (unsigned row = 0; row < rows; row++) {
    const unsigned h = row % c.query_heads / (c.query_heads / s.kv_heads);
    const kvq_io io_value = {nullptr, aq.data() + static_cast<size_t>(row) * d, KVQ_LAYOUT_F32, fixed_or_null(a0), fixed_or_null(a1), nullptr};
    const kvq_io *io = &io_value;
    for (unsigned e = 0; e < pf; e++) {
      const double magnitude = s.method == KVQ_LAYOUT_QJL
                                   ? kvq_qjl_prepare_row(io, 0u, e, d)
                                   : kvq_cq_prepare_entry(io, 0u, e >> s.code_bits, e & ((1u << s.code_bits) - 1u), d, s.channels, s.code_bits, h);
      const size_t i = static_cast<size_t>(row) * pf + e;
      const double diff = std::fabs(static_cast<double>(out[i]) - fc.prepared[i]);
      if (diff > bound * magnitude && over == SIZE_MAX) over = i;
      if (magnitude > 0.0) worst = std::max(worst, diff / magnitude);
    }
  }
  std::printf("# %s: PREPARE_QUERY's largest |gpu - cpu| / sum |a_i b_i|: %.3g (bound (n + 2) 2^-24 = %.3g)\n", name.c_str(), worst, bound);
  check(r.ok && over == SIZE_MAX,
        name + ": PREPARE_QUERY gives the CPU's " + (s.method == KVQ_LAYOUT_QJL ? "S q" : "CQ tables") +
            " within (n + 2) 2^-24 sum |a_i b_i| (float sum of n products, CPU double)",
        r.ok ? "first value past the bound " + std::to_string(over) : r.message);
}

// SCORE's dots (key_dots.cuh) of the fixture's query rows against the CPU's pages (reversed slots, a
// slot of garbage), with the CPU's prepared queries, so that this check stands apart from PREPARE's.
// Every method but QJL sums n products (or CQ's n = d / c table entries) whose factors are the CPU's
// floats bit for bit (the decoded key or rotated coordinates; the prepared query), in float here and
// in double on the CPU: the bound of test_prepare, (n + 2) 2^-24 sum |a_i b_i|, with sum |a_i b_i|
// from the same factors. QJL's estimator has a bound of its own, derived in
// tests/cuda_emu/qjl_bound.h (qjl_dot_terms, shared with tests/cuda_attention): the GPU's float estimate and the CPU's double one rounded to float differ by at most
// sum_parts (gamma_(n+k+5) + gamma'_(n+k+5) + u (1 + gamma'_(n+k+5))) K W.
static double qjl_dot_bound(const kvq_io *io, const fixture_case &fc, unsigned block, unsigned t, unsigned row) {
  const float *q = fc.queries.data() + static_cast<size_t>(row) * fc.side.head_dim;
  const float *p = fc.prepared.data() + static_cast<size_t>(row) * fc.c.prepared_floats;
  return qjl_terms_dot_bound(qjl_dot_terms(io, fc.side, q, p, block, t));
}

static void test_dots(const fixture_case &fc) {
  const kvq_fixture_case &c = fc.c;
  const kvq_cuda_side &s = fc.side;
  const std::string name = c.name;
  const unsigned P = s.page_size, hkv = s.kv_heads, d = s.head_dim, rows = c.query_rows, n = c.tokens, pf = c.prepared_floats;
  const size_t page_words = c.page_bytes / 4u;
  std::vector<unsigned> pool((c.pages + 1u) * page_words, 0xa5a5a5a5u), slots;
  for (unsigned e = 0; e < c.pages; e++) {
    std::memcpy(pool.data() + (c.pages - e) * page_words, fc.pages.data() + static_cast<size_t>(e) * c.page_bytes, c.page_bytes);
    slots.push_back(c.pages - e);
  }
  std::vector<float> out(static_cast<size_t>(rows) * n, -7.0f), abs_prepared(fc.prepared);
  for (float &x : abs_prepared) x = std::fabs(x);
  const kvq_emu::Result r = kvq_emu::launch(kvq_cuda_key_dots, dim3(c.pages, rows), dim3(KVQ_CUDA_KEY_DOTS_THREADS), 0u, s, c.query_heads, n,
                                            slots.data(), pool.data(), fixed_or_null(fc.fixed[0]), fixed_or_null(fc.fixed[1]),
                                            fc.queries.data(), fixed_or_null(fc.prepared), out.data());
  const unsigned terms = s.method == KVQ_LAYOUT_CQ ? d / s.channels : d;
  const double bound = (terms + 2.0) * std::ldexp(1.0, -24);
  double worst = 0.0, worst_relative = 0.0; // largest |gpu - cpu| / sum |a_i b_i|, and / (1 + |cpu|)
  size_t over = SIZE_MAX;
  for (unsigned row = 0; row < rows; row++) {
    const unsigned h = row % c.query_heads / (c.query_heads / hkv);
    const float *q = fc.queries.data() + static_cast<size_t>(row) * d;
    for (unsigned t = 0; t < n; t++) {
      const unsigned e = t / P, block = (slots[e] * hkv + h) * c.head_bytes;
      const kvq_io io_value = {pool.data(), nullptr, KVQ_LAYOUT_F32, fixed_or_null(fc.fixed[0]), fixed_or_null(fc.fixed[1]),
                               pf ? abs_prepared.data() + static_cast<size_t>(row) * pf : nullptr};
      const kvq_io *io = &io_value;
      double magnitude = 0.0;
      if (s.method == KVQ_LAYOUT_CQ) magnitude = kvq_cq_score(io, block, t % P, 0u, d, s.channels, s.code_bits);
      else if (s.method == KVQ_LAYOUT_POLAR) {
        const unsigned tables = kvq_polar_tables(h, s.codebook, s.levels, s.level_bits);
        for (unsigned i = 0; i < d; i++)
          magnitude += std::fabs(static_cast<double>(io->prepared[i]) *
                                 kvq_polar_decode_coord(io, block, t % P, i, P, d, s.levels, s.level_bits, tables));
      } else
        for (unsigned i = 0; i < d; i++) magnitude += std::fabs(static_cast<double>(q[i]) * fc.whole_pages[((static_cast<size_t>(t) * hkv) + h) * d + i]);
      const size_t at = static_cast<size_t>(row) * n + t;
      const double diff = std::fabs(static_cast<double>(out[at]) - fc.dots[at]);
      if (s.method == KVQ_LAYOUT_QJL) {
        const double qjl_bound = qjl_dot_bound(io, fc, block, t % P, row);
        if (!(diff <= qjl_bound) && over == SIZE_MAX) over = at;
        if (qjl_bound > 0.0) worst = std::max(worst, diff / qjl_bound);
      } else {
        if (diff > bound * magnitude && over == SIZE_MAX) over = at;
        if (magnitude > 0.0) worst = std::max(worst, diff / magnitude);
      }
      worst_relative = std::max(worst_relative, diff / (1.0 + std::fabs(static_cast<double>(fc.dots[at]))));
    }
  }
  if (s.method == KVQ_LAYOUT_QJL) {
    std::printf("# %s: SCORE dots' largest |gpu - cpu| / (1 + |cpu|): %.3g, and / the derived bound: %.3g\n", name.c_str(), worst_relative,
                worst);
    check(r.ok && over == SIZE_MAX,
          name + ": SCORE's dots (QJL estimator) are the CPU's within sum_parts (gamma_(n+k+5) + gamma'_(n+k+5) + u (1 + gamma')) K W "
                 "(float against double, derived above)",
          r.ok ? "first dot past the bound " + std::to_string(over) : r.message);
    return;
  }
  std::printf("# %s: SCORE dots' largest |gpu - cpu| / sum |a_i b_i|: %.3g (bound (n + 2) 2^-24 = %.3g)\n", name.c_str(), worst, bound);
  check(r.ok && over == SIZE_MAX, name + ": SCORE's dots are the CPU's within (n + 2) 2^-24 sum |a_i b_i| (float sum of n products, CPU double)",
        r.ok ? "first dot past the bound " + std::to_string(over) : r.message);
}

int main(int argc, char **argv) {
  FILE *f = argc == 2 ? std::fopen(argv[1], "rb") : nullptr;
  if (!f) {
    std::printf("1..1\nnot ok 1 - cannot read the fixture %s\n", argc == 2 ? argv[1] : "(usage: test_cuda_kernels FIXTURE)");
    return 1;
  }
  unsigned cases = 0;
  for (fixture_case fc; read_case(f, fc); cases++) {
    test_case(fc);
    test_prepare(fc);
    test_dots(fc);
  }
  const bool complete = std::feof(f) != 0;
  std::fclose(f);
  check(complete && cases == 14, "the fixture holds the 14 cases (7 caches, both sides), read to its end");
  std::printf("1..%d\n", tap_number);
  return tap_failures ? 1 : 0;
}
