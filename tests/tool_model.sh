#!/bin/sh
# TAP test: `kvq dump` and `kvq demo` on the real model (docs/MODEL.md), CPU backend. Skipped,
# visibly, when scripts/fetch-model.sh has not fetched the model (the same folder kvq_use_default_dir
# finds: $KVQ_MODEL_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/kvq/use-lite-0.2.0).
# usage: tool_model.sh KVQ_TOOL
kvq="$1"
n=0
failures=0
pass() { n=$((n + 1)); echo "ok $n - $1"; }
fail() {
  n=$((n + 1))
  failures=$((failures + 1))
  echo "not ok $n - $1"
  [ -f "$2" ] && tail -n 30 "$2" | sed 's/^/# /'
}
dir="${KVQ_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvq/use-lite-0.2.0}/package/dist"
if [ ! -f "$dir/model.json" ]; then
  echo "1..1"
  echo "ok 1 # SKIP model not fetched (scripts/fetch-model.sh): no $dir/model.json"
  exit 0
fi
scratch=$(mktemp -d /tmp/kvq-tool-model-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
log="$scratch/log"

# kvq dump: 8 sentences of layer 1 (141 tokens), cut to 100 tokens; each file's numpy header says [100, 4, 128].
if "$kvq" dump --layer 1 --sentences 8 --tokens 100 --out "$scratch" > "$log" 2>&1; then
  pass "kvq dump --layer 1 --sentences 8 --tokens 100 exits 0"
else
  fail "kvq dump --layer 1 --sentences 8 --tokens 100 failed" "$log"
fi
for name in queries keys values; do
  if head -c 128 "$scratch/layer1-$name.npy" 2>/dev/null | grep -q "'shape': (100, 4, 128)"; then
    pass "layer1-$name.npy is [100, 4, 128]"
  else
    fail "layer1-$name.npy is not [100, 4, 128]" "$log"
  fi
done
if grep -q "without 1/sqrt(head_dim)" "$log"; then
  pass "kvq dump says the queries do not carry 1/sqrt(head_dim)"
else
  fail "kvq dump does not say whether the queries carry 1/sqrt(head_dim)" "$log"
fi
# More tokens than the sentences hold: a clear error, nothing written.
if "$kvq" dump --sentences 2 --tokens 5000 --out "$scratch/none" > "$log" 2>&1; then
  fail "kvq dump --sentences 2 --tokens 5000 succeeded" "$log"
elif grep -q "fewer than the 5000 asked for" "$log"; then
  pass "kvq dump with too few sentences for --tokens says so"
else
  fail "kvq dump with too few sentences for --tokens gave no clear error" "$log"
fi

# kvq eval reads the dump: its table has the exact-f16 row, whose output error of fp16 storage is
# below 1e-2 (fp16's relative rounding 2^-11 per number, far below it).
if "$kvq" eval --keys "$scratch/layer1-keys.npy" --values "$scratch/layer1-values.npy" \
     --queries "$scratch/layer1-queries.npy" --mask none --methods exact-f16,uniform-b2 --quiet > "$log" 2>&1 &&
   awk '$1 == "exact-f16" && $8 < 1e-2 { found = 1 } END { exit !found }' "$log"; then
  pass "kvq eval reads the dumped layer (exact-f16 output error below 1e-2)"
else
  fail "kvq eval did not read the dumped layer" "$log"
fi

# kvq demo, small: the table, the exact fp32 row (storage as the reference's, only rounding apart:
# cosine printed 1.000000 to 6 decimals needs |1 - cos| < 5e-7; fp32 attention agrees with the
# plain reference to ~1e-6 relative, so the embedding's cosine is 1 - O(1e-12)) keeps every
# nearest neighbour, a policy row, and the plot is written when gnuplot is there.
if "$kvq" demo --sentences 12 --calibration 4 --methods exact-f32,uniform-b2,exact-f32@streaming --budget 20 \
     --threads 2 --quiet --plot "$scratch/demo.png" > "$log" 2>&1; then
  pass "kvq demo --sentences 12 --methods exact-f32,uniform-b2,exact-f32@streaming --budget 20 exits 0"
else
  fail "kvq demo --sentences 12 failed" "$log"
fi
if grep -q "^method .*B/token .*bits .*cos-mean .*cos-worst .*nn-same% .*score-err .*seconds" "$log"; then
  pass "kvq demo prints the table's header"
else
  fail "kvq demo prints no table header" "$log"
fi
if awk '$1 == "exact-f32" && $4 == "1.000000" && $5 == "1.000000" && $6 == "100.0" { found = 1 } END { exit !found }' "$log"; then
  pass "the exact-f32 row has cosine 1 and keeps every nearest neighbour"
else
  fail "the exact-f32 row is not cosine 1 with every neighbour kept" "$log"
fi
if awk '$1 == "uniform-b2" && $4 > 0 && $4 < 1 && $3 == "3.000" { found = 1 } END { exit !found }' "$log"; then
  pass "the uniform-b2 row has 3 bits per number and a cosine below 1"
else
  fail "the uniform-b2 row is missing or wrong" "$log"
fi
if command -v gnuplot > /dev/null; then
  if [ -s "$scratch/demo.png" ] && head -c 8 "$scratch/demo.png" | grep -q PNG; then
    pass "kvq demo wrote the PNG plot"
  else
    fail "kvq demo wrote no PNG" "$log"
  fi
else
  n=$((n + 1))
  echo "ok $n # SKIP gnuplot is not installed (scripts/install-deps.sh installs gnuplot-nox)"
fi
# The policy row keeps 20 tokens of each layer of a sentence, so its bits per number (fp32's 32
# times the kept share) lie below 32 (the first 12 verses have more than 20 pieces; Genesis 1:2 has
# 35) and above 32 x 20 / 128 = 5 (no sentence keeps fewer than 20 of at most 128); its embeddings
# are unit vectors, so the cosine lies in (-1, 1] (eviction moves them: no tighter bound is derived).
if awk '$1 == "exact-f32@streaming" && $3 < 32 && $3 > 5 && $4 > -1 && $4 <= 1 { found = 1 } END { exit !found }' "$log" &&
   grep -q "exact-f32@streaming .*% of the tokens kept" "$log"; then
  pass "the exact-f32@streaming row counts the kept tokens only and says what share it kept"
else
  fail "the exact-f32@streaming row is missing or wrong" "$log"
fi
# A budget below the 4 sinks and 16 newest tokens, and an unknown policy, are refused with the reason.
if "$kvq" demo --sentences 4 --methods uniform-b2@h2o --budget 19 --quiet > "$log" 2>&1; then
  fail "kvq demo ran a budget of 19" "$log"
elif grep -q "token budget of 19: from 20" "$log"; then
  pass "kvq demo refuses a budget of 19 and says why"
else
  fail "kvq demo refused a budget of 19 without the reason" "$log"
fi
if "$kvq" demo --sentences 4 --methods uniform-b2@lru --quiet > "$log" 2>&1; then
  fail "kvq demo ran an unknown policy" "$log"
elif grep -q '"lru": not a policy kvq demo knows' "$log"; then
  pass "kvq demo refuses an unknown policy and says why"
else
  fail "kvq demo refused an unknown policy without the reason" "$log"
fi
echo "1..$n"
[ "$failures" -eq 0 ]
