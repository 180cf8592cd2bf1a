"""Failures raised as Python exceptions carrying the C status and message: errors the C library
reports at enqueue, at completion and at init; mismatches between ranks; a wait's own limit
(WaitTimeoutError) told apart from an operation that timed out (ConcordTimeoutError); arguments the binding refuses before calling C; compression and device tensors this library
cannot take; use after finalize."""

import ctypes
import os
import re
import threading
import time

import numpy as np
import pytest

from envutil import import_torch

import concord
from concord import Status
from fake_cuda import fake_cuda_tensor, no_gpu_backend
from sigintutil import interrupted_wait


def test_c_enqueue_errors_carry_status_and_message(comm):
    x = np.zeros(4, np.float32)
    with pytest.raises(concord.InvalidArgumentError) as e:
        comm.allreduce(x, name="bad_op", op=99)
    assert e.value.status == Status.ERR_INVALID_ARGUMENT
    assert "unknown reduce op 99" in e.value.message
    with pytest.raises(concord.ConcordError) as e:
        comm.allreduce(x, name="bad_out", out=np.zeros(5, np.float32))
    assert e.value.status == Status.ERR_INVALID_ARGUMENT
    assert "output has 5 elements, the input 4" in e.value.message
    assert concord.status_string(Status.ERR_MISMATCH) == "ranks submitted mismatching requests"


def test_c_completion_error_allgather_capacity(comm):
    x = np.ones((2, 3), np.int32)
    with pytest.raises(concord.ConcordError) as e:
        comm.allgather(x, name="small_out", out=np.zeros((1, 3), np.int32))
    assert e.value.status == Status.ERR_INVALID_ARGUMENT
    assert e.value.message  # the engine's text, e.g. naming the bytes needed


def test_mismatch_between_ranks(comm):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    x = np.zeros(4 + comm.rank, np.float32)  # shapes differ by rank
    with pytest.raises(concord.ConcordError) as e:
        comm.allreduce(x, name="mismatched")
    assert e.value.status == Status.ERR_MISMATCH
    assert "mismatched" in e.value.message and "shape" in e.value.message
    comm.barrier()  # the communicator stays usable


def test_broadcast_root_out_of_range(comm):
    with pytest.raises(concord.ConcordError) as e:
        comm.broadcast(np.zeros(2, np.int64), root=comm.size, name="bad_root")
    assert e.value.status in (Status.ERR_INVALID_ARGUMENT, Status.ERR_MISMATCH)
    assert "root" in e.value.message


def test_reduce_and_gather_roots(comm):
    """A root out of range is refused at enqueue; ranks that disagree on the root all fail with
    MISMATCH naming the tensor and the field."""
    for call in (comm.reduce, comm.gather):
        with pytest.raises(concord.InvalidArgumentError, match="root"):
            call(np.zeros(2, np.int64), root=comm.size, name="bad_root." + call.__name__)
    if comm.size < 2:
        return
    for call in (comm.reduce, comm.gather):
        name = "root_mismatch." + call.__name__
        with pytest.raises(concord.ConcordError) as e:
            call(np.ones(3, np.float32), root=comm.rank % 2, name=name)
        assert e.value.status == Status.ERR_MISMATCH
        assert name in e.value.message and "root" in e.value.message
    got = comm.reduce(np.ones(3, np.float32), root=0, name="root_agreed")  # still usable
    assert (got is not None) == (comm.rank == 0)


