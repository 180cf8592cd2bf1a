#!/usr/bin/env bash
# One script for a GPU machine (lent for minutes): builds Concord's CUDA parts, runs the planner's and
# the engine's device-path CPU tests and the GPU tests (packing kernels, the NCCL backend, the C API
# with NCCL), the conformance suite on CUDA tensors at 1 to 4 ranks (also on split communicators)
# and point to point on CUDA tensors at 2 and 3 ranks, the creation time of a CPU-only
# sub-communicator with the nccl backend on,
# the Python binding's CUDA tensors and DDP on CUDA over the torch backend "concord"
# (tests/python/test_torch_cuda.py at 1 and 2 ranks, when a torch built with CUDA is found),
# measures pack/unpack bandwidth over model workloads against cudaMemcpy device-to-device, and runs
# concord-perf --backend nccl (Concord beside raw ncclAllReduce on the same buffer) with one rank
# per GPU. With fewer GPUs than ranks, ranks share a GPU as pretend hosts
# (perf/nccl-pretend-host.sh). Everything is written to $OUT/gpu-check.txt (or
# ./gpu-check-results/gpu-check.txt). Without a usable GPU it says so and exits 0 after building and
# running the CPU tests. Any failed step is reported loudly and makes the exit status 1, but the
# steps after it still run where they can, and the results file keeps what was gathered.
#
# Usage: perf/gpu-check.sh [all | multi | rest]. A lent GPU machine runs one command for at most
# 600 s, and the whole check takes longer, so it runs in two groups, one device call each (through
# perf/gpu-bundle.sh, with timeout_s at most 600 and OUT set to a directory per call):
#   multi   the multi-rank steps on CUDA tensors, which one GPU runs as pretend hosts
#           (perf/nccl-pretend-host.sh): conformance at 2, 3 and 4 ranks and on split
#           communicators, point to point at 2 and 3 ranks, a sub-communicator's creation time
#   rest    the CPU tests, the GPU test binaries, the C API, conformance at 1 rank, the Python
#           binding with torch, concord-perf --backend nccl and the pack/unpack benchmark
#   all     (the default) multi, then rest
#   perf/gpu-bundle.sh run multi     # first device call
#   perf/gpu-bundle.sh run rest      # second device call
# Each multi-rank step runs for at most STEP_TIMEOUT_S (default 150) seconds, with
# CONCORD_TIMEOUT_S=30, so a hung step fails within its group's call.
#
# Variables: OUT (results directory), BUILD_DIR (default build-gpu), WORKLOADS (workload directory,
# default perf/workloads in the repository), BENCH_WORKLOADS (default
# "resnet50 bert_large vgg16"), BENCH_ITERS (default 50), JOBS (build parallelism, default nproc),
# SKIP_SETUP=1 (do not run scripts/setup.sh), SKIP_BUILD=1 (use the build already in BUILD_DIR,
# made on a machine that has the dependencies: perf/gpu-bundle.sh, for GPU machines that reach no
# package registry), PERF_BYTES (concord-perf sweep, default 4K:256M),
# TORCH_PYTHON (a Python whose torch has CUDA; else the python3 on PATH (the lent machines' image
# keeps its CUDA torch 2.11 there), ~/.cache/concord/torch-*/bin/python, then /usr/bin/python3 are
# tried, and the torch step is reported NOT RUN when none has CUDA).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
group="${1:-all}"
case "$group" in
  all | multi | rest) ;;
  *)
    echo "usage: perf/gpu-check.sh [all | multi | rest]" >&2
    exit 2
    ;;
esac
step_timeout="${STEP_TIMEOUT_S:-150}"
out="${OUT:-$PWD/gpu-check-results}"
build="${BUILD_DIR:-$root/build-gpu}"
jobs="${JOBS:-$(nproc)}"
mkdir -p "$out"
results="$out/gpu-check.txt"
: >"$results"
exec > >(tee -a "$results") 2>&1
tee_pid=$!

