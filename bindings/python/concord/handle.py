"""Handle: one enqueued operation, and what handles need underneath comm.py (which imports this
module, never the reverse): the loaded library, completion callbacks, and the requests of handles
dropped unfinished.

lib() loads libconcord once per process, on first use, from any thread. Ownership: a Handle owns
its request and the tensors the engine uses (keepalive) until the operation finishes; then
_complete frees the request, unless the result views memory the request owns (_viewed returns it
wrapped in _Adopted): then the request is the result's (_RequestMemory) and is freed when the
last view goes. A Handle dropped unfinished hands its request and tensors to _ORPHANS, and
_sweep_orphans (comm.py calls it at each submission and at finalize) frees those that have
finished. _PENDING holds each callback, with its operation's tensors, under the key handed to C
as user_data: Communicator._callback adds it, and _on_complete pops it on whichever thread
completes the operation (the submission pops it when the enqueue fails).

Threading: lib(), _PENDING (under _PENDING_LOCK) and _ORPHANS (under _ORPHANS_LOCK) may be used
from any thread. A Handle may be waited on and polled from many threads: its lock lets one thread
complete it and free the request while the others block until the result is there.

fork: a child forked from a process with Concord operations has none of its threads (no engine
runs there), so it neither waits for nor frees what the parent enqueued: a Handle of the parent's
raises ConcordError in the child (instead of waiting forever), and the child frees none of the
parent's requests (their memory is the parent's copy; the library's state may be mid-update).
"""
import ctypes
import itertools
import os
import threading
import time

from . import _lib, device, tensors
from .errors import ConcordError, Status, WaitTimeoutError, make_error

_LIB = None
_LIB_LOCK = threading.Lock()


def lib():
    """The loaded libconcord (loaded on first use)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    with _LIB_LOCK:
        if _LIB is None:
            _LIB = _lib.load()
        return _LIB


# Completion callbacks: one C trampoline for the whole process; user_data is a key into _PENDING,
# which holds the Python callable (and its handle's buffers) until the engine calls back.
_PENDING = {}
_PENDING_LOCK = threading.Lock()
_KEYS = itertools.count(1)

# Whether this thread runs a completion callback (depth > 0). What a callback enqueues never joins
# a group the thread running it has open (the engine's threads enqueue outside groups), so its
# Handle does not take that group's token.
_IN_CALLBACK = threading.local()


def _on_complete(request, status, user_data):
    with _PENDING_LOCK:
        entry = _PENDING.pop(user_data, None)
    if entry is None:
        return
    fn, _keepalive = entry
    _IN_CALLBACK.depth = getattr(_IN_CALLBACK, "depth", 0) + 1
    try:
        fn(Status(status) if status in Status._value2member_map_ else status)
    except Exception:  # an exception cannot cross into C: report it as Python would
        import traceback
        traceback.print_exc()
    finally:
        _IN_CALLBACK.depth -= 1


class _RequestMemory:
    """Owns a finished request whose result memory an array or tensor views (tensors.view_address):
    frees the request when the last view goes."""

    def __init__(self, request):
        self._request = request
        self._pid = _PID

    def disown(self):
        """Gives the request back (to Handle._complete, which frees it): no view was made."""
        self._request = None

    def __del__(self):
        request, self._request = self._request, None
        # _LIB None: the interpreter is shutting down; another pid: the parent's (see the doc).
        if request is not None and _LIB is not None and self._pid == _PID:
            _LIB.concord_request_free(request)


class _Adopted:
    """What a finish function returns when its result views memory its request owns (_viewed):
    Handle._complete then leaves the request to that result instead of freeing it."""

    def __init__(self, value):
        self.value = value


def _viewed(request, address, nbytes, dtype, shape, torch_like):
    """The result the request owns (nbytes at address) as a new array or tensor that views it, or
    (no bytes) a new empty one; None: no view was made and the request stays the caller's."""
    if not nbytes:
        return None
    owner = _RequestMemory(request)
    try:
        return tensors.view_address(address, nbytes, dtype, shape, owner, torch_like)
    except BaseException:
        owner.disown()
        raise


# This process's id: what a Handle or request memory made here records. A forked child gets its own
# (_forget_parent), so it can tell the parent's objects from its own.
_PID = os.getpid()


