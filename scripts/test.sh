#!/usr/bin/env bash
# The test command (CI runs exactly this through .ci/run). After scripts/setup.sh, five passes:
#   format  scripts/format-check.sh: seconds, so that style errors fail before any build.
#   gcc     GCC, RelWithDebInfo, warnings as errors (CONCORD_WERROR), everything built into build/
#           (or $BUILD_DIR), every ctest test, the fault-injection suite included (label faults,
#           tests/faults/README.md; about 2 minutes of it).
#   asan    AddressSanitizer and UndefinedBehaviorSanitizer (GCC, -O1) into build-sanitize/, the
#           same suite, without CUDA (its kernels cannot run here, and the gcc pass compiled them),
#           without perf/, and without the large conformance sweeps at 1, 3 and 4 ranks, the
#           hierarchical one included (the 2-rank one takes the same large paths through the
#           engine and a backend; 1 rank takes no backend at all), MPI's at 2 ranks too, and a
#           few other repeats of what runs (test_asan says which).
#           UndefinedBehaviorSanitizer instruments the library, not the gtest binaries' own code
#           (CONCORD_UBSAN_TESTS=OFF): instrumented, they took twice as long to compile, most of
#           the pass's build (AddressSanitizer still covers them).
#   (CI's builds keep line tables only, -g1, and compile the gtest binaries' own code at -Og, to
#   compile faster.)
#   tsan    clang with its thread-safety analysis (-Wthread-safety, CONCORD_WERROR) and
#           ThreadSanitizer into build-tsan/: what runs threads against each other, i.e. the
#           unit tests marked THREADED (ctest label threaded: the engine's, its progress driver's,
#           the tensor queue's; the Gloo, shared-memory and hierarchical backends', the stores',
#           the control plane's and the C++ API's, whose ranks are threads), the C API test and
#           the multi-process tests
#           (mp_*, on Gloo and on MPI). Only their targets are built. Any ThreadSanitizer report,
#           from any process, fails the pass (scripts/tsan-suppressions.txt says what is not
#           Concord's). Under TSan's 5-15x the sweeps that only repeat the same threading over
#           more data are cut: the engine's every-op-and-size sweep runs float32 only (every rank
#           count and inline mode), the 1 Mi-element conformance runs on Gloo at 2 ranks only,
#           and gloo_backend_test leaves out its 1 Mi-element allreduces and multi-MB blocks.
#   fuzz    clang with -DCONCORD_FUZZ=ON (libFuzzer, AddressSanitizer, UndefinedBehaviorSanitizer)
#           into build-fuzz/, only the fuzz targets (tests/fuzz/README.md): the negotiation
#           messages, the TCP store's wire format, compressed-tensor decoding (top-k) and the C
#           API's argument checks. Each runs FUZZ_SECONDS (default 60) from a scratch copy of its
#           committed corpus (tests/fuzz/corpus/<target>), all four at once; any crash, hang
#           (-timeout) or leak fails the pass, and the input that did it is left in
#           build-fuzz/fuzz-run/ (add it to the corpus with the fix).
# SANITIZE=0 skips asan, tsan and fuzz. Arguments choose passes instead: scripts/test.sh tsan.
# Builds: the first pass that builds does so in the foreground; the later passes' builds then run
# one after another in the background, at idle scheduling priority (SCHED_IDLE: they get only the
# CPU time that the tests leave, which is much of it while multi-process tests wait on each other,
# on timeouts and on launchers), so they never slow a test down. Each pass waits for its own build,
# prints its output, and prints the build's wall time and its own, with how busy the machine was.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# Each pass's build directory, written by its build_<pass> and read by its test_<pass>.
gcc_dir="${BUILD_DIR:-$root/build}"
asan_dir="$root/build-sanitize"
tsan_dir="$root/build-tsan"
fuzz_dir="$root/build-fuzz"

