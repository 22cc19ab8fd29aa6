"""Array operands: a uniform view (pointer, shape, strides, dtype, device, producer stream) of
whatever the caller passed, and the array library that allocates results and fallback copies in
the caller's own type.

Four families of arrays:
  * CuPy arrays and PyTorch CUDA tensors: read directly (the fast path), results of their type;
  * any other object with ``__cuda_array_interface__`` (v3; its ``stream`` is honoured) or
    ``__dlpack__`` (JAX, Numba, ...): wrapped here (DLPack through cuda.core's
    StridedMemoryView); results are converted with the array's ``__array_namespace__()``
    when it has one, else returned as a :class:`DeviceArray` (which exports DLPack itself,
    bfloat16 included, through the ctypes structs below);
  * NumPy host arrays: copied to the GPU, computed there, returned as NumPy.

Describing an operand (:func:`describe`) makes no CUDA call, except the DLPack hand-off, which
lets the producer order its work before the consumer stream; the device of a raw
``__cuda_array_interface__`` pointer is looked up separately (:func:`resolve_device`), after every
check that needs no device.
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import weakref
from dataclasses import dataclass, replace

import numpy as np

from .problem import MAX_DIM

# numpy-style dtype names -> kernel dtype names
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
NUMPY_NAMES = {v: k for k, v in DTYPE_NAMES.items()}
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
TMA_ALIGN = 16           # bytes: TMA needs 16-byte aligned base addresses and leading strides
LEGACY_STREAM = 1        # CU_STREAM_LEGACY; also the CAI / DLPack code for the legacy default stream
HOST = -1                # View.device of a host (NumPy) array
UNRESOLVED = -2          # View.device of a raw CUDA-array-interface pointer not yet looked up
MAX_SPAN = 1 << 48       # bytes from an array's first to its last element: more than any device
                         # holds, and far from wrapping the 64-bit address arithmetic done on them


@dataclass(frozen=True)
class View:
    """A 2-D array as the kernel sees it. Strides are in elements."""
    array: object
    lib: "ArrayLib"
    ptr: int
    shape: tuple
    strides: tuple
    dtype: str
    itemsize: int
    device: int              # CUDA ordinal, HOST or UNRESOLVED
    stream: int | None = None   # producer stream to wait for (CUDA array interface), or None
    readonly: bool = False
    keepalive: object = None    # what must outlive the view (a DLPack export)

    @property
    def is_host(self) -> bool:
        return self.device == HOST

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def major(self) -> int | None:
        """Index of the unit-stride dimension (1 = row-major), or None if neither is unit-stride."""
        rows, cols = self.shape
        if self.strides[1] == 1 or cols == 1:
            return 1
        if self.strides[0] == 1 or rows == 1:
            return 0
        return None

    def tma_ready(self, major: int) -> bool:
        """Whether TMA can use this view with dimension `major` innermost, without a copy.

        Besides 16-byte aligned base and leading stride, the rows must span whole 16-byte
        units: measured on the H200, TMA stores past a row end up to the next 16-byte boundary
        (and loads are treated the same way to be safe), so a ragged row end would write into,
        or read from, memory outside the array.
        """
        lead = self.leading_stride_bytes(major)
        return (self.ptr % TMA_ALIGN == 0 and lead % TMA_ALIGN == 0 and lead < (1 << 40)
                and (self.shape[major] * self.itemsize) % TMA_ALIGN == 0)

    def leading_stride_bytes(self, major: int) -> int:
        """Bytes between consecutive rows along the non-contiguous dimension."""
        other = 1 - major
        if self.shape[other] == 1:  # a single row: its stride is never used, pick a legal one
            return -(-self.shape[major] * self.itemsize // TMA_ALIGN) * TMA_ALIGN
        return self.strides[other] * self.itemsize

    def same_memory(self, other: "View") -> bool:
        """The same elements in the same layout (out=c for in-place accumulation)."""
        return (self.ptr == other.ptr and self.shape == other.shape
                and self.itemsize == other.itemsize
                and all(s == o or n == 1 for s, o, n in zip(self.strides, other.strides, self.shape)))


def overlaps(x: View, y: View) -> bool:
    """Whether two views share any byte of memory (exact, for any strides).

    NumPy's solver does the arithmetic on stand-in arrays built from the raw addresses; no
    memory is read, so this works for device pointers as well as host ones.
    """
    if x.size == 0 or y.size == 0:
        return False
    return bool(np.shares_memory(_stand_in(x), _stand_in(y)))


class _ArrayInterface:
    def __init__(self, interface: dict):
        self.__array_interface__ = interface


def _stand_in(v: View) -> np.ndarray:
    isz = v.itemsize
    # the stride of a dimension of one element is never stepped (and may be anything)
    strides = tuple(s * isz if n > 1 else 0 for s, n in zip(v.strides, v.shape))
    return np.asarray(_ArrayInterface({
        "shape": (v.shape[0], v.shape[1], isz), "typestr": "|u1", "data": (v.ptr, True),
        "strides": (*strides, 1), "version": 3}))


# --------------------------------------------------------------------------------------------
# describing operands
# --------------------------------------------------------------------------------------------
def _dtype_error(argname: str, got) -> TypeError:
    return TypeError(f"{argname}: unsupported dtype {got}; expected bfloat16 or float16 "
                     f"(float32 for out and c)")


def _kernel_dtype(dtype: np.dtype, argname: str) -> str:
    """The kernel dtype of a NumPy / CuPy dtype; the kernels read native (little-endian) bytes."""
    found = DTYPE_NAMES.get(dtype.name)
    if found is None:
        raise _dtype_error(argname, dtype.name)
    if not dtype.isnative:
        raise TypeError(f"{argname}: {dtype.name} in non-native byte order ({dtype.str!r}) is not "
                        f"supported; convert it first, e.g. x.astype(x.dtype.newbyteorder('='))")
    return found


def _checked(view: View, argname: str, byte_strides: tuple | None = None) -> View:
    """Shape and stride checks shared by every kind of array."""
    shape = view.shape
    if len(shape) != 2:
        raise ValueError(f"{argname}: expected a 2-D array, got {len(shape)}-D with shape {tuple(shape)}")
    if byte_strides is not None and any(s % view.itemsize for s in byte_strides):
        raise ValueError(f"{argname}: strides must be multiples of the element size "
                         f"({view.itemsize} bytes), got {tuple(byte_strides)} bytes")
    for i, n in enumerate(shape):
        if n > MAX_DIM:
            raise ValueError(f"{argname}: dimension {i} has {n} elements, more than the {MAX_DIM} the "
                             f"kernels can index (32-bit ints)")
    if 0 in shape:
        return view
    if any(s <= 0 and n > 1 for s, n in zip(view.strides, shape)):
        raise ValueError(f"{argname}: strides must be positive, got {tuple(view.strides)} (in elements) "
                         f"for shape {tuple(shape)}; broadcast (zero-stride) and reversed "
                         f"(negative-stride) views are not supported: pass a copy")
    span = sum((n - 1) * s for s, n in zip(view.strides, shape)) * view.itemsize + view.itemsize
    if span > MAX_SPAN or view.ptr + span > 1 << 64:
        raise ValueError(f"{argname}: shape {tuple(shape)} with strides {tuple(view.strides)} (in elements) "
                         f"from address {view.ptr:#x} spans {span} bytes, past what any device memory "
                         f"holds ({MAX_SPAN} bytes) or the 64-bit address space")
    return view


def _has(obj, name: str) -> bool:
    """hasattr, reading an object whose attribute lookup raises anything as lacking `name`."""
    try:
        return hasattr(obj, name)
    except Exception:
        return False


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _ints(value, argname: str, what: str) -> tuple:
    """`value` as a tuple of Python ints, or TypeError naming `argname` and `what`."""
    if not isinstance(value, (tuple, list)) or not all(_is_int(v) for v in value):
        raise TypeError(f"{argname}: __cuda_array_interface__ {what!r} must be a tuple of ints, got {value!r}")
    return tuple(int(v) for v in value)


def _cai_stream(stream, argname: str) -> int | None:
    """The CAI v3 'stream': None, 1 (legacy default), 2 (per-thread default) or a CUstream."""
    if stream is None:
        return None
    if not _is_int(stream):
        raise TypeError(f"{argname}: __cuda_array_interface__ 'stream' must be None or an int, got {stream!r}")
    if stream == 0:
        raise ValueError(f"{argname}: __cuda_array_interface__ 'stream' must not be 0 (the spec reserves it); "
                         f"use 1 for the legacy default stream")
    if not 0 < stream < 1 << 64:
        raise ValueError(f"{argname}: __cuda_array_interface__ 'stream' must be a CUstream handle in "
                         f"[1, 2^64), got {stream!r}")
    return int(stream)


def _cai_view(obj, argname: str) -> View:
    try:
        cai = obj.__cuda_array_interface__
    except Exception as exc:   # e.g. torch raises for bfloat16
        raise TypeError(f"{argname}: its __cuda_array_interface__ could not be read: {exc}") from exc
    if not isinstance(cai, dict) or not {"shape", "typestr", "data"} <= cai.keys():
        raise TypeError(f"{argname}: expected __cuda_array_interface__ to be a dict with 'shape', "
                        f"'typestr' and 'data', got {cai!r}")
    version = cai.get("version", 0)
    if not _is_int(version) or version not in (0, 1, 2, 3):
        raise ValueError(f"{argname}: __cuda_array_interface__ version {version!r} is not supported; "
                         f"expected version 3 (or 0-2)")
    if cai.get("mask") is not None:
        raise ValueError(f"{argname}: masked arrays (__cuda_array_interface__ 'mask') are not supported")
    shape = _ints(cai["shape"], argname, "shape")
    if any(n < 0 for n in shape):
        raise ValueError(f"{argname}: __cuda_array_interface__ 'shape' must not be negative, got {shape}")
    typestr = cai["typestr"]
    if not isinstance(typestr, str):
        raise _dtype_error(argname, f"{typestr!r} (__cuda_array_interface__ typestr)")
    if typestr[:1] == ">":     # jitgemm runs on little-endian hosts only
        raise TypeError(f"{argname}: non-native (big-endian) byte order is not supported, got "
                        f"__cuda_array_interface__ typestr {typestr!r}")
    if typestr[1:] in ("f2", "f4") and typestr[0] in "<|=":
        dtype = {"f2": "fp16", "f4": "fp32"}[typestr[1:]]
    elif typestr[1:] == "V2" and _bfloat16_named(obj):
        dtype = "bf16"  # bfloat16 has no typestr of its own; the array's dtype names it
    else:
        raise _dtype_error(argname, f"{typestr!r} (__cuda_array_interface__ typestr)")
    itemsize = ITEMSIZE[dtype]
    if len(shape) != 2:
        raise ValueError(f"{argname}: expected a 2-D array, got {len(shape)}-D with shape {shape}")
    data = cai["data"]
    if not (isinstance(data, (tuple, list)) and len(data) == 2 and _is_int(data[0])
            and isinstance(data[1], (bool, np.bool_, int))):
        raise TypeError(f"{argname}: __cuda_array_interface__ 'data' must be (pointer: int, read-only: bool), "
                        f"got {data!r}")
    ptr, readonly = int(data[0]), bool(data[1])
    if not 0 <= ptr < 1 << 64:
        raise ValueError(f"{argname}: __cuda_array_interface__ pointer {ptr:#x} is not a 64-bit address")
    byte_strides = cai.get("strides")
    if byte_strides is None:
        byte_strides = (shape[1] * itemsize, itemsize)
    byte_strides = _ints(byte_strides, argname, "strides")
    if len(byte_strides) != len(shape):
        raise ValueError(f"{argname}: __cuda_array_interface__ 'strides' {byte_strides} must have one entry "
                         f"per dimension of shape {shape}")
    stream = _cai_stream(cai.get("stream"), argname)
    view = View(obj, GENERIC, ptr, shape, tuple(s // itemsize for s in byte_strides), dtype,
                itemsize, UNRESOLVED, stream, readonly)
    return _checked(view, argname, byte_strides)


def _bfloat16_named(obj) -> bool:
    try:
        return str(getattr(obj, "dtype", "")).removeprefix("torch.") == "bfloat16"
    except Exception:
        return False


_DLPACK_DEVICE_TYPES = {2: "CUDA", 13: "CUDA managed"}   # kDLCUDA, kDLCUDAManaged


def _dlpack_view(obj, argname: str, stream: int) -> View:
    from cuda.core.utils import StridedMemoryView
    try:
        device_type, _ = obj.__dlpack_device__()
    except Exception as exc:
        raise TypeError(f"{argname}: its __dlpack_device__() did not give (device type, id): {exc}") from exc
    if device_type not in _DLPACK_DEVICE_TYPES:
        raise ValueError(f"{argname}: expected a CUDA device array or a NumPy array, got a "
                         f"{type(obj).__name__} on DLPack device type {device_type} (not CUDA memory)")
    try:
        smv = StridedMemoryView.from_dlpack(obj, stream_ptr=stream)
    except NotImplementedError as exc:   # bfloat16 without ml_dtypes
        raise TypeError(f"{argname}: {exc} (install ml_dtypes for bfloat16 DLPack arrays)") from exc
    except Exception as exc:             # whatever the producer's __dlpack__ raises or returns
        raise TypeError(f"{argname}: its DLPack export failed: {type(exc).__name__}: {exc}") from exc
    dtype = _kernel_dtype(np.dtype(smv.dtype), argname)
    shape = tuple(smv.shape)
    if len(shape) != 2:
        raise ValueError(f"{argname}: expected a 2-D array, got {len(shape)}-D with shape {shape}")
    strides = tuple(smv.strides) if smv.strides is not None else (shape[1], 1)
    view = View(obj, GENERIC, smv.ptr, shape, strides, dtype, ITEMSIZE[dtype], smv.device_id,
                None, bool(smv.readonly), keepalive=smv)
    return _checked(view, argname)


def describe(obj, argname: str, stream: int = LEGACY_STREAM) -> View:
    """The View of `obj`, or TypeError/ValueError naming `argname`. `stream` is the consumer
    stream handed to ``__dlpack__`` (the only protocol that needs it up front)."""
    lib = lib_of(obj)
    if lib is not None:
        return lib.view(obj, argname)
    if _has(obj, "__cuda_array_interface__"):
        return _cai_view(obj, argname)
    if _has(obj, "__dlpack__") and _has(obj, "__dlpack_device__"):
        return _dlpack_view(obj, argname, stream)
    raise TypeError(f"{argname}: expected a CuPy array, a PyTorch CUDA tensor, a NumPy array or an "
                    f"object with __cuda_array_interface__ or __dlpack__, got {type(obj).__name__}")


def needs_consumer_stream(obj) -> bool:
    """Whether describing `obj` hands a stream to its producer (DLPack-only objects)."""
    return (lib_of(obj) is None and not _has(obj, "__cuda_array_interface__")
            and _has(obj, "__dlpack__"))


def pointer_device(ptr: int) -> int:
    """The CUDA ordinal owning device pointer `ptr` (a driver query)."""
    from cuda.bindings import driver
    from . import runtime
    runtime.init_driver()
    err, ordinal = driver.cuPointerGetAttribute(
        driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    if err != driver.CUresult.CUDA_SUCCESS:
        return -1
    return int(ordinal)


def resolve_device(view: View, argname: str) -> View:
    """Look up the device of a raw CUDA-array-interface pointer (other views pass through)."""
    if view.device != UNRESOLVED or view.size == 0:   # an empty array has no memory to ask about
        return view
    ordinal = pointer_device(view.ptr)
    if ordinal < 0:
        raise ValueError(f"{argname}: __cuda_array_interface__ pointer {view.ptr:#x} is not CUDA "
                         f"device memory")
    return replace(view, device=ordinal)


# --------------------------------------------------------------------------------------------
# array libraries
# --------------------------------------------------------------------------------------------
class ArrayLib:
    """Allocation, copies and stream scoping in one array library."""
    name = "?"
    fast = False     # a fast-path library: `key` identifies an operand for the call-plan cache

    def view(self, array, argname: str) -> View:
        raise NotImplementedError

    def key(self, array) -> tuple:
        raise NotImplementedError

    def data_ptr(self, array) -> int:
        raise NotImplementedError

    def device_of(self, array) -> int:
        raise NotImplementedError

    def current_stream(self, device: int) -> int:
        raise NotImplementedError

    def stream_scope(self, handle: int, device: int):
        """A context in which the library's own operations run on stream `handle`."""
        raise NotImplementedError

    def empty(self, shape, dtype: str, device: int, stream: int):
        raise NotImplementedError

    def zeros(self, shape, dtype: str, device: int, stream: int):
        raise NotImplementedError

    def copy_(self, dst: View, src: View, stream: int) -> None:
        raise NotImplementedError

    def scale_(self, dst: View, src: View, beta: float, stream: int) -> None:
        """dst = beta * src (src may be dst)."""
        raise NotImplementedError

    def zero_(self, dst: View, stream: int) -> None:
        dst.array[...] = 0

    def window(self, array, rows: int, cols: int, transpose: bool, argname: str) -> View:
        """The View of array[:rows, :cols] (of its transpose when `transpose`)."""
        part = array[:rows, :cols]
        return self.view(part.T if transpose else part, argname)

    def result(self, array, like):
        """`array` (allocated by this library) as the caller's type."""
        return array


