"""Shared-memory and TMA layout of a kernel configuration.

One source of truth for the numbers the template, the runtime (tensor-map boxes) and the
heuristics (shared-memory arithmetic) must agree on.

A K-major operand tile is `rows x 64` 16-bit elements with 128-byte swizzling (one 128-byte
row per M or N index). block_n is a multiple of 16, or of 8 where the wgmma's B operand (B, or
A under swap_ab) is K-major, so that a tile count wastes fewer padded rows (M = 1300 swapped is
8 tiles of 168, not of 176). An MN-major tile is stored as pieces of `swizzle / 2` MN-elements x
block_k K-rows, each piece one TMA box: 128-byte swizzle (64-wide pieces) when the tile is
more than 32 wide, else the widest of 64 or 32 bytes whose piece width divides it, so that the
narrowest tiles (block_n 16, 32) load no padding. A 48-wide tile loads one 64-wide piece:
three 16-wide pieces of 32-byte rows streamed up to 1.4x slower. A wider MN-major tile that is
not a multiple of 64 (block_n 80, 96, ..., 240) is loaded in 64-wide pieces, the last one padded; with
`b_tail` B ends instead in a narrower "tail" laid out by the narrow-tile rule (its own TMA box
and swizzle; wgmma covers it with a second, narrower instruction), so that no columns past the
tile are loaded: 128x144 lands 144 columns of B per k-block, not 192. With TMA multicast of an
operand, the two CTAs of a cluster each load half of that operand's pieces and multicast them
to both CTAs; a K-major tile whose halves are not whole 8-row swizzle atoms (168 rows) is
loaded as two boxes of the next whole atoms (88 rows, at rows 0 and 80), their common rows
landing twice with the same bytes (the cost model counts the tile's rows once).

With `swap_ab` the kernel computes D^T = B^T A^T, so that the user's M lands on the wgmma's N
side (any multiple of 16 up to 256, of 8 for a K-major A) and the user's N on its 64-row
atoms. The tiling fields are
then in kernel coordinates (`jitgemm.geometry`), as on sm_100a (`jitgemm.archs.sm100.layout`): block_m runs along the
user's N, block_n along the user's M; `multicast` still names the user operand a pair shares.
`a` and `b` stay the user's A and B tiles (so the tensor maps do not change); the wgmma reads
B's tile as its A operand (`mma_a`) and A's as its B operand (`mma_b`), and the epilogue stores
the accumulators transposed (stmatrix .trans), one 64-column box of D per 64-row atom.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ...config import KernelConfig
from ...problem import DTYPE_BYTES

SWIZZLE_ATOM = 1024  # bytes: 8 rows of 128 bytes, the 128B-swizzle repeat
SMEM_CAPACITY = 232448  # dynamic shared memory one CTA may opt into on sm_90
BARRIER_BYTES = 8
WGMMA_M = 64


class OperandLayout(NamedTuple):
    major_is_k: bool  # K-major (rows of 128 bytes) or MN-major (pieces of MN elements)
    extent: int  # block_m or block_n
    swizzle: int  # bytes: 128, or 64 / 32 for narrow MN-major tiles
    piece_extent: int  # MN elements covered by one TMA box
    piece_bytes: int
    num_pieces: int  # pieces in the whole tile
    pieces_per_rank: int  # pieces each CTA loads (all of them unless multicast on this operand)
    multicast: bool
    box: tuple  # TMA box, innermost dimension first
    smem_rows: int  # K-major: rows the tile occupies in shared memory (>= rows loaded)
    tail: OperandLayout | None = None  # MN-major: the narrower last part, after the pieces
    # The tile's last block along its rows (M for A, N for B) loads only the rows inside the
    # operand: K-major, through a second map whose box has those rows (`edge_rows`); MN-major,
    # skipping the pieces wholly past them. Not for a multicast operand (its pieces are split
    # between the pair) nor one loading fixed fewer rows (a_rows).
    edge: bool = False
    # MN elements from one piece's origin to the next's: piece_extent, but for a K-major tile
    # multicast in halves that are not whole 8-row swizzle atoms (168 rows: boxes of 88 rows at
    # rows 0 and 80, their 8 shared rows landing twice with the same bytes)
    piece_step: int = 0

    @property
    def step(self) -> int:
        return self.piece_step or self.piece_extent

    @property
    def step_bytes(self) -> int:
        """Shared-memory bytes from one piece to the next."""
        return self.step * self.piece_bytes // self.piece_extent

    @property
    def edge_box(self) -> bool:
        """Whether the last block loads through a second map, a box of the rows inside (K-major)."""
        return self.edge and self.major_is_k

    @property
    def edge_pieces(self) -> bool:
        """Whether the last block leaves out the pieces wholly past the edge (MN-major)."""
        return self.edge and not self.major_is_k

    @property
    def main_extent(self) -> int:
        """MN elements the full-width pieces cover (the wgmma of the tile without its tail)."""
        return self.num_pieces * self.piece_extent if self.tail else self.extent

    @property
    def tx_bytes(self) -> int:
        """Bytes TMA lands in one CTA per stage (all pieces, multicast ones included)."""
        return self.num_pieces * self.piece_bytes + (self.tail.tx_bytes if self.tail else 0)

    @property
    def tile_bytes(self) -> int:
        """Shared memory the tile occupies in one stage."""
        return self.smem_rows * 128 if self.major_is_k else self.tx_bytes

    @property
    def lbo(self) -> int:
        """wgmma descriptor leading byte offset (MN-major: stride between pieces)."""
        return self.piece_bytes if not self.major_is_k else 16

    @property
    def sbo(self) -> int:
        """wgmma descriptor stride byte offset: between 8-row (K-major) or 8-K (MN-major) groups."""
        return 8 * self.swizzle

    @property
    def k16_bytes(self) -> int:
        """Descriptor start-address step for the next 16 elements of K."""
        return 32 if self.major_is_k else 16 * self.swizzle

    @property
    def desc_layout(self) -> int:
        """wgmma descriptor layout type (bits 62-63): 1 = 128B, 2 = 64B, 3 = 32B swizzle."""
        return {128: 1, 64: 2, 32: 3}[self.swizzle]


def _operand(
    major_is_k: bool,
    extent: int,
    block_k: int,
    elem: int,
    multicast: bool,
    loaded_rows: int = 0,
    with_tail: bool = False,
    is_tail: bool = False,
) -> OperandLayout:
    """`loaded_rows` (K-major only): load fewer rows than the tile has; wgmma still reads all
    `extent` rows, and the rows never loaded only feed output rows that are never stored.
    `with_tail` (MN-major, not multicast): the columns past the last full piece form a narrow tail,
    laid out by `_operand` with `is_tail` (`tail_swizzle`: no padding)."""
    ranks = 2 if multicast else 1
    step = 0
    if major_is_k:
        swizzle = 128
        rows = loaded_rows or extent
        # each piece whole 8-row swizzle atoms, so that it lands on a 1024-byte boundary
        piece_extent = -(-rows // ranks // 8) * 8
        if piece_extent * ranks != rows:
            step = rows - piece_extent
        num_pieces = ranks
        box = (block_k, piece_extent)
    else:
        swizzle = tail_swizzle(extent, elem) if is_tail else mn_major_swizzle(extent, elem)
        piece_extent = swizzle // elem
        num_pieces = -(-extent // piece_extent)
        box = (piece_extent, block_k)
        tail_extent = extent % piece_extent
        if with_tail and tail_extent:
            num_pieces = extent // piece_extent
            return OperandLayout(
                False,
                extent,
                swizzle,
                piece_extent,
                piece_extent * block_k * elem,
                num_pieces,
                num_pieces,
                False,
                box,
                extent,
                _operand(False, tail_extent, block_k, elem, False, is_tail=True),
            )
    piece_bytes = box[0] * box[1] * elem
    edge = not multicast and not loaded_rows
    return OperandLayout(
        major_is_k,
        extent,
        swizzle,
        piece_extent,
        piece_bytes,
        num_pieces,
        num_pieces // ranks,
        multicast,
        box,
        extent,
        edge=edge,
        piece_step=step,
    )


def edge_rows(op: OperandLayout, rows: int) -> int:
    """The rows of the box of the last block of a K-major operand of `rows` rows (M for A, N for
    B) that `op` tiles: the rows inside it (the whole tile where the blocks divide the rows)."""
    return rows % op.extent or op.extent


def mn_major_swizzle(extent: int, elem: int) -> int:
    """Swizzle bytes of an MN-major tile `extent` elements wide (see the module docstring): 128
    (64-wide pieces) past 64 bytes, so that a 48-wide tile loads one 64-wide piece, 16 columns
    of it padding, not three 16-wide pieces of 32-byte rows (BENCHMARKS.md, session 21); the
    narrower ones as `tail_swizzle`."""
    if extent * elem > 64:
        return 128
    return tail_swizzle(extent, elem)


def tail_swizzle(extent: int, elem: int) -> int:
    """Swizzle bytes of an MN-major part that loads no padding, a tile of at most 64 bytes or
    the tail of a wider one (`b_tail`): the widest of 64 or 32 whose pieces divide it."""
    return 64 if (extent * elem) % 64 == 0 else 32


class KernelLayout(NamedTuple):
    config: KernelConfig
    a: OperandLayout
    b: OperandLayout
    wg_m: int  # kernel rows of the tile each math warpgroup owns (64-row atoms)
    out_swizzle: int  # bytes: 128, 64 or 32; 0 for one unswizzled box of the whole row (`whole_row_box`)
    out_piece_cols: int  # output columns per TMA store box
    out_box: tuple  # (out_piece_cols, rows): wg_m rows, or block_n with swap_ab
    out_bufs: int  # staging buffers (one store box each) per math warpgroup
    out_bytes: int  # epilogue staging, all warpgroups
    out_bytes_whole: int  # ... with a buffer per box (= out_bytes unless the boxes take turns)
    stage_bytes: int  # shared memory of one stage
    stage_tx_bytes: int  # bytes TMA lands per stage (the tma2mma transaction count)
    smem_bytes: int  # dynamic shared memory to request, alignment slack included
    num_threads: int
    acc_regs: int  # fp32 accumulator registers per math thread

    @property
    def num_out_pieces(self) -> int:
        """Store boxes of one math warpgroup's part of a tile."""
        return (self.wg_m if self.config.swap_ab else self.config.block_n) // self.out_piece_cols

    @property
    def mma_a(self) -> OperandLayout:
        """The tile wgmma reads as its A operand (64-row atoms along kernel M)."""
        return self.b if self.config.swap_ab else self.a

    @property
    def mma_b(self) -> OperandLayout:
        """The tile wgmma reads as its B operand (its N = block_n)."""
        return self.a if self.config.swap_ab else self.b