# CI's builds keep line tables only (-g1: a sanitizer's or a debugger's stack still has files and
# lines), which cuts their compile time; $1 is the optimisation level. The gtest binaries' own
# code is compiled at -Og (CONCORD_TEST_CODE_FLAGS): about half of -O2's compile time, and most of
# a build is test code; the library they test keeps $1. Sets ci_cmake_flags.
ci_flags() {
  ci_cmake_flags=("-DCMAKE_C_FLAGS_RELWITHDEBINFO=$1 -g1 -DNDEBUG"
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$1 -g1 -DNDEBUG" "-DCONCORD_TEST_CODE_FLAGS=-Og")
}

# Runs the ctest suite in $1, but for the tests that match $CTEST_EXCLUDE (a regular expression),
# if set.
run_ctest() {
  ctest --test-dir "$1" --output-on-failure -j2 --timeout 300 ${CTEST_EXCLUDE:+-E "$CTEST_EXCLUDE"}
}

# Each pass with a build has build_<pass> and test_<pass>; format has only test_format.
test_format() {
  "$root/scripts/format-check.sh"
}

build_gcc() {
  # CUDA code is compiled and linked here, never run (no GPU): one real architecture (sm_90,
  # through ptxas) checks it as well as the default three, in a third of nvcc's time (~60 s).
  ci_flags -O2
  BUILD_DIR="$gcc_dir" "$root/scripts/build.sh" -DCONCORD_WERROR=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90-real "${ci_cmake_flags[@]}"
}

test_gcc() {
  run_ctest "$gcc_dir"
}

# The sanitizers' settings, for the asan pass's build (gtest_discover_tests runs each test binary
# to list its cases) and its tests.
asan_env() {
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    LSAN_OPTIONS="suppressions=$root/scripts/lsan-suppressions.txt" "$@"
}

build_asan() {
  # -O1, as AddressSanitizer advises: quicker to compile than -O2, and fast enough to run.
  ci_flags -O1
  BUILD_DIR="$asan_dir" asan_env "$root/scripts/build.sh" \
    -DCONCORD_SANITIZE=address,undefined -DCONCORD_BUILD_PERF=OFF -DCONCORD_CUDA=OFF \
    -DCONCORD_UBSAN_TESTS=OFF "${ci_cmake_flags[@]}"
}

test_asan() {
  # The large conformance sweeps at 3 and 4 ranks only repeat the 2-rank one over more data (the
  # hierarchical one at 4 ranks too: mp_conformance_hier_np4 and mp_hier_conformance_np6 take its
  # two levels at small sizes), and at 1 rank it takes no backend (as Gloo's every-dtype-and-op
  # allreduce of 1 Mi elements repeats its 4099-element one: it runs here at 4 ranks, on two
  # dtypes), and the fault scenarios under mpirun (and the stall
  # shutdown under mpirun) mostly wait out mpirun's grace periods over the same Concord code as
  # the Gloo ones (the gcc pass runs them all). The Gloo runs go through shared memory; of their
  # repeats on Gloo's TCP pairs (CONCORD_SHM=off) the 2-rank conformance and the kill run here.
  # Also left to the gcc pass, as repeats of code the pass runs at the same sizes (about 115
  # CPU-s): the engine's every-op-and-size sweep in uint8, int32 and int64 (the same element sizes
  # as int8, float32 and float64, which run, float16 and bfloat16 too), Gloo's reduce-scatter of
  # multi-MB blocks in halves (ReduceScatterUnevenBlocks cuts blocks in halves too), the
  # compressors' convergence runs (arithmetic over many steps of the same calls as the
  # compression tests) and MPI's 1 Mi-element conformance at 2 ranks (the engine's large paths run
  # on Gloo's; Open MPI's own code is not instrumented).
  CTEST_EXCLUDE='^mp_conformance_large_np[134]$|^mp_mpi_conformance_large_np[1234]$|LargeCount/([12]ranks_auto|3ranks)|^faults_.*_mpi$|^mp_mpi_stall_|^mp_conformance_(large_|split_)?noshm_np[34]$|^mp_hier_conformance_large_np4$|EveryOpAndSize/.*_(uint8|int32|int64)_|^GlooBackendTest\.ReduceScatterLargeBlocksInHalves$|^ConvergenceTest\.' \
    asan_env run_ctest "$asan_dir"
}

build_tsan() {
  ci_flags -O2
  TARGETS="threaded_tests c_api_test concordrun mp_conformance mp_failure_modes
           mp_launcher_lifecycle mp_lifecycle_faults mp_cache_eviction mp_comm_split mp_join
           mp_p2p mp_determinism mp_straggler mp_random_mix" \
    BUILD_DIR="$tsan_dir" "$root/scripts/build.sh" -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DCONCORD_SANITIZE=thread -DCONCORD_THREAD_SAFETY_ANALYSIS=ON \
    -DCONCORD_WERROR=ON -DCONCORD_BUILD_PERF=OFF -DCONCORD_CUDA=OFF "${ci_cmake_flags[@]}"
}

test_tsan() {
  local build="$tsan_dir"
  local reports="$build/tsan-reports"
  rm -rf "$reports"
  mkdir -p "$reports"
  # Reports go to files (one per process), so that none is lost in a test whose output is only
  # matched (the multi-process tests) or whose exit status is the victim's (the killed-rank tests).
  export TSAN_OPTIONS="log_path=$reports/tsan second_deadlock_stack=1 \
suppressions=$root/scripts/tsan-suppressions.txt"
  local failed=0
  # Cut as repeats of the same threading over more data: the engine's every-op-and-size sweep
  # beyond float32, and gloo_backend_test's 1 Mi-element allreduces and multi-MB reduce-scatter
  # blocks (about 85 of its 120 s under TSan; ReduceScatterUnevenBlocks still cuts blocks into
  # the ring's halves, and gloo_span_allreduce_test and mp_conformance_large_np2 keep large sizes).
  ctest --test-dir "$build" --output-on-failure -j2 --timeout 300 -L '^threaded$' \
    -E 'EveryOpAndSize/.*_(float16|bfloat16|float64|int8|uint8|int32|int64)_|GlooAllreduceTest\.LargeCount/|^GlooBackendTest\.ReduceScatterLargeBlocksInHalves$' \
    || failed=1
  # The 1 Mi-element shared-memory and hierarchical conformance runs (140 s of the pass) repeat
  # mp_conformance_large_np2's threading over more data; the gcc and asan passes run them.
  ctest --test-dir "$build" --output-on-failure -j2 --timeout 300 -R '^(c_api_test|mp_)' \
    -E '^mp_conformance_large_np[134]$|^mp_mpi_conformance_large_|^mp_conformance_(large_|split_)?noshm_np[34]$|^mp_hier_conformance_large_np4$|^mp_shm_conformance_chunked_large_np3$' \
    || failed=1
  if compgen -G "$reports/tsan.*" >/dev/null; then
    echo "== ThreadSanitizer reports =="
    cat "$reports"/tsan.*
    failed=1
  fi
  return "$failed"
}

fuzz_targets=(messages tcp_store compressed c_api tcp_p2p_wire)

build_fuzz() {
  ci_flags -O2
  TARGETS="fuzz_targets" BUILD_DIR="$fuzz_dir" "$root/scripts/build.sh" \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCONCORD_FUZZ=ON -DCONCORD_WERROR=ON \
    -DCONCORD_BUILD_PERF=OFF -DCONCORD_CUDA=OFF -DCONCORD_MPI=OFF "${ci_cmake_flags[@]}"
}

test_fuzz() {
  local build="$fuzz_dir"
  local run="$build/fuzz-run"
  rm -rf "$run"
  mkdir -p "$run"
  local pids=()
  for t in "${fuzz_targets[@]}"; do
    # The fuzzer adds what it finds to its first directory: a copy, so the committed corpus stays.
    cp -r "$root/tests/fuzz/corpus/$t" "$run/$t"
    "$build/tests/fuzz/fuzz_$t" "$run/$t" -max_total_time="${FUZZ_SECONDS:-60}" -timeout=20 \
      -rss_limit_mb=2048 -artifact_prefix="$run/$t-" >"$run/$t.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for i in "${!fuzz_targets[@]}"; do
    local t="${fuzz_targets[$i]}"
    if wait "${pids[$i]}"; then
      echo "fuzz_$t: $(grep -h '^Done ' "$run/$t.log")"
    else
      failed=1
      echo "== fuzz_$t failed (log: $run/$t.log; the input: $run/$t-*) =="
      grep -v '^\[concord rank' "$run/$t.log" | tail -n 80
    fi
  done
  return "$failed"
}

# The background builds: build_<pass> for each pass named, one after another, in a process group
# of their own at idle priority. Each writes $builds/<pass>.log, then <pass>.done ("status
# seconds"); the first that fails ends the chain.
start_background_builds() {
  set -m
  (
    chrt --idle -p 0 "$BASHPID" >/dev/null ||
      echo "test.sh: chrt --idle failed: the background builds compete with the tests" >&2
    for pass in "$@"; do
      start=$SECONDS
      status=0
      "build_$pass" >"$builds/$pass.log" 2>&1 || status=$?
      echo "$status $((SECONDS - start))" >"$builds/$pass.done.tmp"
      mv "$builds/$pass.done.tmp" "$builds/$pass.done"
      [ "$status" -eq 0 ] || exit "$status"
    done
  ) &
  background_pid=$!
  set +m
}

# Waits for pass $1's background build, prints its output and time; fails as the build did.
wait_for_build() {
  local done="$builds/$1.done"
  until [ -e "$done" ]; do
    if ! kill -0 "$background_pid" 2>/dev/null && [ ! -e "$done" ]; then
      echo "test.sh: the background builds ended before $1's was done" >&2
      return 1
    fi
    sleep 1
  done
  cat "$builds/$1.log"
  local status seconds
  read -r status seconds <"$done"
  echo "== pass $1: build $seconds s, in the background at idle priority =="
  return "$status"
}

# The machine's busy CPU time in clock ticks (every process's, the background builds' included),
# for each pass's last line. (A pass's own processes are not counted apart: bash reaps the
# background builds' chain, and adds its CPU time to its children's, whenever it notices its end.)
busy_ticks() {
  local cpu user nice system idle iowait irq softirq steal rest
  read -r cpu user nice system idle iowait irq softirq steal rest </proc/stat
  echo $((user + nice + system + irq + softirq + steal))
}

# "the machine N% busy on C CPUs" since busy_ticks printed $1, $2 seconds ago.
busy_since() {
  local busy0=$1 seconds=$2 hz cpus
  hz=$(getconf CLK_TCK)
  cpus=$(nproc)
  [ "$seconds" -gt 0 ] || seconds=1
  echo "the machine $((($(busy_ticks) - busy0) * 100 / (hz * seconds * cpus)))% busy on $cpus CPUs"
}

if [ $# -gt 0 ]; then
  passes=("$@")
elif [ "${SANITIZE:-1}" = "0" ]; then
  passes=(format gcc)
else
  passes=(format gcc asan tsan fuzz)
fi
named=" "
for pass in "${passes[@]}"; do
  case "$pass" in
    format | gcc | asan | tsan | fuzz) ;;
    *) echo "test.sh: unknown pass '$pass' (format, gcc, asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
  case "$named" in
    *" $pass "*) echo "test.sh: pass '$pass' named twice" >&2; exit 2 ;;
  esac
  named+="$pass "
