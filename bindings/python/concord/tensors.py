"""Tensors as the C API sees them: numpy arrays and torch tensors turned into concord_tensor_t
descriptors, and new arrays or tensors of a given dtype and shape for results. numpy and torch are
imported only when an object of theirs is passed, so neither is required.

CUDA tensors (torch, tensor.is_cuda): describe() gives the device memory (data_ptr()), the device
index and torch's current stream of that device at the call, which the Communicator hands to the
C API's _ex entry points (concord_device_opts_t). Other devices (meta, mps, ...) are refused here,
naming the tensor and its device, before anything is enqueued."""
import ctypes
import math
import sys

from . import _lib
from .errors import InvalidArgumentError, UnavailableError

# concord_dtype_t by dtype name (numpy's names; torch's without the "torch." prefix). numpy has no
# bfloat16 of its own: an array whose dtype is named "bfloat16" (ml_dtypes) is accepted too.
DTYPES = {
    "uint8": 0,
    "int8": 1,
    "int32": 2,
    "int64": 3,
    "float16": 4,
    "bfloat16": 5,
    "float32": 6,
    "float64": 7,
}
_TORCH_DTYPES = {}  # torch.dtype -> concord_dtype_t, filled as dtypes are seen
_NUMPY_DTYPES = {}  # numpy.dtype -> concord_dtype_t, filled as dtypes are seen (dtype.name is slow)
ITEMSIZE = {0: 1, 1: 1, 2: 4, 3: 8, 4: 2, 5: 2, 6: 4, 7: 8}


def _is_torch(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _is_numpy(obj):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)


# What describe() makes of each Python type it has met: _NUMPY, _TORCH or None (neither). A type
# is what it is for good (a torch type cannot exist before torch is imported), so one isinstance
# test per type serves every later call, which then costs a dict lookup.
_NUMPY, _TORCH = "numpy", "torch"
_KINDS = {}


def _kind(obj):
    kind = _KINDS.get(type(obj), 0)
    if kind == 0:
        kind = _TORCH if _is_torch(obj) else _NUMPY if _is_numpy(obj) else None
        if kind is not None or len(_KINDS) < 256:  # strangers are not kept without bound
            _KINDS[type(obj)] = kind
    return kind


# The ctypes array type of a shape with n dimensions (one element at least, for a scalar).
_SHAPE_TYPES = [ctypes.c_int64 * max(n, 1) for n in range(9)]


class Described:
    """One tensor's C descriptor. It keeps the object (so its memory) and the shape array alive as
    long as the descriptor is referenced."""

    __slots__ = ("obj", "dtype", "shape", "_shape", "struct", "ptr", "what", "device", "stream",
                 "nbytes")

    def __init__(self, obj, ptr, dtype, shape, device=_lib.DEVICE_CPU, stream=None):
        self.obj = obj
        self.dtype = dtype
        self.shape = shape = tuple(map(int, shape))
        n = len(shape)
        self._shape = (_SHAPE_TYPES[n] if n < len(_SHAPE_TYPES) else ctypes.c_int64 * n)(*shape)
        self.struct = _lib.TensorStruct(ptr or None, dtype, n, self._shape, device)
        self.ptr = ptr
        self.what = None  # what the tensor is to the operation ("allreduce input"), for errors
        self.device = device  # DEVICE_CPU, or the CUDA device index
        self.stream = stream  # CUDA: torch's current stream of the device (cudaStream_t as int)
        self.nbytes = ITEMSIZE[dtype] * math.prod(shape)


def cuda_stream(index):
    """torch's current stream of CUDA device `index`, as a cudaStream_t (an int; 0 is the legacy
    default stream). UnavailableError when this torch cannot reach CUDA."""
    import torch
    try:
        return int(torch.cuda.current_stream(index).cuda_stream)
    except (AssertionError, RuntimeError) as e:  # torch without CUDA, no driver, no device
        raise UnavailableError(8, "cuda:%d: torch %s cannot reach CUDA to read its current "
                               "stream: %s" % (index, torch.__version__, e))


def _is_bool(obj):
    """Whether obj, a numpy array or torch tensor, holds bools."""
    torch = sys.modules.get("torch")
    return (torch is not None and obj.dtype is torch.bool) or \
        getattr(obj.dtype, "kind", None) == "b"


