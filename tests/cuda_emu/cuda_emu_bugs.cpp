// Runs one planted bug of emu_bugs.cuh that only a sanitizer can catch, built twice (tests/cuda_emu/
// meson.build): with ThreadSanitizer for the missing barrier, with AddressSanitizer for the indices past
// shared memory or a per-thread array. sanitizer_bugs.sh checks that each run fails with the sanitizer's
// report, with the threads as fibers and as OS threads (KVQ_CUDA_EMU_THREADS).
// usage: cuda_emu_bugs race | late_race | warp_race | shared_overflow | dynamic_overflow | local_overflow
#include "emu_bugs.cuh"

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  const std::string bug = argc > 1 ? argv[1] : "";
  std::vector<float> in(128, 1.0f), out(128);
  kvq_emu::Result r;
  if (bug == "race") r = kvq_emu::launch(bug_missing_sync, dim3(1), dim3(128), 0, in.data(), out.data());
  else if (bug == "late_race") r = kvq_emu::launch(bug_missing_sync_last_block, dim3(300), dim3(128), 0, in.data(), out.data());
  else if (bug == "warp_race") r = kvq_emu::launch(bug_shuffle_as_barrier, dim3(1), dim3(32), 0, out.data());
  else if (bug == "shared_overflow") r = kvq_emu::launch(bug_shared_overflow, dim3(1), dim3(128), 0, in.data(), out.data());
  else if (bug == "local_overflow") r = kvq_emu::launch(bug_local_overflow, dim3(1), dim3(64), 0, in.data(), out.data(), 8);
  else if (bug == "dynamic_overflow") r = kvq_emu::launch(bug_dynamic_overflow, dim3(1), dim3(128), 128 * sizeof(float), out.data());
  else {
    std::fprintf(stderr, "usage: %s race | late_race | warp_race | shared_overflow | dynamic_overflow | local_overflow\n", argv[0]);
    return 2;
  }
  std::printf("the launch finished without a sanitizer report (%s)\n", r.ok ? "ok" : r.message.c_str());
  return 0;
}