def test_wait_timeout_then_completion(comm):
    """A wait whose limit passes raises WaitTimeoutError (not a ConcordError: nothing failed), and
    the handle can be waited on again."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    x = np.ones(8, np.float32)
    if comm.rank == 0:
        handle = comm.allreduce_async(x, out=x, name="late")
        with pytest.raises(concord.WaitTimeoutError) as e:
            handle.wait(timeout=0.05)
        assert isinstance(e.value, TimeoutError) and not isinstance(e.value, concord.ConcordError)
        assert e.value.timeout == 0.05 and "still running" in str(e.value)
        with pytest.raises(concord.WaitTimeoutError):
            handle.wait(timeout=0)  # a poll that says "not yet"
        assert not handle.poll()
    # Operations are matched by name, so this broadcast completes while "late" waits; the other
    # ranks submit "late" only once rank 0's short waits have expired.
    comm.broadcast(np.zeros(1, np.int8), root=0, name="late.go")
    if comm.rank != 0:
        handle = comm.allreduce_async(x, out=x, name="late")
    handle.wait()
    np.testing.assert_array_equal(x, comm.size)
    assert handle.wait(timeout=0) is not None  # finished: its result at once


def test_ctrl_c_ends_a_wait_and_the_operation_goes_on(comm):
    """SIGINT (Ctrl-C) while wait() waits for an operation the other ranks submit only 4 s later
    raises KeyboardInterrupt within a slice of the wait (before, the interrupt waited for the
    operation's end); the operation goes on and a later wait gives its result. Waits without a
    limit and with one both end so."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run on the main thread")
    x = np.ones(5, np.float32)
    seen = []  # checked once every rank is past both cases, so that a failure hangs no rank
    for limit in (None, 30):
        name = "interrupted.%s" % limit
        comm.barrier()
        if comm.rank == 0:
            handle = comm.allgather_async(x, name=name)
            seen += ["timeout=%s: %s" % (limit, failure)
                     for failure in interrupted_wait(lambda: handle.wait(timeout=limit))]
            if handle.poll():  # the others submit it 4 s after the barrier
                seen.append("'%s' finished before the others submitted it" % name)
        else:
            time.sleep(4)
            handle = comm.allgather_async(x, name=name)
        np.testing.assert_array_equal(handle.wait(), np.ones(5 * comm.size, np.float32))
    assert not seen


