#!/usr/bin/env bash
# Ctrl-Z stops the whole job: SIGTSTP to concordrun (what the terminal sends its process group)
# stops the ranks, which lead process groups of their own, and concordrun itself; SIGCONT (fg, bg)
# continues them all. The same for SIGTTIN. concordrun runs under `timeout`, in a process group of
# its own whose parent (this script) is in another, so that the kernel does not discard the stop
# as it would for an orphaned group. The script signals only processes it started, by pid.
# Usage: concordrun_job_control_test.sh path/to/concordrun
set -u
RUN=$1
TMP=$(mktemp -d /tmp/concordrun_job_control.XXXXXX)
cleanup() {
  # A stopped concordrun is continued, so that it acts on the SIGTERM.
  [ -n "$launcher" ] && [ -n "${concordrun:-}" ] && kill -CONT "$concordrun" 2>/dev/null
  stop_launcher
  rm -rf "$TMP"
}
trap cleanup EXIT
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

# The rank pids ("pid N" lines) in concordrun's stdout.
two_ranks() { [ "$(rank_pids | wc -l)" -eq 2 ]; }
rank_pids() { sed -n 's/^\[[0-9]\] pid //p' "$TMP/out"; }
stopped() { [[ "$(ps -o stat= -p "$1")" == T* ]]; }
# all_stopped yes|no: concordrun and every rank are stopped (yes) or none is (no).
all_stopped() {
  for pid in "$concordrun" $(rank_pids); do
    if [ "$1" = yes ]; then stopped "$pid" || return 1; else ! stopped "$pid" || return 1; fi
  done
}
states() {
  for pid in "$concordrun" $(rank_pids); do echo -n "$pid:$(ps -o stat= -p "$pid") "; done
}

# A signal ignored when concordrun starts stays ignored: where this test was started with SIGTSTP
# or SIGTTIN ignored, there is nothing to test (exit 77: skipped).
ignored=$((16#$(sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status)))
if (((ignored >> (20 - 1)) & 1 || (ignored >> (21 - 1)) & 1)); then
  echo "SIGTSTP or SIGTTIN is ignored here: skipped"
  exit 77
fi

timeout -k 2 20 "$RUN" -np 2 --no-summary sh -c 'echo "pid $$"; exec sleep 30' \
  >"$TMP/out" 2>"$TMP/err" &
launcher=$!
wait_for 5 two_ranks || fail "the ranks did not start"
concordrun=$(pgrep -P "$launcher")

for sig in TSTP TTIN; do
  echo "== SIG$sig"
  kill -"$sig" "$concordrun"
  wait_for 3 all_stopped yes || fail "after SIG$sig, not all stopped (pid:state): $(states)"
  kill -CONT "$concordrun"
  wait_for 3 all_stopped no || fail "after SIGCONT, some still stopped (pid:state): $(states)"
done

echo "== SIGTERM ends the job"
kill -TERM "$concordrun"
wait "$launcher"
rc=$?
launcher=
[ "$rc" -eq 143 ] || fail "exit status $rc, expected 143"
for pid in $(rank_pids); do
  if kill -0 "$pid" 2>/dev/null; then
    fail "rank process $pid still runs"
    kill -9 "$pid"
  fi
done

if [ "$failures" -ne 0 ]; then
  echo "--- concordrun's stderr:" >&2
  cat "$TMP/err" >&2
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all passed"
