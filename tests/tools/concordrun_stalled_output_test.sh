#!/usr/bin/env bash
# concordrun supervises while nothing reads its stdout (a terminal paused with Ctrl-S, a stuck
# pipe): here its stdout is a FIFO that this script holds open and does not read.
#   1. A rank fails: the other gets SIGTERM after --grace all the same; once the reader reads,
#      every byte the ranks wrote arrives, in order, and concordrun exits 1.
#   2. A SIGTERM to concordrun stops the ranks at once, and concordrun itself a second later
#      (--grace after the ranks ended, it gives up on what is not read), exit status 143.
# concordrun runs under `timeout`; the script signals only processes it started, by pid.
# Usage: concordrun_stalled_output_test.sh path/to/concordrun
set -u
RUN=$1
TMP=$(mktemp -d /tmp/concordrun_stalled.XXXXXX)
cleanup() {
  stop_launcher
  rm -rf "$TMP"
}
trap cleanup EXIT
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

gone() { ! kill -0 "$1" 2>/dev/null; }
# The rank pids ("pid N" lines) in concordrun's stderr, $TMP/err.
two_ranks() { [ "$(rank_pids | wc -l)" -eq 2 ]; }
rank_pids() { sed -n 's/^\[[0-9]\] pid //p' "$TMP/err"; }
ranks_gone() {
  for pid in $(rank_pids); do gone "$pid" || return 1; done
}
# expect_ranks_gone SECONDS: the ranks end within SECONDS; those that do not fail the test and are
# killed.
expect_ranks_gone() {
  wait_for "$1" ranks_gone && return
  fail "rank processes still run: $(rank_pids)"
  for pid in $(rank_pids); do kill -9 "$pid" 2>/dev/null; done
}
# finish: waits for concordrun (its `timeout`) to end; sets rc.
finish() {
  wait "$launcher"
  rc=$?
  launcher=
}
has_line() { grep -Eq -- "$1" "$TMP/err"; }

# A FIFO held open read-write on fd 3: concordrun's open for writing does not wait, and nothing
# reads it until the script does.
start_stalled() {
  rm -f "$TMP/fifo"
  mkfifo "$TMP/fifo"
  exec 3<>"$TMP/fifo"
  timeout -k 2 20 "$RUN" "$@" >"$TMP/fifo" 2>"$TMP/err" &
  launcher=$!  # timeout's pid; concordrun is its child
}

# 3000 lines, 288 kB: far more than a pipe holds. What rank 0 writes, as concordrun forwards it:
LINES='yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | head -n 3000'
sh -c "$LINES" | sed 's/^/[0] /' >"$TMP/expected"

echo "== a rank fails while nothing reads concordrun's stdout"
mkdir "$TMP/sync"
export SYNC_DIR=$TMP/sync
start_stalled -np 2 --grace 0.5 --no-summary sh -c '
  echo "pid $$" >&2
  if [ "$CONCORD_RANK" = 0 ]; then '"$LINES"'; : >"$SYNC_DIR/wrote"; exec sleep 60; fi
  i=0; while [ ! -e "$SYNC_DIR/wrote" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
  exit 1'
wait_for 5 has_line '^concordrun: rank 1 \(pid [0-9]+\) exited with code 1, the first rank to fail' ||
  fail "concordrun did not report rank 1's failure"
wait_for 4 has_line '^concordrun: rank 0 still running 0\.5 s after rank 1 failed: sent SIGTERM' ||
  fail "concordrun did not send SIGTERM to rank 0 after the grace period"
expect_ranks_gone 4
# Now read: all of rank 0's output comes, then concordrun exits.
timeout 10 head -c "$(wc -c <"$TMP/expected")" <&3 >"$TMP/out"
finish
[ "$rc" -eq 1 ] || fail "exit status $rc, expected 1"
cmp -s "$TMP/expected" "$TMP/out" || fail "stdout is not rank 0's 3000 lines ($(wc -c <"$TMP/out") bytes)"
extra=$(dd iflag=nonblock bs=65536 count=1 <&3 2>/dev/null | wc -c)
[ "$extra" -eq 0 ] || fail "$extra bytes more than rank 0 wrote on stdout"
has_line '^concordrun: the job failed: rank 1 ' || fail "no final report"
exec 3<&-

echo "== SIGTERM to concordrun while nothing reads its stdout"
rm -f "$SYNC_DIR/wrote"
start_stalled -np 2 --grace 1 --no-summary sh -c '
  echo "pid $$" >&2; '"$LINES"'; exec sleep 60'
wait_for 5 two_ranks || fail "the ranks did not start"
sleep 0.3  # for the ranks' output to fill the FIFO
concordrun=$(pgrep -P "$launcher")
kill -TERM "$concordrun"
expect_ranks_gone 3
wait_for 5 gone "$concordrun" || fail "concordrun still runs 5 s after SIGTERM"
finish
[ "$rc" -eq 143 ] || fail "exit status $rc, expected 143"
has_line '^concordrun: received SIGTERM; stopping the ranks$' || fail "SIGTERM not reported"
has_line '^concordrun: gave up on [0-9]+ bytes of output that were not read$' ||
  fail "the output given up on was not reported"
exec 3<&-

if [ "$failures" -ne 0 ]; then
  echo "--- concordrun's stderr:" >&2
  cat "$TMP/err" >&2
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all passed"
