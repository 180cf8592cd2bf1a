"""PyTorch integration: data-parallel training over N ranks ends with the same parameters, to float
tolerance, as one process training on the union of the ranks' batches (plain steps, gradient
accumulation over backward_passes_per_step, gradient_predivide_factor); broadcast_parameters and
broadcast_optimizer_state make every rank equal to the root; broadcast_object and
allgather_object carry tensors; sparse gradients (an Embedding's), allgathered or made dense,
equal the single process too. Also: a channels_last model, step() after synchronize() (reduced
once) and skip_synchronize(), zero_grad() between accumulated passes, and a new wrapper over the
same parameters."""

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


def train_distributed(comm, model, passes, predivide=1.0):
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                      named_parameters=model.named_parameters(),
                                      backward_passes_per_step=passes, comm=comm,
                                      gradient_predivide_factor=predivide)
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


@pytest.mark.parametrize("passes,predivide", [(1, 1.0), (2, 1.0), (2, 4.0)])
def test_data_parallel_equals_single_process_on_union(comm, passes, predivide):
    model = make_model(seed=1 + comm.rank)  # different on every rank until broadcast
    ctorch.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
    reference = make_model(seed=1)  # rank 0's initial parameters
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    train_reference(reference, comm.size, passes)
    train_distributed(comm, model, passes, predivide)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    # Replicas are identical bit for bit: compare with rank 0's copy.
    for name, p in model.named_parameters():
        root = comm.broadcast(p.detach(), root=0, name="check." + name)
        assert torch.equal(root, p.detach()), name


