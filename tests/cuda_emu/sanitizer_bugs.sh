#!/bin/sh
# TAP test: the planted bugs of tests/cuda_emu/emu_bugs.cuh that only a sanitizer sees are caught on
# the emulator: ThreadSanitizer reports the missing __syncthreads as a data race, AddressSanitizer the
# indices one past static and dynamic shared memory (heap storage of exactly the declared size). Each
# bug runs in its own process, which must fail with the sanitizer's report naming the kernel.
# usage: sanitizer_bugs.sh TSAN_BINARY|none ASAN_BINARY|none
tsan="$1"
asan="$2"
echo "1..3"
# run N DESCRIPTION BINARY BUG REPORT KERNEL
run() {
  n="$1"; what="$2"; binary="$3"; bug="$4"; report="$5"; kernel="$6"
  if [ "$binary" = none ]; then
    echo "ok $n - # SKIP $what: the compiler cannot build this sanitizer here"
    return
  fi
  output=$("$binary" "$bug" 2>&1)
  status=$?
  if [ "$status" -ne 0 ] && echo "$output" | grep -q "$report" && echo "$output" | grep -q "$kernel"; then
    echo "ok $n - $what (exit status $status)"
  else
    echo "not ok $n - $what: no report (exit status $status)"
    echo "$output" | sed 's/^/# /' | head -40
  fi
}
TSAN_OPTIONS="halt_on_error=1:exitcode=66" \
  run 1 "ThreadSanitizer reports a missing __syncthreads as a data race" "$tsan" race "ThreadSanitizer: data race" bug_missing_sync
# UndefinedBehaviorSanitizer sees the static array's bound too (-fsanitize=bounds); it must not halt
# first, so that the test shows AddressSanitizer's report (the one that also covers dynamic memory).
export UBSAN_OPTIONS="print_stacktrace=1"
run 2 "AddressSanitizer reports an index past static shared memory" "$asan" shared_overflow \
  "AddressSanitizer: heap-buffer-overflow" bug_shared_overflow
run 3 "AddressSanitizer reports an index past dynamic shared memory" "$asan" dynamic_overflow \
  "AddressSanitizer: heap-buffer-overflow" bug_dynamic_overflow
