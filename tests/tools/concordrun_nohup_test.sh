#!/usr/bin/env bash
# SIGHUP: a concordrun started with SIGHUP ignored (`nohup concordrun ...`) leaves it ignored, so
# the job outlives the terminal: the ranks go on (and ignore it too). Started without, SIGHUP
# stops the job (the ranks get SIGTERM; exit status 129). Each concordrun runs under `timeout`;
# the script signals only processes it started, by pid.
# Usage: concordrun_nohup_test.sh path/to/concordrun
set -u
RUN=$1
TMP=$(mktemp -d /tmp/concordrun_nohup.XXXXXX)
cleanup() {
  stop_launcher
  rm -rf "$TMP"
}
trap cleanup EXIT
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

two_ranks() { [ "$(rank_pids | wc -l)" -eq 2 ]; }
rank_pids() { sed -n 's/^\[[0-9]\] pid //p' "$TMP/out"; }
# ignores_hup PID: SIGHUP (signal 1) is in the process's ignored set.
ignores_hup() { (($((16#$(sed -n 's/^SigIgn:[[:space:]]*//p' "/proc/$1/status"))) & 1)); }
# start_job TRAP: concordrun with 2 sleeping ranks; TRAP is the shell's `trap` before the exec.
start_job() {
  : >"$TMP/out"
  timeout -k 2 20 sh -c "$1; exec \"\$0\" -np 2 --no-summary sh -c 'echo \"pid \$\$\"; exec sleep 30'" \
    "$RUN" >"$TMP/out" 2>"$TMP/err" &
  launcher=$!
  wait_for 5 two_ranks || fail "the ranks did not start"
  concordrun=$(pgrep -P "$launcher")
}
# end_job EXPECTED_STATUS: waits for concordrun and checks its status and that no rank is left.
end_job() {
  wait "$launcher"
  local rc=$?
  launcher=
  [ "$rc" -eq "$1" ] || fail "exit status $rc, expected $1; stderr: $(cat "$TMP/err")"
  for pid in $(rank_pids); do
    if kill -0 "$pid" 2>/dev/null; then
      fail "rank process $pid still runs"
      kill -9 "$pid"
    fi
  done
}

echo "== nohup: SIGHUP ignored at start stays ignored"
start_job "trap '' HUP"
ignores_hup "$concordrun" || fail "concordrun does not ignore SIGHUP"
for pid in $(rank_pids); do ignores_hup "$pid" || fail "rank process $pid does not ignore SIGHUP"; done
kill -HUP "$concordrun"
sleep 1
kill -0 "$concordrun" 2>/dev/null || fail "concordrun ended on SIGHUP"
for pid in $(rank_pids); do kill -0 "$pid" 2>/dev/null || fail "rank process $pid ended on SIGHUP"; done
grep -q "received SIGHUP" "$TMP/err" && fail "concordrun acted on an ignored SIGHUP"
kill -TERM "$concordrun"
end_job 143

echo "== without nohup: SIGHUP stops the job"
start_job "trap - HUP"
kill -HUP "$concordrun"
end_job 129
grep -q "received SIGHUP" "$TMP/err" || fail "concordrun did not say it received SIGHUP"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all passed"
