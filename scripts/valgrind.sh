#!/usr/bin/env bash
# valgrind's memcheck over a 2-rank Concord job on Gloo (tests/valgrind/wire_job.cc: allreduce of
# every dtype inline, fused and direct, a group, allgather, broadcast, barrier, fp16/bf16/top-k
# compression): fails on any memcheck error (an uninitialised byte sent, an invalid access) or a
# definite or indirect leak, on either rank. tests/valgrind/suppressions.txt lists, with reasons,
# the reports that are Gloo's own rendezvous.
#   scripts/valgrind.sh [--build DIR] [--algorithms "auto ring ..."]
# --build: the build tree holding tools/concordrun and tests/valgrind/valgrind_wire_job (default
# $BUILD_DIR, else build/; build them with TARGETS="concordrun valgrind_wire_job"
# scripts/build.sh). --algorithms: the CONCORD_GLOO_ALGORITHM values to run the job with, one run
# each (default: auto and every forced algorithm; the ctest test valgrind_wire_np2 runs auto).
# About 10-15 s a run on 2 cores. Never hangs: each run is under `timeout`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
algorithms="auto ring ring_chunked halving_doubling allreduce"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --algorithms) algorithms="$2"; shift 2 ;;
    *) echo "valgrind.sh: unknown argument $1 (see the comment at its top)" >&2; exit 2 ;;
  esac
done

if ! command -v valgrind >/dev/null; then
  echo "valgrind.sh: valgrind is not installed (apt-get install valgrind; scripts/setup.sh" \
       "installs it)" >&2
  exit 2
fi
launcher="$build/tools/concordrun"
job="$build/tests/valgrind/valgrind_wire_job"
for f in "$launcher" "$job"; do
  if [ ! -x "$f" ]; then
    echo "valgrind.sh: $f is missing; build it: BUILD_DIR=$build" \
         "TARGETS=\"concordrun valgrind_wire_job\" scripts/build.sh" >&2
    exit 2
  fi
done

logs="$(mktemp -d "${TMPDIR:-/tmp}/concord-valgrind.XXXXXX")"
trap 'rm -rf "$logs"' EXIT
failed=0
for algorithm in $algorithms; do
  mkdir -p "$logs/$algorithm"
  start=$(date +%s.%N)
  set +e
  CONCORD_GLOO_ALGORITHM="$algorithm" timeout --kill-after=5 150 \
    "$launcher" -np 2 --timeout 60 \
    valgrind --error-exitcode=97 --leak-check=full --errors-for-leak-kinds=definite,indirect \
    --show-leak-kinds=definite,indirect --track-origins=yes --num-callers=30 \
    --suppressions="$root/tests/valgrind/suppressions.txt" \
    --log-file="$logs/$algorithm/rank%q{CONCORD_RANK}.log" "$job" >"$logs/$algorithm/out" 2>&1
  rc=$?
  set -e
  elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  passes=$(grep -c "valgrind_wire_job: rank [0-9] PASS" "$logs/$algorithm/out" || true)
  clean=0
  for log in "$logs/$algorithm"/rank*.log; do
    if grep -q "ERROR SUMMARY: 0 errors" "$log" 2>/dev/null; then clean=$((clean + 1)); fi
  done
  if [ "$rc" -eq 0 ] && [ "$passes" -eq 2 ] && [ "$clean" -eq 2 ]; then
    echo "valgrind.sh: CONCORD_GLOO_ALGORITHM=$algorithm: clean on both ranks (${elapsed} s)"
  else
    failed=1
    echo "valgrind.sh: CONCORD_GLOO_ALGORITHM=$algorithm: FAILED (exit status $rc, $passes of 2" \
         "ranks passed, $clean of 2 valgrind logs clean, ${elapsed} s)"
    cat "$logs/$algorithm/out"
    for log in "$logs/$algorithm"/rank*.log; do
      echo "---- $log"
      cat "$log"
    done
  fi
done
exit "$failed"
