#!/usr/bin/env bash
# The examples as a new user runs them, with the arguments that once broke them:
#   train_demo: unknown or malformed arguments are usage errors (exit 2), never ignored or a
#   crash ("--samples-per-rank 99999999999" aborted in std::vector); 2 ranks end bit-identical.
#   Python (needs torch, else exit 77): pipeline_parallel.py --batch 6 (micro-batches of uneven
#   size) still equals one process; zero_sharded.py refuses a batch the ranks cannot split
#   evenly; train_classifier.py at 3 ranks (shards of 2731, 2731 and 2730 samples) with
#   --batch 2731 says that the batch is too large instead of stalling (ranks 0 and 1 took a step
#   that rank 2 did not), and trains with --batch 2730.
# Usage: examples_test.sh CONCORDRUN TRAIN_DEMO PYTHON LIBCONCORD SOURCE_DIR
set -uo pipefail
run="${1:?}" demo="${2:?}" python="${3:?}" lib="${4:?}" src="${5:?}"
fail() { echo "examples_test.sh: FAIL: $*" >&2; exit 1; }
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
export CONCORD_TIMEOUT_S=20 CONCORD_STALL_SHUTDOWN_S=20

for args in "--epoch 2" "--epochs" "--epochs 2x" "--epochs 0" "--samples-per-rank 99999999999"; do
  # shellcheck disable=SC2086
  timeout 30 "$demo" $args >"$out" 2>&1
  rc=$?
  [[ $rc == 2 ]] || { cat "$out"; fail "train_demo $args exited $rc, not 2"; }
  grep -q '^usage: train_demo' "$out" || { cat "$out"; fail "train_demo $args printed no usage"; }
done
timeout 60 "$run" -np 2 --no-summary "$demo" --epochs 2 --samples-per-rank 256 >"$out" 2>&1 ||
  { cat "$out"; fail "train_demo at 2 ranks failed"; }
grep -q '2 replicas are bit-identical' "$out" || { cat "$out"; fail "train_demo: no identity"; }

if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "SKIPPED: the Python examples need torch"
  exit 77
fi
export CONCORD_LIBRARY="$lib" PYTHONPATH="$src/bindings/python" PYTHONDONTWRITEBYTECODE=1
py="$src/examples/python"
timeout 120 "$run" -np 2 --no-summary "$python" "$py/pipeline_parallel.py" --steps 5 --batch 6 \
  --check >"$out" 2>&1 || { cat "$out"; fail "pipeline_parallel.py --batch 6 --check"; }
timeout 120 "$run" -np 4 --no-summary "$python" "$py/zero_sharded.py" --steps 2 --batch 66 \
  >"$out" 2>&1
rc=$?
[[ $rc == 1 ]] && grep -q 'positive multiple of 4' "$out" ||
  { cat "$out"; fail "zero_sharded.py --batch 66 exited $rc without saying why"; }
timeout 120 "$run" -np 3 --no-summary "$python" "$py/train_classifier.py" --epochs 1 \
  --batch 2731 >"$out" 2>&1
rc=$?
[[ $rc == 1 ]] && grep -q 'batch must be from 1 to 2730 at 3 ranks' "$out" ||
  { cat "$out"; fail "train_classifier.py --batch 2731 at 3 ranks exited $rc without saying why"; }
timeout 120 "$run" -np 3 --no-summary "$python" "$py/train_classifier.py" --epochs 1 \
  --batch 2730 >"$out" 2>&1 || { cat "$out"; fail "train_classifier.py at 3 ranks, --batch 2730"; }
grep -q 'epoch 0' "$out" || { cat "$out"; fail "train_classifier.py printed no epoch"; }
echo "examples_test.sh: PASS"
