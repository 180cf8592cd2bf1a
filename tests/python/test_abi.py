"""The Python binding's mirrors of the C API's constants equal concord.h's: the status codes, the
dtypes, the reduce ops and the limits are written down once, in include/concord/concord.h, and
every mirror is checked here (the C++ mirrors are checked by static_assert in base/)."""
import pathlib
import re

from concord import ReduceOp, _lib, tensors
from concord.errors import Status

HEADER = pathlib.Path(__file__).resolve().parents[2] / "include" / "concord" / "concord.h"


def header_constants():
    text = HEADER.read_text()
    values = {m.group(1): int(m.group(2))
              for m in re.finditer(r"\bCONCORD_([A-Z0-9_]+)\s*=\s*(-?\d+)", text)}
    for m in re.finditer(r"#define CONCORD_([A-Z0-9_]+)\s+\(?(-?\d+)\)?\s*$", text, re.M):
        values[m.group(1)] = int(m.group(2))
    return values


def enum_block(name):
    """The enumerators of `typedef enum name { ... }` in concord.h, by name without CONCORD_."""
    body = re.search(r"typedef enum %s \{(.*?)\}" % name, HEADER.read_text(), re.S).group(1)
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"CONCORD_([A-Z0-9_]+)\s*=\s*(\d+)", body)}


def test_status_codes_equal_the_header():
    codes = enum_block("concord_status")
    assert len(codes) >= 14
    assert {s.name: s.value for s in Status} == codes


def test_reduce_ops_equal_the_header():
    assert {op.name: op.value for op in ReduceOp} == enum_block("concord_reduce_op")


def test_dtypes_equal_the_header():
    dtypes = enum_block("concord_dtype")
    assert {name.upper(): code for name, code in tensors.DTYPES.items()} == dtypes


def test_lib_constants_equal_the_header():
    c = header_constants()
    assert _lib.SUCCESS == c["SUCCESS"]
    assert _lib.ERR_INVALID_ARGUMENT == c["ERR_INVALID_ARGUMENT"]
    assert _lib.ERR_UNAVAILABLE == c["ERR_UNAVAILABLE"]
    assert _lib.IN_PROGRESS == c["IN_PROGRESS"]
    assert _lib.DEVICE_CPU == c["DEVICE_CPU"]
    assert _lib.MAX_DIMS == c["MAX_DIMS"]
    assert _lib.UNDEFINED == c["UNDEFINED"]


def test_stats_mirror_the_header():
    # StatsStruct has concord_stats_t's fields in its order (struct_size, then 8-byte counters).
    body = re.search(r"typedef struct concord_stats \{(.*?)\} concord_stats_t;",
                     HEADER.read_text(), re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)  # the comments name no fields
    fields = re.findall(r"\b(?:size_t|uint64_t)\s+(\w+);", body)
    assert len(fields) >= 13
    assert [name for name, _ in _lib.StatsStruct._fields_] == fields


def test_device_opts_mirror_the_library():
    # concord_device_opts_t as the _ex entry points read it: the library's own size (its
    # struct_size after concord_device_opts_init) is the mirror's.
    import ctypes

    import concord
    size = _lib.library_struct_size(concord.lib(), "concord_device_opts_init")
    assert ctypes.sizeof(_lib.DeviceOptsStruct) == size == 24
    for name in ("concord_allreduce_async_ex", "concord_allgather_async_ex",
                 "concord_broadcast_async_ex", "concord_reducescatter_async_ex",
                 "concord_alltoall_async_ex", "concord_reduce_async_ex", "concord_gather_async_ex",
                 "concord_send_async_ex", "concord_recv_async_ex", "concord_request_wait_stream"):
        assert getattr(concord.lib(), name).argtypes, name  # declared by _lib.load()


def test_option_structs_mirror_the_library():
    # Each options struct the binding fills has the library's size (its struct_size after _init).
    import ctypes

    import concord
    for init, mirror in (("concord_allreduce_opts_init", _lib.AllreduceOptsStruct),
                         ("concord_reducescatter_opts_init", _lib.ReducescatterOptsStruct),
                         ("concord_alltoall_opts_init", _lib.AlltoallOptsStruct),
                         ("concord_reduce_opts_init", _lib.ReduceOptsStruct)):
        assert ctypes.sizeof(mirror) == _lib.library_struct_size(concord.lib(), init), init
