#!/usr/bin/env python3
# TAP test: `kvq-bench --quick` on the CPU backend and, where they are available, Vulkan (lavapipe in
# CI) and CUDA (a GPU machine: scripts/gpu-check.sh), writing JSON and CSV into the build directory; the files must be well-formed and hold a row of
# every method and case on every backend that ran, each run or skipped with a reason. The bench
# itself fails (exit 2) when a case's output is off its reference (bench/cases.c, check_outputs), so a zero exit
# also says that every timed result was right. Figures are measurements: never checked here.
# usage: bench_quick.py KVQ_BENCH KVQ_TOOL OUT_DIR
import csv
import json
import os
import subprocess
import sys

bench, tool, out = sys.argv[1], sys.argv[2], sys.argv[3]
CASES = ["append", "fused", "scores", "wsum"]
n = 0


def ok(good, what, detail=""):
    global n
    n += 1
    print(("ok" if good else "not ok") + " %d - %s" % (n, what))
    if not good and detail:
        for line in detail.splitlines()[-40:]:
            print("# " + line)


def not_json(constant):
    # Python reads NaN and Infinity, which JSON has not: other readers would reject the file
    raise ValueError("not JSON: " + constant)


info = subprocess.run([tool, "info"], capture_output=True, text=True).stdout
# `kvq info` lists "  vulkan  available: DEVICE" when a Vulkan device is there (lavapipe in CI)
available = [line.split()[0] for line in info.splitlines() if line.split()[1:2] == ["available:"]]
backends = ["cpu"] + [b for b in ("vulkan", "cuda") if b in available]
lavapipe = "llvmpipe" in info
print("1..%d" % (4 * len(backends) + 3 + lavapipe))

for backend in backends:
    js, cs = os.path.join(out, "bench-quick-%s.json" % backend), os.path.join(out, "bench-quick-%s.csv" % backend)
    for f in (js, cs):
        if os.path.exists(f):
            os.remove(f)
    run = subprocess.run([bench, "--quick", "--backend", backend, "--json", js, "--csv", cs],
                         capture_output=True, text=True)
    ok(run.returncode == 0, "%s: kvq-bench --quick exits 0" % backend, run.stdout + run.stderr)
    try:
        with open(js) as f:
            doc = json.load(f, parse_constant=not_json)
        dev = doc["devices"][0]
        good = isinstance(doc.get("rows"), list) and dev["backend"] == backend and \
            dev["copy_gb_per_s"] > 0 and doc["kvq_version"]
        # GPU backends also time kvq's own copy kernel, and the copy bandwidth every fraction is
        # taken of is the better of it and the copy engine's (docs/BENCH.md, "Copy bandwidth")
        if backend != "cpu":
            good = good and dev["copy_kernel_gb_per_s"] > 0 and dev["copy_engine_gb_per_s"] > 0 and \
                dev["copy_gb_per_s"] == max(dev["copy_kernel_gb_per_s"], dev["copy_engine_gb_per_s"])
        ok(good, "%s: JSON well-formed, with its device and copy bandwidth (engine and kernel on a GPU backend)" % backend, json.dumps(doc)[:2000])
    except Exception as e:  # noqa: BLE001 - any failure to read it is the finding
        doc = {"rows": []}
        ok(False, "%s: JSON well-formed" % backend, repr(e))
    # every method (the default list, whose first row is exact-f16) has every case, run or skipped
    methods = []
    for r in doc["rows"]:
        if r["method"] not in methods:
            methods.append(r["method"])
    # (the cuBLAS baseline, CUDA only, has the fused case alone)
    missing = [(m, c) for m in methods for c in (["fused"] if m == "cublas-f16" else CASES)
               if not any(r["method"] == m and r["case"] == c for r in doc["rows"])]
    ran = [r for r in doc["rows"] if "skipped" not in r]
    # the quick grid fits every backend: a skipped kvq row is a regression that would otherwise pass
    # as "run or skipped" (only the cuBLAS baseline may skip: it is not kvq's work)
    skipped = [(r["method"], r["case"], r["skipped"]) for r in doc["rows"] if "skipped" in r and r["method"] != "cublas-f16"]
    bad = [r for r in ran if not (r["call"] and r["call"]["median_ms"] > 0 and r["read_bytes"] > 0)]
    unchecked = [r for r in ran if r["case"] in ("fused", "wsum") and r["relative_error"] is None]
    ok(len(methods) >= 10 and not missing and ran and not bad and not unchecked and not skipped,
       "%s: a row of every method and case (%d methods), each timed and its output checked" % (backend, len(methods)),
       "missing %s\nbad %s\nunchecked %s\nskipped %s" % (missing, bad[:3], unchecked[:3], skipped[:3]))
    try:
        with open(cs, newline="") as f:
            rows = list(csv.reader(f))
        header = rows[0]
        good = len(rows) == len(doc["rows"]) + 1 and all(len(r) == len(header) for r in rows) and \
            "fraction_of_copy" in header and "speedup_over_fp16" in header
        # the same rows in the same order: a line per JSON row, not just as many lines
        at = {name: header.index(name) for name in ("method", "case")}
        good = good and [(r[at["method"]], r[at["case"]]) for r in rows[1:]] == \
            [(r["method"], r["case"]) for r in doc["rows"]]
        ok(good, "%s: CSV well-formed, one line per JSON row" % backend,
           "header %s, %d lines, widths %s" % (header, len(rows), sorted(set(len(r) for r in rows))))
    except Exception as e:  # noqa: BLE001
        ok(False, "%s: CSV well-formed" % backend, repr(e))

