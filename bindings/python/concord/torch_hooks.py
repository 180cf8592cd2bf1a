"""DDP communication hooks over Concord: concord.torch.hooks.

    from concord.torch import hooks
    model = torch.nn.parallel.DistributedDataParallel(net)         # over "concord"
    model.register_comm_hook(None, hooks.allreduce_hook(compression="fp16"))
    # DDP over gloo (or any group) with Concord for the gradients:
    model.register_comm_hook(None, hooks.allreduce_hook(comm=concord.init()))

DDP keeps its bucketing; each bucket it hands the hook is divided by the number of ranks (as
torch's default allreduce_hook does, before the reduction, so half-precision sums stay in range)
and enqueued as one asynchronous Concord allreduce (sum) in place, without waiting: buckets ready
in the same engine cycle are negotiated and fused together, and the hook's torch future completes
with the bucket, averaged over ranks, when the allreduce does (or holds its ConcordError, which
DDP raises from backward()). Buckets are named "<prefix>.bucket.<index>.v<layout>": the same names
every step, so negotiation hits the response cache and top-k keeps its error-feedback residual per
bucket; <layout> counts the changes of a bucket's parameters (DDP rebuilds its buckets once, after
the first step), so a residual never meets a different layout. A CUDA bucket goes to the device
backend (NCCL) in place, after the work queued on torch's current stream (the division
included); its future is for the bucket's device and completes when the allreduce has finished
on the GPU. A CUDA bucket on a communicator without a GPU backend raises UnavailableError from the
hook, naming the bucket and what is missing. A bucket of a sparse gradient (an Embedding with
sparse=True) is summed as torch's default hook sums it: every rank's entries allgathered
(uncompressed), averaged, as one sparse tensor.
"""
import itertools
import threading

import torch
import torch.distributed as dist

from . import comm as _comm
from ._sparse import SparseSum
from .compression import check_compression
from .errors import ConcordError, InvalidArgumentError, Status, make_error

_PREFIXES = itertools.count()


def _backend_of(group):
    try:
        return dist.get_backend(group)
    except (RuntimeError, ValueError):  # not a group torch.distributed knows
        return "unknown (a %s)" % type(group).__name__


