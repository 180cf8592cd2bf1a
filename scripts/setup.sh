#!/usr/bin/env bash
# Installs everything Concord needs to build, test and benchmark, from Debian's packages.
# Idempotent: packages already present are not touched, and apt-get runs only when one is missing.
set -euo pipefail
# clang, clang-format and clang-tidy are Debian 12's version 14: scripts/test.sh's thread-safety
# and ThreadSanitizer pass, scripts/format-check.sh and scripts/tidy.sh. libclang-rt-14-dev holds
# clang's sanitizer runtimes (ThreadSanitizer's too): clang only recommends it (through
# libclang-common-14-dev), and recommends are not installed. valgrind: scripts/valgrind.sh and the
# ctest test valgrind_wire_np2. python3-torchvision: perf/torch_ddp_bench.py's resnet18. locales:
# de_DE's sources, from which tests/common/comma_locale.h makes a decimal-comma locale (localedef).
packages=(build-essential cmake pkg-config libgloo-dev libgtest-dev libbenchmark-dev libopenmpi-dev
  openmpi-bin python3 iproute2 gnuplot-nox python3-numpy python3-pytest python3-torch
  python3-torchvision python3-pip python3-venv clang clang-format clang-tidy libclang-rt-14-dev valgrind
  locales)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
