// Tests of kvq's CUDA thread-model emulation (backends/cuda/emu/cuda_emu.h): the kernels of
// emu_kernels.cuh against host references, and the planted bugs of emu_bugs.cuh that the emulator
// itself must report (quickly, as a failed launch, not a hang or an abort). A plain TAP program: it
// also runs under ThreadSanitizer (test cuda_emu_tsan), where Criterion's runner cannot start.
// The bugs that only a sanitizer catches are run by cuda_emu_bugs.cpp (sanitizer_bugs.sh).
#include "emu_bugs.cuh"
#include "emu_kernels.cuh"
#include "tap.h"

#include "core/halfconv.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

static void test_block_sum_128() {
  const int blocks = 8, n = 1000;
  std::vector<float> in(blocks * n), out(blocks, -1.0f);
  for (int i = 0; i < blocks * n; ++i) in[i] = std::sin(0.001f * static_cast<float>(i)) * static_cast<float>(i % 7 - 3);
  float total = 0.0f;
  int absmax_bits = 0;
  const kvq_emu::Result r = kvq_emu::launch(emu_block_sum<128>, dim3(blocks), dim3(128), 0, in.data(), out.data(), &total, &absmax_bits, n);
  double ref_total = 0.0;
  float ref_max = 0.0f;
  bool sums_ok = r.ok;
  std::string detail = r.message;
  for (int b = 0; b < blocks; ++b) {
    double ref = 0.0;
    for (int i = 0; i < n; ++i) {
      ref += in[b * n + i];
      ref_max = std::fmax(ref_max, std::fabs(in[b * n + i]));
    }
    ref_total += ref;
    if (std::fabs(ref - out[b]) > 1e-4 * (1.0 + std::fabs(ref))) {
      sums_ok = false;
      detail += "block " + std::to_string(b) + ": " + std::to_string(out[b]) + " != " + std::to_string(ref) + "\n";
    }
  }
  check(sums_ok, "a block reduction (static shared memory, __shfl_xor_sync, __syncthreads, __shfl_down_sync) matches the reference", detail);
  check(r.ok && std::fabs(ref_total - total) <= 1e-4 * (1.0 + std::fabs(ref_total)), "atomicAdd on float sums every block",
        std::to_string(total) + " != " + std::to_string(ref_total));
  check(r.ok && __int_as_float(absmax_bits) == ref_max, "atomicMax on the bits of non-negative floats finds the largest",
        std::to_string(__int_as_float(absmax_bits)) + " != " + std::to_string(ref_max));
}

// The reduction on constant data, where every sum is exact: blocks of THREADS threads.
template <int THREADS> static void test_block_sum_exact(int blocks, int n, float value, const std::string &what) {
  std::vector<float> in(static_cast<size_t>(blocks) * n, value), out(blocks);
  float total = 0.0f;
  int absmax_bits = 0;
  const kvq_emu::Result r = kvq_emu::launch(emu_block_sum<THREADS>, dim3(blocks), dim3(THREADS), 0, in.data(), out.data(), &total, &absmax_bits, n);
  bool ok = r.ok && total == value * static_cast<float>(n * blocks) && __int_as_float(absmax_bits) == value;
  for (float o : out) ok = ok && o == value * static_cast<float>(n);
  check(ok, what, r.message);
}

static void test_reverse() {
  const int blocks = 5;
  const dim3 block(16, 4);
  const int n = 64;
  std::vector<float> in(blocks * n), out(blocks * n, -1.0f);
  std::vector<float4> scale(blocks);
  for (int i = 0; i < blocks * n; ++i) in[i] = static_cast<float>(i);
  for (int b = 0; b < blocks; ++b) scale[b] = make_float4(0.5f, 0.25f, 0.25f, static_cast<float>(b));
  const kvq_emu::Result r = kvq_emu::launch(emu_reverse, dim3(blocks), block, n * sizeof(float), in.data(), out.data(), scale.data());
  bool ok = r.ok;
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t) ok = ok && out[b * n + t] == in[b * n + n - 1 - t] * (1.0f + static_cast<float>(b));
  check(ok, "dynamic shared memory in 2-D blocks, with float4 loads, reverses each block", r.message);
}

