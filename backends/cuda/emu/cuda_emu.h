// kvq's emulation of CUDA's thread model on the CPU, so that CUDA kernels run in tests without a GPU
// (docs/CUDA.md, "Testing CUDA kernels without a GPU").
//
// A kernel is written once in a .cuh against backends/cuda/kernel_lang.cuh; nvcc compiles it for the
// GPU, and a host C++17 compiler compiles it against this header. Here:
//   - every CUDA thread of a block has its own stack and registers: a fiber (a user-level thread, the
//     default), or an OS thread (KVQ_CUDA_EMU_THREADS=os). Fibers take turns on the launching thread,
//     each running until it waits at a barrier or warp operation or returns; OS threads run at once.
//     The checks below are the same in both; the blocks of a grid run one after another;
//   - static shared memory (KVQ_SHARED) and dynamic shared memory (KVQ_DYNAMIC_SHARED) are heap blocks
//     of exactly the declared size, one set per block, so AddressSanitizer reports an index past them;
//   - __syncthreads and the warp operations (__syncwarp, __shfl*_sync, __ballot_sync, __any_sync,
//     __all_sync) are rendezvous under one mutex per block that check what CUDA requires of them: every
//     thread of the block at the same __syncthreads, every lane named in a mask calling with that mask,
//     no lane calling that its mask leaves out. A violation, a deadlock (every live thread waiting) or a
//     wait longer than the timeout ends the launch with a failure message instead of a hang or an abort;
//   - under ThreadSanitizer only __syncthreads and __syncwarp order memory between threads (as on the
//     GPU), so a missing barrier is reported as a data race (fibers are ThreadSanitizer fibers whose
//     switches order nothing, so the same holds for them).
// Fibers exist for speed: with OS threads, every barrier of a 128-thread block wakes 128 threads on a
// machine of few cores, and a golden check spent 118 of its 120 seconds in the kernel (docs/CUDA.md).
// Half and bf16 come from NVIDIA's own cuda_fp16.h / cuda_bf16.h host paths, vector types from
// vector_types.h / vector_functions.h (the CUDA toolkit's include directory must be on the path).
#ifndef KVQ_BACKENDS_CUDA_EMU_CUDA_EMU_H
#define KVQ_BACKENDS_CUDA_EMU_CUDA_EMU_H

#if defined(__CUDACC__)
#error "cuda_emu.h emulates CUDA on the host; nvcc compiles kernels for the GPU (include kernel_lang.cuh)"
#endif
#if __cplusplus < 201703L
#error "cuda_emu.h needs C++17"
#endif

#define KVQ_CUDA_EMU 1

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// NVIDIA's host_defines.h (pulled in above) defines __device__, __global__, __host__ and
// __forceinline__ for a host compiler. Plain __shared__ has no meaning here: a kernel declares shared
// memory with KVQ_SHARED / KVQ_DYNAMIC_SHARED, and a plain __shared__ fails to compile with this name.
#undef __shared__
#define __shared__ kvq_cuda_emu_error_declare_shared_memory_with_KVQ_SHARED
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __restrict__
#define __restrict__ __restrict
#endif

#if defined(__SANITIZE_THREAD__)
#define KVQ_CUDA_EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVQ_CUDA_EMU_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVQ_CUDA_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVQ_CUDA_EMU_ASAN 1
#endif
#endif
#if defined(KVQ_CUDA_EMU_ASAN)
// AddressSanitizer's fiber interface: where the stack is after a switch (exported by its runtime).
extern "C" {
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
}
#endif

#if defined(KVQ_CUDA_EMU_TSAN)
// ThreadSanitizer's annotation and fiber interfaces (exported by its runtime).
extern "C" {
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
void AnnotateHappensBefore(const char *file, int line, const volatile void *addr);
void AnnotateHappensAfter(const char *file, int line, const volatile void *addr);
void AnnotateIgnoreSyncBegin(const char *file, int line);
void AnnotateIgnoreSyncEnd(const char *file, int line);
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
}
#endif

// The built-in variables: each emulated thread has its own.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace kvq_emu {

// Where a barrier or warp operation is called from (for the failure messages).
struct Site {
  const char *file;
  int line;
};
inline bool same_site(Site a, Site b) { return a.line == b.line && std::strcmp(a.file, b.file) == 0; }
inline std::string site_text(Site s) { return std::string(s.file) + ":" + std::to_string(s.line); }

// What a launch reports: ok, or the first failure with the state of the block's threads.
struct Result {
  bool ok = true;
  std::string message;
};

// How long one thread may wait at a barrier or warp operation before the launch fails. 0: the
// environment variable KVQ_CUDA_EMU_TIMEOUT_MS, else 20 s (generous: sanitizers slow threads down, and
// a deadlock among waiting threads is reported at once without it).
inline std::atomic<long> timeout_ms{0};
inline std::chrono::milliseconds timeout() {
  long ms = timeout_ms.load();
  if (ms <= 0) {
    const char *env = std::getenv("KVQ_CUDA_EMU_TIMEOUT_MS");
    ms = env ? std::atol(env) : 0;
  }
  return std::chrono::milliseconds(ms > 0 ? ms : 20000);
}

// The most shared memory (static + dynamic) one block may use: 227 KiB, the largest opt-in of any
// current GPU (sm_90). The 48 KiB default limit without cudaFuncSetAttribute is not modelled.
constexpr size_t max_shared_bytes = 227 * 1024;

// Thrown into a thread that waits, or calls a barrier, after its launch has failed; the thread ends.
struct aborted {};

#if defined(KVQ_CUDA_EMU_TSAN)
// The emulator's own bookkeeping is invisible to ThreadSanitizer: neither its memory accesses nor its
// mutex create or check anything. Ordering between kernel threads is then exactly what tsan_release /
// tsan_acquire state: the edges of __syncthreads and __syncwarp.
struct internal_scope {
  internal_scope() {
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~internal_scope() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
  }
  internal_scope(const internal_scope &) = delete;
  internal_scope &operator=(const internal_scope &) = delete;
};
// The emulator's own memory accesses outside internal_scope (the fibers' bookkeeping, the builtin
// variables it sets): invisible, while its synchronisation annotations still count.
struct ignore_accesses {
  ignore_accesses() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~ignore_accesses() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
  ignore_accesses(const ignore_accesses &) = delete;
  ignore_accesses &operator=(const ignore_accesses &) = delete;
};
inline void tsan_release(const void *addr) {
  AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
  AnnotateHappensBefore(__FILE__, __LINE__, addr);
  AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
}
inline void tsan_acquire(const void *addr) {
  AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
  AnnotateHappensAfter(__FILE__, __LINE__, addr);
  AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
}
#else
struct internal_scope { // nothing to hide (user-provided, so that an unused instance is no warning)
  internal_scope() {}
  ~internal_scope() {}
};
struct ignore_accesses {
  ignore_accesses() {}
  ~ignore_accesses() {}
};
inline void tsan_release(const void *) {}
inline void tsan_acquire(const void *) {}
#endif

