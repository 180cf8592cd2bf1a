"""Small-operation latency through the Python binding, side by side in one run: the blocking call
(comm.allreduce_, one blocking C call), the same operation as allreduce_async(...).wait() (an
asynchronous submission, which wakes the engine thread, then a wait that takes the step over), and
the floor: concord_allreduce called straight through ctypes with a descriptor made once.

    build/tools/concordrun -np 2 /usr/bin/python3 perf/python_latency.py --iters 2000 --rounds 3

Every size runs each mode --iters times per round after a barrier (and --warmup untimed); rounds
alternate the modes so that drifting load hits each alike; a time is the mean per operation on
rank 0, a row the median over rounds. Rank 0 prints one row per size and mode, with the ratio to
the blocking call. float32, in place, sum; the sums are checked at the end.
"""
import argparse
import ctypes
import statistics
import time

import numpy as np

import concord
from concord import _lib, tensors
from concord.handle import lib


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4K,64K", help="comma-separated bytes (K, M suffixes)")
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    comm = concord.init()
    L = lib()
    opts = _lib.AllreduceOptsStruct()
    opts.struct_size = ctypes.sizeof(opts)
    opts.prescale = opts.postscale = 1.0
    results = {}
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        x = np.ones(size // 4, np.float32)
        described = tensors.describe(x, "x")
        name = b"latency.%d" % size
        modes = {
            "blocking": lambda: comm.allreduce_(x, name="latency"),
            "async+wait": lambda: comm.allreduce_async(x, out=x, name="latency").wait(),
            "ctypes floor": lambda: comm._check(L.concord_allreduce(
                comm._handle, name, ctypes.byref(described.struct), None, ctypes.byref(opts))),
        }
        for label, run in modes.items():
            for _ in range(args.warmup):
                run()
        times = {label: [] for label in modes}
        for rnd in range(args.rounds):
            order = list(modes) if rnd % 2 == 0 else list(reversed(list(modes)))
            for label in order:
                comm.barrier()
                start = time.perf_counter()
                for _ in range(args.iters):
                    run = modes[label]
                    run()
                times[label].append((time.perf_counter() - start) / args.iters * 1e6)
        results[size] = {label: statistics.median(t) for label, t in times.items()}
        x[:] = 1.0
        comm.allreduce_(x, name="latency.check")
        assert np.all(x == comm.size), "wrong sum"
    if comm.rank == 0:
        print("# python_latency: %d ranks, %d iterations x %d rounds, float32 sum in place"
              % (comm.size, args.iters, args.rounds))
        print("%10s  %-14s %10s %10s" % ("bytes", "mode", "time(us)", "x blocking"))
        for size, row in results.items():
            for label, us in row.items():
                print("%10d  %-14s %10.1f %10.2f" % (size, label, us, us / row["blocking"]))
    comm.finalize()


if __name__ == "__main__":
    main()
