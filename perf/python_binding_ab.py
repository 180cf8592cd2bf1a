"""The Python binding's own cost per operation, side by side in one process: the binding of a git
revision (default HEAD) against the working tree's, on one rank, alternating rounds.

    CONCORD_LIBRARY=build/libconcord.so /usr/bin/python3 perf/python_binding_ab.py --old HEAD

Both bindings load the same libconcord and each opens a communicator of one rank, so what differs is
only the Python between the caller and the C API (describing tensors, making results and handles).
Every case runs --iters times per round after a warm-up; rounds alternate which binding goes first;
a time is the median over rounds of the mean per operation. 4 KiB float32 (and bool) tensors;
the torch cases only where torch imports.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import timeit

import numpy as np

CASES = {
    "allreduce_ numpy (in place)": "c.allreduce(x, out=x, name='a')",
    "allreduce numpy (new output)": "c.allreduce(x, name='b')",
    "allreduce_ torch (in place)": "c.allreduce(t, out=t, name='c')",
    "allreduce_async numpy .wait()": "c.allreduce_async(x, out=x, name='d').wait()",
    "allreduce_async torch .wait()": "c.allreduce_async(t, out=t, name='e').wait()",
    "broadcast_ numpy": "c.broadcast(x, out=x, name='f')",
    "allgather numpy (owned output)": "c.allgather(x, name='g')",
    "broadcast_ bool numpy": "c.broadcast(flags, out=flags, name='h')",
}


def load(package_dir, alias):
    """Imports the `concord` package in package_dir under the name `alias`."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        alias, os.path.join(package_dir, "__init__.py"), submodule_search_locations=[package_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="HEAD", help="git revision of the binding to compare")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        import torch
    except ImportError:
        torch = None
    cases = {case: stmt for case, stmt in CASES.items() if torch is not None or " t," not in stmt}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", root, "archive", args.old, "bindings/python/concord"], check=True,
            capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        bindings = {"old": load(os.path.join(tmp, "bindings/python/concord"), "concord_old"),
                    "new": load(os.path.join(root, "bindings/python/concord"), "concord_new")}
        comms = {label: module.Communicator() for label, module in bindings.items()}
        values = {"x": np.ones(1024, np.float32), "flags": np.ones(4096, bool),
                  "t": torch.ones(1024) if torch is not None else None}
        times = {case: {label: [] for label in comms} for case in cases}
        for rnd in range(args.rounds):
            order = list(comms) if rnd % 2 == 0 else list(reversed(list(comms)))
            for label in order:
                scope = dict(values, c=comms[label])
                for case, stmt in cases.items():
                    timeit.timeit(stmt, globals=scope, number=max(args.iters // 10, 1))
                    took = timeit.timeit(stmt, globals=scope, number=args.iters)
                    times[case][label].append(took / args.iters * 1e6)
        for comm in comms.values():
            comm.finalize()
    print("# python_binding_ab: %s against the working tree, 1 rank, %d x %d rounds" %
          (args.old, args.iters, args.rounds))
    print("%-32s %9s %9s %8s" % ("case", "old(us)", "new(us)", "new/old"))
    for case, by_label in times.items():
        old, new = statistics.median(by_label["old"]), statistics.median(by_label["new"])
        print("%-32s %9.2f %9.2f %8.2f" % (case, old, new, new / old))


if __name__ == "__main__":
    main()