enum class op { syncwarp, shfl, shfl_up, shfl_down, shfl_xor, ballot, any, all };
inline const char *op_name(op o) {
  switch (o) {
  case op::syncwarp: return "__syncwarp";
  case op::shfl: return "__shfl_sync";
  case op::shfl_up: return "__shfl_up_sync";
  case op::shfl_down: return "__shfl_down_sync";
  case op::shfl_xor: return "__shfl_xor_sync";
  case op::ballot: return "__ballot_sync";
  case op::any: return "__any_sync";
  case op::all: return "__all_sync";
  }
  return "?";
}
// Ballot, any and all are one operation on the hardware (a vote); they may meet in one rendezvous.
inline bool same_kind(op a, op b) {
  auto vote = [](op o) { return o == op::ballot || o == op::any || o == op::all; };
  return a == b || (vote(a) && vote(b));
}

// One rendezvous of some lanes of a warp: open until every lane of its mask has arrived.
struct warp_group {
  op kind;
  unsigned mask;
  unsigned arrived = 0;
  bool done = false;
  Site site;
  uint64_t value[32] = {};
};

enum class state { running, barrier, warp, exited };

struct block {
  std::mutex m;
  std::condition_variable cv;
  unsigned nthreads = 0;
  unsigned exited = 0;
  unsigned blocked = 0; // threads waiting at a barrier or warp operation that has not completed
  unsigned bar_arrived = 0;
  unsigned long bar_gen = 0;
  Site bar_site{"", 0};
  char bar_sync[2] = {0, 0}; // ThreadSanitizer edges of __syncthreads, alternating by generation
  std::vector<state> where;
  std::vector<Site> at;
  std::vector<std::vector<std::shared_ptr<warp_group>>> open; // per warp
  struct smem_deleter {
    size_t align;
    void operator()(unsigned char *p) const { ::operator delete[](p, std::align_val_t(align)); }
  };
  using smem = std::unique_ptr<unsigned char[], smem_deleter>;
  std::vector<std::pair<const void *, smem>> statics;
  smem dynamic{nullptr, smem_deleter{16}};
  size_t shared_bytes = 0;
  bool failed = false;
  std::string message;
  uint3 index{0, 0, 0};
  dim3 dim;
  struct fiber_runner *fibers = nullptr; // the block's fibers, or null: its threads are OS threads
};
inline void fiber_yield(fiber_runner &f);

struct thread_ctx {
  block *b;
  unsigned tid;
};
inline thread_local thread_ctx *current = nullptr;

inline thread_ctx &ctx() {
  if (!current) {
    std::fprintf(stderr, "kvq cuda emu: a CUDA builtin was called outside a kernel launched by kvq_emu::launch\n");
    std::abort();
  }
  return *current;
}

inline std::string thread_name(const block &b, unsigned tid) {
  return "thread (" + std::to_string(tid % b.dim.x) + "," + std::to_string(tid / b.dim.x % b.dim.y) + "," +
         std::to_string(tid / (b.dim.x * b.dim.y)) + ")";
}

// Where the threads of the block are: "N threads <state> (first: thread (x,y,z))", one line each.
inline std::string describe(const block &b) {
  std::map<std::string, std::pair<unsigned, unsigned>> groups; // what -> (count, first thread)
  for (unsigned t = 0; t < b.nthreads; ++t) {
    std::string what;
    switch (b.where[t]) {
    case state::running: what = "still running"; break;
    case state::exited: what = "returned from the kernel"; break;
    case state::barrier: what = "wait at __syncthreads at " + site_text(b.at[t]); break;
    case state::warp: what = "wait at a warp operation at " + site_text(b.at[t]); break;
    }
    auto it = groups.find(what);
    if (it == groups.end()) groups.emplace(what, std::make_pair(1u, t));
    else ++it->second.first;
  }
  std::string s;
  for (const auto &g : groups)
    s += "\n  " + std::to_string(g.second.first) + " thread(s) " + g.first + " (first: " + thread_name(b, g.second.second) + ")";
  return s;
}

// Records the launch's first failure (with the block's state) and wakes every waiting thread.
inline void record_failure(block &b, const std::string &what) {
  if (!b.failed) {
    b.failed = true;
    b.message = "block (" + std::to_string(b.index.x) + "," + std::to_string(b.index.y) + "," + std::to_string(b.index.z) +
                "): " + what + describe(b);
  }
  b.cv.notify_all();
}
[[noreturn]] inline void fail(block &b, const std::string &what) {
  record_failure(b, what);
  throw aborted{};
}

// After a thread starts waiting: if every live thread now waits, none of them can ever go on.
inline void check_deadlock(block &b) {
  if (b.blocked > 0 && b.blocked == b.nthreads - b.exited)
    fail(b, "deadlock: every thread that has not returned waits at a barrier or warp operation that cannot complete");
}

