"""The torch.distributed backend "concord" (concord/torch_backend.py), torch's own test patterns:
every ReduceOp Concord has over every dtype at sizes 0, 1, odd and larger; all_gather (and
_into_tensor), broadcast from every root, reduce (every op, dtype, size, root) and gather (and
gather_object) to every root, scatter (every dtype, root and size; and scatter_object_list),
reduce_scatter (and _tensor), all_to_all (and _single, uneven), send/recv, barrier; async works
and their futures; a shape that differs between ranks, a scatter_list that does not match the
output and an unsupported op fail with errors naming them; a CUDA tensor (a stand-in that says it
is on cuda:0; torch built with CUDA) refused by the backend and the DDP hook, naming it; a group
whose rank 0 serves Concord's store (as under torchrun); "cpu:concord" and a device-mapped string
it cannot honour (torch 2.x); non-contiguous tensors filled in place; a recv of another shape;
output lists of another size refused at the call; a forked child refused the parent's group and
works; destroy_process_group finalizing a group's communicator; new_group's timeout= bounding a
recv; finished operations' requests and tensors freed without a later submission; DDP
training of a small CNN on "concord" equals the same on "gloo" to 1e-5; all_reduce of sparse
tensors (one or every dimension sparse, one rank's empty) sums as gloo's (shapes or dtypes that
differ between ranks fail on every rank), and DDP with an
Embedding's sparse gradients equals gloo's to 1e-6.
Run on 2 and 3 ranks under concordrun (its CONCORD_STORE; torch's store is a FileStore), its
scatter cases alone on 1 and 4, and by torch2_test.sh on 2 ranks under torch 2.x's torchrun,
where the group is made exactly as a torchrun script makes it: init_process_group("concord"),
rendezvous from torchrun's variables."""
import os

import pytest

from envutil import import_torch

torch = import_torch()
import torch.distributed as dist  # noqa: E402

import concord.torch  # noqa: E402,F401  (registers the backend)
from fake_cuda import FakeBucket, fake_cuda_tensor, no_gpu_backend  # noqa: E402
from sparse_ddp import train_sparse_ddp  # noqa: E402

TORCHRUN = "CONCORD_RANK" not in os.environ  # else concordrun's
RANK = int(os.environ["RANK" if TORCHRUN else "CONCORD_RANK"])
SIZE = int(os.environ["WORLD_SIZE" if TORCHRUN else "CONCORD_SIZE"])
# torch >= 2.0 maps devices to backends ("cpu:gloo,cuda:nccl"); 1.13 has one backend per group.
DEVICE_STRINGS = hasattr(dist.Backend, "backend_capability")
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16]
SIZES = [0, 1, 7, 4099]
OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]


@pytest.fixture(scope="module", autouse=True)
def group():
    if TORCHRUN:
        dist.init_process_group("concord")
    else:
        path = "/tmp/concord-torch-test-%s" % os.environ["CONCORD_JOB_ID"]
        dist.init_process_group("concord", rank=RANK, world_size=SIZE,
                                store=dist.FileStore(path, SIZE))
    yield
    dist.destroy_process_group()


def values(rank, n, dtype):
    """Rank `rank`'s input: small integers (exact in every dtype, products included)."""
    return (torch.arange(n, dtype=torch.float64) % 3 + rank + 1).to(dtype)


def expected(op, n, dtype):
    every = torch.stack([values(r, n, torch.float64) for r in range(SIZE)])
    out = {"SUM": every.sum(0), "AVG": every.sum(0) / SIZE, "MIN": every.min(0).values,
           "MAX": every.max(0).values, "PRODUCT": every.prod(0)}[op]
    if not dtype.is_floating_point:
        out = out.trunc()  # Concord's integer average truncates
    return out.to(dtype)


def close(a, b, dtype):
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.allclose(a.double(), b.double(), rtol=tol, atol=tol), (a, b)


