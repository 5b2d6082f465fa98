#!/bin/sh
# TAP test: the planted bugs of tests/cuda_emu/emu_bugs.cuh that only a sanitizer sees are caught on
# the emulator: ThreadSanitizer reports a missing __syncthreads, and a shuffle used as if it were a
# __syncwarp, as data races, AddressSanitizer the
# indices one past static and dynamic shared memory (heap storage of exactly the declared size). Each
# bug runs in its own process, which must fail with the sanitizer's report naming the kernel.
# usage: sanitizer_bugs.sh TSAN_BINARY|none ASAN_BINARY|none
tsan="$1"
asan="$2"
echo "1..4"
# run N DESCRIPTION BINARY BUG REPORT KERNEL: one TAP line, and the output of a run that was not caught.
run() {
  [ "$3" = none ] && { echo "ok $1 - # SKIP $2: the compiler cannot build this sanitizer here"; return; }
  output=$("$3" "$4" 2>&1)
  status=$?
  verdict="not ok"
  [ "$status" -ne 0 ] && echo "$output" | grep -q "$5" && echo "$output" | grep -q "$6" && verdict="ok"
  echo "$verdict $1 - $2 (exit status $status)"
  [ "$verdict" = ok ] || echo "$output" | sed 's/^/# /' | head -40
}
export TSAN_OPTIONS="halt_on_error=1:exitcode=66"
run 1 "ThreadSanitizer reports a missing __syncthreads as a data race" "$tsan" race "ThreadSanitizer: data race" bug_missing_sync
run 2 "ThreadSanitizer reports a shuffle used in place of __syncwarp as a data race" "$tsan" warp_race \
  "ThreadSanitizer: data race" bug_shuffle_as_barrier
# UndefinedBehaviorSanitizer sees the static array's bound too (-fsanitize=bounds); it must not halt
# first, so that the test shows AddressSanitizer's report (the one that also covers dynamic memory).
export UBSAN_OPTIONS="print_stacktrace=1"
run 3 "AddressSanitizer reports an index past static shared memory" "$asan" shared_overflow \
  "AddressSanitizer: heap-buffer-overflow" bug_shared_overflow
run 4 "AddressSanitizer reports an index past dynamic shared memory" "$asan" dynamic_overflow \
  "AddressSanitizer: heap-buffer-overflow" bug_dynamic_overflow
