"""Data-parallel training of a small classifier with Concord's PyTorch integration.

    build/tools/concordrun -np 4 /usr/bin/python3 examples/python/train_classifier.py --epochs 5

The data set is generated (the same on every rank, from a fixed seed): points from three
interleaved spirals in 2-D with noise, lifted to 18 features (the 2 coordinates and 16 tanh
features of a fixed random projection of them). Each rank trains on its own shard, all ranks the
same number of steps; DistributedOptimizer averages the gradients; rank 0 prints the loss and the
accuracy on held-out points after every epoch.
"""
import argparse
import math
import sys
import time

import torch

import concord
import concord.torch as ctorch


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=g)
    t = torch.rand(n, generator=g) * 3.0 + 0.3
    angle = t * 3.0 + labels.float() * (2 * math.pi / 3)
    points = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], 1)
    points += 0.2 * torch.randn(n, 2, generator=g)
    projection = torch.randn(2, 16, generator=torch.Generator().manual_seed(99))
    features = torch.cat([points, torch.tanh(points @ projection)], 1)
    return features, labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--compression", default=None, help="e.g. fp16, where libconcord has it")
    parser.add_argument("--min-accuracy", type=float, default=0.0,
                        help="exit 1 when the final accuracy is lower (for tests)")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")

    comm = concord.init()
    torch.manual_seed(comm.rank)  # different initial weights: broadcast_parameters fixes that
    model = torch.nn.Sequential(torch.nn.Linear(18, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * comm.size)
    ctorch.broadcast_parameters(model.state_dict(), root_rank=0)
    ctorch.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = ctorch.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                            compression=args.compression)

    x, y = make_dataset(8192, seed=1)
    x_test, y_test = make_dataset(2048, seed=2)
    shard = torch.arange(comm.rank, len(x), comm.size)  # this rank's samples
    # Every rank must take the same number of steps (each one's gradients are averaged).
    steps = (len(x) // comm.size) // args.batch if args.batch >= 1 else 0
    if steps < 1:
        if comm.rank == 0:
            print("train_classifier: --batch must be from 1 to %d at %d ranks, not %d"
                  % (len(x) // comm.size, comm.size, args.batch), file=sys.stderr)
        concord.finalize()
        sys.exit(2)
    accuracy = 0.0
    for epoch in range(args.epochs):
        start = time.time()
        order = shard[torch.randperm(len(shard), generator=torch.Generator().manual_seed(epoch))]
        total = torch.zeros(2, dtype=torch.float64)  # loss sum, sample count
        for i in range(0, steps * args.batch, args.batch):
            idx = order[i:i + args.batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(idx), len(idx)], dtype=torch.float64)
        comm.allreduce_(total, name="epoch_loss")
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if comm.rank == 0:
            print("epoch %d  loss %.4f  test accuracy %.3f  (%d ranks, %.2f s)" %
                  (epoch, total[0] / total[1], accuracy, comm.size, time.time() - start),
                  flush=True)
    concord.finalize()
    if accuracy < args.min_accuracy:
        print("accuracy %.3f is below %.3f" % (accuracy, args.min_accuracy))
        sys.exit(1)


if __name__ == "__main__":
    main()