// Blocks this thread (lock held) at a barrier or warp operation until done() or the launch fails; a wait
// past the timeout fails the launch. Another thread's completion marks it running again.
template <class Done> void wait_at(block &b, std::unique_lock<std::mutex> &lk, unsigned tid, state where, Site s, const char *what, Done done) {
  b.where[tid] = where;
  b.at[tid] = s;
  ++b.blocked;
  check_deadlock(b);
  if (b.fibers) { // a fiber: the others run until one of them completes the rendezvous (or the launch fails)
    while (!done()) {
      if (b.failed) throw aborted{};
      lk.unlock();
      fiber_yield(*b.fibers);
      lk.lock();
    }
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  while (!done()) {
    if (b.failed) throw aborted{};
    if (b.cv.wait_until(lk, deadline) == std::cv_status::timeout && !done() && !b.failed)
      fail(b, "timeout: " + thread_name(b, tid) + " waited " + std::to_string(timeout().count()) + " ms at " + what + " at " +
                  site_text(s) + " (a thread that never arrives: divergence, or a loop that does not end)");
  }
}

// The last arrival completes a rendezvous: the `released` waiting threads run again (marked before
// they wake, since other threads look at their state).
template <class Waiting> void complete(block &b, unsigned released, Waiting waiting) {
  b.blocked -= released;
  for (unsigned t = 0; t < b.nthreads; ++t)
    if (waiting(t)) b.where[t] = state::running;
  b.cv.notify_all();
}

inline void syncthreads(Site s) {
  thread_ctx &c = ctx();
  block &b = *c.b;
  internal_scope quiet;
  std::unique_lock<std::mutex> lk(b.m);
  if (b.failed) throw aborted{};
  if (b.exited)
    fail(b, "__syncthreads at " + site_text(s) + " reached by " + thread_name(b, c.tid) +
                " after other threads of the block returned: every thread of a block must reach every __syncthreads "
                "(a return before a barrier?)");
  if (b.bar_arrived == 0) b.bar_site = s;
  else if (!same_site(b.bar_site, s))
    fail(b, thread_name(b, c.tid) + " waits at __syncthreads at " + site_text(s) + " while others wait at the one at " +
                site_text(b.bar_site) + ": the threads of a block must meet at the same __syncthreads (divergent barrier)");
  const unsigned long gen = b.bar_gen;
  const void *edge = &b.bar_sync[gen & 1];
  tsan_release(edge);
  if (++b.bar_arrived == b.nthreads) {
    b.bar_arrived = 0;
    ++b.bar_gen;
    complete(b, b.nthreads - 1, [&](unsigned t) { return b.where[t] == state::barrier; });
  } else {
    wait_at(b, lk, c.tid, state::barrier, s, "__syncthreads", [&] { return b.bar_gen != gen; });
  }
  tsan_acquire(edge);
}

// One warp operation: a rendezvous of the lanes named in mask, which must all call the same kind of
// operation with the same mask. use(value) runs when all have arrived, with every lane's value.
template <class Use> void warp_op(Site s, op kind, unsigned mask, uint64_t mine, Use use) {
  thread_ctx &c = ctx();
  block &b = *c.b;
  internal_scope quiet;
  std::unique_lock<std::mutex> lk(b.m);
  if (b.failed) throw aborted{};
  const unsigned lane = c.tid % 32, warp = c.tid / 32, bit = 1u << lane;
  const unsigned lanes = std::min(32u, b.nthreads - warp * 32);
  const unsigned exist = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  char hex[16];
  // The call as a failure message names it: built only on a failure (at every call, its few heap
  // strings per shuffle were a large part of a profile of the golden matrix under ThreadSanitizer,
  // which intercepts every allocation and records its stack).
  auto call = [&] {
    char m[16];
    std::snprintf(m, sizeof m, "0x%08x", mask);
    return std::string(op_name(kind)) + "(mask " + m + ") at " + site_text(s) + " by " + thread_name(b, c.tid);
  };
  if (!(mask & bit)) fail(b, call() + ": the mask does not name the calling lane " + std::to_string(lane));
  if (mask & ~exist)
    fail(b, call() + ": the mask names lanes this warp does not have (the block has " + std::to_string(b.nthreads) + " threads)");
  for (unsigned l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u) || l == lane) continue;
    const state w = b.where[warp * 32 + l];
    if (w == state::exited)
      fail(b, call() + ": lane " + std::to_string(l) + ", named in the mask, has returned from the kernel (divergent warp operation)");
    if (w == state::barrier)
      fail(b, call() + ": lane " + std::to_string(l) + ", named in the mask, waits at __syncthreads at " + site_text(b.at[warp * 32 + l]));
  }
  // Lanes may be at different warp operations at once (disjoint masks; or a lane at its next operation
  // while others finish the last one without it). A group that names this lane and that lanes of this
  // call's mask already wait at can never complete: they wait for this lane, this lane for them.
  auto &open = b.open[warp];
  std::shared_ptr<warp_group> g;
  for (auto &o : open) {
    if ((o->mask & bit) && (o->arrived & mask) && !(o->mask == mask && same_kind(o->kind, kind))) {
      std::snprintf(hex, sizeof hex, "0x%08x", o->mask);
      fail(b, call() + ": other lanes of the warp wait for this lane at " + op_name(o->kind) + "(mask " + hex + ") at " +
                  site_text(o->site) + ": every lane named in a mask must call the same operation with the same mask (divergent warp operation)");
    }
    if (o->mask == mask && same_kind(o->kind, kind) && !(o->arrived & bit)) g = o;
  }
  if (!g) {
    g = std::make_shared<warp_group>();
    g->kind = kind;
    g->mask = mask;
    g->site = s;
    open.push_back(g);
  }
  g->value[lane] = mine;
  g->arrived |= bit;
  if (kind == op::syncwarp) tsan_release(g.get());
  if (g->arrived == mask) {
    g->done = true;
    open.erase(std::find(open.begin(), open.end(), g));
    complete(b, static_cast<unsigned>(__builtin_popcount(mask)) - 1,
             [&](unsigned t) { return t / 32 == warp && (mask >> (t % 32) & 1u); });
  } else {
    wait_at(b, lk, c.tid, state::warp, s, op_name(kind), [&] { return g->done; });
  }
  if (kind == op::syncwarp) tsan_acquire(g.get());
  use(g->value);
}

// A thread's kernel returned (or was ended by a failure).
inline void thread_exit(block &b, unsigned tid) {
  internal_scope quiet;
  std::lock_guard<std::mutex> lk(b.m);
  b.where[tid] = state::exited;
  ++b.exited;
  if (b.failed) return;
  if (b.bar_arrived > 0)
    return record_failure(b, thread_name(b, tid) + " returned while other threads wait at __syncthreads at " + site_text(b.bar_site) +
                                 ": every thread of a block must reach every __syncthreads (a return before a barrier?)");
  for (auto &g : b.open[tid / 32])
    if (g->mask >> (tid % 32) & 1u)
      return record_failure(b, thread_name(b, tid) + " returned while named in the mask of " + op_name(g->kind) + " at " +
                                   site_text(g->site) + " that other lanes wait at (divergent warp operation)");
  if (b.blocked > 0 && b.blocked == b.nthreads - b.exited)
    record_failure(b, "deadlock: every thread that has not returned waits at a barrier or warp operation that cannot complete");
}

inline void *new_smem(block &b, size_t bytes, size_t align, block::smem &out) {
  if (b.shared_bytes + bytes > max_shared_bytes)
    fail(b, "the block uses " + std::to_string(b.shared_bytes + bytes) + " bytes of shared memory, more than " +
                std::to_string(max_shared_bytes));
  align = std::max<size_t>(align, 16);
  out = block::smem(static_cast<unsigned char *>(::operator new[](bytes, std::align_val_t(align))), block::smem_deleter{align});
  std::memset(out.get(), 0xA5, bytes); // uninitialised shared memory holds garbage on the GPU too
  b.shared_bytes += bytes;
  return out.get();
}

// The block's storage of one KVQ_SHARED declaration (key: a static object at the declaration).
inline void *block_shared(const void *key, size_t bytes, size_t align) {
  block &b = *ctx().b;
  internal_scope quiet;
  std::lock_guard<std::mutex> lk(b.m);
  if (b.failed) throw aborted{};
  for (auto &e : b.statics)
    if (e.first == key) return e.second.get();
  b.statics.emplace_back(key, block::smem(nullptr, block::smem_deleter{16}));
  return new_smem(b, bytes, align, b.statics.back().second);
}

// The block's dynamic shared memory (KVQ_DYNAMIC_SHARED): exactly the bytes the launch asked for.
inline void *dynamic_shared() { return ctx().b->dynamic.get(); }

struct start_arg {
  block *b;
  unsigned tid;
  const std::function<void()> *body;
};

