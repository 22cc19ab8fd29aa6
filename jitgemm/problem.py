"""The problem a GEMM call poses, as one frozen value that everything downstream reads."""

from __future__ import annotations

from dataclasses import dataclass

# Element types the kernels take as inputs, and the output types they can write.
INPUT_DTYPES = ("bf16", "fp16")
OUTPUT_DTYPES = ("bf16", "fp16", "fp32")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# Size limits. The kernels take M, N, K as 32-bit ints and compute tile origins up to one tile
# (at most 512 wide) past the last row or column: each dimension leaves room for that. The
# output's elements bound the tile count, also a 32-bit int (heuristics.rules.shape_problems):
# 2^40 elements, more than any GPU holds, still leave tiles of 128 x 256 far below 2^31.
MAX_DIM = (1 << 31) - 1024
MAX_OUTPUT_ELEMENTS = 1 << 40

# Operand majors: which dimension is contiguous in memory.
#   A is (M, K): "K" = row-major a, "M" = a transposed view of a contiguous (K, M) array.
#   B is (K, N): "N" = row-major b, "K" = a transposed view of a contiguous (N, K) array.
A_MAJORS = ("K", "M")
B_MAJORS = ("K", "N")

# Short layout names used by the CLI: first letter A, second B, "n" = K-major, "t" = MN-major
# (BLAS convention for C = A @ B with column-major thinking is avoided on purpose: these
# letters describe the operands exactly as the user passes them).
LAYOUTS = {"nt": ("K", "N"), "nn": ("K", "K"), "tn": ("M", "K"), "tt": ("M", "N")}


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    dtype: str = "bf16"  # input element type, the same for A and B
    # Output element type: the input dtype (the default, None) or fp32. Resolved when the Problem
    # is made, so Problem(m, n, k, "fp16") == Problem(m, n, k, "fp16", "fp16") (and hashes alike).
    out_dtype: str = None  # type: ignore[assignment]
    a_major: str = "K"
    b_major: str = "N"
    has_c: bool = False  # an addend C (beta * C) is read in the epilogue
    # Whether TMA can address the rows of D (and C): each a whole number of 16-byte units from a
    # 16-byte aligned base. None (the default): as a row-major (M, N) result has them, i.e.
    # when N elements of out_dtype are a multiple of 16 bytes. False: odd N, padding-free or
    # offset views; kernels then store directly (KernelConfig.out_direct) where the arch can.
    aligned_out: bool = None  # type: ignore[assignment]

    def __post_init__(self):
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
                raise ValueError(
                    f"Problem.{name} must be an int in [1, {MAX_DIM}] (the kernels index in 32 bits), got {value!r}"
                )
        if self.m * self.n > MAX_OUTPUT_ELEMENTS:
            raise ValueError(
                f"Problem: M x N = {self.m} x {self.n} output elements exceed {MAX_OUTPUT_ELEMENTS} "
                f"(2^40; the kernels count tiles in 32 bits)"
            )
        if self.dtype not in INPUT_DTYPES:
            raise ValueError(f"Problem.dtype must be one of {INPUT_DTYPES}, got {self.dtype!r}")
        if self.out_dtype is None:
            object.__setattr__(self, "out_dtype", self.dtype)  # frozen: set once, before any hash
        if self.out_dtype not in OUTPUT_DTYPES:
            raise ValueError(f"Problem.out_dtype must be one of {OUTPUT_DTYPES}, got {self.out_dtype!r}")
        if self.out_dtype not in (self.dtype, "fp32"):
            raise ValueError(
                f"Problem.out_dtype must be the input dtype ({self.dtype}) or fp32, got {self.out_dtype!r} "
                f"(the kernels write their inputs' type or fp32)"
            )
        if self.aligned_out is None:
            object.__setattr__(self, "aligned_out", self.n * DTYPE_BYTES[self.out_dtype] % 16 == 0)
        if not isinstance(self.aligned_out, bool):
            raise ValueError(f"Problem.aligned_out must be None or a bool, got {self.aligned_out!r}")
        if self.a_major not in A_MAJORS:
            raise ValueError(f"Problem.a_major must be one of {A_MAJORS}, got {self.a_major!r}")
        if self.b_major not in B_MAJORS:
            raise ValueError(f"Problem.b_major must be one of {B_MAJORS}, got {self.b_major!r}")

    @property
    def layout(self) -> str:
        return {v: k for k, v in LAYOUTS.items()}[(self.a_major, self.b_major)]

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def describe(self) -> str:
        return (
            f"M={self.m} N={self.n} K={self.k} {self.dtype}->{self.out_dtype} "
            f"layout={self.layout} (A {self.a_major}-major, B {self.b_major}-major)"
            f"{'' if self.aligned_out else ', output rows not 16-byte aligned'}"
        )