# In _TORCH_DTYPES and _NUMPY_DTYPES beside the concord_dtype_t codes: a bool dtype, which moves as
# uint8 (describe's as_bytes) and is never reduced.
_BOOL = -1


def describe(obj, what, writable=False, as_bytes=False):
    """The descriptor of a numpy array or torch tensor; InvalidArgumentError for anything Concord
    cannot take (other types, unsupported dtypes, sparse layouts, non-contiguous or read-only
    memory) and UnavailableError for a torch tensor on a device other than the CPU and CUDA.
    as_bytes: the operation only moves bytes (broadcast, gathers, all-to-all, send/recv), so a
    bool tensor goes as uint8 (one byte an element either way); elsewhere bool is refused.
    Every operation calls it once or twice, so the common case is a few dict lookups."""
    kind = _kind(obj)
    if kind is _TORCH:
        described = _describe_torch(obj, what, writable, as_bytes)
    elif kind is _NUMPY:
        described = _describe_numpy(obj, what, writable, as_bytes)
    else:
        raise InvalidArgumentError(1, "%s is a %s; Concord takes numpy arrays and torch tensors" %
                                   (what, type(obj).__name__))
    described.what = what
    return described


def _refuse_bool(obj, what):
    raise InvalidArgumentError(
        1, "%s has dtype %s: Concord moves bool tensors (as bytes) in broadcast, allgather, "
        "gather, alltoall and send/recv, but reduces none; cast it to uint8 first" %
        (what, obj.dtype))


def _describe_torch(obj, what, writable, as_bytes):
    torch = sys.modules["torch"]
    dtype = _TORCH_DTYPES.get(obj.dtype)
    if dtype is None:
        name = str(obj.dtype).replace("torch.", "")
        if obj.dtype is torch.bool:
            dtype = _TORCH_DTYPES[obj.dtype] = _BOOL
        elif name in DTYPES:
            dtype = _TORCH_DTYPES[obj.dtype] = DTYPES[name]
    if dtype == _BOOL:
        if not as_bytes:
            _refuse_bool(obj, what)
        obj, dtype = obj.view(torch.uint8), DTYPES["uint8"]
    index, stream = _lib.DEVICE_CPU, None
    if obj.is_cuda:
        device = obj.device
        index = device.index if device.index is not None else _current_device()
        stream = cuda_stream(index)
    else:
        try:
            on_cpu = obj.is_cpu  # torch >= 1.13; a tenth of obj.device's cost
        except AttributeError:
            on_cpu = obj.device.type == "cpu"
        if not on_cpu:
            raise UnavailableError(
                8, "%s is a %s tensor: Concord takes CPU and CUDA tensors; pass tensor.cpu()" %
                (what, obj.device.type))
    if dtype is None:
        raise InvalidArgumentError(1, "%s has dtype %s; Concord takes %s" %
                                   (what, obj.dtype, ", ".join(DTYPES)))
    if obj.layout != torch.strided:
        # A sparse (or mkldnn) tensor has no one block of memory Concord could read.
        raise InvalidArgumentError(
            1, "%s has layout %s: Concord takes dense tensors (torch.strided); pass "
            "tensor.to_dense()" % (what, obj.layout))
    if not obj.is_contiguous():
        raise InvalidArgumentError(1, "%s is not contiguous (call .contiguous())" % what)
    if writable:
        check_writable(obj, what)
    return Described(obj, obj.data_ptr(), dtype, obj.shape, index, stream)


def _describe_numpy(obj, what, writable, as_bytes):
    dtype = _NUMPY_DTYPES.get(obj.dtype)
    if dtype is None:
        name = obj.dtype.name
        if obj.dtype.kind == "b":
            dtype = _BOOL
        elif name not in DTYPES:
            raise InvalidArgumentError(1, "%s has dtype %s; Concord takes %s" %
                                       (what, name, ", ".join(DTYPES)))
        elif not obj.dtype.isnative:  # '>f4' is named float32 too: its bytes would be misread
            raise InvalidArgumentError(
                1, "%s has dtype %s in non-native byte order (%s); convert it with "
                "arr.astype(arr.dtype.newbyteorder('='))" % (what, name, obj.dtype.str))
        else:
            dtype = DTYPES[name]
        _NUMPY_DTYPES[obj.dtype] = dtype
    if dtype == _BOOL:
        if not as_bytes:
            _refuse_bool(obj, what)
        obj, dtype = obj.view("uint8"), DTYPES["uint8"]
    flags = obj.flags
    if not flags.c_contiguous:
        raise InvalidArgumentError(
            1, "%s is not C-contiguous (use numpy.ascontiguousarray)" % what)
    if writable and not flags.writeable:
        raise InvalidArgumentError(1, "%s is read-only" % what)
    return Described(obj, obj.ctypes.data, dtype, obj.shape)