bad_flag = subprocess.run([bench, "--contexts", "12x"], capture_output=True, text=True)
ok(bad_flag.returncode == 2 and "--contexts" in bad_flag.stderr, "a bad flag: exit 2 and a message naming it",
   bad_flag.stderr)

# --keep-going (scripts/gpu-check.sh's runs on a GPU): a method whose check fails must not end the run.
# A check bound of 1e-300 fails every fused check (fp32 arithmetic is never that close to the double
# reference), while appends are not checked against a bound: the appends keep their figures, the
# fused rows are marked failed, and the second method still runs. Without the flag the first failure
# ends the run, so the second method has no row.
two = ["--quick", "--backend", "cpu", "--methods", "exact-f16/exact-f16,uniform-b4/uniform-b4",
       "--cases", "append,fused", "--check-bound", "1e-300"]
for keep in (True, False):
    kg = os.path.join(out, "bench-keep-going-%d.json" % keep)
    run = subprocess.run([bench] + two + (["--keep-going"] if keep else []) + ["--json", kg],
                         capture_output=True, text=True)
    try:
        with open(kg) as f:
            rows = json.load(f, parse_constant=not_json)["rows"]
    except Exception as e:  # noqa: BLE001
        rows = [{"error": repr(e)}]
    by = {(r.get("method"), r.get("case")): r for r in rows}
    if keep:
        good = run.returncode == 2 and len(rows) == 4 and all(
            "skipped" not in by.get((m, "append"), {"skipped": 1}) and
            by.get((m, "fused"), {}).get("skipped", "").startswith("FAILED")
            for m in ("exact-f16/exact-f16", "uniform-b4/uniform-b4"))
        what = "--keep-going: both methods run, fused rows marked FAILED, appends kept, exit 2"
    else:
        good = run.returncode == 2 and not any(r.get("method") == "uniform-b4/uniform-b4" for r in rows)
        what = "without --keep-going the first failed check ends the run (exit 2)"
    ok(good, what, json.dumps(rows)[:1500] + "\n" + run.stderr)

# lavapipe's largest storage buffer (maxStorageBufferRange, 128 MiB) is below the standard run's 256 MiB
# copy buffers: the bench cuts them to it, saying so, instead of failing before the first case (as it
# did until 2026-11-27, with an empty message).
if lavapipe:
    run = subprocess.run([bench, "--backend", "vulkan", "--contexts", "256", "--batch", "1", "--methods",
                          "exact-f16/exact-f16", "--cases", "fused", "--warmup", "1", "--samples", "1"],
                         capture_output=True, text=True)
    ok(run.returncode == 0 and "cut from 256 to 128 MiB" in run.stderr,
       "vulkan (lavapipe): the standard run's 256 MiB copy buffers cut to the device's largest buffer",
       run.stdout + run.stderr)
