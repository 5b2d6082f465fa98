// The CUDA backend's k-means and CONVERT kernels (backends/cuda/kernels/kmeans.cuh, convert.cuh) on
// kvq's CUDA emulation, against host references:
//   - KMEANS_ASSIGN / KMEANS_UPDATE against ref_nearest / ref_update below, which follow
//     backends/cpu/cpu_kmeans.c line by line (float distances, double sums in point order): the
//     assignments, distances and centroids must be the CPU's bit for bit, over several Lloyd steps of
//     several problems, with ties, empty clusters, zero weights, assignments past the clusters, dims
//     past the block, and no distance buffer;
//   - CONVERT against ref_convert below, the backend.h contract element by element (64-bit signed
//     index arithmetic, core/halfconv.h's conversions), for every dtype pair, strided tensors with
//     gaps (which must keep their bytes), a negative stride, non-finite and overflowing inputs, and
//     every flag; plus known fp16 / bf16 bit patterns that do not depend on halfconv.h.
// A plain TAP program, run plain, under ThreadSanitizer and under ASan + UBSan (meson.build).
#include "../cuda_emu/tap.h"
#include "backends/cuda/kernels/convert.cuh"
#include "backends/cuda/kernels/kmeans.cuh"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

// ---- k-means ------------------------------------------------------------------------------------

// backends/cpu/cpu_kmeans.c's kvq_cpu_nearest (built with -ffp-contract=off, as kvq is).
static uint32_t ref_nearest(const float *x, const float *centroids, uint32_t clusters, uint32_t dims, float *distance) {
  uint32_t best = 0;
  float best_d = 0.0f;
  for (uint32_t j = 0; j < clusters; j++) {
    const float *mu = centroids + static_cast<size_t>(j) * dims;
    float sum = 0.0f;
    for (uint32_t i = 0; i < dims; i++) {
      const float diff = x[i] - mu[i];
      const float square = diff * diff;
      sum = sum + square;
    }
    if (j == 0 || sum < best_d) best = j, best_d = sum;
  }
  if (distance) *distance = best_d;
  return best;
}

struct kmeans_problem {
  uint32_t problems, points, dims, clusters;
  std::vector<float> data, weights, centroids; // weights empty: weight 1
};

static void ref_assign(const kmeans_problem &k, std::vector<uint32_t> &assignment, std::vector<float> *distance) {
  for (uint32_t p = 0; p < k.problems; p++)
    for (uint32_t t = 0; t < k.points; t++) {
      const uint64_t i = static_cast<uint64_t>(p) * k.points + t;
      assignment[i] = ref_nearest(k.data.data() + i * k.dims, k.centroids.data() + static_cast<uint64_t>(p) * k.clusters * k.dims,
                                  k.clusters, k.dims, distance ? distance->data() + i : nullptr);
    }
}

// kvq_cpu_kmeans_update.
static void ref_update(const kmeans_problem &k, const std::vector<uint32_t> &assignment, std::vector<float> &centroids) {
  std::vector<double> sum(static_cast<size_t>(k.clusters) * (k.dims + 1));
  for (uint32_t p = 0; p < k.problems; p++) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (uint32_t t = 0; t < k.points; t++) {
      const uint64_t i = static_cast<uint64_t>(p) * k.points + t;
      const uint32_t j = assignment[i] < k.clusters ? assignment[i] : 0;
      const double w = k.weights.empty() ? 1.0 : k.weights[t];
      double *acc = sum.data() + static_cast<size_t>(j) * (k.dims + 1);
      for (uint32_t c = 0; c < k.dims; c++) acc[c] += w * k.data[i * k.dims + c];
      acc[k.dims] += w;
    }
    for (uint32_t j = 0; j < k.clusters; j++) {
      const double *acc = sum.data() + static_cast<size_t>(j) * (k.dims + 1);
      if (acc[k.dims] <= 0.0) continue;
      for (uint32_t c = 0; c < k.dims; c++)
        centroids[(static_cast<uint64_t>(p) * k.clusters + j) * k.dims + c] = static_cast<float>(acc[c] / acc[k.dims]);
    }
  }
}