class CupyLib(ArrayLib):
    name = "cupy"
    fast = True

    def __init__(self):
        import cupy
        self.cp = cupy

    def view(self, array, argname):
        itemsize = array.dtype.itemsize
        dtype = _kernel_dtype(array.dtype, argname)
        view = View(array, self, array.data.ptr, array.shape, tuple(s // itemsize for s in array.strides),
                    dtype, itemsize, array.data.device_id)
        return _checked(view, argname, array.strides)

    def key(self, array):
        return (array.data.ptr, array.shape, array.strides, array.dtype, array.data.device_id)

    def data_ptr(self, array):
        return array.data.ptr

    def device_of(self, array):
        return array.data.device_id

    def current_stream(self, device):
        return self.cp.cuda.get_current_stream(device).ptr

    @contextlib.contextmanager
    def stream_scope(self, handle, device):
        with self.cp.cuda.Device(device), self.cp.cuda.ExternalStream(handle, device):
            yield

    def empty(self, shape, dtype, device, stream):
        with self.cp.cuda.Device(device):
            return self.cp.empty(shape, dtype=numpy_dtype(dtype))

    def zeros(self, shape, dtype, device, stream):
        with self.cp.cuda.Device(device):
            return self.cp.zeros(shape, dtype=numpy_dtype(dtype))

    def copy_(self, dst, src, stream):
        with self.cp.cuda.Device(dst.device):
            dst.array[...] = src.array

    def scale_(self, dst, src, beta, stream):
        with self.cp.cuda.Device(dst.device):
            self.cp.multiply(src.array, beta, out=dst.array, casting="unsafe")


class TorchLib(ArrayLib):
    name = "torch"
    fast = True

    def __init__(self):
        import torch
        self.torch = torch
        self.dtypes = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
        self.torch_dtypes = {v: k for k, v in self.dtypes.items()}
        self.devices: dict = {}
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.current_stream = raw if raw is not None else (
            lambda device: torch.cuda.current_stream(device).cuda_stream)

    def _device(self, ordinal):
        dev = self.devices.get(ordinal)
        if dev is None:
            dev = self.devices[ordinal] = self.torch.device("cuda", ordinal)
        return dev

    def view(self, array, argname):
        if array.device.type != "cuda":
            raise ValueError(f"{argname}: expected a CUDA tensor (or a NumPy array), got a tensor "
                             f"on {array.device}")
        dtype = self.dtypes.get(array.dtype)
        if dtype is None:
            raise _dtype_error(argname, str(array.dtype).removeprefix("torch."))
        view = View(array, self, array.data_ptr(), tuple(array.shape), tuple(array.stride()), dtype,
                    array.element_size(), array.get_device())
        return _checked(view, argname)

    def key(self, array):
        return (array.data_ptr(), array.shape, array.stride(), array.dtype, array.get_device())

    def data_ptr(self, array):
        return array.data_ptr()

    def device_of(self, array):
        return array.get_device()

    def stream_scope(self, handle, device):
        return self.torch.cuda.stream(self.torch.cuda.ExternalStream(handle, device=self._device(device)))

    def empty(self, shape, dtype, device, stream):
        return self.torch.empty(shape, dtype=self.torch_dtypes[dtype], device=self._device(device))

    def zeros(self, shape, dtype, device, stream):
        return self.torch.zeros(shape, dtype=self.torch_dtypes[dtype], device=self._device(device))

    def copy_(self, dst, src, stream):
        dst.array.copy_(src.array)

    def scale_(self, dst, src, beta, stream):
        self.torch.mul(src.array, beta, out=dst.array)


class HostLib(ArrayLib):
    """NumPy host arrays: validated like device arrays, computed after a copy to the GPU."""
    name = "numpy"

    def view(self, array, argname):
        itemsize = array.dtype.itemsize
        dtype = _kernel_dtype(array.dtype, argname)
        view = View(array, self, array.ctypes.data, array.shape, tuple(s // itemsize for s in array.strides),
                    dtype, itemsize, HOST, None, not array.flags.writeable)
        return _checked(view, argname, array.strides)

    def empty(self, shape, dtype, device, stream):
        return np.empty(shape, numpy_dtype(dtype))

    def copy_(self, dst, src, stream):
        dst.array[...] = src.array

    def scale_(self, dst, src, beta, stream):
        dst.array[...] = (src.array.astype(np.float32) * np.float32(beta)).astype(dst.array.dtype)


_LIB_CLASSES = (("cupy", "ndarray", CupyLib), ("torch", "Tensor", TorchLib), ("numpy", "ndarray", HostLib))
_LIBS_BY_TYPE: dict = {}
_LIB_INSTANCES: dict = {}
_lib_lock = threading.Lock()


def lib_of(obj) -> ArrayLib | None:
    """The library for CuPy arrays, torch tensors and NumPy arrays (None for other objects)."""
    t = type(obj)
    found = _LIBS_BY_TYPE.get(t, False)
    if found is not False:
        return found
    found = None
    for module, cls_name, lib_cls in _LIB_CLASSES:
        mod = sys.modules.get(module)
        if mod is not None and issubclass(t, getattr(mod, cls_name)):
            with _lib_lock:
                found = _LIB_INSTANCES.get(module)
                if found is None:
                    found = _LIB_INSTANCES[module] = lib_cls()
            break
    _LIBS_BY_TYPE[t] = found
    return found


# --------------------------------------------------------------------------------------------
# raw device memory for arrays of other libraries (CUDA array interface / DLPack)
# --------------------------------------------------------------------------------------------
def numpy_dtype(dtype: str) -> np.dtype:
    if dtype == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(NUMPY_NAMES[dtype])


def _free(ptr: int, stream: int, context) -> None:
    """Release stream-ordered device memory (at garbage collection, on any thread)."""
    from cuda.bindings import driver
    if driver.cuCtxPushCurrent(context)[0] != driver.CUresult.CUDA_SUCCESS:
        return   # the process is shutting down and the context is gone
    try:
        if driver.cuMemFreeAsync(ptr, driver.CUstream(stream))[0] != driver.CUresult.CUDA_SUCCESS:
            driver.cuMemFree(ptr)     # the stream no longer exists
    finally:
        driver.cuCtxPopCurrent()


class DeviceMemory:
    """`nbytes` of stream-ordered device memory, freed on `stream` when garbage-collected.
    Needs the device's context current when created."""

    def __init__(self, nbytes: int, stream: int):
        from cuda.bindings import driver
        from . import runtime
        self.nbytes = nbytes
        self.ptr = int(runtime.check(driver.cuMemAllocAsync(nbytes, driver.CUstream(stream)),
                                     f"cuMemAllocAsync({nbytes})"))
        self.context = runtime.check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        weakref.finalize(self, _free, self.ptr, stream, self.context)

    @contextlib.contextmanager
    def current(self):
        """The memory's context, current on this thread for the block."""
        from cuda.bindings import driver
        from . import runtime
        runtime.check(driver.cuCtxPushCurrent(self.context), "cuCtxPushCurrent")
        try:
            yield
        finally:
            driver.cuCtxPopCurrent()


# --------------------------------------------------------------------------------------------
# DLPack export: the C structs of dlpack.h, built with ctypes
# --------------------------------------------------------------------------------------------
DL_CUDA = 2                                                         # kDLCUDA
DL_DTYPES = {"bf16": (4, 16), "fp16": (2, 16), "fp32": (2, 32)}     # (kDLBfloat / kDLFloat, bits)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)          # void (*)(DLManagedTensor*)
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(PyObject*): a raw pointer,
                                                              # never a py_object of a dying capsule


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


def _capi(name: str, restype, *argtypes):
    """A private prototype of a Python C-API function (ctypes.pythonapi's are shared state)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                     _CapsuleDestructor)
_capsule_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_capsule_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_incref = _capi("Py_IncRef", None, ctypes.py_object)
_decref = _capi("Py_DecRef", None, ctypes.c_void_p)


class _CapsuleKind:
    """One capsule flavour: its name, its managed-tensor struct, and the C callbacks.

    Each export is a :class:`_Export` with one extra reference, whose address is the struct's
    ``manager_ctx``; the deleter (called by the consumer once done, or by the capsule destructor
    if the capsule was never consumed) drops that reference, freeing the structs and releasing
    the array that owns the device memory."""

    def __init__(self, name: bytes, struct):
        self.name, self.struct = name, struct
        self.deleter = _Deleter(self._delete)
        self.destructor = _CapsuleDestructor(self._destroy)
        _incref(self)   # never freed: a consumer may call the deleter while the interpreter exits

    def _delete(self, managed: int) -> None:
        _decref(self.struct.from_address(managed).manager_ctx)

    def _destroy(self, capsule: int) -> None:
        if _capsule_is_valid(capsule, self.name):   # still "dltensor...": never consumed
            self._delete(_capsule_pointer(capsule, self.name))


_LEGACY = _CapsuleKind(b"dltensor", DLManagedTensor)
_VERSIONED = _CapsuleKind(b"dltensor_versioned", DLManagedTensorVersioned)


class _Export:
    """What one capsule owns: the structs it points to, and the array keeping the memory alive."""
    __slots__ = ("managed", "shape", "strides", "array")


def dlpack_capsule(array: "DeviceArray", versioned: bool):
    """A DLPack capsule of `array` (DLManagedTensorVersioned when `versioned`)."""
    kind = _VERSIONED if versioned else _LEGACY
    export = _Export()
    export.array = array
    export.shape = (ctypes.c_int64 * 2)(*array.shape)
    export.strides = (ctypes.c_int64 * 2)(*array.strides_elements)
    managed = export.managed = kind.struct()
    code, bits = DL_DTYPES[array.dtype_name]
    managed.dl_tensor = DLTensor(array.ptr, DLDevice(DL_CUDA, array.device), 2,
                                 DLDataType(code, bits, 1), export.shape, export.strides, 0)
    managed.manager_ctx = id(export)
    managed.deleter = kind.deleter
    if versioned:
        managed.version = DLPackVersion(1, 0)       # flags 0: writable, not a copy
    _incref(export)                                 # dropped by the deleter
    try:
        return _capsule_new(ctypes.addressof(managed), kind.name, kind.destructor)
    except BaseException:
        kind._delete(ctypes.addressof(managed))
        raise


class DeviceArray:
    """A 2-D device array owned by jitgemm: the result type for inputs whose library jitgemm
    cannot allocate in. Exposes ``__cuda_array_interface__`` (v3, naming the stream the result
    was computed on) and ``__dlpack__`` (bfloat16 included), so CuPy, PyTorch, JAX, Numba, ...
    adopt it without a copy (``cupy.asarray(r)``, ``torch.from_dlpack(r)``,
    ``jax.numpy.from_dlpack(r)``, ...)."""

    def __init__(self, memory: DeviceMemory | None, shape: tuple, dtype: str, device: int, stream: int):
        self._memory = memory
        self.ptr = memory.ptr if memory is not None else 0
        self.shape = shape
        self.strides_elements = (shape[1], 1)
        self.dtype_name = dtype
        self.device = device
        self.stream = stream

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype_name)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": self.dtype.descr,
                "data": (self.ptr, False), "strides": None, "version": 3, "stream": self.stream}

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this array, safe to use on the consumer's `stream` (None: the
        legacy default stream; -1: no ordering; else a CUstream, 1 and 2 the default streams)."""
        if stream == 0 or not (stream is None or isinstance(stream, int)):
            raise ValueError(f"stream: expected None, -1 or a CUDA stream handle, got {stream!r} "
                             f"(0 is ambiguous in the DLPack protocol: use 1 for the legacy default stream)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"{self!r} cannot be exported to DLPack device {tuple(dl_device)} "
                              f"(it lives on {self.__dlpack_device__()}) without a copy")
        if copy:
            raise BufferError(f"{self!r}: copy=True is not supported; export it and copy in the consumer")
        consumer = LEGACY_STREAM if stream is None else stream
        if consumer != -1 and consumer != self.stream and self._memory is not None:
            with self._memory.current():
                stream_wait(consumer, self.stream, self.device)
        return dlpack_capsule(self, versioned=max_version is not None and max_version[0] >= 1)

    def __dlpack_device__(self):
        return (DL_CUDA, self.device)

    def __repr__(self) -> str:
        return (f"jitgemm.DeviceArray(shape={self.shape}, dtype={NUMPY_NAMES[self.dtype_name]}, "
                f"device={self.device})")


_events = threading.local()


def stream_wait(consumer: int, producer: int, device: int) -> None:
    """Make `consumer` wait for the work queued so far on `producer` (no host synchronisation)."""
    from cuda.bindings import driver
    from . import runtime
    cache = getattr(_events, "by_device", None)
    if cache is None:
        cache = _events.by_device = {}
    event = cache.get(device)
    if event is None:
        event = cache[device] = runtime.check(
            driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    runtime.check(driver.cuEventRecord(event, driver.CUstream(producer)), "cuEventRecord")
    runtime.check(driver.cuStreamWaitEvent(driver.CUstream(consumer), event, 0), "cuStreamWaitEvent")


def copy_2d(dst_ptr: int, dst_strides: tuple, src_ptr: int, src_strides: tuple, shape: tuple,
            itemsize: int, stream: int, dst_host: bool = False, src_host: bool = False) -> None:
    """Copy a (rows, cols) strided array (strides in elements) with 2-D driver copies: one when
    both sides share a unit-stride dimension, else one per row or column."""
    from cuda.bindings import driver
    from . import runtime
    mem = driver.CUmemorytype
    rows, cols = shape
    if rows == 0 or cols == 0:
        return
    if src_strides[1] == 1 and dst_strides[1] == 1 or cols == 1:
        plan = [(0, 0, cols * itemsize, rows, src_strides[0], dst_strides[0])]
    elif src_strides[0] == 1 and dst_strides[0] == 1 or rows == 1:
        plan = [(0, 0, rows * itemsize, cols, src_strides[1], dst_strides[1])]
    elif rows <= cols:   # element by element along each row
        plan = [(i * src_strides[0], i * dst_strides[0], itemsize, cols, src_strides[1], dst_strides[1])
                for i in range(rows)]
    else:
        plan = [(j * src_strides[1], j * dst_strides[1], itemsize, rows, src_strides[0], dst_strides[0])
                for j in range(cols)]
    for src_off, dst_off, width, height, src_pitch, dst_pitch in plan:
        p = driver.CUDA_MEMCPY2D()
        p.srcMemoryType = mem.CU_MEMORYTYPE_HOST if src_host else mem.CU_MEMORYTYPE_DEVICE
        p.dstMemoryType = mem.CU_MEMORYTYPE_HOST if dst_host else mem.CU_MEMORYTYPE_DEVICE
        if src_host:
            p.srcHost = src_ptr + src_off * itemsize
        else:
            p.srcDevice = src_ptr + src_off * itemsize
        if dst_host:
            p.dstHost = dst_ptr + dst_off * itemsize
        else:
            p.dstDevice = dst_ptr + dst_off * itemsize
        p.srcPitch = max(src_pitch * itemsize, width) if height > 1 else width
        p.dstPitch = max(dst_pitch * itemsize, width) if height > 1 else width
        p.WidthInBytes = width
        p.Height = height
        runtime.check(driver.cuMemcpy2DAsync(p, driver.CUstream(stream)), "cuMemcpy2DAsync")


class GenericLib(ArrayLib):
    """Device arrays of any other library: memory and copies by the driver."""
    name = "cuda"

    def view(self, array, argname):
        return View(array, self, array.ptr, array.shape, array.strides_elements, array.dtype_name,
                    ITEMSIZE[array.dtype_name], array.device, None)

    def stream_scope(self, handle, device):
        return contextlib.nullcontext()

    def empty(self, shape, dtype, device, stream):
        nbytes = shape[0] * shape[1] * ITEMSIZE[dtype]
        return DeviceArray(DeviceMemory(nbytes, stream) if nbytes else None, tuple(shape), dtype,
                           device, stream)

    def zeros(self, shape, dtype, device, stream):
        from cuda.bindings import driver
        from . import runtime
        array = self.empty(shape, dtype, device, stream)
        nbytes = shape[0] * shape[1] * ITEMSIZE[dtype]
        if nbytes:
            runtime.check(driver.cuMemsetD8Async(array.ptr, 0, nbytes, driver.CUstream(stream)),
                          "cuMemsetD8Async")
        return array

    def window(self, array, rows, cols, transpose, argname):
        shape, strides = (rows, cols), array.strides_elements
        if transpose:
            shape, strides = (cols, rows), strides[::-1]
        return View(array, self, array.ptr, shape, strides, array.dtype_name,
                    ITEMSIZE[array.dtype_name], array.device, None)

    def copy_(self, dst, src, stream):
        copy_2d(dst.ptr, dst.strides, src.ptr, src.strides, dst.shape, dst.itemsize, stream)

    def zero_(self, dst, stream):
        zeros = self.zeros(dst.shape, dst.dtype, dst.device, stream)
        self.copy_(dst, self.window(zeros, dst.shape[0], dst.shape[1], False, "zeros"), stream)

    def scale_(self, dst, src, beta, stream):
        """Rare (K = 0 with beta not 0 or 1): through the host, synchronising `stream`."""
        from cuda.bindings import driver
        from . import runtime
        host = np.empty(src.shape, numpy_dtype(src.dtype))
        copy_2d(host.ctypes.data, (src.shape[1], 1), src.ptr, src.strides, src.shape, src.itemsize, stream,
                dst_host=True)
        runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")
        scaled = (host.astype(np.float32) * np.float32(beta)).astype(host.dtype)
        copy_2d(dst.ptr, dst.strides, scaled.ctypes.data, (scaled.shape[1], 1), dst.shape, dst.itemsize,
                stream, src_host=True)
        runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")

    def result(self, array, like):
        namespace = getattr(like, "__array_namespace__", None)
        return namespace().from_dlpack(array) if namespace is not None else array


GENERIC = GenericLib()