def test_backend_name():
    assert dist.get_backend() == "concord"
    assert dist.get_rank() == RANK and dist.get_world_size() == SIZE


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_reduce_every_op_dtype_size(dtype):
    for op in OPS:
        for n in SIZES:
            t = values(RANK, n, dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            close(t, expected(op, n, dtype), dtype)


def test_all_reduce_async_work_and_future():
    ts = [values(RANK, n, torch.float32) for n in SIZES]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    chained = works[-1].get_future().then(lambda f: f.value()[0] * 2)
    for w, t, n in zip(works, ts, SIZES):
        assert w.wait() is True and w.is_completed()
        close(t, expected("SUM", n, torch.float32), torch.float32)
        value = w.get_future().wait()
        assert isinstance(value, list) and value[0] is t
    close(chained.wait(), 2 * expected("SUM", SIZES[-1], torch.float32), torch.float32)


def test_ctrl_c_ends_a_work_wait_and_the_work_goes_on():
    """SIGINT (Ctrl-C) while Work.wait() waits for an allreduce the other ranks submit only 3 s
    later raises KeyboardInterrupt at once (torch's Future.wait() could not be interrupted: the
    wait ended with the work); the work goes on and a later wait completes it. Failures are
    checked once every rank is past the work, so that none hangs the others."""
    import threading
    import time
    from sigintutil import interrupted_wait
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run on the main thread")
    t = values(RANK, 5, torch.float32)
    seen = []
    if RANK != 0:
        time.sleep(3)
    work = dist.all_reduce(t, async_op=True)
    if RANK == 0 and SIZE > 1:
        seen += interrupted_wait(work.wait, within_s=2.0)
        if work.is_completed():
            seen.append("the allreduce finished before the others submitted it")
    assert work.wait() is True
    close(t, expected("SUM", 5, torch.float32), torch.float32)
    assert not seen


def test_work_wait_with_a_timeout_raises_and_the_work_goes_on():
    import datetime
    import time
    t = values(RANK, 5, torch.float32)
    if RANK != 0:
        time.sleep(0.5)  # rank 0's limit passes first
    work = dist.all_reduce(t, async_op=True)
    if RANK == 0:
        with pytest.raises(concord.WaitTimeoutError):
            work.wait(timeout=datetime.timedelta(milliseconds=100))
    assert work.wait(timeout=datetime.timedelta(seconds=30)) is True
    close(t, expected("SUM", 5, torch.float32), torch.float32)


def test_all_gather_and_into_tensor():
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        for n in (0, 1, 5):
            x = values(RANK, n, dtype).reshape(n, 1)
            outs = [torch.empty(n, 1, dtype=dtype) for _ in range(SIZE)]
            dist.all_gather(outs, x)
            for r in range(SIZE):
                close(outs[r], values(r, n, dtype).reshape(n, 1), dtype)
            flat = torch.empty(SIZE * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, x.reshape(n))
            close(flat, torch.cat([values(r, n, dtype) for r in range(SIZE)]), dtype)
    scalar = torch.empty(SIZE)
    dist.all_gather_into_tensor(scalar, torch.tensor(float(RANK)))
    close(scalar, torch.arange(float(SIZE)), torch.float32)


def test_broadcast_from_every_root_and_reduce():
    for root in range(SIZE):
        for n in SIZES:
            t = values(RANK, n, torch.float64)
            work = dist.broadcast(t, src=root, async_op=True)
            work.wait()
            close(t, values(root, n, torch.float64), torch.float64)
        t = values(RANK, 7, torch.int32)
        dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
        close(t, expected("MAX", 7, torch.int32) if RANK == root else values(RANK, 7, torch.int32),
              torch.int32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_every_op_dtype_size_and_root(dtype):
    """Concord's reduce: the root's tensor gets the result, the others' are left alone."""
    for op in OPS:
        for n in SIZES:
            root = (n + OPS.index(op)) % SIZE
            t = values(RANK, n, dtype)
            work = dist.reduce(t, dst=root, op=getattr(dist.ReduceOp, op), async_op=True)
            assert work.wait() is True
            close(t, expected(op, n, dtype) if RANK == root else values(RANK, n, dtype), dtype)


def test_gather_to_every_root():
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        for root in range(SIZE):
            for n in (0, 1, 4099):
                x = values(RANK, n, dtype).reshape(n, 1)
                outs = [torch.full((n, 1), -1, dtype=dtype) for _ in range(SIZE)]
                work = dist.gather(x, outs if RANK == root else None, dst=root, async_op=True)
                assert work.wait() is True
                for r in range(SIZE):
                    close(outs[r], values(r, n, dtype).reshape(n, 1) if RANK == root
                          else torch.full((n, 1), -1, dtype=dtype), dtype)
    # torch.distributed.gather_object is gather over pickled bytes.
    objects = [None] * SIZE if RANK == 0 else None
    dist.gather_object({"rank": RANK, "pad": "x" * RANK}, objects, dst=0)
    if RANK == 0:
        assert objects == [{"rank": r, "pad": "x" * r} for r in range(SIZE)]



SCATTER_DTYPES = DTYPES + [torch.int8, torch.uint8, torch.bool]


def piece(root, rank, shape, dtype):
    """What root's scatter_list[rank] holds: small integers (exact in every dtype; for bool
    their parity), different for every root and destination."""
    n = 1
    for d in shape:
        n *= d
    x = torch.arange(n, dtype=torch.int64) % 3 + 4 * root + rank + 1
    return (x % 2 == 0 if dtype == torch.bool else x.to(dtype)).reshape(shape)


def scattered(shape, dtype, root, async_op, contiguous=True):
    """dist.scatter from root of pieces of `shape` into an output filled with a marker; returns
    the output."""
    out = torch.full(shape[::-1] if not contiguous else shape, 9, dtype=dtype)
    if not contiguous:
        out = out.t()
        assert not out.is_contiguous() or out.numel() <= 1
    pieces = [piece(root, r, shape, dtype) for r in range(SIZE)] if RANK == root else None
    work = dist.scatter(out, pieces, src=root, async_op=async_op)
    if async_op:
        value = work.get_future().wait() if root % 2 else None
        assert work.wait() is True and work.is_completed()
        assert value is None or value[0] is out  # the future holds the output, as gloo's
    else:
        assert work is None
    return out


@pytest.mark.parametrize("dtype", SCATTER_DTYPES, ids=str)
def test_scatter_every_dtype_root_size(dtype):
    """torch's scatter (on Concord's all-to-all): every rank's output receives the root's
    scatter_list[rank], from every root, at sizes 0, 1, odd and larger, 2-d, blocking and
    async (wait() and the future), and into a transposed output."""
    for root in range(SIZE):
        for i, shape in enumerate([(0,), (1,), (7,), (4099,), (2, 3)]):
            out = scattered(shape, dtype, root, async_op=bool((root + i) % 2))
            assert torch.equal(out, piece(root, RANK, shape, dtype)), (root, shape, out)
        out = scattered((3, 2), dtype, root, async_op=False, contiguous=False)
        assert torch.equal(out, piece(root, RANK, (3, 2), dtype))


def test_scatter_object_list():
    """torch's scatter_object_list: a broadcast of the largest size, then two scatters."""
    for root in range(SIZE):
        objects = [{"to": r, "from": root, "pad": "x" * (3 * r)} for r in range(SIZE)]
        got = [None]
        dist.scatter_object_list(got, objects if RANK == root else None, src=root)
        assert got[0] == objects[RANK]


def test_scatter_shapes_that_do_not_match_are_named():
    # The root refuses a scatter_list of another shape, dtype or length before sending (the
    # others need not call).
    if RANK == 0:
        bad = [torch.ones(4) for _ in range(SIZE)]
        bad[-1] = torch.ones(2, 2)
        with pytest.raises(concord.InvalidArgumentError, match=r"scatter: scatter_list\[%d\] is "
                           r"torch.float32 \[2, 2\] on cpu, the output tensor torch.float32 "
                           r"\[4\] on cpu: each must have the output's shape" % (SIZE - 1)):
            dist.scatter(torch.ones(4), bad, src=0)
        group = dist.distributed_c10d._get_default_group()  # torch checks dtypes first
        opts = dist.ScatterOptions()
        opts.rootRank = 0
        bad[-1] = torch.ones(4, dtype=torch.float64)
        with pytest.raises(concord.InvalidArgumentError, match=r"scatter_list\[%d\] is "
                           r"torch.float64 \[4\] on cpu, the output tensor torch.float32"
                           % (SIZE - 1)):
            group.scatter([torch.ones(4)], [bad], opts)
        with pytest.raises(concord.InvalidArgumentError, match="scatter: expected one input list "
                           "of %d tensors on the root" % SIZE):
            group.scatter([torch.ones(4)], [[torch.ones(4)] * (SIZE + 1)], opts)
    dist.barrier()
    # A rank whose output has more elements than the root sends it fails with MISMATCH naming
    # both, one with fewer with the library's INVALID_ARGUMENT naming both sizes; the others get
    # their pieces.
    odd = SIZE - 1
    errors = {5: (concord.Status.ERR_MISMATCH, r"rank %d expected \[5(, 0)*\] elements from "
                  r"ranks 0..%d \(its output sizes\), the ranks sent it \[4(, 0)*\]" % (odd, odd)),
              3: (concord.Status.ERR_INVALID_ARGUMENT, "alltoall result needs 16 bytes, the output "
                  "buffer has 12")}
    for n, (status, message) in errors.items():
        pieces = [piece(0, r, (4,), torch.float32) for r in range(SIZE)] if RANK == 0 else None
        if RANK == odd and RANK != 0:
            with pytest.raises(concord.ConcordError, match=r"torch\.scatter\.\d+'.*" + message) \
                    as e:
                dist.scatter(torch.empty(n), pieces, src=0)
            assert e.value.status == status
        else:
            out = torch.empty(4)
            dist.scatter(out, pieces, src=0)
            assert torch.equal(out, piece(0, RANK, (4,), torch.float32))
    if SIZE > 1:  # an output of another dtype than the root's: MISMATCH on every rank
        pieces = [piece(0, r, (4,), torch.float32) for r in range(SIZE)] if RANK == 0 else None
        with pytest.raises(concord.ConcordError, match="ranks disagree on dtype: float32 on ranks? "
                           "0.*; int32 on rank %d" % odd):
            dist.scatter(torch.empty(4, dtype=torch.int32 if RANK == odd else torch.float32),
                         pieces, src=0)
    dist.all_reduce(torch.ones(3))  # the group still works

def test_reduce_scatter_and_tensor():
    for n in (0, 1, 3):
        chunks = [values(RANK + r, n, torch.float32) for r in range(SIZE)]
        out = torch.empty(n)
        dist.reduce_scatter(out, chunks, op=dist.ReduceOp.SUM)
        want = sum(values(r + RANK, n, torch.float64) for r in range(SIZE))
        close(out, want.float(), torch.float32)
        out2 = torch.empty(n)
        dist.reduce_scatter_tensor(out2, torch.cat(chunks), op=dist.ReduceOp.AVG)
        close(out2, (want / SIZE).float(), torch.float32)


def test_all_to_all_single_uneven_and_list():
    # Rank s sends r + 1 rows to rank r, each row holding 10 * s + r.
    splits = [r + 1 for r in range(SIZE)]
    x = torch.cat([torch.full((r + 1, 2), 10.0 * RANK + r) for r in range(SIZE)])
    out = torch.empty(SIZE * (RANK + 1), 2)
    dist.all_to_all_single(out, x, output_split_sizes=[RANK + 1] * SIZE,
                           input_split_sizes=splits)
    want = torch.cat([torch.full((RANK + 1, 2), 10.0 * s + RANK) for s in range(SIZE)])
    close(out, want, torch.float32)
    even = torch.arange(float(SIZE)) + 100 * RANK
    got = torch.empty(SIZE)
    dist.all_to_all_single(got, even)
    close(got, torch.tensor([100.0 * s + RANK for s in range(SIZE)]), torch.float32)
    outs = [torch.empty(3, dtype=torch.int64) for _ in range(SIZE)]
    dist.all_to_all(outs, [torch.full((3,), 10 * RANK + r) for r in range(SIZE)])
    for s in range(SIZE):
        close(outs[s], torch.full((3,), 10 * s + RANK), torch.int64)


def test_non_contiguous_outputs_are_filled():
    # As gloo does: a reshape of such an output is a copy, which the result used to go into.
    chunks = [torch.full((2, 2), float(RANK + r)) for r in range(SIZE)]
    want = sum(float(RANK + r) for r in range(SIZE))  # this rank's chunk, summed over ranks
    out = torch.full((2, 2), -1.0).t()
    assert not out.is_contiguous()
    dist.reduce_scatter_tensor(out, torch.cat([c.reshape(-1) for c in chunks]))
    close(out, torch.full((2, 2), want), torch.float32)
    out = torch.full((2, 2), -1.0).t()
    dist.reduce_scatter(out, chunks)
    close(out, torch.full((2, 2), want), torch.float32)
    base = torch.full((8,), -1.0)
    dist.reduce_scatter(base[::2], [c.reshape(-1) for c in chunks])  # a strided 1-d view
    close(base, torch.tensor([want, -1.0] * 4), torch.float32)
    out = torch.full((4, SIZE), -1.0).t()  # (SIZE, 4), non-contiguous
    dist.all_gather_into_tensor(out, torch.full((4,), float(RANK + 1)))
    close(out, torch.arange(1.0, SIZE + 1).repeat_interleave(4).reshape(SIZE, 4), torch.float32)
    out = torch.full((2, SIZE), -1.0).t()  # all_to_all_single: one row of 2 from each rank
    dist.all_to_all_single(out, torch.arange(2.0 * SIZE).reshape(SIZE, 2) + 100 * RANK)
    close(out, torch.stack([torch.tensor([2.0 * RANK, 2.0 * RANK + 1]) + 100 * s
                            for s in range(SIZE)]), torch.float32)


def test_non_contiguous_tensors_reduced_broadcast_sent_in_place():
    """all_reduce, reduce, broadcast, send and recv of a transposed or channels_last tensor fill
    it in place, as gloo does (they used to raise "not contiguous")."""
    base = torch.arange(6.0).reshape(2, 3)
    t = (base + RANK).t()
    assert not t.is_contiguous()
    dist.all_reduce(t)
    close(t, (base * SIZE + sum(range(SIZE))).t(), torch.float32)
    image = (torch.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5) + RANK).to(
        memory_format=torch.channels_last)
    assert not image.is_contiguous()
    work = dist.all_reduce(image, op=dist.ReduceOp.MAX, async_op=True)
    assert work.get_future().wait()[0] is image
    close(image, torch.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5) + SIZE - 1, torch.float32)
    for root in range(SIZE):
        t = torch.full((3, 2), float(RANK)).t()
        dist.broadcast(t, root)
        close(t, torch.full((2, 3), float(root)), torch.float32)
        t = torch.full((3, 2), float(RANK + 1)).t()
        dist.reduce(t, root)
        mine = sum(range(1, SIZE + 1)) if RANK == root else RANK + 1
        close(t, torch.full((2, 3), float(mine)), torch.float32)
    got = torch.full((2, 3), -1.0).t()
    assert not got.is_contiguous()
    send = dist.isend(torch.arange(6.0).reshape(2, 3).t() + RANK, (RANK + 1) % SIZE)
    dist.recv(got, (RANK - 1) % SIZE)
    send.wait()
    close(got, torch.arange(6.0).reshape(2, 3).t() + (RANK - 1) % SIZE, torch.float32)