inline void *thread_main(void *p) {
  const start_arg &a = *static_cast<start_arg *>(p);
  thread_ctx c{a.b, a.tid};
  {
    ignore_accesses quiet; // fibers share these thread-locals: the emulator sets them, the kernel reads them
    current = &c;
    const dim3 bd = a.b->dim;
    threadIdx = make_uint3(a.tid % bd.x, a.tid / bd.x % bd.y, a.tid / (bd.x * bd.y));
    blockIdx = a.b->index;
    blockDim = bd;
  }
  try {
    (*a.body)();
  } catch (const aborted &) {
  }
  thread_exit(*a.b, a.tid);
  ignore_accesses quiet;
  current = nullptr;
  return nullptr;
}

// The OS threads of one launch: one per CUDA thread of a block, started once and given the blocks one
// after another (starting 64 or 256 threads per block made thread creation most of a launch's time).
// A worker runs thread_main for each block as a fresh thread would (its thread-locals set anew, the
// block's state new); the launcher hands out a block, then waits until every worker has left it, so
// blocks stay ordered one after another as before. Each worker syncs with the launcher alone (its own
// mutex, which ThreadSanitizer sees): block k's writes happen before block k+1's reads, as a join then
// a create made them, while the threads of one block stay unordered, so a missing barrier is still a race.
struct thread_pool {
  struct worker {
    thread_pool *pool = nullptr;
    unsigned tid = 0;
    std::mutex m;
    std::condition_variable cv;
    unsigned long long given = 0, finished = 0; // blocks handed to it, blocks it has left
    bool quit = false;
    block *b = nullptr;
  };
  bool started = false;
  const std::function<void()> *body = nullptr;
  std::unique_ptr<worker[]> workers;
  std::vector<pthread_t> threads;

  static void *main(void *p) {
    worker &w = *static_cast<worker *>(p);
    for (unsigned long long seen = 0;;) {
      block *blk;
      {
        std::unique_lock<std::mutex> lk(w.m);
        w.cv.wait(lk, [&] { return w.quit || w.given != seen; });
        if (w.quit) return nullptr;
        seen = w.given;
        blk = w.b;
      }
      start_arg a{blk, w.tid, w.pool->body};
      thread_main(&a);
      std::lock_guard<std::mutex> lk(w.m);
      w.finished = seen;
      w.cv.notify_all();
    }
  }
  // Starts n workers (fewer when the system refuses one: the caller reports it).
  void start(unsigned n, const std::function<void()> *f) {
    started = true;
    body = f;
    workers.reset(new worker[n]);
    threads.reserve(n);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1u << 20);
    for (unsigned t = 0; t < n; ++t) {
      workers[t].pool = this;
      workers[t].tid = t;
      pthread_t th;
      if (pthread_create(&th, &attr, main, &workers[t]) != 0) break;
      threads.push_back(th);
    }
    pthread_attr_destroy(&attr);
  }
  // Runs one block on every worker and waits for all of them to leave it.
  void run(block *blk) {
    for (size_t t = 0; t < threads.size(); ++t) {
      std::lock_guard<std::mutex> lk(workers[t].m);
      workers[t].b = blk;
      ++workers[t].given;
      workers[t].cv.notify_all();
    }
    for (size_t t = 0; t < threads.size(); ++t) {
      std::unique_lock<std::mutex> lk(workers[t].m);
      workers[t].cv.wait(lk, [&] { return workers[t].finished == workers[t].given; });
    }
  }
  ~thread_pool() {
    for (size_t t = 0; t < threads.size(); ++t) {
      std::lock_guard<std::mutex> lk(workers[t].m);
      workers[t].quit = true;
      workers[t].cv.notify_all();
    }
    for (pthread_t th : threads) pthread_join(th, nullptr);
  }
};

// The threads of a block as fibers: user-level threads taking turns on the launching thread. Each has
// its own stack (a guard page below each, so that an overflow faults instead of writing into a
// neighbour), mapped once per OS thread (of_this_thread) and kept for the thread's life. The scheduler
// resumes, in thread order, every fiber that can go on (not started yet, released from a rendezvous, or
// in a failed launch, where it ends); a fiber runs until it waits at a barrier or warp operation
// (wait_at yields) or returns. A rendezvous that can never complete is found by check_deadlock as with
// OS threads; a timeout has nothing to measure here (while one fiber runs no other can arrive), so a
// loop that never ends hangs the launch as it would on the GPU.
//
// The switch saves the callee-saved registers and the stack pointer (x86-64: a few instructions);
// elsewhere, or with KVQ_CUDA_EMU_UCONTEXT defined, it is swapcontext. Under AddressSanitizer and
// ThreadSanitizer every switch is announced to the sanitizer (their fiber interfaces). ThreadSanitizer's
// fibers are switched without synchronisation, so that within a block only the barriers' edges order
// memory, as with OS threads; a fiber's first switch of a block synchronises with the launching thread
// (what the launch wrote before), and the launching thread acquires every fiber's end after the block:
// so a fiber that ran block k of one launch and runs a block of the next is ordered as a new thread would be.
#if defined(__x86_64__) && !defined(KVQ_CUDA_EMU_UCONTEXT)
#define KVQ_CUDA_EMU_ASM_SWITCH 1
// Pushes rbp, rbx, r12-r15, stores the stack pointer in *from, loads `to`, pops them and returns there.
__attribute__((naked, noinline)) inline void stack_switch(void ** /*from*/, void * /*to*/) {
  __asm__("pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
          "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
          "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n");
}
// Where a new fiber's first switch returns to: calls r13(r12), the function and argument that
// fiber_runner::prepare placed where stack_switch pops them. The function never returns.
__attribute__((naked, noinline)) inline void stack_start() { __asm__("movq %r12, %rdi\n\tcallq *%r13\n\tud2\n"); }
#endif

struct fiber_runner {
  static constexpr size_t stack_bytes = 512 * 1024; // sanitizers make frames large; untouched pages cost nothing
  unsigned n = 0;
  size_t slot = 0, guard = 0;
  unsigned char *region = nullptr;
  size_t region_bytes = 0;
  std::vector<unsigned char> started, returned; // in the current block
  unsigned cur = 0;                             // the fiber running, or last run
  block *b = nullptr;
  const std::function<void()> *body = nullptr;
  char end_of_block = 0; // ThreadSanitizer: each fiber's end happens before the launching thread goes on
  bool quit = false;     // set by the destructor: the fibers leave their loop (fiber_main) and end
#if defined(KVQ_CUDA_EMU_ASM_SWITCH)
  std::vector<void *> sp; // each fiber's stack pointer while it does not run
  void *scheduler_sp = nullptr;
#else
  std::vector<ucontext_t> uc;
  ucontext_t scheduler_uc;
#endif
#if defined(KVQ_CUDA_EMU_ASAN)
  std::vector<void *> fake; // AddressSanitizer's fake stack of each fiber, kept across its switches
  void *scheduler_fake = nullptr;
  const void *scheduler_bottom = nullptr;
  size_t scheduler_size = 0;
#endif
#if defined(KVQ_CUDA_EMU_TSAN)
  std::vector<void *> tsan_fiber;
  void *tsan_scheduler = nullptr;
#endif

