#!/usr/bin/env bash
# pack_bench's options take the whole value (atoi read "--iters 1x" as 1 and "abc" as 0, and
# strtod took " 0.5" and "nan"): anything else is a usage error, exit status 2, naming the option,
# before any device is touched (so this runs on machines without a GPU); so is a missing
# --workload, and an unreadable workload file is named.
# Usage: pack_bench_options_test.sh path/to/pack_bench
set -u
PACK_BENCH=$1
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

# refused EXPECTED ARGS...: pack_bench exits 2 saying EXPECTED and its usage.
refused() {
  local expected=$1 out rc
  shift
  out=$(timeout 10 "$PACK_BENCH" "$@" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "pack_bench $*: exit status $rc, expected 2: $out"
  [[ "$out" == *"pack_bench: $expected"* ]] || fail "pack_bench $*: said: $out"
  [[ "$out" == *"usage: pack_bench"* ]] || fail "pack_bench $*: no usage: $out"
}

workload=(--workload /nonexistent/workload.txt)
for v in 1x abc 1e3 " 5" "" 0 -1 99999999999999999999 100000001; do
  refused "--iters takes an integer from 1 to 100000000, not '$v'" "${workload[@]}" --iters "$v"
done
for v in 1x abc 1.5 " 5" "" -1 +-1 100000001; do
  refused "--warmup takes an integer from 0 to 100000000, not '$v'" "${workload[@]}" --warmup "$v"
done
for v in abc 0.5x " 0.5" "" nan inf 1e999; do
  refused "--scale takes a finite number, not '$v'" "${workload[@]}" --scale "$v"
done
refused "missing value or unknown option --iters" "${workload[@]}" --iters
refused "unknown option --bogus" --bogus 1
refused "no --workload given" --iters 3

# A workload file that cannot be read is named, exit status 1, before any device is looked for
# (which would fail first on a machine without a GPU, saying only that).
out=$(timeout 10 "$PACK_BENCH" --workload /nonexistent/workload.txt 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "pack_bench --workload /nonexistent/workload.txt: exit status $rc: $out"
[[ "$out" == "pack_bench: /nonexistent/workload.txt: "* ]] || fail "an unreadable workload: $out"
[[ "$out" != *"CUDA device"* ]] || fail "an unreadable workload: looked for a device: $out"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all passed"