def test_wait_on_an_operation_that_timed_out(comm):
    """An operation that fails by a deadline of its own raises ConcordTimeoutError (status
    ERR_TIMEOUT), told apart from a wait's own limit (WaitTimeoutError). Only rank 0 submits
    "rank0.only" on a second communicator whose stall shutdown (CONCORD_STALL_SHUTDOWN_S, read
    at init) fails it after a second."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    os.environ["CONCORD_STALL_SHUTDOWN_S"] = "1"
    try:
        stalled = concord.Communicator(job_id="python-errors-stalled")
    finally:
        del os.environ["CONCORD_STALL_SHUTDOWN_S"]
    if comm.rank == 0:
        handle = stalled.allreduce_async(np.ones(3, np.float32), name="rank0.only")
        with pytest.raises(concord.WaitTimeoutError):
            handle.wait(timeout=0.05)
        with pytest.raises(concord.ConcordTimeoutError) as e:
            handle.wait(timeout=30)
        assert e.value.status == Status.ERR_TIMEOUT
        assert "rank0.only" in e.value.message and "stall shutdown" in e.value.message
        assert handle.poll()
        with pytest.raises(concord.ConcordTimeoutError):
            handle.wait(timeout=0.05)  # over: the same failure again, never "not yet"
    comm.barrier()  # the other ranks keep `stalled` up until rank 0 has seen the failure
    stalled.finalize()


def test_python_side_refusals(comm):
    with pytest.raises(concord.InvalidArgumentError, match="int16"):
        comm.allreduce(np.zeros(3, np.int16), name="int16")
    with pytest.raises(concord.InvalidArgumentError, match="not C-contiguous"):
        comm.allreduce(np.zeros((4, 4), np.float32)[:, 1], name="strided")
    # Named float32 and int64, but their bytes are swapped: they would be misread, not reduced.
    for swapped in (">f4", ">i8") if np.little_endian else ("<f4", "<i8"):
        with pytest.raises(concord.InvalidArgumentError, match="non-native byte order"):
            comm.allreduce(np.ones(3, dtype=swapped), name="swapped")
    # The native form of the same dtype is still taken after the refusal (dtypes are cached).
    np.testing.assert_array_equal(comm.allreduce(np.ones(3, np.float32), name="native"),
                                  np.full(3, comm.size, np.float32))
    with pytest.raises(concord.InvalidArgumentError, match="numpy arrays and torch tensors"):
        comm.allreduce([1.0, 2.0], name="list")
    with pytest.raises(concord.InvalidArgumentError, match="unknown reduce op"):
        comm.allreduce(np.zeros(3, np.float32), name="x", op="median")
    frozen = np.zeros(3, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(concord.InvalidArgumentError, match="read-only"):
        comm.allreduce_(frozen, name="frozen")


class _Rows(np.ndarray):
    """An ndarray subclass, as libraries make them (numpy.ma, astropy)."""


def test_tensor_kinds_are_learned_per_type(comm):
    """describe() learns once per Python type what a tensor is (tensors._kind): subclasses of
    ndarray and torch.Tensor are taken, other types refused on every call, bool dtypes moved as
    bytes after a refusal and float dtypes reduced after a bool one."""
    torch = import_torch()
    for _ in range(2):  # the second time from what the first one learned
        with pytest.raises(concord.InvalidArgumentError, match="is a tuple; Concord takes"):
            comm.allreduce((1.0, 2.0), name="tuple")
        rows = np.ones((2, 3), np.float32).view(_Rows)
        np.testing.assert_array_equal(comm.allreduce(rows, name="subclass"),
                                      np.full((2, 3), comm.size, np.float32))
        param = torch.nn.Parameter(torch.ones(3))
        got = comm.allreduce(param, name="parameter")  # read only, so a leaf is fine as input
        assert torch.equal(got, torch.full((3,), float(comm.size)))
        with pytest.raises(concord.InvalidArgumentError, match="requires grad"):
            comm.allreduce_(param, name="parameter.out")
        for flags in (np.ones(3, bool), torch.ones(3, dtype=torch.bool)):
            with pytest.raises(concord.InvalidArgumentError, match="bool: Concord moves"):
                comm.allreduce(flags, name="flags")
            moved = comm.broadcast(flags, root=0, name="flags.broadcast")
            assert str(moved.dtype) in ("bool", "torch.bool") and bool(moved.all())
        np.testing.assert_array_equal(comm.allreduce(np.ones(2, np.float64), name="float"),
                                      np.full(2, comm.size, np.float64))


def test_names_sparse_tensors_and_negative_splits_refused_on_every_rank(comm):
    """A name that is not text, a sparse tensor and a negative split of this rank's own rows are
    refused with InvalidArgumentError on every rank, before anything is made or enqueued."""
    torch = import_torch()
    x = np.ones(4, np.float32)
    with pytest.raises(concord.InvalidArgumentError, match="name must be a str .*not int 5"):
        comm.allreduce(x, name=5)  # was bytes(5): five NUL bytes, read by C as an empty name
    with pytest.raises(concord.InvalidArgumentError, match="contains a NUL"):
        comm.allreduce(x, name="a\0b")
    sparse = torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (4,))
    with pytest.raises(concord.InvalidArgumentError,
                       match="allreduce input has layout torch.sparse_coo: .*to_dense"):
        comm.allreduce(sparse, name="sparse")
    with pytest.raises(concord.InvalidArgumentError, match="broadcast output has layout"):
        comm.broadcast(torch.ones(4), out=sparse, name="sparse.out")
    bad = [5] * comm.size
    bad[comm.rank] = -1  # every rank's own split is the negative one
    for rows in (np.ones((4, 2), np.float32), torch.ones(4, 2)):
        with pytest.raises(concord.InvalidArgumentError,
                           match="reducescatter split %d is negative" % comm.rank):
            comm.reducescatter(rows, recv_splits=bad, name="rs.negative")
    # Nothing was enqueued: the names are free and the communicator works.
    assert comm.allreduce(x, name="sparse").tolist() == [comm.size] * 4


def test_out_with_other_dimensions_is_refused(comm):
    """allgather, gather and alltoall return out cut to the rows received: an out whose
    dimensions after the first differ from the input's is refused naming both shapes (it gave a
    truncated result of another shape), through numpy and torch."""
    torch = import_torch()
    for make in (lambda shape: np.full(shape, -1, np.float32),
                 lambda shape: torch.full(shape, -1.0)):
        x = make((2, 3))
        for shape in [(12,), (3, 4), (2 * comm.size, 3, 1), (2 * comm.size, 1)]:
            out = make(shape)
            with pytest.raises(concord.InvalidArgumentError,
                               match=r"allgather output has shape %s, the input \[2, 3\]: .*"
                               r"dimensions after the first \(\[3\]\)" %
                               re.escape(str(list(shape)))):
                comm.allgather(x, out=out, name="ag.dims")
            # root=comm.rank: every rank is the root of its own call, refused before enqueue
            with pytest.raises(concord.InvalidArgumentError,
                               match=r"gather output has shape %s" % re.escape(str(list(shape)))):
                comm.gather(x, root=comm.rank, out=out, name="ga.dims")
            assert (np.asarray(out) == -1).all()  # untouched
        y = make((2 * comm.size, 2))
        with pytest.raises(concord.InvalidArgumentError,
                           match=r"alltoall output has shape \[%d, 3\], the input \[%d, 2\]"
                           % (2 * comm.size, 2 * comm.size)):
            comm.alltoall(y, out=make((2 * comm.size, 3)), name="a2a.dims")
        # The same calls with the input's trailing dimensions go through.
        got = comm.allgather(x, out=make((2 * comm.size + 1, 3)), name="ag.dims")
        assert tuple(got.shape) == (2 * comm.size, 3)
        got, received = comm.alltoall(y, out=make((2 * comm.size, 2)), name="a2a.dims")
        assert tuple(got.shape) == (2 * comm.size, 2) and received == [2] * comm.size


def test_struct_field_probe():
    """compression_supported() rests on this probe of the library's concord_allreduce_opts_t."""
    from concord import _lib
    L = concord.lib()
    size = _lib.library_struct_size(L, "concord_allreduce_opts_init")
    assert size >= 32  # struct_size, op, prescale, postscale
    opts = _lib.AllreduceOptsStruct
    assert _lib.struct_has_field(L, opts, "concord_allreduce_opts_init", "postscale")
    assert not _lib.struct_has_field(L, opts, "concord_allreduce_opts_init", "no_such_field")
    assert concord.compression_supported() == _lib.struct_has_field(
        L, opts, "concord_allreduce_opts_init", "compression")


