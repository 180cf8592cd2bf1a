#!/usr/bin/env bash
# pip install from the source tree into a fresh virtual environment (with the system's site
# packages, so Debian's numpy and setuptools serve offline), then `import concord` from outside
# the source tree finds libconcord (bundled by setup.py from $CONCORD_LIBRARY) and runs a 1-rank
# allreduce. Exits 77 when PYTHON has no venv module.
#   pip_install_test.sh PYTHON SOURCE_DIR LIBCONCORD
set -euo pipefail
python="$1" source="$2" library="$3"
if ! "$python" -c "import venv, ensurepip" 2>/dev/null; then
  echo "SKIPPED: $python has no venv/ensurepip (apt-get install python3-venv)"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m venv --system-site-packages "$work/venv"
# A copy of the source: the build writes build/ and *.egg-info next to setup.py.
cp -r "$source" "$work/src"
CONCORD_LIBRARY="$library" "$work/venv/bin/pip" install -q --no-build-isolation "$work/src"
cd "$work"
env -u CONCORD_LIBRARY -u CONCORD_BUILD_DIR -u PYTHONPATH -u CONCORD_RANK -u CONCORD_SIZE \
  -u CONCORD_STORE -u CONCORD_TOKEN -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT \
  "$work/venv/bin/python" - <<'PY'
import numpy as np
import concord
path = concord.lib().concord_path
assert "/venv/" in path, "libconcord was not loaded from the installed package: " + path
comm = concord.init()
x = np.arange(5, dtype=np.float32)
assert (comm.allreduce(x, name="x") == x).all() and comm.size == 1
concord.finalize()
print("pip install OK: concord", concord.version(), "from", path)
PY
