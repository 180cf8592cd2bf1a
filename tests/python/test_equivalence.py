"""PyTorch integration: data-parallel training over N ranks ends with the same parameters, to float
tolerance, as one process training on the union of the ranks' batches (plain steps, and gradient
accumulation over backward_passes_per_step); broadcast_parameters and broadcast_optimizer_state
make every rank equal to the root."""

import pytest

from envutil import import_torch

torch = import_torch()
import concord  # noqa: E402
import concord.torch as ctorch  # noqa: E402

STEPS = 5
PER_RANK = 8  # samples per rank per step


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batch(step, size):
    """The global batch of one step (every rank can build it): size * PER_RANK samples."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size * PER_RANK, 10, generator=g)
    y = torch.randint(0, 3, (size * PER_RANK,), generator=g)
    return x, y


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def train_reference(model, size, passes):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, size)
        loss_of(model, x, y).backward()
        opt.step()
    return model


def train_distributed(comm, model, passes):
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                      named_parameters=model.named_parameters(),
                                      backward_passes_per_step=passes, comm=comm)
    assert isinstance(opt, torch.optim.SGD)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, comm.size)
        mine = slice(comm.rank * PER_RANK, (comm.rank + 1) * PER_RANK)
        xs, ys = x[mine], y[mine]
        micro = PER_RANK // passes
        for k in range(passes):  # each micro-batch's mean loss; their gradients accumulate
            part = slice(k * micro, (k + 1) * micro)
            loss_of(model, xs[part], ys[part]).backward()
            # The hooks enqueued every gradient during the last backward pass, none before it.
            expected = len(list(model.parameters())) if k == passes - 1 else 0
            assert len(opt._concord_handles) == expected
        opt.step()
        assert not opt._concord_handles
    return model


@pytest.mark.parametrize("passes", [1, 2])
def test_data_parallel_equals_single_process_on_union(comm, passes):
    model = make_model(seed=1 + comm.rank)  # different on every rank until broadcast
    ctorch.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
    reference = make_model(seed=1)  # rank 0's initial parameters
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    train_reference(reference, comm.size, passes)
    train_distributed(comm, model, passes)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    # Replicas are identical bit for bit: compare with rank 0's copy.
    for name, p in model.named_parameters():
        root = comm.broadcast(p.detach(), root=0, name="check." + name)
        assert torch.equal(root, p.detach()), name


def test_broadcast_parameters_sends_bool_and_integer_buffers(comm):
    # A state_dict holds more than float parameters: a bool mask, BatchNorm's int64 counter.
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    model.register_buffer("mask", torch.tensor([comm.rank == 0, True, comm.rank != 0]))
    with torch.no_grad():
        model[1].num_batches_tracked.fill_(7 + comm.rank)
        model[0].weight.fill_(comm.rank)
    ctorch.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
    assert model.mask.dtype == torch.bool
    assert model.mask.tolist() == [True, True, False]
    assert int(model[1].num_batches_tracked) == 7
    assert torch.equal(model[0].weight, torch.zeros(2, 3))


def test_broadcast_optimizer_state(comm):
    model = make_model(seed=7)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (comm.rank + 1))
    if comm.rank == 0:  # only the root has moments and a step count
        x, y = batch(0, 1)
        loss_of(model, x, y).backward()
        opt.step()
    ctorch.broadcast_optimizer_state(opt, root_rank=0, comm=comm)
    assert opt.param_groups[0]["lr"] == 0.01
    for p in model.parameters():
        moment = opt.state[p]["exp_avg"]
        assert torch.equal(comm.broadcast(moment, root=0, name="moment"), moment)


def test_optimizer_misuse_is_refused(comm):
    model = make_model(seed=3)
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm)
    opt.step()  # no gradients anywhere: zeros are reduced (as Horovod), SGD leaves p alone
    x, y = batch(0, 1)
    loss_of(model, x, y).backward()
    with pytest.raises(concord.InvalidArgumentError, match="in flight"):
        opt.zero_grad()  # the engine is still writing into the gradients
    with pytest.raises(RuntimeError, match="computed again before step"):
        loss_of(model, x, y).backward()  # a second pass without backward_passes_per_step=2
    opt.step()
    # Refused before anything was added: every rank had the same model and batch, so each
    # gradient is the one a local backward pass gives.
    reference = make_model(seed=3)
    loss_of(reference, x, y).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
    opt.zero_grad()
    if not concord.compression_supported():
        with pytest.raises(concord.UnavailableError, match="compression"):
            ctorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        compression="fp16", comm=comm)


def test_parameter_without_gradient_on_some_ranks(comm):
    """A parameter that takes no part in some ranks' forward pass (a branch only rank 0 takes)
    gets zeros there, reduced with the others' gradients, as Horovod's: every rank steps (the
    others waited in step() for a gradient these ranks never submitted), and every rank gets the
    same average."""
    torch.manual_seed(5)
    a, b = torch.nn.Linear(2, 1, bias=False), torch.nn.Linear(2, 1, bias=False)
    opt = ctorch.DistributedOptimizer(
        torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1),
        named_parameters=[("a", a.weight), ("b", b.weight)], comm=comm)
    before = b.weight.detach().clone()
    for step in range(2):
        opt.zero_grad(set_to_none=True)
        x = torch.ones(1, 2)
        loss = a(x).sum() + (b(x).sum() if comm.rank == 0 else 0)
        loss.backward()
        assert (b.weight.grad is None) == (comm.rank != 0)
        opt.step()
        torch.testing.assert_close(b.weight.grad, torch.full((1, 2), 1.0 / comm.size))
        torch.testing.assert_close(a.weight.grad, torch.ones(1, 2))
    torch.testing.assert_close(b.weight.detach(), before - 2 * 0.1 / comm.size)
    for name, p in (("a", a.weight), ("b", b.weight)):
        root = comm.broadcast(p.detach(), root=0, name="unused.check." + name)
        assert torch.equal(root, p.detach()), name


def test_sparse_gradient_is_refused_naming_it(comm):
    """An Embedding with sparse=True gives a sparse gradient, which Concord cannot reduce: the
    backward pass raises InvalidArgumentError naming the gradient and its layout."""
    emb = torch.nn.Embedding(4, 2, sparse=True)
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                      named_parameters=emb.named_parameters(), comm=comm)
    with pytest.raises(concord.InvalidArgumentError,
                       match="the gradient grad.weight is a torch.sparse_coo tensor"):
        emb(torch.tensor([1, 2])).sum().backward()
    assert not opt._concord_handles
