"""A sharded optimizer (ZeRO stage 2 style) on process sets, beside plain data parallelism.

    build/tools/concordrun -np 4 /usr/bin/python3 examples/python/zero_sharded.py --steps 20

Four ranks form 2 data-parallel replicas of 2 shards: ranks {0, 1} and {2, 3} each split the
optimizer between them (`shard` = comm.split(rank // 2)), and ranks {0, 2} and {1, 3} hold the
same shard in the two replicas (`replica` = comm.split(rank % 2)). Every step each rank computes
the gradient of its own quarter of the batch; a reduce-scatter over `shard` leaves each rank the
sum of its half of the flat gradient over its shard group, an allreduce over `replica` adds the
other replica's, and each rank steps only its half of the parameters (SGD with momentum: each
rank keeps the momentum of its half only); an allgather over `shard` gives every rank the whole
updated parameters. Rank 0 prints the loss (the mean over the ranks' quarters) every few steps.
With --check every rank also trains the model in one process on the whole batch and exits 1
unless the weights match to --tolerance.
"""
import argparse
import sys

import torch

import concord


def make_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 4))


def batch(step, size):
    g = torch.Generator().manual_seed(500 + step)
    x = torch.randn(size, 16, generator=g)
    y = torch.randint(0, 4, (size,), generator=g)
    return x, y


def flat(tensors, length):
    out = torch.zeros(length)
    torch.cat([t.reshape(-1) for t in tensors], out=out[:sum(t.numel() for t in tensors)])
    return out


def unflat(vector, params):
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(vector[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def train_sharded(comm, args):
    shard = comm.split(comm.rank // 2, key=comm.rank)  # the two ranks sharing one optimizer
    replica = comm.split(comm.rank % 2, key=comm.rank)  # the same shard in both replicas
    model = make_model()
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    length = (n + shard.size - 1) // shard.size * shard.size  # padded to split evenly
    part = length // shard.size
    mine = slice(shard.rank * part, (shard.rank + 1) * part)
    momentum = torch.zeros(part)
    quarter = args.batch // comm.size
    losses = torch.zeros(args.steps)
    for step in range(args.steps):
        x, y = batch(step, args.batch)
        rows = slice(comm.rank * quarter, (comm.rank + 1) * quarter)
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
        loss.backward()
        losses[step] = loss.item()
        grad = flat([p.grad for p in params], length)
        # Sum over this shard group, then over the replicas: the gradient of the whole batch.
        g = shard.reducescatter(grad, name="grad", op="sum")
        g = replica.allreduce(g, name="grad", op="sum") / comm.size
        momentum.mul_(args.momentum).add_(g)
        weights = flat([p.detach() for p in params], length)[mine] - args.lr * momentum
        unflat(shard.allgather(weights.contiguous(), name="weights"), params)
    replica.finalize()
    shard.finalize()
    comm.allreduce_(losses, name="losses", op="average")
    if comm.rank == 0:
        for step in range(0, args.steps, max(1, args.steps // 5)):
            print("step %3d  loss %.6f" % (step, losses[step]))
    return model


def train_reference(args):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for step in range(args.steps):
        x, y = batch(step, args.batch)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="samples per step, all ranks")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--check", action="store_true",
                        help="compare with plain SGD in one process; exit 1 on a difference")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    # Each rank takes a quarter: a remainder would leave samples out that --check's one process
    # trains on.
    if args.batch < 4 or args.batch % 4 != 0:
        parser.error("--batch must be a positive multiple of 4 (one quarter per rank), not %d"
                     % args.batch)
    comm = concord.init()
    if comm.size != 4:
        print("zero_sharded: run with 4 ranks (2 replicas of 2 shards)", file=sys.stderr)
        return 2
    model = train_sharded(comm, args)
    ok = True
    if args.check:
        ref = train_reference(args)
        worst = max((p - q).abs().max().item()
                    for p, q in zip(model.parameters(), ref.parameters()))
        ok = worst <= args.tolerance
        print("zero_sharded: rank %d: largest weight difference from one process %.2e: %s"
              % (comm.rank, worst, "MATCH" if ok else "DIFFER"))
    concord.finalize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
