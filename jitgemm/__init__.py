"""jitgemm: JIT-generated GEMM kernels for Hopper, compiled with NVRTC and cached on disk."""

import os as _os

# In a checkout, heuristics/ and templates/ sit beside jitgemm/ (pyproject maps them into the
# installed package): let the checkout's root serve as a second directory of this package so
# that `import jitgemm` works from the checkout as it does installed.
_here = _os.path.dirname(__file__)
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "heuristics")) and _os.path.isfile(
    _os.path.join(_root, "heuristics", "__init__.py")
):
    __path__.append(_root)

from .api import FallbackCopyWarning, config_for, gemm
from .arrays import DeviceArray
from .config import KernelConfig
from .problem import Problem
from .runtime import CudaError, NoGPUError

__version__ = "0.1.0"
__all__ = [
    "gemm",
    "config_for",
    "KernelConfig",
    "Problem",
    "DeviceArray",
    "FallbackCopyWarning",
    "NoGPUError",
    "CudaError",
    "__version__",
]
