"""CUDA tensors from Python on a GPU: the binding's collectives on CUDA tensors (allreduce,
allgather, broadcast, reducescatter, alltoall, reduce, gather: device memory straight to the
device backend, NCCL: no host copy; ordered after torch's current stream, the default one and a
side stream; wait() makes the current stream wait), send and recv of CUDA tensors (through host
memory), the refusals that remain on a GPU, and the torch.distributed backend "concord" on CUDA:
its collectives and send/recv, async works on a side stream, and
DDP on CUDA (default hook and Concord's allreduce_hook) equal to one process on the union of the
ranks' batches.

Run by perf/gpu-check.sh under concordrun --backend nccl at 1 and 2 ranks (one rank per GPU, or
ranks sharing one GPU as pretend NCCL hosts: perf/nccl-pretend-host.sh). Skipped, saying
why, when torch has no CUDA or no GPU is usable; a communicator without a GPU backend on a GPU
machine fails (it is what is tested)."""
import os

import pytest

from envutil import import_torch

torch = import_torch()
if not torch.cuda.is_available():
    pytest.skip("torch %s has no usable CUDA here (built with CUDA %s; a GPU and a CUDA build of "
                "torch are needed)" % (torch.__version__, torch.version.cuda),
                allow_module_level=True)
import torch.distributed as dist  # noqa: E402

import concord  # noqa: E402
import concord.torch  # noqa: E402,F401  (registers the backend)
from concord.torch import hooks  # noqa: E402

RANK = int(os.environ.get("CONCORD_RANK", "0"))
SIZE = int(os.environ.get("CONCORD_SIZE", "1"))
LOCAL_RANK = int(os.environ.get("CONCORD_LOCAL_RANK", "0"))
DEVICE = torch.device("cuda", LOCAL_RANK % torch.cuda.device_count())
torch.cuda.set_device(DEVICE)
N = 1 << 22  # large enough that a missing stream order shows as wrong values


@pytest.fixture(scope="module")
def comm():
    c = concord.Communicator(backend="nccl")
    yield c
    c.finalize()


def launches(comm):
    return comm.stats()["device_launches"]


def test_allreduce_after_the_default_stream(comm):
    before = launches(comm)
    t = torch.arange(N, dtype=torch.float32, device=DEVICE)
    t.mul_(RANK + 1)  # queued on the default stream just before: the allreduce must see it
    handle = comm.allreduce_async(t, out=t, name="cuda.sum")
    assert handle.wait() is t
    t.add_(1)  # after wait(), on the current stream: runs after the allreduce
    expected = torch.arange(N, dtype=torch.float32) * sum(range(1, SIZE + 1)) + 1
    assert torch.equal(t.cpu(), expected)
    assert launches(comm) > before  # the device backend ran it: no host copy


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64],
                         ids=str)
def test_allreduce_average_into_out_on_a_side_stream(comm, dtype):
    side = torch.cuda.Stream(DEVICE)
    with torch.cuda.stream(side):
        x = torch.full((1000, 3), 2 * (RANK + 1), dtype=dtype, device=DEVICE)
        out = comm.allreduce(x, out=torch.empty_like(x), op="average",
                             name="cuda.avg.%s" % dtype)
        got = out.cpu()  # on the side stream, which wait() made wait
    expected = 2 * sum(range(1, SIZE + 1)) // SIZE if not dtype.is_floating_point else \
        2.0 * sum(range(1, SIZE + 1)) / SIZE
    assert torch.equal(got, torch.full((1000, 3), expected, dtype=dtype))


def test_allgather_and_broadcast(comm):
    x = torch.full((3, 5), float(RANK), device=DEVICE)
    out = torch.empty(3 * SIZE, 5, device=DEVICE)
    assert comm.allgather(x, out=out, name="cuda.gather") is out
    assert torch.equal(out.cpu(), torch.arange(SIZE).repeat_interleave(3).float()[:, None]
                       .expand(3 * SIZE, 5))
    y = torch.full((7,), float(RANK + 10), device=DEVICE)
    comm.broadcast_(y, root=SIZE - 1, name="cuda.bcast")
    assert torch.equal(y.cpu(), torch.full((7,), float(SIZE - 1 + 10)))
    fresh = comm.broadcast(y, root=0, name="cuda.bcast.new")  # out=None: a new CUDA tensor
    assert fresh.is_cuda and torch.equal(fresh.cpu(), y.cpu())


def test_synchronize_and_callback(comm):
    import threading
    done = threading.Event()
    statuses = []
    t = torch.ones(1 << 20, device=DEVICE)
    handle = comm.allreduce_async(t, out=t, name="cuda.cb",
                                  callback=lambda s: (statuses.append(s), done.set()))
    assert handle.synchronize() is t  # the host waits for the end
    assert done.wait(30) and statuses == [concord.Status.SUCCESS]
    assert handle.poll() and handle.wire_bytes() >= 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
