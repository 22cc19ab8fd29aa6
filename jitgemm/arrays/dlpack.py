"""DeviceArray, the row-major device array jitgemm returns for inputs whose library it cannot allocate
in, and its DLPack export: the C structs of dlpack.h built with ctypes, in capsules.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .memory import DeviceMemory, stream_wait
from .views import LEGACY_STREAM, NUMPY_NAMES, contiguous_strides, numpy_dtype

# The C structs of dlpack.h
DL_CUDA = 2  # kDLCUDA
DL_DTYPES = {"bf16": (4, 16), "fp16": (2, 16), "fp32": (2, 32)}  # (kDLBfloat / kDLFloat, bits)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(DLManagedTensor*)
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(PyObject*): a raw pointer,
# never a py_object of a dying capsule


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


def _capi(name: str, restype, *argtypes):
    """A private prototype of a Python C-API function (ctypes.pythonapi's are shared state)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor)
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
        _incref(self)  # never freed: a consumer may call the deleter while the interpreter exits

    def _delete(self, managed: int) -> None:
        _decref(self.struct.from_address(managed).manager_ctx)

    def _destroy(self, capsule: int) -> None:
        if _capsule_is_valid(capsule, self.name):  # still "dltensor...": never consumed
            self._delete(_capsule_pointer(capsule, self.name))


_LEGACY = _CapsuleKind(b"dltensor", DLManagedTensor)
_VERSIONED = _CapsuleKind(b"dltensor_versioned", DLManagedTensorVersioned)


class _Export:
    """What one capsule owns: the structs it points to, and the array keeping the memory alive."""

    __slots__ = ("managed", "shape", "strides", "array")


def dlpack_capsule(array: DeviceArray, versioned: bool):
    """A DLPack capsule of `array` (DLManagedTensorVersioned when `versioned`)."""
    kind = _VERSIONED if versioned else _LEGACY
    export = _Export()
    export.array = array
    ndim = len(array.shape)
    export.shape = (ctypes.c_int64 * ndim)(*array.shape)
    export.strides = (ctypes.c_int64 * ndim)(*array.strides_elements)
    managed = export.managed = kind.struct()
    code, bits = DL_DTYPES[array.dtype_name]
    managed.dl_tensor = DLTensor(
        array.ptr, DLDevice(DL_CUDA, array.device), ndim, DLDataType(code, bits, 1), export.shape, export.strides, 0
    )
    managed.manager_ctx = id(export)
    managed.deleter = kind.deleter
    if versioned:
        managed.version = DLPackVersion(1, 0)  # flags 0: writable, not a copy
    _incref(export)  # dropped by the deleter
    try:
        return _capsule_new(ctypes.addressof(managed), kind.name, kind.destructor)
    except BaseException:
        kind._delete(ctypes.addressof(managed))
        raise


class DeviceArray:
    """A row-major device array owned by jitgemm (2-D, or N-D as the result of an N-D `a`): the
    result type for inputs whose library jitgemm cannot allocate in. Exposes ``__cuda_array_interface__`` (v3, naming the stream the result
    was computed on) and ``__dlpack__`` (bfloat16 included), so CuPy, PyTorch, JAX, Numba, ...
    adopt it without a copy (``cupy.asarray(r)``, ``torch.from_dlpack(r)``,
    ``jax.numpy.from_dlpack(r)``, ...)."""

    def __init__(self, memory: DeviceMemory | None, shape: tuple, dtype: str, device: int, stream: int):
        self._memory = memory
        self.ptr = memory.ptr if memory is not None else 0
        self.shape = tuple(shape)
        self.strides_elements = contiguous_strides(self.shape)
        self.dtype_name = dtype
        self.device = device
        self.stream = stream

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype_name)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "descr": self.dtype.descr,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            "stream": self.stream,
        }

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this array, safe to use on the consumer's `stream` (None: the
        legacy default stream; -1: no ordering; else a CUstream, 1 and 2 the default streams)."""
        if stream == 0 or not (stream is None or isinstance(stream, int)):
            raise ValueError(
                f"stream: expected None, -1 or a CUDA stream handle, got {stream!r} "
                f"(0 is ambiguous in the DLPack protocol: use 1 for the legacy default stream)"
            )
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(
                f"{self!r} cannot be exported to DLPack device {tuple(dl_device)} "
                f"(it lives on {self.__dlpack_device__()}) without a copy"
            )
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
        return f"jitgemm.DeviceArray(shape={self.shape}, dtype={NUMPY_NAMES[self.dtype_name]}, device={self.device})"
