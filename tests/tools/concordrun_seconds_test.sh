#!/usr/bin/env bash
# concordrun's --timeout (passed to every rank as CONCORD_TIMEOUT_S), --grace and CONCORD_GRACE_S
# take a number of seconds as the library reads CONCORD_TIMEOUT_S (core/config.cc): decimal,
# without hexadecimal or leading blanks, finite and in a double's range. What a rank would refuse
# is a usage error (exit status 2) before any rank starts.
# Usage: concordrun_seconds_test.sh path/to/concordrun
set -u
RUN=$1
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

# refused FLAG VALUE: concordrun exits 2, naming FLAG, and runs nothing.
refused() {
  local out rc
  out=$(timeout 10 "$RUN" -np 1 --no-summary "$1" "$2" sh -c 'echo ran' 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "$1 '$2': exit status $rc, expected 2"
  [[ "$out" == "concordrun: $1 must be a number of seconds"* ]] || fail "$1 '$2': said: $out"
}

# accepted VALUE: --timeout VALUE reaches the rank as CONCORD_TIMEOUT_S, and --grace VALUE runs.
accepted() {
  local out rc
  out=$(timeout 10 "$RUN" -np 1 --no-summary --timeout "$1" --grace "$1" \
    sh -c 'echo "timeout=$CONCORD_TIMEOUT_S"' 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || fail "'$1': exit status $rc, expected 0 ($out)"
  [ "$out" = "[0] timeout=$1" ] || fail "'$1': said: $out"
}

echo "== refused: hexadecimal, leading blanks, out of a double's range, not finite"
for v in 0x10 0X1p3 " 5" $'\t5' "5 " 1e-400 1e400 inf nan "" .; do
  refused --timeout "$v"
  refused --grace "$v"
done
echo "== refused as CONCORD_GRACE_S"
for v in 0x1 " 1"; do
  out=$(CONCORD_GRACE_S=$v timeout 10 "$RUN" -np 1 --no-summary true 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "CONCORD_GRACE_S='$v': exit status $rc, expected 2"
  [[ "$out" == "concordrun: CONCORD_GRACE_S must be a number of seconds"* ]] ||
    fail "CONCORD_GRACE_S='$v': said: $out"
done
echo "== accepted: decimal forms"
for v in 10 2.5 1e1 .5 +3 86400; do accepted "$v"; done

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all passed"
