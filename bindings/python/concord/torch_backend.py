"""The torch.distributed backend "concord": a ProcessGroup written in Python over a Communicator.

`import concord.torch` registers it (register()); then
`torch.distributed.init_process_group("concord", rank=, world_size=, store= / init_method=)` (or
torchrun's variables) makes a ProcessGroupConcord whose collectives run through Concord's engine.
CUDA tensors: every collective (all_reduce, reduce, broadcast, all_gather,
all_gather_into_tensor, gather, reduce_scatter, reduce_scatter_tensor, all_to_all,
all_to_all_single, and scatter, which is all_to_all_single's path: not yet run on a GPU) goes to
the device backend (NCCL) without a host copy, ordered after torch's
current stream; a work's wait() makes the current stream wait for the operation (into a list of
tensors: the host waits, for the copies into the list), its future (for the tensors' device)
completes when the operation has. send and recv take CUDA tensors too: they travel through host
memory (the binding's send and recv), the send's copy after torch's current stream.

One class serves torch 1.13 and 2.x (tested: 1.13, 2.9.1 and 2.15.0), no compiled code: both let a
backend's creator return a Python subclass of ProcessGroup (torch 2.x's pybind trampoline), which
torch then uses as the whole group, for every device; 2.x's C++ Backend has no such trampoline.
On torch 2.x the backend is registered for the device "cpu", so "concord" and "cpu:concord" name
it. A string that maps another device to another backend ("cpu:concord,cuda:nccl") cannot be
honoured (torch would use this group alone, for every device): the group's first call raises
InvalidArgumentError naming the string.

Each collective enqueues one Concord operation with a completion callback and returns a _Work
(a Python subclass of torch's Work) over a torch future: wait() raises the operation's error,
get_future() and is_completed() behave as torch's. The callback (on the thread that completes the
operation) copies results where torch wants them and completes the future; a failure is handed to
a short thread that waits for the operation's Handle (a callback may not wait) and sets the
future's exception to the ConcordError with the library's message. torch 1.13's C++ side (DDP's
reducer) holds a Python Work only as its C++ base, which forgets the Python object: the group
keeps each _Work that torch's C++ side may hold alive until it is done and wait() or get_future()
was called on it. A _Work returned to Python code by torch.distributed's functions
(dist.all_reduce(..., async_op=True), isend, ...) is its caller's: the group drops it once done,
waited for or not. all_to_all, all_to_all_single and scatter check the rows each rank sent
against the output sizes once the operation is over (a callback may not read them): a short
daemon thread per operation completes those works (its future's callbacks then run there, and
may wait for other works). Once an operation is over its Handle is completed (the binding's
request and the tensors the engine used freed) by that thread, the failure's, or _Releaser's
(one per process), not left for the communicator's next submission.

scatter runs on Concord's all-to-all: the root sends scatter_list[i]'s elements to rank i, the
others send none, so each rank receives only its piece.

init_process_group's (and new_group's) timeout= becomes the communicator's timeout_s unless
CONCORD_TIMEOUT_S is set or torch gives its default (see _timeout_config).

Tensors that are not contiguous (transposed, channels_last) go through a contiguous copy in
all_reduce, reduce, broadcast, send and recv, copied back into them once done; send and recv move
a flat run of elements (a message fits a recv of its number of elements and dtype, in any shape),
as torch's own backends. torch 2.x's destroy_process_group calls shutdown(), which finalizes the
group's Communicator; its group_name and group_desc are kept on the group (torch keeps them on
per-device Backends, which a Python group has none of).

Rendezvous: rank 0 of the group chooses a job id and a token and puts them in torch's store; with
CONCORD_STORE set (concordrun) every rank joins that store under the new job id, otherwise rank 0
serves Concord's store on a free port of its address (MASTER_ADDR, else CONCORD_HOST, else
127.0.0.1), which the other ranks read from torch's store.
"""
import inspect
import json
import os
import queue
import socket
import sys
import threading
import uuid
import warnings

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from . import comm as _comm
from ._sparse import SparseSum
from .errors import (InvalidArgumentError, Status, UnavailableError, WaitTimeoutError,
                     make_error)

BACKEND = "concord"
# torch's ReduceOp names -> Concord's reduce ops. BAND, BOR, BXOR and PREMUL_SUM have no Concord
# counterpart in any version.
_OPS = {"SUM": "sum", "AVG": "average", "MIN": "min", "MAX": "max", "PRODUCT": "product"}
_ENV_LOCK = threading.Lock()


