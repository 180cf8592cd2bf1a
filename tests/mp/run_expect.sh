#!/usr/bin/env bash
# Runs a command (normally concordrun ...), shows its output, and checks its exit status and output.
#   run_expect.sh [--rc N | --rc-nonzero] [--expect REGEX]... [--expect-count REGEX N]...
#                 [--reject REGEX]... [--allow-later-failures] [--min-seconds S]
#                 [--max-seconds S] -- command args...
# --expect: an extended regex some output line must match; --expect-count: exactly N lines must
# match; --reject: no line may match; --min-seconds: it must not end sooner. Always rejected: a
# sanitizer's report, and (unless --allow-later-failures) concordrun's line for the ranks that
# failed by themselves after the first failure, which the exit status does not show. The command runs
# under `timeout` (default 120 s), so this script never hangs; it stops only the process it
# started.
set -euo pipefail

want_rc=0
nonzero=0
max_seconds=120
min_seconds=0
expects=()
counts=()
rejects=('ERROR: (Address|Leak|Thread|Memory)Sanitizer|: runtime error: ')
later_failures='^concordrun: also failed after it, by themselves: '
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rc) want_rc="$2"; shift 2 ;;
    --rc-nonzero) nonzero=1; shift ;;
    --expect) expects+=("$2"); shift 2 ;;
    --expect-count) counts+=("$2" "$3"); shift 3 ;;
    --reject) rejects+=("$2"); shift 2 ;;
    --allow-later-failures) later_failures=; shift ;;
    --max-seconds) max_seconds="$2"; shift 2 ;;
    --min-seconds) min_seconds="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "run_expect.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "run_expect.sh: no command" >&2; exit 2; }

out="$(mktemp "${TMPDIR:-/tmp}/concord-run-expect.XXXXXX")"
# Open MPI's shared-memory transport (vader) leaves its segments behind when a rank is killed:
# they go to a directory of this run's own (on tmpfs where it can), removed afterwards.
mpi_shm="$(mktemp -d /dev/shm/run-expect-mpi.XXXXXX 2>/dev/null ||
  mktemp -d "${TMPDIR:-/tmp}/run-expect-mpi.XXXXXX")"
export OMPI_MCA_btl_vader_backing_directory="$mpi_shm"
# So does its session directory (mpirun leaves ~8 MiB of PMIx segments in /tmp when a job fails).
export OMPI_MCA_orte_tmpdir_base="$mpi_shm"
trap 'rm -f "$out"; rm -rf "$mpi_shm"' EXIT

start=$(date +%s.%N)
set +e
timeout --kill-after=5 "$max_seconds" "$@" >"$out" 2>&1
rc=$?
set -e
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
cat "$out"
echo "run_expect.sh: exit status $rc after ${elapsed} s"

fail=0
# timeout(1) answers 124, or 137 when it had to SIGKILL; 137 is also a SIGKILLed rank's status.
if [[ $rc -eq 124 ]] || awk -v e="$elapsed" -v m="$max_seconds" 'BEGIN { exit !(e >= m) }'; then
  echo "run_expect.sh: FAIL: the command ran past ${max_seconds} s" >&2
  fail=1
fi
if awk -v e="$elapsed" -v m="$min_seconds" 'BEGIN { exit !(e < m) }'; then
  echo "run_expect.sh: FAIL: the command ended before ${min_seconds} s" >&2
  fail=1
fi
if [[ $nonzero -eq 1 ]]; then
  if [[ $rc -eq 0 ]]; then echo "run_expect.sh: FAIL: expected a non-zero exit status" >&2; fail=1; fi
elif [[ $rc -ne $want_rc ]]; then
  echo "run_expect.sh: FAIL: exit status $rc, expected $want_rc" >&2
  fail=1
fi
for re in "${expects[@]+"${expects[@]}"}"; do
  if ! grep -Eq -- "$re" "$out"; then
    echo "run_expect.sh: FAIL: no output line matches /$re/" >&2
    fail=1
  fi
done
if [[ ${#counts[@]} -gt 0 ]]; then
  for ((i = 0; i < ${#counts[@]}; i += 2)); do
    re="${counts[i]}"
    n="${counts[i + 1]}"
    got=$(grep -Ec -- "$re" "$out" || true)
    if [[ "$got" -ne "$n" ]]; then
      echo "run_expect.sh: FAIL: $got output lines match /$re/, expected $n" >&2
      fail=1
    fi
  done
fi
[[ -n "$later_failures" ]] && rejects+=("$later_failures")
for re in "${rejects[@]+"${rejects[@]}"}"; do
  if grep -Eq -- "$re" "$out"; then
    echo "run_expect.sh: FAIL: an output line matches /$re/" >&2
    fail=1
  fi
done
exit $fail