static uint32_t rng_state = 12345u;
static uint32_t rng() {
  rng_state = rng_state * 1664525u + 1013904223u;
  return rng_state >> 8;
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(rng() & 0xffffu) / 65536.0f; }

static size_t first_difference(const void *a, const void *b, size_t n, size_t size) {
  for (size_t i = 0; i < n; i++)
    if (std::memcmp(static_cast<const char *>(a) + i * size, static_cast<const char *>(b) + i * size, size) != 0) return i;
  return SIZE_MAX;
}

static std::string where(const kvq_emu::Result &r, size_t first) {
  return r.ok ? "first different entry " + std::to_string(first) : r.message;
}

static kvq_emu::Result run_assign(const kmeans_problem &k, std::vector<uint32_t> &assignment, float *distance) {
  const unsigned long long n = static_cast<unsigned long long>(k.problems) * k.points;
  return kvq_emu::launch(kvq_cuda_kmeans_assign, dim3(static_cast<unsigned>((n + KVQ_CUDA_KMEANS_THREADS - 1) / KVQ_CUDA_KMEANS_THREADS)),
                         dim3(KVQ_CUDA_KMEANS_THREADS), 0u, k.problems, k.points, k.dims, k.clusters, k.data.data(), k.centroids.data(),
                         assignment.data(), distance);
}

static kvq_emu::Result run_update(const kmeans_problem &k, const std::vector<uint32_t> &assignment, std::vector<float> &centroids) {
  return kvq_emu::launch(kvq_cuda_kmeans_update, dim3(k.problems * k.clusters), dim3(KVQ_CUDA_KMEANS_THREADS), 0u, k.points, k.dims,
                         k.clusters, k.data.data(), k.weights.empty() ? nullptr : k.weights.data(), assignment.data(), centroids.data());
}

// `steps` Lloyd steps (ASSIGN, then UPDATE of the same assignment) on both sides from the same
// centroids; every step's assignments, distances and centroids must be the reference's bit for bit.
static void lloyd(const std::string &name, kmeans_problem k, int steps, bool with_distance) {
  const size_t n = static_cast<size_t>(k.problems) * k.points;
  bool ok = true;
  std::string detail;
  for (int s = 0; s < steps && ok; s++) {
    std::vector<uint32_t> want(n), got(n, 0xdeadbeefu);
    std::vector<float> want_d(n), got_d(n, -1.0f);
    ref_assign(k, want, &want_d);
    kvq_emu::Result r = run_assign(k, got, with_distance ? got_d.data() : nullptr);
    size_t a = first_difference(got.data(), want.data(), n, 4);
    size_t d = with_distance ? first_difference(got_d.data(), want_d.data(), n, 4) : SIZE_MAX;
    if (!with_distance)
      for (float x : got_d) d = x == -1.0f ? d : 0; // no distance buffer: nothing written there (got_d is not passed)
    if (!r.ok || a != SIZE_MAX || d != SIZE_MAX) {
      ok = false;
      detail = "step " + std::to_string(s) + " ASSIGN: " + (r.ok ? "assignment " + std::to_string(a) + ", distance " + std::to_string(d) : r.message);
      break;
    }
    std::vector<float> want_c(k.centroids), got_c(k.centroids);
    ref_update(k, want, want_c);
    r = run_update(k, got, got_c);
    const size_t c = first_difference(got_c.data(), want_c.data(), want_c.size(), 4);
    if (!r.ok || c != SIZE_MAX) {
      ok = false;
      detail = "step " + std::to_string(s) + " UPDATE: " + where(r, c);
    }
    k.centroids = want_c;
  }
  check(ok, name + ": " + std::to_string(steps) + " Lloyd steps give the CPU's assignments" + (with_distance ? ", distances" : "") +
                " and centroids bit for bit",
        detail);
}

