#!/bin/sh
# TAP test: every command README.md lists works as a newcomer types it, from a fresh build.
# The source tree is copied to a scratch directory (no build directories, no .git) and, there:
#   1. the main command (between the main-command markers) runs as written, but for the demo's
#      sentence count (below): install-deps, a fresh `meson setup build-main`, the build, and
#      `kvq demo` (its table, down to the last default row);
#   2. each command of "Other useful commands" runs as written against that fresh build-main
#      (stand-in K.npy, V.npy and Q.npy are written first; `meson install` gets DESTDIR so that the
#      test never writes outside its scratch directory);
#   3. the README's pkg-config line compiles the example against the installed (staged) kvq, and the
#      result runs; the installed kvq tool looks for the installed golden files, not the source's.
# The test command itself is what runs this test, so it is not repeated here.
# usage: readme_commands.sh SOURCE_ROOT
root="$1"
n=0
pass() { n=$((n + 1)); echo "ok $n - $1"; }
fail() {
  n=$((n + 1))
  echo "not ok $n - $1"
  [ -f "$2" ] && tail -n 40 "$2" | sed 's/^/# /'
}
skip() { n=$((n + 1)); echo "ok $n - # SKIP $1"; }

scratch=$(mktemp -d /tmp/kvq-readme-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
work="$scratch/kvq"
mkdir -p "$work"
unset LD_PRELOAD # the test setup pins lavapipe for sanitized processes; the fresh build is not one
(cd "$root" && tar --exclude=./.git --exclude='./build*' -cf - .) | (cd "$work" && tar -xf -)
log="$scratch/log"

block() { sed -n "/<!-- $1 -->/,/<!-- \/$1 -->/p" "$work/README.md" | grep -v '^<!--' | grep -v '^```'; }

# 1. The main command. Its kvq demo embeds 400 sentences here instead of its default (2000, about
# 7.5 minutes on 2 idle cores: docs/EVAL.md), to keep CI's time; the sentence count is the only change,
# the command is otherwise run as written and its table checked down to the last default row.
main=$(block main-command)
run_main=$(printf '%s' "$main" | sed 's|tools/kvq demo$|tools/kvq demo --sentences 400|')
start=$(date +%s)
if [ -n "$main" ] && (cd "$work" && sh -c "$run_main") > "$log" 2>&1 && grep -q "cos-mean" "$log" &&
   grep -q "^uniform-b4@qhitter" "$log"; then
  pass "main command, as written but for --sentences 400, from a fresh build ($(($(date +%s) - start)) s): $run_main"
else
  fail "main command failed: $main" "$log"
  echo "Bail out! no build-main to run the other commands with"
  exit 0
fi

# 2. The other commands.
vulkan_line=$("$work/build-main/tools/kvq" info 2>&1 | grep '^ *vulkan ')
commands=$(sed -n '/^Other useful commands:/,/^## /p' "$work/README.md" | grep '^    ' | sed 's/^ *//; s/  *#.*$//')
if [ -z "$commands" ]; then fail "README.md has no \"Other useful commands\" block" /dev/null; fi
# Stand-in keys, values and queries for the .npy command: fp32 [tokens, heads, head_dim] arrays
# in numpy's format, version 1.0 (perl is part of every Debian system).
(cd "$work" && perl -e '
  sub npy {
    my ($name, $t, $h, $d, $seed) = @_;
    open(my $f, ">", $name) or die "$name: $!";
    binmode $f;
    my $header = "{\x27descr\x27: \x27<f4\x27, \x27fortran_order\x27: False, \x27shape\x27: ($t, $h, $d), }";
    $header .= " " x ((64 - (10 + length($header) + 1) % 64) % 64) . "\n";
    print $f "\x93NUMPY\x01\x00" . pack("v", length($header)) . $header;
    srand($seed);
    print $f pack("f<*", map { rand() * 2 - 1 } 1 .. $t * $h * $d);
    close $f;
  }
  npy("K.npy", 320, 2, 64, 1); npy("V.npy", 320, 2, 64, 2); npy("Q.npy", 320, 4, 64, 3);')
stage="$scratch/stage"
while IFS= read -r command; do
  [ -z "$command" ] && continue
  case "$command" in
    *"--backend vulkan"*)
      case "$vulkan_line" in
        *" available"*) ;;
        *) skip "$command: the Vulkan backend is not available here (kvq info: $vulkan_line)"; continue ;;
      esac ;;
  esac
  start=$(date +%s)
  case "$command" in
    "meson install"*) (cd "$work" && DESTDIR="$stage" sh -c "$command") > "$log" 2>&1 ;;
    *) (cd "$work" && sh -c "$command") > "$log" 2>&1 ;;
  esac
  status=$?
  if [ "$status" -eq 0 ]; then
    pass "$command (exit 0, $(($(date +%s) - start)) s)"
  else
    fail "$command exited with status $status" "$log"
  fi
done <<EOF
$commands
EOF

# 3. The staged install: what the README says it installs, the pkg-config line, the installed tool.
header=$(find "$stage" -path '*/include/kvq/kvq.h' | head -n 1)
prefix=${header%/include/kvq/kvq.h}
prefix=${prefix#"$stage"}
installed="$stage$prefix"
missing=""
for want in include/kvq/kvq.h bin/kvq share/kvq/golden/cache-v1.kvq; do
  [ -e "$installed/$want" ] || missing="$missing $want"
done
for want in libkvq.so libkvq.a kvq.pc; do
  [ -n "$(find "$installed" -name "$want" 2>/dev/null)" ] || missing="$missing $want"
done
if [ -z "$missing" ]; then
  pass "meson install staged the header, libkvq (shared and static), kvq, kvq.pc and the golden files under $prefix"
else
  fail "meson install did not stage:$missing" /dev/null
fi
compile=$(grep -o 'Compile against an installed kvq with `[^`]*`' "$work/README.md" | sed 's/.*`\([^`]*\)`/\1/')
pcdir=$(dirname "$(find "$installed" -name kvq.pc | head -n 1)")
libdir=$(dirname "$(find "$installed" -name 'libkvq.so' | head -n 1)")
mkdir -p "$scratch/example" && cp "$work/examples/quickstart.c" "$scratch/example/"
if [ -n "$compile" ] &&
   (cd "$scratch/example" && PKG_CONFIG_PATH="$pcdir" PKG_CONFIG_SYSROOT_DIR="$stage" sh -c "$compile") > "$log" 2>&1 &&
   (cd "$scratch/example" && LD_LIBRARY_PATH="$libdir" ./a.out) > "$log" 2>&1 && grep -q "bits per number" "$log"; then
  pass "the README's pkg-config line builds the example against the installed kvq, and it runs: $compile"
else
  fail "the README's pkg-config line (${compile:-missing}) did not build a working example" "$log"
fi
if "$installed/bin/kvq" golden --help 2>&1 | grep -q "default: $prefix/share/kvq/golden"; then
  pass "the installed kvq checks the installed golden files by default ($prefix/share/kvq/golden)"
else
  fail "the installed kvq does not default to $prefix/share/kvq/golden" /dev/null
  "$installed/bin/kvq" golden --help 2>&1 | sed 's/^/# /'
fi
if "$work/build-main/tools/kvq" golden --help 2>&1 | grep -q "default: $work/tests/golden"; then
  pass "the build tree's kvq checks its own source tree's golden files by default"
else
  fail "the build tree's kvq does not default to $work/tests/golden" /dev/null
fi
echo "1..$n"
