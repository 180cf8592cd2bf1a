"""Pipeline parallelism over Concord's send/recv: a two-stage model, GPipe schedule.

    build/tools/concordrun -np 2 /usr/bin/python3 examples/python/pipeline_parallel.py --steps 20

Rank 0 holds stage 0 (Linear 8->32, tanh), rank 1 stage 1 (Linear 32->1). Every step splits the
batch into micro-batches: rank 0 runs each forward and sends its activations to rank 1 (tag 0);
rank 1 finishes the forward, computes the loss and sends the gradient of the activations back
(tag 1); rank 0 runs each backward as its gradient arrives. Then each rank steps its own stage.
Messages of one (peer, tag) arrive in order, so micro-batches need no numbering. Each micro-batch
adds its squared errors divided by the whole batch, so the step's loss and gradients are the whole
batch's mean whatever the micro-batches' sizes (--batch need not divide by --micro). Rank 1 prints
the loss; with --check every rank also trains the whole model in one process on the same data and
exits 1 unless the losses and weights match to --tolerance.
"""
import argparse
import sys

import torch

import concord

ACTIVATIONS, GRADIENTS = 0, 1


def make_stages():
    torch.manual_seed(7)  # the same initial weights on every rank and in the reference
    return (torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh()),
            torch.nn.Linear(32, 1))


def batch(step, size):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 8, generator=g)
    y = torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(size, 1, generator=g)
    return x, y


def train_pipeline(comm, args):
    stage0, stage1 = make_stages()
    stage = stage0 if comm.rank == 0 else stage1
    opt = torch.optim.SGD(stage.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        x, y = batch(step, args.batch)
        xs, ys = x.chunk(args.micro), y.chunk(args.micro)
        opt.zero_grad()
        if comm.rank == 0:
            outputs = []
            for mb in xs:  # forward of every micro-batch, activations on their way at once
                out = stage(mb)
                outputs.append(out)
                comm.send(out.detach().contiguous(), peer=1, tag=ACTIVATIONS)
            for out in outputs:  # backward in the same order as the gradients come back
                grad = comm.recv(peer=1, tag=GRADIENTS, like=out)
                out.backward(grad)
        else:
            total = 0.0
            for mb_y in ys:
                act = comm.recv(peer=0, tag=ACTIVATIONS, like=torch.empty(len(mb_y), 32))
                act.requires_grad_(True)
                loss = torch.nn.functional.mse_loss(stage(act), mb_y, reduction="sum") / args.batch
                loss.backward()
                total += loss.item()
                comm.send(act.grad.contiguous(), peer=0, tag=GRADIENTS)
            losses.append(total)
        opt.step()
    return stage, losses


def train_reference(args):
    stage0, stage1 = make_stages()
    model = torch.nn.Sequential(stage0, stage1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        x, y = batch(step, args.batch)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return (stage0, stage1), losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--check", action="store_true",
                        help="compare with the model trained in one process; exit 1 on a difference")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()
    for name in ("steps", "batch", "micro"):
        if getattr(args, name) < 1:
            parser.error("--%s must be at least 1" % name)
    if args.micro > args.batch:
        parser.error("--micro (%d) must be at most --batch (%d)" % (args.micro, args.batch))
    comm = concord.init()
    if comm.size != 2:
        print("pipeline_parallel: run with 2 ranks (one per stage)", file=sys.stderr)
        return 2
    stage, losses = train_pipeline(comm, args)
    if comm.rank == 1:
        for step in range(0, args.steps, max(1, args.steps // 5)):
            print("step %3d  loss %.6f" % (step, losses[step]))
    ok = True
    if args.check:
        (ref0, ref1), ref_losses = train_reference(args)
        ref = ref0 if comm.rank == 0 else ref1
        worst = max((p - q).abs().max().item() for p, q in zip(stage.parameters(), ref.parameters()))
        if comm.rank == 1:
            worst_loss = max(abs(a - b) for a, b in zip(losses, ref_losses))
            print("pipeline_parallel: largest loss difference from one process %.2e" % worst_loss)
            ok = worst_loss <= args.tolerance
        print("pipeline_parallel: rank %d: largest weight difference from one process %.2e"
              % (comm.rank, worst))
        ok = ok and worst <= args.tolerance
        print("pipeline_parallel: rank %d: %s" % (comm.rank, "MATCH" if ok else "DIFFER"))
    concord.finalize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