def test_reducescatter_alltoall_reduce_gather(comm, dtype):
    before = launches(comm)
    rows = 2 * SIZE + 1  # uneven: the first ranks get one row more
    x = (torch.arange(rows * 3, device=DEVICE).reshape(rows, 3) + RANK).to(dtype)
    mine = rows // SIZE + (1 if RANK < rows % SIZE else 0)
    first = sum(rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(RANK))
    out = comm.reducescatter(x, name="cuda.rs.%s" % dtype)
    assert out.is_cuda and out.shape == (mine, 3)
    want = sum((torch.arange(rows * 3).reshape(rows, 3) + r) for r in range(SIZE))
    assert torch.equal(out.cpu(), want[first:first + mine].to(dtype))

    # alltoall: rank s sends s + d + 1 rows of 2 to rank d.
    sends = [RANK + d + 1 for d in range(SIZE)]
    src = torch.cat([torch.full((n, 2), RANK * 10 + d, dtype=dtype, device=DEVICE)
                     for d, n in enumerate(sends)])
    recvs = [s + RANK + 1 for s in range(SIZE)]
    got, received = comm.alltoall(src, splits=sends, name="cuda.a2a.%s" % dtype,
                                  out=torch.empty(sum(recvs), 2, dtype=dtype, device=DEVICE))
    assert received == recvs and got.is_cuda
    assert torch.equal(got.cpu(), torch.cat([torch.full((n, 2), s * 10 + RANK, dtype=dtype)
                                             for s, n in enumerate(recvs)]))

    for root in range(SIZE):
        y = torch.full((4099,), RANK + 1, dtype=dtype, device=DEVICE)
        reduced = comm.reduce(y, root=root, name="cuda.rd.%s.%d" % (dtype, root))
        if RANK == root:
            assert reduced.is_cuda and torch.equal(
                reduced.cpu(), torch.full((4099,), SIZE * (SIZE + 1) // 2, dtype=dtype))
        else:
            assert reduced is None
        g = torch.full((RANK + 1, 2), RANK, dtype=dtype, device=DEVICE)
        total = SIZE * (SIZE + 1) // 2
        buf = torch.empty(total, 2, dtype=dtype, device=DEVICE) if RANK == root else None
        gathered = comm.gather(g, root=root, out=buf, name="cuda.ga.%s.%d" % (dtype, root))
        if RANK == root:
            assert torch.equal(gathered.cpu(), torch.cat(
                [torch.full((r + 1, 2), r, dtype=dtype) for r in range(SIZE)]))
    assert launches(comm) >= before + 2 + 2 * SIZE


def test_refusals_on_a_gpu(comm):
    x = torch.ones(4, 2, device=DEVICE)
    with pytest.raises(concord.InvalidArgumentError, match="needs out="):
        comm.allgather(x, name="cuda.refused")
    with pytest.raises(concord.InvalidArgumentError, match="alltoall of a CUDA tensor.*needs out="):
        comm.alltoall(x, name="cuda.a2a.refused")
    with pytest.raises(concord.InvalidArgumentError, match="gather of a CUDA tensor.*needs out="):
        comm.gather(x, root=RANK, name="cuda.ga.refused")
    with pytest.raises(concord.UnavailableError, match="compression"):
        comm.allreduce(x, out=x, name="cuda.fp16", compression="fp16")
    with pytest.raises(concord.UnavailableError, match="compression"):
        comm.reducescatter(x, name="cuda.rs.fp16", compression="fp16")
    with pytest.raises(concord.InvalidArgumentError, match="send to rank %d .*this rank" % RANK):
        comm.send(x, RANK, 1)
    assert comm.allreduce(x, out=x, name="cuda.after").cpu().eq(SIZE).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.uint8], ids=str)
def test_send_recv_of_cuda_tensors(comm, dtype):
    """Through host memory, in a ring: CUDA to CUDA after the default stream's work, CUDA to
    CPU, CPU to CUDA, and a recv on a side stream (one rank: a rank cannot send to itself)."""
    if SIZE == 1:
        with pytest.raises(concord.InvalidArgumentError, match="this rank"):
            comm.send(torch.ones(2, device=DEVICE, dtype=dtype), 0, 1)
        return
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE

    def message(rank, n):
        return (torch.arange(n) % 100 + rank).to(dtype)

    t = torch.zeros(N, dtype=dtype, device=DEVICE)
    t.add_(message(RANK, N).to(DEVICE))  # queued on the default stream: the send must see it
    handle = comm.send_async(t, nxt, tag=11)
    got = comm.recv(prv, tag=11, like=t)
    assert got.is_cuda and torch.equal(got.cpu(), message(prv, N))
    handle.wait()
    comm.send(t[:4099], nxt, tag=12)  # CUDA to CPU
    host = comm.recv(prv, tag=12, out=torch.empty(4099, dtype=dtype))
    assert torch.equal(host, message(prv, 4099))
    comm.send(message(RANK, 7), nxt, tag=13)  # CPU to CUDA, on a side stream
    side = torch.cuda.Stream(DEVICE)
    with torch.cuda.stream(side):
        box = torch.full((7,), 3, dtype=dtype, device=DEVICE)  # the copy in waits for this
        comm.recv(prv, tag=13, out=box)
        box.add_(1)
    side.synchronize()
    assert torch.equal(box.cpu(), message(prv, 7) + 1)