def _op_name(op):
    """torch.distributed.ReduceOp (a class in torch >= 1.13 with .op, an enum before) -> name."""
    kind = getattr(op, "op", op)
    return getattr(kind, "name", str(kind).split(".")[-1])


def _reduce_op(op, what):
    name = _op_name(op)
    if name not in _OPS:
        raise UnavailableError(
            Status.ERR_UNAVAILABLE,
            "%s: ReduceOp.%s is not supported by the concord backend (no Concord version has "
            "it); it takes %s" % (what, name, ", ".join("ReduceOp." + n for n in _OPS)))
    return _OPS[name]


def _op_of(opts):
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def _one(tensors, what):
    if len(tensors) != 1:
        raise InvalidArgumentError(
            Status.ERR_INVALID_ARGUMENT,
            "%s: the concord backend takes one tensor per call, got %d" % (what, len(tensors)))
    return tensors[0].detach()  # parameters require grad; the backend writes behind autograd


def _dense(t, copy_back=True):
    """Where an operation on t (detached) runs, and what copies its result into t afterwards: t
    and None when t is contiguous, else a contiguous copy and (copy_back) a function that copies
    it into t (gloo takes a transposed or channels_last tensor too, and fills it in place)."""
    if t.is_contiguous():
        return t, None
    target = t.contiguous()
    return target, (lambda: t.copy_(target)) if copy_back else None


def _cuda(t):
    """The torch.device of a CUDA tensor, else None (CPU, and devices the binding refuses)."""
    return t.device if t.is_cuda else None


def _rows(t):
    """t as a contiguous 2-d (1, numel) input (a view when t is contiguous, else a copy):
    Concord's gathers and scatters split along dimension 0."""
    return t.detach().reshape(1, t.numel()).contiguous()


def _into(output, shape):
    """Where a collective writes `output`, seen as `shape` (as many elements), and what copies it
    into output afterwards: output itself (a view) and None when output is contiguous, else a new
    contiguous tensor and a function that copies it into output (gloo fills a non-contiguous
    output too; a reshape would copy it, and the result would never reach the caller)."""
    out = output.detach()
    if out.is_contiguous():
        return out.view(shape), None
    buffer = torch.empty(shape, dtype=out.dtype, device=out.device)
    return buffer, lambda: out.copy_(buffer.view(out.shape))


# The file of torch.distributed's functions (dist.all_reduce, ...): a collective called from there
# returns its Work to Python code (see the module doc). Not all_reduce.__code__'s: torch 2.x wraps
# the functions in decorators of another file.
_C10D_FILE = dist.distributed_c10d.__file__


def _returned_to_python(depth):
    """Whether the frame `depth` levels up (the caller of a collective method) is one of
    torch.distributed's functions: they call the group from Python and keep its Work in Python.
    Anything else (torch's C++ side, DDP's reducer) may hold the Work as its C++ base only."""
    try:
        return sys._getframe(depth + 1).f_code.co_filename == _C10D_FILE
    except ValueError:  # no Python frame there: called from C++ on a thread of its own
        return False


