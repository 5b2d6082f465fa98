#!/bin/sh
# Compiles the CUDA kernels with ptxas's report (-Xptxas -v) for every architecture of the budget file
# and checks every kernel against its line there (backends/cuda/ptxas_budget.txt): registers, stack
# frame (local memory), spill stores and loads, static shared memory must not exceed it, and every
# kernel needs a line.
# Prints TAP. usage: ptxas_check.sh NVCC SOURCE_ROOT BUDGET
nvcc=$1 root=$2 budget=$3
out=$(mktemp -d) || exit 1
trap 'rm -rf "$out"' EXIT
archs=$(awk '!/^#/ && NF { print $1 }' "$budget" | sort -u)
for arch in $archs; do
  if ! "$nvcc" -arch="$arch" -I"$root" -Xptxas -v -c "$root/backends/cuda/kernels/kernels_check.cu" -o "$out/k.o" >"$out/$arch.log" 2>&1; then
    echo "not ok - nvcc for $arch"
    sed 's/^/# /' "$out/$arch.log"
    continue
  fi
  # ptxas's lines: "Compiling entry function '_Z<len><name>...' for 'sm_80'", then the function's
  # "N bytes stack frame, S bytes spill stores, L bytes spill loads" and "Used R registers, used B
  # barriers, M bytes smem" (no smem part when it has none).
  awk -v arch="$arch" -v budget="$budget" '
    BEGIN { while ((getline line < budget) > 0) { split(line, f); if (line !~ /^#/ && f[1] == arch) limit[f[2]] = f[3] " " f[4] " " f[5] " " f[6] " " f[7] } }
    /Compiling entry function/ { match($0, /_Z[0-9]+/); len = substr($0, RSTART + 2, RLENGTH - 2); kernel = substr($0, RSTART + RLENGTH, len) }
    /bytes stack frame/ { stack = $1; stores = $5; loads = $9 }
    /Used [0-9]+ registers/ && kernel != "" {
      smem = 0
      for (i = 1; i <= NF; i++) { if ($i == "Used") regs = $(i + 1); if ($i ~ /^smem/ && $(i - 1) == "bytes") smem = $(i - 2) }
      got = regs " " stack " " stores " " loads " " smem
      if (!(kernel in limit)) { printf "not ok - %s %s has no line in the budget (registers stack stores loads shared: %s)\n", arch, kernel, got; kernel = ""; next }
      split(limit[kernel], l, " "); split(got, g, " ")
      ok = g[1] <= l[1] && g[2] <= l[2] && g[3] <= l[3] && g[4] <= l[4] && g[5] != "" && l[5] != "" && g[5] <= l[5]
      printf "%s - %s %s within its budget (registers stack stores loads shared: %s, budget %s)\n", ok ? "ok" : "not ok", arch, kernel, got, limit[kernel]
      seen[kernel] = 1; kernel = ""
    }
    END { for (k in limit) if (!(k in seen)) printf "not ok - %s %s is in the budget but ptxas did not report it\n", arch, k }
  ' "$out/$arch.log"
done | awk '{ n++; sub(/^ok -/, "ok " n " -"); sub(/^not ok -/, "not ok " n " -"); print } END { print "1.." n }'
