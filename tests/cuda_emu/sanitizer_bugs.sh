#!/bin/sh
# TAP test: the planted bugs of tests/cuda_emu/emu_bugs.cuh that only a sanitizer sees are caught on
# the emulator, with a block's threads as fibers (the default) and as OS threads: ThreadSanitizer
# reports a missing __syncthreads, and a shuffle used as if it were a __syncwarp, as data races;
# AddressSanitizer the indices one past static and dynamic shared memory (heap storage of exactly the
# declared size) and past a per-thread array after a barrier (a fiber's stack, after switches). Each
# bug runs in its own process, which must fail with the sanitizer's report naming the kernel. A missing
# __syncthreads in the last of 300 blocks must be reported too, with stacks that hold the fiber's entry
# (fiber_main, stack_start) at most once each.
# usage: sanitizer_bugs.sh TSAN_BINARY|none ASAN_BINARY|none
tsan="$1"
asan="$2"
echo "1..12"
n=0
# run DESCRIPTION BINARY BUG REPORT KERNEL: one TAP line per way of running threads, and the output of a
# run that was not caught.
run() {
  for threads in fibers os; do
    n=$((n + 1))
    if [ "$2" = none ]; then
      echo "ok $n - # SKIP $1 ($threads): the compiler cannot build this sanitizer here"
      continue
    fi
    output=$(KVQ_CUDA_EMU_THREADS=$threads "$2" "$3" 2>&1)
    status=$?
    verdict="not ok"
    [ "$status" -ne 0 ] && echo "$output" | grep -q "$4" && echo "$output" | grep -q "$5" && verdict="ok"
    # At most one frame of the fiber's entry in each stack of the report (a stack starts at its frame
    # #0): a fiber enters fiber_main (called from stack_start, or from ucontext_main) once and runs block
    # after block there. When each block entered it afresh, ThreadSanitizer's shadow call stack of the
    # fiber kept one more frame (shown as stack_start) per block, and its stack depot grew without bound
    # (docs/CUDA.md, "Test time").
    stacks=$(echo "$output" | grep -c '^ *#0 ')
    for entry in fiber_main stack_start ucontext_main; do
      [ "$(echo "$output" | grep -c "$entry")" -le "$stacks" ] || verdict="not ok"
    done
    echo "$verdict $n - $1, threads as $threads (exit status $status)"
    [ "$verdict" = ok ] || echo "$output" | sed 's/^/# /' | head -40
  done
}
export TSAN_OPTIONS="halt_on_error=1:exitcode=66"
run "ThreadSanitizer reports a missing __syncthreads as a data race" "$tsan" race "ThreadSanitizer: data race" bug_missing_sync
run "ThreadSanitizer reports a missing __syncthreads in the 300th block, each stack of the report entering the fiber once" \
  "$tsan" late_race "ThreadSanitizer: data race" bug_missing_sync_last_block
run "ThreadSanitizer reports a shuffle used in place of __syncwarp as a data race" "$tsan" warp_race \
  "ThreadSanitizer: data race" bug_shuffle_as_barrier
# UndefinedBehaviorSanitizer sees the static array's bound too (-fsanitize=bounds); it must not halt
# first, so that the test shows AddressSanitizer's report (the one that also covers dynamic memory).
export UBSAN_OPTIONS="print_stacktrace=1"
run "AddressSanitizer reports an index past static shared memory" "$asan" shared_overflow \
  "AddressSanitizer: heap-buffer-overflow" bug_shared_overflow
run "AddressSanitizer reports an index past dynamic shared memory" "$asan" dynamic_overflow \
  "AddressSanitizer: heap-buffer-overflow" bug_dynamic_overflow
run "AddressSanitizer reports an index past a per-thread array after a barrier" "$asan" local_overflow \
  "AddressSanitizer: stack-buffer-overflow" bug_local_overflow
