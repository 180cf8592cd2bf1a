"""The C API (include/concord/concord.h) through ctypes: library lookup, mirrors of its structs and
the signature of every function used. Nothing here allocates Concord objects.

The library is looked for, in order: the file named by $CONCORD_LIBRARY; a libconcord.so* inside
this package (pip bundles it there when it finds a build, see setup.py); a build tree above the
package when it runs from a source checkout ($CONCORD_BUILD_DIR, else build/ and build-*/); and
last the system loader (an installed libconcord.so.0).
"""
import ctypes
import ctypes.util
import glob
import os

# Status codes, dtypes and reduce ops: values never change (concord.h).
SUCCESS = 0
ERR_INVALID_ARGUMENT = 1
ERR_UNAVAILABLE = 8
IN_PROGRESS = 9

DEVICE_CPU = -1
MAX_DIMS = 8
UNDEFINED = -1  # CONCORD_UNDEFINED: a color that joins no sub-communicator

c_request_p = ctypes.c_void_p
c_comm_p = ctypes.c_void_p

# void (*)(concord_request_t, concord_status_t, void*): called on the thread that completes the
# request (the engine's thread, a waiting thread, a lane thread; see concord.h).
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


class ConfigStruct(ctypes.Structure):
    """concord_config_t, field for field. struct_size is set from ctypes.sizeof, so a library that
    appended fields keeps its defaults for them and an older one ignores none it knows."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("size", ctypes.c_int),
        ("local_rank", ctypes.c_int),
        ("local_size", ctypes.c_int),
        ("store", ctypes.c_char_p),
        ("token", ctypes.c_char_p),
        ("job_id", ctypes.c_char_p),
        ("iface", ctypes.c_char_p),
        ("host", ctypes.c_char_p),
        ("fusion_threshold_bytes", ctypes.c_int64),
        ("cycle_time_ms", ctypes.c_double),
        ("timeout_s", ctypes.c_double),
        ("cache_capacity", ctypes.c_int),
        ("log_level", ctypes.c_int),
        ("inline_threshold_bytes", ctypes.c_int64),
        ("direct_threshold_bytes", ctypes.c_int64),
        ("lanes", ctypes.c_int),
        ("backend", ctypes.c_char_p),
        ("compression", ctypes.c_char_p),
        ("waiter_progress", ctypes.c_int),
        ("deterministic", ctypes.c_int),
    ]


class AllreduceOptsStruct(ctypes.Structure):
    """concord_allreduce_opts_t, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("op", ctypes.c_int),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("compression", ctypes.c_char_p),
    ]


class ReducescatterOptsStruct(ctypes.Structure):
    """concord_reducescatter_opts_t, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("op", ctypes.c_int),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("recv_splits", ctypes.POINTER(ctypes.c_int64)),
        ("nsplits", ctypes.c_int),
        ("compression", ctypes.c_char_p),
    ]


class ReduceOptsStruct(ctypes.Structure):
    """concord_reduce_opts_t, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("op", ctypes.c_int),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
    ]


class AlltoallOptsStruct(ctypes.Structure):
    """concord_alltoall_opts_t, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("splits", ctypes.POINTER(ctypes.c_int64)),
        ("nsplits", ctypes.c_int),
    ]


class StatsStruct(ctypes.Structure):
    """concord_stats_t, field for field."""

    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_uint64)
        for name in ("responses_cached", "responses_full", "response_lists", "collectives",
                     "fused_tensors", "inline_reductions", "device_launches", "cache_evictions",
                     "topk_residual_evictions", "scratch_bytes", "scratch_reallocations",
                     "kept_result_bytes")
    ]


class TensorStruct(ctypes.Structure):
    """concord_tensor_t."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("device", ctypes.c_int),
    ]


