"""concord-perf at 2 and 3 ranks under concordrun, small sizes: every row's result is checked and
a wrong one fails the run; the sweep's sizes and header are what nccl-tests readers expect.

- Every op, with its raw Gloo rows, over --bytes 0:4K: each size once per implementation (sizes
  that round to the same whole elements once ran again, and a raw row met the earlier row's store
  keys), whole elements (per rank where the op splits by rank), every JSON row "checked": true,
  no raw row failing, busbw = algbw x nccl-tests' factor, and the header naming the statistic.
- Concord's check covers the dtypes and reductions: float16 max, int8 average, bfloat16 min,
  int32 product, float64 sum.
- 3 ranks: reducescatter and alltoall sizes are multiples of 3 elements; allreduce sizes are not
  rounded to the ranks.
- With tests/perf/perf_corrupt_shim.c preloaded (Concord's float32 sweep allreduces come back
  with their first element off by one) the run exits 1, prints WRONG RESULT and writes the rows
  with "checked": false (a benchmark used to report such a row as a fast one).
- --factor 1e300 runs one size (its size_t product was undefined and stepped by one byte).

Usage: concord_perf_check_test.py CONCORDRUN CONCORD_PERF CORRUPT_SHIM
"""
import json
import os
import subprocess
import sys
import tempfile

from checks import check, finish

CONCORDRUN, PERF, SHIM = sys.argv[1:4]
FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
          "reducescatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
          "broadcast": lambda n: 1, "sendrecv": lambda n: 1}


def run(np, *args, env=None):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.json")
        p = subprocess.run([CONCORDRUN, "-np", str(np), "--timeout", "60", PERF, *args,
                            "--json", path],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, **(env or {})})
        rows = []
        if os.path.exists(path):
            with open(path) as f:
                rows = json.load(f)
        return p.returncode, p.stdout + p.stderr, rows


def sweep_ok(np, op, args, elem=4):
    rc, out, rows = run(np, "--op", op, *args)
    what = f"{np} ranks, --op {op} {' '.join(args)}"
    check(rc == 0 and rows, f"{what}: runs", out)
    check("time: median of iterations, max over ranks" in out, f"{what}: the header's statistic",
          out)
    check("failed on rank" not in out and "WRONG" not in out, f"{what}: no raw row failed", out)
    check(all(r.get("checked") is True for r in rows), f"{what}: every row checked",
          json.dumps(rows))
    seen = {}
    for r in rows:
        seen.setdefault(r["implementation"], []).append(r["bytes"])
    check(all(len(b) == len(set(b)) for b in seen.values()), f"{what}: each size once", str(seen))
    unit = elem * (np if op in ("allgather", "reducescatter", "alltoall") else 1)
    check(all(r["bytes"] % unit == 0 for r in rows), f"{what}: whole elements ({unit} bytes)",
          str(seen))
    factor = FACTOR[op](np)
    # The JSON holds 6 significant digits.
    check(all(abs(r["busbw_gbps"] - r["algbw_gbps"] * factor) <= 1e-4 * r["algbw_gbps"]
              for r in rows), f"{what}: busbw = algbw x {factor:.3f}", json.dumps(rows))
    return rows


small = ["--bytes", "0:4K", "--factor", "8", "--iters", "3", "--warmup", "1"]
for op in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv"):
    rows = sweep_ok(2, op, small)
    check(any(r["implementation"].startswith("raw gloo") for r in rows),
          f"--op {op}: raw Gloo rows ran", json.dumps(rows))

for dtype, redop, elem in (("float16", "max", 2), ("int8", "average", 1), ("bfloat16", "min", 2),
                           ("int32", "product", 4), ("float64", "sum", 8)):
    sweep_ok(2, "allreduce", ["--dtype", dtype, "--redop", redop, "--bytes", "1:1K", "--factor",
                              "16", "--iters", "2", "--warmup", "0"], elem)
    sweep_ok(2, "reducescatter", ["--dtype", dtype, "--redop", redop, "--bytes", "8:1K",
                                  "--factor", "16", "--iters", "2", "--warmup", "0"], elem)

for op in ("reducescatter", "alltoall", "allreduce"):
    rows = sweep_ok(3, op, ["--bytes", "20:200", "--factor", "3", "--iters", "2", "--warmup", "0"])
    if op == "allreduce":
        check(20 in [r["bytes"] for r in rows], "3 ranks: a 20-byte allreduce stays 20 bytes",
              json.dumps(rows))

rc, out, rows = run(2, "--bytes", "4K:8K", "--iters", "3", "--warmup", "1", "--no-raw",
                    env={"LD_PRELOAD": SHIM})
check(rc == 1 and "WRONG RESULT" in out and "wrong result on rank" in out,
      "a wrong Concord result fails the run and says so", out)
check(rows and all(r.get("checked") is False for r in rows), "its JSON rows say checked: false",
      json.dumps(rows))

rc, out, rows = run(2, "--bytes", "1K:1100", "--factor", "1e300", "--iters", "1", "--warmup",
                    "0", "--no-raw")
check(rc == 0 and [r["bytes"] for r in rows] == [1024], "--factor 1e300: one size", out)

finish()
print("PASS")
