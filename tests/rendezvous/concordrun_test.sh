#!/usr/bin/env bash
# Drives the built concordrun with small shell programs: output prefixes, the environment given to
# ranks, failure handling (exit codes, signals, the report on the first rank to fail, the grace
# period and stopping the other ranks), signal forwarding, usage errors and the job summary.
# Usage: concordrun_test.sh path/to/concordrun path/to/rendezvous_probe
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

echo "== torchrun's variables: rank 0's address and a free port, or concordrun's own"
launch -np 2 --no-summary sh -c 'echo "torch $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT"'
[ "$rc" -eq 0 ] || fail "exit code $rc, expected 0"
for r in 0 1; do expect_line "$TMP/out" "^\[$r\] torch $r $r 2 2 127\.0\.0\.1 [0-9]+$"; done
[ "$(grep torch "$TMP/out" | awk '{print $8}' | sort -u | wc -l)" -eq 1 ] ||
  fail "ranks disagree about MASTER_PORT"
port=$(grep -m1 torch "$TMP/out" | awk '{print $8}')
[ "$port" -gt 0 ] && [ "$port" -lt 65536 ] || fail "MASTER_PORT $port"
MASTER_ADDR=10.9.8.7 MASTER_PORT=4321 launch -np 1 --no-prefix sh -c 'echo "$MASTER_ADDR:$MASTER_PORT"'
expect_line "$TMP/out" '^10\.9\.8\.7:4321$'

echo "== optional variables are absent unless given; --no-prefix"
launch -np 1 --no-prefix sh -c 'echo "[${CONCORD_IFACE-unset}] [${CONCORD_BACKEND-unset}] [${CONCORD_TIMEOUT_S-unset}]"'
[ "$rc" -eq 0 ] || fail "exit code $rc, expected 0"
expect_line "$TMP/out" '^\[unset\] \[unset\] \[unset\]$'