  unsigned char *stack_low(unsigned t) const { return region + t * slot + guard; }

  // Maps the stacks of n fibers; false when the system refuses (the caller reports it).
  bool start(unsigned count, const std::function<void()> *f) {
    n = count;
    body = f;
    guard = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    slot = stack_bytes + guard;
    region_bytes = slot * n;
    void *m = mmap(nullptr, region_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    region = static_cast<unsigned char *>(m);
    for (unsigned t = 0; t < n; ++t) mprotect(region + t * slot, guard, PROT_NONE);
    started.assign(n, 0);
    returned.assign(n, 0);
#if defined(KVQ_CUDA_EMU_ASM_SWITCH)
    sp.assign(n, nullptr);
#else
    uc.resize(n);
#endif
    for (unsigned t = 0; t < n; ++t) prepare(t);
#if defined(KVQ_CUDA_EMU_ASAN)
    fake.assign(n, nullptr);
#endif
#if defined(KVQ_CUDA_EMU_TSAN)
    tsan_scheduler = __tsan_get_current_fiber();
    for (unsigned t = 0; t < n; ++t) tsan_fiber.push_back(__tsan_create_fiber(0));
#endif
    return true;
  }
  ~fiber_runner() {
    if (region) { // every fiber waits for its next block in fiber_main: let each end (AddressSanitizer
      ignore_accesses quiet; // frees a fiber's fake stack when it ends)
      quit = true;
      for (unsigned t = 0; t < n; ++t) {
        started[t] = 1; // (no synchronisation with the launching thread: the fiber only ends)
        resume(t);
      }
    }
#if defined(KVQ_CUDA_EMU_TSAN)
    for (void *t : tsan_fiber) __tsan_destroy_fiber(t);
#endif
    if (region) munmap(region, region_bytes);
  }

  // A fiber's life: the kernel's thread of one block after another, each time ending with a switch back
  // to the scheduler (which resumes it for the next block), until the runner ends it; then one last
  // switch back. The fiber stays inside this loop for the runner's life (launch after launch): were it
  // to start afresh for each block from a new frame (as it once did), the frames it left would stay on
  // ThreadSanitizer's shadow call stack of the fiber (a function entered and never returned from), one
  // more for every block, so
  // that every stack ThreadSanitizer records (each allocation, each synchronisation) would be new and
  // longer, block after block: its stack depot grew without bound, to gigabytes on the golden matrix
  // (docs/CUDA.md, "Test time").
  static void fiber_main(void *self) {
    fiber_runner &f = *static_cast<fiber_runner *>(self);
#if defined(KVQ_CUDA_EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &f.scheduler_bottom, &f.scheduler_size);
#endif
    for (;;) {
      unsigned me;
      start_arg a;
      bool quit;
      {
        ignore_accesses quiet;
        me = f.cur;
        a = start_arg{f.b, me, f.body};
        quit = f.quit;
      }
      if (quit) break;
      thread_main(&a);
      {
        ignore_accesses quiet;
        f.returned[me] = 1;
      }
#if defined(KVQ_CUDA_EMU_TSAN)
      AnnotateHappensBefore(__FILE__, __LINE__, &f.end_of_block);
#endif
      fiber_yield(f); // back when the next block, or the runner's end, resumes this fiber
    }
#if defined(KVQ_CUDA_EMU_ASM_SWITCH)
    void **mine, *to;
#else
    ucontext_t *mine, *to;
#endif
#if defined(KVQ_CUDA_EMU_TSAN)
    void *scheduler;
#endif
    {
      ignore_accesses quiet; // ended before the last switch: a fiber must not end with ignores on
      const unsigned me = f.cur;
#if defined(KVQ_CUDA_EMU_ASM_SWITCH)
      mine = &f.sp[me];
      to = f.scheduler_sp;
#else
      mine = &f.uc[me];
      to = &f.scheduler_uc;
#endif
#if defined(KVQ_CUDA_EMU_TSAN)
      scheduler = f.tsan_scheduler;
#endif
#if defined(KVQ_CUDA_EMU_ASAN)
      __sanitizer_start_switch_fiber(nullptr, f.scheduler_bottom, f.scheduler_size); // this stack is done
#endif
    }
#if defined(KVQ_CUDA_EMU_TSAN)
    __tsan_switch_to_fiber(scheduler, 1 /* __tsan_switch_to_fiber_no_sync */);
#endif
#if defined(KVQ_CUDA_EMU_ASM_SWITCH)
    stack_switch(mine, to);
#else
    swapcontext(mine, to);
#endif
    __builtin_unreachable();
  }
#if !defined(KVQ_CUDA_EMU_ASM_SWITCH)
  static void ucontext_main(unsigned hi, unsigned lo) {
    fiber_main(reinterpret_cast<void *>(static_cast<uintptr_t>(hi) << 32 | lo));
  }
#endif

  // A fresh stack for thread t, whose first switch enters fiber_main.
  void prepare(unsigned t) {
#if defined(KVQ_CUDA_EMU_ASM_SWITCH)
    // stack_switch pops r15, r14, r13, r12, rbx, rbp and returns into stack_start, which calls r13(r12)
    // with the stack 16-byte aligned as the ABI requires at a call.
    void **frame = reinterpret_cast<void **>(stack_low(t) + stack_bytes - 72);
    frame[0] = frame[1] = frame[4] = frame[5] = nullptr;
    frame[2] = reinterpret_cast<void *>(&fiber_main);
    frame[3] = this;
    frame[6] = reinterpret_cast<void *>(&stack_start);
    sp[t] = frame;
#else
    getcontext(&uc[t]);
    uc[t].uc_stack.ss_sp = stack_low(t);
    uc[t].uc_stack.ss_size = stack_bytes;
    uc[t].uc_link = nullptr;
    const uintptr_t self = reinterpret_cast<uintptr_t>(this);
    makecontext(&uc[t], reinterpret_cast<void (*)()>(&ucontext_main), 2, static_cast<unsigned>(self >> 32),
                static_cast<unsigned>(self & 0xffffffffu));
#endif
  }

  // From the scheduler into fiber t, until it waits or returns.
  void resume(unsigned t) {
    cur = t;
#if defined(KVQ_CUDA_EMU_TSAN)
    __tsan_switch_to_fiber(tsan_fiber[t], started[t] ? 1 /* no sync */ : 0);
#endif
    started[t] = 1;
#if defined(KVQ_CUDA_EMU_ASAN)
    __sanitizer_start_switch_fiber(&scheduler_fake, stack_low(t), stack_bytes);
#endif
#if defined(KVQ_CUDA_EMU_ASM_SWITCH)
    stack_switch(&scheduler_sp, sp[t]);
#else
    swapcontext(&scheduler_uc, &uc[t]);
#endif
#if defined(KVQ_CUDA_EMU_ASAN)
    __sanitizer_finish_switch_fiber(scheduler_fake, nullptr, nullptr);
#endif
  }

  // The calling OS thread's runner, with at least `count` fibers, kept for the thread's life and given
  // its launches one after another, whatever their block size (a block of m threads runs on the first m
  // fibers); null when the stacks cannot be mapped (the caller reports it). Mapping the stacks, creating
  // the ThreadSanitizer fibers and unmapping them again at every launch (as it once did) cost about 60 ms
  // of CPU time per launch under ThreadSanitizer, most of it in the kernel, and the golden matrix
  // launches thousands of kernels; one runner per thread (replaced by a larger one when a launch needs
  // more threads) also bounds the fibers alive, each of which holds its ThreadSanitizer trace.
  // Only blocks of up to kept_max threads (kvq's kernels name 128 and 256) run on the kept runner: under
  // ThreadSanitizer each fiber holds about 1 MB (its trace) while it exists, so a kept runner of 1024
  // fibers would hold a gigabyte for the thread's life; a larger block gets a runner of its launch.
  static constexpr unsigned kept_max = 256;
  static fiber_runner *of_this_thread(unsigned count, const std::function<void()> *f) {
    thread_local std::unique_ptr<fiber_runner> kept;
    if (!kept || kept->n < count) {
      kept.reset(); // its fibers end before the larger runner's are created
      std::unique_ptr<fiber_runner> r(new fiber_runner);
      if (!r->start(count, f)) return nullptr;
      kept = std::move(r);
    }
    kept->body = f;
    return kept.get();
  }

  // Runs one block: every fiber from the top of its loop in fiber_main, in turns, until all have returned.
  void run(block *blk) {
    ignore_accesses quiet;
    b = blk;
    blk->fibers = this;
    const unsigned m = blk->nthreads; // the first m fibers (at most n)
    for (unsigned t = 0; t < m; ++t) started[t] = returned[t] = 0;
    for (;;) {
      bool ran = false, all_returned = true;
      for (unsigned t = 0; t < m; ++t) {
        if (returned[t]) continue;
        all_returned = false;
        if (!started[t] || b->where[t] == state::running || b->failed) {
          resume(t);
          ran = true;
        }
      }
      if (all_returned) break;
      if (!ran) { // cannot happen while wait_at checks for deadlocks; here so that the launch never spins
        std::lock_guard<std::mutex> lk(b->m);
        record_failure(*b, "deadlock: no thread of the block can go on");
      }
    }
#if defined(KVQ_CUDA_EMU_TSAN)
    AnnotateHappensAfter(__FILE__, __LINE__, &end_of_block);
#endif
    blk->fibers = nullptr;
  }
};

// From the running fiber back to the scheduler; it resumes this fiber when it may go on. The
// thread-locals that make it this CUDA thread are its own again afterwards.
inline void fiber_yield(fiber_runner &f) {
  ignore_accesses quiet;
  thread_ctx *const c = current;
  const uint3 ti = threadIdx, bi = blockIdx;
  const dim3 bd = blockDim, gd = gridDim;
  const unsigned me = f.cur;
#if defined(KVQ_CUDA_EMU_TSAN)
  __tsan_switch_to_fiber(f.tsan_scheduler, 1 /* __tsan_switch_to_fiber_no_sync */);
#endif
#if defined(KVQ_CUDA_EMU_ASAN)
  __sanitizer_start_switch_fiber(&f.fake[me], f.scheduler_bottom, f.scheduler_size);
#endif
#if defined(KVQ_CUDA_EMU_ASM_SWITCH)
  stack_switch(&f.sp[me], f.scheduler_sp);
#else
  swapcontext(&f.uc[me], &f.scheduler_uc);
#endif
#if defined(KVQ_CUDA_EMU_ASAN)
  __sanitizer_finish_switch_fiber(f.fake[me], &f.scheduler_bottom, &f.scheduler_size);
#endif
  current = c;
  threadIdx = ti;
  blockIdx = bi;
  blockDim = bd;
  gridDim = gd;
}

// How the threads of a block run: fibers (the default), or OS threads. 0: the environment variable
// KVQ_CUDA_EMU_THREADS ("os" or "fibers"), else fibers; a test may set it.
enum class threads_kind { from_environment = 0, fibers = 1, os = 2 };
inline std::atomic<int> threads_mode{0};
inline bool use_fibers() {
  const int m = threads_mode.load();
  if (m != 0) return m == static_cast<int>(threads_kind::fibers);
  const char *env = std::getenv("KVQ_CUDA_EMU_THREADS");
  return !(env && std::strcmp(env, "os") == 0);
}

// Runs kernel(args...) on grid x block threads, the blocks one after another; dynamic_bytes of dynamic
// shared memory per block. Returns the first failure instead of hanging or aborting. A thread that never
// returns and never waits (an endless loop) still hangs the launch: the test's own timeout ends it.
template <class... P, class... A>
Result launch(void (*kernel)(P...), dim3 grid, dim3 blk, size_t dynamic_bytes, A &&...args) {
  static_assert(sizeof...(P) == sizeof...(A), "kvq_emu::launch: wrong number of kernel arguments");
  Result r;
  const unsigned long long n = 1ull * blk.x * blk.y * blk.z;
  if (n == 0 || n > 1024 || blk.x > 1024 || blk.y > 1024 || blk.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || dynamic_bytes > max_shared_bytes) {
    r.ok = false;
    r.message = "invalid launch configuration: grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
                std::to_string(grid.z) + "), block (" + std::to_string(blk.x) + "," + std::to_string(blk.y) + "," +
                std::to_string(blk.z) + "), " + std::to_string(dynamic_bytes) + " bytes of dynamic shared memory";
    return r;
  }
  const std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  const std::function<void()> body = [&] {
    {
      ignore_accesses quiet;
      gridDim = grid;
    }
    std::apply(kernel, params); // every thread gets its own copy of the arguments, as on the GPU
  };
  const bool fibers = use_fibers();
  thread_pool pool;                // the launch's OS threads, one per CUDA thread of a block, reused block after block
  fiber_runner *runner = nullptr;  // or this OS thread's fibers for n threads (fiber_runner::of_this_thread),
  std::unique_ptr<fiber_runner> own_runner; // or, for more than kept_max threads, the launch's own
  bool runner_started = false;
  for (unsigned bz = 0; bz < grid.z && r.ok; ++bz)
    for (unsigned by = 0; by < grid.y && r.ok; ++by)
      for (unsigned bx = 0; bx < grid.x && r.ok; ++bx) {
        block b;
        b.nthreads = static_cast<unsigned>(n);
        b.index = make_uint3(bx, by, bz);
        b.dim = blk;
        b.where.assign(n, state::running);
        b.at.assign(n, Site{"", 0});
        b.open.resize((n + 31) / 32);
        b.dynamic = block::smem(static_cast<unsigned char *>(::operator new[](dynamic_bytes, std::align_val_t(16))),
                                block::smem_deleter{16});
        std::memset(b.dynamic.get(), 0xA5, dynamic_bytes);
        b.shared_bytes = dynamic_bytes;
        if (fibers) {
          if (!runner_started) {
            runner_started = true;
            internal_scope quiet; // the emulator's own bookkeeping (the thread's kept runner)
            if (n <= fiber_runner::kept_max) {
              runner = fiber_runner::of_this_thread(static_cast<unsigned>(n), &body);
            } else {
              own_runner.reset(new fiber_runner);
              if (own_runner->start(static_cast<unsigned>(n), &body)) runner = own_runner.get();
            }
          }
          if (!runner) { // the stacks could not be mapped: the block cannot run
            std::lock_guard<std::mutex> lk(b.m);
            record_failure(b, "cannot map the stacks of the block's " + std::to_string(n) + " fibers");
          } else {
            runner->run(&b);
          }
        } else {
          if (!pool.started) pool.start(static_cast<unsigned>(n), &body);
          if (pool.threads.size() < n) { // a thread could not be started: the block cannot run
            std::lock_guard<std::mutex> lk(b.m);
            record_failure(b, "cannot start the block's thread " + std::to_string(pool.threads.size()));
          } else {
            pool.run(&b);
          }
        }
        if (b.failed) {
          r.ok = false;
          r.message = b.message;
        }
      }
  return r;
}

inline Site site_of(const char *file, int line) { return Site{file, line}; }

// A value as the bits a shuffle moves. NVIDIA's __half2 and __nv_bfloat162 have user-written copy
// operations (not trivially copyable), but are plain 4 bytes: standard layout, trivially destructible.
template <class T> constexpr bool shufflable = sizeof(T) <= 8 && std::is_standard_layout_v<T> && std::is_trivially_destructible_v<T>;
template <class T> inline uint64_t to_bits(const T &v) {
  static_assert(shufflable<T>, "a warp shuffle moves at most 8 bytes of a plain (standard-layout) type");
  uint64_t u = 0;
  std::memcpy(&u, static_cast<const void *>(&v), sizeof v);
  return u;
}
template <class T> inline T from_bits(uint64_t u) {
  T v{};
  std::memcpy(static_cast<void *>(&v), &u, sizeof v);
  return v;
}

// The warp operations, called through the macros below so that each knows its call site.
struct at {
  Site s;
  void syncwarp(unsigned mask = 0xffffffffu) const {
    warp_op(s, op::syncwarp, mask, 0, [](const uint64_t *) {});
  }
  // lane_of(lane, width): the lane whose value this lane reads (itself: its own value).
  template <class T, class LaneOf> T shuffle(op kind, unsigned mask, T v, int width, LaneOf lane_of) const {
    if (width <= 0 || width > 32 || (width & (width - 1))) {
      block &b = *ctx().b;
      internal_scope quiet;
      std::lock_guard<std::mutex> lk(b.m);
      fail(b, std::string(op_name(kind)) + " at " + site_text(s) + ": width " + std::to_string(width) + " is not a power of two from 1 to 32");
    }
    const unsigned lane = ctx().tid % 32;
    const unsigned src = lane_of(lane, static_cast<unsigned>(width)) & 31u;
    T r = v;
    warp_op(s, kind, mask, to_bits(v), [&](const uint64_t *all) {
      if (!(mask >> src & 1u)) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08x", mask);
        fail(*ctx().b, std::string(op_name(kind)) + "(mask " + hex + ") at " + site_text(s) + ": lane " + std::to_string(lane) +
                           " reads lane " + std::to_string(src) + ", which the mask does not name (an undefined value)");
      }
      r = from_bits<T>(all[src]);
    });
    return r;
  }
  template <class T> T shfl_sync(unsigned mask, T v, int src, int width = warpSize) const {
    return shuffle(op::shfl, mask, v, width,
                   [&](unsigned lane, unsigned w) { return (lane & ~(w - 1)) + (static_cast<unsigned>(src) & (w - 1)); });
  }
  template <class T> T shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) const {
    return shuffle(op::shfl_up, mask, v, width, [&](unsigned lane, unsigned w) { return lane % w >= delta ? lane - delta : lane; });
  }
  template <class T> T shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) const {
    return shuffle(op::shfl_down, mask, v, width,
                   [&](unsigned lane, unsigned w) { return lane % w + delta < w ? lane + delta : lane; });
  }
  // A lane that names a lane of a later group of width lanes reads its own value (CUDA's rule).
  template <class T> T shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) const {
    return shuffle(op::shfl_xor, mask, v, width, [&](unsigned lane, unsigned w) {
      const unsigned src = (lane ^ static_cast<unsigned>(lane_mask)) & 31u;
      return src >= (lane & ~(w - 1)) + w ? lane : src;
    });
  }
  unsigned vote(op kind, unsigned mask, int predicate) const {
    unsigned r = 0;
    warp_op(s, kind, mask, predicate != 0, [&](const uint64_t *all) {
      for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l & 1u) && all[l]) r |= 1u << l;
    });
    return r;
  }
  unsigned ballot_sync(unsigned mask, int predicate) const { return vote(op::ballot, mask, predicate); }
  int any_sync(unsigned mask, int predicate) const { return vote(op::any, mask, predicate) != 0; }
  int all_sync(unsigned mask, int predicate) const { return vote(op::all, mask, predicate) == mask; }
};

