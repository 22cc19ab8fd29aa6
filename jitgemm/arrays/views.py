"""Operand views: the uniform View (pointer, shape, strides in elements, dtype, device, producer
stream) jitgemm makes of whatever the caller passed, the dtype, shape and stride checks every
kind of array passes, and the exact test of whether two views share memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..problem import MAX_DIM

if TYPE_CHECKING:
    from .libraries import ArrayLib

# numpy-style dtype names -> kernel dtype names
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
NUMPY_NAMES = {v: k for k, v in DTYPE_NAMES.items()}
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
TMA_ALIGN = 16  # bytes: TMA needs 16-byte aligned base addresses and leading strides
LEGACY_STREAM = 1  # CU_STREAM_LEGACY; also the CAI / DLPack code for the legacy default stream
HOST = -1  # View.device of a host (NumPy) array
UNRESOLVED = -2  # View.device of a raw CUDA-array-interface pointer not yet looked up
MAX_SPAN = 1 << 48  # bytes from an array's first to its last element: more than any device
# holds, and far from wrapping the 64-bit address arithmetic done on them


@dataclass(frozen=True)
class View:
    """A 2-D array as the kernel sees it. Strides are in elements."""

    array: object
    lib: ArrayLib
    ptr: int
    shape: tuple
    strides: tuple
    dtype: str
    itemsize: int
    device: int  # CUDA ordinal, HOST or UNRESOLVED
    stream: int | None = None  # producer stream to wait for (CUDA array interface), or None
    readonly: bool = False
    keepalive: object = None  # what must outlive the view (a DLPack export)

    @property
    def is_host(self) -> bool:
        return self.device == HOST

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def span(self) -> int:
        """Bytes from the first element to one past the last (positive strides; 0 when empty)."""
        if self.size == 0:
            return 0
        return sum((n - 1) * s for n, s in zip(self.shape, self.strides)) * self.itemsize + self.itemsize

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
        return (
            self.ptr % TMA_ALIGN == 0
            and lead % TMA_ALIGN == 0
            and lead < (1 << 40)
            and (self.shape[major] * self.itemsize) % TMA_ALIGN == 0
        )

    def leading_stride_bytes(self, major: int) -> int:
        """Bytes between consecutive rows along the non-contiguous dimension."""
        other = 1 - major
        if self.shape[other] == 1:  # a single row: its stride is never used, pick a legal one
            return -(-self.shape[major] * self.itemsize // TMA_ALIGN) * TMA_ALIGN
        return self.strides[other] * self.itemsize

    def same_memory(self, other: View) -> bool:
        """The same elements in the same layout (out=c for in-place accumulation)."""
        return (
            self.ptr == other.ptr
            and self.shape == other.shape
            and self.itemsize == other.itemsize
            and all(s == o or n == 1 for s, o, n in zip(self.strides, other.strides, self.shape))
        )


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
    return np.asarray(
        _ArrayInterface(
            {
                "shape": (v.shape[0], v.shape[1], isz),
                "typestr": "|u1",
                "data": (v.ptr, True),
                "strides": (*strides, 1),
                "version": 3,
            }
        )
    )


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of kernel dtype `dtype`."""
    if dtype == "bf16":
        import ml_dtypes  # imported here: only bfloat16 needs it, and its import takes about a second

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(NUMPY_NAMES[dtype])


def dtype_error(argname: str, got) -> TypeError:
    return TypeError(f"{argname}: unsupported dtype {got}; expected bfloat16 or float16 (float32 for out and c)")


def kernel_dtype(dtype: np.dtype, argname: str) -> str:
    """The kernel dtype of a NumPy / CuPy dtype; the kernels read native (little-endian) bytes."""
    found = DTYPE_NAMES.get(dtype.name)
    if found is None:
        raise dtype_error(argname, dtype.name)
    if not dtype.isnative:
        raise TypeError(
            f"{argname}: {dtype.name} in non-native byte order ({dtype.str!r}) is not "
            f"supported; convert it first, e.g. x.astype(x.dtype.newbyteorder('='))"
        )
    return found


def checked_view(view: View, argname: str, byte_strides: tuple | None = None) -> View:
    """Shape and stride checks shared by every kind of array."""
    shape = view.shape
    if len(shape) != 2:
        raise ValueError(f"{argname}: expected a 2-D array, got {len(shape)}-D with shape {tuple(shape)}")
    if byte_strides is not None and any(s % view.itemsize for s in byte_strides):
        raise ValueError(
            f"{argname}: strides must be multiples of the element size "
            f"({view.itemsize} bytes), got {tuple(byte_strides)} bytes"
        )
    for i, n in enumerate(shape):
        if n > MAX_DIM:
            raise ValueError(
                f"{argname}: dimension {i} has {n} elements, more than the {MAX_DIM} the "
                f"kernels can index (32-bit ints)"
            )
    if 0 in shape:
        return view
    if any(s <= 0 and n > 1 for s, n in zip(view.strides, shape)):
        raise ValueError(
            f"{argname}: strides must be positive, got {tuple(view.strides)} (in elements) "
            f"for shape {tuple(shape)}; broadcast (zero-stride) and reversed "
            f"(negative-stride) views are not supported: pass a copy"
        )
    span = sum((n - 1) * s for s, n in zip(view.strides, shape)) * view.itemsize + view.itemsize
    if span > MAX_SPAN or view.ptr + span > 1 << 64:
        raise ValueError(
            f"{argname}: shape {tuple(shape)} with strides {tuple(view.strides)} (in elements) "
            f"from address {view.ptr:#x} spans {span} bytes, past what any device memory "
            f"holds ({MAX_SPAN} bytes) or the 64-bit address space"
        )
    return view
