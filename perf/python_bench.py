"""Side by side, in one run: a model's gradient set per training step through Concord's Python
binding, against torch.distributed's Gloo backend per tensor (async all_reduce of every tensor)
and in 25 MiB buckets (copied into persistent flat buffers in ready order, as DDP does). A last
row is a reference, not an allreduce: the bytes a bandwidth-optimal allreduce of the whole set
moves (a ring's reduce-scatter and allgather, 2(p-1) chunks of 1/p each way), sent and received
through torch.distributed's Gloo (one connection per peer) with no reduction, packing or
per-tensor work. Concord's two lanes use two connections, so it can come close to that row.

    build/tools/concordrun -np 2 /usr/bin/python3 perf/python_bench.py \
        --workload perf/workloads/resnet50.txt --steps 10 --rounds 3

Every step starts after a barrier; a step's time is the slowest rank's; a round runs each mode
for --steps steps (after --warmup) and reports the median; rounds alternate the modes so that
drifting load on the machine hits each alike. Rank 0 prints one table row per round and the
ratios. All modes sum float32 tensors in place (values are checked at the end).
"""
import argparse
import json
import socket
import statistics
import time

import torch
import torch.distributed as dist

import concord

BUCKET_BYTES = 25 << 20


def read_workload(path):
    """A workload file's float32 tensors as (name, shape) in its order (perf/workloads/README.md);
    another dtype ends the program, naming it."""
    tensors = []
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, dtype, shape = line.split()
        if dtype != "float32":
            raise SystemExit("%s: only float32 workloads (%s is %s)" % (path, name, dtype))
        tensors.append((name, [int(d) for d in shape.split("x")]))
    return tensors


def init_torch_distributed(comm):
    """Rank 0 picks a free port and tells the others through Concord."""
    port = torch.zeros(1, dtype=torch.int64)
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.broadcast_(port, root=0, name="bench.port")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % int(port),
                            rank=comm.rank, world_size=comm.size)


class Concord:
    name = "concord (python binding)"

    def __init__(self, comm, grads, names):
        self.comm, self.grads, self.names = comm, grads, names

    def step(self):
        handles = [self.comm.allreduce_async(g, out=g, name=n) for g, n in zip(self.grads,
                                                                              self.names)]
        for h in handles:
            h.wait()


class TorchPerTensor:
    name = "torch.distributed gloo, per tensor"

    def __init__(self, grads):
        self.grads = grads

    def step(self):
        works = [dist.all_reduce(g, async_op=True) for g in self.grads]
        for w in works:
            w.wait()


class TorchBuckets:
    name = "torch.distributed gloo, 25 MiB buckets"

    def __init__(self, grads):
        self.buckets = []  # (flat buffer, [(grad, offset)]) in ready order, as DDP builds them
        current, size = [], 0
        for g in grads:
            if current and size + g.numel() * 4 > BUCKET_BYTES:
                self.buckets.append(current)
                current, size = [], 0
            current.append(g)
            size += g.numel() * 4
        self.buckets.append(current)
        self.flat = [torch.empty(sum(g.numel() for g in b)) for b in self.buckets]

    def step(self):
        works = []
        for flat, bucket in zip(self.flat, self.buckets):
            torch.cat([g.view(-1) for g in bucket], out=flat)
            works.append(dist.all_reduce(flat, async_op=True))
        for flat, bucket, w in zip(self.flat, self.buckets, works):
            w.wait()
            offset = 0
            for g in bucket:
                g.view(-1).copy_(flat[offset:offset + g.numel()])
                offset += g.numel()


class TransferOnly:
    name = "gloo ring transfer only (reference)"

    def __init__(self, comm, total_elements):
        self.rank, self.size = comm.rank, comm.size
        chunk = -(-total_elements // self.size)
        self.send = torch.zeros(chunk)
        self.recv = torch.empty(chunk)

    def step(self):
        if self.size == 1:
            return
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        for _ in range(2 * (self.size - 1)):
            works = [dist.isend(self.send, right), dist.irecv(self.recv, left)]
            for w in works:
                w.wait()


def timed_steps(comm, mode, steps, warmup):
    times = []
    for i in range(warmup + steps):
        comm.barrier()
        start = time.perf_counter()
        mode.step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        comm.allreduce_(elapsed, name="bench.time", op="max")
        if i >= warmup:
            times.append(float(elapsed) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the medians here (rank 0)")
    args = parser.parse_args()

    comm = concord.init()
    init_torch_distributed(comm)
    workload = read_workload(args.workload)
    total_bytes = sum(4 * torch.Size(s).numel() for _, s in workload)
    # One gradient set per mode, so no mode's buffers are warm from another's.
    sets = [[torch.ones(s) for _, s in workload] for _ in range(3)]
    names = ["grad." + n for n, _ in workload]
    modes = [Concord(comm, sets[0], names), TorchPerTensor(sets[1]), TorchBuckets(sets[2]),
             TransferOnly(comm, total_bytes // 4)]
    rows = {m.name: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            rows[mode.name].append(timed_steps(comm, mode, args.steps, args.warmup))
    steps = args.rounds * (args.steps + args.warmup)
    for s in sets:  # every element was summed over comm.size ranks, once per step
        expected = float(comm.size) ** steps
        assert all(float(g.view(-1)[0]) == expected for g in s), "wrong sums"
    if comm.rank == 0:
        print("%s: %d tensors, %.1f MB, %d ranks; ms per step (median of %d steps, max over "
              "ranks), one column per round; speed-up: their time / Concord's" %
              (args.workload, len(workload), total_bytes / 1e6, comm.size, args.steps))
        for name, ms in rows.items():
            print("  %-40s %s   median %7.1f  best %7.1f" % (
                name, "  ".join("%7.1f" % t for t in ms), statistics.median(ms), min(ms)))
        ours = rows[modes[0].name]
        for mode in modes[1:3]:
            ratios = [t / c for t, c in zip(rows[mode.name], ours)]
            print("  %-40s %s   median %.2fx, best rounds %.2fx" % (
                "speed-up vs " + mode.name.split(", ")[1], "  ".join("%6.2fx" % r for r in ratios),
                statistics.median(ratios), min(rows[mode.name]) / min(ours)))
        transfer = statistics.median(rows[modes[3].name])
        per_tensor = statistics.median(rows[modes[1].name])
        print("  1.5x per tensor needs %.1f ms a step or less; moving the bytes alone took %.1f ms "
              "(Concord: %.2fx that)" % (per_tensor / 1.5, transfer,
                                         statistics.median(ours) / transfer))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"workload": args.workload, "ranks": comm.size, "ms": rows}, f, indent=1)
    dist.destroy_process_group()
    concord.finalize()


if __name__ == "__main__":
    main()
