#!/usr/bin/env bash
# Deterministic mode's cost: allreduce time with the default mode and deterministic mode side by
# side in one job (concord-perf --versus-deterministic: two communicators of the same ranks,
# iterations alternating between them), repeated; prints every job's ratio and, per rank count and
# size, the medians of both modes' times and the median and range of the jobs' ratios.
#   perf/deterministic_overhead.sh [BUILD_DIR] [REPEATS] [RANKS...]
# BUILD_DIR defaults to build, REPEATS to 5, RANKS to "2 4". BACKEND=mpi measures MPI instead
# of Gloo. Sizes: 16 MiB and 64 MiB (SIZES="16M:64M", FACTOR=4). CONCORD_SHM=off measures Gloo's
# TCP pairs between ranks of one host.
set -euo pipefail
build="${1:-build}"
repeats="${2:-5}"
ranks=("${@:3}")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
backend="${BACKEND:-gloo}"
launch=("$build/tools/concordrun")
perf=("$build/perf/concord-perf" --op allreduce --bytes "${SIZES:-16M:64M}" --factor "${FACTOR:-4}"
      --iters "${ITERS:-20}" --warmup "${WARMUP:-3}" --no-raw --versus-deterministic)
if [ "$backend" = mpi ]; then
  launch+=(--backend mpi)
  perf+=(--backend mpi)
fi
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for ((rep = 0; rep < repeats; ++rep)); do
  for np in "${ranks[@]}"; do
    # Rank 0's rows: "[0]  <bytes>  concord [deterministic]  <time(us)> <algbw> <busbw>"
    # ("[1,0]<stdout>:" under mpirun).
    "${launch[@]}" -np "$np" "${perf[@]}" |
      sed -E 's/^\[[0-9,]*\](<stdout>:)? *//' |
      awk -v np="$np" '$1 ~ /^[0-9]+$/ && $2 == "concord" {
                         det = $3 == "deterministic"; print np, det, $1, det ? $4 : $3 }' |
      tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
times = collections.defaultdict(list)
for line in open(sys.argv[1]):
    np, det, size, us = line.split()
    times[(int(np), int(size), int(det))].append(float(us))
print("ranks      bytes  jobs  default(us)  deterministic(us)  overhead: median (min .. max)")
for np, size in sorted({(k[0], k[1]) for k in times}):
    a, b = times[(np, size, 0)], times[(np, size, 1)]
    if not a or len(a) != len(b):
        continue
    ratios = [100 * (y / x - 1) for x, y in zip(a, b)]
    print("%5d %10d %5d %12.0f %18.0f   %+6.1f%% (%+.1f%% .. %+.1f%%)" % (
        np, size, len(a), statistics.median(a), statistics.median(b),
        statistics.median(ratios), min(ratios), max(ratios)))
PY