def like_dtype(result, like):
    """result (uint8, as a bool tensor travelled: describe's as_bytes) viewed as bool when `like`
    is bool; else result itself."""
    if _is_bool(like) and not _is_bool(result):
        return result.view(sys.modules["torch"].bool if _is_torch(result) else "bool")
    return result


def _current_device():
    import torch
    return torch.cuda.current_device()


def check_writable(obj, what):
    """InvalidArgumentError when Concord may not write into obj: a read-only numpy array, or a
    torch leaf that requires grad (writing behind autograd's back)."""
    kind = _kind(obj)
    if kind is _TORCH:
        if obj.requires_grad and obj.is_leaf:
            raise InvalidArgumentError(
                1, "%s requires grad; pass tensor.data or run under torch.no_grad()" % what)
    elif kind is _NUMPY and not obj.flags.writeable:
        raise InvalidArgumentError(1, "%s is read-only" % what)


def empty_like(obj, first_dim=None):
    """A new uninitialised array or tensor like obj (a torch tensor: on obj's device), with its
    first dimension replaced."""
    shape = obj.shape if first_dim is None else (first_dim,) + tuple(obj.shape[1:])
    if _kind(obj) is _TORCH:
        return sys.modules["torch"].empty(shape, dtype=obj.dtype, device=obj.device)
    import numpy
    return numpy.empty(shape, dtype=obj.dtype)


_NAMES = {code: name for name, code in DTYPES.items()}  # concord_dtype_t -> its name
_NUMPY_OF = {}  # concord_dtype_t -> numpy dtype, filled as results are made


def _numpy_dtype(dtype):
    """numpy's dtype for a concord_dtype_t; bfloat16 needs ml_dtypes (InvalidArgumentError)."""
    found = _NUMPY_OF.get(dtype)
    if found is None:
        import numpy
        name = _NAMES[dtype]
        if name == "bfloat16":
            try:
                import ml_dtypes
            except ImportError:
                raise InvalidArgumentError(1, "received a bfloat16 tensor, which numpy cannot "
                                           "hold without ml_dtypes: recv with like= a torch "
                                           "tensor")
            found = numpy.dtype(ml_dtypes.bfloat16)
        else:
            found = numpy.dtype(name)
        _NUMPY_OF[dtype] = found
    return found


def empty(dtype, shape, torch_like=False):
    """A new uninitialised numpy array (or torch tensor) of a concord_dtype_t and shape. numpy has
    no bfloat16: a numpy result of that dtype needs ml_dtypes (else: pass a torch tensor)."""
    if torch_like:
        import torch
        return torch.empty(list(shape), dtype=getattr(torch, _NAMES[dtype]))
    import numpy
    return numpy.empty(list(shape), dtype=_numpy_dtype(dtype))


def is_torch(obj):
    return _kind(obj) is _TORCH


def view_address(address, nbytes, dtype, shape, owner, torch_like=False):
    """An array (a CPU torch tensor when torch_like) of a concord_dtype_t and shape over the
    nbytes of C memory at address, without a copy: it holds `owner`, which keeps that memory
    alive, until its last view goes. Raises as empty() does for a dtype numpy cannot hold."""
    memory = (ctypes.c_char * nbytes).from_address(address)
    memory.owner = owner  # numpy and torch keep the buffer object, so its owner, alive
    if torch_like:
        import torch
        return torch.frombuffer(memory, dtype=getattr(torch, _NAMES[dtype])).reshape(list(shape))
    import numpy
    return numpy.frombuffer(memory, dtype=_numpy_dtype(dtype)).reshape(list(shape))