failures=()
not_run=()
step() { echo; echo "== $* =="; }
# run NAME CMD...: runs a step, records a failure by name.
run() {
  local name="$1"
  shift
  step "$name"
  echo "+ $*"
  local started=$SECONDS
  "$@"
  local rc=$?
  echo "-- $name: $((SECONDS - started)) s"
  if [ $rc -ne 0 ]; then
    echo "!! FAILED: $name (exit $rc)"
    failures+=("$name")
  fi
  return $rc
}
# bench_to LOG ARGS...: runs pack_bench with ARGS, appending its table to LOG too.
# shellcheck disable=SC2317  # called through run
bench_to() {
  local log="$1"
  shift
  timeout 300 "$build/perf/pack_bench" "$@" | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
finish() {
  step "summary"
  echo "results: $results"
  [ ${#not_run[@]} -eq 0 ] || echo "!! NOT RUN: ${not_run[*]}"
  local rc=0
  if [ ${#failures[@]} -gt 0 ]; then
    echo "!! gpu-check FAILED steps: ${failures[*]}"
    rc=1
  else
    echo "gpu-check: every step passed${1:+ ($1)}"
  fi
  exec >&- 2>&-
  wait "$tee_pid"  # the results file is complete before the script exits
  exit $rc
}

# want GROUP: whether this run includes GROUP's steps.
want() { [ "$group" = all ] || [ "$group" = "$1" ]; }

step "machine (gpu-check group: $group)"
date -u
uname -a
echo "repository: $root ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
echo "cores: $(nproc)"
if command -v nvidia-smi >/dev/null; then timeout 60 nvidia-smi; else echo "nvidia-smi: not found"; fi
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
if [ -x "$nvcc_bin" ]; then "$nvcc_bin" --version; else echo "nvcc: not found"; fi
cmake --version | head -1 || true

if [ "${SKIP_SETUP:-0}" != "1" ]; then run "setup (scripts/setup.sh)" "$root/scripts/setup.sh"; fi

if [ "${SKIP_BUILD:-0}" = "1" ]; then
  step "build: SKIP_BUILD=1, using $build as it is"
  grep -E '^(CMAKE_BUILD_TYPE|CONCORD_CUDA|CMAKE_HOME_DIRECTORY)[:=]' "$build/CMakeCache.txt" || finish
else
  run "configure (CONCORD_CUDA=ON) in $build" \
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCONCORD_CUDA=ON || finish
  run "build" cmake --build "$build" -j"$jobs" \
    --target pack_plan_test cuda_packer_test pack_bench engine_device_test nccl_backend_test \
    nccl_exchange_test c_api_test mp_conformance mp_p2p concord-perf concordrun concord || finish
fi

if want rest; then
  run "CPU tests (the pack planner, the engine's device path, the NCCL probe)" \
    ctest --test-dir "$build" -R '^(PackPlanTest|EngineDeviceTest|NcclProbeTest)\.' \
    --output-on-failure --timeout 120
fi

step "device"
"$build/perf/pack_bench" --check-device
device_rc=$?
if [ $device_rc -eq 2 ]; then
  echo "no usable GPU: GPU tests and the benchmark are skipped"
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "!! FAILED: nvidia-smi lists a GPU that CUDA cannot use (driver older than the toolkit?)"
    failures+=("GPU listed by nvidia-smi but unusable")
  fi
  finish "no GPU: CPU part only"
elif [ $device_rc -ne 0 ]; then
  echo "!! FAILED: device check (exit $device_rc)"
  failures+=("device check")
  finish
fi

# gpu_test NAME BINARY: runs a GPU test binary; a skip on a machine with a usable GPU is a failure,
# except NcclBackendTest.PeerThatNeverArrivesTimesOut, which needs two GPUs.
gpu_test() {
  local name="$1" binary="$2"
  step "GPU tests: $name"
  local log="$out/$name.txt"
  timeout 300 "$binary" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "!! FAILED: GPU tests $name (exit $rc)"
    failures+=("GPU tests $name")
  elif grep -E '^\[  SKIPPED \] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+' "$log" |
    grep -vq 'PeerThatNeverArrivesTimesOut'; then
    echo "!! FAILED: a GPU is usable but $name skipped tests"
    failures+=("GPU tests $name skipped")
  fi
}

gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
[ "${gpus:-0}" -ge 1 ] || gpus=1

# Multi-rank steps run one rank per GPU; with fewer GPUs than ranks, each rank is a pretend host of
# its own (perf/nccl-pretend-host.sh: NCCL refuses two ranks of a communicator on one GPU of one
# host), which checks results, not speed. launch NP CMD...: CMD on NP ranks, for at most
# STEP_TIMEOUT_S.
# shellcheck disable=SC2317  # called through run
launch() {
  local np="$1" share=()
  shift
  [ "$gpus" -ge "$np" ] || share=("$root/perf/nccl-pretend-host.sh")
  timeout "$step_timeout" "$build/tools/concordrun" -np "$np" --backend nccl "${share[@]}" "$@"
}

# The multi-process suites on CUDA tensors, checked as on the CPU: the conformance suite
# (tests/mp/conformance.cc: every collective x dtype x size) and point to point (tests/mp/p2p.cc).
# mp_cuda LOG NP TEST ARGS...: tests/mp/TEST --device cuda on NP ranks; passes when every rank
# prints its PASS line.
# shellcheck disable=SC2317  # called through run
mp_cuda() {
  local log="$out/$1.txt" np="$2" test="$3"
  shift 3
  CONCORD_TIMEOUT_S=30 launch "$np" "$build/tests/mp/$test" --device cuda "$@" >"$log" 2>&1
  local rc=$?
  grep -E ': rank [0-9]+ of [0-9]+:|FAIL|rror' "$log" | head -40
  [ "$rc" -eq 0 ] && [ "$(grep -cE ': rank [0-9]+ of [0-9]+: .*PASS' "$log")" -eq "$np" ]
}
if want multi; then
  run "conformance on CUDA, 2 ranks (sizes to 4099)" mp_cuda conformance_cuda_np2 2 mp_conformance \
    --max-size 4099 --steps 2
  run "conformance on CUDA, 2 ranks (1 Mi elements)" mp_cuda conformance_cuda_np2_large 2 \
    mp_conformance --min-size 1048576 --steps 1
  run "conformance on CUDA, 3 ranks (sizes to 7)" mp_cuda conformance_cuda_np3 3 mp_conformance \
    --max-size 7 --steps 1
  run "conformance on CUDA, 4 ranks (sizes to 7)" mp_cuda conformance_cuda_np4 4 mp_conformance \
    --max-size 7 --steps 1
  run "conformance on CUDA, split communicators of 4 ranks (sizes to 7)" mp_cuda \
    conformance_cuda_np4_split 4 mp_conformance --max-size 7 --steps 1 --split
  run "point to point on CUDA, 2 ranks" mp_cuda p2p_cuda_np2 2 mp_p2p
  run "point to point on CUDA, 3 ranks" mp_cuda p2p_cuda_np3 3 mp_p2p --large 65537

  # A sub-communicator that carries CPU tensors only starts no NCCL communicator (NCCL starts at a
  # communicator's first CUDA collective): with the nccl backend on, a sub-communicator of 2 in 4
  # ranks is still created in under 100 ms (issue 14).
  # shellcheck disable=SC2317  # called through run
  split_creation() {
    local log="$out/split_creation_nccl.txt" ms
    CONCORD_TIMEOUT_S=30 launch 4 "$build/perf/concord-perf" --comm group:0,1 --bytes 4K:4K \
      --iters 20 --warmup 2 --no-raw >"$log" 2>&1
    local rc=$?
    ms="$(sed -n 's/.*sub-communicators created in \([0-9.]*\) ms.*/\1/p' "$log" | head -1)"
    echo "sub-communicator of 2 in 4 ranks, nccl backend on: created in ${ms:-?} ms (bar: < 100 ms)"
    [ "$rc" -eq 0 ] && [ -n "$ms" ] && awk -v ms="$ms" 'BEGIN { exit !(ms < 100) }'
  }
  run "sub-communicator creation with the nccl backend on, 4 ranks" split_creation
fi

if ! want rest; then finish "group $group"; fi
gpu_test cuda_packer_test "$build/tests/gpu/cuda_packer_test"
gpu_test nccl_backend_test "$build/tests/gpu/nccl_backend_test"
gpu_test nccl_exchange_test "$build/tests/gpu/nccl_exchange_test"
run "C API with a GPU (CONCORD_BACKEND=nccl starts)" timeout 120 "$build/tests/c_api/c_api_test"
run "conformance on CUDA, 1 rank (every size)" mp_cuda conformance_cuda_np1 1 mp_conformance

# The Python binding on CUDA tensors and DDP on CUDA over "concord", 1 rank and 2.
step "Python: CUDA tensors through the binding, the torch backend and DDP"
torch_python=""
tried=()
# The lent GPU machines' image has its CUDA torch in the python3 first on PATH.
for py in ${TORCH_PYTHON:-} "$(command -v python3 || true)" "$HOME"/.cache/concord/torch-*/bin/python \
  /usr/bin/python3; do
  [ -x "$py" ] || continue
  tried+=("$py")
  if timeout 180 "$py" -c 'import sys, numpy, pytest, torch
sys.exit(0 if torch.cuda.is_available() else 3)' >/dev/null 2>&1; then
    torch_python="$py"
    break
  fi
done
if [ -z "$torch_python" ]; then
  echo "!! NOT RUN: no Python here has torch with usable CUDA, numpy and pytest (tried:" \
    "${tried[*]:-none}); set TORCH_PYTHON"
  not_run+=("tests/python/test_torch_cuda.py (no torch with CUDA)")
else
  "$torch_python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
  # torch_cuda_test NP: the test file on NP ranks; a skip with a usable GPU is a failure.
  # shellcheck disable=SC2317  # called through run
  torch_cuda_test() {
    local log="$out/torch_cuda_np$1.txt"
    CONCORD_LIBRARY="$build/libconcord.so" PYTHONPATH="$root/bindings/python" \
      PYTHONDONTWRITEBYTECODE=1 launch "$1" \
      "$torch_python" -m pytest -q -rs -p no:cacheprovider "$root/tests/python/test_torch_cuda.py" \
      2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ] && grep -q 'SKIPPED' "$log"; then
      echo "a GPU is usable but test_torch_cuda.py skipped"
      return 1
    fi
    return "$rc"
  }
  run "test_torch_cuda.py, 1 rank" torch_cuda_test 1
  run "test_torch_cuda.py, 2 ranks" torch_cuda_test 2
fi
perf_log="$out/concord_perf_nccl.txt"
# shellcheck disable=SC2317  # called through run
perf_nccl() {
  timeout 300 "$build/tools/concordrun" -np "$gpus" "$build/perf/concord-perf" --backend nccl \
    --bytes "${PERF_BYTES:-4K:256M}" --factor 4 --iters 20 --warmup 5 \
    --json "$out/concord_perf_nccl.json" | tee "$perf_log"
  return "${PIPESTATUS[0]}"
}
run "concord-perf --backend nccl, $gpus rank(s), one per GPU" perf_nccl
if grep -q 'skipped' "$perf_log" 2>/dev/null; then
  echo "!! FAILED: a GPU is usable but concord-perf --backend nccl skipped"
  failures+=("concord-perf nccl skipped")
fi

workload_dir="${WORKLOADS:-$root/perf/workloads}"
files=()
for name in ${BENCH_WORKLOADS:-resnet50 bert_large vgg16}; do
  if [ -f "$workload_dir/$name.txt" ]; then files+=(--workload "$workload_dir/$name.txt"); else
    echo "!! workload $name.txt not found in '$workload_dir' (set WORKLOADS)"
    failures+=("workload $name")
  fi
done
if [ ${#files[@]} -gt 0 ]; then
  bench="$out/pack_bench.md"
  : >"$bench"
  iters="${BENCH_ITERS:-50}"
  run "pack/unpack bandwidth (as listed)" bench_to "$bench" "${files[@]}" --iters "$iters"
  run "pack/unpack bandwidth (all as bfloat16)" bench_to "$bench" "${files[@]}" --iters "$iters" \
    --dtype bf16
fi
finish "group $group"
