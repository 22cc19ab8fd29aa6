"""Array operands: a uniform view (pointer, shape, strides, dtype, device) of the caller's arrays,
and the array library used to allocate results and fallback copies in the caller's own type."""
from __future__ import annotations

from dataclasses import dataclass

# numpy-style dtype names -> kernel dtype names
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
TMA_ALIGN = 16  # bytes: TMA needs 16-byte aligned base addresses and leading strides


@dataclass(frozen=True)
class View:
    """A 2-D device array as the kernel sees it. Strides are in elements."""
    array: object
    lib: "ArrayLib"
    ptr: int
    shape: tuple
    strides: tuple
    dtype: str
    itemsize: int
    device: int

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


class ArrayLib:
    """Allocation and copies in one array library (CuPy or PyTorch)."""
    name = "?"

    def empty(self, shape, dtype: str, device: int):
        raise NotImplementedError

    def zeros(self, shape, dtype: str, device: int):
        raise NotImplementedError

    def current_stream(self, device: int) -> int:
        raise NotImplementedError

    def view(self, array, argname: str) -> View:
        raise NotImplementedError

    def copy_(self, dst, src):
        raise NotImplementedError

    def slice2d(self, array, rows: int, cols: int):
        return array[:rows, :cols]

    def transpose(self, array):
        return array.T


class CupyLib(ArrayLib):
    name = "cupy"

    def __init__(self):
        import cupy
        self.cp = cupy

    def _dtype(self, dtype: str):
        if dtype == "bf16":
            import ml_dtypes
            return ml_dtypes.bfloat16
        return {"fp16": self.cp.float16, "fp32": self.cp.float32}[dtype]

    def empty(self, shape, dtype, device):
        with self.cp.cuda.Device(device):
            return self.cp.empty(shape, dtype=self._dtype(dtype))

    def zeros(self, shape, dtype, device):
        with self.cp.cuda.Device(device):
            return self.cp.zeros(shape, dtype=self._dtype(dtype))

    def current_stream(self, device):
        with self.cp.cuda.Device(device):
            return self.cp.cuda.get_current_stream().ptr

    def view(self, array, argname):
        dtype = _dtype_name(array.dtype, argname)
        itemsize = array.dtype.itemsize
        strides = tuple(s // itemsize for s in array.strides)
        _check_strides(array.strides, itemsize, argname)
        return View(array, self, array.data.ptr, tuple(array.shape), strides, dtype, itemsize,
                    array.device.id)

    def copy_(self, dst, src):
        with self.cp.cuda.Device(dst.device.id):
            dst[...] = src


class TorchLib(ArrayLib):
    name = "torch"

    def __init__(self):
        import torch
        self.torch = torch

    def _dtype(self, dtype):
        t = self.torch
        return {"bf16": t.bfloat16, "fp16": t.float16, "fp32": t.float32}[dtype]

    def empty(self, shape, dtype, device):
        return self.torch.empty(shape, dtype=self._dtype(dtype), device=f"cuda:{device}")

    def zeros(self, shape, dtype, device):
        return self.torch.zeros(shape, dtype=self._dtype(dtype), device=f"cuda:{device}")

    def current_stream(self, device):
        return self.torch.cuda.current_stream(device).cuda_stream

    def view(self, array, argname):
        if array.device.type != "cuda":
            raise ValueError(f"{argname}: expected a CUDA tensor, got a tensor on {array.device}")
        dtype = _dtype_name(str(array.dtype).removeprefix("torch."), argname)
        strides = tuple(array.stride())
        _check_strides(strides, 1, argname)
        return View(array, self, array.data_ptr(), tuple(array.shape), strides, dtype,
                    array.element_size(), array.device.index)

    def copy_(self, dst, src):
        dst.copy_(src)


def _dtype_name(dtype, argname: str) -> str:
    name = getattr(dtype, "name", str(dtype))
    if name not in DTYPE_NAMES:
        raise TypeError(f"{argname}: unsupported dtype {name}; expected bfloat16 or float16 "
                        f"(float32 only for out)")
    return DTYPE_NAMES[name]


def _check_strides(strides, unit: int, argname: str) -> None:
    if any(s <= 0 for s in strides) or any(s % unit for s in strides):
        raise ValueError(f"{argname}: strides must be positive multiples of the element size, "
                         f"got {tuple(strides)} (broadcast or reversed views are not supported)")


_LIBS: dict = {}


def lib_of(array, argname: str) -> ArrayLib:
    """The array library that owns `array`, or TypeError naming the argument."""
    module = type(array).__module__.split(".")[0]
    if module in ("cupy", "torch"):
        lib = _LIBS.get(module)
        if lib is None:
            lib = _LIBS[module] = CupyLib() if module == "cupy" else TorchLib()
        return lib
    raise TypeError(f"{argname}: expected a CuPy array or a PyTorch CUDA tensor, got {type(array).__name__}")


def as_view(array, argname: str) -> View:
    view = lib_of(array, argname).view(array, argname)
    if len(view.shape) != 2:
        raise ValueError(f"{argname}: expected a 2-D array, got {len(view.shape)}-D with shape {view.shape}")
    return view
