"""jitgemm: JIT-generated GEMM kernels for Hopper, compiled with NVRTC and cached on disk."""
from .api import FallbackCopyWarning, config_for, gemm
from .config import KernelConfig
from .operands import DeviceArray
from .problem import Problem

__version__ = "0.1.0"
__all__ = ["gemm", "config_for", "KernelConfig", "Problem", "DeviceArray", "FallbackCopyWarning", "__version__"]
