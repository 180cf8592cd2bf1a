"""Every operation and dtype through numpy and torch against expected values, at 1 to 4 ranks:
allreduce (each reduce op, prescale and postscale, in place and out of place, async with poll and
callback), allgather (first dimensions differing between ranks; request-owned and caller-owned
output), broadcast from every root, barrier, groups, reducescatter (even and given splits),
alltoall (uneven splits, received splits), reduce and gather to every root. Sizes 0, 1, 7, 4099 and 1 Mi elements.
Python objects: broadcast_object from every root and allgather_object, objects that cannot be
pickled (an error on every rank, the ranks still in step) or unpickled (an error there only)."""
import threading

import numpy as np
import pytest

from envutil import import_torch

import concord

NP_DTYPES = ["uint8", "int8", "int32", "int64", "float16", "float32", "float64"]
TORCH_DTYPES = NP_DTYPES + ["bfloat16"]
SIZES = [0, 1, 7, 4099]
OPS = ["sum", "average", "min", "max", "product"]
FLOATS = {"float16", "bfloat16", "float32", "float64"}
# Relative tolerance of one rounding of a result in each floating-point dtype (integers: exact).
RTOL = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-22, "float64": 2.0**-51}


def torch_or_skip():
    return import_torch()


class Frame:
    """Builds inputs in numpy or torch and reads results back as float64 numpy arrays."""

    def __init__(self, kind):
        self.kind = kind
        self.torch = torch_or_skip() if kind == "torch" else None

    def make(self, values, dtype):
        values = np.asarray(values, dtype=np.float64)
        if self.torch is None:
            return values.astype(dtype)
        return self.torch.from_numpy(values).to(getattr(self.torch, dtype))

    def read(self, t):
        return t.to(self.torch.float64).numpy() if self.torch is not None else t.astype(np.float64)


@pytest.fixture(params=["numpy", "torch"])
def frame(request):
    return Frame(request.param)


def dtypes_of(frame):
    return TORCH_DTYPES if frame.kind == "torch" else NP_DTYPES


def rank_values(n, rank, op):
    """Small integers (exact in every dtype, products fit int8) that differ per rank."""
    i = np.arange(n)
    return (i % 2 if op == "product" else i % 5) + rank + 1


def expected_allreduce(n, size, op, dtype):
    per_rank = np.stack([rank_values(n, r, op) for r in range(size)]).astype(np.float64)
    if op == "sum":
        return per_rank.sum(0)
    if op == "average":
        total = per_rank.sum(0)
        return total / size if dtype in FLOATS else np.trunc(total / size)
    if op == "min":
        return per_rank.min(0)
    if op == "max":
        return per_rank.max(0)
    return per_rank.prod(0)


@pytest.mark.parametrize("op", OPS)
def test_allreduce_every_dtype_and_size(comm, frame, op):
    for dtype in dtypes_of(frame):
        for n in SIZES:
            x = frame.make(rank_values(n, comm.rank, op), dtype)
            before = frame.read(x).copy()
            out = comm.allreduce(x, name="ar.%s.%s.%s.%d" % (frame.kind, op, dtype, n), op=op)
            expected = expected_allreduce(n, comm.size, op, dtype)
            np.testing.assert_allclose(frame.read(out), expected, rtol=RTOL.get(dtype, 0),
                                       err_msg="%s %s n=%d" % (dtype, op, n))
            np.testing.assert_array_equal(frame.read(x), before)  # out of place left x alone


def test_allreduce_in_place_with_scaling(comm, frame):
    for dtype in sorted(FLOATS & set(dtypes_of(frame))):
        x = frame.make(rank_values(7, comm.rank, "sum"), dtype)
        result = comm.allreduce_(x, name="scaled.%s.%s" % (frame.kind, dtype), op="sum",
                                 prescale=0.5, postscale=4.0)
        assert result is x
        np.testing.assert_allclose(frame.read(x), 2.0 * expected_allreduce(7, comm.size, "sum",
                                                                           dtype), rtol=RTOL[dtype])


