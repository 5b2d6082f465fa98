#!/bin/sh
# TAP test: LeakSanitizer catches kvq's own leaks under the suite's sanitizer settings (the
# default test setup in tests/meson.build, whose environment this script and its children inherit:
# the lavapipe preload and tests/sanitizers/lsan.supp), both at the exit of a process and at the
# end of a Criterion test (tests/helpers.h), and passes processes and tests that free everything.
# usage: leak_check.sh CANARY_BINARY CRITERION_CANARY_BINARY B_SANITIZE_OPTION
canary="$1"
criterion_canary="$2"
sanitize="$3"
echo "1..4"
case "$sanitize" in
  *address*) ;;
  *)
    for i in 1 2 3 4; do
      echo "ok $i - # SKIP not an AddressSanitizer build (b_sanitize=$sanitize): no leak checking to test"
    done
    exit 0 ;;
esac
# 1. The process loads the Vulkan driver (on AMD Zen hosts Mesa's lavapipe leaks a block there) and
#    frees everything of kvq's: it must pass, or the driver's block is reported.
if output=$("$canary" clean 2>&1); then
  echo "ok 1 - a process that loads every backend and frees what kvq took passes LeakSanitizer"
else
  echo "not ok 1 - a clean process failed under LeakSanitizer with the suite's settings"
  echo "$output" | sed 's/^/# /' | head -40
fi
# 2. The same process leaking one cache of kvq's must fail, and the report must name kvq.
output=$("$canary" leak 2>&1)
status=$?
if [ "$status" -ne 0 ] && echo "$output" | grep -q "LeakSanitizer" && echo "$output" | grep -q "kvq_cache_create"; then
  echo "ok 2 - a cache kvq leaks is reported at exit (exit status $status)"
else
  echo "not ok 2 - a deliberate kvq leak was not reported (exit status $status)"
  echo "$output" | sed 's/^/# /' | head -40
fi
# 3 and 4. A Criterion test that leaks a cache must fail; one that frees everything must pass.
output=$("$criterion_canary" --tap=- 2>&1)
if echo "$output" | grep -q "^not ok - leak_canary::leaks_a_cache" && echo "$output" | grep -q "kvq_cache_create"; then
  echo "ok 3 - a Criterion test that leaks a cache of kvq's fails, and the report names kvq_cache_create"
else
  echo "not ok 3 - a Criterion test that leaks a cache of kvq's did not fail with a report"
  echo "$output" | sed 's/^/# /' | head -40
fi
if echo "$output" | grep -q "^ok - leak_canary::frees_everything"; then
  echo "ok 4 - a Criterion test that frees everything passes the per-test leak check"
else
  echo "not ok 4 - a Criterion test that frees everything failed the per-test leak check"
  echo "$output" | sed 's/^/# /' | head -40
fi
