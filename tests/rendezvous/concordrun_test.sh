#!/usr/bin/env bash
# Drives the built concordrun with small shell programs: output prefixes, the environment given to
# ranks, failure handling (exit codes, signals, stopping the other ranks), signal forwarding and
# usage errors. Usage: concordrun_test.sh path/to/concordrun path/to/rendezvous_probe
set -u
RUN=$1
PROBE=$2
TMP=$(mktemp -d /tmp/concordrun_test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_line FILE REGEX: some line of FILE matches the extended regex.
expect_line() {
  grep -Eq -- "$2" "$1" || { fail "no line matching '$2' in $1:"; sed 's/^/    /' "$1" >&2; }
}

now_ms() { date +%s%3N; }

# Shell functions for rank programs, so that a rank acts only once the others run: `started`
# marks this rank as running; `await_ranks R...` waits until ranks R... have (at most 10 s, then
# goes on: the test's checks then fail rather than hang). The marks live in $SYNC_DIR, a fresh
# directory per case (new_sync_dir NAME). `exec sleep 30` in a rank program is a rank that runs
# until concordrun stops it.
RANK_SYNC='started() { : >"$SYNC_DIR/started.$CONCORD_RANK"; }
await_ranks() {
  for r in "$@"; do
    i=0
    while [ ! -e "$SYNC_DIR/started.$r" ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
  done
}'
# expect_stopped RANKS: the processes of RANKS (a bracket expression, e.g. [02]) whose "[R] pid N"
# lines are in $TMP/out no longer run (any that still does is killed).
expect_stopped() {
  for pid in $(sed -n "s/^\[$1\] pid //p" "$TMP/out"); do
    kill -0 "$pid" 2>/dev/null && { fail "rank process $pid still runs"; kill -9 "$pid"; }
  done
}

new_sync_dir() {
  export SYNC_DIR="$TMP/sync.$1"
  mkdir -p "$SYNC_DIR"
}

# Runs concordrun with the given arguments; sets rc and elapsed (ms); output in $TMP/out, $TMP/err.
launch() {
  local start
  start=$(now_ms)
  "$RUN" "$@" >"$TMP/out" 2>"$TMP/err"
  rc=$?
  elapsed=$(($(now_ms) - start))
}

echo "== output prefixes and environment"
launch -np 3 --iface lo --backend gloo --timeout 7 sh -c \
  'echo "env $CONCORD_RANK $CONCORD_SIZE $CONCORD_LOCAL_RANK $CONCORD_LOCAL_SIZE $CONCORD_IFACE $CONCORD_BACKEND $CONCORD_TIMEOUT_S ${#CONCORD_TOKEN} $CONCORD_STORE $CONCORD_JOB_ID"
   echo "to stderr $CONCORD_RANK" >&2
   printf "no newline $CONCORD_RANK"'
[ "$rc" -eq 0 ] || fail "exit code $rc, expected 0"
for r in 0 1 2; do
  expect_line "$TMP/out" "^\[$r\] env $r 3 $r 3 lo gloo 7 64 tcp://127\.0\.0\.1:[0-9]+ [0-9a-f]{16}$"
  expect_line "$TMP/err" "^\[$r\] to stderr $r$"
  expect_line "$TMP/out" "^\[$r\] no newline $r$"
done
grep -q "to stderr" "$TMP/out" && fail "stderr lines leaked into stdout"
[ "$(grep -c env "$TMP/out")" -eq 3 ] || fail "expected 3 env lines"
# One store and one job id for the whole job.
[ "$(grep env "$TMP/out" | awk '{print $11, $12}' | sort -u | wc -l)" -eq 1 ] ||
  fail "ranks disagree about CONCORD_STORE or CONCORD_JOB_ID"

echo "== optional variables are absent unless given; --no-prefix"
launch -np 1 --no-prefix sh -c 'echo "[${CONCORD_IFACE-unset}] [${CONCORD_BACKEND-unset}] [${CONCORD_TIMEOUT_S-unset}]"'
[ "$rc" -eq 0 ] || fail "exit code $rc, expected 0"
expect_line "$TMP/out" '^\[unset\] \[unset\] \[unset\]$'

echo "== ranks reach each other through the store and a TCP control plane"
launch -np 3 "$PROBE"
[ "$rc" -eq 0 ] || { fail "probe job exit code $rc"; cat "$TMP/err" >&2; }
for r in 0 1 2; do expect_line "$TMP/out" "^\[$r\] probe ok rank $r of 3$"; done

echo "== a rank that exits 3 stops the others"
new_sync_dir exit3
launch -np 3 sh -c "$RANK_SYNC"'
  if [ "$CONCORD_RANK" = 1 ]; then await_ranks 0 2; exit 3; fi
  echo "pid $$"; started; exec sleep 30'
[ "$rc" -ne 0 ] || fail "exit code 0 after a rank failed"
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
expect_line "$TMP/err" '^concordrun: rank 1 \(pid [0-9]+\) exited with code 3; stopping the other ranks$'
[ "$elapsed" -lt 4000 ] || fail "took ${elapsed} ms to stop the sleeping ranks"
expect_stopped "[02]"

echo "== a rank killed by SIGKILL stops the others"
new_sync_dir kill9
launch -np 3 sh -c "$RANK_SYNC"'
  if [ "$CONCORD_RANK" = 2 ]; then await_ranks 0 1; kill -9 $$; fi
  started; exec sleep 30'
[ "$rc" -eq 137 ] || fail "exit code $rc, expected 137"
expect_line "$TMP/err" '^concordrun: rank 2 \(pid [0-9]+\) was killed by signal 9; stopping the other ranks$'
[ "$elapsed" -lt 4000 ] || fail "took ${elapsed} ms to stop the sleeping ranks"

echo "== a rank that ignores SIGTERM gets SIGKILL after the grace period"
new_sync_dir ignore_term
launch -np 2 sh -c "$RANK_SYNC"'
  if [ "$CONCORD_RANK" = 0 ]; then await_ranks 1; exit 1; fi
  trap "" TERM; started; while :; do sleep 0.1; done'
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
[ "$elapsed" -ge 4500 ] && [ "$elapsed" -lt 9000 ] || fail "stopping took ${elapsed} ms, expected ~5 s"

echo "== SIGTERM to concordrun is forwarded"
start=$(now_ms)
"$RUN" -np 2 sh -c 'echo "pid $$"; exec sleep 30' >"$TMP/out" 2>"$TMP/err" &
launcher=$!
# Waits (at most 5 s) until both ranks run: they have printed their pids.
for _ in $(seq 100); do [ "$(grep -c pid "$TMP/out")" -eq 2 ] && break; sleep 0.05; done
kill -TERM "$launcher"
wait "$launcher"
rc=$?
elapsed=$(($(now_ms) - start))
[ "$rc" -eq 143 ] || fail "exit code $rc, expected 143"
expect_line "$TMP/err" '^concordrun: received SIGTERM; stopping the ranks$'
[ "$elapsed" -lt 4000 ] || fail "took ${elapsed} ms after SIGTERM"
expect_stopped "[01]"

echo "== a program that cannot be executed"
launch -np 2 /nonexistent/program
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
expect_line "$TMP/err" "cannot execute '/nonexistent/program'"

echo "== usage errors exit 2"
for args in "-np 0 true" "-np x true" "-np 2" "true" "-np 2 -H localhost:0 true" \
  "-np 3 -H localhost:1,127.0.0.1:1 true" "-np 1 --bogus true" "-np 1 --timeout -1 true" \
  "-np 1 -H :2 true" "-np"; do
  # shellcheck disable=SC2086  # the words are meant to split
  launch $args
  [ "$rc" -eq 2 ] || fail "'concordrun $args' exited $rc, expected 2"
  expect_line "$TMP/err" '^usage: concordrun'
done

echo "== -H with local names assigns local ranks per host"
launch -np 3 -H localhost:2,127.0.0.1:2 sh -c 'echo "lr $CONCORD_LOCAL_RANK $CONCORD_LOCAL_SIZE"'
[ "$rc" -eq 0 ] || fail "exit code $rc"
for r in 0 1 2; do expect_line "$TMP/out" "^\[$r\] lr $r 3$"; done

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all concordrun tests passed"
