"""CUDA tensors' plumbing for the Communicator: the C API's _ex entry points, the device options
that order an operation after torch's current stream, and torch's Work.wait() for CUDA operations
(concord_request_wait_stream on torch's current stream). torch is imported only when a CUDA tensor
is passed.

The legacy default stream (cudaStream_t 0, torch's default) needs care on both sides: the C API
reads a NULL stream as "no stream" (it orders after the legacy stream only when given neither a
stream nor an event), and Concord's device backend runs on a non-blocking stream, which the legacy
stream does not order. Ordering after it goes through an event recorded on it (ready_event), which
says so explicitly; a wait for it goes through a per-device relay stream that waits for the
operation and on which the default stream then waits (torch's Stream.wait_stream). Neither blocks
the host.
"""
import ctypes
import threading

from . import _lib
from .errors import Status, UnavailableError

_RELAYS = {}  # CUDA device index -> the torch stream that relays waits to the default stream
_RELAYS_LOCK = threading.Lock()


def entry(lib, name):
    """The library's entry point `name` (an _ex one), or UnavailableError when this libconcord
    has none (it predates CUDA tensors)."""
    fn = getattr(lib, name, None)
    if fn is None:
        raise UnavailableError(
            Status.ERR_UNAVAILABLE, "this libconcord (%s) has no %s: it cannot take CUDA "
            "tensors; pass CPU tensors or use a newer libconcord" % (lib.concord_path, name))
    return fn


def options(described, keep):
    """The concord_device_opts_t of an operation on the CUDA tensor `described` (a
    tensors.Described): it reads the tensor only after the work queued so far on torch's current
    stream of its device (described.stream, read when it was described). What must live as long
    as the operation (the struct, an event) is appended to `keep`."""
    opts = _lib.DeviceOptsStruct()
    opts.struct_size = ctypes.sizeof(opts)
    if described.stream:
        opts.stream = described.stream
    else:
        import torch
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(described.device))
        opts.ready_event = event.cuda_event
        keep.append(event)
    keep.append(opts)
    return opts


def _relay(index):
    import torch
    with _RELAYS_LOCK:
        if index not in _RELAYS:
            _RELAYS[index] = torch.cuda.Stream(index)
        return _RELAYS[index]


def wait_stream(lib, request, index, timeout_s):
    """concord_request_wait_stream for torch's current stream of CUDA device `index`: work queued
    on that stream afterwards runs after the operation. Returns the C status (IN_PROGRESS: the
    operation was not launched within timeout_s, nothing queued)."""
    import torch
    current = torch.cuda.current_stream(index)
    if current.cuda_stream:
        return lib.concord_request_wait_stream(request, current.cuda_stream, timeout_s)
    relay = _relay(index)
    status = lib.concord_request_wait_stream(request, relay.cuda_stream, timeout_s)
    if status == Status.SUCCESS:
        current.wait_stream(relay)
    return status
