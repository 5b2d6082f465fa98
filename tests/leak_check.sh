#!/bin/sh
# TAP test: LeakSanitizer still catches kvq's own leaks with the suite's suppressions applied
# (tests/sanitizers/lsan.supp, through the default test setup in tests/meson.build, whose
# environment this script and its children inherit).
# usage: leak_check.sh CANARY_BINARY B_SANITIZE_OPTION
canary="$1"
sanitize="$2"
echo "1..2"
case "$sanitize" in
  *address*) ;;
  *)
    echo "ok 1 - # SKIP not an AddressSanitizer build (b_sanitize=$sanitize): no leak checking to test"
    echo "ok 2 - # SKIP not an AddressSanitizer build (b_sanitize=$sanitize): no leak checking to test"
    exit 0 ;;
esac
# 1. The process loads the Vulkan driver (on AMD Zen hosts Mesa's lavapipe leaks a block there) and
#    frees everything of kvq's: it must pass, or the suppressions do not cover the driver's leak.
if output=$("$canary" clean 2>&1); then
  echo "ok 1 - a process that loads every backend and frees what kvq took passes LeakSanitizer"
else
  echo "not ok 1 - a clean process failed under LeakSanitizer with the suite's suppressions"
  echo "$output" | sed 's/^/# /' | head -40
fi
# 2. The same process leaking one cache of kvq's must fail, and the report must name kvq.
output=$("$canary" leak 2>&1)
status=$?
if [ "$status" -ne 0 ] && echo "$output" | grep -q "LeakSanitizer" && echo "$output" | grep -q "kvq_cache_create"; then
  echo "ok 2 - a cache kvq leaks is reported (exit status $status) despite the suppressions"
else
  echo "not ok 2 - a deliberate kvq leak was not reported (exit status $status)"
  echo "$output" | sed 's/^/# /' | head -40
fi
