#!/usr/bin/env bash
# The test command (CI runs exactly this through .ci/run): installs, builds, runs every test with
# ctest, then builds again with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-sanitize/ and runs the suite there too (without CUDA: its kernels cannot run here, and the
# first pass already compiled them). SANITIZE=0 skips the second pass.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
run_suite() {
  local build="$1"
  shift
  BUILD_DIR="$build" "$root/scripts/build.sh" "$@"
  ctest --test-dir "$build" --output-on-failure -j2 --timeout 300
}
run_suite "${BUILD_DIR:-$root/build}"
if [ "${SANITIZE:-1}" != "0" ]; then
  echo "== the same suite under AddressSanitizer and UndefinedBehaviorSanitizer =="
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_suite "$root/build-sanitize" -DCONCORD_SANITIZE=ON -DCONCORD_BUILD_PERF=OFF -DCONCORD_CUDA=OFF
fi
