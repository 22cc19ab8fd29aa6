"""Describing operands: the View of any array gemm takes, with errors that name the argument.

CuPy arrays, PyTorch CUDA tensors and NumPy arrays are read by their library (libraries.py);
any other object through ``__cuda_array_interface__`` (v3; its ``stream`` is honoured) or
``__dlpack__`` (JAX, Numba, ...; through cuda.core's StridedMemoryView), as a GENERIC view.

Describing an operand (:func:`describe`) makes no CUDA call, except the DLPack hand-off, which
lets the producer order its work before the consumer stream; the device of a raw
``__cuda_array_interface__`` pointer is looked up separately (:func:`resolve_device`), after every
check that needs no device.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .libraries import GENERIC, lib_of
from .memory import pointer_device
from .views import (
    ITEMSIZE,
    LEGACY_STREAM,
    UNRESOLVED,
    View,
    checked_view,
    contiguous_strides,
    dtype_error,
    kernel_dtype,
    ndim_error,
)


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
        raise ValueError(
            f"{argname}: __cuda_array_interface__ 'stream' must not be 0 (the spec reserves it); "
            f"use 1 for the legacy default stream"
        )
    if not 0 < stream < 1 << 64:
        raise ValueError(
            f"{argname}: __cuda_array_interface__ 'stream' must be a CUstream handle in [1, 2^64), got {stream!r}"
        )
    return int(stream)


def _cai_view(obj, argname: str) -> View:
    try:
        cai = obj.__cuda_array_interface__
    except Exception as exc:  # e.g. torch raises for bfloat16
        raise TypeError(f"{argname}: its __cuda_array_interface__ could not be read: {exc}") from exc
    if not isinstance(cai, dict) or not {"shape", "typestr", "data"} <= cai.keys():
        raise TypeError(
            f"{argname}: expected __cuda_array_interface__ to be a dict with 'shape', 'typestr' and 'data', got {cai!r}"
        )
    version = cai.get("version", 0)
    if not _is_int(version) or version not in (0, 1, 2, 3):
        raise ValueError(
            f"{argname}: __cuda_array_interface__ version {version!r} is not supported; expected version 3 (or 0-2)"
        )
    if cai.get("mask") is not None:
        raise ValueError(f"{argname}: masked arrays (__cuda_array_interface__ 'mask') are not supported")
    shape = _ints(cai["shape"], argname, "shape")
    if any(n < 0 for n in shape):
        raise ValueError(f"{argname}: __cuda_array_interface__ 'shape' must not be negative, got {shape}")
    typestr = cai["typestr"]
    if not isinstance(typestr, str):
        raise dtype_error(argname, f"{typestr!r} (__cuda_array_interface__ typestr)")
    if typestr[:1] == ">":  # jitgemm runs on little-endian hosts only
        raise TypeError(
            f"{argname}: non-native (big-endian) byte order is not supported, got "
            f"__cuda_array_interface__ typestr {typestr!r}"
        )
    if typestr[1:] in ("f2", "f4") and typestr[0] in "<|=":
        dtype = {"f2": "fp16", "f4": "fp32"}[typestr[1:]]
    elif typestr[1:] == "V2" and _bfloat16_named(obj):
        dtype = "bf16"  # bfloat16 has no typestr of its own; the array's dtype names it
    else:
        raise dtype_error(argname, f"{typestr!r} (__cuda_array_interface__ typestr)")
    itemsize = ITEMSIZE[dtype]
    if len(shape) < 2:
        raise ndim_error(argname, shape)
    data = cai["data"]
    if not (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and _is_int(data[0])
        and isinstance(data[1], (bool, np.bool_, int))
    ):
        raise TypeError(
            f"{argname}: __cuda_array_interface__ 'data' must be (pointer: int, read-only: bool), got {data!r}"
        )
    ptr, readonly = int(data[0]), bool(data[1])
    if not 0 <= ptr < 1 << 64:
        raise ValueError(f"{argname}: __cuda_array_interface__ pointer {ptr:#x} is not a 64-bit address")
    byte_strides = cai.get("strides")
    if byte_strides is None:
        byte_strides = tuple(s * itemsize for s in contiguous_strides(shape))
    byte_strides = _ints(byte_strides, argname, "strides")
    if len(byte_strides) != len(shape):
        raise ValueError(
            f"{argname}: __cuda_array_interface__ 'strides' {byte_strides} must have one entry "
            f"per dimension of shape {shape}"
        )
    stream = _cai_stream(cai.get("stream"), argname)
    view = View(
        obj,
        GENERIC,
        ptr,
        shape,
        tuple(s // itemsize for s in byte_strides),
        dtype,
        itemsize,
        UNRESOLVED,
        stream,
        readonly,
    )
    return checked_view(view, argname, byte_strides)


def _bfloat16_named(obj) -> bool:
    try:
        return str(getattr(obj, "dtype", "")).removeprefix("torch.") == "bfloat16"
    except Exception:
        return False


_DLPACK_DEVICE_TYPES = {2: "CUDA", 13: "CUDA managed"}  # kDLCUDA, kDLCUDAManaged


def _dlpack_view(obj, argname: str, stream: int) -> View:
    # imported here: only DLPack-only inputs need it, and its import takes about a second
    from cuda.core.utils import StridedMemoryView

    try:
        device_type, _ = obj.__dlpack_device__()
    except Exception as exc:
        raise TypeError(f"{argname}: its __dlpack_device__() did not give (device type, id): {exc}") from exc
    if device_type not in _DLPACK_DEVICE_TYPES:
        raise ValueError(
            f"{argname}: expected a CUDA device array or a NumPy array, got a "
            f"{type(obj).__name__} on DLPack device type {device_type} (not CUDA memory)"
        )
    try:
        smv = StridedMemoryView.from_dlpack(obj, stream_ptr=stream)
    except NotImplementedError as exc:  # bfloat16 without ml_dtypes
        raise TypeError(f"{argname}: {exc} (install ml_dtypes for bfloat16 DLPack arrays)") from exc
    except Exception as exc:  # whatever the producer's __dlpack__ raises or returns
        raise TypeError(f"{argname}: its DLPack export failed: {type(exc).__name__}: {exc}") from exc
    dtype = kernel_dtype(np.dtype(smv.dtype), argname)
    shape = tuple(smv.shape)
    if len(shape) < 2:
        raise ndim_error(argname, shape)
    strides = tuple(smv.strides) if smv.strides is not None else contiguous_strides(shape)
    view = View(
        obj,
        GENERIC,
        smv.ptr,
        shape,
        strides,
        dtype,
        ITEMSIZE[dtype],
        smv.device_id,
        None,
        bool(smv.readonly),
        keepalive=smv,
    )
    return checked_view(view, argname)


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
    raise TypeError(
        f"{argname}: expected a CuPy array, a PyTorch CUDA tensor, a NumPy array or an "
        f"object with __cuda_array_interface__ or __dlpack__, got {type(obj).__name__}"
    )


def needs_consumer_stream(obj) -> bool:
    """Whether describing `obj` hands a stream to its producer (DLPack-only objects)."""
    return lib_of(obj) is None and not _has(obj, "__cuda_array_interface__") and _has(obj, "__dlpack__")


def resolve_device(view: View, argname: str) -> View:
    """Look up the device of a raw CUDA-array-interface pointer (other views pass through)."""
    if view.device != UNRESOLVED or view.size == 0:  # an empty array has no memory to ask about
        return view
    ordinal = pointer_device(view.ptr)
    if ordinal < 0:
        raise ValueError(f"{argname}: __cuda_array_interface__ pointer {view.ptr:#x} is not CUDA device memory")
    return replace(view, device=ordinal)
