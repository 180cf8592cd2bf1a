#!/usr/bin/env bash
# The main job: installs, builds, and trains a small model by data-parallel SGD on NP local ranks
# (default 4) through concordrun on the default backend (Gloo over TCP). Extra arguments go to
# the demo (e.g. --epochs 20).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
BUILD_DIR="$build" "$root/scripts/build.sh"
exec "$build/tools/concordrun" -np "${NP:-4}" "$build/examples/train_demo" "$@"