def test_allreduce_large_float32_async(comm, frame):
    """1 Mi elements: past the direct threshold, cut into slices on both lanes."""
    n = 1 << 20
    x = frame.make(rank_values(n, comm.rank, "sum"), "float32")
    handle = comm.allreduce_async(x, out=x, name="large." + frame.kind, op=concord.ReduceOp.AVERAGE)
    assert handle.wait() is x
    assert handle.poll()
    np.testing.assert_allclose(frame.read(x), expected_allreduce(n, comm.size, "average",
                                                                 "float32"), rtol=RTOL["float32"])


def test_stats_count_cache_hits(comm):
    before = comm.stats()
    assert set(before) == {"responses_cached", "responses_full", "response_lists", "collectives",
                           "fused_tensors", "inline_reductions", "device_launches",
                           "cache_evictions", "topk_residual_evictions", "scratch_bytes",
                           "scratch_reallocations", "kept_result_bytes"}
    for _ in range(3):
        comm.allreduce(np.ones(4, np.float32), name="stats.repeated")
    after = comm.stats()
    assert after["response_lists"] >= before["response_lists"] + 3
    # The first one is negotiated in full, the repeats through the response cache.
    assert after["responses_cached"] >= before["responses_cached"] + 2
    assert after["cache_evictions"] >= before["cache_evictions"]


def test_stats_show_the_scratch_memory(comm):
    # A fused group packs into the lane's fusion buffer (scratch_bytes, allocated at least once);
    # an allgather's result the request owned, once freed, is kept for reuse (kept_result_bytes).
    # The stats move after each response list: the barrier's list comes after both.
    n = 16 * 1024  # 64 KiB: under the direct threshold, so fused
    with comm.group():
        handles = [comm.allreduce_async(np.ones(n, np.float32), name="stats.fused%d" % k)
                   for k in range(4)]
    for h in handles:
        h.wait()
    gathered = comm.allgather(np.ones(n, np.float32), name="stats.owned")
    assert gathered.shape == (n * comm.size,)
    del gathered  # the request's result goes back to the library's pool
    comm.barrier()
    comm.barrier()
    stats = comm.stats()
    assert stats["scratch_bytes"] >= 4 * n * 4, stats
    assert stats["scratch_reallocations"] >= 1, stats
    assert stats["kept_result_bytes"] >= n * 4 * comm.size, stats


