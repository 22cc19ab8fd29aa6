"""Array operands: a uniform view (pointer, shape, strides, dtype, device, producer stream) of
whatever the caller passed, and the array library that allocates results and fallback copies in
the caller's own type.

Four families of arrays:
  * CuPy arrays and PyTorch CUDA tensors: read directly (the fast path), results of their type;
  * any other object with ``__cuda_array_interface__`` (v3; its ``stream`` is honoured) or
    ``__dlpack__`` (JAX, Numba, ...): read in readers.py; results are converted with the
    array's ``__array_namespace__()`` when it has one, else returned as a :class:`DeviceArray`
    (which exports DLPack itself, bfloat16 included: dlpack.py);
  * NumPy host arrays: copied to the GPU, computed there, returned as NumPy.

Modules, each importing only those above it: views (View, dtypes, checks), memory (driver
memory and copies), dlpack (DeviceArray and its export), libraries (ArrayLib and one adapter
per library), readers (describe: the View of any operand).
"""

from .dlpack import DeviceArray
from .libraries import GENERIC, lib_of
from .memory import DeviceMemory, stream_wait
from .readers import describe, needs_consumer_stream, resolve_device
from .views import HOST, LEGACY_STREAM, NUMPY_NAMES, TMA_ALIGN, UNRESOLVED, View, numpy_dtype, overlaps

__all__ = [
    "DeviceArray",
    "DeviceMemory",
    "GENERIC",
    "HOST",
    "LEGACY_STREAM",
    "NUMPY_NAMES",
    "TMA_ALIGN",
    "UNRESOLVED",
    "View",
    "describe",
    "lib_of",
    "needs_consumer_stream",
    "numpy_dtype",
    "overlaps",
    "resolve_device",
    "stream_wait",
]
