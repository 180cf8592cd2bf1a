"""The timeline (CONCORD_TIMELINE, Communicator.timeline) on every rank of a concordrun job:
a short mixed workload traced from init to finalize, the ranks' files merged and checked by
perf/concord-timeline (valid JSON, each tensor's phases in order, fused batches with their
members, one pid per rank); a run-time timeline covers what runs inside it only; compressed
batches show encode and decode, backend collectives their algorithm; a path that
cannot be written is an error naming it; a disk that fills up only warns, and another timeline
starts after it; tensor names that are not UTF-8 leave the files valid JSON; sub-communicators
write their own files, apart from each other's and the world's."""
import glob
import json
import os
import time

import numpy as np
import pytest

import concord
from concord import Status

from envutil import with_env
from timeline_util import run_tool, shared_dir, world  # noqa: F401 (fixtures)

SMALL = ["tl.small%d" % k for k in range(6)]  # fused
BIG = "tl.big"  # past the direct threshold: alone, in place


def steps(c, n):
    for _ in range(n):
        with c.group():
            handles = [c.allreduce_async(np.ones(20_000, np.float32), name=s) for s in SMALL]
        big = c.allreduce(np.ones(100_000, np.float32), name=BIG)
        assert float(big[0]) == c.size
        for h in handles:
            assert float(h.wait()[0]) == c.size
    c.allgather(np.arange(3, dtype=np.int32), name="tl.gather")


def test_env_timeline_merges_into_one_checked_trace(world, shared_dir):
    base = os.path.join(shared_dir, "env")
    c = with_env({"CONCORD_TIMELINE": base}, concord.Communicator)
    steps(c, 3)
    c.finalize()  # stops the timeline: the file is complete
    world.barrier()
    if world.rank != 0:
        return
    files = [base + ".rank%d" % r for r in range(world.size)]
    merged = os.path.join(shared_dir, "merged.json")
    rc, out = run_tool("merge", merged, *files)
    assert rc == 0, out
    rc, out = run_tool("check", merged, "--ranks", str(world.size), "--expect", BIG, "tl.gather",
                       *SMALL)
    assert rc == 0, out
    with open(merged) as f:
        events = json.load(f)["traceEvents"]
    fused = [e for e in events if e.get("name") == "fused allreduce"]
    assert fused and any(set(e["args"]["members"]) >= set(SMALL) for e in fused), fused
    names = {e["name"] for e in events if e.get("ph") == "X"}
    # (a callback is written only when it took 1 us or more: not required here)
    assert {"negotiate", "queued", "execute", "pack", "unpack", "allreduce", "cycle"} <= names
    # Each operation's negotiation names the rank the coordinator waited for last on every other
    # rank (check has verified that they agree and that the rank named names none).
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e.get("name") == "thread_name" and e["tid"] >= 100}
    named = {}  # (tensor, rank) -> [whether each negotiate names a last rank]
    for e in events:
        if e.get("name") == "negotiate":
            named.setdefault((tracks[(e["pid"], e["tid"])], e["pid"]), []).append(
                "last_rank" in e.get("args", {}))
    for tensor in set(t for t, _ in named):
        per_op = zip(*(named[(tensor, r)] for r in range(world.size)))
        assert all(sum(op) == world.size - 1 for op in per_op), (tensor, named)
    # The plot of the merged trace: a PNG, and its numbers (every rank has time in each phase
    # it ran; the straggler shares of each window sum to 1).
    png, data = os.path.join(shared_dir, "merged.png"), os.path.join(shared_dir, "merged.tsv")
    rc, out = run_tool("plot", merged, png, "--window", "0.5", "--data", data)
    assert rc == 0, out
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    phases, shares = open(data).read().strip().split("\n\n")
    rows = [line.split("\t") for line in phases.split("\n")[1:]]
    assert [int(r[0]) for r in rows] == list(range(world.size))
    assert all(float(r[1]) > 0 and float(r[3]) > 0 for r in rows), phases  # negotiate, execute
    for line in shares.split("\n")[1:]:
        assert abs(sum(float(x) for x in line.split("\t")[1:]) - 1) < 1e-3, shares
    # The check fails a trace whose phases are out of order.
    for e in events:
        if e.get("name") == "queued":
            e["name"] = "negotiate"
    broken = os.path.join(shared_dir, "broken.json")
    with open(broken, "w") as f:
        json.dump({"traceEvents": events}, f)
    rc, out = run_tool("check", broken)
    assert rc == 1 and "expected ('negotiate', 'queued', 'execute', 'callback')" in out, out


def test_runtime_timeline_covers_only_its_block(world, shared_dir):
    base = os.path.join(shared_dir, "block")
    with world.timeline(base):
        world.allreduce(np.ones(8, np.float32), name="tl.inside")
    world.allreduce(np.ones(8, np.float32), name="tl.outside")
    path = base + ".rank%d" % world.rank
    rc, out = run_tool("check", path, "--expect", "tl.inside")
    assert rc == 0, out
    with open(path) as f:
        text = f.read()
    assert "tl.outside" not in text
    with world.timeline(base + "2"):  # a second timeline after the first
        with pytest.raises(concord.ConcordError) as e:
            world.timeline(base + "3").__enter__()
        assert e.value.status == Status.ERR_INVALID_ARGUMENT
        assert "already being written to " + base + "2.rank" in e.value.message


