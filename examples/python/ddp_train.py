"""A DDP training script as torch.distributed users write it: env:// rendezvous (torchrun's or
concordrun's variables), DistributedDataParallel, SGD. Over Concord it differs from its gloo
version by one import and the backend's name:

    build/tools/concordrun -np 2 /usr/bin/python3 examples/python/ddp_train.py --backend concord
    torchrun --nproc-per-node 2 examples/python/ddp_train.py --backend concord    # torch 2.x

--model cnn (a small CNN) or resnet18 (torchvision's, 10 classes), random data (each rank its own
batch, the same on every run); --save PATH: rank 0 saves the trained state_dict there.
"""
import argparse

import torch
import torch.distributed as dist

import concord.torch  # noqa: F401  (registers the backend "concord")


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv1(x)))
        return self.fc(torch.relu(self.conv2(x)).flatten(1))


def build(name):
    torch.manual_seed(0)
    if name == "cnn":
        return SmallCNN()
    import torchvision
    return torchvision.models.resnet18(num_classes=10)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="concord")
    parser.add_argument("--model", choices=["cnn", "resnet18"], default="cnn")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--save")
    args = parser.parse_args()
    torch.set_num_threads(1)

    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(build(args.model))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 16, 16, generator=data)
        y = torch.randint(0, 10, (args.batch,), generator=data)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if rank == 0:
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
    if rank == 0 and args.save:
        torch.save(model.module.state_dict(), args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
