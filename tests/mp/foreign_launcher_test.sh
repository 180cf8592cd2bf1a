#!/usr/bin/env bash
# Runs NP ranks of a Concord program the way another launcher would, with none of concordrun's
# CONCORD_* variables, and checks that every rank passes:
#   foreign_launcher_test.sh STYLE NP program args...
# STYLE: torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
# TORCHELASTIC_RUN_ID), openmpi (OMPI_COMM_WORLD_*, OMPI_MCA_ess_base_jobid) or slurm
# (SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_JOB_ID: as srun sets
# them). Every rank runs under `timeout`; the script stops only the processes it started and
# removes the file store a one-host job leaves.
set -euo pipefail
style="$1"
np="$2"
shift 2
job="foreign-$$-$RANDOM"
port=$((20000 + RANDOM % 20000))
out="$(mktemp -d "${TMPDIR:-/tmp}/concord-foreign.XXXXXX")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$out" "/tmp/concord-$(id -u)-$job"
}
trap cleanup EXIT

for ((r = 0; r < np; r++)); do
  vars=()
  case "$style" in
    torchrun)
      vars=(RANK=$r WORLD_SIZE=$np LOCAL_RANK=$r LOCAL_WORLD_SIZE=$np MASTER_ADDR=127.0.0.1
            MASTER_PORT=$port TORCHELASTIC_RUN_ID=$job) ;;
    openmpi)
      vars=(OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$np OMPI_COMM_WORLD_LOCAL_RANK=$r
            OMPI_COMM_WORLD_LOCAL_SIZE=$np OMPI_MCA_ess_base_jobid=$job) ;;
    slurm)
      vars=(SLURM_PROCID=$r SLURM_NTASKS=$np SLURM_STEP_NUM_TASKS=$np SLURM_LOCALID=$r
            SLURM_JOB_ID=$job) ;;
    *) echo "foreign_launcher_test.sh: unknown style $style" >&2; exit 2 ;;
  esac
  env -u CONCORD_RANK -u CONCORD_SIZE -u CONCORD_LOCAL_RANK -u CONCORD_LOCAL_SIZE \
      -u CONCORD_STORE -u CONCORD_TOKEN -u CONCORD_JOB_ID CONCORD_TIMEOUT_S=20 "${vars[@]}" \
      timeout 60 "$@" > "$out/rank$r.log" 2>&1 &
  pids+=($!)
done

failed=0
for ((r = 0; r < np; r++)); do
  if ! wait "${pids[$r]}"; then
    echo "rank $r ($style) failed:" >&2
    failed=1
  fi
  sed "s/^/[$r] /" "$out/rank$r.log"
done
pids=()
exit $failed
