"""perf/concord-timeline plot on a made-up trace whose answer is known: rank 1 submits every
operation 10 ms after rank 0 for 2 s, then rank 0 is the late one; phase seconds are exact."""
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
        for k in range(40):  # an operation every 100 ms
            t = k * 100_000.0
            late = (rank == 1) == (t < 2_000_000)
            start = t + (10_000 if late else 0)
            negotiate = t + 12_000 - start  # both leave negotiation together
            events += [
                {"ph": "X", "name": "negotiate", "pid": rank, "tid": 100, "ts": start,
                 "dur": negotiate},
                {"ph": "X", "name": "execute", "pid": rank, "tid": 100, "ts": t + 12_000,
                 "dur": 5_000},
                {"ph": "X", "name": "callback", "pid": rank, "tid": 100, "ts": t + 17_000,
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
        # 40 operations: callback 40 ms, execute 200 ms, collective 120 ms on each rank;
        # negotiate 40 x 12 ms on the rank that was early half the time, 40 x 2 ms late.
        for rank in (0, 1):
            negotiate, execute, callback, pack, collective = rows[rank]
            assert abs(execute - 0.2) < 1e-6 and abs(callback - 0.04) < 1e-6, rows
            assert abs(collective - 0.12) < 1e-6 and pack == 0, rows
            assert abs(negotiate - (20 * 0.012 + 20 * 0.002)) < 1e-6, rows
        windows = [[float(x) for x in line.split("\t")] for line in shares.split("\n")[1:]]
        assert [w[0] for w in windows] == [0, 1, 2, 3], windows
        assert windows[0][1:] == [0, 1] and windows[1][1:] == [0, 1], windows  # rank 1 late
        assert windows[2][1:] == [1, 0] and windows[3][1:] == [1, 0], windows  # then rank 0
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
