#!/bin/sh
# Installs what building and testing kvq needs on Debian 12, from Debian's own packages.
# Runs apt-get as root, or through sudo when run as another user. Safe to run again.
set -eu
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
packages="meson ninja-build gcc g++ pkg-config libcriterion-dev glslang-tools libvulkan-dev libvulkan-volk-dev mesa-vulkan-drivers vulkan-validationlayers npm libcjson-dev"
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "kvq: installing$missing" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
