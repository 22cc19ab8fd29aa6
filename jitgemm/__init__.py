"""jitgemm: JIT-generated GEMM kernels for Hopper, compiled with NVRTC and cached on disk."""
from .api import gemm
from .config import KernelConfig
from .problem import Problem

__version__ = "0.1.0"
__all__ = ["gemm", "KernelConfig", "Problem", "__version__"]