static kmeans_problem random_problem(uint32_t problems, uint32_t points, uint32_t dims, uint32_t clusters, bool weighted, float scale) {
  kmeans_problem k{problems, points, dims, clusters, {}, {}, {}};
  k.data.resize(static_cast<size_t>(problems) * points * dims);
  for (float &x : k.data) x = scale * uniform(-1.0f, 1.0f) * (rng() % 8 == 0 ? 37.0f : 1.0f);
  if (weighted) {
    k.weights.resize(points);
    for (float &w : k.weights) w = rng() % 5 == 0 ? 0.0f : uniform(0.0f, 3.0f);
  }
  k.centroids.resize(static_cast<size_t>(problems) * clusters * dims);
  for (uint32_t p = 0; p < problems; p++) // seeded from the problem's points, as core/learn.c seeds
    for (uint32_t j = 0; j < clusters; j++)
      std::memcpy(&k.centroids[(static_cast<size_t>(p) * clusters + j) * dims],
                  &k.data[(static_cast<size_t>(p) * points + (j * 7u) % points) * dims], sizeof(float) * dims);
  return k;
}

static void test_kmeans() {
  // several problems, more points than a block (a tile and a part), weighted with zeros, and not
  lloyd("k-means 3 problems x 300 points, 4 dims, 16 clusters, weights with zeros", random_problem(3, 300, 4, 16, true, 1.0f), 3, true);
  lloyd("k-means 1 problem x 129 points, 2 dims, 64 clusters, weight 1", random_problem(1, 129, 2, 64, false, 3.0f), 2, true);
  lloyd("k-means 2 problems x 600 points, 1 dim, 8 clusters (PolarQuant's tables)", random_problem(2, 600, 1, 8, true, 1e-3f), 3, true);
  lloyd("k-means dims past the block (130), 2 problems x 40 points, 5 clusters", random_problem(2, 40, 130, 5, true, 1.0f), 3, true);
  lloyd("k-means without a distance buffer", random_problem(2, 50, 3, 4, false, 1.0f), 2, false);
  // large offsets: a float sum in point order would differ from the double sum
  kmeans_problem big = random_problem(1, 500, 2, 3, true, 1.0f);
  for (float &x : big.data) x += 4096.0f;
  lloyd("k-means 500 points near 4096 (a float sum would round differently)", big, 3, true);

  // ties go to the lower index: centroids 1 and 3 equal, and a point halfway between 0 and 2
  {
    kmeans_problem k{1, 3, 2, 4, {0.5f, 0.0f, 5.0f, 5.0f, -3.0f, 1.0f}, {}, {0.0f, 0.0f, 5.0f, 5.0f, 1.0f, 0.0f, 5.0f, 5.0f}};
    std::vector<uint32_t> got(3, 99u);
    std::vector<float> dist(3, -1.0f);
    const kvq_emu::Result r = run_assign(k, got, dist.data());
    // point 0 (0.5, 0) is 0.25 from centroids 0 and 2: centroid 0; point 1 (5, 5) is 0 from 1 and 3:
    // centroid 1; point 2 (-3, 1) is nearest centroid 0
    check(r.ok && got[0] == 0u && got[1] == 1u && got[2] == 0u && dist[0] == 0.25f && dist[1] == 0.0f && dist[2] == 10.0f,
          "k-means ASSIGN: ties go to the lower index", r.ok ? "assignments " + std::to_string(got[0]) + " " + std::to_string(got[1]) + " " +
                                                                 std::to_string(got[2]) : r.message);
  }
  // empty clusters, clusters of zero total weight, and assignments past the clusters (cluster 0)
  {
    kmeans_problem k{2, 6, 2, 4, {}, {1.0f, 2.0f, 0.0f, 0.5f, 0.0f, 1.0f}, {}};
    for (int i = 0; i < 24; i++) k.data.push_back(static_cast<float>(i) * 0.75f - 4.0f);
    for (int i = 0; i < 16; i++) k.centroids.push_back(100.0f + static_cast<float>(i));
    // problem 0: points 0, 1 in 1, point 2 (weight 0) alone in 2, points 3, 5 and 4 (weight 0) past the clusters -> 0; 3 empty
    // problem 1: every point in 3 except 4 (weight 0), which is in 0 alone
    const std::vector<uint32_t> assignment = {1, 1, 2, 4, 0xffffffffu, 7, 3, 3, 3, 3, 0, 3};
    std::vector<float> want(k.centroids), got(k.centroids);
    ref_update(k, assignment, want);
    const kvq_emu::Result r = run_update(k, assignment, got);
    const size_t c = first_difference(got.data(), want.data(), want.size(), 4);
    const bool kept = std::memcmp(&got[2 * 2], &k.centroids[2 * 2], 8) == 0 && std::memcmp(&got[3 * 2], &k.centroids[3 * 2], 8) == 0 &&
                      std::memcmp(&got[(4 + 0) * 2], &k.centroids[(4 + 0) * 2], 8) == 0 &&
                      std::memcmp(&got[(4 + 1) * 2], &k.centroids[(4 + 1) * 2], 8) == 0 &&
                      std::memcmp(&got[(4 + 2) * 2], &k.centroids[(4 + 2) * 2], 8) == 0;
    // cluster 0 of problem 0: points 3 and 5, weights 0.5 and 1
    const float mean0 = static_cast<float>((0.5 * k.data[3 * 2] + 1.0 * k.data[5 * 2]) / 1.5);
    check(r.ok && c == SIZE_MAX && kept && got[0] == mean0,
          "k-means UPDATE: empty clusters and clusters of zero weight keep their centroids; assignments past the clusters count for 0",
          r.ok ? "first different " + std::to_string(c) + (kept ? "" : ", a kept centroid changed") : r.message);
  }
}