static void test_atomics() {
  emu_counters c{};
  c.imax = -1000;
  c.imin = 1000;
  c.umin = 0xffffffffu;
  c.bits_and = 0xffffffffu;
  const int blocks = 4, threads = 96, all = blocks * threads;
  const kvq_emu::Result r = kvq_emu::launch(emu_atomics, dim3(blocks), dim3(threads), 0, &c);
  check(r.ok && c.f == 0.5f * all && c.d == 0.25 * all, "atomicAdd on float and double", r.message);
  check(r.ok && c.i == 2 * all && c.u == 3u * all && c.ull == static_cast<unsigned long long>(all) << 33,
        "atomicAdd on int, unsigned and unsigned long long");
  check(r.ok && c.imax == all - 1 - 100 && c.imin == -100 && c.umax == (all - 1) * 7u && c.umin == 5u, "atomicMax and atomicMin on int and unsigned");
  check(r.ok && c.bits_or == 0xffffffffu && c.bits_and == 0xffff0000u, "atomicOr and atomicAnd");
  check(r.ok && c.cas_count == all && c.exch == 42, "atomicCAS loops and atomicExch");
}

static void test_warp_ops() {
  const int blocks = 2;
  std::vector<unsigned> out(blocks * 9 * 32, 0xdeadbeefu);
  const kvq_emu::Result r = kvq_emu::launch(emu_warp_ops, dim3(blocks), dim3(32), 0, out.data());
  unsigned ballot3 = 0;
  for (unsigned l = 0; l < 32; l += 3) ballot3 |= 1u << l;
  bool vote = r.ok, half = r.ok, scan = r.ok, seg = r.ok, sync = r.ok, dbl = r.ok, fp16 = r.ok;
  for (int b = 0; b < blocks; ++b)
    for (unsigned l = 0; l < 32; ++l) {
      const unsigned *o = out.data() + b * 9 * 32;
      vote = vote && o[l] == ballot3 && o[32 + l] == (1u | 4u);
      half = half && o[64 + l] == (l < 16 ? 0x0000aaaau : 0xaaaa0000u);
      scan = scan && o[96 + l] == (l + 1) * (l + 2) / 2;
      seg = seg && o[128 + l] == ((l & ~7u) + 3) * 10 && o[160 + l] == ((l & 4) ? (l ^ 4) : l);
      sync = sync && o[192 + l] == (31 - l) * (31 - l);
      dbl = dbl && o[224 + l] == (l < 31 ? (l + 1) * 2 : l * 2);
      fp16 = fp16 && o[256 + l] == ((l ^ 1) + 1) * 1000 + 15;
    }
  check(vote, "__ballot_sync, __any_sync and __all_sync over a full warp", r.message);
  check(half, "two half warps vote with disjoint masks at the same time");
  check(scan, "a prefix sum with __shfl_up_sync");
  check(seg, "__shfl_sync and __shfl_xor_sync with a width of 8 and 4 (CUDA's rules for lanes outside the group)");
  check(sync, "__syncwarp orders shared memory between the lanes of a warp");
  check(dbl, "__shfl_down_sync moves a double");
  check(fp16, "shuffles move __half2 and __nv_bfloat16");
}

static void test_half() {
  std::vector<float> in;
  for (int i = -2000; i <= 2000; ++i) in.push_back(static_cast<float>(i) * 0.37f + static_cast<float>(i % 13) * 1e-3f);
  for (float x : {0.0f, -0.0f, 6.0e-8f, 3.0e-6f, -5.9e-5f, 65504.0f, 65519.0f, 65520.0f, 1e30f, -1e-30f, 1.0f / 3.0f, INFINITY, -INFINITY})
    in.push_back(x);
  const int n = static_cast<int>(in.size());
  std::vector<unsigned short> h(n), bf(n);
  std::vector<float> back(n);
  const kvq_emu::Result r = kvq_emu::launch(emu_half, dim3((n + 127) / 128), dim3(128), 0, in.data(), h.data(), bf.data(), back.data(), n);
  bool half_ok = r.ok, bf_ok = r.ok, back_ok = r.ok;
  std::string detail = r.message;
  for (int i = 0; i < n; ++i) {
    if (h[i] != kvq_f32_to_f16_bits(in[i])) {
      half_ok = false;
      detail += "fp16 of " + std::to_string(in[i]) + "\n";
    }
    if (bf[i] != kvq_f32_to_bf16_bits(in[i])) {
      bf_ok = false;
      detail += "bf16 of " + std::to_string(in[i]) + "\n";
    }
    const float twice = kvq_f16_bits_to_f32(kvq_f32_to_f16_bits(2.0f * kvq_round_f16(in[i])));
    const float ref = twice + kvq_bf16_bits_to_f32(kvq_f32_to_bf16_bits(in[i]));
    if (!(back[i] == ref || (std::isnan(back[i]) && std::isnan(ref)))) back_ok = false;
  }
  check(half_ok, "NVIDIA's host __float2half_rn agrees bit for bit with kvq's fp16 conversion (core/halfconv.h)", detail);
  check(bf_ok, "NVIDIA's host __float2bfloat16_rn agrees bit for bit with kvq's bf16 conversion");
  check(back_ok, "__hadd, __half2float and __bfloat162float on the host");
}