class _Releaser:
    """Completes the Handles of operations whose callback has run, on one daemon thread of the
    process, so that their requests and the tensors the engine used are freed as soon as they
    finish. Neither can happen in the callback (its request is still IN_PROGRESS there, and a
    callback must not wait), and a Handle merely dropped waits in the binding's orphan list for
    the communicator's next submission or finalize: a job that ended its collectives and went on
    to a long evaluation kept its last operations' buffers. put(holder, submitted): called by an
    operation's callback; the thread waits for `submitted` (then holder["handle"] is the Handle,
    or absent: the enqueue failed), then for the callback to return (Handle.synchronize, which
    never waits longer: the operation is over), and drops the Handle. Its errors were reported
    through the work's future already. A forked child starts a thread (and queue) of its own
    for its own operations; the parent's queued ones are never completed there (the binding
    frees nothing of the parent's in a child)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._queue = None
        self._pid = None

    def put(self, holder, submitted):
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._queue = queue.SimpleQueue()
                    threading.Thread(target=self._loop, args=(self._queue,), daemon=True,
                                     name="concord-torch-release").start()
                    self._pid = os.getpid()
        self._queue.put((holder, submitted))

    @staticmethod
    def _loop(pending):
        while True:
            holder, submitted = pending.get()
            submitted.wait()
            handle = holder.get("handle")
            del holder, submitted
            if handle is not None:
                try:
                    handle.synchronize()
                except Exception:
                    pass  # the work's future carries the operation's error
                del handle


_release = _Releaser().put


class _Work(dist.Work):
    """One collective's torch Work: wait() returns True or raises the operation's error (torch's
    Work.wait raises too); get_future() is completed with the outputs, as torch's are."""

    def __init__(self, group, future, stream_wait=None):
        super().__init__()
        self._group = group
        self._future = future
        self._stream_wait = stream_wait  # CUDA: makes the current stream wait (the Handle's)
        self.claimed = False  # wait() or get_future() was called (under the group's lock)
        self.done = False  # the operation ended; set before the future completes
        self._done_event = None  # set by the future's done callback, once a wait needs it

    def _claim(self):
        # Someone holds the result now: the group may drop its reference once the work is done.
        self._group._settle(self, claimed=True)

    def wait(self, timeout=None):
        """Waits for the operation (and its copies); raises its ConcordError if it failed. With a
        timeout (torch's timedelta; zero or None: none) that passes first, raises
        concord.WaitTimeoutError (a TimeoutError: the operation goes on; wait again)."""
        self._claim()
        if not self._future.done():
            self._group.comm._live()  # a forked child: the parent's work never completes here
        seconds = None if timeout is None else timeout.total_seconds()
        if seconds and not self._wait_done(seconds):
            raise WaitTimeoutError(seconds)
        if self._stream_wait is not None:
            self._stream_wait()  # raises the ConcordError of an operation that failed so far
        else:
            self._wait_done(None)
            self._future.wait()  # done: raises the ConcordError of a failed operation
        return True

    def _wait_done(self, seconds):
        """Whether the future is done within `seconds` (None: no limit). torch's futures have no
        wait with a limit, and their wait() is one C++ call that Ctrl-C cannot interrupt; this
        waits on an Event that the future's callback sets, whose wait Python interrupts
        (KeyboardInterrupt; the operation goes on)."""
        if self._future.done():
            return True
        done = self._done_event
        if done is None:  # one Event per work, however often it is waited for
            done = self._done_event = threading.Event()
            self._future.add_done_callback(lambda _: done.set())
        return done.wait(seconds)

    def get_future(self):
        self._claim()
        return self._future

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        return self._future.done() and self.exception() is None

    def exception(self):
        if not self._future.done():
            return None
        try:
            self._future.value()
            return None
        except Exception as e:
            return e

    def result(self):
        return self._future.wait() or []


