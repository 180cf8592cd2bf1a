"""Point to point through the binding, at 2 ranks or more: a ring of every dtype through numpy and
torch (sizes 0, 1, 7, 4099), into out=, like= and the sender's own dtype and shape; FIFO on one
tag; a shape mismatch (ConcordError MISMATCH naming both, the next message intact); bad
arguments refused at once."""
import numpy as np
import pytest

from envutil import import_torch

import concord

NP_DTYPES = ["uint8", "int8", "int32", "int64", "float16", "float32", "float64"]
SIZES = [0, 1, 7, 4099]


@pytest.fixture(autouse=True)
def two_ranks_or_more(comm):
    if comm.size < 2:
        pytest.skip("point to point needs 2 ranks or more")


def values(n, rank, salt):
    return (np.arange(n) * 7 + rank * 13 + salt) % 101


def test_ring_numpy_every_dtype_and_size(comm):
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    salt = 0
    for dtype in NP_DTYPES:
        for n in SIZES:
            salt += 1
            x = values(n, comm.rank, salt).astype(dtype).reshape(n, 1)
            mode = salt % 3
            if mode == 0:
                h = comm.recv_async(prev, tag=salt, out=np.empty_like(x))
            elif mode == 1:
                h = comm.recv_async(prev, tag=salt, like=x)
            else:
                h = comm.recv_async(prev, tag=salt)
            comm.send(x, nxt, tag=salt)
            got = h.wait()
            assert got.dtype == np.dtype(dtype) and got.shape == (n, 1), (dtype, n, mode)
            np.testing.assert_array_equal(got, values(n, prev, salt).astype(dtype).reshape(n, 1))


def test_ring_torch_with_bfloat16(comm):
    torch = import_torch()
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for salt, dtype in enumerate([torch.bfloat16, torch.float32, torch.int64]):
        x = torch.from_numpy(values(4099, comm.rank, salt).astype(np.float64)).to(dtype)
        h = comm.recv_async(prev, tag=100 + salt, like=x)
        concord.send(x, nxt, tag=100 + salt)
        got = h.wait()
        assert isinstance(got, torch.Tensor) and got.dtype == dtype
        want = torch.from_numpy(values(4099, prev, salt).astype(np.float64)).to(dtype)
        assert torch.equal(got, want)


def test_fifo_and_mismatch_keep_the_stream(comm):
    if comm.rank == 0:
        for j in range(20):
            comm.send_async(np.full(3, j, np.int64), 1, tag=5)
        comm.send(np.zeros((2, 3), np.float32), 1, tag=6)
        comm.send(np.arange(6, dtype=np.float32), 1, tag=6)
    elif comm.rank == 1:
        handles = [comm.recv_async(0, tag=5, like=np.empty(3, np.int64)) for _ in range(20)]
        for j, h in enumerate(handles):
            assert h.wait().tolist() == [j, j, j]
        with pytest.raises(concord.ConcordError) as e:
            comm.recv(0, tag=6, like=np.empty(6, np.float32))
        assert e.value.status == concord.Status.ERR_MISMATCH
        assert "float32 [2, 3]" in str(e.value) and "float32 [6]" in str(e.value)
        np.testing.assert_array_equal(comm.recv(0, tag=6), np.arange(6, dtype=np.float32))
    comm.barrier()


def test_bad_arguments_are_refused_at_once(comm):
    x = np.ones(4, np.float32)
    with pytest.raises(concord.InvalidArgumentError, match="not a rank"):
        comm.send(x, comm.size, tag=0)
    with pytest.raises(concord.InvalidArgumentError, match="this rank"):
        comm.recv_async(comm.rank, tag=0)
    with pytest.raises(concord.InvalidArgumentError, match="negative"):
        comm.send(x, (comm.rank + 1) % comm.size, tag=-1)
