#!/usr/bin/env bash
# kvq on a real NVIDIA GPU in one command (docs/CUDA.md, "Verified on a GPU"): builds kvq with CUDA
# and Vulkan, runs the tests that use the GPU, `kvq golden --check` on CUDA and on Vulkan through the
# NVIDIA driver, compute-sanitizer's four tools over the golden check on CUDA, the benchmark at the
# long-context point of issue 11's targets on both backends, Nsight Compute's profile of the fused
# decode kernels there, and the rest of the test suite in the time left, and writes one report.
# Whoever gets a GPU runs it first.
#
#   scripts/gpu-check.sh [--out DIR] [--debs DIR]
#
# --out   where the report goes (default: $OUT if set, else ./gpu-check-out): gpu-check-report.md, the
#         summary and the tail of every step's log, and gpu-check-logs.tar.gz, the whole logs.
# --debs  Debian packages to unpack into a private prefix first (default .gpu-check/debs, written by
#         scripts/gpu-check-pack.sh), for a GPU machine without a package registry.
#
# Every step has its own time limit and the whole stays under 9 minutes (GPU_CHECK_SECONDS=N: N
# seconds, to leave a device call room for more). A quicker recheck of a change: GPU_CHECK_GPU_TESTS (the
# tests that use the GPU, space-separated), GPU_CHECK_BENCH_CASES (kvq-bench --cases, default
# fused,append), GPU_CHECK_NCU_METHODS (kvq-bench --methods for the profile). Exit status: 0 when every
# step that ran passed, 1 when one failed, 2 when there is no NVIDIA GPU here (nothing else is run).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/gpu-check-out}
debs=$root/.gpu-check/debs
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --debs) debs=$2; shift 2 ;;
    *) echo "usage: scripts/gpu-check.sh [--out DIR] [--debs DIR]" >&2; exit 64 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
logs=$(mktemp -d "${TMPDIR:-/tmp}/kvq-gpu-check.XXXXXX")
report=$out/gpu-check-report.md
build=$root/build-gpu
started=$(date +%s)
deadline=$((started + ${GPU_CHECK_SECONDS:-530})) # 8 min 50 s unless GPU_CHECK_SECONDS says: every step's limit is cut to what is left of it
failed=0
summary=""

# step NAME SECONDS COMMAND...: runs COMMAND with a time limit, its output in $logs/NAME.log, and adds
# a line to the summary. A command that exits 77 is a skip (its last line says why).
step() {
  local name=$1 limit=$2 result t0 t1 rc
  shift 2
  t0=$(date +%s)
  if [ $((deadline - t0)) -lt 10 ]; then
    summary+="| $name | SKIP: out of time (the whole check stops at 9 minutes) | 0 |"$'\n'
    return 77
  fi
  if [ $((deadline - t0)) -lt "$limit" ]; then limit=$((deadline - t0)); fi
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  t1=$(date +%s)
  case $rc in
    0) result=PASS ;;
    77) result="SKIP: $(tail -n 1 "$logs/$name.log")" ;;
    124 | 137) result="FAIL (timed out after $limit s)"; failed=1 ;;
    *) result="FAIL (exit $rc)"; failed=1 ;;
  esac
  summary+="| $name | $result | $((t1 - t0)) |"$'\n'
  echo "gpu-check: $name: $result ($((t1 - t0)) s)"
  return $rc
}

