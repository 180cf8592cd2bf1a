"""DDP over a model with an Embedding(sparse=True): sparse gradients for the torch backend's and
the DDP hook's tests."""
import torch


class SparseNet(torch.nn.Module):
    """An Embedding with sparse=True (sparse COO gradients) under a dense layer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 3, sparse=True)
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, tokens):
        return self.fc(self.emb(tokens).mean(1))


def train_sparse_ddp(process_group, rank, hook=None, state=None):
    """Three SGD steps of DDP over SparseNet (every rank starts alike), each rank on its own
    batches, with `hook` registered if given. Returns the module."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(SparseNet(), process_group=process_group)
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(3):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randint(0, 20, (4, 5), generator=g), torch.randint(0, 2, (4,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.module