class _AllreduceHook:
    """The state behind one allreduce_hook(): which communicator, which compression, and each
    bucket's layout (to name it). Thread-safe."""

    def __init__(self, comm, compression, prefix):
        self.comm = comm
        self.compression = compression
        self.prefix = prefix
        self._layouts = {}  # bucket index -> (its parameters' ids, layout number)
        self._lock = threading.Lock()

    def communicator(self, state):
        """comm= if given, else the state: a Communicator, or a process group of the concord
        backend (None: the default group, as torch's hooks take it). A process group given as
        the state must have as many ranks as the communicator."""
        if self.comm is None and isinstance(state, _comm.Communicator):
            return state
        group = state
        if group is None and (self.comm is None or dist.is_initialized()):
            group = dist.distributed_c10d._get_default_group()
        comm = self.comm if self.comm is not None else getattr(group, "comm", None)
        if comm is None:
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "concord allreduce_hook: the DDP model's process "
                "group (backend %s) is not a concord one: pass allreduce_hook(comm=a "
                "Communicator) or register_comm_hook(state=a Communicator)" % _backend_of(group))
        if isinstance(group, dist.ProcessGroup) and group.size() != comm.size:
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "concord allreduce_hook: the communicator has %d "
                "ranks, the process group %d: give a communicator of the group's ranks" %
                (comm.size, group.size()))
        return comm

    def name(self, bucket):
        index = bucket.index()
        layout = tuple(id(p) for p in bucket.parameters())
        with self._lock:
            seen, number = self._layouts.get(index, (layout, 0))
            if seen != layout:
                number += 1
            self._layouts[index] = (layout, number)
        return "%s.bucket.%d.v%d" % (self.prefix, index, number)

    def __call__(self, state, bucket):
        comm = self.communicator(state)
        buffer = bucket.buffer()
        name = self.name(bucket)
        if buffer.layout == torch.sparse_coo:
            return self.sparse(comm, bucket, buffer, name)
        future = (torch.futures.Future(devices=[buffer.device]) if buffer.is_cuda else
                  torch.futures.Future())
        holder = {}
        submitted = threading.Event()

        def fail():
            # A callback may not wait on its own operation: a thread takes the error.
            submitted.wait()
            try:
                holder["handle"].synchronize()
                error = RuntimeError("concord: allreduce %s failed without an error" % name)
            except Exception as e:  # the ConcordError with the library's message
                error = e
            future.set_exception(error)

        def callback(status):
            if status == Status.SUCCESS:
                future.set_result(buffer)
            else:
                threading.Thread(target=fail, daemon=True).start()

        try:
            buffer.div_(comm.size)
            holder["handle"] = comm.allreduce_async(buffer, out=buffer, op="sum", name=name,
                                                    compression=self.compression,
                                                    callback=callback)
        except ConcordError as e:
            raise make_error(e.status, "concord allreduce_hook, bucket %d (%s): %s" %
                             (bucket.index(), name, e.message)) from e
        submitted.set()
        # torch's Python set_exception stores the error as the value, which DDP's C++ side would
        # try to read as a tensor: value() in a then() raises it, and the chained future fails
        # with it as torch's own errors do (DDP raises it from backward()).
        return future.then(lambda done: done.value())

    def sparse(self, comm, bucket, buffer, name):
        """A bucket of one sparse gradient (an Embedding with sparse=True): every rank's entries
        allgathered (_sparse.SparseSum, uncompressed), averaged; the future gets the sum as one
        sparse tensor, as torch's default hook (all_reduce) gives it."""
        part = SparseSum(buffer, "concord allreduce_hook, bucket %d (%s)" % (bucket.index(), name))
        try:
            indices = comm.allgather_async(part.index_rows, name=name + ".indices")
            values = comm.allgather_async(part.value_rows, name=name + ".values")
        except ConcordError as e:
            raise make_error(e.status, "concord allreduce_hook, bucket %d (%s): %s" %
                             (bucket.index(), name, e.message)) from e
        future = torch.futures.Future()

        def complete():  # waits: on a thread of its own
            try:
                future.set_result(part.sum(indices.wait(), values.wait()) / comm.size)
            except Exception as e:  # the ConcordError with the library's message
                future.set_exception(e)

        threading.Thread(target=complete, daemon=True).start()
        return future.then(lambda done: done.value())


def allreduce_hook(compression=None, comm=None, prefix=None):
    """A DDP communication hook for model.register_comm_hook(state, hook) that averages each
    gradient bucket over the ranks through Concord (see the module's doc).

    compression: None (the communicator's default, CONCORD_COMPRESSION), "none", "fp16", "bf16"
    or "topk:density=D[,...]" (README, Compression); every rank must give the same. A spec the
    library cannot parse raises InvalidArgumentError here, naming it. comm: the Communicator
    that reduces the buckets; None: the state given to register_comm_hook if it is a
    Communicator, else the Communicator of the DDP model's process group (state: the group, or
    None for the default group), which must then be a concord one. A communicator other than
    the group's must have the group's ranks. prefix: the buckets' names begin with it (default
    "ddp.<n>", n counting the hooks made in this process: make them in the same order on every
    rank, or name them)."""
    check_compression(compression)
    if comm is not None and not isinstance(comm, _comm.Communicator):
        raise InvalidArgumentError(Status.ERR_INVALID_ARGUMENT,
                                   "comm must be a concord.Communicator, got %r" % (comm,))
    hook = _AllreduceHook(comm, compression, prefix or "ddp.%d" % next(_PREFIXES))

    def concord_allreduce_hook(state, bucket):
        return hook(state, bucket)

    return concord_allreduce_hook