write_report() {
  local overall
  if [ "$1" = no-gpu ]; then overall="NOT RUN (no NVIDIA GPU)"; elif [ $failed -eq 0 ]; then overall=PASS; else overall=FAIL; fi
  {
    echo "# kvq gpu-check report"
    echo
    echo '```'
    cat "$logs/system.txt"
    echo '```'
    echo
    echo "| step | result | seconds |"
    echo "|---|---|---|"
    printf '%s' "$summary"
    echo
    echo "Total: $(($(date +%s) - started)) s. Overall: $overall."
    for log in "$logs"/*.log; do
      [ -e "$log" ] || continue
      echo
      echo "## $(basename "$log" .log) (last 60 lines)"
      echo
      echo '```'
      tail -n 60 "$log"
      echo '```'
    done
  } >"$report"
  tar -C "$logs" -czf "$out/gpu-check-logs.tar.gz" .
  echo "gpu-check: report in $report"
}

# ---- The machine ------------------------------------------------------------------------------
{
  echo "date:     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "kvq:      $(git -C "$root" rev-parse HEAD 2>/dev/null || echo 'not a git checkout') $(git -C "$root" status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
  echo "host:     $(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | sed 's/^/gpu:      /'
  else
    echo "gpu:      nvidia-smi not found"
  fi
} >"$logs/system.txt"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  summary+="| gpu | no NVIDIA GPU here: nothing checked | 0 |"$'\n'
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi finds none): nothing checked"
  write_report no-gpu
  exit 2
fi

# ---- What the build needs -----------------------------------------------------------------------
# CUDA: nvcc is rarely on PATH.
for dir in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
  if ! command -v nvcc >/dev/null && [ -x "$dir/nvcc" ]; then export PATH=$PATH:$dir; fi
done
system_meson=$(command -v meson || true) # before the carried packages' bin goes first on PATH
# The carried Debian packages go into a private prefix: the compiler, pkg-config, the loader and the
# tests find them through the variables below.
if [ -d "$debs" ] && ls "$debs"/*.deb >/dev/null 2>&1; then
  prefix=$(mktemp -d "${TMPDIR:-/tmp}/kvq-gpu-deps.XXXXXX")
  for deb in "$debs"/*.deb; do dpkg -x "$deb" "$prefix"; done
  lib=$prefix/usr/lib/x86_64-linux-gnu
  export PATH=$prefix/usr/bin:$PATH
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH}
  export CPATH=$prefix/usr/include${CPATH:+:$CPATH}
  export PKG_CONFIG_SYSROOT_DIR=$prefix PKG_CONFIG_LIBDIR=$lib/pkgconfig:$prefix/usr/share/pkgconfig
  # kvq links Criterion dynamically: its .pc's private requirements (libgit2, nanomsg, ...) are not
  # needed to build, and their development packages are not carried.
  sed -i '/^Requires.private/d; /^Libs.private/d' "$lib/pkgconfig/criterion.pc" 2>/dev/null
  export VK_ADD_LAYER_PATH=$prefix/usr/share/vulkan/explicit_layer.d
fi
# The NVIDIA Vulkan driver where the image keeps it outside the loader's search path.
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$icd" ]; then export VK_DRIVER_FILES=$icd; fi
{
  echo "nvcc:     $(nvcc --version 2>&1 | grep -m1 release || echo 'not found')"
  echo "cc:       $(cc --version 2>&1 | head -n 1)"
  echo "meson:    ${system_meson:-not on the PATH} $([ -n "$system_meson" ] && "$system_meson" --version 2>&1), carried: $([ -f "${prefix:-/nonexistent}/usr/bin/meson" ] && echo 1.0.1 || echo none); ninja: $(ninja --version 2>&1)"
  echo "vulkan:   VK_DRIVER_FILES=${VK_DRIVER_FILES:-unset}"
} >>"$logs/system.txt"

# ---- The checks ---------------------------------------------------------------------------------
# Ordered by what only a GPU can show, so that the deadline cuts the least telling steps: the tests
# that run on the GPU, the golden checks, compute-sanitizer's memcheck, the benchmark's decode and
# append figures at long context, the other sanitizers, and last the rest of the suite (which CI runs
# too, on the CPU and lavapipe).
kvq=$build/tools/kvq
bench=$build/bench/kvq-bench
built=0
setup_opts=(-Dbuildtype=release -Dcuda=enabled -Dvulkan=enabled -Dtests=enabled)
# meson: the machine's own (GPU images carry one from PyPI), else the carried Debian one (CI's meson).
# A fresh tree has no build directory (`meson setup --wipe` fails on one that does not exist).
meson_cmd=()
if [ -n "$system_meson" ]; then
  rm -rf "$build"
  if step configure 120 "$system_meson" setup "$build" "${setup_opts[@]}"; then meson_cmd=("$system_meson"); fi
fi
if [ ${#meson_cmd[@]} -eq 0 ] && [ -n "${prefix:-}" ] && [ -f "$prefix/usr/bin/meson" ]; then
  export PYTHONPATH=$prefix/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}
  rm -rf "$build"
  if step configure-carried-meson 120 python3 "$prefix/usr/bin/meson" setup "$build" "${setup_opts[@]}"; then
    meson_cmd=(python3 "$prefix/usr/bin/meson")
  fi
fi
if [ ${#meson_cmd[@]} -gt 0 ] && step build 240 ninja -C "$build"; then
  built=1
fi
if [ $built -eq 1 ]; then
  step info 30 "$kvq" info
  # The tests that use a real device (CUDA, and Vulkan through the NVIDIA driver) first.
  gpu_tests=(cuda gpu_cuda gpu_vulkan vulkan determinism limits threads bad_input golden attention model_bounds
             cuda_ptxas bench_quick)
  if [ -n "${GPU_CHECK_GPU_TESTS:-}" ]; then read -ra gpu_tests <<<"$GPU_CHECK_GPU_TESTS"; fi
  step tests-gpu 150 "${meson_cmd[@]}" test -C "$build" --print-errorlogs --num-processes "$(nproc)" "${gpu_tests[@]}"
  step golden-cuda 60 "$kvq" golden --check --backend cuda
  step golden-vulkan 60 "$kvq" golden --check --backend vulkan
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  sanitize() {
    if [ -n "$sanitizer" ]; then
      step "sanitizer-$1" 75 "$sanitizer" --tool "$1" --error-exitcode 1 "$kvq" golden --check --backend cuda
    else
      step "sanitizer-$1" 5 sh -c 'echo "compute-sanitizer is not installed here"; exit 77'
    fi
  }
  sanitize memcheck
  # The benchmark at the issue's target point (docs/BENCH.md, "On a GPU"): every default method at
  # 256k tokens, batch 1, GQA 4, head_dim 128, 8 kv heads: decode against the copy bandwidth, the
  # speed-up over fp16, the cuBLAS baseline, and the appends' rate (a 32k prefill's is the same per
  # token). On the H200 of 2026-11-27 the appends (5-7 s of wall time per method) took most of the
  # 90 s, and 10 of 11 methods ran: hence 130 s. --time-limit ends a run with what it measured
  # (methods not started by then are skipped rows), 30 s before the step's own limit; --keep-going:
  # a method that fails its check is marked and the others still run.
  for backend in cuda vulkan; do
    left=$((deadline - $(date +%s)))
    bench_step=$((left < 130 ? left : 130))
    bench_limit=$((bench_step - 30))
    if [ "$bench_limit" -lt 10 ]; then bench_limit=10; fi
    step "bench-$backend" "$bench_step" "$bench" --backend "$backend" --contexts 256k --batch 1 --cases "${GPU_CHECK_BENCH_CASES:-fused,append}" \
      --keep-going --time-limit "$bench_limit" \
      --json "$logs/bench-$backend.json" --csv "$logs/bench-$backend.csv" --plot "$logs/bench-$backend-plots"
  done
  # Where the fused decode's time goes (issue 11 asks for the profile behind every missed target):
  # Nsight Compute over the flash kernels at the same point, for the exact fp16 cache, QJL k0 and
  # PolarQuant b4222: both calls of each (a warm-up and a sample), two kernels a call, hence
  # --launch-count 12. 66 s on the H200 of 2026-11-27.
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  ncu_methods=${GPU_CHECK_NCU_METHODS:-exact-f16/exact-f16,qjl-m256-k0/uniform-b2,polar-b4222}
  ncu_launches=$((4 * $(tr ',' '\n' <<<"$ncu_methods" | grep -c .)))
  if [ -n "$ncu" ]; then
    step ncu-fused 100 "$ncu" --clock-control none -k regex:kvq_cuda_flash --launch-count "$ncu_launches" --section SpeedOfLight \
      --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section SchedulerStats --section ComputeWorkloadAnalysis \
      "$bench" --backend cuda --contexts 256k --batch 1 --cases fused \
      --methods "$ncu_methods" --warmup 1 --samples 1 --copy-mb 64 --flush-mb 64
  else
    step ncu-fused 5 sh -c 'echo "Nsight Compute (ncu) is not installed here"; exit 77'
  fi
  for tool in racecheck synccheck initcheck; do sanitize "$tool"; done
  # The rest of the suite in what time is left (suite setup installs packages: no registry here).
  # The deadline usually cuts it: a cut run in which no test failed is a SKIP that says how far it
  # got, not a FAIL; a test that failed before the cut fails the step.
  rest=()
  while read -r name; do
    name=${name#kvq / }
    case " ${gpu_tests[*]} " in *" $name "*) continue ;; esac
    case $name in kvq:setup* | *readme_commands*) continue ;; esac
    rest+=("$name")
  done < <("${meson_cmd[@]}" test -C "$build" --list 2>/dev/null | grep '^kvq')
  left=$((deadline - $(date +%s)))
  export GPU_CHECK_LOG=$logs/tests-rest.log GPU_CHECK_TESTS=${#rest[@]}
  step tests-rest 600 bash -c '
    limit=$1; shift
    timeout "$limit" "$@"; rc=$?
    ran=$(grep -cE "^ *[0-9]+/[0-9]+ .* (OK|SKIP|FAIL|ERROR|TIMEOUT|EXPECTEDFAIL|UNEXPECTEDPASS) " "$GPU_CHECK_LOG" 2>/dev/null)
    bad=$(grep -cE "^ *[0-9]+/[0-9]+ .* (FAIL|ERROR|TIMEOUT|UNEXPECTEDPASS) " "$GPU_CHECK_LOG" 2>/dev/null)
    if [ "$rc" -eq 124 ] && [ "$bad" -eq 0 ]; then
      echo "cut by the deadline after $ran of $GPU_CHECK_TESTS tests, none failed"; exit 77
    fi
    if [ "$rc" -eq 124 ]; then echo "cut by the deadline after $ran of $GPU_CHECK_TESTS tests, $bad failed"; exit 1; fi
    exit "$rc"' _ "$((left > 20 ? left - 15 : 5))" "${meson_cmd[@]}" test -C "$build" --print-errorlogs \
    --num-processes "$(nproc)" "${rest[@]}"
fi
write_report ran
exit $failed
