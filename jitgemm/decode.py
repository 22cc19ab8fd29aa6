"""Decode against weights TMA cannot read: a of a few rows times a b whose rows (or columns)
have unit stride but start off the 16-byte grid (a leading stride that is not whole 16-byte
units, a misaligned base; rows that merely end mid-unit in padded rows TMA reads itself), by a
kernel that reads b in place instead of staging it and running the GEMM. Two kernels, one per
b layout (`Decoder`):

- ROWS (templates/common/decode_rows.cuh): a row-major b (odd N, a misaligned view), M <= 4,
  fp32 FMAs on the CUDA cores;
- COLS (templates/common/decode_cols.cuh): a K-major b (b = W.t() as nn.Linear holds W; K not a
  multiple of 8, a misaligned view), M <= 16, m16n8k16 tensor-core products.

Why: at these M the GEMM reads b once, so staging it (read and written once more) triples the
traffic. On an H100 (2026-12-02, CUDA graphs, 4 weights rotated): 1x50257x4096 161 us against
445 staged (cuBLAS 243), 2x32001x4096 118 against 288 (cuBLAS 162); 3 and 4 rows still run in
about half the staged time but at 0.77-0.97x cuBLAS, whose kernels for them are faster than
for one row (BENCHMARKS.md, session 9). Five rows and more keep the staged GEMM for a row-major
b: ROWS' FMAs fall behind its loads there (COLS' tensor cores do not). COLS on an H100
(2026-12-07, CUDA graphs over 512 MB of weights): 2x4144x14084 51 us (staged: 127, session 20;
cuBLAS 56), 8x14336x4095 55 (cuBLAS 155), 4x151655x4097 485 (cuBLAS 804), after session 28's
split rule. It streams W at up to 0.86 of the copy bandwidth, but where K is a few thousand and
M 8-16 it still trails cuBLAS (16x11008x4100 0.86x; 3 of 16 held-out shapes below 1x) and every
shape trails the aligned neighbour TMA reads (1.2-2x its time: BENCHMARKS.md, session 28).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

from . import runtime
from .arrays import TMA_ALIGN, View
from .fixed_kernels import FixedKernel
from .launch import REGIONS, Launch
from .problem import DTYPE_BYTES, Problem

THREADS = 256  # the kernels' __launch_bounds__
WARPS_PER_BLOCK = THREADS // 32
BLOCKS_PER_SM = 2  # the kernels' __launch_bounds__(THREADS, 2)
B_BYTES = 2  # the decode kernels' b is 16-bit
WAVE_FILL = 0.95  # see `Decoder.split_for`


class Split(NamedTuple):
    """The grid: N in strips of `Decoder.strip` columns, K in splits of whole `granule` rows, a
    block for each strip and group of WARPS_PER_BLOCK consecutive splits (ROWS: a warp each;
    COLS: the group's rows, its warps taking their granules in turn)."""

    strips: int
    groups: int
    rows: int  # per split (the last splits may have fewer, or none)
    blocks: int


class Decoder(NamedTuple):
    """One decode kernel and the geometry the host shares with it (its constants)."""

    kernel: FixedKernel
    b_major: int  # the dimension of b (K, N) with unit stride: 1 rows along N, 0 columns along K
    max_m: int  # rows of a (the kernel's MAX_M)
    strip: int  # columns of b a warp takes (STRIP)
    granule: int  # a split's rows of b are a multiple of it (ROWS_IN_FLIGHT, WINDOW)
    # The fewest rows of b a split reads: the partial sums (M x strip fp32 a group, written and
    # read back through L2) stay small beside the bytes streamed.
    min_split_rows: int
    # A block's fixed cost in bytes of b streamed (`split_for`), fitted on an H100 to every group
    # count of 16 random shapes (BENCHMARKS.md, session 28); None: split to fill the waves.
    block_overhead: int | None
    sum_rows: tuple  # the kernel instances' rows of a, ascending (M runs the first >= M)

    def kernel_rows(self, m: int) -> int:
        """The rows of a the kernel's instance for M rows sums (and lays out its partials for)."""
        return next(rows for rows in self.sum_rows if rows >= m)

    def split_rows(self, k: int, groups: int) -> int:
        """A split's rows of b when K is cut in `groups` groups: whole granules."""
        return -(-k // (groups * WARPS_PER_BLOCK * self.granule)) * self.granule

    def group_counts(self, k: int) -> list:
        """The group counts K may be cut in: at most as many as K has splits of min_split_rows
        rows, none that leaves a group without rows, and none whose last split ends past the
        kernels' 32-bit K indices (the splits round up; K may be near 2^31)."""
        most = -(-k // (self.min_split_rows * WARPS_PER_BLOCK))
        counts = {-(-k // (self.split_rows(k, g) * WARPS_PER_BLOCK)) for g in range(1, most + 1)}
        return sorted(g for g in counts if g * WARPS_PER_BLOCK * self.split_rows(k, g) < 1 << 31)

    def split_cost(self, n: int, k: int, num_sms: int, groups: int, block_overhead: int) -> int:
        """The estimated time of `groups` groups, in bytes: waves of blocks (BLOCKS_PER_SM a SM)
        times a block's bytes of b plus `block_overhead`."""
        strips = -(-n // self.strip)
        waves = -(-(strips * groups) // (num_sms * BLOCKS_PER_SM))
        streamed = self.strip * min(WARPS_PER_BLOCK * self.split_rows(k, groups), k) * B_BYTES
        return waves * (streamed + block_overhead)

    def split_for(self, n: int, k: int, num_sms: int) -> Split:
        """A strip's group count, of `group_counts`:

        - with a `block_overhead`, the count of least `split_cost` (the fewest of equals). A
          block's overhead is a's loads, the first loads' latency, the partial sums; a wave's
          empty slots cost little where blocks stream long. COLS on an H100 (BENCHMARKS.md,
          session 28; examples/decode_split.py): the fastest count on 16 of 16 held-out shapes,
          where filling the waves ran them 1.05x slower (up to 1.33x);
        - else the fewest that fill their waves to WAVE_FILL, else the fullest waves: 203 blocks
          (1x50257x4096) ran at 1958 GB/s on the H200's 264 slots, a full wave at 2541. ROWS
          keeps it: the cost rule fitted to ROWS ran its held-out shapes 0.99x as fast."""
        strips = -(-n // self.strip)
        slots = num_sms * BLOCKS_PER_SM
        counts = self.group_counts(k)

        def fill(groups: int) -> float:
            blocks = strips * groups
            return blocks / (-(-blocks // slots) * slots)

        if self.block_overhead is not None:
            groups = min(counts, key=lambda g: (self.split_cost(n, k, num_sms, g, self.block_overhead), g))
        else:
            groups = next((g for g in counts if fill(g) >= WAVE_FILL), None)
            if groups is None:
                groups = max(counts, key=lambda g: (fill(g), -g))
        return Split(strips, groups, self.split_rows(k, groups), strips * groups)


ROWS = Decoder(
    FixedKernel(
        "jitgemm_decode_rows", ("realign.cuh", "decode_common.cuh", "decode_rows.cuh"), THREADS, "the decode kernel"
    ),
    b_major=1,
    max_m=4,
    strip=31 * 8,
    granule=8,
    min_split_rows=16,
    block_overhead=None,
    sum_rows=(1, 2, 4),  # 3 rows run the 4-row instance
)
COLS = Decoder(
    FixedKernel(
        "jitgemm_decode_cols",
        ("realign.cuh", "decode_common.cuh", "decode_cols.cuh"),
        THREADS,
        "the K-major decode kernel",
    ),
    b_major=0,
    max_m=16,
    strip=64,
    granule=32,
    min_split_rows=64,
    block_overhead=43_000,
    sum_rows=(8, 16),  # one or two n8 products
)
DECODERS = (ROWS, COLS)


def decoder_for(va: View, vb: View, b_major: int, b_copy: bool) -> Decoder | None:
    """The decoder that runs `va @ vb`, if one does: M <= its max_m rows of a (any strides)
    and a b TMA cannot read (`b_copy`) with unit stride along the decoder's dimension; both
    element-aligned."""
    dec = next(d for d in DECODERS if d.b_major == b_major)
    if not (b_copy and 0 < va.shape[0] <= dec.max_m and va.strides is not None and vb.strides is not None):
        return None
    if vb.strides[b_major] != 1 or va.ptr % va.itemsize or vb.ptr % vb.itemsize:
        return None
    return dec


def decoder_of(problem: Problem) -> Decoder | None:
    """The decoder that runs `problem` with contiguous operands of its layout (`decoder_for`),
    the configuration not forced."""
    b_major = 1 if problem.b_major == "N" else 0
    dec = next(d for d in DECODERS if d.b_major == b_major)
    row = problem.n if b_major else problem.k  # the elements of b's unit-stride rows
    if problem.m > dec.max_m or row * DTYPE_BYTES[problem.dtype] % TMA_ALIGN == 0:
        return None
    return dec


def explain_note(problem: Problem) -> str | None:
    """What `jitgemm explain` says of `problem` where a contiguous b of its layout would run a
    decode kernel (`decoder_of`), not the GEMM explained."""
    dec = decoder_of(problem)
    if dec is None:
        return None
    what = f"a row-major b of N = {problem.n}" if dec.b_major else f"a K-major b (W.t()) of K = {problem.k}"
    return (
        f"gemm() runs {dec.kernel.what} (jitgemm/decode.py), not this GEMM, for M <= {dec.max_m} against a b "
        f"whose rows TMA cannot read, as {what} (unless a config is forced)"
    )


def writes_in_place(view: View | None) -> bool:
    """Whether the kernels write (or read, for c) `view` where it is: any strides of a 2-D
    view, element-aligned (None: the result jitgemm allocates)."""
    return view is None or (view.strides is not None and view.ptr % view.itemsize == 0)


class _DecodeArgs(ctypes.Structure):
    """The kernels' DecodeArgs (the same fields in both; b_row is the stride of b's rows for
    ROWS, of its columns for COLS)."""

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
    """The decode of one call site, parameters packed once (`Launch`): `decoder`'s kernel (as
    loaded), a, b, the result and c as described by their views (their addresses patched by
    `launch_at`), the grid of `Decoder.split_for`, and the workspace's partials and counters
    regions."""

    __slots__ = ("kernel", "args", "params", "address", "config", "workspace_sizes", "split")

    def __init__(
        self,
        decoder: Decoder,
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
        self.kernel, self.split = kernel, decoder.split_for(n, k, num_sms)
        strips, groups, rows, blocks = self.split
        args = self.args = _DecodeArgs()
        args.a_row, args.a_col = va.strides
        args.b_row = vb.strides[1 - decoder.b_major]
        args.out_row, args.out_col = vd.strides
        args.c_row, args.c_col = _strides(vc)
        args.alpha, args.beta = alpha, beta
        args.m, args.n, args.k = m, n, k
        args.strips, args.groups, args.rows_per_split = strips, groups, rows
        args.fp16, args.out_fp32, args.has_c = va.dtype == "fp16", vd.dtype == "fp32", vc is not None
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        self.address = ctypes.addressof(self.params)
        self.config = runtime.launch_config(kernel, blocks, stream)
        partials = strips * groups * decoder.kernel_rows(m) * decoder.strip * 4
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
