"""Concord from Python, through its C API (libconcord) with ctypes: no compiled extension.

    import concord
    concord.init()                      # from concordrun / torchrun / Slurm / Open MPI variables
    x = numpy.ones(4, numpy.float32)
    concord.allreduce_(x, name="x", op="average")
    h = concord.allgather_async(x, name="g")
    try:
        gathered = h.wait(timeout=5)    # at most 5 s; a failure raises ConcordError
    except concord.WaitTimeoutError:    # not finished yet: it goes on; wait() again or poll()
        gathered = h.wait()

The module-level functions act on the default communicator that init() creates; Communicator
objects can also be made directly. PyTorch: concord.torch (DistributedOptimizer,
broadcast_parameters, broadcast_optimizer_state; importing it registers the torch.distributed
backend "concord", concord.torch_backend; concord.torch.hooks: DDP communication hooks).
"""
import enum

from ._lib import UNDEFINED
from .comm import Communicator
from .compression import check_compression, compression_supported
from .errors import (ConcordError, ConcordTimeoutError, InvalidArgumentError, Status,
                     UnavailableError, WaitTimeoutError)
from .handle import Handle, lib

__all__ = [
    "Communicator", "Handle", "ConcordError", "ConcordTimeoutError", "InvalidArgumentError",
    "UnavailableError", "WaitTimeoutError", "Status", "ReduceOp", "init", "finalize",
    "is_initialized", "default", "rank", "size", "local_rank", "local_size", "allreduce",
    "allreduce_", "allreduce_async", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "barrier", "barrier_async", "group", "compression_supported",
    "check_compression", "version", "status_string", "UNDEFINED", "send", "send_async", "recv",
    "recv_async",
]


class ReduceOp(enum.IntEnum):
    """concord_reduce_op_t. AVERAGE divides the sum by the number of ranks (integers truncate)."""

    SUM = 0
    AVERAGE = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4


_default = None


def init(**config):
    """Creates the default communicator (see Communicator for the keyword arguments) and returns
    it; an error if one exists already."""
    global _default
    if _default is not None:
        raise InvalidArgumentError(Status.ERR_INVALID_ARGUMENT,
                                   "concord.init() was already called")
    _default = Communicator(**config)
    return _default


def default():
    """The default communicator; ERR_NOT_INITIALIZED before init()."""
    if _default is None:
        raise ConcordError(Status.ERR_NOT_INITIALIZED, "call concord.init() first")
    return _default


def is_initialized():
    return _default is not None


def finalize():
    """Finalizes the default communicator (a last barrier with the other ranks)."""
    global _default
    if _default is not None:
        comm, _default = _default, None
        comm.finalize()


def version():
    """The loaded library's (major, minor, patch)."""
    import ctypes
    parts = [ctypes.c_int() for _ in range(3)]
    lib().concord_version(*[ctypes.byref(p) for p in parts])
    return tuple(p.value for p in parts)


def status_string(status):
    """The C library's name for a status code."""
    return lib().concord_status_string(int(status)).decode()


def rank():
    return default().rank


def size():
    return default().size


def local_rank():
    return default().local_rank


def local_size():
    return default().local_size


def _forward(method):
    def call(*args, **kwargs):
        return getattr(default(), method)(*args, **kwargs)

    call.__name__ = method
    call.__doc__ = getattr(Communicator, method).__doc__
    return call


allreduce = _forward("allreduce")
allreduce_ = _forward("allreduce_")
allreduce_async = _forward("allreduce_async")
allgather = _forward("allgather")
allgather_async = _forward("allgather_async")
broadcast = _forward("broadcast")
broadcast_ = _forward("broadcast_")
broadcast_async = _forward("broadcast_async")
barrier = _forward("barrier")
barrier_async = _forward("barrier_async")
group = _forward("group")
send = _forward("send")
send_async = _forward("send_async")
recv = _forward("recv")
recv_async = _forward("recv_async")
