#!/usr/bin/env bash
# concordrun --backend mpi hands the job's settings to mpirun as -x NAME, so ranks on other hosts
# get them as they do over ssh: every CONCORD_* variable of its environment but those that
# describe this host or launcher (CONCORD_HOST_ID, CONCORD_METRICS_PORT, ...), and not those it
# sets itself (CONCORD_BACKEND=mpi; CONCORD_TIMEOUT_S from --timeout). A stand-in mpirun
# (CONCORD_MPIRUN) prints the arguments it was given.
# Usage: concordrun_mpi_settings_test.sh path/to/concordrun
set -u
RUN=$1
TMP=$(mktemp -d /tmp/concordrun_mpi_settings.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# shellcheck source=tests/tools/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

printf '#!/bin/sh\nfor a in "$@"; do echo "arg: $a"; done\n' > "$TMP/mpirun"
chmod +x "$TMP/mpirun"
out=$(CONCORD_MPIRUN="$TMP/mpirun" CONCORD_COMPRESSION=fp16 CONCORD_TIMELINE=/tmp/t \
  CONCORD_HOST_ID=here CONCORD_METRICS_PORT=9400 CONCORD_BACKEND=gloo CONCORD_TIMEOUT_S=7 \
  timeout 10 "$RUN" -np 2 --backend mpi --timeout 9 true 2>&1)
args=$(echo "$out" | sed -n 's/^arg: //p' | tr '\n' ' ')
for want in "-x CONCORD_COMPRESSION " "-x CONCORD_TIMELINE " "-x CONCORD_BACKEND=mpi " \
  "-x CONCORD_TIMEOUT_S=9 "; do
  [[ " $args" == *" $want"* ]] || fail "mpirun was not given '$want': $args"
done
for unwanted in "CONCORD_HOST_ID" "CONCORD_METRICS_PORT" "-x CONCORD_BACKEND " \
  "-x CONCORD_TIMEOUT_S "; do
  [[ " $args" != *"$unwanted"* ]] || fail "mpirun was given '$unwanted': $args"
done
[[ $failures -eq 0 ]] && echo "concordrun_mpi_settings: PASS"
exit $((failures > 0))