// Serializes nothing; under ThreadSanitizer it orders fences in the order they run (see __threadfence).
inline std::atomic<unsigned> fence_word{0};

} // namespace kvq_emu

#define KVQ_CUDA_EMU_SITE ::kvq_emu::site_of(__FILE__, __LINE__)
#define __syncthreads() ::kvq_emu::syncthreads(KVQ_CUDA_EMU_SITE)
#define __syncwarp(...) ::kvq_emu::at{KVQ_CUDA_EMU_SITE}.syncwarp(__VA_ARGS__)
#define __shfl_sync(...) ::kvq_emu::at{KVQ_CUDA_EMU_SITE}.shfl_sync(__VA_ARGS__)
#define __shfl_up_sync(...) ::kvq_emu::at{KVQ_CUDA_EMU_SITE}.shfl_up_sync(__VA_ARGS__)
#define __shfl_down_sync(...) ::kvq_emu::at{KVQ_CUDA_EMU_SITE}.shfl_down_sync(__VA_ARGS__)
#define __shfl_xor_sync(...) ::kvq_emu::at{KVQ_CUDA_EMU_SITE}.shfl_xor_sync(__VA_ARGS__)
#define __ballot_sync(...) ::kvq_emu::at{KVQ_CUDA_EMU_SITE}.ballot_sync(__VA_ARGS__)
#define __any_sync(...) ::kvq_emu::at{KVQ_CUDA_EMU_SITE}.any_sync(__VA_ARGS__)
#define __all_sync(...) ::kvq_emu::at{KVQ_CUDA_EMU_SITE}.all_sync(__VA_ARGS__)

