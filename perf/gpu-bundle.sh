#!/usr/bin/env bash
# The GPU check on a machine that has a GPU but no package registry (the lent GPU machines: CUDA,
# NCCL in torch's pip package and a CUDA torch, but no Gloo, gtest or compiler toolchain to
# install them with). Two steps:
#
#   perf/gpu-bundle.sh prepare   # here: builds build-gpu (CONCORD_CUDA=ON; the MPI backend off,
#                                # the GPU machine has no Open MPI) and copies into .gpu-libs/ the
#                                # shared libraries it needs beyond glibc, CUDA and NCCL (Gloo and
#                                # its dependencies)
#   perf/gpu-bundle.sh run [GROUP]
#                                # there, in a copy of the repository with build-gpu and
#                                # .gpu-libs: perf/gpu-check.sh GROUP on that build (results in
#                                # $OUT or ./gpu-check-results). The whole check takes longer than
#                                # one device call may (600 s): run it as two calls, `run multi`
#                                # then `run rest`, each with its own OUT (perf/gpu-check.sh)
#   perf/gpu-bundle.sh exec CMD  # there: CMD with the same libraries and BUILD pointing at the
#                                # build and SOURCE at the repository (one step of the check, or
#                                # an experiment)
#
# The build's absolute path is in its CMake and CTest files: `run` links that path to the copy
# when the copy lives elsewhere and the path is free. Libraries the GPU machine has already are
# not overridden; NCCL comes from the machine (torch's nvidia-nccl package, else the first
# libnccl.so.2 under Python's site-packages or /usr, looked for once per machine and kept in
# .gpu-libs/.nccl-dir). Variables: BUILD_DIR (default build-gpu), and those of gpu-check.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build-gpu}"
libs="$root/.gpu-libs"
targets=(pack_plan_test cuda_packer_test pack_bench engine_device_test nccl_backend_test
  nccl_exchange_test c_api_test mp_conformance mp_p2p concord-perf concordrun concord)

prepare() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCONCORD_CUDA=ON \
    -DCONCORD_MPI=OFF
  cmake --build "$build" --target "${targets[@]}"
  rm -rf "$libs"
  mkdir -p "$libs"
  # Every library the binaries load, except the C runtime, CUDA's and NCCL's own.
  find "$build" -maxdepth 3 -type f -perm -u+x \( -name 'lib*.so*' -o -path '*/tests/*' -o \
    -path '*/perf/*' -o -path '*/tools/*' \) -exec ldd {} + 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -Ev "/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|libnccl|$build" |
    while read -r lib; do cp -L "$lib" "$libs/"; done
  echo "gpu-bundle: $build and $libs ($(cd "$libs" && echo *)) are ready to carry"
}

# environment: checks the carried build, links its path, puts the libraries on LD_LIBRARY_PATH
# and sets BUILD and SOURCE to the build's and the repository's paths as the build knows them.
environment() {
  if [ ! -d "$build" ] || [ ! -d "$libs" ]; then
    echo "gpu-bundle: $build or $libs is missing: run 'perf/gpu-bundle.sh prepare' first" >&2
    exit 2
  fi
  local rel="${build#"$root"/}" built_at
  if [ "$rel" = "$build" ]; then
    echo "gpu-bundle: BUILD_DIR must be inside the repository ($root)" >&2
    exit 2
  fi
  built_at="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")"
  if [ "$built_at" != "$root" ]; then
    if [ -e "$built_at" ]; then
      echo "gpu-bundle: the build was made in $built_at, which exists here and is not this copy" >&2
      exit 2
    fi
    mkdir -p "$(dirname "$built_at")"
    ln -s "$root" "$built_at"
  fi
  local extra
  extra="$(mktemp -d)"
  for f in "$libs"/*; do
    ldconfig -p | grep -q "^[[:space:]]*$(basename "$f") " || cp -L "$f" "$extra/"
  done
  local nccl cache="$libs/.nccl-dir"
  nccl="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
  [ -f "$nccl/libnccl.so.2" ] || nccl="$(cat "$cache" 2>/dev/null || true)"
  if [ ! -f "$nccl/libnccl.so.2" ]; then
    # Not the whole file system: Python's package directories and /usr, each on its own device.
    local places
    places="$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)"
    # shellcheck disable=SC2086  # the directories, split
    nccl="$(dirname "$(find $places /usr -xdev -name libnccl.so.2 -print 2>/dev/null | head -1 || true)")"
    if [ -f "$nccl/libnccl.so.2" ]; then echo "$nccl" >"$cache"; fi
  fi
  export LD_LIBRARY_PATH="$extra:$nccl:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  echo "gpu-bundle: libraries carried in: $(cd "$extra" && echo *); NCCL from $nccl"
  export BUILD="$built_at/$rel" SOURCE="$built_at"
}

case "${1:-}" in
  prepare) prepare ;;
  run)
    environment
    SKIP_SETUP=1 SKIP_BUILD=1 BUILD_DIR="$BUILD" "$SOURCE/perf/gpu-check.sh" "${2:-all}"
    ;;
  exec)
    shift
    environment
    "$@"
    ;;
  *)
    echo "usage: perf/gpu-bundle.sh prepare | run [all | multi | rest] | exec CMD..." >&2
    exit 2
    ;;
esac