def test_recv_takes_a_message_of_its_size_in_any_shape():
    """torch's send/recv move a run of elements: a (6,) message received into a (2, 3) tensor,
    as gloo and NCCL do (Concord's recv refused the other shape); another number of elements
    is a MISMATCH naming both."""
    got = torch.empty(2, 3)
    send = dist.isend(torch.arange(6.0) + RANK, (RANK + 1) % SIZE, tag=7)
    dist.recv(got, (RANK - 1) % SIZE, tag=7)
    send.wait()
    close(got, torch.arange(6.0).reshape(2, 3) + (RANK - 1) % SIZE, torch.float32)
    send = dist.isend(torch.arange(6.0), (RANK + 1) % SIZE, tag=8)
    with pytest.raises(concord.ConcordError, match=r"sent float32 \[6\], this recv expects "
                       r"float32 \[5\]") as e:
        dist.recv(torch.empty(5), (RANK - 1) % SIZE, tag=8)
    assert e.value.status == concord.Status.ERR_MISMATCH
    send.wait()
    dist.barrier()


def test_forked_child_refuses_the_group_and_its_works():
    """A child forked with a work of the group in flight (a DataLoader worker, os.fork): the
    work's wait() and a new collective raise ConcordError naming the parent instead of waiting
    forever for an engine that does not run in the child."""
    from forkutil import in_forked_child, refused_in_child
    t = torch.ones(3)
    work = dist.all_reduce(t, async_op=True) if RANK == 0 else None

    def child():
        failures = []
        if work is not None:
            refused_in_child(failures, "the parent's work", work.wait, concord.errors)
        refused_in_child(failures, "all_reduce", lambda: dist.all_reduce(torch.ones(2)),
                         concord.errors)
        return failures

    status, report = in_forked_child(child)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
        (status, report)
    assert report == ""
    if work is None:
        work = dist.all_reduce(t, async_op=True)
    assert work.wait()
    close(t, torch.full((3,), float(SIZE)), torch.float32)