// ---- CONVERT ------------------------------------------------------------------------------------

struct place {
  unsigned dtype;
  int64_t offset, strides[3];
};

static unsigned dtype_size(unsigned dtype) { return dtype == KVQ_LAYOUT_F32 ? 4u : 2u; }
static const char *dtype_name(unsigned dtype) { return dtype == KVQ_LAYOUT_F32 ? "fp32" : dtype == KVQ_LAYOUT_F16 ? "fp16" : "bf16"; }

static unsigned load(const std::vector<unsigned char> &buf, unsigned dtype, int64_t e) {
  unsigned bits = 0;
  std::memcpy(&bits, buf.data() + e * dtype_size(dtype), dtype_size(dtype)); // little-endian host
  return bits;
}
static void store(std::vector<unsigned char> &buf, unsigned dtype, int64_t e, unsigned bits) {
  std::memcpy(buf.data() + e * dtype_size(dtype), &bits, dtype_size(dtype));
}

// backends/backend.h's CONVERT, element by element, indices in 64-bit signed arithmetic.
static unsigned ref_convert(const unsigned shape[3], const place &s, const std::vector<unsigned char> &src, const place &d,
                            std::vector<unsigned char> &dst, unsigned checks, unsigned flag) {
  if ((checks & KVQ_CUDA_CONVERT_IF_CLEAR) && flag != 0u) return flag;
  for (unsigned i0 = 0; i0 < shape[0]; i0++)
    for (unsigned i1 = 0; i1 < shape[1]; i1++)
      for (unsigned i2 = 0; i2 < shape[2]; i2++) {
        const unsigned bits = load(src, s.dtype, s.offset + i0 * s.strides[0] + i1 * s.strides[1] + i2 * s.strides[2]);
        const float x = s.dtype == KVQ_LAYOUT_F32 ? kvq_bits_to_f32(bits) : s.dtype == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32(bits)
                                                                                                     : kvq_bf16_bits_to_f32(bits);
        unsigned out = bits;
        if (d.dtype != s.dtype)
          out = d.dtype == KVQ_LAYOUT_F32 ? kvq_f32_to_bits(x) : d.dtype == KVQ_LAYOUT_F16 ? kvq_f32_to_f16_bits(x) : kvq_f32_to_bf16_bits(x);
        if ((checks & KVQ_CUDA_CONVERT_FINITE) && !std::isfinite(x)) flag |= KVQ_CUDA_CONVERT_FINITE, out = 0u;
        const float back = d.dtype == KVQ_LAYOUT_F32 ? kvq_bits_to_f32(out) : d.dtype == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32(out)
                                                                                                       : kvq_bf16_bits_to_f32(out);
        const bool masked = (checks & KVQ_CUDA_CONVERT_MASKED) && x == -std::numeric_limits<float>::infinity();
        if ((checks & KVQ_CUDA_CONVERT_FITS) && (!std::isfinite(x) || !std::isfinite(back)) && !masked) flag |= KVQ_CUDA_CONVERT_FITS;
        if (!(checks & KVQ_CUDA_CONVERT_NO_WRITE))
          store(dst, d.dtype, d.offset + i0 * d.strides[0] + i1 * d.strides[1] + i2 * d.strides[2], out);
      }
  return flag;
}

