#!/usr/bin/env bash
# Configures and builds Concord into build/ (or $BUILD_DIR), after installing what it needs.
# Extra arguments go to cmake's configure step (e.g. -DCONCORD_SANITIZE=address,undefined);
# TARGETS="a b" builds only those targets.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j"$(nproc)" ${TARGETS:+--target $TARGETS}
