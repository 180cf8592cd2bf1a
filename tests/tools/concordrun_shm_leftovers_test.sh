#!/usr/bin/env bash
# Shared-memory segments left by ranks that died during the set-up (/dev/shm/concord-<pid>-...,
# tools/shm_leftovers.h): concordrun unlinks those of its ranks once they have ended, and so does
# its lifeline when concordrun itself is SIGKILLed. A segment of a process that is not one of the
# job's ranks stays. The ranks make the files themselves (`touch`, as their own pid's segment).
# Each concordrun runs under `timeout`; the script signals only processes it started, by pid.
# Usage: concordrun_shm_leftovers_test.sh path/to/concordrun
set -u
RUN=$1
TMP=$(mktemp -d /tmp/concordrun_shm_leftovers.XXXXXX)
# Not a rank's: this script's own pid, which is alive and in no job.
DECOY=/dev/shm/concord-$$-0-decoy
cleanup() {
  stop_launcher
  for pid in $(rank_pids); do kill -9 "$pid" 2>/dev/null; done
  # Every case's ranks' segments (each case's output was kept in $TMP/out.N).
  cat "$TMP"/out* 2>/dev/null | sed -n 's/^\[[0-9]\] pid //p' | while read -r pid; do
    rm -f /dev/shm/concord-"$pid"-0-test
  done
  rm -f "$DECOY"
  rm -rf "$TMP"
}
trap cleanup EXIT
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

[ -d /dev/shm ] && [ -w /dev/shm ] || { echo "SKIP: no writable /dev/shm"; exit 77; }
rank_pids() { sed -n 's/^\[[0-9]\] pid //p' "$TMP/out" 2>/dev/null; }
left_segments() { for pid in $(rank_pids); do ls /dev/shm/concord-"$pid"-* 2>/dev/null; done; }
no_segments_left() { [ -z "$(left_segments)" ]; }
two_ranks() { [ "$(rank_pids | wc -l)" -eq 2 ]; }
# The rank program: its segment's name, its pid, then what follows.
MAKE_SEGMENT='touch "/dev/shm/concord-$$-0-test"; echo "pid $$"'
: >"$DECOY"

echo "== ranks that fail leave segments: concordrun removes them once they ended"
timeout -k 2 30 "$RUN" -np 2 --no-summary sh -c "$MAKE_SEGMENT; exit 3" >"$TMP/out" 2>"$TMP/err"
rc=$?
[ "$rc" -eq 1 ] || fail "exit status $rc, expected 1; stderr: $(cat "$TMP/err")"
two_ranks || fail "the ranks did not start: $(cat "$TMP/out")"
no_segments_left || fail "left in /dev/shm: $(left_segments)"
grep -q "^concordrun: removed 2 shared-memory segment(s) the ranks left" "$TMP/err" ||
  fail "no line saying so in: $(cat "$TMP/err")"
[ -e "$DECOY" ] || fail "the segment of a process that is no rank was removed"
cp "$TMP/out" "$TMP/out.1"

echo "== concordrun SIGKILLed: its lifeline removes them"
: >"$TMP/out"
timeout -k 2 30 "$RUN" -np 2 --no-summary sh -c "$MAKE_SEGMENT; exec sleep 30" \
  >"$TMP/out" 2>"$TMP/err" &
launcher=$!
wait_for 10 two_ranks || fail "the ranks did not start: $(cat "$TMP/out")"
wait_for 5 eval '[ "$(left_segments | wc -l)" -eq 2 ]' || fail "the ranks made no segments"
concordrun=$(pgrep -P "$launcher")
kill -9 "$concordrun"
wait_for 5 no_segments_left || fail "left in /dev/shm after concordrun's SIGKILL: $(left_segments)"
{ wait "$launcher"; } 2>/dev/null
launcher=
[ -e "$DECOY" ] || fail "the segment of a process that is no rank was removed"

if [ "$failures" -gt 0 ]; then
  echo "concordrun_shm_leftovers_test: $failures failure(s)" >&2
  exit 1
fi
echo "concordrun_shm_leftovers_test: PASS"