@pytest.fixture(scope="module")
def group():
    path = "/tmp/concord-torch-cuda-%s" % os.environ.get("CONCORD_JOB_ID", os.getpid())
    dist.init_process_group("concord", rank=RANK, world_size=SIZE,
                            store=dist.FileStore(path, SIZE))
    yield dist.distributed_c10d._get_default_group()
    dist.destroy_process_group()


def test_backend_collectives_on_cuda(group):
    t = torch.full((4099,), float(RANK + 1), device=DEVICE)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.full((4099,), float(SIZE * (SIZE + 1) // 2)))
    side = torch.cuda.Stream(DEVICE)
    with torch.cuda.stream(side):
        u = torch.full((1 << 20,), float(RANK + 1), device=DEVICE)
        work = dist.all_reduce(u, op=dist.ReduceOp.AVG, async_op=True)
        work.wait()  # the side stream waits
        u.mul_(2)
        got = u.cpu()
    assert torch.allclose(got, torch.full((1 << 20,), float(SIZE + 1)))
    assert torch.equal(work.get_future().wait()[0].cpu(), got)
    parts = [torch.empty(3, device=DEVICE) for _ in range(SIZE)]
    dist.all_gather(parts, torch.full((3,), float(RANK), device=DEVICE))
    assert [p.cpu().tolist() for p in parts] == [[float(r)] * 3 for r in range(SIZE)]
    flat = torch.empty(SIZE * 2, device=DEVICE)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(RANK), device=DEVICE))
    assert flat.cpu().tolist() == [float(r) for r in range(SIZE) for _ in range(2)]
    b = torch.full((5,), float(RANK), device=DEVICE)
    dist.broadcast(b, src=0)
    assert b.cpu().tolist() == [0.0] * 5
    before = group.comm.stats()["device_launches"]
    big = torch.arange(SIZE * 6, dtype=torch.float32, device=DEVICE) + RANK
    shard = torch.empty(6, device=DEVICE)
    dist.reduce_scatter_tensor(shard, big)
    want = sum(torch.arange(SIZE * 6, dtype=torch.float32) + r for r in range(SIZE))
    assert torch.equal(shard.cpu(), want[RANK * 6:(RANK + 1) * 6])
    ins = torch.arange(SIZE * 2, dtype=torch.float32, device=DEVICE) + 100 * RANK
    outs = torch.empty(SIZE * 2, device=DEVICE)
    dist.all_to_all_single(outs, ins)
    assert outs.cpu().tolist() == [float(100 * s + 2 * RANK + j) for s in range(SIZE)
                                   for j in range(2)]
    r = torch.full((3,), float(RANK + 1), device=DEVICE)
    dist.reduce(r, dst=0)
    assert r.cpu().tolist() == ([float(SIZE * (SIZE + 1) // 2)] * 3 if RANK == 0 else
                                [float(RANK + 1)] * 3)
    gathered = [torch.empty(2, device=DEVICE) for _ in range(SIZE)] if RANK == 0 else None
    dist.gather(torch.full((2,), float(RANK), device=DEVICE), gathered, dst=0)
    if RANK == 0:
        assert [g.cpu().tolist() for g in gathered] == [[float(q)] * 2 for q in range(SIZE)]
    assert group.comm.stats()["device_launches"] >= before + 4
    if SIZE > 1:  # send and recv through host memory
        msg = torch.full((7,), float(RANK), device=DEVICE)
        box = torch.empty(7, device=DEVICE)
        works = [dist.isend(msg, (RANK + 1) % SIZE), dist.irecv(box, (RANK - 1) % SIZE)]
        for w in works:
            w.wait()
        assert box.cpu().tolist() == [float((RANK - 1) % SIZE)] * 7


def train(model, batches, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in batches[:steps]:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8)).to(DEVICE)


@pytest.mark.parametrize("hook", [None, "concord"])
def test_ddp_on_cuda_equals_one_process_on_the_union(group, hook):
    gen = torch.Generator().manual_seed(1)
    union = [(torch.randn(8 * SIZE, 32, generator=gen), torch.randn(8 * SIZE, 8, generator=gen))
             for _ in range(5)]
    mine = [(x[8 * RANK:8 * (RANK + 1)].to(DEVICE), y[8 * RANK:8 * (RANK + 1)].to(DEVICE))
            for x, y in union]
    model = torch.nn.parallel.DistributedDataParallel(net(), device_ids=[DEVICE])
    if hook is not None:
        model.register_comm_hook(None, hooks.allreduce_hook(prefix="cuda.ddp"))
    got = train(model, mine, 5)
    want = train(net(), [(x.to(DEVICE), y.to(DEVICE)) for x, y in union], 5)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()
