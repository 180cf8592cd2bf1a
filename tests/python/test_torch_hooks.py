"""DDP communication hooks (concord/torch_hooks.py, concord.torch.hooks): a small CNN trained by
DDP with Concord's allreduce_hook equals DDP over gloo with torch's default hook to 1e-5, over a
concord process group and over a gloo one with a Communicator passed; the buckets' names hit the
response cache step after step; fp16 and bf16 halve the bytes on the wire (Concord's metrics)
and end within 1% of the uncompressed loss; top-k sends about its density and the loss falls; a
bad spec fails at hook creation naming it; sparse gradients (an Embedding's) equal torch's
default hook's; a failed allreduce makes backward() raise; device
buckets and groups without a communicator are refused naming them. Run on 2 and 3 ranks under
concordrun (its CONCORD_STORE; torch's store is a FileStore)."""
import os
import time

import pytest

from envutil import import_torch

torch = import_torch()
import torch.distributed as dist  # noqa: E402

import concord  # noqa: E402
import concord.torch  # noqa: E402,F401  (registers the backend)
from concord.torch import hooks  # noqa: E402
from fake_cuda import FakeBucket  # noqa: E402
from sparse_ddp import train_sparse_ddp  # noqa: E402

RANK = int(os.environ["CONCORD_RANK"])
SIZE = int(os.environ["CONCORD_SIZE"])
STEPS = 8


@pytest.fixture(scope="module", autouse=True)
def group():
    path = "/tmp/concord-torch-hooks-test-%s" % os.environ["CONCORD_JOB_ID"]
    dist.init_process_group("concord", rank=RANK, world_size=SIZE,
                            store=dist.FileStore(path, SIZE))
    # DDP's first bucket holds up to 1 MB, the whole test model: several buckets instead.
    first_bucket, dist._DEFAULT_FIRST_BUCKET_BYTES = dist._DEFAULT_FIRST_BUCKET_BYTES, 40000
    yield
    dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo():
    return dist.new_group(backend="gloo")


class Net(torch.nn.Module):
    """About 40k parameters: most buckets are above the inline threshold (32 KiB)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc1 = torch.nn.Linear(8 * 6 * 6, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(torch.relu(self.bn(self.conv(x))).flatten(1))))


def batches(rank):
    """Rank `rank`'s data: 4 fixed batches of random images with random labels, cycled."""
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))
            for _ in range(4)]


def loss_on_every_rank_data(model):
    model.eval()
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(model(x), y)
                  for r in range(SIZE) for x, y in batches(r)]
    model.train()
    return float(torch.stack(losses).mean())


def train(process_group, hook=None, state=None, steps=STEPS, probe=None):
    """An unmodified DDP loop (ranks start different: DDP's broadcast makes them equal), with
    `hook` registered if given; probe(step) runs after each step. Returns the module."""
    torch.manual_seed(1 + RANK)
    model = torch.nn.parallel.DistributedDataParallel(Net(), process_group=process_group,
                                                      bucket_cap_mb=0.05)
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = batches(RANK)
    for step in range(steps):
        x, y = data[step % len(data)]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if probe is not None:
            probe(step)
    return model.module


def assert_close(a, b, atol=1e-5):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        diff = (sa[key].double() - sb[key].double()).abs().max()
        assert diff <= atol, (key, float(diff))


def counted(hook):
    """hook, counting its calls (the buckets DDP handed it) in .calls."""
    def counting_hook(state, bucket):
        counting_hook.calls += 1
        return hook(state, bucket)

    counting_hook.calls = 0
    return counting_hook


def allreduce_totals(comm, dtype="float32"):
    ops = [o for o in comm.metrics()["operations"]
           if o["op"] == "allreduce" and o["dtype"] == dtype]
    return sum(o["count"] for o in ops), sum(o["wire_bytes"] for o in ops)


def wire_bytes_of(comm, hook_fn):
    """Bytes this rank put on the wire for the allreduces hook_fn() issued through the hook (a
    counted one), comm's only user (a new communicator: an earlier test's last operations may
    still be counted after their callbacks, in another's totals). The metrics are written just
    after each completion callback, so wait for them."""
    assert allreduce_totals(comm) == (0, 0)
    result = hook_fn()
    deadline = time.monotonic() + 10
    while allreduce_totals(comm)[0] < hook_fn.counted.calls:
        assert time.monotonic() < deadline, "the metrics never counted every bucket"
        time.sleep(0.01)
    count, wire = allreduce_totals(comm)
    assert count == hook_fn.counted.calls, (count, hook_fn.counted.calls)
    return wire, result


def test_bad_spec_fails_at_creation_naming_it():
    for spec in ("fp17", "topk:density=2", "topk", "fp16:x=1"):
        with pytest.raises(concord.InvalidArgumentError, match="compression '%s'" % spec):
            hooks.allreduce_hook(compression=spec)
    with pytest.raises(concord.InvalidArgumentError, match="spec string"):
        hooks.allreduce_hook(compression=16)
    with pytest.raises(concord.InvalidArgumentError, match="Communicator"):
        hooks.allreduce_hook(comm="gloo")


