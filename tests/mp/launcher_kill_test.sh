#!/usr/bin/env bash
# SIGKILL of concordrun ends its ranks:
#   launcher_kill_test.sh [--wrap-rank0] concordrun args... -- program --mode block
# Starts concordrun with tests/mp/launcher_lifecycle.cc's block mode (rank 0 sleeps, the others
# block in an allreduce it never submits), waits until every rank has printed READY, SIGKILLs
# concordrun and checks by PID that every rank process is gone (exited, or a zombie) within 3 s.
# --wrap-rank0 (not with --backend mpi: it reads CONCORD_RANK) runs rank 0's program as the child
# of a shell, as a wrapper script would: the shell is the rank process, and both must go.
# Leftovers are SIGKILLed by PID (they are this test's) and fail it.
set -euo pipefail
wrap=0
if [[ "${1:-}" == "--wrap-rank0" ]]; then
  wrap=1
  shift
fi
[[ $# -gt 0 ]] || { echo "launcher_kill_test.sh: no launcher" >&2; exit 2; }
out="$(mktemp "${TMPDIR:-/tmp}/concord-launcher-kill.XXXXXX")"
# Open MPI's shared-memory segments, which ranks killed with their launcher leave behind: in a
# directory of this test's own (as run_expect.sh does), removed afterwards.
mpi_shm="$(mktemp -d /dev/shm/launcher-kill-mpi.XXXXXX 2>/dev/null ||
  mktemp -d "${TMPDIR:-/tmp}/launcher-kill-mpi.XXXXXX")"
export OMPI_MCA_btl_vader_backing_directory="$mpi_shm"
# So does its session directory (mpirun leaves ~8 MiB of PMIx segments in /tmp when a job fails).
export OMPI_MCA_orte_tmpdir_base="$mpi_shm"
# concordrun's job-summary directory goes to a TMPDIR of this test's own: the lifeline must
# remove it, as it is left nowhere else.
job_tmp="$(mktemp -d "${TMPDIR:-/tmp}/launcher-kill-tmp.XXXXXX")"
trap 'rm -f "$out"; rm -rf "$mpi_shm" "$job_tmp"' EXIT

if [[ $wrap -eq 1 ]]; then
  launch=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do
    launch+=("$1")
    shift
  done
  shift  # --
  # shellcheck disable=SC2016  # expanded by the rank's shell
  wrapper='if [ "$CONCORD_RANK" = 0 ]; then echo "WRAPPER pid $$"; "$0" "$@" & wait
           else exec "$0" "$@"; fi'
  TMPDIR="$job_tmp" "${launch[@]}" -- sh -c "$wrapper" "$@" >"$out" 2>&1 &
else
  TMPDIR="$job_tmp" "$@" >"$out" 2>&1 &
fi
launcher=$!

ready=0
for _ in $(seq 300); do  # 30 s
  ready=$(grep -c "READY rank" "$out" || true)
  [[ $ready -ge 3 ]] && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
sleep 0.3  # the blocked ranks are in their allreduce
pids=$(sed -n -e 's/.*PID rank [0-9]* pid \([0-9]*\)$/\1/p' \
  -e 's/.*WRAPPER pid \([0-9]*\)$/\1/p' "$out")
start=$(date +%s%N)
kill -9 "$launcher" 2>/dev/null || true
{ wait "$launcher"; } 2>/dev/null || true

# A process that has exited but is not reaped yet (a zombie) counts as gone.
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [[ "$state" != Z ]]
}
left=""
took_ms=""
for _ in $(seq 60); do  # 3 s
  left=""
  for pid in $pids; do alive "$pid" && left="$left $pid"; done
  [[ -z "$left" && -z "$took_ms" ]] && took_ms=$((($(date +%s%N) - start) / 1000000))
  summaries=$(find "$job_tmp" -maxdepth 1 -name 'concordrun-*' | wc -l)
  [[ -z "$left" && $summaries -eq 0 ]] && break
  sleep 0.05
done
cat "$out"

fail=0
want=$((3 + wrap))
if [[ $(echo "$pids" | wc -w) -ne $want ]]; then
  echo "launcher_kill_test.sh: FAIL: $ready ranks READY, $(echo "$pids" | wc -w) pids of $want" >&2
  fail=1
fi
if [[ -n "$left" ]]; then
  echo "launcher_kill_test.sh: FAIL: still running 3 s after concordrun's SIGKILL:$left" >&2
  for pid in $left; do kill -9 "$pid" 2>/dev/null || true; done
  fail=1
else
  echo "launcher_kill_test.sh: every rank process (${pids//$'\n'/ }) gone ${took_ms} ms" \
       "after concordrun's SIGKILL"
fi
if [[ $summaries -ne 0 ]]; then
  echo "launcher_kill_test.sh: FAIL: concordrun's summary directory was left in TMPDIR:" \
       "$(ls "$job_tmp")" >&2
  fail=1
fi
exit $fail