def test_async_poll_and_callback(comm):
    done = threading.Event()
    seen = []

    def callback(status):
        seen.append(status)
        done.set()

    x = np.full(3, comm.rank + 1, np.int32)
    handle = comm.allreduce_async(x, out=x, name="callback", callback=callback)
    assert done.wait(30), "the completion callback never ran"
    assert seen == [concord.Status.SUCCESS]
    while not handle.poll():
        pass
    handle.wait()
    assert list(x) == [comm.size * (comm.size + 1) // 2] * 3
    barrier_done = threading.Event()
    comm.barrier_async(callback=lambda status: barrier_done.set()).wait()
    assert barrier_done.wait(30)


def test_handle_waited_from_two_threads(comm):
    x = np.full(1000, comm.rank + 1, np.float64)
    handle = comm.allreduce_async(x, out=x, name="two_waiters")
    results = []
    waiters = [threading.Thread(target=lambda: results.append(handle.wait())) for _ in range(2)]
    for t in waiters:
        t.start()
    for t in waiters:
        t.join(60)
    assert len(results) == 2 and all(r is x for r in results)
    np.testing.assert_array_equal(x, comm.size * (comm.size + 1) / 2)


def test_dropped_handles_inside_a_group(comm):
    """Handles dropped before their group is submitted: no blocking, the engine's buffers stay
    alive, and later submissions free the finished requests."""
    from concord import handle as handle_module
    done = threading.Event()
    with comm.group():
        comm.allreduce_async(np.full(5000, comm.rank + 1.0), name="dropped.0")
        comm.barrier_async(callback=lambda status: done.set())
    assert done.wait(30)
    comm.barrier()  # the dropped allreduce finished before this barrier
    comm.barrier()  # this submission swept it
    assert not handle_module._ORPHANS


def test_waiting_inside_the_own_group_is_refused_not_a_hang(comm):
    """A blocking call inside this thread's group, or a wait without a limit for a member before
    the group ends, would never end: each raises InvalidArgumentError at once (it hung before); a
    limited wait times out; the members run once the group ends."""
    x = np.full(7, comm.rank + 1.0)
    with comm.group():
        handle = comm.allreduce_async(x, out=x, name="held.member")
        for blocking in (lambda: comm.allreduce(np.ones(3), name="held.blocking"),
                         lambda: comm.broadcast(np.ones(3), name="held.bcast"), comm.barrier):
            with pytest.raises(concord.InvalidArgumentError, match="blocking call inside a group"):
                blocking()
        with pytest.raises(concord.InvalidArgumentError,
                           match="'held.member' is in the group this thread has open"):
            handle.wait()
        with pytest.raises(concord.WaitTimeoutError):
            handle.wait(timeout=0.01)
        # Blocking allgather: submitted to the group, then its wait is refused; it runs at the end.
        with pytest.raises(concord.InvalidArgumentError, match="in the group this thread has open"):
            comm.allgather(np.ones(2), name="held.gather")
    assert handle.wait(30) is x
    np.testing.assert_array_equal(x, comm.size * (comm.size + 1) / 2)


def test_blocking_calls_give_what_their_async_forms_give(comm):
    """allreduce, broadcast and barrier run as one blocking C call on CPU tensors without a
    callback; with a callback they go through the async form. Both give the same results."""
    for size in (0, 1, 1001):
        x = np.arange(size, dtype=np.float32) + comm.rank
        want = np.arange(size, dtype=np.float32) * comm.size + sum(range(comm.size))
        np.testing.assert_array_equal(comm.allreduce(x, name="blocking.%d" % size), want)
        np.testing.assert_array_equal(comm.allreduce(x, op="max", name="blocking.max"),
                                      np.arange(size, dtype=np.float32) + comm.size - 1)
        seen = []
        np.testing.assert_array_equal(
            comm.allreduce(x, name="blocking.cb", callback=lambda status: seen.append(status)),
            want)
        assert seen == [concord.Status.SUCCESS]
        y = x.copy()
        assert comm.allreduce_(y, name="blocking.inplace") is y
        np.testing.assert_array_equal(y, want)
        root = comm.size - 1
        np.testing.assert_array_equal(comm.broadcast(x, root=root, name="blocking.bcast"),
                                      np.arange(size, dtype=np.float32) + root)
        assert comm.broadcast_(y, root=0, name="blocking.bcast_") is y
    comm.barrier()
    with pytest.raises(concord.InvalidArgumentError, match="dtype"):
        comm.allreduce(np.ones(2, dtype=np.complex64), name="blocking.bad")


def rows_of(rank):
    return rank + 1 if rank % 2 == 0 else 0  # odd ranks contribute no rows at all


def test_allgather_differing_first_dims(comm, frame):
    for dtype in dtypes_of(frame):
        for cols in (1, 3):
            mine = np.array([[10 * comm.rank + (j % 10)] * cols for j in range(rows_of(comm.rank))])
            x = frame.make(mine.reshape(rows_of(comm.rank), cols), dtype)
            expected = np.concatenate(
                [np.array([[10 * r + (j % 10)] * cols for j in range(rows_of(r))]).reshape(-1, cols)
                 for r in range(comm.size)])
            got = comm.allgather(x, name="ag.%s.%s.%d" % (frame.kind, dtype, cols))
            assert tuple(got.shape) == expected.shape
            np.testing.assert_array_equal(frame.read(got), expected)
            # Into a caller's buffer, larger than needed: the gathered rows are returned.
            buf = frame.make(np.zeros((expected.shape[0] + 2, cols)), dtype)
            got = comm.allgather(x, name="ag.out.%s.%s.%d" % (frame.kind, dtype, cols), out=buf)
            np.testing.assert_array_equal(frame.read(got), expected)


def test_owned_results_view_the_requests_memory(comm, frame):
    """A result the request owns (no out=) views the request's memory, no copy: it stays intact
    while later results come and go and after finalize, and once it is gone its memory is taken
    by the next result of its size (the communicator keeps it: core/result_buffers.h)."""
    import gc
    c = comm.split(0, comm.rank)  # a communicator of its own, to finalize
    address = (lambda t: t.data_ptr()) if frame.kind == "torch" else (lambda a: a.ctypes.data)
    n = 1 << 16  # 256 KiB of float32 per rank: large enough to be kept
    gathered = [frame.make(np.full(n, 10 * r + 1), "float32") for r in range(c.size)]
    first = c.allgather(gathered[c.rank], name="owned.view")
    second = c.allgather(frame.make(np.full(n, 7), "float32"), name="owned.view")
    assert address(first) != address(second)
    np.testing.assert_array_equal(frame.read(first), np.concatenate(
        [frame.read(g) for g in gathered]))
    first_address = address(first)
    del first
    gc.collect()
    third = c.allgather(frame.make(np.full(n, 3), "float32"), name="owned.view")
    assert address(third) == first_address
    np.testing.assert_array_equal(frame.read(third), np.full(n * c.size, 3))
    received, _ = c.alltoall(frame.make(np.full(n * c.size, c.rank), "float32"), name="owned.a2a")
    c.finalize()
    np.testing.assert_array_equal(frame.read(second), np.full(n * c.size, 7))
    np.testing.assert_array_equal(frame.read(received), np.repeat(np.arange(c.size), n))
    del second, third, received  # their requests are freed after the communicator
    gc.collect()


def test_reducescatter_even_and_given_splits(comm, frame):
    for dtype in dtypes_of(frame):
        for n in (0, 1, 7):
            for op in ("sum", "max"):
                x = frame.make(np.stack([rank_values(n, comm.rank, op)] * 2, axis=1), dtype)
                full = np.stack([expected_allreduce(n, comm.size, op, dtype)] * 2, axis=1)
                even = [n // comm.size + (1 if r < n % comm.size else 0) for r in range(comm.size)]
                first = sum(even[:comm.rank])
                got = comm.reducescatter(x, op=op, name="rs.%s.%s.%d.%s" % (frame.kind, dtype,
                                                                             n, op))
                assert tuple(got.shape) == (even[comm.rank], 2)
                np.testing.assert_array_equal(frame.read(got),
                                              full[first:first + even[comm.rank]])
        # Every row to the last rank, given as splits.
        splits = [0] * (comm.size - 1) + [5]
        x = frame.make(np.ones((5, 1)) * (comm.rank + 1), dtype)
        got = comm.reducescatter(x, recv_splits=splits, name="rs.last.%s.%s" % (frame.kind, dtype))
        want = sum(range(1, comm.size + 1)) if comm.rank == comm.size - 1 else None
        assert got.shape[0] == splits[comm.rank]
        if want is not None:
            np.testing.assert_array_equal(frame.read(got), np.full((5, 1), want))


def test_alltoall_uneven_splits(comm, frame):
    # Rank s sends (s + d) % 3 rows of [s, d] to rank d.
    for dtype in dtypes_of(frame):
        splits = [(comm.rank + d) % 3 for d in range(comm.size)]
        rows = [[comm.rank, d] for d in range(comm.size) for _ in range(splits[d])]
        x = frame.make(np.array(rows, dtype=np.float64).reshape(-1, 2), dtype)
        got, received = comm.alltoall(x, splits=splits, name="a2a.%s.%s" % (frame.kind, dtype))
        assert received == [(s + comm.rank) % 3 for s in range(comm.size)]
        want = [[s, comm.rank] for s in range(comm.size) for _ in range(received[s])]
        np.testing.assert_array_equal(frame.read(got), np.array(want).reshape(-1, 2))
        # The even split, into a caller's buffer larger than needed.
        x = frame.make(np.arange(2 * comm.size) + 10 * comm.rank, dtype)
        buf = frame.make(np.zeros(2 * comm.size + 3), dtype)
        got, received = comm.alltoall(x, out=buf, name="a2a.even.%s.%s" % (frame.kind, dtype))
        assert received == [2] * comm.size
        want = np.concatenate([10 * s + np.arange(2 * comm.rank, 2 * comm.rank + 2)
                               for s in range(comm.size)])
        np.testing.assert_array_equal(frame.read(got), want)


def test_broadcast_from_every_root(comm, frame):
    for dtype in dtypes_of(frame):
        for root in range(comm.size):
            for n in (0, 1, 4099):
                x = frame.make((np.arange(n) % 10) + 10 * comm.rank, dtype)
                got = comm.broadcast(x, root=root, name="bc.%s.%s.%d.%d" % (frame.kind, dtype,
                                                                              root, n))
                np.testing.assert_array_equal(frame.read(got), (np.arange(n) % 10) + 10 * root)
        y = frame.make([comm.rank] * 5, dtype)
        assert comm.broadcast_(y, root=comm.size - 1, name="bc_." + dtype) is y
        np.testing.assert_array_equal(frame.read(y), [comm.size - 1] * 5)


@pytest.mark.parametrize("op", OPS)
def test_reduce_every_dtype_size_and_root(comm, frame, op):
    """Only the root gets the reduction; the others get None and their out is left alone.
    Sizes past the inline threshold (4099 x 8 bytes) and the direct threshold (1 Mi) included."""
    for dtype in dtypes_of(frame):
        for n in SIZES + ([1 << 16] if op in ("sum", "max") else []):
            root = (n + len(dtype)) % comm.size
            x = frame.make(rank_values(n, comm.rank, op), dtype)
            before = frame.read(x).copy()
            out = frame.make(np.full(n, 42), dtype)
            got = comm.reduce(x, root=root, op=op, out=out,
                              name="red.%s.%s.%s.%d" % (frame.kind, op, dtype, n))
            np.testing.assert_array_equal(frame.read(x), before)
            if comm.rank == root:
                assert got is out
                np.testing.assert_allclose(frame.read(got), expected_allreduce(n, comm.size, op,
                                                                               dtype),
                                           rtol=RTOL.get(dtype, 0), err_msg="%s %s n=%d" % (
                                               dtype, op, n))
            else:
                assert got is None
                np.testing.assert_array_equal(frame.read(out), np.full(n, 42))


def test_reduce_in_place_scaled_and_async(comm, frame):
    for dtype in sorted(FLOATS & set(dtypes_of(frame))):
        for root in range(comm.size):
            x = frame.make(rank_values(7, comm.rank, "sum"), dtype)
            before = frame.read(x).copy()
            handle = comm.reduce_async(x, root=root, out=x, prescale=0.5, postscale=4.0,
                                       name="red_.%s.%s.%d" % (frame.kind, dtype, root))
            got = handle.wait()
            if comm.rank == root:
                assert got is x
                np.testing.assert_allclose(frame.read(x), 2.0 * expected_allreduce(
                    7, comm.size, "sum", dtype), rtol=RTOL[dtype])
            else:
                assert got is None
                np.testing.assert_array_equal(frame.read(x), before)


def test_gather_differing_first_dims_every_root(comm, frame):
    for dtype in dtypes_of(frame):
        for root in range(comm.size):
            for cols in (1, 3):
                mine = np.array([[10 * comm.rank + (j % 10)] * cols
                                 for j in range(rows_of(comm.rank))])
                x = frame.make(mine.reshape(rows_of(comm.rank), cols), dtype)
                expected = np.concatenate(
                    [np.array([[10 * r + (j % 10)] * cols
                               for j in range(rows_of(r))]).reshape(-1, cols)
                     for r in range(comm.size)])
                name = "ga.%s.%s.%d.%d" % (frame.kind, dtype, cols, root)
                got = comm.gather(x, root=root, name=name)
                if comm.rank == root:
                    assert tuple(got.shape) == expected.shape
                    np.testing.assert_array_equal(frame.read(got), expected)
                else:
                    assert got is None
                # Into a caller's buffer, larger than needed; untouched on the other ranks.
                buf = frame.make(np.full((expected.shape[0] + 2, cols), 7), dtype)
                got = comm.gather_async(x, root=root, name=name + ".out", out=buf).wait()
                if comm.rank == root:
                    np.testing.assert_array_equal(frame.read(got), expected)
                else:
                    assert got is None
                    np.testing.assert_array_equal(frame.read(buf), np.full(buf.shape, 7))


def test_gather_large(comm):
    """Past the inline threshold and the direct threshold: the backend's gather."""
    x = np.arange(1 << 16, dtype=np.float32) + comm.rank
    got = comm.gather(x, root=comm.size - 1, name="ga.large")
    if comm.rank == comm.size - 1:
        np.testing.assert_array_equal(
            got, np.concatenate([np.arange(1 << 16, dtype=np.float32) + r
                                 for r in range(comm.size)]))


def test_scalar_tensor(comm, frame):
    x = frame.make(np.array(comm.rank + 1.0), "float64")
    assert tuple(comm.allreduce(x, name="scalar." + frame.kind).shape) == ()
    assert float(frame.read(comm.allreduce(x, name="scalar." + frame.kind))) == \
        comm.size * (comm.size + 1) / 2


def test_group_fuses_operations(comm):
    xs = [np.full(n, comm.rank + 1, np.float32) for n in (1, 7, 300)]
    with comm.group():
        handles = [comm.allreduce_async(x, out=x, name="group.%d" % i)
                   for i, x in enumerate(xs)]
        handles.append(comm.barrier_async())
    for h in handles:
        h.wait()
    for x in xs:
        np.testing.assert_array_equal(x, comm.size * (comm.size + 1) / 2)


def test_threads_hold_their_own_groups_at_once(comm):
    """Groups are per thread: two threads hold groups open at the same time, each knows only its
    own (waiting for the other's member is not refused), and each group's end submits its own
    members. Before, the second thread's group was refused ("another thread has a group open")."""
    both_open = threading.Barrier(2, timeout=30)
    xs = [np.full(5, comm.rank + 1.0 + k) for k in range(4)]
    handles, errors = {}, []

    def grouped(first):
        try:
            with comm.group():
                both_open.wait()
                for k in (first, first + 1):
                    handles[k] = comm.allreduce_async(xs[k], out=xs[k], name="thread_group.%d" % k)
                both_open.wait()  # the other thread's members are in its own group
                assert handles[2 - first]._group is not comm._own_open_group()
        except Exception as e:  # noqa: BLE001 (reported below, from the main thread)
            errors.append(e)
            both_open.abort()

    threads = [threading.Thread(target=grouped, args=(first,)) for first in (0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for k in range(4):
        assert handles[k].wait(30) is xs[k]
        np.testing.assert_array_equal(xs[k], comm.size * (comm.size + 1) / 2 + comm.size * k)


def test_a_callback_enqueues_outside_the_group_of_the_thread_running_it(comm):
    """A thread that waits runs the engine's steps, and with them the callbacks of what completes,
    while it may have a group open. What such a callback enqueues is not held by that group (the
    C side enqueues it outside), so its Handle takes no group token: its wait() goes in slices,
    as any other, instead of one unlimited wait kept for the group's own members."""
    ran_here, made = [], []
    x, y = np.ones(3), np.ones(2)

    def then(status):
        ran_here.append(threading.get_ident() == waiter)
        made.append(comm.allreduce_async(y, out=y, name="callback.then"))

    waiter = threading.get_ident()
    for _ in range(20):  # the callback runs here in most rounds, on the engine's thread in others
        first = comm.allreduce_async(x, name="callback.first", callback=then)
        with comm.group():
            inner = comm.allreduce_async(x, name="callback.grouped")
            first.wait(30)  # runs the engine's steps here, so the callback too, mostly
            assert made[-1]._group is None, "the callback's handle took this thread's group"
        made[-1].wait(30)
        inner.wait(30)
    np.testing.assert_array_equal(y, np.full(2, comm.size ** 20))
    assert len(ran_here) == 20


def test_module_level_api_and_unnamed_ops(comm):
    assert concord.default() is comm
    assert (concord.rank(), concord.size()) == (comm.rank, comm.size)
    assert 0 <= concord.local_rank() < concord.local_size()
    # Unnamed operations are named by a counter; every rank issues them in the same order.
    a = concord.allreduce(np.ones(4, np.int64))
    b = concord.allreduce(np.ones(2, np.int64))
    assert list(a) == [comm.size] * 4 and list(b) == [comm.size] * 2
    concord.barrier()


def test_bool_tensors_move_as_bytes_and_are_not_reduced(comm, frame):
    # torch's gloo moves bool tensors; models keep bool buffers (masks) that
    # broadcast_parameters must send. They travel as uint8 and come back as bool.
    r, n = comm.rank, comm.size

    def flags(values):
        values = np.asarray(values, dtype=bool)
        return values if frame.torch is None else frame.torch.from_numpy(values)

    def as_numpy(t):
        return np.asarray(t) if frame.torch is None else t.numpy()

    mine = flags([(r + i) % 2 == 0 for i in range(3)])
    got = comm.allgather(mine, name="bool.allgather")
    assert str(got.dtype) in ("bool", "torch.bool")
    want = [(s + i) % 2 == 0 for s in range(n) for i in range(3)]
    np.testing.assert_array_equal(as_numpy(got), want)
    into = flags([False] * (3 * n))
    assert comm.allgather(mine, name="bool.allgather.out", out=into) is not None
    np.testing.assert_array_equal(as_numpy(into), want)

    b = flags([r == 0, True, r != 0])
    comm.broadcast_(b, root=0, name="bool.broadcast")
    np.testing.assert_array_equal(as_numpy(b), [True, True, False])

    out, received = comm.alltoall(flags([r % 2 == 0] * n), name="bool.alltoall")
    assert str(out.dtype) in ("bool", "torch.bool")
    np.testing.assert_array_equal(as_numpy(out), [s % 2 == 0 for s in range(n)])
    assert list(received) == [1] * n

    if n > 1:
        right, left = (r + 1) % n, (r - 1) % n
        sent = comm.send_async(flags([True, r % 2 == 1]), right, tag=5)
        back = comm.recv(left, tag=5, like=flags([False, False]))
        sent.wait()
        np.testing.assert_array_equal(as_numpy(back), [True, left % 2 == 1])

    with pytest.raises(concord.InvalidArgumentError, match="bool: Concord moves.*reduces none"):
        comm.allreduce(mine, name="bool.allreduce")


def _rebuild_only_on(rank):
    """Unpickles (as None) on the given rank of the default communicator only."""
    if concord.rank() != rank:
        raise ValueError("rank %d's object unpickles on rank %d only" % (rank, rank))


class OnlyOnRank:
    def __init__(self, rank):
        self.rank = rank

    def __reduce__(self):
        return (_rebuild_only_on, (self.rank,))


class Unpicklable:
    def __reduce__(self):
        raise TypeError("no pickling this")


def test_broadcast_object_from_every_root(comm):
    for root in range(comm.size):
        sent = {"root": root, "items": list(range(root * 1000)), "none": None,
                "nested": (1.5, b"x")}
        got = comm.broadcast_object(sent if comm.rank == root else "ignored", root=root)
        assert got == sent
        assert (got is sent) == (comm.rank == root)  # the root keeps its own object
    big = bytes(range(256)) * 12289  # 3 MiB and a bit: larger than any fusion buffer
    assert comm.broadcast_object(big if comm.rank == 0 else None, name="big") == big
    assert comm.broadcast_object(comm.rank, root=comm.size - 1) == comm.size - 1


def test_allgather_object_every_rank_in_rank_order(comm):
    got = comm.allgather_object({"rank": comm.rank, "text": "x" * (5000 * comm.rank)})
    assert got == [{"rank": r, "text": "x" * (5000 * r)} for r in range(comm.size)]
    assert comm.allgather_object(None, name="nothing") == [None] * comm.size


def test_object_that_cannot_be_pickled_fails_on_every_rank_in_step(comm):
    root = comm.size - 1
    with pytest.raises(concord.InvalidArgumentError,
                       match=r"root rank %d could not pickle its object: TypeError: no pickling "
                             r"this" % root):
        comm.broadcast_object(Unpicklable() if comm.rank == root else None, root=root)
    with pytest.raises(concord.InvalidArgumentError,
                       match=r"could not pickle the object of rank 0: TypeError: no pickling"):
        comm.allgather_object(Unpicklable() if comm.rank == 0 else comm.rank)
    # Every rank took part in both: the next calls match.
    assert comm.allgather_object(comm.rank) == list(range(comm.size))
    assert comm.broadcast_object("after", root=root) == "after"


def test_object_that_cannot_be_unpickled_fails_there_only(comm):
    if comm.size == 1:
        assert comm.broadcast_object(OnlyOnRank(0)).rank == 0  # the root's own object
        return
    if comm.rank == 0:
        assert isinstance(comm.broadcast_object(OnlyOnRank(0)), OnlyOnRank)
    else:
        with pytest.raises(concord.InvalidArgumentError,
                           match=r"could not unpickle rank 0's object here: ValueError: rank 0's "
                                 r"object unpickles on rank 0 only"):
            comm.broadcast_object(OnlyOnRank(0))
    assert comm.allgather_object("in step") == ["in step"] * comm.size
