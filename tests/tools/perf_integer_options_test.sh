#!/usr/bin/env bash
# The perf tools' integer options take the whole value as a decimal integer in range (atoi read
# "1e3" as 1 and "5abc" as 5): anything else is a usage error, exit status 2, naming the option.
# gloo_algos' positional numbers likewise (atoi read "0" and "x" as 0 ranks, and it crashed).
# Usage: perf_integer_options_test.sh path/to/metrics_bench path/to/timeline-bench path/to/gloo_algos
set -u
METRICS_BENCH=$1
TIMELINE_BENCH=$2
GLOO_ALGOS=$3
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

# refused FLAG PROGRAM ARGS...: PROGRAM exits 2 saying "FLAG takes an integer".
refused() {
  local flag=$1 out rc
  shift
  out=$(timeout 10 "$@" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "$*: exit status $rc, expected 2"
  [[ "$out" == *": $flag takes an integer from "* ]] || fail "$*: said: $out"
}

echo "== metrics_bench"
for v in 1e3 5abc " 5" "" 0 -1 99999999999999999999; do
  refused --iters "$METRICS_BENCH" --iters "$v" --rounds 1
  refused --rounds "$METRICS_BENCH" --iters 1 --rounds "$v"
done
out=$(timeout 60 "$METRICS_BENCH" --iters 100 --rounds 1 2>&1) || fail "metrics_bench --iters 100: $out"

echo "== timeline-bench (refused before it reads the workload)"
args=(--workload /nonexistent/workload.txt --timeline /nonexistent/tl)
for v in 1e3 5abc " 5" "" 0 1000001; do
  refused --steps "$TIMELINE_BENCH" "${args[@]}" --steps "$v"
  refused --rounds "$TIMELINE_BENCH" "${args[@]}" --rounds "$v"
done
for v in 1.5 -1 +-1; do refused --warmup "$TIMELINE_BENCH" "${args[@]}" --warmup "$v"; done

echo "== gloo_algos (ranks, iterations, max MiB)"
for v in 0 x 1e3 " 2" 257; do refused ranks "$GLOO_ALGOS" "$v"; done
for v in 0 5abc; do refused iterations "$GLOO_ALGOS" 2 "$v"; done
for v in 0 99999999999999999999; do refused "max MiB" "$GLOO_ALGOS" 2 1 "$v"; done

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all passed"
