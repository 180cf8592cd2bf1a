"""concord-perf's command line, on one rank: every backend it documents is taken (--backend nccl
was once refused by a second, stale parse of --backend, so perf/gpu-check.sh could not run it),
--percentile P changes the statistic and says so (also in --json), --versus-deterministic adds
the deterministic communicator's row and the ratio (and refuses what it cannot time), and bad
values are refused with exit 2.

Usage: concord_perf_cli_test.py PATH_TO_CONCORD_PERF
"""
import json
import os
import subprocess
import sys
import tempfile

PERF = sys.argv[1]


def run(*args):
    p = subprocess.run([PERF, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def check(ok, what, out):
    if not ok:
        print(f"FAIL: {what}\n{out}")
        sys.exit(1)
    print(f"ok: {what}")


rc, out = run("--backend", "nccl", "--bytes", "4K", "--iters", "1", "--warmup", "0")
check("must be" not in out and "usage:" not in out, "--backend nccl is taken", out)
check((rc == 0 and ("no usable GPU" in out or " concord " in out))
      or (rc == 1 and "this build has no NCCL backend" in out),
      "--backend nccl runs, skips without a GPU, or says the build lacks NCCL", out)

rc, out = run("--bytes", "4K", "--iters", "5", "--warmup", "0", "--no-raw")
check(rc == 0 and "percentile" not in out and " concord " in out, "the median by default", out)
check("time: median of iterations, max over ranks" in out, "the header says how a row's time is taken",
      out)

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "rows.json")
    rc, out = run("--bytes", "4K", "--iters", "5", "--warmup", "0", "--no-raw", "--percentile",
                  "90", "--json", path)
    check(rc == 0 and "time: 90th percentile of iterations" in out and " concord " in out,
          "--percentile 90 runs and says so", out)
    with open(path) as f:
        rows = json.load(f)
    check(len(rows) == 1 and rows[0]["percentile"] == 90 and rows[0]["time_us"] > 0,
          "--json records the percentile", json.dumps(rows))
    check(rows[0]["checked"] is True, "--json records that the result was checked",
          json.dumps(rows))

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "rows.json")
    rc, out = run("--op", "reducescatter", "--bytes", "4K:64K", "--factor", "16", "--iters", "3",
                  "--warmup", "0", "--no-raw", "--versus-deterministic", "--json", path)
    check(rc == 0 and out.count(" concord deterministic ") == 2
          and out.count("deterministic/default: time x") == 2,
          "--versus-deterministic times both communicators at every size", out)
    with open(path) as f:
        impls = [r["implementation"] for r in json.load(f)]
    check(impls == ["concord", "concord deterministic"] * 2,
          "--json has both rows per size", json.dumps(impls))

for bad in (["--op", "sendrecv"], ["--workload", "w.txt"], ["--comm", "split:1"],
            ["--backend", "nccl"]):
    rc, out = run("--versus-deterministic", *bad)
    check(rc == 2 and "--versus-deterministic takes" in out,
          f"--versus-deterministic with {' '.join(bad)} refused", out)

for bad in ("0", "100", "x", "50x"):
    rc, out = run("--percentile", bad)
    check(rc == 2 and "--percentile must be a number from 1 to 99" in out,
          f"--percentile {bad} refused", out)

# Sizes: none of whole elements is refused; --bytes 0 runs one 0-byte row, not one per size below
# an element; raw algorithms are known before anything runs.
rc, out = run("--bytes", "1:3", "--iters", "1", "--no-raw")
check(rc == 2 and "holds no size of whole float32 elements" in out, "--bytes 1:3 refused", out)
rc, out = run("--bytes", "0:4", "--iters", "1", "--warmup", "0", "--no-raw")
sizes = [line.split()[0] for line in out.splitlines() if " concord " in line]
check(rc == 0 and sizes == ["0", "4"], "--bytes 0:4: rows of 0 and 4 bytes, once each", out)
rc, out = run("--raw-algos", "ring,rign")
check(rc == 2 and "not 'rign'" in out, "--raw-algos with an unknown algorithm refused", out)

rc, out = run("--backend", "tcp")
check(rc == 2 and "--backend must be gloo, gloo-ibverbs, mpi or nccl" in out, "--backend tcp refused",
      out)

# Numbers are read whole (atoi once ran "--iters 1e3" as 1 iteration, "--bytes inf" as 0 bytes).
for bad in (["--iters", "1e3"], ["--iters", "5abc"], ["--iters", "99999999999"],
            ["--warmup", "-1"], ["--factor", "2abc"], ["--bytes", "1e20"], ["--bytes", "inf"],
            ["--comm", "split:2abc"], ["--comm", "group:0,x"], ["--steps", "0"]):
    rc, out = run(*bad)
    check(rc == 2 and "usage:" in out, f"{' '.join(bad)} refused", out)


def run_env(env, *args):
    p = subprocess.run([PERF, *args], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env})
    return p.returncode, p.stdout + p.stderr


# The environment's backend is the one measured (concordrun --backend sets it), or refused.
rc, out = run_env({"CONCORD_BACKEND": "auto"}, "--bytes", "4K", "--iters", "1")
check(rc == 2 and "CONCORD_BACKEND=auto" in out, "CONCORD_BACKEND=auto alone: which one?", out)
rc, out = run_env({"CONCORD_BACKEND": "auto"}, "--backend", "gloo", "--bytes", "4K", "--iters",
                  "1", "--no-raw")
check(rc == 0 and " concord " in out, "CONCORD_BACKEND=auto with --backend gloo", out)
# gloo-ibverbs (concord-fabric real --fabric ib) is measured, not silently replaced by TCP: here,
# without an RDMA device, init says so.
rc, out = run_env({"CONCORD_BACKEND": "gloo-ibverbs"}, "--bytes", "4K", "--iters", "1")
check(rc == 1 and "gloo-ibverbs" in out and "init failed" in out, "gloo-ibverbs is taken", out)
rc, out = run_env({"CONCORD_BACKEND": "mpi"}, "--backend", "gloo", "--bytes", "4K")
check(rc == 2 and "--backend gloo but CONCORD_BACKEND=mpi" in out, "a conflict refused", out)

with tempfile.TemporaryDirectory() as tmp:
    # A workload named with a quote still gives valid JSON; a file that cannot be written fails.
    workload = os.path.join(tmp, 'my"net.txt')
    with open(workload, "w") as f:
        f.write("fc.weight float32 10x20\nfc.bias float32 10\n")
    path = os.path.join(tmp, "w.json")
    rc, out = run("--workload", workload, "--steps", "1", "--rounds", "1", "--no-raw",
                  "--json", path)
    with open(path) as f:
        rows = json.load(f)
    check(rc == 0 and rows and rows[0]["workload"] == 'my"net', "JSON strings escaped", out)
    rc, out = run("--bytes", "4K", "--iters", "1", "--no-raw", "--json",
                  os.path.join(tmp, "missing", "x.json"))
    check(rc == 1 and "could not write" in out, "an unwritable --json fails the run", out)
print("PASS")