def test_destroying_a_group_finalizes_its_communicator():
    """torch 2.x's destroy_process_group(group) calls the group's shutdown(): its Communicator
    is finalized there (it used to live on, with its threads and connections, until exit);
    torch 1.13's calls nothing, so shutdown() is called here as 2.x would."""
    sub = dist.new_group(list(range(SIZE)))
    t = torch.ones(2)
    dist.all_reduce(t, group=sub)
    close(t, torch.full((2,), float(SIZE)), torch.float32)
    comm = sub.comm
    dist.destroy_process_group(sub)
    if not hasattr(dist.ProcessGroup, "shutdown"):  # torch 1.13
        sub.shutdown()
    with pytest.raises(concord.ConcordError, match="finalized"):
        comm.barrier()
    dist.barrier()  # the default group goes on


def test_gather_outputs_of_another_size_are_refused_before_sending():
    """An all_gather or gather output list with a tensor of another number of elements is
    refused at the call, naming it (it used to fail after the operation, with torch's view
    error, some outputs already written)."""
    outputs = [torch.full((2,), -1.0) for _ in range(SIZE)]
    outputs[-1] = torch.full((3,), -1.0)
    with pytest.raises(concord.InvalidArgumentError,
                       match="all_gather: output tensor %d is torch.float32 of 3 elements, the "
                       "input torch.float32 of 2" % (SIZE - 1)):
        dist.all_gather(outputs, torch.ones(2))
    assert all(bool((o == -1).all()) for o in outputs)
    if RANK == 0:  # the root refuses before enqueuing: the others need not call
        with pytest.raises(concord.InvalidArgumentError, match="gather: output tensor"):
            dist.gather(torch.ones(2), outputs, dst=0)
    dist.barrier()