def test_compression_shows_encode_and_decode_and_backends_their_algorithm(world, shared_dir):
    base = os.path.join(shared_dir, "coded")
    c = with_env({"CONCORD_SHM": "off"}, concord.Communicator)  # Gloo, whose choice depends on size
    with c.timeline(base):
        with c.group():
            handles = [c.allreduce_async(np.ones(n, np.float32), name="tl.fp16.%d" % n,
                                         compression="fp16") for n in (100, 3000)]
        for h in handles:
            assert float(h.wait()[0]) == c.size
        c.allreduce(np.ones(600_000, np.float32), name="tl.large")
    c.finalize()
    path = base + ".rank%d" % world.rank
    rc, out = run_tool("check", path, "--expect", "tl.fp16.100", "tl.fp16.3000")
    assert rc == 0, out
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    coding = [e for e in events if e["name"] in ("encode", "decode")]
    assert sorted(e["name"] for e in coding) == ["decode", "encode"], coding
    encode = next(e for e in coding if e["name"] == "encode")
    assert encode["args"]["bytes"] == 3100 * 4 and encode["args"]["encoded"] < 3100 * 4, encode
    collectives = [e for e in events if 0 < e["tid"] < 98 and e["name"] == "allreduce"]
    algorithms = {e["args"]["backend"]: set() for e in collectives}
    for e in collectives:
        algorithms[e["args"]["backend"]].add(e["args"].get("algorithm"))
    # 2 ranks: ring below 256 KiB (the fp16 batch), the function-style "allreduce" above.
    assert list(algorithms) == ["gloo"] and "ring" in algorithms["gloo"], algorithms
    assert algorithms["gloo"] <= {"ring", "allreduce", "span_ring"}, algorithms
    # The check fails an encode outside its batch.
    encode["ts"] -= 1e6
    broken = path + ".broken"
    with open(broken, "w") as f:
        json.dump({"traceEvents": events}, f)
    rc, out = run_tool("check", broken)
    assert rc == 1 and "the encode at" in out and "lies inside no fused batch" in out, out


def test_a_path_that_cannot_be_written_is_an_error_naming_it(world):
    with pytest.raises(concord.ConcordError) as e:
        with_env({"CONCORD_TIMELINE": "/nonexistent-dir/t"}, concord.Communicator)
    assert e.value.status == Status.ERR_INVALID_ARGUMENT
    assert ("CONCORD_TIMELINE = /nonexistent-dir/t: cannot write the timeline file "
            "/nonexistent-dir/t.rank%d: No such file or directory (errno 2)" % world.rank
            ) in e.value.message, e.value.message
    with pytest.raises(concord.ConcordError) as e:
        world.timeline("/nonexistent-dir/t").__enter__()
    assert "/nonexistent-dir/t.rank%d: No such file or directory" % world.rank in e.value.message
    from concord.handle import lib as load
    lib = load()
    assert lib.concord_timeline_start(world._live(), None) == Status.ERR_INVALID_ARGUMENT
    assert "path is NULL or empty" in lib.concord_comm_last_error(world._live()).decode()
    assert lib.concord_timeline_stop(None) == Status.ERR_NOT_INITIALIZED  # as every call


def test_the_tool_names_a_file_it_cannot_read_or_write(tmp_path):
    rc, out = run_tool("merge", str(tmp_path / "out.json"), "/nonexistent-dir/t.rank0")
    assert rc == 1 and "merge: /nonexistent-dir/t.rank0: No such file" in out, out
    assert "Traceback" not in out
    rc, out = run_tool("check", "/nonexistent-dir/trace.json")
    assert rc == 1 and "check: /nonexistent-dir/trace.json: No such file" in out, out
    rc, out = run_tool("merge", str(tmp_path / "out.json"), "a.rank0", "a.rank0")
    assert rc == 2 and "given twice" in out, out


def test_a_full_disk_warns_and_training_goes_on(world, shared_dir, capfd):
    base = os.path.join(shared_dir, "full")
    os.symlink("/dev/full", base + ".rank%d" % world.rank)
    warning = "timeline: writing %s.rank%d failed: No space left on device" % (base, world.rank)
    err = ""
    with world.timeline(base):
        for k in range(20):
            out = world.allreduce(np.ones(1000, np.float32), name="tl.full")
            assert float(out[0]) == world.size
        for _ in range(1000):  # until the writer thread (every 100 ms) has found the disk full
            err += capfd.readouterr().err
            if warning in err:
                break
            time.sleep(0.01)
        assert warning in err, err
        # Turned off, not stopped: another timeline starts (as after CONCORD_TIMELINE's), and works.
        with world.timeline(base + "2"):
            world.allreduce(np.ones(4, np.float32), name="tl.again")
    world.allreduce(np.ones(4, np.float32), name="tl.after")
    rc, out = run_tool("check", base + "2.rank%d" % world.rank, "--expect", "tl.again")
    assert rc == 0, out