echo "== remote ranks get the CONCORD_* variables and -x's; sshd's environment is otherwise bare"
mkdir -p "$TMP/fakessh"
cat >"$TMP/fakessh/ssh" <<'SSH'
#!/bin/sh
# ssh to "another host", here: drops the options and the host, runs the command in a bare
# environment, as sshd would
while [ $# -gt 0 ]; do case "$1" in -T) shift ;; -o) shift 2 ;; *) break ;; esac; done
shift
exec env -i PATH=/usr/bin:/bin sh -c "$*"
SSH
chmod +x "$TMP/fakessh/ssh"
PATH="$TMP/fakessh:$PATH" CONCORD_LANES=1 CONCORD_HOST=10.1.2.3 FOO=bar BAZ=no \
  launch -np 2 -H localhost:1,otherhost:1 -x FOO -x QUX=a\ b \
  sh -c 'echo "lanes=$CONCORD_LANES host=${CONCORD_HOST-unset} foo=$FOO baz=${BAZ-unset} qux=$QUX"'
[ "$rc" -eq 0 ] || fail "exit code $rc, expected 0"
expect_line "$TMP/out" '^\[0\] lanes=1 host=10.1.2.3 foo=bar baz=no qux=a b$'
# CONCORD_HOST describes the launcher's host: not for the others.
expect_line "$TMP/out" '^\[1\] lanes=1 host=unset foo=bar baz=unset qux=a b$'
launch -np 1 -x 'no-name=1' true
[ "$rc" -eq 2 ] || fail "-x with a bad name: exit code $rc, expected 2"

echo "== what a rank leaves running in its process group ends with the job, said on stderr"
launch -np 2 --no-summary sh -c 'sleep 97 & echo "left $!"'
[ "$rc" -eq 0 ] || fail "exit code $rc, expected 0"
expect_line "$TMP/err" "^concordrun: killed what rank\\(s\\) 0, 1 left running"
for pid in $(sed -n 's/^\[[01]\] left //p' "$TMP/out"); do
  i=0  # SIGKILL is delivered, and the orphan reaped, a moment later
  while [ -n "$(ps -o stat= -p "$pid" 2>/dev/null | grep -v Z)" ] && [ "$i" -lt 40 ]; do
    sleep 0.05
    i=$((i + 1))
  done
  if [ -n "$(ps -o stat= -p "$pid" 2>/dev/null | grep -v Z)" ]; then
    kill "$pid"
    fail "rank's background process $pid outlived the job"
  fi
done

echo "== --no-prefix passes the bytes through as they are (no newline added, binary intact)"
head -c 300000 /dev/urandom >"$TMP/bytes"
printf 'no newline at the end' >>"$TMP/bytes"
launch -np 1 --no-prefix --no-summary cat "$TMP/bytes"
[ "$rc" -eq 0 ] || fail "exit code $rc, expected 0"
cmp -s "$TMP/bytes" "$TMP/out" || fail "--no-prefix changed the output ($(wc -c <"$TMP/out") bytes)"

echo "== ranks reach each other through the store and a TCP control plane"
launch -np 3 "$PROBE"
[ "$rc" -eq 0 ] || { fail "probe job exit code $rc"; cat "$TMP/err" >&2; }
for r in 0 1 2; do expect_line "$TMP/out" "^\[$r\] probe ok rank $r of 3$"; done

echo "== a rank that exits 3: the others have the grace period (CONCORD_GRACE_S), then SIGTERM"
new_sync_dir exit3
CONCORD_GRACE_S=0.5 launch -np 3 sh -c "$RANK_SYNC"'
  if [ "$CONCORD_RANK" = 1 ]; then await_ranks 0 2; exit 3; fi
  echo "pid $$"; started; exec sleep 30'
[ "$rc" -ne 0 ] || fail "exit code 0 after a rank failed"
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
first='^concordrun: rank 1 \(pid [0-9]+\) exited with code 3'
expect_line "$TMP/err" "$first, the first rank to fail\$"
expect_line "$TMP/err" \
  '^concordrun: the other ranks have 0\.5 s to exit by themselves \(--grace\), then get SIGTERM$'
expect_line "$TMP/err" \
  '^concordrun: ranks 0, 2 still running 0\.5 s after rank 1 failed: sent SIGTERM, SIGKILL in 3 s$'
expect_line "$TMP/err" \
  '^concordrun: the job failed: rank 1 \(pid [0-9]+\) exited with code 3 first$'
[ "$elapsed" -ge 500 ] && [ "$elapsed" -lt 4000 ] ||
  fail "took ${elapsed} ms to stop the sleeping ranks, expected 0.5 s and a little"
expect_stopped "[02]"

echo "== a rank killed by SIGKILL, --grace 0: the others get SIGTERM at once"
new_sync_dir kill9
launch -np 3 --grace 0 sh -c "$RANK_SYNC"'
  if [ "$CONCORD_RANK" = 2 ]; then await_ranks 0 1; kill -9 $$; fi
  started; exec sleep 30'
[ "$rc" -eq 137 ] || fail "exit code $rc, expected 137"
expect_line "$TMP/err" \
  '^concordrun: rank 2 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\), the first rank to fail$'
expect_line "$TMP/err" \
  '^concordrun: stopping the other ranks \(--grace 0\): SIGTERM, SIGKILL in 3 s$'
[ "$elapsed" -lt 4000 ] || fail "took ${elapsed} ms to stop the sleeping ranks"

echo "== a rank that ignores SIGTERM gets SIGKILL 3 s after it"
new_sync_dir ignore_term
launch -np 2 --grace 0.5 sh -c "$RANK_SYNC"'
  if [ "$CONCORD_RANK" = 0 ]; then await_ranks 1; exit 1; fi
  trap "" TERM; started; while :; do sleep 0.1; done'
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
expect_line "$TMP/err" '^concordrun: rank 1 still running: sent SIGKILL$'
[ "$elapsed" -ge 3500 ] && [ "$elapsed" -lt 7000 ] ||
  fail "stopping took ${elapsed} ms, expected 0.5 + 3 s"

echo "== a stopped rank (SIGSTOP) is continued with its SIGTERM, so that it can act on it"
new_sync_dir stopped
launch -np 2 --grace 0.5 sh -c "$RANK_SYNC"'
  if [ "$CONCORD_RANK" = 1 ]; then await_ranks 0; exit 3; fi
  trap "echo TERM after stop; exit 9" TERM; started; kill -STOP $$; echo "continued without TERM"'
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
expect_line "$TMP/out" '^\[0\] TERM after stop$'
[ "$elapsed" -lt 3000 ] || fail "took ${elapsed} ms: the stopped rank did not act on SIGTERM"

echo "== the first rank to fail is named with its last words; a rank that fails by itself after it is listed"
new_sync_dir last_words
# Rank 0 exits (4) once concordrun has reaped rank 1, so that rank 1 is the first to fail.
launch -np 2 sh -c "$RANK_SYNC"'
  if [ "$CONCORD_RANK" = 1 ]; then
    echo $$ >"$SYNC_DIR/pid.1"; started; await_ranks 0
    echo "[concord rank 1] ERROR PEER_FAILURE: what the library said" >&2
    echo "RuntimeError: what the application said " >&2; echo " " >&2; exit 3
  fi
  started; await_ranks 1
  i=0
  while kill -0 "$(cat "$SYNC_DIR/pid.1")" 2>/dev/null && [ "$i" -lt 200 ]; do
    sleep 0.05; i=$((i + 1))
  done
  exit 4'
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
rank1='rank 1 \(pid [0-9]+\) exited with code 3'
words='; its last Concord error: "\[concord rank 1\] ERROR PEER_FAILURE: what the library said"'
words+='; its last stderr line: "RuntimeError: what the application said"$'
expect_line "$TMP/err" "^concordrun: $rank1, the first rank to fail$words"
expect_line "$TMP/err" "^concordrun: the job failed: $rank1 first$words"
grep -q "sent SIG\|rank 0 (pid" "$TMP/err" && fail "rank 0 exited by itself but was signalled or named"
expect_line "$TMP/err" '^concordrun: also failed after it, by themselves: rank 0 exited with code 4$'
[ "$elapsed" -lt 4000 ] || fail "took ${elapsed} ms, although rank 0 exited by itself"

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
# Refused before anything starts (tests/tools/concordrun_usage_test.sh has the other cases).
launch -np 2 /nonexistent/program
[ "$rc" -eq 2 ] || fail "exit code $rc, expected 2"
expect_line "$TMP/err" "^concordrun: cannot run '/nonexistent/program': no such file"
# An executable file whose interpreter is missing: only the ranks' exec finds out.
printf '#!/nonexistent/interpreter\n' >"$TMP/no_interpreter"
chmod +x "$TMP/no_interpreter"
launch -np 2 "$TMP/no_interpreter"
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
expect_line "$TMP/err" "cannot execute '$TMP/no_interpreter'"

echo "== a job that cannot start leaves no summary directory"
mkdir "$TMP/start_failed"
TMPDIR="$TMP/start_failed" launch -np 2 -H localhost:1,otherhost:1 --iface nosuch0 true
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
expect_line "$TMP/err" "^concordrun: cannot start the job: .*interface 'nosuch0'"
[ -z "$(ls "$TMP/start_failed")" ] || fail "left in TMPDIR: $(ls "$TMP/start_failed")"

echo "== usage errors exit 2"
for args in "-np 0 true" "-np x true" "-np 2" "true" "-np 2 -H localhost:0 true" \
  "-np 3 -H localhost:1,127.0.0.1:1 true" "-np 1 --bogus true" "-np 1 --timeout -1 true" \
  "-np 1 -H :2 true" "-np" "-np 1 --grace -1 true" "-np 1 --grace x true" \
  "-np 1 --grace 1e9 true" "-np 1 --timeout inf true" "-np 1 --timeout 100000 true" \
  "-np 1 --backend tcp true" "-np 1 -H -oProxyCommand=x:1 true"; do
  # shellcheck disable=SC2086  # the words are meant to split
  launch $args
  [ "$rc" -eq 2 ] || fail "'concordrun $args' exited $rc, expected 2"
  expect_line "$TMP/err" '^usage: concordrun'
done

CONCORD_GRACE_S=soon launch -np 1 true
[ "$rc" -eq 2 ] || fail "CONCORD_GRACE_S=soon: exit code $rc, expected 2"
expect_line "$TMP/err" \
  "^concordrun: CONCORD_GRACE_S must be a number of seconds from 0 to 86400, not 'soon'$"
# --grace wins over the variable, and --help needs neither.
CONCORD_GRACE_S=soon launch -np 1 --grace 1 true
[ "$rc" -eq 0 ] || fail "CONCORD_GRACE_S=soon with --grace 1: exit code $rc, expected 0"
CONCORD_GRACE_S=soon launch --help
[ "$rc" -eq 0 ] || fail "CONCORD_GRACE_S=soon --help: exit code $rc, expected 0"

echo "== -H with local names assigns local ranks per host"
launch -np 3 -H localhost:2,127.0.0.1:2 sh -c 'echo "lr $CONCORD_LOCAL_RANK $CONCORD_LOCAL_SIZE"'
[ "$rc" -eq 0 ] || fail "exit code $rc"
for r in 0 1 2; do expect_line "$TMP/out" "^\[$r\] lr $r 3$"; done

echo "== the job summary: what the ranks wrote into CONCORD_SUMMARY_DIR, also when one failed"
# A rank program that writes its summary file as an engine does at finalize; rank 0 adds a
# straggler line; rank 2 exits 3 without one, once the others wrote theirs (at most 10 s).
WRITE_SUMMARY='d="$CONCORD_SUMMARY_DIR"; f="$d/rank-$CONCORD_RANK.txt"
  if [ "$CONCORD_RANK" = 2 ]; then
    i=0
    while { [ ! -e "$d/rank-0.txt" ] || [ ! -e "$d/rank-1.txt" ]; } && [ "$i" -lt 200 ]; do
      sleep 0.05; i=$((i + 1))
    done
    exit 3
  fi
  printf "rank %s\nhost h%s\nwall_s 10\nops 5\nbytes 1000\nerrors 0\ncollective_s 2\nphase pack 1\n" \
    "$CONCORD_RANK" "$CONCORD_RANK" >"$f.tmp"
  [ "$CONCORD_RANK" = 0 ] && echo "straggler 1 0.9 3" >>"$f.tmp"
  mv "$f.tmp" "$f"'
TMPDIR="$TMP" launch -np 3 --grace 0 sh -c "$WRITE_SUMMARY"
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
expect_line "$TMP/err" \
  '^concordrun: job summary: 3 ranks, 2 with a summary: 2 KB moved in 10 operations, 0 with errors$'
expect_line "$TMP/err" '^ +1 h1 +10\.0 +2\.00 +20\.0% +1 KB +5 +0 +pack 200 ms +90%$'
expect_line "$TMP/err" '^ +2 no summary \(rank exited before finalize\?\)$'
expect_line "$TMP/err" \
  '^top straggler: rank 1 \(h1\) arrived last in 90% of the cycles; the others waited 3\.0 s'
ls -d "$TMP"/concordrun-* >/dev/null 2>&1 && fail "the summary directory was not removed"

echo "== no summary with --no-summary, nor when no rank wrote one"
launch -np 1 --no-prefix --no-summary sh -c 'echo "[${CONCORD_SUMMARY_DIR-unset}]"'
[ "$rc" -eq 0 ] || fail "exit code $rc"
expect_line "$TMP/out" '^\[unset\]$'
launch -np 2 true
grep -q "summary" "$TMP/err" && fail "a summary printed although no rank wrote one"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all concordrun tests passed"
