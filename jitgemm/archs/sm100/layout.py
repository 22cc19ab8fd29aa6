"""Shared-memory, tensor-memory and TMA layout of an sm_100a (Blackwell, tcgen05) kernel.

One source of truth for the numbers the sm_100a template, the runtime (tensor-map boxes, grid)
and the sm100 heuristics (shared-memory and TMEM arithmetic) must agree on; the sm_100a
counterpart of `jitgemm.archs.sm90.layout`.

How a KernelConfig reads on sm_100a
-----------------------------------
The kernel computes D = alpha * A @ B (+ beta * C). With ``swap_ab`` it computes the same D as
D^T = B^T @ A^T, so that a small M lands on the MMA's N side (tcgen05 M is 128 or 256, N can be
as small as 16). "Kernel coordinates" below are those of the GEMM the MMA actually runs:

    ============  ===================  ===================
                  swap_ab = False      swap_ab = True
    ============  ===================  ===================
    kernel M      user M               user N
    kernel N      user N               user M
    MMA A side    user A (map_a)       user B (map_b)
    MMA B side    user B (map_b)       user A (map_a)
    ============  ===================  ===================

The tiling fields of the config are in kernel coordinates: ``block_m`` is the tile extent along
kernel M (``128 * num_consumers``: each MMA consumer owns 128 accumulator rows = the 128 TMEM
lanes), ``block_n`` the extent along kernel N (= the MMA's N, 16..256 in steps of 16),
``raster``/``group_size`` the L2 walk over kernel tiles. ``dtype``, ``out_dtype``, ``a_major``,
``b_major`` and ``has_c`` always describe the user's arrays.

``cluster_size == 2`` selects the cooperative 2-CTA MMA (tcgen05 ``cta_group::2``): the two
CTAs of a cluster take neighbouring kernel-M tiles with the same kernel-N tile; each CTA loads
its own 128*C rows of the MMA-A operand and *half* of the MMA-B operand tile, and one M=256 MMA
issued by the even CTA reads both halves. ``multicast`` names the *user* operand the pair
shares (splits in halves): ``'B'`` without swap_ab, ``'A'`` with swap_ab. The runtime builds that
operand's tensor map with the half-size box given here.

``num_consumers == 2`` adds a second MMA consumer: the stage holds 256 rows of the MMA-A operand
and one MMA-B tile, consumer c multiplies rows [128c, 128c+128) by the shared B tile into its
own TMEM column range and has its own writeback warpgroup.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import KernelConfig
from ...problem import DTYPE_BYTES

SWIZZLE_ATOM = 1024  # bytes: 8 rows of 128 bytes, the 128B-swizzle repeat
SMEM_CAPACITY = 232448  # dynamic shared memory one CTA may opt into on sm_100
SM_SHARED_MEMORY = 233472  # shared memory of one SM on sm_100 (1 KiB of it reserved per CTA)
BARRIER_BYTES = 8
UMMA_M = 128  # accumulator rows per CTA per consumer (= TMEM lanes)
UMMA_K = 16  # K of one kind::f16 tcgen05.mma
TMEM_COLUMNS = 512  # 32-bit columns of tensor memory per SM
MN_PIECE = 64  # MN elements of one 128-byte swizzled row (16-bit types)
OUT_SLOTS = 2  # staging buffers per writeback warpgroup (TMA-store ring)
THREADS_PER_WARPGROUP = 128

# Instruction-descriptor encodings (PTX ISA, tcgen05 "Instruction descriptor", kind::f16).
_IDESC_AB_TYPE = {"fp16": 0, "bf16": 1}
_IDESC_D_F32 = 1


@dataclass(frozen=True)
class OperandLayout:
    """One operand's tile in one pipeline stage of one CTA (and how TMA fills it)."""

    user: str  # "A" or "B": the user operand (and tensor map) it comes from
    role: str  # "mma_a" (TMEM lanes side) or "mma_b" (TMEM columns side)
    major_is_k: bool  # K-major (rows of 128 bytes) or MN-major (pieces of 64 MN elements)
    extent: int  # MN elements of this operand held by one CTA per stage
    piece_extent: int  # MN elements covered by one TMA box
    piece_bytes: int
    num_pieces: int  # TMA boxes per stage per CTA
    box: tuple  # TMA box, innermost dimension first
    shared_by_pair: bool  # 2-CTA MMA: each CTA holds half of this operand's tile

    @property
    def tile_bytes(self) -> int:
        return self.num_pieces * self.piece_bytes

    @property
    def swizzle(self) -> int:
        """TMA and UMMA swizzle bytes: always 128 on sm_100a (the runtime reads it per operand)."""
        return 128

    @property
    def lbo(self) -> int:
        """UMMA descriptor leading byte offset: MN-major, between 64-wide pieces; K-major unused."""
        return self.piece_bytes if not self.major_is_k else 16

    @property
    def sbo(self) -> int:
        """UMMA descriptor stride byte offset: between 8-row (K-major) or 8-K (MN-major) groups."""
        return SWIZZLE_ATOM

    @property
    def k16_bytes(self) -> int:
        """Descriptor start-address advance per K=16 step inside a 64-wide K block."""
        return 2 * UMMA_K if self.major_is_k else (UMMA_K // 8) * SWIZZLE_ATOM


def _operand(
    user: str, role: str, major_is_k: bool, extent: int, block_k: int, elem: int, shared_by_pair: bool
) -> OperandLayout:
    if major_is_k:
        return OperandLayout(
            user, role, True, extent, extent, extent * block_k * elem, 1, (block_k, extent), shared_by_pair
        )
    pieces = -(-extent // MN_PIECE)
    return OperandLayout(
        user, role, False, extent, MN_PIECE, MN_PIECE * block_k * elem, pieces, (MN_PIECE, block_k), shared_by_pair
    )


@dataclass(frozen=True)
class KernelLayout:
    config: KernelConfig
    a: OperandLayout  # the user's A operand (map_a)
    b: OperandLayout  # the user's B operand (map_b)
    cta_group: int  # tcgen05 .cta_group (1, or 2 for the 2-CTA MMA)
    umma_m: int  # M of one tcgen05.mma (128, or 256 across the pair)
    umma_n: int  # N of one tcgen05.mma (= block_n)
    idesc: int  # 32-bit instruction descriptor of that MMA
    acc_stages: int  # accumulator buffers per consumer in TMEM (MMA/writeback overlap)
    tmem_columns: int  # columns the accumulators use
    tmem_alloc_columns: int  # power of two >= 32 handed to tcgen05.alloc
    out_swizzle: int  # bytes of one staged output row (TMA store swizzle)
    out_piece_cols: int  # output columns (user N) per TMA store box
    out_box: tuple  # (out_piece_cols, rows): the D (and C) tensor-map box
    chunk_cols: int  # TMEM columns read per writeback step (tcgen05.ld .32x32b.xN)
    num_chunks: int  # writeback steps per tile per consumer
    boxes_per_chunk: int  # TMA store boxes per writeback step
    slot_bytes: int  # one staging slot (one writeback step)
    out_bytes: int  # all staging slots of all consumers
    stage_bytes: int  # one pipeline stage of one CTA (A side + B side)
    num_barriers: int
    smem_bytes: int  # dynamic shared memory to request, alignment slack included
    num_threads: int

    @property
    def mma_a(self) -> OperandLayout:
        return self.b if self.config.swap_ab else self.a

    @property
    def mma_b(self) -> OperandLayout:
        return self.a if self.config.swap_ab else self.b

    @property
    def expect_tx_bytes(self) -> int:
        """Bytes the leader CTA's tma2mma barrier expects per stage (both CTAs' loads)."""
        return self.stage_bytes * self.cta_group


def structural_problems(cfg: KernelConfig) -> list[str]:
    """Reasons `cfg` cannot be an sm_100a kernel (empty when it can)."""
    out = []
    if cfg.out_direct:
        out.append("out_direct: the sm_100a kernels store D with TMA only (an unaligned output is copied)")
    if cfg.stream_k:
        out.append("stream_k: the sm_100a kernels cut K by split_k only")
    if cfg.block_m != UMMA_M * cfg.num_consumers:
        out.append(
            f"block_m must be 128 per MMA consumer ({UMMA_M * cfg.num_consumers} for "
            f"{cfg.num_consumers}), got {cfg.block_m}"
        )
    if cfg.block_n % 16 or not 16 <= cfg.block_n <= 256:
        out.append(f"block_n (the MMA's N) must be a multiple of 16 in [16, 256], got {cfg.block_n}")
    shared = "A" if cfg.swap_ab else "B"
    if cfg.cluster_size == 2 and cfg.multicast != shared:
        out.append(
            f"the 2-CTA MMA shares the MMA-B operand, which is user {shared} "
            f"{'(swap_ab)' if cfg.swap_ab else ''}: multicast must be {shared!r}, got {cfg.multicast!r}"
        )
    if cfg.cluster_size == 1 and cfg.multicast != "none":
        out.append("multicast needs the 2-CTA MMA (cluster_size 2)")
    if getattr(cfg, "split_k", 1) != 1:
        out.append("split_k is not implemented for sm_100a")
    if cfg.a_rows:
        out.append("a_rows is not implemented for sm_100a")
    if cfg.b_tail:
        out.append("b_tail is not implemented for sm_100a")
    b_major_is_k = (cfg.a_major if cfg.swap_ab else cfg.b_major) == "K"
    b_extent = cfg.block_n // cfg.cluster_size
    if not b_major_is_k and b_extent % MN_PIECE:
        out.append(
            f"an MN-major MMA-B operand needs whole 64-element swizzle rows per CTA: "
            f"block_n / cluster_size = {b_extent} is not a multiple of 64"
        )
    if b_major_is_k and b_extent % 8:
        out.append(f"a K-major MMA-B operand needs a multiple of 8 rows per CTA, got {b_extent}")
    if cfg.num_consumers * cfg.block_n > TMEM_COLUMNS:
        out.append(
            f"{cfg.num_consumers} accumulator(s) of {cfg.block_n} fp32 columns exceed the {TMEM_COLUMNS} TMEM columns"
        )
    return out


def pair_along(cfg: KernelConfig) -> str | None:
    """The kernel dimension along which a 2-CTA cluster pairs neighbouring tiles: 'm' for the
    2-CTA MMA (the pair shares the MMA-B tile), None for one CTA."""
    return "m" if cfg.cluster_size == 2 else None


def _pow2_at_least(x: int, floor: int = 32) -> int:
    p = floor
    while p < x:
        p *= 2
    return p


def instruction_descriptor(cfg: KernelConfig, umma_m: int) -> int:
    """tcgen05.mma kind::f16 instruction descriptor: fp32 D, dtype A/B, majors, N>>3, M>>4."""
    ab = _IDESC_AB_TYPE[cfg.dtype]
    a_major, b_major = (cfg.b_major, cfg.a_major) if cfg.swap_ab else (cfg.a_major, cfg.b_major)
    a_mn = 0 if a_major == "K" else 1  # "transpose" bit: 1 reads an MN-major operand
    b_mn = 0 if b_major == "K" else 1
    return (
        (_IDESC_D_F32 << 4)
        | (ab << 7)
        | (ab << 10)
        | (a_mn << 15)
        | (b_mn << 16)
        | ((cfg.block_n >> 3) << 17)
        | ((umma_m >> 4) << 24)
    )


def layout_of(cfg: KernelConfig) -> KernelLayout:
    problems = structural_problems(cfg)
    if problems:
        raise ValueError(f"config {cfg.name} cannot be laid out for sm_100a: " + "; ".join(problems))
    elem = DTYPE_BYTES[cfg.dtype]
    out_elem = DTYPE_BYTES[cfg.out_dtype]
    c = cfg.num_consumers
    pair = cfg.cluster_size
    # The MMA-A side: 128 rows per consumer, all in this CTA. The MMA-B side: block_n columns,
    # split between the two CTAs of a 2-CTA pair.
    if cfg.swap_ab:
        b = _operand("B", "mma_a", cfg.b_major == "K", cfg.block_m, cfg.block_k, elem, False)
        a = _operand("A", "mma_b", cfg.a_major == "K", cfg.block_n // pair, cfg.block_k, elem, pair == 2)
    else:
        a = _operand("A", "mma_a", cfg.a_major == "K", cfg.block_m, cfg.block_k, elem, False)
        b = _operand("B", "mma_b", cfg.b_major == "K", cfg.block_n // pair, cfg.block_k, elem, pair == 2)

    umma_m = UMMA_M * pair
    # Two accumulator buffers per consumer let the MMA run the next tile while the writeback
    # drains this one, when they fit the 512 TMEM columns.
    acc_stages = 2 if 2 * c * cfg.block_n <= TMEM_COLUMNS else 1
    tmem_columns = acc_stages * c * cfg.block_n
    tmem_alloc = _pow2_at_least(tmem_columns)

    if cfg.swap_ab:
        # TMEM lanes are user N (contiguous in D), columns user M: a writeback step stages
        # chunk_cols rows of D x 128 columns, as 128-byte-swizzled boxes 128 bytes wide.
        out_swizzle = 128
        out_piece_cols = out_swizzle // out_elem
        chunk_cols = 32 if cfg.block_n % 32 == 0 else 16
        boxes_per_chunk = UMMA_M // out_piece_cols
        out_box = (out_piece_cols, chunk_cols)
        slot_bytes = chunk_cols * UMMA_M * out_elem
    else:
        # TMEM lanes are user M, columns user N: a writeback step stages one box of
        # 128 rows x out_swizzle bytes; the widest swizzle whose row divides block_n.
        out_swizzle = next(s for s in (128, 64, 32) if cfg.block_n % (s // out_elem) == 0)
        out_piece_cols = out_swizzle // out_elem
        chunk_cols = out_piece_cols
        boxes_per_chunk = 1
        out_box = (out_piece_cols, UMMA_M)
        slot_bytes = UMMA_M * out_swizzle
    num_chunks = cfg.block_n // chunk_cols
    out_bytes = c * OUT_SLOTS * slot_bytes

    stage_bytes = a.tile_bytes + b.tile_bytes
    # tma2mma, mma2tma per stage; mma2ld, ld2mma per consumer and accumulator stage; c_ready per
    # consumer and staging slot; one 8-byte word for the TMEM base address.
    num_barriers = 2 * cfg.num_stages + 2 * c * acc_stages + c * OUT_SLOTS
    smem = cfg.num_stages * stage_bytes + out_bytes + (num_barriers + 1) * BARRIER_BYTES + SWIZZLE_ATOM
    # A CTA holds its TMEM columns while it runs: two CTAs on one SM could each wait for the
    # other's. Asking for more than half the SM's shared memory keeps one CTA per SM.
    smem = max(smem, SM_SHARED_MEMORY // 2 + 1)
    return KernelLayout(
        config=cfg,
        a=a,
        b=b,
        cta_group=pair,
        umma_m=umma_m,
        umma_n=cfg.block_n,
        idesc=instruction_descriptor(cfg, umma_m),
        acc_stages=acc_stages,
        tmem_columns=tmem_columns,
        tmem_alloc_columns=tmem_alloc,
        out_swizzle=out_swizzle,
        out_piece_cols=out_piece_cols,
        out_box=out_box,
        chunk_cols=chunk_cols,
        num_chunks=num_chunks,
        boxes_per_chunk=boxes_per_chunk,
        slot_bytes=slot_bytes,
        out_bytes=out_bytes,
        stage_bytes=stage_bytes,
        num_barriers=num_barriers,
        smem_bytes=smem,
        num_threads=THREADS_PER_WARPGROUP * (1 + c),
    )


def smem_bytes(cfg: KernelConfig) -> int:
    """Dynamic shared memory of `cfg` (for stage arithmetic)."""
    return layout_of(cfg).smem_bytes
