#!/bin/sh
# Packs what scripts/gpu-check.sh needs on a GPU machine that cannot reach a package registry: the
# Debian 12 packages kvq builds and tests with that a CUDA image usually lacks (the Vulkan loader and
# headers, volk, glslang, the validation layer, Criterion and the libraries it loads, cJSON, pkgconf; and
# meson and ninja, which gpu-check.sh uses where the machine has none or its own meson fails; and
# libglvnd with its GL/EGL front ends, which the NVIDIA Vulkan driver (libGLX_nvidia) loads). Run it
# on a Debian 12 machine that reaches Debian's mirror (a kvq development machine); it writes the .deb
# files into .gpu-check/debs (ignored by git). Carry .gpu-check to the GPU machine with the tree, and
# gpu-check.sh unpacks them into a private prefix there (never into /).
set -eu
cd "$(dirname "$0")/.."
dir=.gpu-check/debs
# amd64: the GPU machines are x86-64 whatever this machine is.
arch="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64"
packages="libvulkan1 libvulkan-dev libvulkan-volk-dev vulkan-validationlayers glslang-tools spirv-tools
  libcriterion3 libcriterion-dev libnanomsg5 libgit2-1.5 libmbedtls14 libmbedx509-1 libmbedcrypto7
  libhttp-parser2.9 libssh2-1 pkgconf pkgconf-bin libpkgconf3 libcjson1 libcjson-dev meson ninja-build
  libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2"
mkdir -p "$dir"
if [ "$(id -u)" -eq 0 ]; then apt-get $arch update -qq; fi
# shellcheck disable=SC2086
(cd "$dir" && apt-get $arch download $packages)
echo "gpu-check-pack: $(ls "$dir" | wc -l) packages in $dir ($(du -sh "$dir" | cut -f1)); carry .gpu-check with the tree"