// Shared memory as kernels declare it through kernel_lang.cuh: one block storage per declaration.
#define KVQ_CUDA_EMU_SHARED(type, name, count)                                                                   \
  static char kvq_emu_shared_key_##name;                                                                         \
  type(&name)[count] = *static_cast<type(*)[count]>(                                                             \
      ::kvq_emu::block_shared(&kvq_emu_shared_key_##name, sizeof(type[count]), alignof(type)))
#define KVQ_CUDA_EMU_SHARED_2D(type, name, rows, cols)                                                           \
  static char kvq_emu_shared_key_##name;                                                                         \
  type(&name)[rows][cols] = *static_cast<type(*)[rows][cols]>(                                                   \
      ::kvq_emu::block_shared(&kvq_emu_shared_key_##name, sizeof(type[rows][cols]), alignof(type)))
#define KVQ_CUDA_EMU_DYNAMIC_SHARED(type, name) type *const name = static_cast<type *>(::kvq_emu::dynamic_shared())

// Atomics: relaxed, as CUDA's plain atomics are (ThreadSanitizer sees no ordering through them).
#define KVQ_CUDA_EMU_ATOMIC_INT(T)                                                                               \
  inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }                           \
  inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }                           \
  inline T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }                             \
  inline T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }                           \
  inline T atomicXor(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); }                           \
  inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }                         \
  inline T atomicCAS(T *p, T compare, T v) {                                                                     \
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);                      \
    return compare;                                                                                              \
  }                                                                                                              \
  inline T atomicMax(T *p, T v) {                                                                                \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                                \
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {     \
    }                                                                                                            \
    return old;                                                                                                  \
  }                                                                                                              \
  inline T atomicMin(T *p, T v) {                                                                                \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                                \
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {     \
    }                                                                                                            \
    return old;                                                                                                  \
  }