class ProcessGroupConcord(dist.ProcessGroup):
    """A torch.distributed process group over one Concord Communicator (its own engine and
    rendezvous). Calls are matched across ranks by a per-group sequence number, as torch requires
    every rank to issue a group's collectives in the same order. CUDA tensors: see the module
    doc."""

    def __init__(self, comm, rank, size):
        super().__init__(rank, size)
        self.comm = comm
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._works = set()  # the _Works not yet done or never waited for (see the module doc)
        self._refusal = None  # the error every call raises (a device-mapped string), once known
        self._config_checked = False

    def getBackendName(self):
        return BACKEND

    # torch 2.x asks a group for its per-device Backend (batch_isend_irecv, device_id, splitting,
    # abort): this group is its own, for every device (see the module doc), and neither coalesces
    # nor splits nor estimates times, so torch takes its plain paths. torch 2.15's
    # batch_isend_irecv failed without it ("No backend type associated with device type cpu").
    supports_coalescing = False
    supports_splitting = False
    supports_time_estimate = False
    _supports_time_estimate = False

    def _get_backend(self, device):
        return self

    # torch 2.x keeps a group's name and description on its per-device Backends, which a group
    # written in Python has none of ("ProcessGroup name not set": destroy_process_group(group)
    # failed reading it): kept here. torch 1.13 neither sets nor reads them.
    _group_name = None
    _group_desc = None

    def _set_group_name(self, name):
        self._group_name = name

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_name(self):
        return self._group_name

    @property
    def group_desc(self):
        return self._group_desc

    def shutdown(self):
        """Finalizes the group's Communicator (its last barrier with the group's other ranks):
        torch 2.x's destroy_process_group calls it on every rank of the group, so the engine's
        threads and connections go then, not at exit (torch 1.13's calls nothing: they go at
        exit). Works still pending fail; later calls raise ConcordError (NOT_INITIALIZED)."""
        self.comm.finalize()

    def _name(self, kind):
        with self._seq_lock:
            self._seq += 1
            return "torch.%s.%d" % (kind, self._seq)

    def _check_config(self):
        """Refuses a device-mapped string that gives another device another backend (torch 2.x
        records it only after the creator returned: checked at the first call)."""
        self._config_checked = True
        config = getattr(dist, "get_backend_config", None)  # torch >= 2.1
        if config is None:
            return
        pairs = [p.strip().split(":") for p in config(self).split(",") if ":" in p]
        others = ["%s:%s" % (d, b) for d, b in pairs if b != BACKEND]
        if others:
            self._refusal = InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "the backend string '%s' maps %s: a process group "
                "written in Python (concord) serves every device of its group in torch %s, so "
                "it cannot share one; use \"concord\" (or \"cpu:concord\") and a separate group "
                "(dist.new_group) for the other backend" % (config(self), " and ".join(others),
                                                             torch.__version__))

    def _run(self, submit, result, finish=None, cuda=None, verify=None):
        """submit(callback) enqueues and returns a Handle; the Work's future gets `result` after
        finish() ran (on success), or the operation's ConcordError. cuda: the torch.device of an
        operation on CUDA tensors: its future is for that device; without finish, wait() makes
        the current stream wait for the operation; finish() (copies) runs on the completing
        thread once the operation has finished on the GPU, and the host waits for it.
        verify(value): called with the Handle's result once the operation succeeded, before
        finish(); what it raises fails the work (the work is completed on a thread of its own).
        Called by the collective methods only (it looks at their caller's frame)."""
        from_python = _returned_to_python(2)
        if not self._config_checked:
            self._check_config()
        if self._refusal is not None:
            raise self._refusal
        future = torch.futures.Future(devices=[cuda]) if cuda is not None else \
            torch.futures.Future()
        holder = {}
        stream_wait = None
        if cuda is not None and finish is None:
            def stream_wait():
                value = holder["handle"].wait()
                if verify is not None:
                    verify(value)
        work = _Work(self, future, stream_wait)
        # Returned to Python: the caller holds the work, or dropped it (then nobody needs it).
        work.claimed = from_python
        submitted = threading.Event()
        if cuda is not None and finish is not None:
            copy = finish

            def finish():
                with torch.cuda.device(cuda):
                    copy()
                    torch.cuda.current_stream(cuda).synchronize()

        def fail():
            submitted.wait()
            try:
                holder["handle"].synchronize()
                error = RuntimeError("concord: the operation failed without an error")
            except Exception as e:  # the ConcordError with the library's message
                error = e
            self._settle(work, done=True)
            future.set_exception(error)

        def succeed():
            try:
                if verify is not None:
                    submitted.wait()
                    verify(holder["handle"].synchronize())  # over: it does not block
                if finish is not None:
                    finish()
                self._settle(work, done=True)
                future.set_result(result)
            except Exception as e:
                self._settle(work, done=True)
                future.set_exception(e)

        def callback(status):
            if status == Status.SUCCESS:
                if verify is not None:
                    # The result is readable once the callback returned.
                    threading.Thread(target=succeed, daemon=True).start()
                else:
                    succeed()
                    # Its Handle is completed (request and tensors freed) once this returns;
                    # the threads above complete theirs themselves.
                    _release(holder, submitted)
            else:
                threading.Thread(target=fail, daemon=True).start()

        with self._seq_lock:
            self._works.add(work)
        try:
            holder["handle"] = submit(callback)
        except BaseException:
            self._settle(work, claimed=True, done=True)
            raise
        finally:
            submitted.set()  # those waiting for the Handle find it, or none (never called back)
        return work

    def _settle(self, work, claimed=False, done=False):
        """Drops the group's reference to `work` once it is done and claimed. Done is settled
        before the future completes, so a waiter that returns finds the work dropped."""
        with self._seq_lock:
            work.claimed |= claimed
            work.done |= done
            if work.claimed and work.done:
                self._works.discard(work)

    # ---- collectives (torch 1.13's ProcessGroup method names and arguments) ----
    # all_reduce, reduce, broadcast, send and recv take tensors that are not contiguous through
    # a contiguous copy (_dense).
    def allreduce(self, tensors, opts=None):
        if _one(tensors, "allreduce").layout == torch.sparse_coo:
            submit, finish, verify = self._sparse_sum(tensors[0], opts)
            return self._run(submit, tensors, finish, verify=verify)
        t, finish = _dense(_one(tensors, "allreduce"))
        op = _reduce_op(_op_of(opts), "allreduce")
        return self._run(lambda cb: self.comm.allreduce_async(
            t, out=t, op=op, name=self._name("allreduce"), callback=cb), tensors, finish,
            cuda=_cuda(t))

    def _sparse_sum(self, t, opts):
        """all_reduce of a sparse COO tensor, as gloo's (DDP's gradients of an Embedding with
        sparse=True): the sum over ranks (_sparse.SparseSum: two allgathers), coalesced, copied
        into t, which takes its entries (t itself: a detached alias of a sparse tensor would take
        them alone). ReduceOp.SUM only, as gloo. Returns _run's submit, finish and verify: the
        values' allgather is the work's operation, and finish waits for the indices' too."""
        if _op_name(_op_of(opts)) != "SUM":
            raise UnavailableError(
                Status.ERR_UNAVAILABLE, "all_reduce of a sparse tensor: the concord backend "
                "sums sparse tensors only (ReduceOp.SUM), as gloo; got ReduceOp.%s" %
                _op_name(_op_of(opts)))
        name = self._name("allreduce")
        part = SparseSum(t, "all_reduce of a sparse tensor (%s)" % name)
        indices = self.comm.allgather_async(part.index_rows, name=name + ".indices")
        gathered = {}

        def verify(values):
            gathered["values"] = values

        def finish():
            summed = part.sum(indices.wait(), gathered.pop("values")).coalesce()
            with torch.no_grad():
                t.copy_(summed)

        return (lambda cb: self.comm.allgather_async(part.value_rows, name=name + ".values",
                                                     callback=cb)), finish, verify

    def reduce(self, tensors, opts=None):
        """Concord's reduce: the root's tensor gets the result, the others' are left alone."""
        t, finish = _dense(_one(tensors, "reduce"), copy_back=self.rank() == opts.rootRank)
        op = _reduce_op(_op_of(opts), "reduce")
        return self._run(lambda cb: self.comm.reduce_async(
            t, root=opts.rootRank, out=t, op=op, name=self._name("reduce"), callback=cb), tensors,
            finish, cuda=_cuda(t))

    def broadcast(self, tensors, opts=None):
        t, finish = _dense(_one(tensors, "broadcast"), copy_back=self.rank() != opts.rootRank)
        return self._run(lambda cb: self.comm.broadcast_async(
            t, root=opts.rootRank, out=t, name=self._name("broadcast"), callback=cb), tensors,
            finish, cuda=_cuda(t))

    def allgather(self, output_lists, input_tensors, opts=None):
        t = _one(input_tensors, "allgather")
        outputs = output_lists[0]
        if len(output_lists) != 1 or len(outputs) != self.size():
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT,
                "allgather: expected one output list of %d tensors" % self.size())
        self._check_each(outputs, t, "all_gather")
        buffer = torch.empty((self.size(), t.numel()), dtype=t.dtype, device=t.device)

        def finish():
            for i, o in enumerate(outputs):
                o.detach().copy_(buffer[i].view(o.shape))

        return self._run(lambda cb: self.comm.allgather_async(
            _rows(t), out=buffer, name=self._name("allgather"), callback=cb), output_lists,
            finish, cuda=_cuda(t))

    def _allgather_base(self, output, input, opts=None):
        self._check_total(output, input, "all_gather_into_tensor")
        target, finish = _into(output, (self.size(), input.numel()))
        return self._run(lambda cb: self.comm.allgather_async(
            _rows(input), out=target, name=self._name("allgather"), callback=cb), [output],
            finish, cuda=_cuda(input))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        o = _one(outputs, "reduce_scatter")
        inputs = input_lists[0]
        if len(input_lists) != 1 or len(inputs) != self.size():
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT,
                "reduce_scatter: expected one input list of %d tensors" % self.size())
        op = _reduce_op(_op_of(opts), "reduce_scatter")
        stacked = torch.cat([_rows(x) for x in inputs])
        target, finish = _into(o, (1, o.numel()))
        return self._run(lambda cb: self.comm.reducescatter_async(
            stacked, out=target, op=op, name=self._name("reducescatter"), callback=cb), outputs,
            finish, cuda=_cuda(o))

    def _reduce_scatter_base(self, output, input, opts=None):
        self._check_total(input, output, "reduce_scatter_tensor")
        op = _reduce_op(_op_of(opts), "reduce_scatter_tensor")
        target, finish = _into(output, (1, output.numel()))
        return self._run(lambda cb: self.comm.reducescatter_async(
            input.detach().reshape(self.size(), output.numel()).contiguous(), out=target, op=op,
            name=self._name("reducescatter"), callback=cb), [output], finish,
            cuda=_cuda(output))

    def alltoall_base(self, output, input, output_splits, input_splits,
                      opts=None):
        """all_to_all_single: a rank whose output_split_sizes (or even split of the output) are
        not the rows the ranks sent it fails with ConcordError (status MISMATCH) naming both."""
        splits = list(input_splits) if len(input_splits) else None
        if output.dim() == 0:
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "all_to_all_single: the output has no dimension")
        rows = output.shape[0]
        if len(output_splits):
            expected = [int(n) for n in output_splits]
            if len(expected) != self.size():
                raise InvalidArgumentError(
                    Status.ERR_INVALID_ARGUMENT, "all_to_all_single: %d output_split_sizes for "
                    "%d ranks" % (len(expected), self.size()))
            if sum(expected) != rows:
                raise InvalidArgumentError(
                    Status.ERR_INVALID_ARGUMENT, "all_to_all_single: output_split_sizes add up "
                    "to %d, the output has %d rows" % (sum(expected), rows))
        elif rows % self.size():
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "all_to_all_single: the output's %d rows do not "
                "divide among %d ranks; give output_split_sizes" % (rows, self.size()))
        else:
            expected = [rows // self.size()] * self.size()
        name = self._name("alltoall")
        source = input.detach().contiguous()
        target, finish = _into(output, output.shape)

        def verify(value):
            self._check_received(name, "all_to_all_single", "rows", expected, value[1])

        return self._run(lambda cb: self.comm.alltoall_async(
            source, splits=splits, out=target, name=name, callback=cb), [output], finish,
            cuda=_cuda(input), verify=verify)

    def alltoall(self, outputs, inputs, opts=None):
        if len(inputs) != self.size() or len(outputs) != self.size():
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT,
                "all_to_all: expected %d input and %d output tensors" % (self.size(),
                                                                         self.size()))
        flat = torch.cat([x.detach().reshape(-1) for x in inputs])
        expected = [o.numel() for o in outputs]
        buffer = torch.empty(sum(expected), dtype=flat.dtype, device=flat.device)
        name = self._name("alltoall")

        def verify(value):  # before finish: the outputs are left alone on a mismatch
            self._check_received(name, "all_to_all", "elements", expected, value[1])

        def finish():
            at = 0
            for o in outputs:
                o.detach().copy_(buffer[at:at + o.numel()].view(o.shape))
                at += o.numel()

        return self._run(lambda cb: self.comm.alltoall_async(
            flat, splits=[x.numel() for x in inputs], out=buffer, name=name, callback=cb),
            outputs, finish, cuda=_cuda(flat), verify=verify)

    def _check_received(self, name, what, unit, expected, received):
        """Raises MISMATCH when an all-to-all brought this rank other sizes than its outputs'."""
        if list(received) != list(expected):
            raise make_error(
                Status.ERR_MISMATCH, "%s '%s': rank %d expected %s %s from ranks 0..%d (its "
                "output sizes), the ranks sent it %s" % (what, name, self.rank(), expected, unit,
                                                          self.size() - 1, list(received)))

    # torch >= 2.15 calls these by their new names (same arguments).
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_to_all_single = alltoall_base

    def barrier(self, opts=None):
        return self._run(lambda cb: self.comm.barrier_async(callback=cb), None)

    # send and recv move a flat run of elements, as torch's backends do: a recv takes a message
    # of its number of elements and dtype in any shape (Concord's own recv wants the shape too).
    def send(self, tensors, dst, tag=0):
        t, _ = _dense(_one(tensors, "send"), copy_back=False)
        return self._run(lambda cb: self.comm.send_async(t.view(-1), dst, tag, callback=cb),
                         tensors, cuda=_cuda(t))

    def recv(self, tensors, src, tag=0):
        t, finish = _dense(_one(tensors, "recv"))
        return self._run(lambda cb: self.comm.recv_async(src, tag, out=t.view(-1), callback=cb),
                         tensors, finish, cuda=_cuda(t))

    def _check_total(self, big, small, what):
        if big.numel() != small.numel() * self.size():
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "%s: the larger tensor has %d elements, not %d x %d"
                % (what, big.numel(), self.size(), small.numel()))

    @staticmethod
    def _check_each(outputs, input, what):
        """Refuses, before anything is sent, an output of a list that cannot take the input's
        elements (it used to fail once the operation was over, with torch's view error)."""
        for i, o in enumerate(outputs):
            if o.numel() != input.numel() or o.dtype != input.dtype:
                raise InvalidArgumentError(
                    Status.ERR_INVALID_ARGUMENT, "%s: output tensor %d is %s of %d elements, the "
                    "input %s of %d: each output must have the input's number of elements and "
                    "dtype" % (what, i, o.dtype, o.numel(), input.dtype, input.numel()))

    def _unsupported(self, what):
        raise UnavailableError(
            Status.ERR_UNAVAILABLE, "%s is not supported by the concord backend (Concord has "
            "allreduce, reduce, allgather, gather, broadcast, reducescatter, alltoall, send/recv, "
            "barrier)" % what)

    def gather(self, output_lists, input_tensors, opts=None):
        """Concord's gather: on the root, output_lists is one list of size()
        tensors of the input's number of elements; the other ranks' is ignored (torch passes
        an empty one)."""
        t = _one(input_tensors, "gather")
        root = opts.rootRank
        buffer, finish = None, None
        if self.rank() == root:
            if len(output_lists) != 1 or len(output_lists[0]) != self.size():
                raise InvalidArgumentError(
                    Status.ERR_INVALID_ARGUMENT,
                    "gather: expected one output list of %d tensors on the root" % self.size())
            outputs = output_lists[0]
            self._check_each(outputs, t, "gather")
            buffer = torch.empty((self.size(), t.numel()), dtype=t.dtype, device=t.device)

            def finish():
                for i, o in enumerate(outputs):
                    o.detach().copy_(buffer[i].view(o.shape))

        return self._run(lambda cb: self.comm.gather_async(
            _rows(t), root=root, out=buffer, name=self._name("gather"), callback=cb),
            output_lists, finish, cuda=_cuda(t))

    def scatter(self, output_tensors, input_tensors, opts=None):
        """torch's scatter on Concord's all-to-all: the root sends scatter_list[i] (its elements,
        flat) to rank i, the other ranks send nothing, and every rank's output receives the
        root's scatter_list[rank]. On the root input_tensors is one list of size() tensors of
        the output's shape, dtype and device (else InvalidArgumentError before anything is
        sent); the other ranks' is ignored (torch passes an empty one). A rank whose output has
        more elements than the root sent it fails with MISMATCH naming both (fewer: the
        library's INVALID_ARGUMENT naming both sizes); another dtype than the root's fails with
        MISMATCH on every rank."""
        o = _one(output_tensors, "scatter")
        root = opts.rootRank
        if self.rank() == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self.size():
                raise InvalidArgumentError(
                    Status.ERR_INVALID_ARGUMENT,
                    "scatter: expected one input list of %d tensors on the root" % self.size())
            for i, x in enumerate(input_tensors[0]):
                if x.shape != o.shape or x.dtype != o.dtype or x.device != o.device:
                    raise InvalidArgumentError(
                        Status.ERR_INVALID_ARGUMENT, "scatter: scatter_list[%d] is %s %s on %s, "
                        "the output tensor %s %s on %s: each must have the output's shape, "
                        "dtype and device" % (i, x.dtype, list(x.shape), x.device, o.dtype,
                                              list(o.shape), o.device))
            source = torch.cat([x.detach().reshape(-1) for x in input_tensors[0]])
            splits = [o.numel()] * self.size()
        else:
            source = torch.empty(0, dtype=o.dtype, device=o.device)
            splits = [0] * self.size()
        name = self._name("scatter")
        target, finish = _into(o, (o.numel(),))
        expected = [o.numel() if r == root else 0 for r in range(self.size())]

        def verify(value):  # before finish: a non-contiguous output is not copied into then
            self._check_received(name, "scatter", "elements", expected, value[1])

        return self._run(lambda cb: self.comm.alltoall_async(
            source, splits=splits, out=target, name=name, callback=cb), output_tensors, finish,
            cuda=_cuda(o), verify=verify)

    def recv_anysource(self, *args, **kwargs):
        self._unsupported("recv from any source")

    def allreduce_coalesced(self, *args, **kwargs):
        self._unsupported("all_reduce_coalesced")

    def allgather_coalesced(self, *args, **kwargs):
        self._unsupported("all_gather_coalesced")