done
"$root/scripts/setup.sh"
# setup.sh has installed every dependency the tests take: a test that would skip for want of one
# (numpy, pytest, torch for the Python tests) fails instead, so a broken set-up shows.
export CONCORD_CI=1
builds="$(mktemp -d)"
background_pid=""
# Only what this script started: the background builds' process group.
trap '[ -z "$background_pid" ] || kill -- "-$background_pid" 2>/dev/null; rm -rf "$builds"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for pass in "${passes[@]}"; do
  echo "== pass $pass =="
  start=$SECONDS
  pass_busy=$(busy_ticks)
  if [ "$pass" != format ]; then
    if [ -z "$background_pid" ]; then
      build_start=$SECONDS
      "build_$pass"
      echo "== pass $pass: build $((SECONDS - build_start)) s =="
      later=()
      for p in "${passes[@]}"; do
        case "$p" in format | "$pass") ;; *) later+=("$p") ;; esac
      done
      [ ${#later[@]} -eq 0 ] || start_background_builds "${later[@]}"
    else
      wait_for_build "$pass"
    fi
  fi
  "test_$pass"
  echo "== pass $pass: $((SECONDS - start)) s; $(busy_since "$pass_busy" $((SECONDS - start))) =="
done
# Every build was waited for: the chain has ended, or ends now.
[ -z "$background_pid" ] || wait "$background_pid"
background_pid=""
