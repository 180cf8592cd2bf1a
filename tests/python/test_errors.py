"""Failures raised as Python exceptions carrying the C status and message: errors the C library
reports at enqueue, at completion and at init; mismatches between ranks; timeouts of a wait;
arguments the binding refuses before calling C; compression and device tensors this library
cannot take; use after finalize."""

import numpy as np
import pytest

import concord
from concord import Status


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


def test_wait_timeout_then_completion(comm):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    x = np.ones(8, np.float32)
    if comm.rank == 0:
        handle = comm.allreduce_async(x, out=x, name="late")
        with pytest.raises(concord.ConcordTimeoutError) as e:
            handle.wait(timeout=0.05)
        assert e.value.status == Status.ERR_TIMEOUT
        assert not handle.poll()
    # Operations are matched by name, so this broadcast completes while "late" waits; the other
    # ranks submit "late" only once rank 0's short wait has expired.
    comm.broadcast(np.zeros(1, np.int8), root=0, name="late.go")
    if comm.rank != 0:
        handle = comm.allreduce_async(x, out=x, name="late")
    handle.wait()
    np.testing.assert_array_equal(x, comm.size)


def test_python_side_refusals(comm):
    with pytest.raises(concord.InvalidArgumentError, match="int16"):
        comm.allreduce(np.zeros(3, np.int16), name="int16")
    with pytest.raises(concord.InvalidArgumentError, match="not C-contiguous"):
        comm.allreduce(np.zeros((4, 4), np.float32)[:, 1], name="strided")
    with pytest.raises(concord.InvalidArgumentError, match="numpy arrays and torch tensors"):
        comm.allreduce([1.0, 2.0], name="list")
    with pytest.raises(concord.InvalidArgumentError, match="unknown reduce op"):
        comm.allreduce(np.zeros(3, np.float32), name="x", op="median")
    frozen = np.zeros(3, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(concord.InvalidArgumentError, match="read-only"):
        comm.allreduce_(frozen, name="frozen")


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
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python "
                                "(apt-get install python3-torch)")
    with pytest.raises(concord.UnavailableError, match="CPU memory only"):
        comm.allreduce(torch.empty(4, device="meta"), name="meta")
    with pytest.raises(concord.InvalidArgumentError, match="requires grad"):
        comm.allreduce_(torch.zeros(2, requires_grad=True), name="leaf")
    with pytest.raises(concord.InvalidArgumentError, match="complex"):
        comm.allreduce(torch.zeros(2, dtype=torch.complex64), name="complex")


def test_init_error_and_use_after_finalize(comm):
    with pytest.raises(concord.ConcordError) as e:
        concord.Communicator(lanes=99)
    assert e.value.status == Status.ERR_INVALID_ARGUMENT and "lanes" in e.value.message.lower()
    with pytest.raises(concord.InvalidArgumentError, match="waiter_progress"):
        concord.Communicator(waiter_progress=2)
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
    with pytest.raises(concord.ConcordError, match="already called"):
        concord.init()