def test_all_to_all_sizes_checked_against_what_was_sent():
    # Every rank sends 2 rows to every rank; rank 0 alone claims other output_split_sizes: it
    # fails naming both, the others get their rows.
    x = torch.arange(2.0 * SIZE) + 100 * RANK
    out = torch.full((2 * SIZE,), -1.0)
    claimed = [1, 3] + [2] * (SIZE - 2) if RANK == 0 else [2] * SIZE
    if RANK == 0:
        with pytest.raises(concord.ConcordError, match=r"rank 0 expected \[1, 3%s\] rows .* "
                           r"sent it \[2, 2%s\]" % (", 2" * (SIZE - 2), ", 2" * (SIZE - 2))) as e:
            dist.all_to_all_single(out, x, output_split_sizes=claimed)
        assert e.value.status == concord.Status.ERR_MISMATCH
    else:
        dist.all_to_all_single(out, x, output_split_sizes=claimed)
        close(out, torch.cat([torch.tensor([2.0 * RANK, 2.0 * RANK + 1]) + 100 * s
                              for s in range(SIZE)]), torch.float32)
    # The even split of a larger output: 3 rows expected from each rank, 2 came (async too).
    work = dist.all_to_all_single(torch.full((3 * SIZE,), -1.0), x, async_op=True)
    with pytest.raises(concord.ConcordError, match=r"expected \[3(, 3)*\] rows"):
        work.wait()
    with pytest.raises(concord.InvalidArgumentError, match="7 rows do not divide"):
        dist.all_to_all_single(torch.empty(7 if SIZE != 7 else 8), x)
    with pytest.raises(concord.InvalidArgumentError, match="1 output_split_sizes for %d" % SIZE):
        dist.all_to_all_single(torch.empty(2 * SIZE), x, output_split_sizes=[2 * SIZE])
    # The list form: ranks 0 and 1 send 1 and 3 elements to ranks 0 and 1 (3 and 1 the other
    # way), 2 to the others; everyone expects 2 from each rank, so ranks 0 and 1 fail and their
    # outputs are left alone.
    sizes = [2] * SIZE
    if RANK < 2:
        sizes[:2] = [1, 3] if RANK == 0 else [3, 1]
    outs = [torch.full((2,), -1.0) for _ in range(SIZE)]
    ins = [torch.full((n,), 10.0 * RANK + d) for d, n in enumerate(sizes)]
    if RANK in (0, 1):
        with pytest.raises(concord.ConcordError, match=r"all_to_all .*rank %d expected \[2(, 2)*"
                           r"\] elements" % RANK):
            dist.all_to_all(outs, ins)
        assert all(torch.equal(o, torch.full((2,), -1.0)) for o in outs)
    else:
        dist.all_to_all(outs, ins)
        for s in range(SIZE):
            close(outs[s], torch.full((2,), 10.0 * s + RANK), torch.float32)
    dist.all_reduce(torch.ones(3))  # the group still works