def test_names_that_are_not_utf8_leave_the_file_valid(world, shared_dir):
    base = os.path.join(shared_dir, "names")
    names = [b"tl.bad\xff\xfe", "tl.utf8 \u00e9 \U0001f600", 'tl.q"\\\n\x01']
    with world.timeline(base):
        for n in names:
            world.allreduce(np.ones(8, np.float32), name=n)
    path = base + ".rank%d" % world.rank
    with open(path, "rb") as f:
        events = json.loads(f.read().decode("utf-8"))["traceEvents"]  # strict: valid UTF-8
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"tl.bad\ufffd\ufffd", names[1], names[2]} <= tracks, tracks
    rc, out = run_tool("check", path, "--expect", *names[1:])
    assert rc == 0, out


def test_the_tool_reads_a_file_that_is_not_utf8(tmp_path):
    """A file an older Concord wrote with a name's bytes as they were: merged, names as U+FFFD."""
    path = str(tmp_path / "old.rank0")
    with open(path, "wb") as f:
        f.write(b'{"traceEvents":[\n{"ph":"M","pid":0,"tid":0,"name":"process_name","args":'
                b'{"name":"rank 0","concord_rank":0,"concord_size":1,"concord_start_us":1}},\n'
                b'{"ph":"M","pid":0,"tid":100,"name":"thread_name","args":{"name":"bad\xff"}}'
                b'\n]}\n')
    merged = str(tmp_path / "merged.json")
    rc, out = run_tool("merge", merged, path)
    assert rc == 0 and "Traceback" not in out, out
    with open(merged, encoding="utf-8") as f:
        assert json.load(f)["traceEvents"][1]["args"]["name"] == "bad\ufffd"
    rc, out = run_tool("check", path)
    assert rc == 1 and "does not parse as a trace" in out and "Traceback" not in out, out


def test_sub_communicators_write_their_own_files(world, shared_dir):
    """Sub-communicators' ranks repeat the world's and each other's numbers: each writes
    PATH.comm<H>.rank<R>, H its communicator's, which the merge takes one communicator at a time."""
    if world.size < 2:
        pytest.skip("needs 2 ranks or more")
    base = os.path.join(shared_dir, "split")
    alone = world.split(color=world.rank)  # one per rank, each its rank 0
    both = world.split(color=0)  # every rank, ranks as here
    with world.timeline(base), alone.timeline(base), both.timeline(base):
        world.allreduce(np.ones(8, np.float32), name="tl.world")
        for _ in range(3):
            alone.allreduce(np.ones(8, np.float32), name="tl.alone%d" % world.rank)
            both.allreduce(np.ones(8, np.float32), name="tl.both")
    alone.finalize()
    both.finalize()
    world.barrier()
    if world.rank != 0:
        return
    assert sorted(glob.glob(base + ".rank*")) == [base + ".rank%d" % r for r in range(world.size)]
    subs = sorted(glob.glob(base + ".comm*.rank*"))
    assert len(subs) == 2 * world.size, subs
    by_comm = {}
    for path in subs:
        with open(path) as f:
            events = json.load(f)["traceEvents"]  # each whole: none was shared
        comm = next(e["args"] for e in events if e.get("name") == "process_name")
        by_comm.setdefault(path[:path.rindex(".rank")], []).append((path, comm, events))
    assert len(by_comm) == world.size + 1, sorted(by_comm)
    both_files = None
    for files in by_comm.values():
        names = {e["args"]["name"] for _, _, events in files for e in events
                 if e.get("name") == "thread_name" and e["tid"] >= 100}
        if len(files) == world.size:  # `both`: merged into one trace of its ranks
            both_files = files
            assert names == {"tl.both"}, names
            assert {c["concord_communicator"] for _, c, _ in files} == \
                {files[0][1]["concord_communicator"]}
            merged = os.path.join(shared_dir, "split.json")
            rc, out = run_tool("merge", merged, *(p for p, _, _ in files))
            assert rc == 0, out
            rc, out = run_tool("check", merged, "--ranks", str(world.size), "--expect", "tl.both")
            assert rc == 0, out
        else:
            assert len(files) == 1 and files[0][1]["concord_size"] == 1, files
            assert len(names) == 1 and names <= {"tl.alone%d" % r for r in range(world.size)}
    # Files of different communicators are not merged.
    mixed = os.path.join(shared_dir, "mixed.json")
    one = next(p for p, _, _ in both_files if p.endswith(".rank1"))  # `both`'s rank 1
    rc, out = run_tool("merge", mixed, base + ".rank0", one)
    assert rc == 1 and "the files are of different communicators" in out, out
    rc, out = run_tool("merge", mixed, base + ".rank0", base + ".rank1", one)
    assert rc == 1 and "are both rank 1" in out, out
