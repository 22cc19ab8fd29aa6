"""Decode against weights TMA cannot read: a of M <= MAX_ROWS rows times a b whose rows have unit
stride but are not whole 16-byte units (odd N, a misaligned view), by a kernel that reads b in
place (templates/common/decode_rows.cuh) instead of staging it and running the GEMM.

Why: at these M the GEMM reads b once, so staging it (read and written once more) triples the
traffic. On an H100 (2026-12-02, CUDA graphs, 4 weights rotated): 1x50257x4096 161 us against
445 staged (cuBLAS 243), 2x32001x4096 118 against 288 (cuBLAS 162); 3 and 4 rows still run in
about half the staged time but at 0.77-0.97x cuBLAS, whose kernels for them are faster than
for one row (BENCHMARKS.md, session 9). Five rows and more keep the staged GEMM.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

from . import runtime
from .arrays import TMA_ALIGN, View
from .fixed_kernels import FixedKernel
from .launch import REGIONS, Launch
from .problem import DTYPE_BYTES, Problem

MAX_ROWS = 4  # the kernel's MAX_M
THREADS = 256  # the kernel's __launch_bounds__
WARPS_PER_BLOCK = THREADS // 32
STRIP = 31 * 8  # columns per warp (the kernel's STRIP)
ROWS_IN_FLIGHT = 8  # the kernel's: a split's rows are a multiple of it
BLOCKS_PER_SM = 2  # the kernel's __launch_bounds__(THREADS, 2)
WAVE_FILL = 0.95  # see `split_for`
# The fewest rows of b a split reads: the partial sums (M x STRIP fp32 a group, written and read
# back through L2) stay small beside the bytes streamed.
MIN_SPLIT_ROWS = 16

KERNEL = FixedKernel("jitgemm_decode_rows", ("realign.cuh", "decode_rows.cuh"), THREADS, "the decode kernel")


def reads_in_place(va: View, vb: View, b_major: int, b_copy: bool) -> bool:
    """Whether the decode kernel runs `va @ vb`: M <= MAX_ROWS rows of a (any strides) and a b
    TMA cannot read (`b_copy`) whose rows along N have unit stride; both element-aligned."""
    m = va.shape[0]
    return (
        0 < m <= MAX_ROWS
        and b_copy
        and b_major == 1
        and va.strides is not None
        and vb.strides is not None
        and vb.strides[1] == 1
        and va.ptr % va.itemsize == 0
        and vb.ptr % vb.itemsize == 0
    )


def explain_note(problem: Problem) -> str | None:
    """What `jitgemm explain` says of `problem` where a contiguous row-major b of its N would
    run the decode kernel (`reads_in_place`), not the GEMM explained."""
    if problem.m > MAX_ROWS or problem.b_major != "N" or problem.n * DTYPE_BYTES[problem.dtype] % TMA_ALIGN == 0:
        return None
    return (
        f"gemm() runs the decode kernel (jitgemm/decode.py), not this GEMM, for M <= {MAX_ROWS} against a b "
        f"whose rows TMA cannot read, as a row-major b of N = {problem.n} (unless a config is forced)"
    )


def writes_in_place(view: View | None) -> bool:
    """Whether the kernel writes (or reads, for c) `view` where it is: any strides of a 2-D
    view, element-aligned (None: the result jitgemm allocates)."""
    return view is None or (view.strides is not None and view.ptr % view.itemsize == 0)


def kernel_rows(m: int) -> int:
    """The rows of a the kernel's instance for M rows sums (3 rows run the 4-row kernel)."""
    return m if m <= 2 else MAX_ROWS


class Split(NamedTuple):
    """The grid: N in strips of STRIP columns, K in splits of whole ROWS_IN_FLIGHT rows, a block
    for each strip and group of WARPS_PER_BLOCK consecutive splits (a warp each)."""

    strips: int
    groups: int
    rows: int  # per split (the last splits may have fewer, or none)
    blocks: int


