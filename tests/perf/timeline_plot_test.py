"""perf/concord-timeline plot on a made-up trace whose answer is known: rank 1 submits every
operation 10 ms after rank 0 for 2 s (and rank 0's negotiations name it, as the coordinator
does), then rank 0 is the late one (no names: the clocks decide), and in the last second rank 0
starts later by the clocks but the coordinator names rank 1, which wins; phase seconds are
exact."""
import json
import os
import subprocess
import sys
import tempfile

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf",
                    "concord-timeline")


def trace():
    events = []
    for rank in (0, 1):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": "rank %d" % rank}})
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 100,
                       "args": {"name": "grad"}})
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 1,
                       "args": {"name": "lane 0"}})
        for k in range(50):  # an operation every 100 ms
            t = k * 100_000.0
            late = (rank == 1) == (t < 2_000_000)
            start = t + (10_000 if late else 0)
            negotiate = {"ph": "X", "name": "negotiate", "pid": rank, "tid": 100, "ts": start,
                         "dur": t + 12_000 - start}  # both leave negotiation together
            if rank == 0 and (t < 2_000_000 or t >= 4_000_000):
                negotiate["args"] = {"last_rank": 1, "last_wait_us": 9_000}
            events += [
                negotiate,
                {"ph": "X", "name": "queued", "pid": rank, "tid": 100, "ts": t + 12_000,
                 "dur": 1_000},
                {"ph": "X", "name": "execute", "pid": rank, "tid": 100, "ts": t + 13_000,
                 "dur": 5_000},
                {"ph": "X", "name": "callback", "pid": rank, "tid": 100, "ts": t + 18_000,
                 "dur": 1_000},
                {"ph": "X", "name": "allreduce", "pid": rank, "tid": 1, "ts": t + 13_000,
                 "dur": 3_000},
            ]
    return {"traceEvents": events}


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        with open(path, "w") as f:
            json.dump(trace(), f)
        png, data = os.path.join(d, "t.png"), os.path.join(d, "t.tsv")
        r = subprocess.run([sys.executable, TOOL, "plot", path, png, "--data", data],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        phases, shares = open(data).read().strip().split("\n\n")
        rows = {int(line.split("\t")[0]): [float(x) for x in line.split("\t")[1:]]
                for line in phases.split("\n")[1:]}
        # 50 operations: queued and callback 50 ms, execute 250 ms, collective 150 ms on each
        # rank; negotiate 12 ms early, 2 ms late (rank 0 late for 30 operations, rank 1 for 20).
        for rank, late in ((0, 30), (1, 20)):
            negotiate, queued, execute, callback, pack, collective = rows[rank]
            assert abs(queued - 0.05) < 1e-6 and abs(callback - 0.05) < 1e-6, rows
            assert abs(execute - 0.25) < 1e-6, rows
            assert abs(collective - 0.15) < 1e-6 and pack == 0, rows
            assert abs(negotiate - ((50 - late) * 0.012 + late * 0.002)) < 1e-6, rows
        windows = [[float(x) for x in line.split("\t")] for line in shares.split("\n")[1:]]
        assert [w[0] for w in windows] == [0, 1, 2, 3, 4], windows
        assert windows[0][1:] == [0, 1] and windows[1][1:] == [0, 1], windows  # rank 1 late
        assert windows[2][1:] == [1, 0] and windows[3][1:] == [1, 0], windows  # then rank 0
        assert windows[4][1:] == [0, 1], windows  # the coordinator's word over the clocks'
        # The same trace passes check; a last_rank naming the rank itself does not.
        r = subprocess.run([sys.executable, TOOL, "check", path, "--ranks", "2"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        bad = trace()
        next(e for e in bad["traceEvents"] if "args" in e and "last_rank" in e["args"])[
            "args"]["last_rank"] = 0
        with open(path, "w") as f:
            json.dump(bad, f)
        r = subprocess.run([sys.executable, TOOL, "check", path], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and "negotiate names last_rank 0" in r.stdout + r.stderr, r
        # Events the Trace Event Format does not allow: named, each.
        bad = trace()
        bad["traceEvents"] += [
            {"ph": "X", "name": "late", "pid": 0, "tid": 1, "ts": "12", "dur": 1},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {}},
            {"ph": "X", "name": "x", "pid": 0.5, "tid": 1, "ts": 1, "dur": 1},
            {"ph": "X", "name": "y", "pid": 0, "tid": 1, "ts": 1, "dur": 1, "args": [1]}]
        with open(path, "w") as f:
            json.dump(bad, f)
        r = subprocess.run([sys.executable, TOOL, "check", path], capture_output=True, text=True,
                           timeout=60)
        out = r.stdout + r.stderr
        assert r.returncode == 1 and "'ts': '12'" in out and "with its argument" in out, out
        assert "integer pid and tid" in out and "args are not an object" in out, out
        with open(path, "w") as f:
            json.dump(trace(), f)
        # Bad input: a window that is not positive, a file that is not a trace.
        r = subprocess.run([sys.executable, TOOL, "plot", path, png, "--window", "0"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--window must be positive" in r.stderr, r.stderr
        with open(path, "w") as f:
            f.write("not json")
        r = subprocess.run([sys.executable, TOOL, "plot", path, png], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    print("timeline_plot_test: PASS")


if __name__ == "__main__":
    main()
