#!/usr/bin/env bash
# Deterministic mode's cost: allreduce time with CONCORD_DETERMINISTIC=0 and =1, side by side in
# one run, alternating (the order of the pair alternating too) so that a noisy machine hurts both
# alike; prints every run's time and, per rank count and size, the medians and their ratio.
#   perf/deterministic_overhead.sh [BUILD_DIR] [REPEATS] [RANKS...]
# BUILD_DIR defaults to build, REPEATS to 5, RANKS to "2 4". BACKEND=mpi measures MPI instead
# of Gloo. Sizes: 16 MiB and 64 MiB (SIZES="16M:64M", FACTOR=4).
set -euo pipefail
build="${1:-build}"
repeats="${2:-5}"
ranks=("${@:3}")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
backend="${BACKEND:-gloo}"
launch=("$build/tools/concordrun")
perf=("$build/perf/concord-perf" --op allreduce --bytes "${SIZES:-16M:64M}" --factor "${FACTOR:-4}"
      --iters "${ITERS:-10}" --warmup "${WARMUP:-3}" --no-raw)
if [ "$backend" = mpi ]; then
  launch+=(--backend mpi)
  perf+=(--backend mpi)
fi
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for ((rep = 0; rep < repeats; ++rep)); do
  for np in "${ranks[@]}"; do
    if (( rep % 2 == 0 )); then modes=(0 1); else modes=(1 0); fi
    for det in "${modes[@]}"; do
      # Rank 0's rows: "[0]  <bytes>  concord  <time(us)> <algbw> <busbw>" ("[1,0]<stdout>:"
      # under mpirun).
      CONCORD_DETERMINISTIC=$det "${launch[@]}" -np "$np" "${perf[@]}" |
        sed -E 's/^\[[0-9,]*\](<stdout>:)? *//' |
        awk -v np="$np" -v det="$det" '$2 == "concord" && $1 ~ /^[0-9]+$/ {print np, det, $1, $3}' |
        tee -a "$out"
    done
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
times = collections.defaultdict(list)
for line in open(sys.argv[1]):
    np, det, size, us = line.split()
    times[(int(np), int(size), int(det))].append(float(us))
print("ranks      bytes  runs  default(us)  deterministic(us)  overhead")
for np, size in sorted({(k[0], k[1]) for k in times}):
    a, b = times[(np, size, 0)], times[(np, size, 1)]
    if not a or not b:
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    print("%5d %10d %5d %12.0f %18.0f %+8.1f%%" % (np, size, min(len(a), len(b)), ma, mb,
                                                   100 * (mb / ma - 1)))
PY