def test_compression_without_library_support(comm):
    if concord.compression_supported():
        pytest.skip("this libconcord supports compression")
    with pytest.raises(concord.UnavailableError) as e:
        comm.allreduce(np.ones(4, np.float32), name="compressed", compression="fp16")
    assert isinstance(e.value, NotImplementedError)
    assert e.value.status == Status.ERR_UNAVAILABLE and "compression" in e.value.message
    comm.allreduce(np.ones(4, np.float32), name="uncompressed", compression="none")


def test_device_tensors_are_refused_clearly(comm):
    torch = import_torch()
    with pytest.raises(concord.UnavailableError,
                       match="allreduce input is a meta tensor: Concord takes CPU and CUDA "
                       "tensors"):
        comm.allreduce(torch.empty(4, device="meta"), name="meta")
    with pytest.raises(concord.InvalidArgumentError, match="requires grad"):
        comm.allreduce_(torch.zeros(2, requires_grad=True), name="leaf")
    with pytest.raises(concord.InvalidArgumentError, match="complex"):
        comm.allreduce(torch.zeros(2, dtype=torch.complex64), name="complex")


def test_cuda_tensors_without_gpu_backend(comm, monkeypatch):
    torch = import_torch()
    if not no_gpu_backend():
        pytest.skip("CONCORD_BACKEND=%s may start a GPU backend, which would take the fake "
                    "tensor's host memory for device memory" % os.environ["CONCORD_BACKEND"])
    from concord import _lib, device, tensors
    # torch's current stream, as the binding reads it (torch without CUDA has none to read).
    monkeypatch.setattr(tensors, "cuda_stream", lambda index: 0x5000 + index)
    t = fake_cuda_tensor(torch, torch.ones(2, 3))
    d = tensors.describe(t, "allreduce input")
    assert (d.device, d.struct.device, d.stream, d.ptr) == (0, 0, 0x5000, t.data_ptr())
    keep = []
    opts = device.options(d, keep)
    assert (opts.stream, opts.ready_event) == (0x5000, None)
    assert opts.struct_size == ctypes.sizeof(_lib.DeviceOptsStruct) and opts in keep
    # Refused at enqueue, naming the tensor, its device and what is missing; nothing enqueued.
    before = comm.stats()

    def fake(rows):
        return fake_cuda_tensor(torch, torch.ones(rows, 3))

    mine = 2 // comm.size + (1 if comm.rank < 2 % comm.size else 0)
    for what, call in [("allreduce input", lambda: comm.allreduce_(t, name="cuda.x")),
                       ("allreduce input", lambda: comm.allreduce(t, out=t, name="cuda.x")),
                       ("broadcast input", lambda: comm.broadcast_(t, name="cuda.x")),
                       ("allgather input",
                        lambda: comm.allgather(t, out=fake(2 * comm.size), name="cuda.x")),
                       ("reducescatter input",
                        lambda: comm.reducescatter(t, out=fake(mine), name="cuda.x")),
                       ("alltoall input",
                        lambda: comm.alltoall(fake(2 * comm.size), out=fake(2 * comm.size),
                                              name="cuda.x")),
                       ("reduce input", lambda: comm.reduce(t, root=comm.rank, name="cuda.x",
                                                            out=fake(2))),
                       ("gather input", lambda: comm.gather(t, root=comm.rank, name="cuda.x",
                                                            out=fake(2 * comm.size)))]:
        with pytest.raises(concord.UnavailableError) as e:
            call()
        assert e.value.status == Status.ERR_UNAVAILABLE
        message = str(e.value)
        assert message.startswith("ERR_UNAVAILABLE (8): %s is a CUDA tensor (cuda:0, shape "
                                  % what), message
        assert "'cuda.x' on CUDA device 0" in message and "GPU backend" in message, message
    for what, call in [("allgather", lambda: comm.allgather(t, name="cuda.x")),
                       ("alltoall", lambda: comm.alltoall(fake(2 * comm.size), name="cuda.x")),
                       ("gather", lambda: comm.gather(t, root=comm.rank, name="cuda.x"))]:
        with pytest.raises(concord.InvalidArgumentError,
                           match=r"%s of a CUDA tensor \(cuda:0\) needs out=" % what):
            call()
    if comm.size > 1:  # send and recv of CUDA tensors need a GPU backend as well
        other = (comm.rank + 1) % comm.size
        for what, call in [("send tensor", lambda: comm.send(t, other, tag=3)),
                           ("recv output", lambda: comm.recv(other, tag=3, out=t))]:
            with pytest.raises(concord.UnavailableError) as e:
                call()
            message = str(e.value)
            assert message.startswith("ERR_UNAVAILABLE (8): %s is a CUDA tensor (cuda:0, shape "
                                      % what), message
            assert "rank %d with tag 3: CUDA device 0" % other in message, message
            assert "GPU backend" in message, message
    after = comm.stats()
    assert after == before, (before, after)
    # The names are free: the same name on the CPU goes through.
    assert comm.allreduce(torch.ones(2, 3), name="cuda.x").tolist() == [[comm.size] * 3] * 2


