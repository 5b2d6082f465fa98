#!/bin/sh
# Builds kvq's fuzz targets for libFuzzer with clang (in build-fuzz/, or $KVQ_FUZZ_BUILD) and runs one
# of them for SECONDS seconds on one core (docs/RELIABILITY.md, "Fuzzing"). Needs clang and its
# libFuzzer runtime (Debian 12: clang-14 and libclang-rt-14-dev); CI does not: it replays the corpora
# with the ordinary test build (tests/fuzz/meson.build).
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer options]
# TARGET: cache_load, cache_load_sum, resave, codebooks_load, npy, config or model_manifest. The
# seeds are its committed corpus (tests/fuzz/corpus, and the golden caches for the cache targets);
# what the run adds goes to build-fuzz/corpus-TARGET, crashes to build-fuzz/artifacts-TARGET, and
# the run's log, whose last lines give executions, coverage and corpus size, to
# build-fuzz/fuzz-TARGET.log.
set -eu
if [ $# -lt 2 ]; then
  echo "usage: $0 TARGET SECONDS [libFuzzer options]" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_FUZZ_BUILD:-$root/build-fuzz}
target=$1
seconds=$2
shift 2
case $target in
  cache_load | cache_load_sum | resave) seeds="caches $target" ;;
  codebooks_load | npy | config | model_manifest) seeds=$target ;;
  *) echo "$0: unknown target $target" >&2; exit 2 ;;
esac
if [ ! -f "$build/build.ninja" ]; then
  # UBSan must stop at its first report, as ASan does, so that libFuzzer keeps the input; clang's
  # sanitized shared libraries leave the sanitizer runtime undefined (b_lundef=false).
  CC=${CC:-clang} meson setup "$build" "$root" -Dfuzzing=true -Db_sanitize=address,undefined \
    -Dc_args=-fno-sanitize-recover=all -Dvulkan=disabled -Dcuda=disabled -Demulated_cuda=disabled \
    -Dtests=disabled -Dbench=disabled -Db_lundef=false >/dev/null
fi
ninja -C "$build" -j2 "tests/fuzz/fuzz_$target" >/dev/null
dirs=""
for s in $seeds; do
  [ -d "$root/tests/fuzz/corpus/$s" ] && dirs="$dirs $root/tests/fuzz/corpus/$s"
done
# The golden caches (60-160 KB, head_dim 128, whose matrices every load rebuilds) run at about 15
# executions a second, the seeds of tests/fuzz/corpus/caches (4-16 KB, head_dim 16, every method and
# policy) at hundreds: the golden ones join only with KVQ_FUZZ_GOLDEN=1. The replay tests use both.
case $target in
  cache_load | cache_load_sum | resave)
    if [ "${KVQ_FUZZ_GOLDEN:-0}" = 1 ]; then
      mkdir -p "$build/seeds-golden"
      for f in "$root"/tests/golden/*.kvq; do ln -sf "$f" "$build/seeds-golden/"; done
      dirs="$dirs $build/seeds-golden"
    fi ;;
esac
mkdir -p "$build/corpus-$target" "$build/artifacts-$target" "$build/run-$target"
# From its own directory: with -jobs=N libFuzzer writes its workers' logs (fuzz-0.log, ...) there.
cd "$build/run-$target"
rm -f fuzz-*.log
# shellcheck disable=SC2086 # the seed directories are separate arguments
"$build/tests/fuzz/fuzz_$target" "$build/corpus-$target" $dirs -max_total_time="$seconds" -rss_limit_mb=2048 \
  -malloc_limit_mb=1024 -timeout=60 -print_final_stats=1 -artifact_prefix="$build/artifacts-$target/" "$@" \
  >"$build/fuzz-$target.log" 2>&1 || status=$?
for f in fuzz-*.log; do [ -f "$f" ] && cat "$f" >>"$build/fuzz-$target.log"; done
tail -n 14 "$build/fuzz-$target.log"
exit "${status:-0}"
