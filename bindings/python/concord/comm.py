"""Communicator: Concord's C API as Python objects (the Handle an asynchronous operation returns is
handle.py's; the checks of compression specs, compression.py's).

A Communicator owns one concord_comm_t (one background engine). Each operation exists blocking
(allreduce, ...) and asynchronous (allreduce_async, ... returning a Handle). Operations are
matched across ranks by name: every rank must submit the same names, dtypes and shapes. A name
left out is generated from a per-communicator counter, which matches only when every rank issues
its unnamed operations in the same order.

Threading: a Communicator may be used from many threads. ctypes releases the GIL during every C
call, so a blocking wait lets other Python threads run (and the waiting thread runs the engine's
work itself, unless waiter_progress=0). Completion callbacks run on whichever thread completes the
operation: the engine's thread, a thread waiting in wait() or a blocking call, one of the engine's
lane threads, or the thread that calls finalize() for operations it fails. They get the final
Status only (the handle is not yet done inside its own callback), must not wait on other
operations of the same communicator and must not finalize it (refused).

fork: a child forked from the process cannot use its communicators (their engines' threads are
not copied, their connections are the parent's): every call on one raises ConcordError
(NOT_INITIALIZED) naming the parent, and the child's exit finalizes none of them (that would run
the parent's finalize over the parent's connections).
"""
import atexit
import ctypes
import json
import os
import pickle
import threading

from . import _lib, device, tensors
from .compression import _check_compression
from .compression import check_compression, compression_supported  # noqa: F401  (concord.comm.*)
from .errors import InvalidArgumentError, Status, UnavailableError, make_error
from .handle import (_KEYS, _NO_CALLBACK, _ORPHANS, _PENDING, _PENDING_LOCK, _TRAMPOLINE, Handle,
                     _Adopted, _sweep_orphans, _viewed, forked_error, lib)

REDUCE_OPS = {"sum": 0, "average": 1, "avg": 1, "mean": 1, "min": 2, "max": 3, "product": 4,
              "prod": 4}


def _reduce_op(op):
    if isinstance(op, str):
        if op.lower() not in REDUCE_OPS:
            raise InvalidArgumentError(1, "unknown reduce op %r; use one of %s" %
                                       (op, ", ".join(sorted(REDUCE_OPS))))
        return REDUCE_OPS[op.lower()]
    return int(op)  # a ReduceOp or raw int: the C side checks the range


def _numpy(what):
    try:
        import numpy
    except ImportError as e:
        raise UnavailableError(Status.ERR_UNAVAILABLE, "%s needs numpy: %s" % (what, e)) from e
    return numpy


