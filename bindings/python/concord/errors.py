"""Concord's errors as Python exceptions: every failure carries the C status code and message."""
import enum


class Status(enum.IntEnum):
    """concord_status_t (include/concord/concord.h); values never change."""

    SUCCESS = 0
    ERR_INVALID_ARGUMENT = 1
    ERR_MISMATCH = 2
    ERR_TIMEOUT = 3
    ERR_PEER_FAILURE = 4
    ERR_BACKEND = 5
    ERR_NOT_INITIALIZED = 6
    ERR_INTERNAL = 7
    ERR_UNAVAILABLE = 8
    IN_PROGRESS = 9
    ERR_VERSION = 10
    ERR_SYSTEM = 11
    ERR_AUTH = 12
    ERR_PROTOCOL = 13


class ConcordError(RuntimeError):
    """A failed Concord call. `status` is the C status (a Status, or the raw int for a code this
    binding does not know), `message` the library's text for it."""

    def __init__(self, status, message):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        name = status.name if isinstance(status, Status) else str(int(status))
        super().__init__("%s (%s): %s" % (name, int(status), message))


class InvalidArgumentError(ConcordError, ValueError):
    """CONCORD_ERR_INVALID_ARGUMENT, also raised for Python arguments Concord cannot take."""


class UnavailableError(ConcordError, NotImplementedError):
    """CONCORD_ERR_UNAVAILABLE: a feature this build of libconcord (or this binding) lacks."""


class ConcordTimeoutError(ConcordError, TimeoutError):
    """CONCORD_ERR_TIMEOUT: the operation failed because a deadline of its own passed
    (CONCORD_TIMEOUT_S, the stall shutdown time). It is over; waiting again gives the same."""


class WaitTimeoutError(TimeoutError):
    """Handle.wait(timeout=...) returned because its limit passed first: the operation has not
    failed, it is still running (the C API's CONCORD_IN_PROGRESS), and the handle may be waited on
    again or polled. Not a ConcordError, so `except ConcordError` sees only failures; like
    concurrent.futures' "result(timeout) raises TimeoutError", it is a TimeoutError, so catch it
    before ConcordTimeoutError (also a TimeoutError) when both are handled."""

    def __init__(self, timeout):
        self.timeout = timeout
        super().__init__("the operation is still running after a wait of %s s; wait again or "
                         "poll()" % (timeout,))


_BY_STATUS = {
    Status.ERR_INVALID_ARGUMENT: InvalidArgumentError,
    Status.ERR_UNAVAILABLE: UnavailableError,
    Status.ERR_TIMEOUT: ConcordTimeoutError,
}


def make_error(status, message):
    """The exception for a C status: its subclass where one exists, else ConcordError."""
    return _BY_STATUS.get(status, ConcordError)(status, message)