def split_for(n: int, k: int, num_sms: int) -> Split:
    """The fewest groups a strip whose blocks fill their waves (BLOCKS_PER_SM blocks a SM) to
    WAVE_FILL, else the fullest waves; at most as many groups as K has splits of MIN_SPLIT_ROWS
    rows. Every block streams as many rows, so a wave's empty slots are lost time: 203 blocks
    (1x50257x4096) ran at 1958 GB/s on the H200's 264 slots, where the scratch kernel's single
    full wave reached 2541."""
    strips = -(-n // STRIP)
    slots = num_sms * BLOCKS_PER_SM

    def rows_of(groups: int) -> int:  # a split's rows: whole ROWS_IN_FLIGHT
        return -(-k // (groups * WARPS_PER_BLOCK * ROWS_IN_FLIGHT)) * ROWS_IN_FLIGHT

    def fill(groups: int) -> float:
        blocks = strips * groups
        return blocks / (-(-blocks // slots) * slots)

    most = -(-k // (MIN_SPLIT_ROWS * WARPS_PER_BLOCK))
    # the group counts that leave no group without rows, and whose last split ends where the
    # kernel's 32-bit K indices reach (the splits round up; K may be near 2^31)
    counts = sorted(
        {
            g
            for g in {-(-k // (rows_of(g) * WARPS_PER_BLOCK)) for g in range(1, most + 1)}
            if g * WARPS_PER_BLOCK * rows_of(g) < 1 << 31
        }
    )
    groups = next((g for g in counts if fill(g) >= WAVE_FILL), None)
    if groups is None:
        groups = max(counts, key=lambda g: (fill(g), -g))
    return Split(strips, groups, rows_of(groups), strips * groups)


class _DecodeArgs(ctypes.Structure):
    """The kernel's DecodeArgs."""

    _fields_ = [
        ("a", ctypes.c_uint64),
        ("a_row", ctypes.c_longlong),
        ("a_col", ctypes.c_longlong),
        ("b", ctypes.c_uint64),
        ("b_row", ctypes.c_longlong),
        ("out", ctypes.c_uint64),
        ("out_row", ctypes.c_longlong),
        ("out_col", ctypes.c_longlong),
        ("c", ctypes.c_uint64),
        ("c_row", ctypes.c_longlong),
        ("c_col", ctypes.c_longlong),
        ("partials", ctypes.c_uint64),
        ("counters", ctypes.c_uint64),
        ("alpha", ctypes.c_float),
        ("beta", ctypes.c_float),
        ("m", ctypes.c_int),
        ("n", ctypes.c_int),
        ("k", ctypes.c_int),
        ("strips", ctypes.c_int),
        ("groups", ctypes.c_int),
        ("rows_per_split", ctypes.c_int),
        ("fp16", ctypes.c_int),
        ("out_fp32", ctypes.c_int),
        ("has_c", ctypes.c_int),
    ]


def _strides(view: View | None) -> tuple:
    """A 2-D view's element strides; (0, 0) for a missing one (or a single row or column, whose
    other stride is never used)."""
    return (0, 0) if view is None else view.strides


class DecodeLaunch(Launch):
    """The decode of one call site, parameters packed once (`Launch`): a, b, the result and c
    as described by their views (their addresses patched by `launch_at`), the grid of
    `split_for`, and the workspace's partials and counters regions."""

    __slots__ = ("kernel", "args", "params", "address", "config", "workspace_sizes", "split")

    def __init__(
        self,
        kernel: runtime.LoadedKernel,
        va: View,
        vb: View,
        vd: View,
        vc: View | None,
        alpha: float,
        beta: float,
        num_sms: int,
        device: int,
        stream: int,
    ):
        super().__init__(device, stream)
        (m, k), n = va.shape, vb.shape[1]
        self.kernel, self.split = kernel, split_for(n, k, num_sms)
        strips, groups, rows, blocks = self.split
        args = self.args = _DecodeArgs()
        args.a_row, args.a_col = va.strides
        args.b_row = vb.strides[0]
        args.out_row, args.out_col = vd.strides
        args.c_row, args.c_col = _strides(vc)
        args.alpha, args.beta = alpha, beta
        args.m, args.n, args.k = m, n, k
        args.strips, args.groups, args.rows_per_split = strips, groups, rows
        args.fp16, args.out_fp32, args.has_c = va.dtype == "fp16", vd.dtype == "fp32", vc is not None
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        self.address = ctypes.addressof(self.params)
        self.config = runtime.launch_config(kernel, blocks, stream)
        partials = strips * groups * kernel_rows(m) * STRIP * 4
        self.workspace_sizes = (partials, strips * 4) + (0,) * (len(REGIONS) - 2)
        self.repoint(va.ptr, vb.ptr, vd.ptr, 0 if vc is None else vc.ptr)

    def repoint(self, a: int, b: int, d: int, c: int) -> None:
        args = self.args
        args.a, args.b, args.out, args.c = a, b, d, c

    def _dispatch(self) -> None:
        self.with_workspace(self.workspace_sizes, self._launch_with)

    def _launch_with(self, regions: tuple) -> None:
        args = self.args
        args.partials, args.counters = regions[:2]
        err = runtime.driver.cuLaunchKernelEx(self.config, self.kernel.function, self.address, 0)[0]
        if err != runtime.driver.CUresult.CUDA_SUCCESS:
            runtime.check((err,), f"cuLaunchKernelEx({self.kernel.name})")
