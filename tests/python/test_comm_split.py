"""Sub-communicators from Python: Communicator.split and create_group against expected members and
sums, None outside, errors on every rank for a bad argument on one, and a DistributedOptimizer over
a process set equal to one process on the set's union batch. Every rank runs the same session."""
import numpy as np
import pytest

from envutil import import_torch

import concord


def members(sub, comm):
    """The parent ranks of sub's members, in sub's rank order."""
    return [int(x) for x in sub.allgather(np.array([comm.rank], dtype=np.int64), name="members")]


def test_split_orders_by_key_and_reduces_over_members(comm):
    sub = comm.split(comm.rank % 2, key=-comm.rank)
    try:
        want = [r for r in reversed(range(comm.size)) if r % 2 == comm.rank % 2]
        assert sub.size == len(want)
        assert members(sub, comm) == want
        for dtype in ["uint8", "int32", "float16", "float32", "float64"]:
            x = np.full(7, comm.rank + 1, dtype=dtype)
            out = sub.allreduce(x, name="sum." + dtype)
            assert np.all(out.astype(np.float64) == sum(r + 1 for r in want))
    finally:
        sub.finalize()


def test_send_recv_and_reducescatter_on_a_sub_communicator(comm):
    sub = comm.split(comm.rank % 2, key=-comm.rank)
    try:
        # A ring among the members, by rank in the sub-communicator.
        right, left = (sub.rank + 1) % sub.size, (sub.rank - 1) % sub.size
        if sub.size > 1:
            h = sub.send_async(np.full(5, comm.rank, dtype=np.int32), right, tag=3)
            got = sub.recv(left, tag=3)
            h.wait()
            want = [r for r in reversed(range(comm.size)) if r % 2 == comm.rank % 2][left]
            assert list(got) == [want] * 5
        x = np.arange(2 * sub.size, dtype=np.float64) + comm.rank
        mine = sub.reducescatter(x, name="rs")
        members = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
        total = np.arange(2 * sub.size, dtype=np.float64) * len(members) + sum(members)
        assert list(mine) == list(total[2 * sub.rank:2 * sub.rank + 2])
    finally:
        sub.finalize()


def test_create_group_and_undefined(comm):
    ranks = list(reversed(range(comm.size)))[: max(1, comm.size - 1)]
    sub = comm.create_group(ranks)
    assert (sub is None) == (comm.rank not in ranks)
    if sub is not None:
        assert sub.rank == ranks.index(comm.rank)
        assert members(sub, comm) == ranks
        sub.finalize()
    none = comm.split(concord.UNDEFINED if comm.rank == 0 else 1)
    assert (none is None) == (comm.rank == 0)
    if none is not None:
        none.finalize()


def test_bad_color_on_one_rank_fails_every_rank(comm):
    culprit = comm.size - 1
    with pytest.raises(concord.InvalidArgumentError) as e:
        comm.split(-5 if comm.rank == culprit else 0)
    if comm.rank != culprit:
        assert "parent rank %d" % culprit in str(e.value)
    else:
        assert "color -5" in str(e.value)
    assert comm.allreduce(np.ones(3, dtype=np.float32), name="after.bad")[0] == comm.size


def test_distributed_optimizer_over_a_process_set(comm):
    torch = import_torch()
    import concord.torch as ct
    pairs = comm.split(comm.rank // 2)  # {0, 1}, {2, 3}: each pair trains its own replica
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        reference = torch.nn.Linear(4, 1)
        reference.load_state_dict(model.state_dict())
        opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(),
                                      process_set=pairs)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + comm.rank // 2)  # one data stream per pair
        for _ in range(5):
            x = torch.randn(2 * pairs.size, 4, generator=gen)
            y = torch.randn(2 * pairs.size, 1, generator=gen)
            mine = slice(2 * pairs.rank, 2 * pairs.rank + 2)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
            opt.step()
            ref_opt.zero_grad()
            torch.nn.functional.mse_loss(reference(x), y).backward()
            ref_opt.step()
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.allclose(p, q, atol=1e-6), (p, q)
    finally:
        pairs.finalize()
