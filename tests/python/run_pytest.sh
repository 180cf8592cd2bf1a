#!/usr/bin/env bash
# Runs a pytest file (or, with --script, a plain script) on N ranks through concordrun.
#   run_pytest.sh [--script] PYTHON CONCORDRUN N FILE [args...]
# Exits 77 (ctest's skip code here) with a clear message when PYTHON lacks pytest or numpy, or 1
# under CONCORD_CI=1 (scripts/test.sh, after scripts/setup.sh installed them).
set -euo pipefail
script=0
if [ "${1:-}" = "--script" ]; then script=1; shift; fi
python="$1" concordrun="$2" np="$3"
shift 3
need="import numpy"
[ "$script" = 1 ] && need="import numpy, torch" || need="import numpy, pytest"
if ! "$python" -c "$need" 2>/dev/null; then
  if [ "${CONCORD_CI:-}" = 1 ]; then
    echo "FAILED: CONCORD_CI=1 and '$need' fails under $python (scripts/setup.sh installs" \
         "python3-numpy python3-pytest python3-torch):"
    "$python" -c "$need" || true
    exit 1
  fi
  echo "SKIPPED: Python tests need '$need' under $python (apt-get install python3-numpy" \
       "python3-pytest python3-torch; scripts/setup.sh installs them)"
  exit 77
fi
if [ "$script" = 1 ]; then
  exec "$concordrun" -np "$np" --timeout 30 "$python" "$@"
fi
# -p no:cacheprovider: no .pytest_cache in the source tree; -rs prints every skip's reason.
# With several ranks, -x: a rank whose test fails stops there. Its peers would go on into the
# next tests' collectives without it and each wait out a timeout (the ranks out of step until
# ctest's own timeout killed the job); concordrun ends them instead (--grace).
first_failure=()
[ "$np" -gt 1 ] && first_failure=(-x)
exec "$concordrun" -np "$np" --timeout 30 "$python" -m pytest -q -rs -p no:cacheprovider \
  "${first_failure[@]}" "$@"
