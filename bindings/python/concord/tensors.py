"""Tensors as the C API sees them: numpy arrays and torch tensors turned into concord_tensor_t
descriptors, and new arrays or tensors of a given dtype and shape for results. numpy and torch are
imported only when an object of theirs is passed, so neither is required.

CUDA tensors (torch, tensor.is_cuda): describe() gives the device memory (data_ptr()), the device
index and torch's current stream of that device at the call, which the Communicator hands to the
C API's _ex entry points (concord_device_opts_t). Other devices (meta, mps, ...) are refused here,
naming the tensor and its device, before anything is enqueued."""
import ctypes
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


class Described:
    """One tensor's C descriptor. It keeps the object (so its memory) and the shape array alive as
    long as the descriptor is referenced."""

    def __init__(self, obj, ptr, dtype, shape, device=_lib.DEVICE_CPU, stream=None):
        self.obj = obj
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        self._shape = (ctypes.c_int64 * max(len(self.shape), 1))(*self.shape)
        self.struct = _lib.TensorStruct(ptr or None, dtype, len(self.shape), self._shape, device)
        self.ptr = ptr
        self.what = None  # what the tensor is to the operation ("allreduce input"), for errors
        self.device = device  # DEVICE_CPU, or the CUDA device index
        self.stream = stream  # CUDA: torch's current stream of the device (cudaStream_t as int)
        self.nbytes = ITEMSIZE[dtype]
        for d in self.shape:
            self.nbytes *= d


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
    return str(obj.dtype) in ("torch.bool", "bool")


def describe(obj, what, writable=False, as_bytes=False):
    """The descriptor of a numpy array or torch tensor; InvalidArgumentError for anything Concord
    cannot take (other types, unsupported dtypes, sparse layouts, non-contiguous or read-only
    memory) and UnavailableError for a torch tensor on a device other than the CPU and CUDA.
    as_bytes: the operation only moves bytes (broadcast, gathers, all-to-all, send/recv), so a
    bool tensor goes as uint8 (one byte an element either way); elsewhere bool is refused."""
    if (_is_torch(obj) or _is_numpy(obj)) and _is_bool(obj):
        if not as_bytes:
            raise InvalidArgumentError(
                1, "%s has dtype %s: Concord moves bool tensors (as bytes) in broadcast, "
                "allgather, gather, alltoall and send/recv, but reduces none; cast it to uint8 "
                "first" % (what, obj.dtype))
        obj = obj.view(sys.modules["torch"].uint8 if _is_torch(obj) else "uint8")
    if _is_torch(obj):
        device = obj.device
        index, stream = _lib.DEVICE_CPU, None
        if device.type == "cuda":
            index = device.index if device.index is not None else _current_device()
            stream = cuda_stream(index)
        elif device.type != "cpu":
            raise UnavailableError(
                8, "%s is a %s tensor: Concord takes CPU and CUDA tensors; pass tensor.cpu()" %
                (what, device.type))
        dtype = _TORCH_DTYPES.get(obj.dtype)
        if dtype is None:
            name = str(obj.dtype).replace("torch.", "")
            if name not in DTYPES:
                raise InvalidArgumentError(1, "%s has dtype %s; Concord takes %s" %
                                           (what, obj.dtype, ", ".join(DTYPES)))
            dtype = _TORCH_DTYPES[obj.dtype] = DTYPES[name]
        if obj.layout != sys.modules["torch"].strided:
            # A sparse (or mkldnn) tensor has no one block of memory Concord could read.
            raise InvalidArgumentError(
                1, "%s has layout %s: Concord takes dense tensors (torch.strided); pass "
                "tensor.to_dense()" % (what, obj.layout))
        if not obj.is_contiguous():
            raise InvalidArgumentError(1, "%s is not contiguous (call .contiguous())" % what)
        if writable:
            check_writable(obj, what)
        described = Described(obj, obj.data_ptr(), dtype, obj.shape, index, stream)
        described.what = what
        return described
    if _is_numpy(obj):
        dtype = _NUMPY_DTYPES.get(obj.dtype)
        if dtype is None:
            name = obj.dtype.name
            if name not in DTYPES:
                raise InvalidArgumentError(1, "%s has dtype %s; Concord takes %s" %
                                           (what, name, ", ".join(DTYPES)))
            if not obj.dtype.isnative:  # '>f4' is named float32 too: its bytes would be misread
                raise InvalidArgumentError(
                    1, "%s has dtype %s in non-native byte order (%s); convert it with "
                    "arr.astype(arr.dtype.newbyteorder('='))" % (what, name, obj.dtype.str))
            dtype = _NUMPY_DTYPES[obj.dtype] = DTYPES[name]
        if not obj.flags.c_contiguous:
            raise InvalidArgumentError(
                1, "%s is not C-contiguous (use numpy.ascontiguousarray)" % what)
        if writable:
            check_writable(obj, what)
        return Described(obj, obj.ctypes.data, dtype, obj.shape)
    raise InvalidArgumentError(1, "%s is a %s; Concord takes numpy arrays and torch tensors" %
                               (what, type(obj).__name__))


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
    if _is_torch(obj):
        if obj.requires_grad and obj.is_leaf:
            raise InvalidArgumentError(
                1, "%s requires grad; pass tensor.data or run under torch.no_grad()" % what)
    elif _is_numpy(obj) and not obj.flags.writeable:
        raise InvalidArgumentError(1, "%s is read-only" % what)


def empty_like(obj, first_dim=None):
    """A new uninitialised array or tensor like obj (a torch tensor: on obj's device), with its
    first dimension replaced."""
    shape = list(obj.shape)
    if first_dim is not None:
        shape = [first_dim] + shape[1:]
    if _is_torch(obj):
        import torch
        return torch.empty(shape, dtype=obj.dtype, device=obj.device)
    import numpy
    return numpy.empty(shape, dtype=obj.dtype)


def empty(dtype, shape, torch_like=False):
    """A new uninitialised numpy array (or torch tensor) of a concord_dtype_t and shape. numpy has
    no bfloat16: a numpy result of that dtype needs ml_dtypes (else: pass a torch tensor)."""
    name = next(n for n, code in DTYPES.items() if code == dtype)
    if torch_like:
        import torch
        return torch.empty(list(shape), dtype=getattr(torch, name))
    import numpy
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise InvalidArgumentError(1, "received a bfloat16 tensor, which numpy cannot hold "
                                          "without ml_dtypes: recv with like= a torch tensor")
        return numpy.empty(list(shape), dtype=ml_dtypes.bfloat16)
    return numpy.empty(list(shape), dtype=name)


def is_torch(obj):
    return _is_torch(obj)


def view_address(address, nbytes, dtype, shape, owner, torch_like=False):
    """An array (a CPU torch tensor when torch_like) of a concord_dtype_t and shape over the
    nbytes of C memory at address, without a copy: it holds `owner`, which keeps that memory
    alive, until its last view goes. Raises as empty() does for a dtype numpy cannot hold."""
    memory = (ctypes.c_char * nbytes).from_address(address)
    memory.owner = owner  # numpy and torch keep the buffer object, so its owner, alive
    if torch_like:
        import torch
        name = next(n for n, code in DTYPES.items() if code == dtype)
        return torch.frombuffer(memory, dtype=getattr(torch, name)).reshape(list(shape))
    import numpy
    return numpy.frombuffer(memory, dtype=empty(dtype, [0]).dtype).reshape(list(shape))
