#!/usr/bin/env bash
# concord-perf reads CONCORD_TIMEOUT_S (its raw rows' timeout) as the library does
# (core/config.cc): what the library refuses is a usage error (exit status 2) naming the
# variable, before anything runs (concord-perf's own reading used to skip it, leaving the raw rows
# at 30 s, and only the library's init refused it, exit status 1); a valid value runs.
# Usage: perf_timeout_env_test.sh path/to/concord-perf
set -u
PERF=$1
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"
args=(--bytes 4:4 --iters 1 --warmup 0)

echo "== refused: not decimal, blanks, out of range, not finite"
for v in 0x10 0X1p3 " 5" "5 " abc . 0 -1 86401 1e400 1e-400 inf nan; do
  out=$(CONCORD_TIMEOUT_S=$v timeout 30 "$PERF" "${args[@]}" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "CONCORD_TIMEOUT_S='$v': exit status $rc, expected 2 ($(head -n 1 <<<"$out"))"
  [[ "$(head -n 1 <<<"$out")" == "concord-perf: "*"CONCORD_TIMEOUT_S"* ]] ||
    fail "CONCORD_TIMEOUT_S='$v': said: $(head -n 1 <<<"$out")"
done

echo "== accepted: decimal forms, and empty (the default)"
for v in 10 2.5 1e1 +3 86400 ""; do
  out=$(CONCORD_TIMEOUT_S=$v timeout 60 "$PERF" "${args[@]}" 2>&1) ||
    fail "CONCORD_TIMEOUT_S='$v': exit status $? ($(tail -n 2 <<<"$out"))"
done

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all passed"
