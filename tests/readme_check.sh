#!/bin/sh
# TAP test: the README stays true. Its example is examples/quickstart.c verbatim, the example runs,
# and its two commands are where .ci/run and newcomers find them.
# usage: readme_check.sh SOURCE_ROOT QUICKSTART_BINARY
root="$1"
quickstart="$2"
echo "1..5"
extracted=$(mktemp)
sed -n '/<!-- quickstart -->/,/<!-- \/quickstart -->/p' "$root/README.md" | sed '1,2d;$d' | sed '$d' > "$extracted"
if cmp -s "$extracted" "$root/examples/quickstart.c"; then
  echo "ok 1 - README's example is examples/quickstart.c"
else
  echo "not ok 1 - README's example differs from examples/quickstart.c"
  diff "$extracted" "$root/examples/quickstart.c" | sed 's/^/# /' | head -20
fi
rm -f "$extracted"
if output=$("$quickstart" 2>&1) && echo "$output" | grep -q "bits per number"; then
  echo "ok 2 - the example runs: $(echo "$output" | tail -1)"
else
  echo "not ok 2 - the example failed"
  echo "$output" | sed 's/^/# /'
fi
for marker in main-command test-command; do
  n=$(sed -n "/<!-- $marker -->/,/<!-- \/$marker -->/p" "$root/README.md" | grep -c '^scripts/install-deps.sh && \(scripts/fetch-model.sh && \)\?meson setup')
  if [ "$n" -eq 1 ]; then echo "ok - README has its $marker"; else echo "not ok - README lacks one $marker block"; fi
done
# .ci/run times the test command part by part (split at " && "): that runs the same commands only
# when nothing else joins them.
command=$(sed -n '/<!-- test-command -->/,/<!-- \/test-command -->/p' "$root/README.md" | grep -v '^<!--' | grep -v '^```')
if echo "$command" | sed 's/ && /\n/g' | grep -qE '[;|&]|\$\(|`'; then
  echo "not ok - the test command is not a plain chain of commands joined by && (.ci/run runs its parts one by one)"
else
  echo "ok - the test command is a chain of $(echo "$command" | sed 's/ && /\n/g' | grep -c .) commands joined by && (.ci/run times each)"
fi
