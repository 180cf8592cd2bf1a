#!/usr/bin/env bash
# Runs clang-tidy (Debian 12's clang-tidy 14, installed by scripts/setup.sh) with the repository's
# .clang-tidy over C++ files: the arguments, else core/*.cc. Compile flags come from
# compile_commands.json in build/ (or $BUILD_DIR), which CMake writes at configure time, so the
# tree must be configured first (cmake -S . -B build). CUDA files are skipped (clang-tidy cannot
# take nvcc's flags), and base/dtype.cc needs a clang build's flags (GCC's -fvect-cost-model is
# not clang's): BUILD_DIR=build-tsan, or any build configured with clang. Files run in parallel
# ($JOBS, default nproc). Exits 1 when clang-tidy reports anything.
# Usage: scripts/tidy.sh [FILE...]     e.g. scripts/tidy.sh core/coordinator.cc core/message.cc
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
tidy="${CLANG_TIDY:-clang-tidy}"
cd "$root"
if [ ! -f "$build/compile_commands.json" ]; then
  echo "tidy.sh: no $build/compile_commands.json; configure first: cmake -S . -B $build" >&2
  exit 2
fi
[ $# -gt 0 ] || set -- core/*.cc
files=()
for f in "$@"; do
  case "$f" in
    *.cu | *.cuh) echo "tidy.sh: skipping CUDA file $f" ;;
    *) files+=("$f") ;;
  esac
done
[ ${#files[@]} -gt 0 ] || exit 0
# --warnings-as-errors: any finding makes that file's clang-tidy fail. The count of warnings
# clang-tidy generated and then filtered out (system headers, checks that are off) is dropped.
set +e
printf '%s\0' "${files[@]}" |
  xargs -0 -n 1 -P "${JOBS:-$(nproc)}" "$tidy" -p "$build" --quiet --warnings-as-errors='*' 2>&1 |
  grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$'
status=${PIPESTATUS[1]}
set -e
if [ "$status" -ne 0 ]; then
  echo "tidy.sh: clang-tidy reported findings (above)" >&2
  exit 1
fi
echo "tidy.sh: ${#files[@]} files clean"