def test_works_never_waited_for_are_let_go():
    # A work dist's functions return is the caller's: once done the group keeps nothing of it
    # (500 unwaited all_reduces held 500 works and their tensors).
    import time
    group = dist.distributed_c10d._get_default_group()
    ts = [torch.full((100,), float(RANK + i)) for i in range(50)]
    for t in ts:
        dist.all_reduce(t, async_op=True)
    for _ in range(10):
        if RANK == 0:
            dist.isend(torch.ones(4), 1 % SIZE)
        if RANK == 1 % SIZE:
            dist.irecv(torch.empty(4), 0)
    dist.barrier()
    deadline = time.monotonic() + 30
    while group._works and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not group._works
    for i, t in enumerate(ts):  # and every one of them completed
        close(t, torch.full((100,), float(sum(r + i for r in range(SIZE)))), torch.float32)



def test_finished_operations_release_their_requests_and_tensors():
    """Once an operation completed and its work was waited for (or dropped), the binding's
    request and the tensors the engine used are let go without a later submission (they waited
    for the next one, or for finalize: a job that ended its collectives and evaluated for an
    hour kept the last operations' buffers)."""
    import gc
    import time
    from concord import handle

    def unreleased(ptr):
        """Tensors on t's memory (the backend's detached views) and Handles with a request."""
        objects = gc.get_objects()
        # type(), not isinstance: that would touch torch's deprecated dist.reduce_op, warning
        return (sum(1 for o in objects if type(o) is torch.Tensor and o.data_ptr() == ptr),
                sum(1 for o in objects if type(o) is handle.Handle and
                    o._request is not None) + len(handle._ORPHANS))

    ptrs = []
    for kind in ("broadcast", "all_to_all", "scatter", "get_future", "wait"):
        t = torch.full((SIZE << 14,), float(RANK + 1))
        ptrs.append(t.data_ptr())
        if kind == "broadcast":
            dist.broadcast(t, src=0)
        elif kind == "all_to_all":  # completed on a thread of its own (it checks the sizes)
            dist.all_to_all_single(torch.empty_like(t), t)
        elif kind == "scatter":
            dist.scatter(t, [t] * SIZE if RANK == 0 else None, src=0)
        elif kind == "get_future":
            dist.all_reduce(t, async_op=True).get_future().wait()
        else:  # the last operation: nothing is submitted after it
            dist.all_reduce(t, async_op=True).wait()
        del t
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [unreleased(p) for p in ptrs]
        if all(left_ == (0, 0) for left_ in left):
            break
        time.sleep(0.05)
    assert all(left_ == (0, 0) for left_ in left), left
    dist.barrier()

def test_send_recv_ring_and_barrier():
    for dtype in (torch.float16, torch.int64):
        x = values(RANK, 9, dtype)
        got = torch.empty(9, dtype=dtype)
        send = dist.isend(x, (RANK + 1) % SIZE)
        dist.recv(got, (RANK - 1) % SIZE)
        send.wait()
        close(got, values((RANK - 1) % SIZE, 9, dtype), dtype)
    # batch_isend_irecv (pipeline code): torch 2.x asks the group for its backend first.
    y = torch.empty(3)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(RANK)), (RANK + 1) % SIZE),
           dist.P2POp(dist.irecv, y, (RANK - 1) % SIZE)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    close(y, torch.full((3,), float((RANK - 1) % SIZE)), torch.float32)
    dist.barrier()
    assert dist.barrier(async_op=True).wait()


def test_mismatched_shape_fails_naming_it():
    with pytest.raises(concord.ConcordError, match="disagree on shape"):
        dist.all_reduce(torch.ones(RANK + 1))
    work = dist.all_reduce(torch.ones(RANK + 2), async_op=True)
    with pytest.raises(concord.ConcordError, match="MISMATCH"):
        work.wait()
    dist.all_reduce(torch.ones(3))  # the group still works


def test_a_torch_without_backend_registration_is_named(monkeypatch):
    # What `import concord.torch` warns (and DistributedOptimizer still works) on a torch older
    # than 1.13, shown by taking registration away from this one.
    from concord import torch_backend
    monkeypatch.delattr(dist.Backend, "register_backend")
    monkeypatch.setattr(dist.Backend, "_plugins", {}, raising=False)
    with pytest.raises(concord.UnavailableError, match=r"torch \S+ is too old for the concord "
                       "torch.distributed backend: it lacks .*register_backend"):
        torch_backend.register()


def test_unsupported_op_and_tensor_are_named():
    for op in ("BAND", "BOR", "BXOR"):
        with pytest.raises(concord.UnavailableError, match="ReduceOp.%s is not supported" % op):
            dist.all_reduce(torch.ones(2, dtype=torch.int32), op=getattr(dist.ReduceOp, op))
    with pytest.raises(concord.InvalidArgumentError, match="dtype torch.bool"):
        dist.all_reduce(torch.ones(2, dtype=torch.bool))