static kvq_cuda_place device_place(const place &p, std::vector<unsigned char> &buf) {
  return {buf.data(), p.dtype, static_cast<unsigned>(p.offset),
          {static_cast<unsigned>(p.strides[0]), static_cast<unsigned>(p.strides[1]), static_cast<unsigned>(p.strides[2])}};
}

// Source elements: ordinary values, ties, subnormals, fp16's edges, huge values, signed zeros, Inf, NaN
// (inputs 0); finite ones only (1); finite ones and -Inf at every 5th element (2: masked logits).
static unsigned source_bits(unsigned dtype, unsigned i, unsigned inputs) {
  if (inputs == 2 && i % 5 == 0) return dtype == KVQ_LAYOUT_F32 ? 0xff800000u : dtype == KVQ_LAYOUT_F16 ? 0xfc00u : 0xff80u;
  const bool finite_only = inputs != 0;
  static const float special[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 0x1p-24f, 0x1p-25f,
                                  0x1.8p-25f, 3e-8f, 65504.0f, 65519.99f, 65520.0f, -70000.0f, 3.3e38f, 0x1.fffffep127f, -0.0f,
                                  0.0f, 1e-40f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                  kvq_bits_to_f32(0x7fc12345u), kvq_bits_to_f32(0xff800001u)};
  const unsigned count = sizeof special / sizeof special[0];
  if (dtype == KVQ_LAYOUT_F32) {
    float x = i % 3 == 0 && i / 3 < count ? special[i / 3] : uniform(-100.0f, 100.0f);
    if (finite_only && !std::isfinite(x)) x = 1.5f;
    return kvq_f32_to_bits(x);
  }
  unsigned bits = rng() & 0xffffu;                                  // any pattern: Inf and NaN too
  if (i % 11 == 0) bits = dtype == KVQ_LAYOUT_F16 ? 0x7c00u : 0x7f80u; // Inf
  const unsigned exponent = dtype == KVQ_LAYOUT_F16 ? 0x7c00u : 0x7f80u;
  if (finite_only && (bits & exponent) == exponent) bits &= ~0x4000u;
  return bits;
}

