#!/bin/sh
# Shows that a fuzz replay test fails when an input crashes (docs/RELIABILITY.md, "Fuzzing"): the
# replay driver linked with tests/fuzz/fuzz_canary.c must pass the harmless input, then end with a
# non-zero status and the expected report on each planted one, without printing its "ok" line.
#   replay_fails.sh REPLAY CANARY_DIR SANITIZED(0|1)
set -u
replay=$1
dir=$2
sanitized=$3
echo "1..3"
out=$("$replay" "$dir/0-harmless" 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -q '^ok 1 '; then echo "ok 1 - a harmless input passes"; else echo "not ok 1 - a harmless input passes"; echo "$out" | sed 's/^/# /'; fi
out=$("$replay" "$dir/0-harmless" "$dir/1-property" 2>&1)
status=$?
if [ $status -ne 0 ] && echo "$out" | grep -q 'planted input broke a property' && ! echo "$out" | grep -q '^ok 2 '; then
  echo "ok 2 - a broken property fails the replay (status $status)"
else
  echo "not ok 2 - a broken property fails the replay (status $status)"; echo "$out" | sed 's/^/# /'
fi
if [ "$sanitized" != 1 ]; then
  echo "ok 3 - # SKIP this build has no AddressSanitizer, which the planted overflow needs"
  exit 0
fi
out=$("$replay" "$dir/0-harmless" "$dir/2-overflow" 2>&1)
status=$?
if [ $status -ne 0 ] && echo "$out" | grep -qE 'heap-buffer-overflow|insufficient space for an object' && ! echo "$out" | grep -q '^ok 2 '; then
  echo "ok 3 - an out-of-bounds read fails the replay (status $status)"
else
  echo "not ok 3 - an out-of-bounds read fails the replay (status $status)"; echo "$out" | sed 's/^/# /'
fi
