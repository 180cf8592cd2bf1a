#!/usr/bin/env python3
"""Compares two builds of Concord side by side: runs concord-perf from each, alternating, and
prints the ratio each run measured between Concord and the best raw backend row of that same run
(time ratios for sizes, step ratios for a workload). A change that should not move performance
(a refactoring) is within noise when the two builds' ratios overlap across rounds.

Each build is a directory holding tools/concordrun, perf/concord-perf and libconcord.so*, as a
CMake build tree does, or a flat directory with the three files (copy them aside before you change
the code: `mkdir /tmp/before && cp build/tools/concordrun build/perf/concord-perf build/libconcord.so*
/tmp/before/`). The library is taken from that directory (LD_LIBRARY_PATH), so a binary built
with an rpath into another tree still runs its own build's library.

    perf/compare_builds.py --old /tmp/before --new build --rounds 3 \\
        --sizes 4K,1M,64M --workload perf/workloads/resnet50.txt

Prints one table per measurement: round, old ratio, new ratio.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys


def tool(build, sub, name):
    for path in (os.path.join(build, sub, name), os.path.join(build, name)):
        if os.path.exists(path):
            return path
    sys.exit("compare_builds: no %s under %s" % (name, build))


def run(build, np, args, timeout):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.abspath(build) + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    cmd = [tool(build, "tools", "concordrun"), "-np", str(np), tool(build, "perf", "concord-perf")]
    out = subprocess.run(cmd + args, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.exit("compare_builds: %s failed (%d):\n%s%s" %
                 (" ".join(cmd + args), out.returncode, out.stdout[-3000:], out.stderr[-3000:]))
    return out.stdout


def size_ratios(text):
    """{bytes: Concord time / best raw time} from a sweep's output (rank 0's lines)."""
    ratios, size = {}, None
    for line in text.splitlines():
        m = re.match(r"\[0\]\s+(\d+)\s+concord\s", line)
        if m:
            size = int(m.group(1))
        m = re.search(r"concord/best raw: time x([\d.]+)", line)
        if m and size is not None:
            ratios[size] = float(m.group(1))
    return ratios


def workload_ratios(text):
    """The per-round step ratios (Concord step / one raw allreduce of all bytes) of a workload."""
    for line in text.splitlines():
        if line.startswith("[0]") and "per round:" in line:
            rounds = line.split("per round:")[1].split("(median")[0]
            return [float(x.lstrip("x")) for x in rounds.split()]
    return []


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--sizes", default="4K,1M,64M", help="comma-separated sizes of the sweep")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--workload", help="a workload file (perf/workloads/*.txt); none: no workload")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    table = {}  # (what, build) -> [ratio per round]
    for r in range(args.rounds):
        # Alternate which build goes first, so drift in the machine's load hits both alike.
        order = [("old", args.old), ("new", args.new)]
        if r % 2:
            order.reverse()
        for label, build in order:
            for size in sizes:
                text = run(build, args.np, ["--bytes", "%d:%d" % (size, size), "--iters",
                                            str(args.iters), "--warmup", "5"], 600)
                # One size a run, keyed by the size asked for: concord-perf prints the size it
                # ran, rounded down to whole elements (and once to a multiple of the ranks: 4096
                # read 4092 at 3 ranks, and its ratios were left out of the table as nan).
                ratios = list(size_ratios(text).values())
                if len(ratios) != 1:
                    sys.exit("compare_builds: no Concord / best raw ratio for %d bytes in:\n%s" %
                             (size, text[-3000:]))
                table.setdefault((size, label), []).append(ratios[0])
            if args.workload:
                text = run(build, args.np, ["--workload", args.workload, "--steps",
                                            str(args.steps), "--warmup", "3", "--rounds", "3"], 900)
                rounds = workload_ratios(text)
                if not rounds:
                    sys.exit("compare_builds: no workload ratio in:\n" + text[-3000:])
                table.setdefault(("workload", label), []).append(statistics.median(rounds))
    print("Concord / best raw row, per run (time: lower is better); old = %s, new = %s" %
          (args.old, args.new))
    print("%-12s %-30s %-30s %s" % ("what", "old", "new", "median new/old"))
    for what in sizes + (["workload"] if args.workload else []):
        old, new = table.get((what, "old"), []), table.get((what, "new"), [])
        name = what if isinstance(what, str) else "%d B" % what
        ratio = statistics.median(new) / statistics.median(old) if old and new else float("nan")
        print("%-12s %-30s %-30s %.2f" % (name, " ".join("%.2f" % x for x in old),
                                          " ".join("%.2f" % x for x in new), ratio))


if __name__ == "__main__":
    main()