class SparseNet(torch.nn.Module):
    """An Embedding with sparse=True (sparse COO gradients) under a dense layer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 4, sparse=True)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, tokens, use_embedding=True):
        features = self.emb(tokens).mean(1) if use_embedding else torch.ones(len(tokens), 4)
        return self.fc(features)


def token_batch(step, size):
    g = torch.Generator().manual_seed(2000 + step)
    return (torch.randint(0, 50, (size * PER_RANK, 5), generator=g),
            torch.randint(0, 3, (size * PER_RANK,), generator=g))


@pytest.mark.parametrize("sparse_as_dense,passes", [(False, 1), (True, 1), (False, 2)])
def test_sparse_gradients_equal_single_process_on_union(comm, sparse_as_dense, passes):
    torch.manual_seed(5)
    reference = SparseNet()
    torch.manual_seed(5)
    model = SparseNet()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                      named_parameters=model.named_parameters(), comm=comm,
                                      sparse_as_dense=sparse_as_dense,
                                      backward_passes_per_step=passes)
    mine = slice(comm.rank * PER_RANK, (comm.rank + 1) * PER_RANK)
    micro = PER_RANK // passes
    for step in range(STEPS + 1):
        # In the last step rank 0 leaves the embedding out: it has no gradient there, and sends
        # an empty sparse one (its gradients of it came sparse before).
        skip = step == STEPS
        x, y = token_batch(step, comm.size)
        ref_opt.zero_grad()
        per_rank = [torch.nn.functional.cross_entropy(
            reference(x[r * PER_RANK:(r + 1) * PER_RANK], use_embedding=not (skip and r == 0)),
            y[r * PER_RANK:(r + 1) * PER_RANK]) for r in range(comm.size)]
        (sum(per_rank) / comm.size).backward()
        ref_opt.step()
        opt.zero_grad()
        use = not (skip and comm.rank == 0)
        xs, ys = x[mine], y[mine]
        for k in range(passes):  # sparse gradients accumulate over the micro-batches
            part = slice(k * micro, (k + 1) * micro)
            torch.nn.functional.cross_entropy(model(xs[part], use_embedding=use),
                                              ys[part]).backward()
        opt.step()
        layout = model.emb.weight.grad.layout
        assert layout == (torch.strided if sparse_as_dense else torch.sparse_coo), layout
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_sparse_gradients_take_sum_and_average_only(comm):
    model = SparseNet()
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(), comm=comm,
                                      op="max")
    x, y = token_batch(0, 1)
    with pytest.raises(concord.InvalidArgumentError,
                       match=r"grad\.emb\.weight is sparse: sparse gradients are allgathered, so "
                             r"they are summed or averaged only, not reduced by op 'max'"):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    opt._concord_handles.clear()  # the dense gradient's allreduce goes on without it


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


def test_broadcast_and_allgather_objects_carry_tensors(comm):
    sent = {"epoch": 3, "weights": torch.arange(6.0).reshape(2, 3)}
    got = ctorch.broadcast_object(sent if comm.rank == 0 else None, root_rank=0, comm=comm,
                                  name="resume")
    assert got["epoch"] == 3 and torch.equal(got["weights"], sent["weights"])
    gathered = ctorch.allgather_object(torch.full((comm.rank + 1,), float(comm.rank)), comm=comm)
    assert [t.tolist() for t in gathered] == [[float(r)] * (r + 1) for r in range(comm.size)]


def test_gradient_predivide_factor_is_checked(comm):
    model = make_model(seed=2)
    for factor in (0, -1, float("nan"), float("inf")):
        with pytest.raises(concord.InvalidArgumentError, match="positive finite"):
            ctorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm,
                                        gradient_predivide_factor=factor)
    with pytest.raises(concord.InvalidArgumentError, match="op \"average\" only.*'sum'"):
        ctorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm,
                                    op="sum", gradient_predivide_factor=2.0)


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


def make_cnn(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 3),
                               torch.nn.Flatten(), torch.nn.Linear(2, 3))


def test_channels_last_model_equals_single_process(comm):
    """A channels_last model (conv weights and their gradients are not contiguous) is
    broadcast and trained as any other: the gradients are reduced through contiguous copies.
    Both used to raise "not contiguous"."""
    model = make_cnn(seed=11 + comm.rank).to(memory_format=torch.channels_last)
    assert not model[0].weight.is_contiguous()
    ctorch.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
    reference = make_cnn(seed=11).to(memory_format=torch.channels_last)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(), comm=comm)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        g = torch.Generator().manual_seed(2000 + step)
        x = torch.randn(comm.size * 2, 3, 5, 5, generator=g).to(
            memory_format=torch.channels_last)
        y = torch.randint(0, 3, (comm.size * 2,), generator=g)
        ref_opt.zero_grad()
        loss_of(reference, x, y).backward()
        ref_opt.step()
        opt.zero_grad()
        mine = slice(comm.rank * 2, comm.rank * 2 + 2)
        loss_of(model, x[mine], y[mine]).backward()
        assert not model[0].weight.grad.is_contiguous()
        opt.step()
        assert model[0].weight.grad.is_contiguous(memory_format=torch.channels_last)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_broadcast_parameters_takes_bare_tensors_and_names_what_is_not_one(comm):
    model = make_model(seed=20 + comm.rank)
    ctorch.broadcast_parameters(model.parameters(), root_rank=0, comm=comm)  # Horovod takes it
    for p, q in zip(model.parameters(), make_model(seed=20).parameters()):
        assert torch.equal(p, q)
    with pytest.raises(concord.InvalidArgumentError, match="'extra' is a int, not a tensor"):
        ctorch.broadcast_parameters({"extra": 3}, comm=comm)


def sum_of_ranks(comm):
    return comm.size * (comm.size + 1) / 2


def scaled_linear(comm):
    """A 1x2 linear layer at zero whose gradient on rank r is r + 1 per pass (loss (r+1) w.1)."""
    layer = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.zero_()
    return layer, lambda: (layer(torch.ones(1, 2)) * (comm.rank + 1)).sum().backward()


@pytest.mark.parametrize("passes,op", [(1, "sum"), (2, "average")])
def test_step_after_synchronize_reduces_once(comm, passes, op):
    """synchronize(), read or clip the gradients, step(): as Horovod's skip_synchronize() pattern.
    step() used to reduce the reduced gradients again (a sum times the ranks; an average divided
    by backward_passes_per_step again)."""
    layer, backward = scaled_linear(comm)
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=1.0), op=op,
                                      backward_passes_per_step=passes,
                                      named_parameters=layer.named_parameters(), comm=comm)
    want = sum_of_ranks(comm) / (comm.size if op == "average" else 1)
    for step in range(2):
        opt.zero_grad()
        for _ in range(passes):
            backward()
        opt.synchronize()
        torch.testing.assert_close(layer.weight.grad, torch.full((1, 2), want))
        if step == 0:
            opt.step()
        else:
            with opt.skip_synchronize():  # Horovod's spelling of the same
                opt.step()
        torch.testing.assert_close(layer.weight.detach(), torch.full((1, 2), -want * (step + 1)))
    # A backward pass after synchronize() makes new gradients: step() reduces those.
    opt.zero_grad()
    opt.synchronize()
    backward()
    opt.step()
    torch.testing.assert_close(layer.weight.grad, torch.full((1, 2), want / passes))


def test_skip_synchronize_refuses_a_step_with_allreduces_in_flight(comm):
    layer, backward = scaled_linear(comm)
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=1.0), comm=comm,
                                      named_parameters=layer.named_parameters())
    backward()
    with pytest.raises(concord.InvalidArgumentError, match="in flight"):
        with opt.skip_synchronize():
            opt.step()
    opt.step()
    torch.testing.assert_close(layer.weight.detach(),
                               torch.full((1, 2), -sum_of_ranks(comm) / comm.size))


def test_zero_grad_restarts_gradient_accumulation(comm):
    """zero_grad() between the backward passes of one step discards them: the count toward
    backward_passes_per_step starts again. It used to go on, so the next pass was taken as the
    last one (and a pass after it refused as computed again before step())."""
    layer, backward = scaled_linear(comm)
    opt = ctorch.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=1.0), comm=comm,
                                      backward_passes_per_step=2,
                                      named_parameters=layer.named_parameters())
    backward()
    opt.zero_grad()  # that pass is thrown away
    backward()
    assert not opt._concord_handles  # one pass of two: nothing enqueued yet
    backward()
    assert len(opt._concord_handles) == 1
    opt.step()
    # Two passes of r + 1 each, averaged over the passes and the ranks.
    torch.testing.assert_close(layer.weight.grad,
                               torch.full((1, 2), sum_of_ranks(comm) / comm.size))


def test_a_new_wrapper_over_the_same_parameters_takes_them_over(comm):
    """Wrapping a new optimizer over a model's parameters (a new phase, a new learning rate):
    the new one reduces them, the old one's hooks go (they used to enqueue every gradient a
    second time: "already in flight"), and the old one, dropped, is freed (its hooks held it)."""
    import gc
    import weakref
    layer, backward = scaled_linear(comm)
    names = list(layer.named_parameters())
    first = ctorch.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=1.0),
                                        named_parameters=names, comm=comm)
    backward()
    first.step()
    first.zero_grad()
    second = ctorch.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.5),
                                         named_parameters=names, comm=comm)
    backward()
    second.step()
    mean = sum_of_ranks(comm) / comm.size
    torch.testing.assert_close(layer.weight.detach(), torch.full((1, 2), -1.5 * mean))
    with pytest.raises(concord.InvalidArgumentError, match="newer DistributedOptimizer"):
        first.step()
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None
    second.zero_grad()
    backward()
    second.step()  # the old one's hooks are gone
    torch.testing.assert_close(layer.weight.detach(), torch.full((1, 2), -2.0 * mean))