def _forget_parent():
    """After fork, in the child: the parent's operations will never complete or call back here
    (their engine threads were not copied), and their requests are not this process's to free."""
    global _PID
    _PID = os.getpid()
    _PENDING.clear()  # one thread only runs in the child now: no lock needed
    _ORPHANS.clear()


def forked_error(what, pid):
    """The error for using, in a forked child, something process `pid` (its parent) made."""
    return make_error(
        Status.ERR_NOT_INITIALIZED, "%s belongs to process %d, and this process (%d) is a child "
        "forked from it: a forked child has none of its parent's Concord threads, so it cannot "
        "use the parent's communicators or operations; use them in the parent (a child that "
        "needs Concord must be started, not forked, e.g. multiprocessing's 'spawn')"
        % (what, pid, os.getpid()))


_TRAMPOLINE = _lib.CALLBACK(_on_complete)
_NO_CALLBACK = ctypes.cast(None, _lib.CALLBACK)

# The longest one C wait of Handle.wait() lasts before control comes back to Python, which then
# runs the signal handlers that came meanwhile: Ctrl-C (KeyboardInterrupt) ends a wait within this
# time, where one C call without a limit could not be interrupted until the operation ended.
WAIT_SLICE_S = 0.1


class Handle:
    """One enqueued operation. wait() blocks until it finishes and returns its result (raising
    ConcordError on failure; with a timeout that passes first, WaitTimeoutError, and the operation
    goes on); poll() says whether it finished without blocking. The handle keeps
    its tensors alive until the operation is done; a handle dropped unfinished hands its request
    and tensors to a list that later submissions and finalize() free once it has finished.

    An operation on CUDA tensors: wait() is torch's Work.wait() for NCCL (see wait());
    synchronize() blocks the host until the operation finished."""

    def __init__(self, comm, request, keepalive, finish, device_index=None):
        self._comm = comm
        self._request = request
        self._keepalive = keepalive
        self._finish = finish  # builds the result once the request succeeded
        self._device = device_index  # the CUDA device of an operation on CUDA tensors, else None
        self._result = None
        self._error = None
        self._wire_bytes = 0
        self._done = False
        self._lock = threading.Lock()  # one thread completes and frees the request
        self._pid = _PID  # the process that enqueued it
        # The token of the group open here at its enqueue, which holds the operation
        self._group = None if getattr(_IN_CALLBACK, "depth", 0) else comm._own_open_group()

    def _check_process(self):
        # A handle left unfinished by the parent of a forked child: nothing runs it here.
        if self._pid != _PID:
            raise forked_error("this operation", self._pid)

    def poll(self):
        """True once the operation finished (successfully or not); never blocks."""
        with self._lock:
            if self._done:
                return True
            self._check_process()
            return lib().concord_test(self._request) != _lib.IN_PROGRESS

    def wait(self, timeout=None):
        """Blocks until done and returns the result: the output tensor, or None for a barrier;
        raises ConcordError (by status) when the operation failed, ConcordTimeoutError when it
        failed by a deadline of its own. timeout: seconds to wait at most (None: as long as the
        engine's own deadlines allow); when it passes first, raises WaitTimeoutError and the
        operation goes on: wait again, or poll(). Any thread may wait; a second waiter blocks
        until the first has the result.

        On CUDA tensors, as torch's NCCL works: makes torch's current stream of the tensors'
        device wait on the GPU for the operation (concord_request_wait_stream) and returns the
        output, blocking the host only until the operation has been launched (timeout bounds
        that). An error known by then raises; one on the device later is seen by synchronize(),
        the callback's status and the communicator's next operations. The handle keeps the
        tensors until the operation has finished."""
        if self._device is not None:
            return self._wait_stream(timeout)
        return self.synchronize(timeout)

    def _wait_stream(self, timeout):
        with self._lock:
            if not self._done:
                self._check_process()
                L = lib()
                status = self._wait_in_slices(
                    lambda limit: device.wait_stream(L, self._request, self._device, limit),
                    timeout)
                if status == Status.IN_PROGRESS:
                    raise WaitTimeoutError(timeout)
                final = L.concord_test(self._request)
                if final != _lib.IN_PROGRESS:
                    self._complete(final)
                elif status != Status.SUCCESS:
                    message = L.concord_request_error(self._request).decode(errors="replace")
                    raise make_error(status, message)
                else:  # launched on the device: its output is described (concord_request_output)
                    return self._finish(self._request)
        if self._error is not None:
            raise self._error
        return self._result

    def synchronize(self, timeout=None):
        """Blocks the host until the operation finished and returns its result, as wait() does
        for CPU tensors (for them the two are the same)."""
        with self._lock:
            if not self._done:
                self._check_process()
                L = lib()
                status = self._wait_in_slices(
                    lambda limit: L.concord_wait(self._request, limit), timeout)
                if status == Status.IN_PROGRESS:
                    raise WaitTimeoutError(timeout)
                if status != Status.SUCCESS and \
                        L.concord_test(self._request) == _lib.IN_PROGRESS:
                    if status == Status.ERR_TIMEOUT:
                        # A libconcord older than IN_PROGRESS from concord_wait said TIMEOUT for
                        # its own limit: the request still runs.
                        raise WaitTimeoutError(timeout)
                    # The wait itself was refused (the request is in this thread's open group):
                    # the request still runs, and keeps its tensors.
                    message = L.concord_request_error(self._request).decode(errors="replace")
                    raise make_error(status, message)
                self._complete(status)
        if self._error is not None:
            raise self._error
        return self._result

    def _wait_in_slices(self, wait, timeout):
        """wait(limit) (a C wait on this request: concord_wait, concord_request_wait_stream) in
        calls of at most WAIT_SLICE_S seconds, until one returns other than IN_PROGRESS or
        `timeout` seconds (None: no limit) have passed; its last status. Between calls Python runs
        pending signal handlers, so Ctrl-C raises KeyboardInterrupt out of wait() and the
        operation goes on, as after a timeout. A member of the group this thread has open is
        waited for without a limit, which the C side refuses at once (only this thread's
        group_end can submit it): sliced, that wait would never end."""
        if timeout is None and self._group is not None and \
                self._group is self._comm._own_open_group():
            return wait(-1.0)
        deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
        while True:
            limit = WAIT_SLICE_S
            if deadline is not None:
                limit = min(limit, max(0.0, deadline - time.monotonic()))
            status = wait(limit)
            if status != Status.IN_PROGRESS or (deadline is not None and
                                                time.monotonic() >= deadline):
                return status

    def wire_bytes(self):
        """Bytes this rank put on the wire for the operation (waits for it first); see
        concord_request_wire_bytes in concord.h."""
        self.synchronize()
        return self._wire_bytes

    def _complete(self, status):
        L = lib()
        adopted = False
        try:
            if status == Status.SUCCESS:
                count = ctypes.c_uint64(0)
                if L.concord_request_wire_bytes(self._request, ctypes.byref(count)) == 0:
                    self._wire_bytes = count.value
                self._result = self._finish(self._request)
                if isinstance(self._result, _Adopted):
                    adopted = True
                    self._result = self._result.value
            else:
                message = L.concord_request_error(self._request).decode(errors="replace")
                self._error = make_error(status, message)
        except ConcordError as e:
            self._error = e
        finally:
            if not adopted:
                L.concord_request_free(self._request)
            self._request = None
            self._keepalive = None
            self._done = True

    def __del__(self):
        # Never block here (inside a group the request may not even be submitted yet): an
        # unfinished request is parked with its tensors until it finishes.
        if not self._done and self._request is not None and self._pid == _PID:
            with _ORPHANS_LOCK:
                _ORPHANS.append((self._request, self._keepalive))


# Requests whose Handle was dropped before they finished, with the tensors the engine still uses.
# Each new submission and each finalize frees those that have finished.
_ORPHANS = []
_ORPHANS_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_forget_parent)


def _sweep_orphans():
    with _ORPHANS_LOCK:
        L = lib()
        running = []
        for request, keepalive in _ORPHANS:
            if L.concord_test(request) == _lib.IN_PROGRESS:
                running.append((request, keepalive))
            else:
                L.concord_request_free(request)
        _ORPHANS[:] = running
