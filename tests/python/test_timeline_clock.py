"""The timeline's clock offsets on a concordrun job whose rank CONCORD_TEST_SKEW_RANK has its
system clock CONCORD_TEST_SKEW_US off (clock_skew_preload.c, LD_PRELOAD; as a rank on a host
whose clock is wrong): the offset measured at init is the skew within its error bound; the ranks'
files merged with the offsets are causal (no rank's negotiate of an operation ends before every
rank's negotiate of it began), merged on the system clocks they are not; a run-time timeline
records no offset."""
import json
import os

import numpy as np

import concord

from envutil import with_env
from timeline_util import run_tool, shared_dir, world  # noqa: F401 (fixtures)

SKEW_US = int(os.environ.get("CONCORD_TEST_SKEW_US", "0"))
SKEW_RANK = int(os.environ.get("CONCORD_TEST_SKEW_RANK", "-1"))
SLACK_US = 0.2  # timestamps are written to 0.1 us


def process_args(path):
    with open(path) as f:
        for e in json.load(f)["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                return e["args"]
    raise AssertionError("no process_name in " + path)


def causality_violations(path, tolerance_us):
    """The operations (the k-th on a tensor on every rank) some rank's negotiate of which ended
    before another rank's began: the coordinator cannot have let a rank run an operation before
    every rank submitted it."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    ops = {}  # (tensor, k) -> [(rank, begin, end)]
    count = {}
    for e in events:
        if e.get("ph") != "X" or e["name"] != "negotiate":
            continue
        tensor = names[(e["pid"], e["tid"])]
        k = count.get((e["pid"], tensor), 0)
        count[(e["pid"], tensor)] = k + 1
        ops.setdefault((tensor, k), []).append((e["pid"], e["ts"], e["ts"] + e["dur"]))
    assert ops, "no negotiate slices in " + path
    bad = []
    for op, slices in sorted(ops.items()):
        last_begin = max(s[1] for s in slices)
        first_end = min(s[2] for s in slices)
        if first_end + tolerance_us < last_begin:
            bad.append("%s #%d: a negotiate ended at %.1f us, one began at %.1f us"
                       % (op[0], op[1], first_end, last_begin))
    return bad, len(ops)


def test_offsets_align_a_skewed_rank(world, shared_dir):
    assert world.size == 2 and SKEW_RANK == 1 and abs(SKEW_US) >= 1_000_000, \
        "run with CONCORD_TEST_SKEW_RANK=1 and a skew of seconds (tests/python/CMakeLists.txt)"
    base = os.path.join(shared_dir, "skew")
    c = with_env({"CONCORD_TIMELINE": base}, concord.Communicator)
    for _ in range(10):
        out = c.allreduce(np.ones(64, np.float32), name="clk.small")
        assert float(out[0]) == c.size
        c.allgather(np.arange(3, dtype=np.int32), name="clk.gather")
    c.finalize()
    world.barrier()
    if world.rank != 0:
        return
    files = [base + ".rank%d" % r for r in range(world.size)]
    meta = [process_args(f) for f in files]
    assert meta[0]["concord_clock_offset_us"] == 0 and meta[0]["concord_clock_error_us"] == 0
    offset, error = meta[1]["concord_clock_offset_us"], meta[1]["concord_clock_error_us"]
    # Zero here means the shim did not reach the library's clock (see clock_skew_preload.c).
    assert abs(offset - SKEW_US) <= error + 0.001, (offset, error, SKEW_US)
    assert error < 50_000, "a loopback round trip of %.1f ms" % (2 * error / 1e3)
    print("rank 1: measured offset %.1f us +- %.1f us (skew %d us)" % (offset, error, SKEW_US))
    tolerance = meta[0]["concord_clock_error_us"] + error + SLACK_US

    aligned = os.path.join(shared_dir, "aligned.json")
    rc, out = run_tool("merge", aligned, *files)
    assert rc == 0, out
    assert "rank 0: rank 0's clock" in out and "rank 1: rank 0's clock (offset %+.1f us +- %.1f" \
        % (offset, error) in out, out
    bad, n = causality_violations(aligned, tolerance)
    assert n >= 20 and not bad, bad
    rc, out = run_tool("check", aligned, "--ranks", "2", "--expect", "clk.small", "clk.gather")
    assert rc == 0, out

    system = os.path.join(shared_dir, "system.json")
    rc, out = run_tool("merge", system, "--system-clock", *files)
    assert rc == 0, out
    assert "rank 1: system clock (--system-clock" in out, out
    bad, n = causality_violations(system, tolerance)
    assert len(bad) == n, "merged on the skewed system clock, every operation breaks causality"


def test_a_runtime_timeline_records_no_offset(world, shared_dir):
    base = os.path.join(shared_dir, "runtime")
    with world.timeline(base):
        world.allreduce(np.ones(8, np.float32), name="clk.runtime")
    world.barrier()
    path = base + ".rank%d" % world.rank
    assert "concord_clock_offset_us" not in process_args(path)
    if world.rank != 0:
        return
    rc, out = run_tool("merge", os.path.join(shared_dir, "m.json"),
                       *[base + ".rank%d" % r for r in range(world.size)])
    assert rc == 0, out
    assert "rank 1: system clock (no offset measured" in out, out
