"""Array libraries: allocation, copies and stream scoping in the caller's own array type, so that
results and fallback copies are CuPy arrays, torch tensors or NumPy arrays as the inputs were;
GENERIC does the same through the driver for every other device array (its results are
DeviceArrays, converted with the input's ``__array_namespace__()`` when it has one).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading

import numpy as np
from cuda.bindings import driver

from .. import runtime
from .dlpack import DeviceArray
from .memory import DeviceMemory, copy_2d, copy_nd
from .views import (
    HOST,
    ITEMSIZE,
    View,
    checked_view,
    contiguous_strides,
    dtype_error,
    fold_view,
    kernel_dtype,
    numpy_dtype,
    split_strides,
    strides_as,
)


class ArrayLib:
    """Allocation, copies and stream scoping in one array library."""

    name = "?"
    fast = False  # a lean-path library: `parts` describes an operand for the plans of api.gemm

    def view(self, array, argname: str) -> View:
        raise NotImplementedError

    def _numpy_like_view(self, array, argname: str, ptr: int, device: int, readonly: bool = False) -> View:
        """The View of an array with NumPy's dtype, shape and byte strides (CuPy, NumPy)."""
        itemsize = array.dtype.itemsize
        dtype = kernel_dtype(array.dtype, argname)
        strides = tuple(s // itemsize for s in array.strides)
        view = View(array, self, ptr, array.shape, strides, dtype, itemsize, device, None, readonly)
        return checked_view(view, argname, array.strides)

    def parts(self, array) -> tuple:
        """(key, address) of an operand of this library, for the lean path's plans: the key is
        (type, shape, strides, dtype, device ordinal), the device last; AttributeError or
        TypeError for an object that is not such an array."""
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

    def matched(self, dst: View, src: View) -> tuple:
        """The arrays of `dst` and `src` (one full shape) with one shape: a 2-D one (a buffer
        of jitgemm's) is seen with the other's N-D shape, its rows split, which is always a
        view of the same memory."""
        x, y = dst.array, src.array
        if dst.nd is None and src.nd is not None:
            x = self.split_rows(x, src.full_shape)
        elif src.nd is None and dst.nd is not None:
            y = self.split_rows(y, dst.full_shape)
        return x, y

    def split_rows(self, array, shape: tuple):
        """2-D `array` seen with N-D `shape` (its rows split into shape[:-1]), without a copy."""
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
        import cupy  # optional: imported only when a CuPy array is passed

        self.cp = cupy

    def view(self, array, argname):
        return self._numpy_like_view(array, argname, array.data.ptr, array.data.device_id)

    def parts(self, array):
        data = array.data
        return (array.__class__, array.shape, array.strides, array.dtype, data.device_id), data.ptr

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
        x, y = self.matched(dst, src)
        with self.cp.cuda.Device(dst.device):
            x[...] = y

    def split_rows(self, array, shape):
        return self.cp.lib.stride_tricks.as_strided(array, shape, split_strides(array.strides, shape))

    def scale_(self, dst, src, beta, stream):
        with self.cp.cuda.Device(dst.device):
            self.cp.multiply(src.array, beta, out=dst.array, casting="unsafe")


class TorchLib(ArrayLib):
    name = "torch"
    fast = True

    def __init__(self):
        import torch  # optional: imported only when a torch tensor is passed

        self.torch = torch
        self.dtypes = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
        self.torch_dtypes = {v: k for k, v in self.dtypes.items()}
        self.devices: dict = {}
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.current_stream = raw if raw is not None else (lambda device: torch.cuda.current_stream(device).cuda_stream)

    def _device(self, ordinal):
        dev = self.devices.get(ordinal)
        if dev is None:
            dev = self.devices[ordinal] = self.torch.device("cuda", ordinal)
        return dev

    def view(self, array, argname):
        if array.device.type != "cuda":
            raise ValueError(f"{argname}: expected a CUDA tensor (or a NumPy array), got a tensor on {array.device}")
        dtype = self.dtypes.get(array.dtype)
        if dtype is None:
            raise dtype_error(argname, str(array.dtype).removeprefix("torch."))
        view = View(
            array,
            self,
            array.data_ptr(),
            tuple(array.shape),
            tuple(array.stride()),
            dtype,
            array.element_size(),
            array.get_device(),
        )
        return checked_view(view, argname)

    def parts(self, array):
        return (array.__class__, array.shape, array.stride(), array.dtype, array.get_device()), array.data_ptr()

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
        x, y = self.matched(dst, src)
        x.copy_(y)

    def split_rows(self, array, shape):
        return array.view(shape)

    def scale_(self, dst, src, beta, stream):
        self.torch.mul(src.array, beta, out=dst.array)


class HostLib(ArrayLib):
    """NumPy host arrays: validated like device arrays, computed after a copy to the GPU."""

    name = "numpy"

    def view(self, array, argname):
        return self._numpy_like_view(array, argname, array.ctypes.data, HOST, not array.flags.writeable)

    def empty(self, shape, dtype, device, stream):
        return np.empty(shape, numpy_dtype(dtype))

    def copy_(self, dst, src, stream):
        x, y = self.matched(dst, src)
        x[...] = y

    def split_rows(self, array, shape):
        return np.lib.stride_tricks.as_strided(array, shape, split_strides(array.strides, shape))

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


class GenericLib(ArrayLib):
    """Device arrays of any other library: memory and copies by the driver."""

    name = "cuda"

    def view(self, array, argname):
        view = View(
            array,
            self,
            array.ptr,
            array.shape,
            array.strides_elements,
            array.dtype_name,
            ITEMSIZE[array.dtype_name],
            array.device,
            None,
        )
        return fold_view(view, argname)

    def stream_scope(self, handle, device):
        return contextlib.nullcontext()

    def empty(self, shape, dtype, device, stream):
        nbytes = math.prod(shape) * ITEMSIZE[dtype]
        return DeviceArray(DeviceMemory(nbytes, stream) if nbytes else None, tuple(shape), dtype, device, stream)

    def zeros(self, shape, dtype, device, stream):
        array = self.empty(shape, dtype, device, stream)
        nbytes = math.prod(shape) * ITEMSIZE[dtype]
        if nbytes:
            runtime.check(driver.cuMemsetD8Async(array.ptr, 0, nbytes, driver.CUstream(stream)), "cuMemsetD8Async")
        return array

    def window(self, array, rows, cols, transpose, argname):
        shape, strides = (rows, cols), array.strides_elements
        if transpose:
            shape, strides = (cols, rows), strides[::-1]
        return View(
            array, self, array.ptr, shape, strides, array.dtype_name, ITEMSIZE[array.dtype_name], array.device, None
        )

    def copy_(self, dst, src, stream):
        if dst.strides is not None and src.strides is not None:  # both (folded) 2-D: one copy
            copy_2d(dst.ptr, dst.strides, src.ptr, src.strides, dst.shape, dst.itemsize, stream)
            return
        shape = dst.full_shape if dst.nd is not None else src.full_shape
        copy_nd(dst.ptr, strides_as(dst, shape), src.ptr, strides_as(src, shape), shape, dst.itemsize, stream)

    def zero_(self, dst, stream):
        zeros = self.zeros(dst.shape, dst.dtype, dst.device, stream)
        self.copy_(dst, self.window(zeros, dst.shape[0], dst.shape[1], False, "zeros"), stream)

    def scale_(self, dst, src, beta, stream):
        """Rare (K = 0 with beta not 0 or 1): through the host, synchronising `stream`."""
        shape = src.full_shape
        host = np.empty(shape, numpy_dtype(src.dtype))
        dense = contiguous_strides(shape)
        copy_nd(host.ctypes.data, dense, src.ptr, strides_as(src, shape), shape, src.itemsize, stream, dst_host=True)
        runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")
        scaled = (host.astype(np.float32) * np.float32(beta)).astype(host.dtype)
        copy_nd(dst.ptr, strides_as(dst, shape), scaled.ctypes.data, dense, shape, dst.itemsize, stream, src_host=True)
        runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")

    def result(self, array, like):
        namespace = getattr(like, "__array_namespace__", None)
        return namespace().from_dlpack(array) if namespace is not None else array


GENERIC = GenericLib()