def _pickled(obj):
    """(pickle of obj, None), or (b"", the reason as bytes) when obj cannot be pickled."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), None
    except Exception as e:  # PicklingError, TypeError, AttributeError, a __reduce__'s own
        return b"", ("%s: %s" % (type(e).__name__, e)).encode(errors="replace")


def _length_word(payload, failure):
    """What a rank sends first: its pickle's length, or -(1 + the length of its failure's text)
    (the text follows in place of the pickle)."""
    return len(payload) if failure is None else -1 - len(failure)


def _unpickled_size(word):
    """The bytes that follow a length word."""
    return int(word) if word >= 0 else -1 - int(word)


def _bytes_array(np, data):
    """data (bytes, or a byte count: zeros) as a writable uint8 array."""
    if isinstance(data, int):
        return np.zeros(data, dtype=np.uint8)
    return np.frombuffer(bytearray(data), dtype=np.uint8)


def _unpickle(piece, base, rank):
    try:
        return pickle.loads(piece.tobytes())
    except Exception as e:
        raise InvalidArgumentError(
            Status.ERR_INVALID_ARGUMENT, "%r: could not unpickle rank %d's object here: %s: %s" %
            (base.decode(errors="replace"), rank, type(e).__name__, e)) from e


class Communicator:
    """One Concord communicator. Created from the launcher's environment (concordrun, torchrun,
    Slurm, Open MPI), or from keyword arguments that override it: rank, size, local_rank,
    local_size, store, token, job_id, iface, host, fusion_threshold_bytes, cycle_time_ms,
    timeout_s, cache_capacity, log_level, inline_threshold_bytes, direct_threshold_bytes, lanes,
    backend, compression, waiter_progress, deterministic (the fields of concord_config_t). finalize() (or the end of a `with` block, or interpreter exit)
    runs a last barrier with the other ranks and frees it."""

    def __init__(self, _handle=None, **config):
        L = lib()
        handle = _lib.c_comm_p()
        if _handle is not None:  # a sub-communicator's (split, create_group)
            handle, status = _handle, Status.SUCCESS
        elif config:
            cfg = _lib.ConfigStruct()
            L.concord_config_init(ctypes.byref(cfg))
            cfg.struct_size = ctypes.sizeof(_lib.ConfigStruct)
            known = {f[0] for f in _lib.ConfigStruct._fields_} - {"struct_size", "version"}
            for key, value in config.items():
                if key not in known:
                    raise InvalidArgumentError(1, "unknown config field %r; known: %s" %
                                               (key, ", ".join(sorted(known))))
                setattr(cfg, key, value.encode() if isinstance(value, str) else value)
            status = L.concord_init_config(ctypes.byref(cfg), ctypes.byref(handle))
        else:
            status = L.concord_init(ctypes.byref(handle))
        if status != Status.SUCCESS:
            raise make_error(status, L.concord_comm_last_error(None).decode(errors="replace"))
        self._handle = handle
        self._forked_from = None  # in a forked child: the parent's pid (see the module doc)
        self._opts_cache = {}  # (op, prescale, postscale, compression) -> AllreduceOptsStruct
        self._counters = {}
        self._counter_lock = threading.Lock()
        self._open_groups = {}  # thread ident -> a token of the group that thread has open
        _LIVE[self] = None

        def query(fn):
            out = ctypes.c_int()
            self._check(fn(self._handle, ctypes.byref(out)))
            return out.value

        self.rank = query(L.concord_comm_rank)
        self.size = query(L.concord_comm_size)
        self.local_rank = query(L.concord_comm_local_rank)
        self.local_size = query(L.concord_comm_local_size)

    def join(self):
        """This rank has run out of data (uneven epochs): until every rank has joined it takes
        part in the others' operations with the reduction's identity (an average divides by the
        ranks that contributed; no rows to an allgather), as Horovod's join. Blocks until every
        rank has joined; returns the last rank to join."""
        last = ctypes.c_int(-1)
        self._check(lib().concord_join(self._live(), ctypes.byref(last)))
        return last.value

    def split(self, color, key=0):
        """A sub-communicator of the ranks that give the same color (>= 0), ordered by key, then
        by rank here (MPI_Comm_split, ncclCommSplit); None for color UNDEFINED (-1). Collective:
        every rank of this communicator calls it. The result is a Communicator like any other
        (finalize it when done, in any order with this one)."""
        sub = _lib.c_comm_p()
        self._check(lib().concord_comm_split(self._live(), int(color), int(key), ctypes.byref(sub)))
        return Communicator(_handle=sub) if sub else None

    def create_group(self, ranks):
        """A sub-communicator of `ranks` (ranks of this communicator, in its order); None on the
        ranks outside it. Collective: every rank calls it with the same list."""
        ranks = [int(r) for r in ranks]
        array = (ctypes.c_int * max(len(ranks), 1))(*ranks)
        sub = _lib.c_comm_p()
        self._check(lib().concord_comm_create_group(self._live(), array, len(ranks),
                                                    ctypes.byref(sub)))
        return Communicator(_handle=sub) if sub else None

    def stats(self):
        """The communicator's counters as a dict (concord_stats_t in concord.h): responses_cached,
        responses_full, response_lists, collectives, fused_tensors, inline_reductions,
        device_launches, cache_evictions, topk_residual_evictions, and the memory figures
        scratch_bytes, scratch_reallocations, kept_result_bytes."""
        s = _lib.StatsStruct()
        s.struct_size = ctypes.sizeof(s)
        self._check(lib().concord_comm_stats(self._live(), ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in _lib.StatsStruct._fields_[1:]}

    def metrics(self):
        """The communicator's metrics as a dict (concord_comm_metrics: operations and bytes by op
        and dtype, latency histograms, time in collectives per lane, fusion fill, compression
        ratio, stall warnings, straggler figures on rank 0; the README's "Metrics" lists them)."""
        length = ctypes.c_size_t(0)
        self._check(lib().concord_comm_metrics(self._live(), None, 0, ctypes.byref(length)))
        while True:
            buf = ctypes.create_string_buffer(length.value + 4096)
            status = lib().concord_comm_metrics(self._live(), buf, len(buf), ctypes.byref(length))
            if status == _lib.ERR_INVALID_ARGUMENT and length.value + 1 > len(buf):
                continue  # the metrics grew between the calls
            self._check(status)
            return json.loads(buf.value.decode("utf-8"))

    def timeline(self, path):
        """`with comm.timeline(path):` writes this rank's timeline of what runs inside into
        `path`.rank<R> (concord_timeline_start / _stop: a Chrome trace that Perfetto opens;
        perf/concord-timeline merge joins the ranks' files). A path that cannot be written raises
        ConcordError naming it; a write that fails later only logs a warning."""
        return _Timeline(self, os.fspath(path))

    # ---- plumbing ----
    def _rows_output(self, request, tensor, dtype, out):
        """A finished allgather's or gather's result: `out` cut to the rows received, or a tensor
        like `tensor` over the request's owned output (_Adopted)."""
        data, nbytes, first = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_int64()
        self._check(lib().concord_request_output(request, ctypes.byref(data),
                                                 ctypes.byref(nbytes), ctypes.byref(first)))
        if out is not None:
            return out[:first.value]
        return self._owned_like(request, tensor, dtype, first.value, data.value, nbytes.value)

    @staticmethod
    def _owned_like(request, tensor, dtype, first_dim, address, nbytes):
        """A result like `tensor` (a concord_dtype_t dtype; its first dimension first_dim) over
        the request's owned output, _Adopted; with no bytes, a new empty one."""
        shape = [first_dim] + list(tensor.shape[1:])
        view = _viewed(request, address, nbytes, dtype, shape, tensors.is_torch(tensor))
        if view is None:
            return tensors.empty_like(tensor, first_dim)
        return _Adopted(tensors.like_dtype(view, tensor))  # a bool tensor travelled as uint8

    def _check(self, status):
        if status != Status.SUCCESS:
            message = lib().concord_comm_last_error(self._handle).decode(errors="replace")
            raise make_error(status, message)

    def _live(self):
        if self._handle is None:
            if self._forked_from is not None:
                raise forked_error("this communicator", self._forked_from)
            raise make_error(Status.ERR_NOT_INITIALIZED, "the communicator was finalized")
        return self._handle

    def _name(self, name, kind):
        if name is not None:
            if isinstance(name, str):
                encoded = name.encode()
            elif isinstance(name, (bytes, bytearray)):
                encoded = bytes(name)
            else:
                raise InvalidArgumentError(1, "the tensor name must be a str (or bytes), not %s "
                                              "%r" % (type(name).__name__, name))
            if b"\0" in encoded:  # C would read the name only up to it
                raise InvalidArgumentError(1, "the tensor name %r contains a NUL character" %
                                           (name,))
            return encoded
        with self._counter_lock:
            n = self._counters.get(kind, 0)
            self._counters[kind] = n + 1
        return ("%s.noname.%d" % (kind, n)).encode()

    def _callback(self, callback, keepalive):
        if callback is None:
            return _NO_CALLBACK, None, None
        key = next(_KEYS)
        with _PENDING_LOCK:
            _PENDING[key] = (callback, keepalive)
        return _TRAMPOLINE, ctypes.c_void_p(key), key

    def _submit(self, enqueue, callback, keepalive, finish, on_device=None):
        """on_device: the CUDA tensor (a tensors.Described) of an operation on CUDA tensors."""
        if _ORPHANS:
            _sweep_orphans()
        fn, user_data, key = self._callback(callback, keepalive)
        request = _lib.c_request_p()
        status = enqueue(fn, user_data, ctypes.byref(request))
        if status != Status.SUCCESS:
            if key is not None:
                with _PENDING_LOCK:
                    _PENDING.pop(key, None)
            if on_device is not None:
                message = lib().concord_comm_last_error(self._handle).decode(errors="replace")
                raise make_error(status, "%s is a CUDA tensor (cuda:%d, shape %s): %s" %
                                 (on_device.what, on_device.device, list(on_device.shape),
                                  message))
            self._check(status)
        return Handle(self, request, keepalive, finish,
                      on_device.device if on_device is not None else None)

    def _run_blocking(self, entry, *args):
        """Calls the blocking C entry point `entry` (the calling thread runs the operation) and
        raises its error; frees dropped requests that finished first, as _submit does."""
        if _ORPHANS:
            _sweep_orphans()
        self._check(getattr(lib(), entry)(*args))

    def _submit_device(self, entry, args, cuda, keep, callback, finish):
        """Enqueues an operation on CUDA tensors through the _ex entry point `entry`: args are
        the arguments before its device options; cuda is its CUDA tensor (a tensors.Described);
        wait() gives finish(request)."""
        enqueue = device.entry(lib(), entry)
        dev = device.options(cuda, keep)
        return self._submit(lambda fn, ud, req: enqueue(*args, ctypes.byref(dev), fn, ud, req),
                            callback, keep, finish, cuda)

    def _submit_either(self, entry, args, keep, callback, finish):
        """Enqueues through the C entry point `entry` (args: those before its callback), or its
        _ex form when the tensors' descriptors (keep[:2]: input, output) hold a CUDA tensor;
        keep: what must live as long as the operation."""
        cuda = self._on_device(*keep[:2])
        if cuda is not None:
            return self._submit_device(entry + "_ex", args, cuda, list(keep), callback, finish)
        return self._submit(lambda fn, ud, req: getattr(lib(), entry)(*args, fn, ud, req),
                            callback, keep, finish)

    @staticmethod
    def _check_rows_output(op, src, dst):
        """Refuses an out= that cannot hold the result as rows of the input's: another dtype, or
        other dimensions after the first (wait() returns out cut to the rows received, which
        would give a result of another shape)."""
        if dst.dtype != src.dtype:
            raise InvalidArgumentError(1, "%s output dtype differs from the input's" % op)
        if len(dst.shape) != len(src.shape) or dst.shape[1:] != src.shape[1:]:
            raise InvalidArgumentError(
                1, "%s output has shape %s, the input %s: out must have the input's dimensions "
                "after the first (%s) and room for the rows received" %
                (op, list(dst.shape), list(src.shape), list(src.shape[1:])))

    @staticmethod
    def _device_output_needed(op, cuda, dst):
        if cuda is not None and dst is None:
            raise InvalidArgumentError(
                1, "%s of a CUDA tensor (cuda:%d) needs out=, a CUDA tensor large enough for the "
                "result: the library cannot own device memory" % (op, cuda.device))

    @staticmethod
    def _on_device(*described):
        """The first CUDA tensor among the descriptors (None entries skipped), else None."""
        for d in described:
            if d is not None and d.device != _lib.DEVICE_CPU:
                return d
        return None

    # ---- operations ----
    def allreduce_async(self, tensor, name=None, op="sum", prescale=1.0, postscale=1.0, out=None,
                        compression=None, callback=None):
        """Reduces tensor over all ranks into out (None: a new tensor; out=tensor: in place).
        op: "sum", "average", "min", "max", "product" (or a ReduceOp). prescale multiplies the input
        and postscale the result (floating-point dtypes). compression: None (the communicator's
        default, CONCORD_COMPRESSION, for sum and average; none for min, max and product),
        "none", or a spec such as "fp16", "bf16", "topk:density=0.01" (README, Compression;
        fp16 and bf16 reduce with op, top-k takes sum and average only); every rank must give the
        same, and a spec the library cannot take raises InvalidArgumentError naming the problem. A top-k spec needs a
        name (its error feedback is kept per name; an unnamed call gets a new name each time).
        Returns a Handle whose wait() gives out."""
        return self._allreduce(tensor, name, op, prescale, postscale, out, compression, callback,
                               blocking=False)

    def allreduce(self, tensor, name=None, op="sum", prescale=1.0, postscale=1.0, out=None,
                  compression=None, callback=None):
        """Blocking allreduce_async(...).wait(). On CPU tensors without a callback it is one blocking
        C call (concord_allreduce): this thread runs the operation itself, with no hand-off to
        the engine's thread (4 KiB between 2 local ranks: about half the time)."""
        return self._allreduce(tensor, name, op, prescale, postscale, out, compression, callback,
                               blocking=True)

    def allreduce_(self, tensor, **kwargs):
        """In-place blocking allreduce: tensor receives the result and is returned."""
        return self.allreduce(tensor, out=tensor, **kwargs)

    def _allreduce(self, tensor, name, op, prescale, postscale, out, compression, callback,
                   blocking):
        handle = self._live()
        if name is None and isinstance(compression, str) and compression.strip().startswith("topk"):
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "compression=%r without a name: top-k keeps its "
                "error feedback per tensor name, and an allreduce without name= gets a new name "
                "each call, so what it does not send would never come back; give the tensor a "
                "name it keeps every step" % compression)
        key = (op, prescale, postscale, compression)
        opts = self._opts_cache.get(key)
        if opts is None:  # built once per distinct choice: the C side copies it at enqueue
            opts = _lib.AllreduceOptsStruct()
            opts.struct_size = ctypes.sizeof(opts)
            opts.op = _reduce_op(op)
            opts.prescale = float(prescale)
            opts.postscale = float(postscale)
            spec = _check_compression(compression)
            if spec is not None:
                opts.compression = spec
                opts._spec = spec  # the struct points into these bytes
            if len(self._opts_cache) < 64:
                self._opts_cache[key] = opts
        src = tensors.describe(tensor, "allreduce input")
        if out is None:
            out = tensors.empty_like(tensor)
        # In place (the same tensor) is a NULL output for the C API: one descriptor fewer.
        dst = None if out is tensor else tensors.describe(out, "allreduce output", writable=True)
        if dst is None:
            tensors.check_writable(tensor, "allreduce output")
        keep = [src, dst]
        nm = self._name(name, "allreduce")
        dst_ref = ctypes.byref(dst.struct) if dst is not None else None
        cuda = self._on_device(src, dst)
        if cuda is not None:
            submitted = self._submit_device(
                "concord_allreduce_async_ex",
                (handle, nm, ctypes.byref(src.struct), dst_ref, ctypes.byref(opts)), cuda, keep,
                callback, lambda _: out)
        elif blocking and callback is None:
            self._run_blocking("concord_allreduce", handle, nm, ctypes.byref(src.struct), dst_ref,
                               ctypes.byref(opts))
            return out
        else:
            submitted = self._submit(
                lambda fn, ud, req: lib().concord_allreduce_async(
                    handle, nm, ctypes.byref(src.struct), dst_ref, ctypes.byref(opts), fn, ud,
                    req),
                callback, keep, lambda _: out)
        return submitted.wait() if blocking else submitted

    def allgather_async(self, tensor, name=None, out=None, callback=None):
        """Concatenates every rank's tensor along the first dimension (which may differ between
        ranks; the others must agree). out=None: a new tensor of the gathered size (it views
        memory the communicator lends until the tensor is gone: no copy); else the result
        goes into out (at least as large, with the input's dtype and dimensions after the first,
        else InvalidArgumentError) and wait() returns out[:gathered rows]. CUDA tensors
        need out= (a CUDA tensor; the library cannot own device memory), and wait() returns out
        whole: give it the gathered size."""
        handle = self._live()
        src = tensors.describe(tensor, "allgather input", as_bytes=True)
        if len(src.shape) == 0:
            raise InvalidArgumentError(1, "allgather input must have at least one dimension")
        dst = None if out is None else tensors.describe(out, "allgather output", writable=True,
                                                         as_bytes=True)
        if dst is not None:
            self._check_rows_output("allgather", src, dst)
        cuda = self._on_device(src, dst)
        self._device_output_needed("allgather", cuda, dst)
        if cuda is not None:
            return self._submit_device(
                "concord_allgather_async_ex",
                (handle, self._name(name, "allgather"), ctypes.byref(src.struct), dst.ptr,
                 dst.nbytes), cuda, [src, dst], callback, lambda _: out)

        def finish(request):
            return self._rows_output(request, tensor, src.dtype, out)

        return self._submit(
            lambda fn, ud, req: lib().concord_allgather_async(
                handle, self._name(name, "allgather"), ctypes.byref(src.struct),
                dst.ptr if dst else None, dst.nbytes if dst else 0, fn, ud, req),
            callback, (src, dst), finish)

    def allgather(self, tensor, **kwargs):
        return self.allgather_async(tensor, **kwargs).wait()

    def broadcast_async(self, tensor, root=0, name=None, out=None, callback=None):
        """Every rank receives root's tensor in out (None: a new tensor; out=tensor: in place)."""
        return self._broadcast(tensor, root, name, out, callback, blocking=False)

    def broadcast(self, tensor, root=0, name=None, out=None, callback=None):
        """Blocking broadcast_async(...).wait(); on CPU tensors without a callback one blocking C
        call (concord_broadcast), as allreduce()."""
        return self._broadcast(tensor, root, name, out, callback, blocking=True)

    def broadcast_(self, tensor, root=0, **kwargs):
        """In-place blocking broadcast: tensor receives root's values and is returned."""
        return self.broadcast(tensor, root=root, out=tensor, **kwargs)

    def _broadcast(self, tensor, root, name, out, callback, blocking):
        handle = self._live()
        src = tensors.describe(tensor, "broadcast input", as_bytes=True)
        if out is None:
            out = tensors.empty_like(tensor)
        dst = tensors.describe(out, "broadcast output", writable=True, as_bytes=True)
        nm = self._name(name, "broadcast")
        cuda = self._on_device(src, dst)
        if cuda is not None:
            submitted = self._submit_device(
                "concord_broadcast_async_ex",
                (handle, nm, ctypes.byref(src.struct), ctypes.byref(dst.struct), int(root)), cuda,
                [src, dst], callback, lambda _: out)
        elif blocking and callback is None:
            self._run_blocking("concord_broadcast", handle, nm, ctypes.byref(src.struct),
                               ctypes.byref(dst.struct), int(root))
            return out
        else:
            submitted = self._submit(
                lambda fn, ud, req: lib().concord_broadcast_async(
                    handle, nm, ctypes.byref(src.struct), ctypes.byref(dst.struct), int(root), fn,
                    ud, req),
                callback, (src, dst), lambda _: out)
        return submitted.wait() if blocking else submitted

    def _splits(self, splits, what):
        """A ctypes array of one count per rank (None: None, the even split)."""
        if splits is None:
            return None
        counts = [int(c) for c in splits]
        if len(counts) != self.size:
            raise InvalidArgumentError(1, "%s: %d splits for %d ranks" %
                                       (what, len(counts), self.size))
        for i, c in enumerate(counts):
            if c < 0:  # refused here, on every rank, before an output of c rows is made
                raise InvalidArgumentError(1, "%s split %d is negative (%d)" % (what, i, c))
        return (ctypes.c_int64 * max(len(counts), 1))(*counts)

    def reducescatter_async(self, tensor, name=None, op="sum", prescale=1.0, postscale=1.0,
                            recv_splits=None, out=None, callback=None, compression=None):
        """Reduces tensor over all ranks (op, prescale and postscale as in allreduce_async) and
        gives this rank its rows of the result along the first dimension: recv_splits[rank] rows
        (one count per rank, the same on every rank), or with recv_splits=None the even split
        (n // size rows, the first n % size ranks one more). out=None: a new tensor of that shape.
        compression: "fp16" or "bf16" (float32/float64 tensors: reduced in 16 bits on the wire),
        None or "none" for none (the communicator's default compression is allreduce's only).
        Returns a Handle whose wait() gives out."""
        handle = self._live()
        src = tensors.describe(tensor, "reducescatter input")
        if len(src.shape) == 0:
            raise InvalidArgumentError(1, "reducescatter input must have at least one dimension")
        counts = self._splits(recv_splits, "reducescatter")
        n = src.shape[0]
        rows = (counts[self.rank] if counts is not None else
                n // self.size + (1 if self.rank < n % self.size else 0))
        if out is None:
            out = tensors.empty_like(tensor, rows)
        dst = tensors.describe(out, "reducescatter output", writable=True)
        opts = _lib.ReducescatterOptsStruct()
        opts.struct_size = ctypes.sizeof(opts)
        opts.op = _reduce_op(op)
        opts.prescale = float(prescale)
        opts.postscale = float(postscale)
        if counts is not None:
            opts.recv_splits = counts
            opts.nsplits = self.size
        spec = _check_compression(compression, "reducescatter")
        if spec is not None:
            opts.compression = spec
        return self._submit_either(
            "concord_reducescatter_async",
            (handle, self._name(name, "reducescatter"), ctypes.byref(src.struct),
             ctypes.byref(dst.struct), ctypes.byref(opts)),
            (src, dst, counts, opts), callback, lambda _: out)

    def reducescatter(self, tensor, **kwargs):
        """Blocking reducescatter_async(...).wait()."""
        return self.reducescatter_async(tensor, **kwargs).wait()

    def reduce_async(self, tensor, root=0, name=None, op="sum", prescale=1.0, postscale=1.0,
                     out=None, callback=None):
        """Reduces tensor over all ranks (op, prescale and postscale as in allreduce_async) into
        out on rank root only (None: a new tensor; out=tensor: in place). Every rank gives the
        same root. Returns a Handle whose wait() gives out on the root and None on the other
        ranks, whose out (ignored) is left untouched."""
        handle = self._live()
        src = tensors.describe(tensor, "reduce input")
        is_root = int(root) == self.rank
        if is_root and out is None:
            out = tensors.empty_like(tensor)
        dst = None
        if is_root and out is not tensor:
            dst = tensors.describe(out, "reduce output", writable=True)
        elif is_root:
            tensors.check_writable(tensor, "reduce output")
        opts = _lib.ReduceOptsStruct()
        opts.struct_size = ctypes.sizeof(opts)
        opts.op = _reduce_op(op)
        opts.prescale = float(prescale)
        opts.postscale = float(postscale)
        result = out if is_root else None
        return self._submit_either(
            "concord_reduce_async",
            (handle, self._name(name, "reduce"), ctypes.byref(src.struct),
             ctypes.byref(dst.struct) if dst is not None else None, int(root),
             ctypes.byref(opts)),
            (src, dst, opts), callback, lambda _: result)

    def reduce(self, tensor, root=0, **kwargs):
        """Blocking reduce_async(...).wait(): the reduction on the root, None elsewhere."""
        return self.reduce_async(tensor, root=root, **kwargs).wait()

    def gather_async(self, tensor, root=0, name=None, out=None, callback=None):
        """Concatenates every rank's tensor along the first dimension (which may differ between
        ranks; the others must agree) on rank root only, as allgather_async there (out=None: a
        new tensor of the gathered size; else out, at least as large, with the input's dtype and
        dimensions after the first, cut to the gathered rows).
        A CUDA tensor needs out= on the root (the library cannot own device memory). On the
        other ranks out is ignored and wait() returns None."""
        handle = self._live()
        src = tensors.describe(tensor, "gather input", as_bytes=True)
        if len(src.shape) == 0:
            raise InvalidArgumentError(1, "gather input must have at least one dimension")
        is_root = int(root) == self.rank
        dst = None
        if is_root and out is not None:
            dst = tensors.describe(out, "gather output", writable=True, as_bytes=True)
            self._check_rows_output("gather", src, dst)
        if is_root:
            self._device_output_needed("gather", self._on_device(src), dst)

        def finish(request):
            if not is_root:
                return None
            return self._rows_output(request, tensor, src.dtype, out)

        return self._submit_either(
            "concord_gather_async",
            (handle, self._name(name, "gather"), ctypes.byref(src.struct),
             dst.ptr if dst else None, dst.nbytes if dst else 0, int(root)),
            (src, dst), callback, finish)

    def gather(self, tensor, root=0, **kwargs):
        """Blocking gather_async(...).wait(): the gathered tensor on the root, None elsewhere."""
        return self.gather_async(tensor, root=root, **kwargs).wait()

    def alltoall_async(self, tensor, splits=None, name=None, out=None, callback=None):
        """Sends splits[d] rows (along the first dimension) of tensor to each rank d, in rank order
        (None: the even split; the first dimension must divide by the number of ranks), and
        receives what every rank sends this one, in rank order. The receive counts come from the
        other ranks (they may differ per call, as a mixture of experts routes). wait() returns
        (output, received_splits): out=None: a new tensor of the received rows (a view of memory
        the communicator lends, as allgather's); else out (at least as large, with the input's
        dtype and dimensions after the first) cut to them;
        received_splits[s] rows came from rank s. A CUDA tensor needs out= (the library cannot
        own device memory)."""
        handle = self._live()
        src = tensors.describe(tensor, "alltoall input", as_bytes=True)
        if len(src.shape) == 0:
            raise InvalidArgumentError(1, "alltoall input must have at least one dimension")
        counts = self._splits(splits, "alltoall")
        dst = None if out is None else tensors.describe(out, "alltoall output", writable=True,
                                                         as_bytes=True)
        if dst is not None:
            self._check_rows_output("alltoall", src, dst)
        self._device_output_needed("alltoall", self._on_device(src), dst)
        opts = _lib.AlltoallOptsStruct()
        opts.struct_size = ctypes.sizeof(opts)
        if counts is not None:
            opts.splits = counts
            opts.nsplits = self.size

        def finish(request):
            data, nbytes, first = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_int64()
            L = lib()
            self._check(L.concord_request_output(request, ctypes.byref(data),
                                                 ctypes.byref(nbytes), ctypes.byref(first)))
            received = (ctypes.c_int64 * self.size)()
            self._check(L.concord_request_received_splits(request, received, self.size))
            if out is not None:
                return out[:first.value], list(received)
            result = self._owned_like(request, tensor, src.dtype, first.value, data.value,
                                      nbytes.value)
            if isinstance(result, _Adopted):
                return _Adopted((result.value, list(received)))
            return result, list(received)

        return self._submit_either(
            "concord_alltoall_async",
            (handle, self._name(name, "alltoall"), ctypes.byref(src.struct),
             dst.ptr if dst else None, dst.nbytes if dst else 0, ctypes.byref(opts)),
            (src, dst, counts, opts), callback, finish)

    def alltoall(self, tensor, splits=None, **kwargs):
        """Blocking alltoall_async(...).wait(): (output, received_splits)."""
        return self.alltoall_async(tensor, splits=splits, **kwargs).wait()

    def barrier_async(self, callback=None):
        handle = self._live()
        return self._submit(
            lambda fn, ud, req: lib().concord_barrier_async(handle, fn, ud, req),
            callback, None, lambda _: None)

    def barrier(self):
        """Blocks until every rank reached it (one blocking C call: concord_barrier)."""
        self._run_blocking("concord_barrier", self._live())

    # ---- Python objects (pickled; Horovod's broadcast_object and allgather_object) ----
    def broadcast_object(self, obj, root=0, name=None):
        """root's obj on every rank: root returns obj itself, the others an unpickled copy.
        Collective, like broadcast (two of them: `name`.length and `name`.bytes; name None: one
        from a counter, as for the operations). An object root cannot pickle raises
        InvalidArgumentError on every rank with root's reason; one that a rank cannot unpickle
        (a class it cannot import) raises there. Unpickling runs code the sender chose: only
        between ranks that trust each other, as the ranks of one job do. Needs numpy."""
        np = _numpy("broadcast_object")
        base = self._name(name, "broadcast_object")
        payload, failure = _pickled(obj) if self.rank == root else (b"", None)
        length = np.array([_length_word(payload, failure)], dtype=np.int64)
        self.broadcast(length, root=root, name=base + b".length", out=length)
        data = _bytes_array(np, (failure or payload) if self.rank == root else
                            _unpickled_size(length[0]))
        self.broadcast(data, root=root, name=base + b".bytes", out=data)
        if length[0] < 0:
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "broadcast_object %r: root rank %d could not pickle "
                "its object: %s" % (base.decode(errors="replace"), root,
                                    data.tobytes().decode(errors="replace")))
        return obj if self.rank == root else _unpickle(data, base, root)

    def allgather_object(self, obj, name=None):
        """Every rank's obj, in rank order, unpickled on every rank (this rank's too: a copy).
        Collective, like allgather (two of them: `name`.length and `name`.bytes). An object that
        a rank cannot pickle raises InvalidArgumentError on every rank with that rank's reason;
        see broadcast_object for unpickling. Needs numpy."""
        np = _numpy("allgather_object")
        base = self._name(name, "allgather_object")
        payload, failure = _pickled(obj)
        length = np.array([_length_word(payload, failure)], dtype=np.int64)
        lengths = self.allgather(length, name=base + b".length")
        data = self.allgather(_bytes_array(np, failure or payload), name=base + b".bytes")
        pieces, at = [], 0
        for word in lengths.tolist():
            size = _unpickled_size(word)
            pieces.append((word, data[at:at + size]))
            at += size
        failed = ["rank %d: %s" % (r, piece.tobytes().decode(errors="replace"))
                  for r, (word, piece) in enumerate(pieces) if word < 0]
        if failed:
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "allgather_object %r: could not pickle the object of "
                "%s" % (base.decode(errors="replace"), "; ".join(failed)))
        return [_unpickle(piece, base, r) for r, (_, piece) in enumerate(pieces)]

    # ---- point to point (not negotiated: straight to the peer; FIFO per (peer, tag)) ----
    def send_async(self, tensor, peer, tag=0, callback=None):
        """Sends tensor to rank peer with tag (>= 0). Messages from this rank to peer with one tag
        arrive in order; nothing else waits for them. The tensor is kept alive (and must not be
        written) until the handle finishes; wait() returns None. A CUDA tensor is copied to host
        memory (after the work queued on torch's current stream) before this returns."""
        handle = self._live()
        src = tensors.describe(tensor, "send tensor", as_bytes=True)
        return self._submit_either(
            "concord_send_async", (handle, ctypes.byref(src.struct), int(peer), int(tag)),
            (src, None), callback, lambda _: None)

    def send(self, tensor, peer, tag=0):
        self.send_async(tensor, peer, tag).wait()

    def recv_async(self, peer, tag=0, like=None, out=None, callback=None):
        """Receives the next message from rank peer with tag. out: into out (its dtype and shape
        must be the sender's, else ConcordError with status ERR_MISMATCH naming both); like: into a
        new tensor like it (the same check); neither: a new numpy array of the sender's dtype and
        shape (a view of memory the communicator lends, as allgather's). wait() returns the
        tensor. A CUDA out (or like) gets the message copied in after the work queued on torch's
        current stream."""
        handle = self._live()
        if out is None and like is not None:
            out = tensors.empty_like(like)
        dst = None if out is None else tensors.describe(out, "recv output", writable=True,
                                                         as_bytes=True)

        def finish(request):
            if out is not None:
                return out
            data, nbytes = ctypes.c_void_p(), ctypes.c_size_t()
            dtype, ndim = ctypes.c_int(), ctypes.c_int()
            shape = (ctypes.c_int64 * _lib.MAX_DIMS)()
            L = lib()
            self._check(L.concord_request_output(request, ctypes.byref(data),
                                                 ctypes.byref(nbytes), None))
            self._check(L.concord_request_output_shape(request, ctypes.byref(dtype),
                                                       ctypes.byref(ndim), shape))
            view = _viewed(request, data.value, nbytes.value, dtype.value, shape[:ndim.value],
                           False)
            return tensors.empty(dtype.value, shape[:ndim.value]) if view is None else \
                _Adopted(view)

        return self._submit_either(
            "concord_recv_async",
            (handle, ctypes.byref(dst.struct) if dst is not None else None, int(peer), int(tag)),
            (dst, None), callback, finish)

    def recv(self, peer, tag=0, like=None, out=None):
        return self.recv_async(peer, tag, like=like, out=out).wait()

    def end_step(self):
        """Ends this rank's training step (concord_end_step): call it at the same point of every
        step on every rank, or on none. A tensor a rank then skips in a step (or submits twice)
        fails with a ConcordError (status MISMATCH) naming the tensor and the ranks' steps,
        instead of being reduced with another step's. DistributedOptimizer calls it in
        synchronize()."""
        self._check(lib().concord_end_step(self._live()))

    def group(self):
        """`with comm.group():` operations this thread enqueues inside are negotiated and fused as
        one unit when the block ends. Groups do not nest; each thread has its own."""
        return _Group(self)

    def _own_open_group(self):
        """A token of the group this thread has open on this communicator (a new one each time a
        group opens), else None."""
        return self._open_groups.get(threading.get_ident())

    # ---- lifetime ----
    def finalize(self):
        """Last barrier with the other ranks, then frees the communicator (idempotent). Pending
        operations fail with ERR_NOT_INITIALIZED. When the barrier does not complete (the other
        ranks did not finalize within the timeout) the communicator is freed all the same and
        ConcordTimeoutError (or the barrier's error) says so."""
        if self._handle is None:
            return
        status = lib().concord_finalize(self._handle)
        if status == Status.ERR_INVALID_ARGUMENT:
            # Refused (inside a callback): the handle stays valid.
            self._check(status)
        self._handle = None
        _LIVE.pop(self, None)
        _sweep_orphans()  # finalize failed whatever was still pending
        if status != Status.SUCCESS:
            # The handle is gone: the message is kept where concord_comm_last_error(NULL) reads.
            message = lib().concord_comm_last_error(None).decode(errors="replace")
            raise make_error(status, message)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()