def _free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _rendezvous(store, rank):
    """Rank 0's choice of job id, token and (without CONCORD_STORE) store address, through
    torch's store."""
    key = "concord/rendezvous"
    if rank == 0:
        info = {"job_id": "torch-" + uuid.uuid4().hex, "token": uuid.uuid4().hex}
        if not os.environ.get("CONCORD_STORE"):
            host = os.environ.get("MASTER_ADDR") or os.environ.get("CONCORD_HOST") or "127.0.0.1"
            loopback = host.startswith("127.") or host == "localhost"
            info["addr"] = host
            info["port"] = _free_port("127.0.0.1" if loopback else "0.0.0.0")
        store.set(key, json.dumps(info))
    return json.loads(store.get(key).decode())


# The library's longest timeout (CONCORD_TIMEOUT_S, concord_config_t.timeout_s): a day.
_MAX_TIMEOUT_S = 86400.0


def _timeout_config(timeout):
    """The communicator's timeout_s for init_process_group's (or new_group's) timeout=, as a
    config dict: none (Concord's own setting applies) when CONCORD_TIMEOUT_S is set, as it is
    this run's explicit choice for Concord while a script's timeout= is written once for every
    backend, or when torch gives its default (30 minutes: what it passes when the caller gave
    none); longer than the library's limit (a day) is taken as a day, with a warning; zero or
    less is refused naming it."""
    if timeout is None or os.environ.get("CONCORD_TIMEOUT_S") or timeout == default_pg_timeout:
        return {}
    seconds = timeout.total_seconds()
    if seconds <= 0:
        raise InvalidArgumentError(
            Status.ERR_INVALID_ARGUMENT, "init_process_group's timeout=%s: the concord backend "
            "takes a timeout above 0 (at most %d s)" % (timeout, _MAX_TIMEOUT_S))
    if seconds > _MAX_TIMEOUT_S:
        warnings.warn("init_process_group's timeout=%s is longer than Concord's longest "
                      "timeout: the concord backend uses %d s" % (timeout, _MAX_TIMEOUT_S))
        seconds = _MAX_TIMEOUT_S
    return {"timeout_s": seconds}