@pytest.mark.skipif(torch.version.cuda is None, reason="torch %s is built without CUDA: it makes "
                    "no CUDA futures, so the backend's CUDA path cannot be entered "
                    "(tests/python/test_errors.py shows the binding's)" % torch.__version__)
def test_cuda_tensor_without_gpu_backend_is_named(monkeypatch):
    # A CPU tensor that says it is on cuda:0 enters the backend's and the hook's CUDA paths (a
    # future for cuda:0) and is refused by the library, as this group has no GPU backend: the
    # error names the tensor, its device and what is missing, and nothing is enqueued.
    if not no_gpu_backend():
        pytest.skip("CONCORD_BACKEND=%s may start a GPU backend, which would take the fake "
                    "tensor's host memory for device memory" % os.environ["CONCORD_BACKEND"])
    from concord import tensors
    from concord.torch import hooks
    monkeypatch.setattr(tensors, "cuda_stream", lambda index: 0)  # torch's default stream
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)  # recorded on it: none without a GPU
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "the default stream")
    group = dist.distributed_c10d._get_default_group()
    before = group.comm.stats()
    t = fake_cuda_tensor(torch, torch.ones(4))
    missing = r"is a CUDA tensor \(cuda:0, shape \[%s\]\): UNAVAILABLE: tensor '%s' on CUDA " \
        r"device 0: .*GPU backend"
    for call, shape, name in [(lambda: group.allreduce([t]), "4", r"torch\.allreduce\.\d+"),
                              (lambda: group.broadcast([t], dist.BroadcastOptions()), "4",
                               r"torch\.broadcast\.\d+"),
                              (lambda: group._allgather_base(
                                  fake_cuda_tensor(torch, torch.ones(4 * SIZE)), t), "1, 4",
                               r"torch\.allgather\.\d+"),
                              (lambda: hooks.allreduce_hook(prefix="cuda")(None, FakeBucket(t)),
                               "4", r"cuda\.bucket\.0\.v0")]:
        with pytest.raises(concord.UnavailableError, match=missing % (shape, name)):
            call()
    assert group.comm.stats() == before
    assert FakeEvent.recorded == 4  # the default stream's work is waited for through an event


class FakeEvent:
    """torch.cuda.Event without a GPU: counts records; its handle is never used (refused)."""
    recorded = 0
    cuda_event = 0x7000

    def record(self, stream):
        FakeEvent.recorded += 1



def test_a_timeout_of_init_process_group_bounds_a_recv(monkeypatch):
    """init_process_group's (and new_group's) timeout= is the group's communicator's timeout:
    a recv with no sender fails with TIMEOUT after about that long (it waited CONCORD_TIMEOUT_S,
    else 30 s). An explicit CONCORD_TIMEOUT_S wins over it."""
    import datetime
    import time
    from concord import torch_backend
    for env, timeout, limit in ((None, 2.0, 2.0), ("2", 60.0, 2.0)):
        if env is None:
            monkeypatch.delenv("CONCORD_TIMEOUT_S", raising=False)  # run_pytest.sh sets it
        else:
            monkeypatch.setenv("CONCORD_TIMEOUT_S", env)
        sub = dist.new_group(backend="concord", timeout=datetime.timedelta(seconds=timeout))
        if RANK == 0:
            start = time.monotonic()
            with pytest.raises(concord.ConcordError) as e:
                dist.recv(torch.empty(3), src=SIZE - 1, group=sub, tag=99)
            took = time.monotonic() - start
            assert e.value.status == concord.Status.ERR_TIMEOUT, e.value
            assert limit - 0.5 < took < limit + 5, took
        dist.barrier()
        sub.shutdown()  # torch 1.13's destroy_process_group does not (torch 2.x's would)
    # What the creator passes on: nothing for torch's default (Concord's own timeout applies)
    # or under CONCORD_TIMEOUT_S; a day at most, with a warning; nothing at or below zero.
    assert torch_backend._timeout_config(dist.default_pg_timeout) == {}
    assert torch_backend._timeout_config(datetime.timedelta(seconds=5)) == {}  # env set above
    monkeypatch.delenv("CONCORD_TIMEOUT_S")
    assert torch_backend._timeout_config(datetime.timedelta(seconds=5)) == {"timeout_s": 5.0}
    with pytest.warns(UserWarning, match="longer than Concord's longest timeout: the concord "
                      "backend uses 86400 s"):
        assert torch_backend._timeout_config(datetime.timedelta(days=2)) == {"timeout_s": 86400.0}
    with pytest.raises(concord.InvalidArgumentError, match="timeout=0:00:00: the concord backend "
                       "takes a timeout above 0"):
        torch_backend._timeout_config(datetime.timedelta(0))

def test_group_whose_rank0_serves_the_store(monkeypatch):
    # Without CONCORD_STORE (torchrun, init_method=...): rank 0 serves Concord's store on a free
    # port and the others learn it from torch's store.
    monkeypatch.delenv("CONCORD_STORE", raising=False)
    sub = dist.new_group(backend="concord")
    t = torch.full((5,), float(RANK))
    dist.all_reduce(t, group=sub)
    close(t, torch.full((5,), float(sum(range(SIZE)))), torch.float32)