def kernel_multicast(cfg: KernelConfig) -> str:
    """The kernel-side operand a 2-CTA pair shares: 'A' (same kernel m block, neighbouring n
    blocks), 'B' (same n block, neighbouring m blocks) or 'none'. `cfg.multicast` names the
    user's operand, which swap_ab puts on the other side."""
    if cfg.swap_ab and cfg.multicast != "none":
        return "B" if cfg.multicast == "A" else "A"
    return cfg.multicast


def pair_along(cfg: KernelConfig) -> str | None:
    """The kernel dimension ('m' or 'n') along which a 2-CTA cluster pairs neighbouring tiles:
    'n' when the pair shares the kernel's A tile, 'm' when it shares its B tile; None for one CTA."""
    return {"A": "n", "B": "m", "none": None}[kernel_multicast(cfg)]


def structural_problems(cfg: KernelConfig) -> list[str]:
    """Reasons a config cannot be laid out (empty when it can)."""
    out = []
    elem = DTYPE_BYTES[cfg.dtype]
    if cfg.swap_ab:
        if cfg.out_dtype == "fp32" or cfg.split_k > 1 or cfg.stream_k or cfg.a_rows or cfg.b_tail:
            out.append(
                "swap_ab needs a 16-bit output and no split-K, stream-K, a_rows or b_tail (its "
                "epilogue stores the transposed accumulators with stmatrix)"
            )
    if cfg.block_m % (WGMMA_M * cfg.num_consumers):
        out.append(
            f"block_m={cfg.block_m} must give each of the {cfg.num_consumers} math warpgroups a multiple of 64 rows"
        )
    if cfg.a_rows and (cfg.a_major != "K" or cfg.multicast == "A"):
        out.append("a_rows needs a K-major A that is not multicast")
    if cfg.cluster_size == 2 and cfg.multicast == "none":
        out.append("cluster_size 2 needs multicast 'A' or 'B'")
    a_extent, b_extent = (cfg.block_n, cfg.block_m) if cfg.swap_ab else (cfg.block_m, cfg.block_n)
    for name, major_is_k, extent in (("A", cfg.a_major == "K", a_extent), ("B", cfg.b_major == "K", b_extent)):
        if cfg.multicast != name:
            continue
        piece = mn_major_swizzle(extent, elem) // elem
        if not major_is_k and (-(-extent // piece)) % 2:
            out.append(
                f"multicast {name}: an MN-major tile of {extent} must span an even number of {piece}-wide pieces"
            )
    if cfg.block_n % 16:
        # wgmma's N steps by 8. The operand on its N side must be K-major: one TMA box of
        # block_n rows (MN-major pieces of 64 are left out, as no measurement asks for them).
        # Unswapped, no 16-bit swizzle span divides the block_n columns of D: they are staged as
        # one unswizzled box of the whole row (an fp32 row in 32-byte boxes of 8 columns), which
        # the direct epilogue (out_direct) does not read.
        mma_b_major = cfg.a_major if cfg.swap_ab else cfg.b_major
        if mma_b_major != "K":
            out.append(
                f"block_n={cfg.block_n} (not a multiple of 16) needs a K-major operand on wgmma's N side "
                f"({'A' if cfg.swap_ab else 'B'}, got {mma_b_major!r})"
            )
        elif cfg.out_direct and not cfg.swap_ab:
            out.append(
                f"block_n={cfg.block_n} (not a multiple of 16) unswapped stores the output with TMA, not out_direct"
            )
    if cfg.swap_ab and cfg.block_n > 256:
        out.append(f"block_n={cfg.block_n} > 256 with swap_ab: it is the wgmma's N (at most 256)")
    if cfg.block_n > 256 and cfg.b_major == "K":
        out.append(
            f"block_n={cfg.block_n} > 256 needs an N-major B (a K-major tile is one TMA box of at most 256 rows)"
        )
    if cfg.b_tail and not b_tail_fits(cfg):
        piece = mn_major_swizzle(cfg.block_n, elem) // elem
        out.append(
            f"b_tail needs an N-major B that is not multicast, with block_n past a multiple of "
            f"{piece} (got b_major={cfg.b_major!r}, multicast={cfg.multicast!r}, block_n={cfg.block_n})"
        )
    return out


def b_tail_fits(cfg: KernelConfig) -> bool:
    """Whether `cfg`'s B tile can end in a narrow tail (`b_tail`): an N-major B that is not
    multicast, block_n past a multiple of its piece width."""
    piece = mn_major_swizzle(cfg.block_n, DTYPE_BYTES[cfg.dtype]) // DTYPE_BYTES[cfg.dtype]
    return cfg.b_major == "N" and cfg.multicast != "B" and cfg.block_n > piece and cfg.block_n % piece != 0


TMA_BOX_MAX = 256  # elements along a TMA box dimension


def whole_row_box(swizzle: int, out_cols: int, out_elem: int, direct: bool) -> bool:
    """Whether a staged output row of `out_cols` elements, boxed by the widest swizzle that
    divides it (`swizzle` bytes), goes instead as one unswizzled box: where only 32-byte boxes
    divide it into several (16-bit output 48, 80, ..., 240 wide) and TMA can store the row in one
    box. TMA then stores each row in one request, not in 16-column pieces: the tiles the
    heuristics chose ran 1.4% faster on an H100 (30 problems, geomean; up to 6%), where 64-byte
    boxes made one box ran 0.5% slower (their unswizzled stores conflict 4-way in the banks, the
    32-byte ones' 2-way; BENCHMARKS.md, session 12). The direct epilogue (out_direct) keeps the
    pieces: its warpgroup's threads split a box row into runs evenly. `layout_of` boxes a row
    whole only where every box of it would be staged at once (no ring), so that both take the
    same shared memory, with and without out_direct."""
    return swizzle == 32 and out_cols * out_elem > swizzle and out_cols <= TMA_BOX_MAX and not direct


def epilogue_buffers(pieces: int, has_c: bool, fits) -> int:
    """Staging buffers per math warpgroup for an output row block of `pieces` store boxes, used
    as a ring: all of them when they fit (`fits(bufs)`) or C is read (its tile lands whole, in
    one wait); else the most, at least 2, that fit, so that a deeper pipeline (or a tile wider
    than 256) fits beside them. 2 when none fits: the config is then too big anyway."""
    if has_c or pieces <= 2:
        return pieces
    return next((b for b in range(pieces, 1, -1) if fits(b)), 2)


def pipeline_bytes(stage_bytes: int, stages: int, num_consumers: int) -> int:
    """Shared memory of a pipeline of `stages` stages of `stage_bytes`: the stages, their
    barriers (tma2mma and mma2tma per stage, c_ready per math warpgroup) and the alignment
    slack; the epilogue's staging buffers come on top."""
    return stages * stage_bytes + (2 * stages + num_consumers) * BARRIER_BYTES + SWIZZLE_ATOM


@functools.lru_cache(maxsize=8192)
def layout_of(cfg: KernelConfig) -> KernelLayout:
    """The layout of `cfg` (memoised: selection asks for the same few configs' layouts often)."""
    problems = structural_problems(cfg)
    if problems:
        raise ValueError(f"config {cfg.name} cannot be laid out: " + "; ".join(problems))
    elem = DTYPE_BYTES[cfg.dtype]
    out_elem = DTYPE_BYTES[cfg.out_dtype]
    a_extent, b_extent = (cfg.block_n, cfg.block_m) if cfg.swap_ab else (cfg.block_m, cfg.block_n)
    a = _operand(cfg.a_major == "K", a_extent, cfg.block_k, elem, cfg.multicast == "A", cfg.a_rows)
    b = _operand(cfg.b_major == "K", b_extent, cfg.block_k, elem, cfg.multicast == "B", with_tail=cfg.b_tail)
    wg_m = cfg.block_m // cfg.num_consumers
    # A math warpgroup stores D rows x columns of: wg_m x block_n, or (swap_ab) block_n x wg_m.
    out_rows, out_cols = (cfg.block_n, wg_m) if cfg.swap_ab else (wg_m, cfg.block_n)
    # Widest swizzle whose row of elements divides the columns, so that store boxes never spill
    # into the neighbouring tile.
    # (none for 16-bit columns 8 past a multiple of 16: then one unswizzled box of the whole row)
    out_swizzle = next((s for s in (128, 64, 32) if out_cols % (s // out_elem) == 0), 0)
    out_piece_cols = out_swizzle // out_elem or out_cols
    stage_bytes = a.tile_bytes + b.tile_bytes
    fixed = pipeline_bytes(stage_bytes, cfg.num_stages, cfg.num_consumers)

    def staging(bufs: int) -> int:  # rounded to the swizzle atom: every TMA box starts 1024-aligned
        return -(-cfg.num_consumers * bufs * out_rows * out_piece_cols * out_elem // SWIZZLE_ATOM) * SWIZZLE_ATOM

    pieces = out_cols // out_piece_cols
    out_bufs = epilogue_buffers(pieces, cfg.has_c, lambda bufs: fixed + staging(bufs) <= SMEM_CAPACITY)
    whole = staging(pieces)  # (the same bytes boxed whole)
    if out_bufs == pieces and whole_row_box(out_swizzle, out_cols, out_elem, cfg.out_direct):
        out_swizzle, out_piece_cols, out_bufs = 0, out_cols, 1
    out_bytes = staging(out_bufs)
    smem = fixed + out_bytes
    acc_regs = (wg_m // WGMMA_M) * (cfg.block_n // 2)
    return KernelLayout(
        cfg,
        a,
        b,
        wg_m,
        out_swizzle,
        out_piece_cols,
        (out_piece_cols, out_rows),
        out_bufs,
        out_bytes,
        whole,
        stage_bytes,
        a.tx_bytes + b.tx_bytes,
        smem,
        128 * (1 + cfg.num_consumers),
        acc_regs,
    )


# Split-K: split 0 of a tile adds the other splits' partials (the split-0 reducer). It takes this
# many more K blocks than each of the others (at most half a split more), so that their partials
# are stored and counted in by the time it needs them instead of it waiting on their last stores
# and fences. Measured on the H200 (bf16, us, medians of three interleaved passes), a lead of
# 8 / 0 / 12 / 16 K blocks: 128x4096x7168 m64n128 B pairs split 2 19.9 / 20.5 / 20.0 / 20.3;
# 128x2112x7168 split 3 13.65 / 14.0 / 14.0 / 14.5; 128x576x7168 m64n64 split 4 9.17 / 9.39 / 9.30 / 9.64.
REDUCER_LEAD_KBLOCKS = 8

# Split-K reducer: fp32 registers per math thread for partial sums in flight at once (whole
# splits: a batch of splits costs one L2 round trip, so more is faster while nothing spills).
PARTIALS_IN_FLIGHT_REGS = 128


# Stream-K: the splits a tile usually has at most (its ranges at least half a tile long), for
# the reducer's batch (`read_batch`); a tile with more reads them in more batches.
STREAM_K_SPLITS = 3


def read_batch(lay: KernelLayout) -> int:
    """Splits whose partials the split-K reducer (split 0) loads together: at least one."""
    splits = STREAM_K_SPLITS if lay.config.stream_k else lay.config.split_k
    return int(splits_per_read(splits, lay.acc_regs))


def splits_per_read(split_k, acc_regs):
    """`read_batch` from a config's split_k and accumulator registers (elementwise over arrays)."""
    return np.maximum(1, np.minimum(split_k - 1, PARTIALS_IN_FLIGHT_REGS // acc_regs))
