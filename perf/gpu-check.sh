#!/usr/bin/env bash
# One script for a GPU machine (lent for minutes): builds Concord's CUDA parts, runs the planner's CPU
# tests and the GPU tests, and measures pack/unpack bandwidth over model workloads against
# cudaMemcpy device-to-device, writing everything to $OUT/gpu-check.txt (or
# ./gpu-check-results/gpu-check.txt). Without a usable GPU it says so and exits 0 after building and
# running the CPU tests. Any failed step is reported loudly and makes the exit status 1, but the
# steps after it still run where they can, and the results file keeps what was gathered.
#
# Variables: OUT (results directory), BUILD_DIR (default build-gpu), WORKLOADS (workload directory,
# default ../shared/workloads relative to the repository), BENCH_WORKLOADS (default
# "resnet50 bert_large vgg16"), BENCH_ITERS (default 50), JOBS (build parallelism, default nproc),
# SKIP_SETUP=1 (do not run scripts/setup.sh).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$PWD/gpu-check-results}"
build="${BUILD_DIR:-$root/build-gpu}"
jobs="${JOBS:-$(nproc)}"
mkdir -p "$out"
results="$out/gpu-check.txt"
: >"$results"
exec > >(tee -a "$results") 2>&1
tee_pid=$!

failures=()
step() { echo; echo "== $* =="; }
# run NAME CMD...: runs a step, records a failure by name.
run() {
  local name="$1"
  shift
  step "$name"
  echo "+ $*"
  "$@"
  local rc=$?
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

step "machine"
date -u
uname -a
echo "repository: $root ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
echo "cores: $(nproc)"
if command -v nvidia-smi >/dev/null; then timeout 60 nvidia-smi; else echo "nvidia-smi: not found"; fi
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
if [ -x "$nvcc_bin" ]; then "$nvcc_bin" --version; else echo "nvcc: not found"; fi
cmake --version | head -1 || true

if [ "${SKIP_SETUP:-0}" != "1" ]; then run "setup (scripts/setup.sh)" "$root/scripts/setup.sh"; fi

run "configure (CONCORD_CUDA=ON) in $build" \
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCONCORD_CUDA=ON || finish
run "build" cmake --build "$build" -j"$jobs" \
  --target pack_plan_test cuda_packer_test pack_bench || finish

run "CPU tests (the pack planner)" \
  ctest --test-dir "$build" -R '^PackPlanTest\.' --output-on-failure --timeout 120

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

step "GPU tests"
gpu_log="$out/cuda_packer_test.txt"
timeout 300 "$build/tests/gpu/cuda_packer_test" 2>&1 | tee "$gpu_log"
gpu_rc=${PIPESTATUS[0]}
if [ "$gpu_rc" -ne 0 ]; then
  echo "!! FAILED: GPU tests (exit $gpu_rc)"
  failures+=("GPU tests")
elif grep -q '^\[  SKIPPED \]' "$gpu_log"; then
  echo "!! FAILED: a GPU is usable but GPU tests were skipped"
  failures+=("GPU tests skipped")
fi

workload_dir="${WORKLOADS:-}"
if [ -z "$workload_dir" ]; then
  for candidate in "$root/../shared/workloads" "$root/shared/workloads"; do
    if [ -d "$candidate" ]; then workload_dir="$candidate"; break; fi
  done
fi
files=()
for name in ${BENCH_WORKLOADS:-resnet50 bert_large vgg16}; do
  if [ -f "$workload_dir/$name.txt" ]; then files+=(--workload "$workload_dir/$name.txt"); else
    echo "!! workload $name.txt not found in '${workload_dir:-../shared/workloads}' (set WORKLOADS)"
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
finish