def test_no_compression_equals_gloo(gloo, comm):
    reference = train(gloo)  # torch's own allreduce over gloo
    # Over the concord group (state None: the default group, as torch's hooks take it).
    hook = counted(hooks.allreduce_hook())
    assert_close(reference, train(None, hook))
    assert hook.calls > STEPS + 1  # one bucket in step 1, then several a step
    # Over gloo, with a Concord Communicator for the buckets (comm=, or as the state), the only
    # user of comm meanwhile: DDP rebuilds its buckets after step 1, and from step 3 on every
    # bucket is negotiated as a response-cache hit (its name and shape as in the step before).
    stats = []
    assert_close(reference, train(gloo, hooks.allreduce_hook(comm=comm), state=gloo,
                                  probe=lambda step: stats.append(comm.stats())))
    full = [s["responses_full"] for s in stats]
    cached = [s["responses_cached"] for s in stats]
    assert full[-1] == full[2] and cached[-1] - cached[2] == (STEPS - 3) * 2, (full, cached)
    assert_close(reference, train(gloo, hooks.allreduce_hook(), state=comm))


def test_compression_bytes_and_loss(gloo, comm):
    def run(spec):
        with comm.split(0) as own:
            hook = counted(hooks.allreduce_hook(compression=spec, comm=own))

            def fn():
                return loss_on_every_rank_data(train(gloo, hook, state=gloo, steps=2 * STEPS))

            fn.counted = hook
            return wire_bytes_of(own, fn)

    plain_bytes, plain_loss = run("none")
    assert plain_bytes > 0
    for spec in ("fp16", "bf16"):
        wire, loss = run(spec)
        assert 0.45 <= wire / plain_bytes <= 0.55, (spec, wire, plain_bytes)
        assert abs(loss - plain_loss) <= 0.01 * plain_loss, (spec, loss, plain_loss)
        print("%s: wire bytes %d / %d = %.3f, loss %.5f vs %.5f (%+.3f%%)" % (
            spec, wire, plain_bytes, wire / plain_bytes, loss, plain_loss,
            100 * (loss - plain_loss) / plain_loss))
    # Top-k allgathers k = density x n (index, value) pairs, 8 bytes each, to size - 1 ranks; an
    # uncompressed ring sends 2 (size - 1) / size x 4 bytes an element: the ratio is size x D.
    density = 0.05
    initial = loss_on_every_rank_data(_seeded_net())
    wire, loss = run("topk:density=%g" % density)
    ratio = wire / plain_bytes
    assert 0.8 * SIZE * density <= ratio <= 1.25 * SIZE * density, (wire, plain_bytes)
    assert loss < initial, (loss, initial)
    print("topk density %g: wire bytes ratio %.4f (size x density %.3f), loss %.4f from %.4f" %
          (density, ratio, SIZE * density, loss, initial))


def _seeded_net():
    torch.manual_seed(1)  # rank 0's start, which DDP broadcasts
    return Net()


def test_sparse_gradients_equal_torchs_default_hook(gloo, comm):
    assert_close(train_sparse_ddp(gloo, RANK),
                 train_sparse_ddp(gloo, RANK, hooks.allreduce_hook(comm=comm), gloo), atol=1e-6)


def test_failed_allreduce_raises_from_backward(gloo, comm):
    # Ranks disagree on the compression of every bucket: each allreduce fails with MISMATCH
    # and DDP raises its future's error from backward().
    spec = "fp16" if RANK == 0 else "bf16"
    with pytest.raises(RuntimeError, match="ConcordError: ERR_MISMATCH .*ddp.*disagree on "
                       "compression: fp16 on rank 0; bf16 on rank"):
        train(gloo, hooks.allreduce_hook(compression=spec, comm=comm), state=gloo, steps=1)


def test_refusals_name_the_bucket_and_group(gloo, comm):
    hook = hooks.allreduce_hook(prefix="refused")
    with pytest.raises(concord.UnavailableError,
                       match=r"bucket 0 \(refused.bucket.0.v0\).*meta tensor"):
        hook(None, FakeBucket(torch.empty(4, device="meta")))
    with pytest.raises(concord.InvalidArgumentError,
                       match=r"group \(backend gloo\) is not a concord"):
        hook(gloo, FakeBucket(torch.ones(4)))
    sub = comm.create_group([0])
    if sub is not None:  # a communicator of 1 rank for a group of SIZE
        with pytest.raises(concord.InvalidArgumentError, match="has 1 ranks, the process group"):
            hooks.allreduce_hook(comm=sub)(gloo, FakeBucket(torch.ones(4)))
        sub.finalize()