@pytest.mark.skipif(not DEVICE_STRINGS, reason="torch %s has no device-mapped backend strings "
                    "(torch >= 2.0 has)" % torch.__version__)
def test_cpu_concord_string_and_a_mixed_one_refused(monkeypatch):
    monkeypatch.delenv("CONCORD_STORE", raising=False)
    sub = dist.new_group(backend="cpu:concord")
    assert isinstance(sub, concord.torch_backend.ProcessGroupConcord)
    t = torch.full((3,), float(RANK + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=sub)
    close(t, torch.full((3,), float(SIZE)), torch.float32)
    # torch would use the Python group for CUDA too: refused, naming the string, at every call.
    mixed = dist.new_group(backend="cpu:concord,cuda:gloo")
    for _ in range(2):
        with pytest.raises(concord.InvalidArgumentError, match="'cpu:concord,cuda:gloo' maps "
                           "cuda:gloo"):
            dist.all_reduce(torch.ones(2), group=mixed)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def train_ddp(process_group):
    """An unmodified DDP loop: broadcast from rank 0 at construction, gradients averaged."""
    torch.manual_seed(1 + RANK)  # ranks start different: DDP's broadcast makes them equal
    model = torch.nn.parallel.DistributedDataParallel(Net(), process_group=process_group,
                                                      bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + RANK)
    for _ in range(4):
        x, y = torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.module.state_dict().values()], \
        [p.detach().clone() for p in model.parameters()]


def test_ddp_concord_equals_gloo():
    gloo = dist.new_group(backend="gloo")
    on_gloo, _ = train_ddp(gloo)
    on_concord, params = train_ddp(None)  # the default group: concord
    assert len(on_gloo) == len(on_concord) == 9  # conv, bn (and its running stats), fc
    for a, b in zip(on_gloo, on_concord):
        assert torch.allclose(a.double(), b.double(), rtol=0, atol=1e-5), (a - b).abs().max()
    # The parameters are the same on every rank (BatchNorm's running stats are each rank's own
    # until DDP broadcasts them at the next forward).
    mine = torch.cat([p.double().flatten() for p in params])
    every = [torch.empty_like(mine) for _ in range(SIZE)]
    dist.all_gather(every, mine)
    assert all(torch.equal(e, mine) for e in every)  # and every rank has the same model
    # Every Work the group kept for torch's C++ side (DDP's reducer) was waited for and let go.
    assert not dist.distributed_c10d._get_default_group()._works


def sparse_of(rank, dtype, sparse_dims=1):
    """Rank `rank`'s sparse tensor of shape (12, 3): rows rank..rank+2 (overlapping the next
    rank's), values rank + 1; the last rank's is empty. sparse_dims=2: every dimension sparse."""
    dense = torch.zeros(12, 3, dtype=dtype)
    if rank != SIZE - 1 or SIZE == 1:
        dense[rank:rank + 3] = rank + 1
    return dense.to_sparse(sparse_dims)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
def test_all_reduce_of_a_sparse_tensor_sums_like_gloo(dtype):
    for sparse_dims in (1, 2):
        t = sparse_of(RANK, dtype, sparse_dims)
        dist.all_reduce(t)
        every = sum(sparse_of(r, torch.float64, sparse_dims).to_dense() for r in range(SIZE))
        assert t.is_sparse and t.sparse_dim() == sparse_dims
        assert torch.equal(t.to_dense().double(), every), (t.to_dense(), every)
        work = dist.all_reduce(sparse_of(RANK, dtype, sparse_dims), async_op=True)
        work.wait()
    with pytest.raises(concord.UnavailableError, match=r"sums sparse tensors only "
                       r"\(ReduceOp.SUM\), as gloo; got ReduceOp.MAX"):
        dist.all_reduce(sparse_of(RANK, dtype), op=dist.ReduceOp.MAX)


def test_sparse_tensors_that_differ_between_ranks_fail_on_every_rank():
    if SIZE == 1:
        pytest.skip("needs 2 ranks or more")
    rows = 12 if RANK == 0 else 13
    with pytest.raises(concord.InvalidArgumentError, match=r"rank 1's sparse tensor has the "
                       r"sizes \[13\] in its sparse dimensions, not \[12\]|rank 0's sparse "
                       r"tensor has the sizes \[12\] in its sparse dimensions, not \[13\]"):
        dist.all_reduce(torch.ones(rows, 2).to_sparse(1))
    dtype = torch.float32 if RANK == 0 else torch.float64
    with pytest.raises(concord.ConcordError, match="MISMATCH.*dtype"):
        dist.all_reduce(torch.ones(12, 2, dtype=dtype).to_sparse(1))
    t = sparse_of(RANK, torch.float32)  # the ranks are still in step
    dist.all_reduce(t)
    assert t.to_dense().sum() == sum(sparse_of(r, torch.float32).to_dense().sum()
                                     for r in range(SIZE))


def test_ddp_with_sparse_gradients_concord_equals_gloo():
    on_gloo = train_sparse_ddp(dist.new_group(backend="gloo"), RANK).parameters()
    on_concord = train_sparse_ddp(None, RANK).parameters()
    for a, b in zip(on_gloo, on_concord):  # sums in another order at 3 ranks: not bit for bit
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (a - b).abs().max()
