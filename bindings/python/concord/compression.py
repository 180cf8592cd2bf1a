"""Compression specs: whether the loaded library takes one per operation, and the checks made before
one is handed to it.

Stateless: every function may be called from any thread, with or without a communicator. The
library parses a spec itself (at enqueue, or concord_compression_check); what is refused here is
only what it cannot say: a spec that is not a string, or a library too old to take one.
"""
from . import _lib, tensors
from .errors import InvalidArgumentError, Status, UnavailableError, make_error
from .handle import lib


def compression_supported():
    """Whether this libconcord takes a compression spec per allreduce: its
    concord_allreduce_opts_t has the `compression` field (mirrored in _lib.AllreduceOptsStruct).
    Every libconcord built from this source tree does; only an older library does not."""
    return _lib.struct_has_field(lib(), _lib.AllreduceOptsStruct, "concord_allreduce_opts_init",
                                 "compression")


def _check_compression(compression, what="allreduce"):
    """The spec to hand to the library (bytes), or None for the library's default (allreduce:
    CONCORD_COMPRESSION, else concord_config_t.compression, else "none"; reducescatter: "none").

    Any string is passed through as it is: the library parses it at enqueue and refuses a bad one
    with InvalidArgumentError naming the problem (an unknown compressor, a bad parameter, a dtype
    the compressor does not take). The one refusal made here is for a library too old to take a
    spec per `what` (an allreduce or a reducescatter), where anything but "none" raises
    UnavailableError at once."""
    if compression is None:
        return None
    if not isinstance(compression, str):
        raise InvalidArgumentError(1, "compression must be a spec string such as 'fp16', 'bf16' "
                                   "or 'topk:density=0.01', got %r" % (compression,))
    struct = (_lib.AllreduceOptsStruct if what == "allreduce" else _lib.ReducescatterOptsStruct)
    init = "concord_%s_opts_init" % what
    if not _lib.struct_has_field(lib(), struct, init, "compression"):
        if compression.strip() == "none":
            return None  # an old library compresses nothing anyway
        theirs = _lib.library_struct_size(lib(), init)
        raise UnavailableError(
            8, "compression=%r: this libconcord (%s) is too old to take a compression per "
            "%s: its concord_%s_opts_t (%d bytes) ends before the compression field; use "
            "compression=None or a newer libconcord" % (compression, lib().concord_path, what,
                                                        what, theirs))
    return compression.encode()


def check_compression(spec, dtype=None):
    """Refuses now what an allreduce's enqueue would refuse later (concord_compression_check): a
    spec that does not parse raises InvalidArgumentError naming the spec and the problem; with
    dtype (a name such as "float32", or a torch or numpy dtype) also one its compressor does not
    take. None, "" and "none" pass. Needs no communicator and sends nothing."""
    if spec is None:
        return
    _check_compression(spec)  # not a string; a library too old for compression
    code = -1
    if dtype is not None:
        name = str(dtype).replace("torch.", "")
        if name not in tensors.DTYPES:
            raise InvalidArgumentError(1, "dtype %s: Concord takes %s" %
                                       (dtype, ", ".join(tensors.DTYPES)))
        code = tensors.DTYPES[name]
    L = lib()
    status = L.concord_compression_check(spec.encode(), code)
    if status != Status.SUCCESS:
        raise make_error(status, L.concord_comm_last_error(None).decode(errors="replace"))