class DeviceOptsStruct(ctypes.Structure):
    """concord_device_opts_t, field for field (CUDA handles as void*)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("stream", ctypes.c_void_p),
        ("ready_event", ctypes.c_void_p),
    ]


# (name, restype, argtypes) of every entry point the binding calls.
_SIGNATURES = [
    ("concord_version", None, [ctypes.POINTER(ctypes.c_int)] * 3),
    ("concord_status_string", ctypes.c_char_p, [ctypes.c_int]),
    ("concord_config_init", None, [ctypes.POINTER(ConfigStruct)]),
    ("concord_allreduce_opts_init", None, [ctypes.c_void_p]),
    ("concord_compression_check", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
    ("concord_reducescatter_opts_init", None, [ctypes.c_void_p]),
    ("concord_reduce_opts_init", None, [ctypes.c_void_p]),
    ("concord_init", ctypes.c_int, [ctypes.POINTER(c_comm_p)]),
    ("concord_init_config", ctypes.c_int,
     [ctypes.POINTER(ConfigStruct), ctypes.POINTER(c_comm_p)]),
    ("concord_finalize", ctypes.c_int, [c_comm_p]),
    ("concord_comm_rank", ctypes.c_int, [c_comm_p, ctypes.POINTER(ctypes.c_int)]),
    ("concord_comm_size", ctypes.c_int, [c_comm_p, ctypes.POINTER(ctypes.c_int)]),
    ("concord_comm_local_rank", ctypes.c_int, [c_comm_p, ctypes.POINTER(ctypes.c_int)]),
    ("concord_comm_local_size", ctypes.c_int, [c_comm_p, ctypes.POINTER(ctypes.c_int)]),
    ("concord_comm_stats", ctypes.c_int, [c_comm_p, ctypes.POINTER(StatsStruct)]),
    ("concord_comm_metrics", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    ("concord_timeline_start", ctypes.c_int, [c_comm_p, ctypes.c_char_p]),
    ("concord_timeline_stop", ctypes.c_int, [c_comm_p]),
    ("concord_join", ctypes.c_int, [c_comm_p, ctypes.POINTER(ctypes.c_int)]),
    ("concord_comm_split", ctypes.c_int,
     [c_comm_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(c_comm_p)]),
    ("concord_comm_create_group", ctypes.c_int,
     [c_comm_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.POINTER(c_comm_p)]),
    ("concord_comm_last_error", ctypes.c_char_p, [c_comm_p]),
    ("concord_allreduce_async", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.POINTER(AllreduceOptsStruct), CALLBACK, ctypes.c_void_p,
      ctypes.POINTER(c_request_p)]),
    ("concord_allgather_async", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.c_void_p, ctypes.c_size_t,
      CALLBACK, ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_broadcast_async", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.c_int, CALLBACK, ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_barrier_async", ctypes.c_int,
     [c_comm_p, CALLBACK, ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    # blocking forms: the calling thread runs the operation (no hand-off to the engine's thread)
    ("concord_allreduce", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.POINTER(AllreduceOptsStruct)]),
    ("concord_broadcast", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.c_int]),
    ("concord_barrier", ctypes.c_int, [c_comm_p]),
    ("concord_group_start", ctypes.c_int, [c_comm_p]),
    ("concord_group_end", ctypes.c_int, [c_comm_p]),
    ("concord_end_step", ctypes.c_int, [c_comm_p]),
    ("concord_wait", ctypes.c_int, [c_request_p, ctypes.c_double]),
    ("concord_test", ctypes.c_int, [c_request_p]),
    ("concord_request_error", ctypes.c_char_p, [c_request_p]),
    ("concord_request_output", ctypes.c_int,
     [c_request_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
      ctypes.POINTER(ctypes.c_int64)]),
    ("concord_request_wire_bytes", ctypes.c_int, [c_request_p, ctypes.POINTER(ctypes.c_uint64)]),
    ("concord_request_free", None, [c_request_p]),
    ("concord_reducescatter_async", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.POINTER(ReducescatterOptsStruct), CALLBACK, ctypes.c_void_p,
      ctypes.POINTER(c_request_p)]),
    ("concord_alltoall_async", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.c_void_p, ctypes.c_size_t,
      ctypes.POINTER(AlltoallOptsStruct), CALLBACK, ctypes.c_void_p,
      ctypes.POINTER(c_request_p)]),
    ("concord_request_received_splits", ctypes.c_int,
     [c_request_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int]),
    ("concord_reduce_async", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.c_int, ctypes.POINTER(ReduceOptsStruct), CALLBACK, ctypes.c_void_p,
      ctypes.POINTER(c_request_p)]),
    ("concord_gather_async", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.c_void_p, ctypes.c_size_t,
      ctypes.c_int, CALLBACK, ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    # point to point
    ("concord_send_async", ctypes.c_int,
     [c_comm_p, ctypes.POINTER(TensorStruct), ctypes.c_int, ctypes.c_int64, CALLBACK,
      ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_recv_async", ctypes.c_int,
     [c_comm_p, ctypes.POINTER(TensorStruct), ctypes.c_int, ctypes.c_int64, CALLBACK,
      ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_request_output_shape", ctypes.c_int,
     [c_request_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
      ctypes.POINTER(ctypes.c_int64)]),
]

# Entry points for CUDA tensors: declared when the library has them (a libconcord without them
# still loads; CUDA tensors are then refused naming the missing function).
_DEVICE_SIGNATURES = [
    ("concord_allreduce_async_ex", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.POINTER(AllreduceOptsStruct), ctypes.POINTER(DeviceOptsStruct), CALLBACK,
      ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_allgather_async_ex", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.c_void_p, ctypes.c_size_t,
      ctypes.POINTER(DeviceOptsStruct), CALLBACK, ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_broadcast_async_ex", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.c_int, ctypes.POINTER(DeviceOptsStruct), CALLBACK, ctypes.c_void_p,
      ctypes.POINTER(c_request_p)]),
    ("concord_reducescatter_async_ex", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.POINTER(ReducescatterOptsStruct), ctypes.POINTER(DeviceOptsStruct), CALLBACK,
      ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_alltoall_async_ex", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.c_void_p, ctypes.c_size_t,
      ctypes.POINTER(AlltoallOptsStruct), ctypes.POINTER(DeviceOptsStruct), CALLBACK,
      ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_reduce_async_ex", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.POINTER(TensorStruct),
      ctypes.c_int, ctypes.POINTER(ReduceOptsStruct), ctypes.POINTER(DeviceOptsStruct), CALLBACK,
      ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_gather_async_ex", ctypes.c_int,
     [c_comm_p, ctypes.c_char_p, ctypes.POINTER(TensorStruct), ctypes.c_void_p, ctypes.c_size_t,
      ctypes.c_int, ctypes.POINTER(DeviceOptsStruct), CALLBACK, ctypes.c_void_p,
      ctypes.POINTER(c_request_p)]),
    ("concord_send_async_ex", ctypes.c_int,
     [c_comm_p, ctypes.POINTER(TensorStruct), ctypes.c_int, ctypes.c_int64,
      ctypes.POINTER(DeviceOptsStruct), CALLBACK, ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_recv_async_ex", ctypes.c_int,
     [c_comm_p, ctypes.POINTER(TensorStruct), ctypes.c_int, ctypes.c_int64,
      ctypes.POINTER(DeviceOptsStruct), CALLBACK, ctypes.c_void_p, ctypes.POINTER(c_request_p)]),
    ("concord_request_wait_stream", ctypes.c_int, [c_request_p, ctypes.c_void_p, ctypes.c_double]),
]


def _candidates():
    """Paths to try, in order, each with where it came from (for the error message)."""
    env = os.environ.get("CONCORD_LIBRARY")
    if env:
        yield env, "$CONCORD_LIBRARY"
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "libconcord.so*"))):
        yield path, "the package directory"
    # A source checkout: bindings/python/concord -> the repository root.
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    builds = []
    if os.environ.get("CONCORD_BUILD_DIR"):
        builds.append(os.environ["CONCORD_BUILD_DIR"])
    builds.append(os.path.join(root, "build"))
    builds.extend(sorted(glob.glob(os.path.join(root, "build-*"))))
    for build in builds:
        path = os.path.join(build, "libconcord.so")
        if os.path.exists(path):
            yield path, "the build tree"
    yield ctypes.util.find_library("concord") or "libconcord.so.0", "the system loader"


def load():
    """Loads libconcord and declares every signature; raises OSError naming what was tried."""
    tried = []
    for path, origin in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, origin, e))
            continue
        for name, restype, argtypes in _SIGNATURES:
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        for name, restype, argtypes in _DEVICE_SIGNATURES:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = restype
                fn.argtypes = argtypes
        lib.concord_path = path
        return lib
    raise OSError("concord: libconcord not found; set CONCORD_LIBRARY to its path, build it "
                  "(scripts/build.sh) or install it (cmake --install). Tried: " + "; ".join(tried))


def library_struct_size(lib, init_fn):
    """The sizeof the library itself gives a struct (read from struct_size after its *_init), via
    a buffer large enough for any version."""
    buf = ctypes.create_string_buffer(4096)
    getattr(lib, init_fn)(buf)
    return ctypes.c_size_t.from_buffer(buf).value


def struct_has_field(lib, struct, init_fn, field):
    """Whether both this mirror and the loaded library's struct have `field` (fields are only
    appended, so the library has it when its struct_size covers the field's end)."""
    desc = getattr(struct, field, None)
    if desc is None:
        return False
    return library_struct_size(lib, init_fn) >= desc.offset + desc.size
