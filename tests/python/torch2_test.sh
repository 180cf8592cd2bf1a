#!/usr/bin/env bash
# Runs a pytest file on 2 ranks under torch 2.x's torchrun, from a virtual environment holding
# torch VERSION from PyPI (Debian has torch 1.13 only):
#   torch2_test.sh PYTHON VERSION FILE
# Without FILE it only makes the environment (ctest's python_torch2_venv, which starts first, on
# one processor, so that the download overlaps other tests instead of holding both).
# The environment is made once, in ${CONCORD_CACHE_DIR:-~/.cache/concord}/torch-VERSION-pyX.Y
# (outside the clone: later runs and clones reuse it; `.ready.N` marks a complete one, a partial
# one is made again), under a lock, so concurrent runs wait for one install.
# Exits 77 with "SKIPPED: ..." when it cannot be made: PYTHON has no venv, the cache has less than
# 6 GB free (10 GB for a VERSION other than 2.9.1), the registry is unreachable, or the disk filled
# during the install.
#
# PyPI's Linux x86_64 torch is a CUDA build that requires 15 nvidia-* wheels and triton (6.7 GB
# installed); for 2.9.1 only the 7 whose libraries torch's own link against are installed (3.7 GB,
# about a third of the time): `import torch` loads them, and the CPU code never calls them. Any
# other VERSION gets its full requirements (2.15.0: 5.4 GB, 145 s; it links against nearly all).
set -euo pipefail
python="$1" version="$2" file="${3:-}"
skip() {
  echo "SKIPPED: torch $version from PyPI: $*"
  exit 77
}
if ! "$python" -c "import venv, ensurepip" 2>/dev/null; then
  skip "$python has no venv/ensurepip (apt-get install python3-venv)"
fi
pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
cache="${CONCORD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/concord}"
venv="$cache/torch-$version-py$pyver"
# What a finished install leaves; its number grows when the install adds packages (2: torchvision,
# for tests/python/ddp_script_test.py's resnet18), so that an older venv is made again.
ready=.ready.2
mkdir -p "$cache" || skip "cannot create $cache"

install() {
  local free_kb need_gb=6 # 2.9.1's 3.7 GB; a full install of 2.9.1 was 6.7 GB, of 2.15.0 5.4 GB
  [ "$version" = 2.9.1 ] || need_gb=10
  free_kb="$(df -Pk "$cache" | awk 'NR == 2 { print $4 }')"
  if [ "$free_kb" -lt $((need_gb * 1024 * 1024)) ]; then
    skip "$cache has $((free_kb / 1024)) MB free, the install needs $need_gb GB"
  fi
  rm -rf "$venv"
  "$python" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip install -q --no-cache-dir --no-compile --timeout 30
    --retries 2)
  local log="$cache/torch-$version-install.log" start=$SECONDS rc=0
  {
    if [ "$version" = 2.9.1 ]; then
      "${pip[@]}" --no-deps torch==2.9.1 torchvision==0.24.1 nvidia-cuda-runtime-cu12==12.8.90 \
        nvidia-cublas-cu12==12.8.4.1 nvidia-cufft-cu12==11.3.3.83 nvidia-cufile-cu12==1.13.1.3 \
        nvidia-cusparselt-cu12==0.7.1 nvidia-nvshmem-cu12==3.3.20 nvidia-cuda-cupti-cu12==12.8.90 &&
        "${pip[@]}" filelock "typing-extensions>=4.10" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 \
          "fsspec>=0.8.5" numpy pytest pillow
    else
      "${pip[@]}" "torch==$version" torchvision numpy pytest
    fi
  } >"$log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    rm -rf "$venv"
    if grep -qiE "no space left|errno 28" "$log"; then
      skip "the disk filled during the install ($log)"
    fi
    # pip retries, then says no version matches: its warnings say why.
    local net="connection broken|failed to establish|name resolution|name or service|timed out"
    net+="|network is unreachable|proxyerror|sslerror"
    if grep -qiE "$net" "$log"; then
      skip "the registry is unreachable: $(grep -ioE "($net)[^']*" "$log" | tail -1) ($log)"
    fi
    cat "$log"
    echo "torch2_test.sh: installing torch $version failed (above; $log)" >&2
    exit 1
  fi
  "$venv/bin/python" -c "import torch, torch.distributed, torchvision, numpy, pytest"
  echo "torch2_test.sh: installed torch $version into $venv in $((SECONDS - start)) s"
  touch "$venv/$ready"
}

exec 9>"$cache/torch-$version.lock"
flock 9
[ -e "$venv/$ready" ] || install
exec 9>&-
if [ -z "$file" ]; then
  echo "torch2_test.sh: torch $version is ready in $venv"
  exit 0
fi

# torchrun's static rendezvous on 127.0.0.1 (a free port); its workers get RANK, WORLD_SIZE,
# MASTER_ADDR=127.0.0.1 and MASTER_PORT, and Gloo (the DDP comparison) stays on loopback.
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
# pip compiled nothing (--no-compile: compiling all of torch took about 30 s): the modules a run
# imports are compiled once, into the venv's cache, never into the source tree.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$venv/pycache"
exec timeout -k 10 240 "$venv/bin/torchrun" --nnodes 1 --nproc-per-node 2 \
  --master-addr 127.0.0.1 --master-port "$port" \
  -m pytest -q -rs -p no:cacheprovider "$file"