def create_process_group(store, rank, size, timeout):
    """torch's backend creator (torch 1.13 and 2.x call it so, the backend being registered
    without extended_api): a ProcessGroupConcord over a new Communicator of `size` ranks, whose
    timeout is torch's `timeout` (see _timeout_config)."""
    config = {"rank": rank, "size": size, **_timeout_config(timeout)}
    info = _rendezvous(store, rank)
    config["job_id"] = info["job_id"]
    if "port" not in info:  # concordrun's store (CONCORD_STORE, CONCORD_TOKEN)
        return ProcessGroupConcord(_comm.Communicator(**config), rank, size)
    config["token"] = info["token"]
    # Concord serves its store on rank 0 when MASTER_ADDR/MASTER_PORT are set (at MASTER_PORT + 1),
    # read at init only: set for this init, then restored.
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
        os.environ["MASTER_ADDR"] = info["addr"]
        os.environ["MASTER_PORT"] = str(info["port"] - 1)
        try:
            comm = _comm.Communicator(**config)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return ProcessGroupConcord(comm, rank, size)


def register():
    """Registers the backend "concord" with torch.distributed (once). A torch without backend
    registration raises UnavailableError saying so."""
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    if not hasattr(dist.Backend, "register_backend"):
        raise UnavailableError(
            Status.ERR_UNAVAILABLE, "torch %s is too old for the concord torch.distributed "
            "backend: it lacks torch.distributed.Backend.register_backend (torch 1.13 has it)"
            % torch.__version__)
    kwargs = {}
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        kwargs["devices"] = ["cpu"]  # torch >= 2.0: "concord" and "cpu:concord" map CPU tensors
    dist.Backend.register_backend(BACKEND, create_process_group, **kwargs)
