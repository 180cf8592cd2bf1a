"""DDP over torch.distributed's backend "concord" against DDP over "gloo", side by side in one
run, on torchvision's resnet18 (random images) or on a gradient set such as ResNet-50's (a model
whose parameters have the workload's shapes and whose forward pass costs next to nothing, so the
step is its communication).

    build/tools/concordrun -np 2 /usr/bin/python3 perf/torch_ddp_bench.py --model resnet18
    build/tools/concordrun -np 2 /usr/bin/python3 perf/torch_ddp_bench.py \
        --model perf/workloads/resnet50.txt

Per backend and round, three medians of --steps steps (after --warmup), each the slowest rank's:
  step     a whole DDP step: forward, backward with DDP's bucketed allreduces, optimizer step;
  compute  the same step under no_sync() (no communication);
  comm     the communication alone: DDP's buckets (the first 1 MiB, then 25 MiB, in the order
           backward makes gradients ready) allreduced asynchronously over the group, then waited.
Rounds alternate the backends so that drifting load on this shared machine hits each alike; the
ratios are gloo's time over concord's. Both groups live in one job (the default group is
"concord", gloo's is a new_group), so both see the same ranks, cores and data.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import concord.torch  # noqa: F401  (registers the backend)
from python_bench import read_workload  # perf/ is this script's directory

FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed's dist._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_BYTES = 25 << 20  # DDP's bucket_cap_mb default


class GradientSet(torch.nn.Module):
    """Parameters with a workload's shapes, registered so that DDP's bucket order (reverse
    registration) is the workload's ready order; the forward pass touches one element of each."""

    def __init__(self, path):
        super().__init__()
        self.shapes = read_workload(path)
        for i, (_, shape) in enumerate(reversed(self.shapes)):
            self.register_parameter("p%d" % i, torch.nn.Parameter(torch.zeros(shape)))

    def forward(self, x):
        return sum((p.view(-1)[0] * x).sum() for p in self.parameters())


def make_model(spec, batch, image):
    """(model, a function that returns one step's loss)."""
    if spec == "resnet18":
        import torchvision
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=100)
        x = torch.randn(batch, 3, image, image)
        y = torch.randint(0, 100, (batch,))
        return model, lambda m: torch.nn.functional.cross_entropy(m(x), y)
    model = GradientSet(spec)
    x = torch.ones(batch)
    return model, lambda m: m(x)


def buckets_of(model):
    """Flat buffers sized as DDP's buckets: ready order (reverse registration), 1 MiB first."""
    sizes, current, cap = [], 0, FIRST_BUCKET_BYTES
    for p in reversed(list(model.parameters())):
        nbytes = p.numel() * p.element_size()
        if current and current + nbytes > cap:
            sizes.append(current)
            current, cap = 0, BUCKET_BYTES
        current += nbytes
    sizes.append(current)
    return [torch.ones(n // 4) for n in sizes]


class Backend:
    """One backend's DDP model, optimizer and bucket buffers."""

    def __init__(self, name, group, spec, args):
        self.name, self.group = name, group
        model, self.loss = make_model(spec, args.batch, args.image)
        self.ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=1e-4)
        self.buckets = buckets_of(model)
        self.nbytes = sum(b.numel() * 4 for b in self.buckets)
        self.comm_calls = 0

    def step(self):
        self.opt.zero_grad()
        self.loss(self.ddp).backward()
        self.opt.step()

    def compute(self):
        with self.ddp.no_sync():
            self.step()

    def comm(self):
        works = [dist.all_reduce(b, group=self.group, async_op=True) for b in self.buckets]
        for w in works:
            w.wait()
        self.comm_calls += 1

    def check(self, size):
        """Every bucket element was summed over `size` ranks once per comm() call."""
        want = float(size)**self.comm_calls
        for b in self.buckets:
            assert float(b[0]) == want and float(b[-1]) == want, (self.name, float(b[0]), want)


# Every tensor given to a gloo collective, kept until the end: torch 1.13's gloo worker thread
# frees a finished work's tensors, and freeing the last reference to a Python tensor there needs
# the GIL, which the main thread holds while it destroys the group at exit (a deadlock seen here).
_KEPT = []


def timed(fn, steps, warmup, sync):
    times = []
    for i in range(warmup + steps):
        dist.barrier(group=sync)
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=sync)
        _KEPT.append(elapsed)
        if i >= warmup:
            times.append(float(elapsed) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet18",
                        help="resnet18, or a workload file (perf/workloads/*.txt)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="resnet18's images per rank")
    parser.add_argument("--image", type=int, default=64, help="resnet18's image side, pixels")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--json", help="write the medians here (rank 0)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rank, size = int(os.environ["CONCORD_RANK"]), int(os.environ["CONCORD_SIZE"])
    store_path = "/tmp/concord-ddp-bench-%s" % os.environ["CONCORD_JOB_ID"]
    dist.init_process_group("concord", rank=rank, world_size=size,
                            store=dist.FileStore(store_path, size))
    gloo = dist.new_group(backend="gloo")
    backends = [Backend("gloo", gloo, args.model, args), Backend("concord", None, args.model, args)]
    kinds = ("step", "compute", "comm")
    rows = {(b.name, k): [] for b in backends for k in kinds}
    for r in range(args.rounds):
        for b in backends if r % 2 == 0 else reversed(backends):
            for kind in kinds:
                rows[(b.name, kind)].append(timed(getattr(b, kind), args.steps, args.warmup, gloo))
    for b in backends:
        b.check(size)
    if rank == 0:
        params = sum(p.numel() for p in backends[0].ddp.parameters())
        print("%s: %d ranks, %.1f MB of gradients in %d DDP buckets, %d torch thread(s) a rank; "
              "ms (median of %d steps, slowest rank), one column per round" %
              (args.model, size, params * 4 / 1e6, len(backends[0].buckets), args.threads,
               args.steps))
        for (name, kind), ms in rows.items():
            print("  %-8s %-8s %s   median %8.1f" % (name, kind, "  ".join("%8.1f" % t for t in ms),
                                                     statistics.median(ms)))
        for kind in kinds:
            ratios = [g / c for g, c in zip(rows[("gloo", kind)], rows[("concord", kind)])]
            print("  gloo/concord %-8s %s   median %.2fx" % (kind, "  ".join(
                "%7.2fx" % x for x in ratios), statistics.median(ratios)))
        exposed = {
            b.name: statistics.median(rows[(b.name, "step")]) -
            statistics.median(rows[(b.name, "compute")])
            for b in backends
        }
        print("  exposed communication (step - compute): gloo %.1f ms, concord %.1f ms" %
              (exposed["gloo"], exposed["concord"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": args.model, "ranks": size,
                           "ms": {"%s.%s" % k: v for k, v in rows.items()}}, f, indent=1)
    dist.barrier(group=gloo)
    del backends  # the DDP reducers and their groups, while _KEPT still holds the tensors
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
