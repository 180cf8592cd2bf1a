#!/bin/sh
# Runs a command as a rank on a pretend host of its own, for NCCL: NCCL_HOSTID from CONCORD_RANK
# (concordrun sets it), so that NCCL takes each rank for another machine and lets several ranks
# share one GPU (it refuses two ranks of a communicator on one GPU of one host), over its socket
# transport on the loopback interface (NCCL_NET=Socket: not an InfiniBand or other network plugin
# the machine may have). Only for checks on a machine with fewer GPUs than ranks
# (perf/gpu-check.sh): the ranks take turns on the GPU, so times mean nothing.
#   concordrun -np 2 --backend nccl perf/nccl-pretend-host.sh PROGRAM ARGS...
if [ -z "${CONCORD_RANK:-}" ]; then
  echo "nccl-pretend-host.sh: CONCORD_RANK is not set (start it with concordrun)" >&2
  exit 2
fi
export NCCL_HOSTID="concord-pretend-host-$CONCORD_RANK"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
export NCCL_NET="${NCCL_NET:-Socket}"
exec "$@"