KVQ_CUDA_EMU_ATOMIC_INT(int)
KVQ_CUDA_EMU_ATOMIC_INT(unsigned int)
KVQ_CUDA_EMU_ATOMIC_INT(unsigned long long)
KVQ_CUDA_EMU_ATOMIC_INT(long long)
#undef KVQ_CUDA_EMU_ATOMIC_INT

// Floating-point atomics: a compare-and-swap loop on the whole value (each add rounded once, as on
// the GPU; the order of the adds, and so the rounding of a sum, depends on the schedule there too).
#define KVQ_CUDA_EMU_ATOMIC_FLOAT(T)                                                                             \
  inline T atomicAdd(T *p, T v) {                                                                                \
    T old, sum;                                                                                                  \
    __atomic_load(p, &old, __ATOMIC_RELAXED);                                                                    \
    do {                                                                                                         \
      sum = old + v;                                                                                             \
    } while (!__atomic_compare_exchange(p, &old, &sum, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));               \
    return old;                                                                                                  \
  }                                                                                                              \
  inline T atomicExch(T *p, T v) {                                                                               \
    T old;                                                                                                       \
    __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);                                                            \
    return old;                                                                                                  \
  }
KVQ_CUDA_EMU_ATOMIC_FLOAT(float)
KVQ_CUDA_EMU_ATOMIC_FLOAT(double)
#undef KVQ_CUDA_EMU_ATOMIC_FLOAT

// __threadfence: a sequentially consistent read-modify-write of one word (a full fence on x86-64;
// ThreadSanitizer, which does not model fences, sees fences ordered in the order they run).
inline void __threadfence() { kvq_emu::fence_word.fetch_add(0, std::memory_order_seq_cst); }
inline void __threadfence_block() { __threadfence(); }
inline void __nanosleep(unsigned ns) { std::this_thread::sleep_for(std::chrono::nanoseconds(ns)); }
template <class T> inline T __ldg(const T *p) { return *p; }

// Arithmetic with a named rounding: the host's IEEE operations, each rounded on its own (build the
// emulated kernels with -ffp-contract=off, as all kvq code is, so that no a*b+c is fused).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
// The fast approximate intrinsics: here the correctly rounded host functions. The GPU's results
// differ by the error CUDA documents for each; compare them with a tolerance that covers it.
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); } // NaN -> 0, as on the GPU
// Bit casts.
inline int __float_as_int(float f) { return kvq_emu::from_bits<int>(kvq_emu::to_bits(f)); }
inline unsigned int __float_as_uint(float f) { return kvq_emu::from_bits<unsigned int>(kvq_emu::to_bits(f)); }
inline float __int_as_float(int i) { return kvq_emu::from_bits<float>(kvq_emu::to_bits(i)); }
inline float __uint_as_float(unsigned int u) { return kvq_emu::from_bits<float>(kvq_emu::to_bits(u)); }
inline long long __double_as_longlong(double d) { return kvq_emu::from_bits<long long>(kvq_emu::to_bits(d)); }
inline double __longlong_as_double(long long i) { return kvq_emu::from_bits<double>(kvq_emu::to_bits(i)); }
// Conversions: the GPU saturates out-of-range values and converts NaN to 0 (no undefined behaviour).
namespace kvq_emu {
template <class I> inline I float_to_int(double r) {
  if (std::isnan(r)) return 0;
  if (r <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (r >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(r);
}
} // namespace kvq_emu
inline int __float2int_rn(float x) { return kvq_emu::float_to_int<int>(std::nearbyint(static_cast<double>(x))); }
inline int __float2int_rz(float x) { return kvq_emu::float_to_int<int>(std::trunc(static_cast<double>(x))); }
inline int __float2int_rd(float x) { return kvq_emu::float_to_int<int>(std::floor(static_cast<double>(x))); }
inline int __float2int_ru(float x) { return kvq_emu::float_to_int<int>(std::ceil(static_cast<double>(x))); }
inline unsigned int __float2uint_rn(float x) { return kvq_emu::float_to_int<unsigned int>(std::nearbyint(static_cast<double>(x))); }
inline unsigned int __float2uint_rz(float x) { return kvq_emu::float_to_int<unsigned int>(std::trunc(static_cast<double>(x))); }
inline float __int2float_rn(int i) { return static_cast<float>(i); }
inline float __uint2float_rn(unsigned int u) { return static_cast<float>(u); }
// Integer intrinsics.
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz(static_cast<unsigned int>(x)) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll(static_cast<unsigned long long>(x)) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned int __brev(unsigned int x) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i) r |= (x >> i & 1u) << (31 - i);
  return r;
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) { return static_cast<unsigned int>((1ull * a * b) >> 32); }
inline int __mulhi(int a, int b) { return static_cast<int>((1ll * a * b) >> 32); }
// CUDA's overloaded min and max of device code.
#define KVQ_CUDA_EMU_MINMAX(T)                                                                                   \
  inline T min(T a, T b) { return b < a ? b : a; }                                                               \
  inline T max(T a, T b) { return a < b ? b : a; }
KVQ_CUDA_EMU_MINMAX(int)
KVQ_CUDA_EMU_MINMAX(unsigned int)
KVQ_CUDA_EMU_MINMAX(long long)
KVQ_CUDA_EMU_MINMAX(unsigned long long)
#undef KVQ_CUDA_EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

#endif // KVQ_BACKENDS_CUDA_EMU_CUDA_EMU_H
