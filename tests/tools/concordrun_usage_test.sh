#!/usr/bin/env bash
# concordrun's usage errors (exit status 2, before any rank starts):
#   - -np beyond what the open-file limit allows (3 descriptors per rank in concordrun) is refused
#     at once, saying the limit and `ulimit -n` (it used to start ranks until a pipe failed:
#     "cannot start rank N: pipe: Too many open files", exit 1); a job that fits still runs;
#   - -np and -H's slots out of range name the range (1 to 1000000);
#   - any option given twice is refused, naming it (they took the last silently; only -np was
#     refused), and so is -x for the same variable twice; -x for other variables repeats;
#   - -x with a name that starts with a digit is refused;
#   - a program the ranks on this host cannot execute (without '/': none on PATH; with one: not an
#     executable file) is refused before anything starts (every rank started and failed to exec
#     it, exit 1).
# Usage: concordrun_usage_test.sh path/to/concordrun
set -u
RUN=$1
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"
TMP=$(mktemp -d /tmp/concordrun_usage.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# refused WHAT EXPECTED ARGS...: concordrun ARGS exits 2, its first line starts with
# "concordrun: EXPECTED", and no rank ran (each would say "ran").
refused() {
  local what=$1 expected=$2 out rc
  shift 2
  out=$(timeout 20 "$RUN" "$@" sh -c 'echo ran' 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "$what: exit status $rc, expected 2 ($(head -c 300 <<<"$out"))"
  [[ "$(head -n 1 <<<"$out")" == "concordrun: $expected"* ]] || fail "$what: said: $(head -n 1 <<<"$out")"
  [[ "$out" != *"] ran"* ]] || fail "$what: a rank ran"
}

# refused_program WHAT EXPECTED ARGS...: as refused, but ARGS end in the program to run (and its
# arguments); no rank may have tried to execute it (each would say "cannot execute").
refused_program() {
  local what=$1 expected=$2 out rc
  shift 2
  out=$(timeout 20 "$RUN" "$@" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "$what: exit status $rc, expected 2 ($(head -c 300 <<<"$out"))"
  [[ "$(head -n 1 <<<"$out")" == "concordrun: $expected"* ]] || fail "$what: said: $(head -n 1 <<<"$out")"
  [[ "$out" != *"cannot execute"* ]] || fail "$what: a rank tried to execute it"
}

echo "== -np beyond the open-file limit"
(
  # Soft and hard limit both (concordrun raises its soft limit to the hard one).
  ulimit -n 128 || exit 77
  refused "-np 100 under ulimit -n 128" "-np 100 needs about " -np 100 --no-summary
  out=$(timeout 20 "$RUN" -np 100 --no-summary true 2>&1)
  [[ "$out" == *"more than its limit of 128 "* && "$out" == *"ulimit -n "* ]] ||
    fail "-np 100 under ulimit -n 128: does not say the limit and ulimit -n: $(head -n 1 <<<"$out")"
  # 25 ranks fit: 75 descriptors and concordrun's own.
  out=$(timeout 60 "$RUN" -np 25 --no-summary sh -c 'echo ran' 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || fail "-np 25 under ulimit -n 128: exit status $rc ($(tail -n 3 <<<"$out"))"
  [ "$(grep -c '^\[[0-9]*\] ran$' <<<"$out")" -eq 25 ] || fail "-np 25: not every rank ran"
  exit "$failures"
)
rc=$?
if [ "$rc" -eq 77 ]; then
  echo "(skipped: cannot set ulimit -n 128)"
else
  failures=$((failures + rc))
fi

echo "== -np and -H slots out of range"
for v in 0 1000001 99999999999 -1 +1 1e3 ""; do
  refused "-np '$v'" "-np must be an integer from 1 to 1000000, not '$v'" -np "$v" --no-summary
  refused "-H localhost:'$v'" "-H: slots must be an integer from 1 to 1000000" \
    -np 1 -H "localhost:$v" --no-summary
done

echo "== -np given twice"
refused "-np 2 -np 1" "-np (or -n) given more than once" -np 2 -np 1 --no-summary
refused "-n 1 -np 1" "-np (or -n) given more than once" -n 1 -np 1 --no-summary

echo "== any option given twice"
refused "-H twice" "-H (or --host) given more than once" -np 1 -H localhost:1 --host localhost:1 \
  --no-summary
refused "--iface twice" "--iface given more than once" -np 1 --iface lo --iface lo --no-summary
refused "--backend twice" "--backend given more than once" -np 1 --backend gloo --backend auto \
  --no-summary
refused "--timeout twice" "--timeout given more than once" -np 1 --timeout 5 --timeout 6 --no-summary
refused "--grace twice" "--grace given more than once" -np 1 --grace 1 --grace 2 --no-summary
refused "--no-prefix twice" "--no-prefix given more than once" -np 1 --no-prefix --no-prefix \
  --no-summary
refused "--no-summary twice" "--no-summary given more than once" -np 1 --no-summary --no-summary
refused "-x A=1 -x A=2" "-x A given more than once" -np 1 -x A=1 -x A=2 --no-summary
refused "-x A -x A=1" "-x A given more than once" -np 1 -x A -x A=1 --no-summary

echo "== a program that cannot be executed here"
: >"$TMP/not_executable"
mkdir "$TMP/bin"
: >"$TMP/bin/concord-usage-not-executable"
printf '#!/bin/sh\necho ran\n' >"$TMP/bin/concord-usage-probe"
chmod +x "$TMP/bin/concord-usage-probe"
refused_program "a name not on PATH" \
  "cannot run 'concord-usage-no-such-program': no executable file of that name in PATH" \
  -np 2 --no-summary concord-usage-no-such-program
PATH="$TMP/bin:$PATH" refused_program "a name on PATH only as a file that is not executable" \
  "cannot run 'concord-usage-not-executable': no executable file of that name in PATH" \
  -np 2 --no-summary concord-usage-not-executable
refused_program "a path that does not exist" "cannot run '/nonexistent/program': no such file" \
  -np 2 --no-summary /nonexistent/program
refused_program "a file that is not executable" \
  "cannot run '$TMP/not_executable': not an executable file" \
  -np 2 --no-summary "$TMP/not_executable"
refused_program "a directory" "cannot run '$TMP/bin': not an executable file" \
  -np 2 --no-summary "$TMP/bin"
# Before concordrun execs mpirun (here one that does not exist: it would say so, exit 127).
CONCORD_MPIRUN=/nonexistent/mpirun refused_program "with --backend mpi" \
  "cannot run '/nonexistent/program': no such file" -np 2 --backend mpi /nonexistent/program
out=$(PATH="$TMP/bin:$PATH" timeout 20 "$RUN" -np 2 --no-summary concord-usage-probe 2>&1)
[ "$(grep -c '^\[[01]\] ran$' <<<"$out")" -eq 2 ] || fail "a program found on PATH: said: $out"

echo "== -x with a name that is not a variable's"
for v in 1=2 1X 9_A=b =x A-B=1 "A B=1"; do
  refused "-x '$v'" "-x takes NAME or NAME=VALUE with a variable name, not '$v'" \
    -np 1 -x "$v" --no-summary
done
out=$(timeout 20 "$RUN" -np 1 --no-summary -x _A1=ok -x B2=yes sh -c 'echo "$_A1 $B2"' 2>&1)
[ "$out" = "[0] ok yes" ] || fail "-x _A1=ok -x B2=yes: said: $out"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all passed"
