#!/bin/sh
# TAP test of scripts/gpu-check.sh where there is no GPU (every CI machine): it must check nothing,
# say so in its report and exit 2, so that a GPU-less run is never mistaken for a passing one. A stub
# nvidia-smi that fails (as it does on a machine without the driver) stands in front of PATH.
# usage: gpu_check_no_gpu.sh SOURCE_ROOT
root="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2\nexit 9\n' >"$work/bin/nvidia-smi"
chmod +x "$work/bin/nvidia-smi"
echo "1..3"
PATH="$work/bin:$PATH" "$root/scripts/gpu-check.sh" --out "$work/out" >"$work/stdout" 2>&1
status=$?
report="$work/out/gpu-check-report.md"
if [ "$status" -eq 2 ]; then echo "ok 1 - exit status 2 without a GPU"; else echo "not ok 1 - exit status $status without a GPU (want 2)"; sed 's/^/# /' "$work/stdout"; fi
if grep -q '^Total: .* Overall: NOT RUN (no NVIDIA GPU)\.$' "$report" 2>/dev/null; then
  echo "ok 2 - the report says nothing was run"
else
  echo "not ok 2 - the report does not say NOT RUN"; sed 's/^/# /' "$report" 2>/dev/null
fi
if [ -d "$root/build-gpu" ] && [ "$root/build-gpu" -nt "$work" ]; then
  echo "not ok 3 - it configured a build without a GPU"
elif tar -tzf "$work/out/gpu-check-logs.tar.gz" 2>/dev/null | grep -q 'system.txt'; then
  echo "ok 3 - it built nothing and packed its logs"
else
  echo "not ok 3 - no log archive"
fi