// A planted bug must fail the launch, with a message naming `expect`, within `seconds`.
template <class... P, class... A>
static void expect_failure(const std::string &what, const std::string &expect, double seconds, void (*kernel)(P...), dim3 grid, dim3 block,
                           A... args) {
  const auto start = std::chrono::steady_clock::now();
  const kvq_emu::Result r = kvq_emu::launch(kernel, grid, block, 0, args...);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check(!r.ok && r.message.find(expect) != std::string::npos && took < seconds,
        what + " is reported (" + std::to_string(static_cast<int>(took * 1000)) + " ms)", r.ok ? "the launch succeeded" : r.message);
  if (!r.ok) std::printf("# %s\n", r.message.substr(0, r.message.find('\n')).c_str());
}

// The divergence checks, with a block's threads run as `threads` (fibers or OS threads).
static void test_bugs(kvq_emu::threads_kind threads, const std::string &as) {
  kvq_emu::threads_mode = static_cast<int>(threads);
  // Divergence and deadlocks are found when they happen, not at the timeout: a short timeout here
  // would not tell them apart.
  std::vector<float> f(256);
  std::vector<unsigned> u(256);
  expect_failure("a full-mask shuffle called by half of each warp" + as, "__shfl_xor_sync", 5.0, bug_half_warp_shuffle, dim3(2),
                 dim3(64), f.data());
  expect_failure("a return before __syncthreads" + as, "__syncthreads", 5.0, bug_return_before_barrier, dim3(1), dim3(64), f.data(), 40);
  expect_failure("two halves of a block at different __syncthreads" + as, "must meet at the same __syncthreads", 5.0, bug_different_barriers,
                 dim3(1), dim3(64), f.data());
  expect_failure("a mask that leaves out the calling lanes" + as, "does not name the calling lane", 5.0, bug_lane_not_in_mask, dim3(1),
                 dim3(32), u.data());
  expect_failure("overlapping masks in one warp" + as, "divergent warp operation", 5.0, bug_mask_mismatch, dim3(1), dim3(32), u.data());
  expect_failure("a shuffle that reads a lane outside its mask" + as, "which the mask does not name", 5.0, bug_read_outside_mask, dim3(1),
                 dim3(32), u.data());
  expect_failure("a mask naming lanes past the end of the block" + as, "does not have", 5.0, bug_lane_not_in_mask, dim3(1), dim3(8), u.data());
  kvq_emu::threads_mode = 0;
}

static void test_refusals() {
  std::vector<float> f(256);
  // Only OS threads run at once, so only they can wait for a thread that is late: with fibers the
  // late thread runs to the barrier before the others are resumed.
  kvq_emu::threads_mode = static_cast<int>(kvq_emu::threads_kind::os);
  kvq_emu::timeout_ms = 200;
  expect_failure("a thread that keeps the others waiting past the timeout (OS threads)", "timeout", 10.0, bug_late_thread, dim3(1), dim3(64),
                 f.data(), 1500);
  kvq_emu::timeout_ms = 0;
  kvq_emu::threads_mode = 0;
  const kvq_emu::Result bad = kvq_emu::launch(emu_reverse, dim3(1), dim3(2048), 0, f.data(), f.data(), static_cast<const float4 *>(nullptr));
  check(!bad.ok && bad.message.find("invalid launch configuration") != std::string::npos, "a block of 2048 threads is refused", bad.message);
}

int main() {
  // The kernels below run with the default, fibers (KVQ_CUDA_EMU_THREADS unset); the last check with OS threads.
  std::printf("1..40\n");
  test_block_sum_128();
  test_block_sum_exact<256>(3, 5000, 0.25f, "the reduction with 256 threads (8 warps) is exact on exact data");
  test_block_sum_exact<1024>(2, 4096, 0.5f, "the reduction with the largest block, 1024 threads (32 warps)");
  test_reverse();
  test_atomics();
  test_warp_ops();
  test_half();
  test_bugs(kvq_emu::threads_kind::fibers, " (fibers)");
  test_bugs(kvq_emu::threads_kind::os, " (OS threads)");
  test_refusals();
  test_block_sum_exact<256>(3, 5000, 0.25f, "the emulator runs kernels again after the failed launches");
  kvq_emu::threads_mode = static_cast<int>(kvq_emu::threads_kind::os);
  test_block_sum_exact<256>(3, 5000, 0.25f, "the reduction with 256 threads as OS threads");
  test_block_sum_exact<1024>(1, 4096, 0.5f, "the reduction with 1024 threads as OS threads");
  kvq_emu::threads_mode = 0;
  return tap_failures ? 1 : 0;
}
