#!/bin/sh
# Installs what building and testing kvq needs on Debian 12, from Debian's own packages.
# Runs apt-get as root, or through sudo when run as another user. Safe to run again.
set -eu
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
packages="meson ninja-build gcc g++ pkg-config libcriterion-dev glslang-tools libvulkan-dev libvulkan-volk-dev mesa-vulkan-drivers vulkan-validationlayers npm libcjson-dev bible-kjv bible-kjv-text gnuplot-nox"
missing=""
for p in $packages; do
  # npm (scripts/fetch-model.sh) also comes with other Node.js builds (NodeSource's nodejs bundles
  # it and conflicts with Debian's npm): any npm on the PATH will do.
  if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "kvq: installing$missing" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