def test_init_error_and_use_after_finalize(comm):
    with pytest.raises(concord.ConcordError) as e:
        concord.Communicator(lanes=99)
    assert e.value.status == Status.ERR_INVALID_ARGUMENT and "lanes" in e.value.message.lower()
    with pytest.raises(concord.InvalidArgumentError, match="waiter_progress"):
        concord.Communicator(waiter_progress=2)
    with pytest.raises(concord.InvalidArgumentError, match="deterministic = 2"):
        concord.Communicator(deterministic=2)
    # Every bad value fails at init, naming the field, the value and what is accepted.
    for fields, says in [
            ({"timeout_s": 0}, "concord_config_t.timeout_s = 0: the timeout must be in (0, 86400]"),
            ({"timeout_s": -5}, "concord_config_t.timeout_s = -5"),
            ({"timeout_s": float("nan")}, "concord_config_t.timeout_s = nan"),
            ({"cycle_time_ms": -2.0}, "concord_config_t.cycle_time_ms = -2"),
            ({"fusion_threshold_bytes": -5}, "concord_config_t.fusion_threshold_bytes = -5"),
            ({"direct_threshold_bytes": -2}, "concord_config_t.direct_threshold_bytes = -2"),
            ({"inline_threshold_bytes": 1 << 20}, "the inline threshold must be in [0, 262144]"),
            ({"cache_capacity": -3}, "concord_config_t.cache_capacity = -3"),
            ({"lanes": 0}, "concord_config_t.lanes = 0: the number of lanes must be in [1, 8]"),
            ({"log_level": 7}, "concord_config_t.log_level = 7"),
            ({"backend": "glo"}, "concord_config_t.backend = 'glo': not a backend"),
            ({"compression": "zstd:level=99"},
             "concord_config_t.compression = 'zstd:level=99': unknown compressor 'zstd'"),
            ({"compression": "topk"}, "topk needs a density")]:
        with pytest.raises(concord.InvalidArgumentError) as e:
            concord.Communicator(**fields)
        assert e.value.status == Status.ERR_INVALID_ARGUMENT
        assert says in e.value.message, (fields, e.value.message)
    os.environ["CONCORD_COMPRESSION"] = "bogus"  # read at init, refused there
    try:
        with pytest.raises(concord.InvalidArgumentError) as e:
            concord.Communicator(job_id="python-errors-bogus")
    finally:
        del os.environ["CONCORD_COMPRESSION"]
    assert "CONCORD_COMPRESSION = 'bogus': unknown compressor 'bogus'" in e.value.message
    with pytest.raises(concord.InvalidArgumentError, match="unknown config field"):
        concord.Communicator(no_such_field=1)
    second = concord.Communicator(job_id="python-errors-second")
    assert (second.rank, second.size) == (comm.rank, comm.size)
    second.allreduce(np.ones(2, np.float32), name="second")
    second.finalize()
    second.finalize()  # idempotent
    with pytest.raises(concord.ConcordError) as e:
        second.allreduce(np.ones(2, np.float32), name="after")
    assert e.value.status == Status.ERR_NOT_INITIALIZED
    with pytest.raises(concord.InvalidArgumentError, match="already called") as e:
        concord.init()
    assert e.value.status == Status.ERR_INVALID_ARGUMENT