static void test_convert() {
  const unsigned shape[3] = {3, 9, 13}; // 351 elements: two blocks of 256, the last partial
  const unsigned dtypes[3] = {KVQ_LAYOUT_F32, KVQ_LAYOUT_F16, KVQ_LAYOUT_BF16};
  // src: rows with gaps, i2 reversed (a negative stride); dst: gaps between rows and between elements
  const place src_shape = {0, 13, {9 * 16, 16, -1}}, dst_shape = {0, 3, {9 * 30 + 5, 30, 2}};
  // the last element of each, then a few more
  const size_t src_elements = 13 + 2 * 9 * 16 + 8 * 16 + 1 + 7, dst_elements = 3 + 2 * (9 * 30 + 5) + 8 * 30 + 12 * 2 + 1 + 9;
  struct variant {
    unsigned checks, flag;
    unsigned inputs; // source_bits's
    const char *what;
  };
  const variant variants[] = {
      {0u, 0u, 0u, "no checks (non-finite copied)"},
      {KVQ_CUDA_CONVERT_FINITE, 0u, 0u, "FINITE (non-finite set bit 1 and write 0)"},
      {KVQ_CUDA_CONVERT_FITS, 0u, 0u, "FITS (non-finite or overflowing set bit 2)"},
      {KVQ_CUDA_CONVERT_FINITE | KVQ_CUDA_CONVERT_FITS, 0u, 0u, "FINITE | FITS"},
      {KVQ_CUDA_CONVERT_FITS | KVQ_CUDA_CONVERT_NO_WRITE, 0u, 0u, "FITS | NO_WRITE (checks only)"},
      {KVQ_CUDA_CONVERT_FINITE, 0u, 1u, "FINITE of finite inputs (no bit)"},
      {KVQ_CUDA_CONVERT_FITS, 0u, 1u, "FITS of finite inputs (bit 2 where fp16 / bf16 overflow)"},
      {KVQ_CUDA_CONVERT_IF_CLEAR, 0u, 0u, "IF_CLEAR with a clear word (writes)"},
      {KVQ_CUDA_CONVERT_IF_CLEAR, KVQ_CUDA_CONVERT_FITS, 0u, "IF_CLEAR with bit 2 set (writes nothing)"},
      {KVQ_CUDA_CONVERT_FITS, 0u, 2u, "FITS of finite inputs and -Inf (bit 2)"},
      {KVQ_CUDA_CONVERT_FITS | KVQ_CUDA_CONVERT_MASKED, 0u, 2u, "FITS | MASKED of finite inputs and -Inf (-Inf passes)"},
  };
  for (unsigned sd : dtypes)
    for (unsigned dd : dtypes) {
      place s = src_shape, d = dst_shape;
      s.dtype = sd, d.dtype = dd;
      bool ok = true;
      std::string detail;
      unsigned bits_seen = 0;
      for (const variant &v : variants) {
        std::vector<unsigned char> src(src_elements * dtype_size(sd), 0x5a);
        for (size_t e = 0; e < src_elements; e++) store(src, sd, static_cast<int64_t>(e), source_bits(sd, static_cast<unsigned>(e), v.inputs));
        std::vector<unsigned char> want(dst_elements * dtype_size(dd) + 2, 0xa5); // two bytes past the last element too
        std::vector<unsigned char> got(want);
        const unsigned want_flag = ref_convert(shape, s, src, d, want, v.checks, v.flag);
        unsigned flag = v.flag;
        const unsigned count = shape[0] * shape[1] * shape[2];
        const kvq_emu::Result r =
            kvq_emu::launch(kvq_cuda_convert, dim3((count + KVQ_CUDA_CONVERT_THREADS - 1) / KVQ_CUDA_CONVERT_THREADS), dim3(KVQ_CUDA_CONVERT_THREADS),
                            0u, shape[0], shape[1], shape[2], device_place(s, src), device_place(d, got), v.checks, &flag);
        const size_t byte = first_difference(got.data(), want.data(), got.size(), 1);
        bits_seen |= want_flag;
        if (!r.ok || byte != SIZE_MAX || flag != want_flag) {
          ok = false;
          detail += std::string(v.what) + ": " +
                    (r.ok ? (byte == SIZE_MAX ? std::string("bytes equal") : "first different byte " + std::to_string(byte)) + ", flag " + std::to_string(flag) + " against " + std::to_string(want_flag)
                          : r.message) + "\n";
        }
        if (v.checks == KVQ_CUDA_CONVERT_IF_CLEAR && v.flag == 0u && std::memcmp(got.data(), std::vector<unsigned char>(got.size(), 0xa5).data(), got.size()) == 0) {
          ok = false;
          detail += "IF_CLEAR with a clear word wrote nothing\n";
        }
      }
      // every pair sees non-finite sources; the narrowing pairs from fp32 also overflow
      const bool flags_exercised = (bits_seen & 3u) == 3u;
      check(ok && flags_exercised,
            std::string("CONVERT ") + dtype_name(sd) + " -> " + dtype_name(dd) +
                ": the reference's bits and flag word under every flag combination, gaps untouched",
            ok ? "the inputs did not set both flag bits" : detail);
    }

  // Known bit patterns, independent of core/halfconv.h: fp32 -> fp16 / bf16 round half to even,
  // fp16 overflow at 65520 (FITS), bf16 overflow of the largest float, NaN payloads kept quiet.
  struct known {
    unsigned src_dtype, dst_dtype, in, out, flag;
  };
  const known cases[] = {
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_F16, 0x3f801000u, 0x3c00u, 0u},    // 1 + 2^-11: tie, to even (1)
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_F16, 0x3f803000u, 0x3c02u, 0u},    // 1 + 3 2^-11: tie, to even (1 + 2^-9)
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_F16, 0x477fefffu, 0x7bffu, 0u},    // just below 65520: 65504
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_F16, 0x477ff000u, 0x7c00u, 2u},    // 65520: Inf, FITS
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_F16, 0xc7800000u, 0xfc00u, 2u},    // -65536: -Inf, FITS
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_F16, 0x33800000u, 0x0001u, 0u},    // 2^-24: the least subnormal
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_F16, 0x33000000u, 0x0000u, 0u},    // 2^-25: tie, to even (0)
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_BF16, 0x3f808000u, 0x3f80u, 0u},   // 1 + 2^-8: tie, to even
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_BF16, 0x3f818000u, 0x3f82u, 0u},   // 1 + 3 2^-8: tie, to even
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_BF16, 0x7f7fffffu, 0x7f80u, 2u},   // the largest float: Inf, FITS
      {KVQ_LAYOUT_F32, KVQ_LAYOUT_BF16, 0x7f800001u, 0x7fc0u, 2u},   // signalling NaN: quiet, FITS
      {KVQ_LAYOUT_F16, KVQ_LAYOUT_F32, 0x0001u, 0x33800000u, 0u},    // fp16 subnormal widened exactly
      {KVQ_LAYOUT_F16, KVQ_LAYOUT_BF16, 0x7bffu, 0x4780u, 0u},       // 65504 to bf16: 65536, no overflow
      {KVQ_LAYOUT_BF16, KVQ_LAYOUT_F16, 0x4780u, 0x7c00u, 2u},       // 65536 from bf16: Inf in fp16, FITS
      {KVQ_LAYOUT_F16, KVQ_LAYOUT_F16, 0x7e01u, 0x7e01u, 2u},        // a NaN copied with its bits, FITS
  };
  bool ok = true;
  std::string detail;
  for (const known &k : cases) {
    std::vector<unsigned char> src(4, 0), dst(12, 0xa5);
    std::memcpy(src.data(), &k.in, 4);
    unsigned flag = 0;
    const unsigned size = dtype_size(k.dst_dtype);
    const kvq_cuda_place s = {src.data(), k.src_dtype, 0u, {1u, 1u, 1u}}, d = {dst.data(), k.dst_dtype, 1u, {1u, 1u, 1u}};
    const kvq_emu::Result r = kvq_emu::launch(kvq_cuda_convert, dim3(1), dim3(KVQ_CUDA_CONVERT_THREADS), 0u, 1u, 1u, 1u, s, d,
                                              KVQ_CUDA_CONVERT_FITS, &flag);
    unsigned out = 0;
    std::memcpy(&out, dst.data() + size, size); // element 1
    bool around = true;
    for (unsigned b = 0; b < dst.size(); b++) around = around && (b >= size && b < 2 * size ? true : dst[b] == 0xa5);
    if (!r.ok || out != k.out || flag != k.flag || !around) {
      ok = false;
      char line[160];
      std::snprintf(line, sizeof line, "%s 0x%x -> %s: 0x%x flag %u (want 0x%x flag %u)%s\n", dtype_name(k.src_dtype), k.in,
                    dtype_name(k.dst_dtype), out, flag, k.out, k.flag, around ? "" : ", a neighbour written");
      detail += r.ok ? line : r.message;
    }
  }
  check(ok, "CONVERT: known fp16 / bf16 bit patterns (ties to even, overflow to Inf with FITS, subnormals, NaN), neighbours untouched", detail);
}

int main() {
  test_kmeans();
  test_convert();
  std::printf("1..%d\n", tap_number);
  return tap_failures ? 1 : 0;
}
