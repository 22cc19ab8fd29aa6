"""Operand views: the uniform View (pointer, shape, strides in elements, dtype, device, producer
stream) jitgemm makes of whatever the caller passed, the dtype, shape and stride checks every
kind of array passes, the folding of an N-D array's leading dimensions into rows, and the exact
test of whether two views share memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
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
    """A 2-D array as the kernel sees it. Strides are in elements.

    An N-D array (..., X) is seen as (rows, X), its leading dimensions folded into rows: `nd`
    holds its own shape and strides, `shape` the folded 2-D one, and `strides` the 2-D strides
    when the leading dimensions step through memory with one stride (see `fold_rows`), else
    None: such an array is copied (or, as an output, written through a copy)."""

    array: object
    lib: ArrayLib
    ptr: int
    shape: tuple
    strides: tuple | None  # None: an N-D array whose leading dimensions do not fold
    dtype: str
    itemsize: int
    device: int  # CUDA ordinal, HOST or UNRESOLVED
    stream: int | None = None  # producer stream to wait for (CUDA array interface), or None
    readonly: bool = False
    keepalive: object = None  # what must outlive the view (a DLPack export)
    nd: tuple | None = None  # (shape, strides) of an array of more than 2 dimensions

    @property
    def is_host(self) -> bool:
        return self.device == HOST

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def full_shape(self) -> tuple:
        """The array's own shape (N-D arrays: before folding)."""
        return tuple(self.nd[0]) if self.nd is not None else tuple(self.shape)

    def geometry(self) -> tuple:
        """(shape, strides) of the array itself (N-D arrays: before folding)."""
        return self.nd if self.nd is not None else (self.shape, self.strides)

    def span(self) -> int:
        """Bytes from the first element to one past the last (positive strides; 0 when empty)."""
        if self.size == 0:
            return 0
        shape, strides = self.geometry()
        return sum((n - 1) * s for n, s in zip(shape, strides)) * self.itemsize + self.itemsize

    def major(self) -> int | None:
        """Index of the unit-stride dimension (1 = row-major), or None if neither is unit-stride
        (or the leading dimensions of an N-D array do not fold)."""
        if self.strides is None:
            return None
        rows, cols = self.shape
        if self.strides[1] == 1 or cols == 1:
            return 1
        if self.strides[0] == 1 or rows == 1:
            return 0
        return None

    def tma_readable(self, major: int) -> bool:
        """Whether TMA can load this view with dimension `major` innermost, in place: a 16-byte
        aligned base and leading stride. The rows may end mid-unit (a K or N that is not a
        multiple of 8 in rows padded to whole units, a slice of a wider array): a box starts on
        a 16-byte unit whatever the extent, and the elements past the extent load as zeros
        (measured on an H100, BENCHMARKS.md, session 25: NaN past the row end stays out of
        the result). What TMA cannot load is a box starting mid-unit, so a leading stride that is
        not a whole number of units (each row starts at its own offset) is copied."""
        if self.strides is None:
            return False
        lead = self.leading_stride_bytes(major)
        return self.ptr % TMA_ALIGN == 0 and lead % TMA_ALIGN == 0 and lead < (1 << 40)

    def tma_ready(self, major: int) -> bool:
        """Whether TMA can store this view with dimension `major` innermost, without a copy:
        `tma_readable`, and rows of whole 16-byte units: measured on the H200, TMA stores past
        a row end up to the next 16-byte boundary, so a ragged row end would write outside the
        array."""
        return self.tma_readable(major) and (self.shape[major] * self.itemsize) % TMA_ALIGN == 0

    def leading_stride_bytes(self, major: int) -> int:
        """Bytes between consecutive rows along the non-contiguous dimension."""
        other = 1 - major
        if self.shape[other] == 1:  # a single row: its stride is never used, pick a legal one
            return -(-self.shape[major] * self.itemsize // TMA_ALIGN) * TMA_ALIGN
        assert self.strides is not None  # callers ask only of views with a unit-stride dimension
        return self.strides[other] * self.itemsize

    def same_memory(self, other: View) -> bool:
        """The same elements in the same layout (out=c for in-place accumulation)."""
        (shape, strides), (other_shape, other_strides) = self.geometry(), other.geometry()
        return (
            self.ptr == other.ptr
            and tuple(shape) == tuple(other_shape)
            and self.itemsize == other.itemsize
            and all(s == o or n == 1 for s, o, n in zip(strides, other_strides, shape))
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
    shape, strides = v.geometry()
    # the stride of a dimension of one element is never stepped (and may be anything)
    strides = tuple(s * isz if n > 1 else 0 for s, n in zip(strides, shape))
    return np.asarray(
        _ArrayInterface(
            {
                "shape": (*shape, isz),
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


def contiguous_strides(shape) -> tuple:
    """Row-major (C-order) strides of `shape`, in elements."""
    strides, step = [], 1
    for n in reversed(tuple(shape)):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def fold_rows(shape, strides) -> int | None:
    """The one stride with which the leading dimensions (all but the last) of an array step
    through its rows in order, or None when there is none.

    They fold when each dimension's stride is the next inner one's stride times that one's
    size, dimensions of size 1 left out (their stride is never stepped): a row-major
    (batch, seq, hidden) array folds with stride hidden, a (batch, seq, hidden) view of a
    contiguous (hidden, batch, seq) array with stride 1; a permuted view like x.transpose(0, 1)
    of a contiguous (seq, batch, hidden) array does not."""
    row = step = None
    for n, s in zip(reversed(shape[:-1]), reversed(strides[:-1])):
        if n == 1:
            continue
        if row is None:
            row = s
        elif s != step:
            return None
        step = n * s
    return row if row is not None else strides[-2]


def strides_as(view: View, shape: tuple) -> tuple:
    """The strides (elements) of `view`'s elements seen with shape `shape`, its own full shape:
    an N-D view's own strides, or a 2-D view's rows split into the leading dimensions."""
    if view.nd is not None:
        return tuple(view.nd[1])
    assert view.strides is not None
    return split_strides(view.strides, shape)


def split_strides(strides: tuple, shape: tuple) -> tuple:
    """The strides of a 2-D array's elements, (row, column) `strides`, with its rows split into
    the leading dimensions of `shape` (in the unit of `strides`)."""
    row, col = strides
    lead: list = []
    for n in reversed(shape[:-1]):
        lead.append(row)
        row *= n
    return (*reversed(lead), col)


def fold_view(view: View, argname: str) -> View:
    """`view` of an N-D array as (rows, last dimension); a 2-D view unchanged."""
    shape, strides = tuple(view.shape), tuple(view.strides or ())
    if len(shape) == 2:
        return view
    rows = math.prod(shape[:-1])
    if rows > MAX_DIM:
        raise ValueError(
            f"{argname}: its leading dimensions {shape[:-1]} hold {rows} rows, more than the {MAX_DIM} "
            f"the kernels can index (32-bit ints)"
        )
    if rows == 0 or shape[-1] == 0:  # no elements: any strides describe it
        return replace(view, shape=(rows, shape[-1]), strides=(max(shape[-1], 1), 1), nd=(shape, strides))
    row = fold_rows(shape, strides)
    return replace(
        view, shape=(rows, shape[-1]), strides=None if row is None else (row, strides[-1]), nd=(shape, strides)
    )


def ndim_error(argname: str, shape) -> ValueError:
    return ValueError(
        f"{argname}: expected a 2-D array (a, out and c may also be N-D: (..., K), (..., N)), "
        f"got {len(shape)}-D with shape {tuple(shape)}"
    )


def checked_view(view: View, argname: str, byte_strides: tuple | None = None) -> View:
    """Shape and stride checks shared by every kind of array; an N-D array (more than 2
    dimensions) comes back folded (see View), and the caller decides whether it may be N-D."""
    shape = view.shape
    if len(shape) < 2:
        raise ndim_error(argname, shape)
    assert view.strides is not None
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
        return fold_view(view, argname)
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
    return fold_view(view, argname)