class _Group:
    def __init__(self, comm):
        self._comm = comm

    def __enter__(self):
        self._comm._check(lib().concord_group_start(self._comm._live()))
        self._comm._open_groups[threading.get_ident()] = object()
        return self

    def __exit__(self, *exc):
        # Closed by group_end, which fails or submits it.
        self._comm._open_groups.pop(threading.get_ident(), None)
        self._comm._check(lib().concord_group_end(self._comm._live()))


class _Timeline:
    def __init__(self, comm, path):
        self._comm = comm
        self._path = path

    def __enter__(self):
        self._comm._check(lib().concord_timeline_start(self._comm._live(),
                                                       self._path.encode("utf-8")))
        return self

    def __exit__(self, *exc):
        self._comm._check(lib().concord_timeline_stop(self._comm._live()))


# Every communicator not yet finalized: held here so that it is finalized before Python tears
# down, and no engine thread calls a Python callback into a dead interpreter. In creation order
# (a dict, not a set): every rank finalizes its communicators in the same order, as each finalize
# waits for the other ranks to finalize that communicator.
_LIVE = {}


def _forget_after_fork():
    """In a forked child: the parent's communicators become unusable here, and are not finalized
    at the child's exit (see the module doc)."""
    for comm in list(_LIVE):
        comm._handle = None
        comm._forked_from = os.getppid()
    _LIVE.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def _finalize_all():
    for comm in list(_LIVE):
        try:
            comm.finalize()
        except Exception:
            pass
