"""Launch geometry, defined once: kernel coordinates, tile counts, 2-CTA pairs, K splits, the
persistent grid, wave quantisation and the tile order (the L2 raster). The heuristics, the
launch and the tests read these; the kernels walk the same tiles (their scheduler, shared by
both archs' templates: `tile_of` in templates/common/scheduler.cuh, mirrored by `tile_order`).

A problem D[M, N] runs in kernel coordinates (M, N), or (N, M) under `swap_ab` (D^T = B^T A^T).
A 2-CTA cluster takes a pair of tiles that share one operand tile; a "work unit" is one K split
of one cluster tile (a tile, or a pair); the grid is persistent: at most one CTA per SM, each
walking work units.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from .config import KernelConfig


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def kernel_shape(cfg: KernelConfig, m: int, n: int) -> tuple[int, int]:
    """(kernel M, kernel N) of a user problem with D of shape (m, n)."""
    return (n, m) if cfg.swap_ab else (m, n)


def cluster_tiles(tiles_m: int, tiles_n: int, pair_along: str | None) -> int:
    """Work items of one K split: tiles, or pairs of neighbouring tiles along kernel 'm' or 'n'
    (an odd last one a pair by itself); the scheduler's `num_cluster_tiles`."""
    return cluster_units(tiles_m, tiles_n, pair_along == "m", pair_along == "n")


def cluster_units(tiles_m, tiles_n, paired_m, paired_n):
    """`cluster_tiles` with the pair side as flags (elementwise over NumPy arrays too)."""
    return ceil_div(tiles_m, 1 + paired_m) * ceil_div(tiles_n, 1 + paired_n)


def num_splits(cfg: KernelConfig, k: int) -> int:
    """K splits actually used: at most one per K block, so no split is empty."""
    return int(splits_used(cfg.split_k, cfg.block_k, k))


def splits_used(split_k, block_k, k):
    """`num_splits` from the fields, elementwise over NumPy arrays too."""
    return np.maximum(1, np.minimum(split_k, ceil_div(k, block_k)))


def k_blocks(cfg: KernelConfig, k: int) -> int:
    """K blocks of a K extent `k` under `cfg` (the last one partial)."""
    return ceil_div(k, cfg.block_k)


# Stream-K (KernelConfig.stream_k): every cluster first takes the same number of whole tiles, in
# waves (tile c, c + ctas, ...: stream_k_whole_tiles of them in all), then the K blocks of the
# tiles left, laid end to end (tile t holding blocks [t * kb, (t + 1) * kb) of kb), are cut into
# `ctas` equal ranges, cluster c owning [total * c // ctas, total * (c + 1) // ctas).
# - Only the last one to two waves' worth is cut: cut over all tiles, the clusters would work on
#   tiles spread over the whole output at once, and neighbouring tiles would no longer share
#   their operands' rows through L2.
# - A cluster walks its range from its end: the piece of its last tile first (from that tile's
#   K block 0), the piece of its first tile last (up to that tile's last K block). So the
#   clusters start their cut ranges together at K block 0 and end them together at the last
#   one, and tiles that share operand rows read them at about the same time; walked from its
#   start, cluster c would begin at K block (c * range) % kb. (A range inside one tile, where
#   fewer tiles than clusters are cut, keeps its own offset.) Measured on the H100 (2026-12-07),
#   m128n128 B pairs: 1536x2112x16000 nn ran in 335 us walked from the start, 225 walked from
#   the end (the wave order: 183).
# - A tile cut between clusters is a split-K tile of its own: the cluster holding its last K
#   block, which reaches it last, is split 0 and sums the others' partials. Where anything is
#   cut, every cluster's range must hold a K block (a cluster of an empty range would count
#   among a tile's splits and never arrive): the launch has at most as many clusters as the cut
#   range has K blocks (it has a tile's per cluster, or all tiles and a cluster per K block at
#   most).
# templates/sm90/gemm.cu.j2 (StreamK) walks the same ranges: change both together.


def stream_k_whole_tiles(tiles, ctas):
    """The tiles walked whole, in waves, before the cut range: all where they make whole waves,
    else all but the last one to two waves' worth (none for two waves or fewer). Elementwise
    over integer arrays too."""
    waves, rest = tiles // ctas, tiles % ctas
    return (waves - (rest != 0)) * (waves > 0) * ctas


def stream_k_cluster_blocks(tiles, kb, ctas):
    """The K blocks of the longest walk of a cluster: its whole tiles' and the most of the cut
    range's. Elementwise over integer arrays too."""
    whole = stream_k_whole_tiles(tiles, ctas)
    return whole // ctas * kb + ceil_div((tiles - whole) * kb, ctas)


def stream_k_owner(block: int, total: int, ctas: int) -> int:
    """The cluster whose range holds K block `block` of `total` (the largest c with
    total * c // ctas <= block)."""
    return ((block + 1) * ctas - 1) // total


def stream_k_segments(c: int, tiles: int, kb: int, ctas: int) -> list[tuple[int, int, int, int, int]]:
    """Cluster c's work as (tile, split, splits, kb_begin, kb_end): each tile it takes, the K
    blocks of it the cluster owns, its index among the clusters sharing the tile (0: the one
    holding its last K block) and their count, in walk order."""
    whole = stream_k_whole_tiles(tiles, ctas)
    out = [(tile, 0, 1, 0, kb) for tile in range(c, whole, ctas)]
    total = (tiles - whole) * kb
    begin, block = total * c // ctas, total * (c + 1) // ctas
    while block > begin:
        tile = (block - 1) // kb
        first, last = stream_k_owner(tile * kb, total, ctas), stream_k_owner(tile * kb + kb - 1, total, ctas)
        kb_begin = max(begin, tile * kb) - tile * kb
        out.append((whole + tile, last - c, last - first + 1, kb_begin, block - tile * kb))
        block = tile * kb + kb_begin
    return out


def stream_k_max_splits(tiles: int, kb: int, ctas: int) -> int:
    """The most clusters sharing one tile: the workspace's partial slots per tile."""
    tiles -= stream_k_whole_tiles(tiles, ctas)
    total = tiles * kb
    if tiles == 0:
        return 1
    if ctas <= tiles:  # a range is at least one tile long: a tile spans at most two ranges
        return 2
    return max(
        stream_k_owner(t * kb + kb - 1, total, ctas) - stream_k_owner(t * kb, total, ctas) + 1 for t in range(tiles)
    )


def partial_slots(cfg: KernelConfig, cluster_tiles: int, k: int, ctas: int) -> int:
    """fp32 partial tiles the split-K workspace holds per tile (the kernel's `num_splits`) for a
    launch of `ctas` clusters: the K splits, or under stream_k the most clusters sharing a tile."""
    if cfg.stream_k:
        return stream_k_max_splits(cluster_tiles, k_blocks(cfg, k), ctas)
    return num_splits(cfg, k)


def partial_tiles(cfg: KernelConfig, cluster_tiles: int, ctas: int) -> int:
    """The cluster tiles the split-K workspace holds partials and counters of, for a launch of
    `ctas` clusters: every tile under split_k, the cut ones under stream_k (the kernel indexes
    them from the first cut tile; a whole tile never touches the workspace)."""
    if cfg.stream_k:
        return cluster_tiles - stream_k_whole_tiles(cluster_tiles, ctas)
    return cluster_tiles


def persistent_grid(units: int, cluster_size: int, num_sms: int) -> int:
    """CTAs to launch for `units` work units: at most one per SM, a multiple of the cluster size."""
    return min(units, num_sms // cluster_size) * cluster_size


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


L2_LINE_BYTES = 128
ROW_UNIT_BYTES = 16  # TMA's rule for a row's pitch (jitgemm.arrays.TMA_ALIGN)


def staged_pitch(row_bytes: int) -> int:
    """The pitch in bytes of the rows of an operand staged for TMA (staging.py): whole 128-byte
    L2 lines where that pads a row by at most an eighth, else whole 16-byte units. In rows of
    any other pitch most box rows straddle two lines, each a TMA request of its own, and the
    requests bound a bandwidth-bound main loop: measured on the H200 (2026-12-02), 618x1896x4560
    (m128n128) ran in 42.7 us on rows as they come and 26.0 us on the same operands in rows
    padded to 128 bytes; 1001x3001x2049 (both operands staged) 39.6 us staged in whole units,
    31.6 in whole lines."""
    lines = round_up(row_bytes, L2_LINE_BYTES)
    return lines if (lines - row_bytes) * 8 <= row_bytes else round_up(row_bytes, ROW_UNIT_BYTES)


def covered_extent(size, block, box):
    """Elements of one dimension read by all blocks together, when block i (origin i*block)
    loads `box` >= `block` elements clipped at `size` (TMA does not fetch out-of-bounds
    elements). With box == block this is `size`; a wider box (MN-major pieces wider than the
    block, e.g. 3 x 64 for a block of 176) re-reads part of the neighbouring block.
    Elementwise over NumPy arrays too (`size` itself where no box is wider than its block).
    """
    if isinstance(box, int) and isinstance(block, int):  # (plain integers: cheaper without NumPy)
        return size if box <= block else _wide_box_extent(size, block, box, max(0, (size - box) // block + 1))
    if not np.count_nonzero(np.greater(box, block)):
        return size
    total = np.where(box <= block, size, _wide_box_extent(size, block, box, np.maximum(0, (size - box) // block + 1)))
    return int(total) if np.ndim(total) == 0 else total


def _wide_box_extent(size, block, box, full):
    """`covered_extent` where box > block: the first `full` blocks, whose whole box is inside
    (j * block + box <= size, fewer than all: (size - box) // block + 1 < ceil(size / block),
    at least 0), read `box`; block j of the others reads size - j * block (elementwise)."""
    nblocks = ceil_div(size, block)
    rest = nblocks - full
    return full * box + rest * size - block * ((full + nblocks - 1) * rest // 2)


class Waves(NamedTuple):
    """Wave quantisation of `tiles` equal work items over `slots` concurrent workers (ints, or
    arrays with one element per candidate)."""

    tiles: Any
    slots: Any
    waves: Any  # ceil(tiles / slots)
    last_wave_tiles: Any  # tiles in the last wave (== slots when it is full)

    @property
    def last_wave_util(self) -> float:
        """Fraction of the workers busy in the last wave."""
        return self.last_wave_tiles / self.slots

    @property
    def efficiency(self) -> float:
        """tiles / (waves * slots): 1.0 when every wave is full."""
        return self.tiles / (self.waves * self.slots)


def waves_of(tiles, slots) -> Waves:
    """Waves of a persistent kernel with `slots` workers (CTAs or clusters) over `tiles` items
    (elementwise over NumPy arrays too)."""
    busy = np.maximum(1, np.where(np.greater(tiles, 0), np.minimum(slots, tiles), slots))
    waves = ceil_div(tiles, busy)
    last = tiles - np.maximum(waves - 1, 0) * busy
    if np.ndim(busy) == 0:
        return Waves(int(tiles), int(busy), int(waves), int(last))
    return Waves(tiles, busy, waves, last)


def tile_order(num_m: int, num_n: int, raster: str, group: int, pair_along: str | None = None):
    """Yield, in launch order, the (m_block, n_block) pairs of each *cluster tile*.

    Mirrors the kernels' persistent scheduler, `tile_of` in templates/common/scheduler.cuh: with
    `pair_along` "n" the two CTAs of a cluster take neighbouring n blocks of one m block (they
    share the A tile), with "m" neighbouring m blocks of one n block (they share the B tile);
    cluster tiles are walked in groups of `group` cluster-rows (raster "m") or cluster-columns
    (raster "n"). A peer past the edge recomputes the last block, so it is reported as that block
    (what it loads). Each item is a tuple of 1 or 2 (m, n).
    """
    grid_m = ceil_div(num_m, 2) if pair_along == "m" else num_m
    grid_n = ceil_div(num_n, 2) if pair_along == "n" else num_n
    total = grid_m * grid_n
    for t in range(total):
        if raster == "m":
            per_group = group * grid_n
            first = (t // per_group) * group
            rows = min(group, grid_m - first)
            cm = first + (t % per_group) % rows
            cn = (t % per_group) // rows
        else:
            per_group = group * grid_m
            first = (t // per_group) * group
            cols = min(group, grid_n - first)
            cn = first + (t % per_group) % cols
            cm = (t % per_group) // cols
        if pair_along == "n":
            yield tuple((cm, min(2 * cn + r, num_n - 1)) for r in (0, 1))
        elif pair_along == "m":
            yield tuple((min(2 * cm + r, num_m - 1), cn) for r in (0, 1))
        else:
            yield ((cm, cn),)


def raster_footprints(
    num_m: int,
    num_n: int,
    rows_per_m: int,
    cols_per_n: int,
    slots: int,
    walks: list,
    pair_along: str | None = None,
    max_waves: int = 16,
) -> np.ndarray:
    """Mean L2 working set of one k-block, in operand rows+columns, over the waves of each walk
    of `walks` ((raster, group) pairs).

    A wave is `slots` consecutive cluster tiles of `tile_order` (the ones the persistent CTAs
    hold at once). Its working set is (distinct m blocks) * rows_per_m + (distinct n blocks) *
    cols_per_n; multiply by the bytes of one K slice to get bytes. Only the first `max_waves`
    waves are counted. Counted in closed form, wave by wave (plain integer arithmetic: a few
    waves of a few walks cost less so than as arrays): see `_walk_footprint`.
    """
    slots = max(1, slots)
    grid_m = ceil_div(num_m, 2) if pair_along == "m" else num_m
    grid_n = ceil_div(num_n, 2) if pair_along == "n" else num_n
    total = grid_m * grid_n
    waves = min(ceil_div(total, slots), max_waves)
    m_side = (grid_m, num_m, pair_along == "m", rows_per_m)  # (cluster units, blocks, paired, size)
    n_side = (grid_n, num_n, pair_along == "n", cols_per_n)
    out, done = [], {}
    for raster, group in walks:
        grouped, walked = (m_side, n_side) if raster == "m" else (n_side, m_side)
        key = raster, min(group, grouped[0])  # groups of all the grouped units walk alike
        if key not in done:
            done[key] = _walk_footprint(grouped, walked, group, slots, total, waves) / max(1, waves)
        out.append(done[key])
    return np.array(out)


def _walk_footprint(grouped: tuple, walked: tuple, group: int, slots: int, total: int, waves: int) -> int:
    """The working sets of the first `waves` waves of one walk, summed (see `raster_footprints`).

    `grouped` is the side the raster groups (m for raster "m") and `walked` the other, each
    (cluster units, blocks, paired, rows or columns per block). Cluster unit t of the walk is in
    group t // (group * walked units), at position p of it: grouped unit group * g + p % rows,
    walked unit p // rows, where rows = the group's grouped units (the last group may have
    fewer). A wave's units along the grouped side are one interval, or two when it wraps inside
    one group; along the walked side they are the columns (raster "m") of its first and last
    positions, or, past one group, from the first's to the end and from 0 to the last's (all of
    them when a whole group lies between). Units are blocks, or pairs of blocks (the last one
    clipped to the last block, as `tile_order` reports a peer past the edge).
    """
    g_units, g_blocks, g_paired, g_size = grouped
    w_units, w_blocks, w_paired, w_size = walked
    per_group = group * w_units
    last_block = g_blocks - 1
    acc = 0
    # (The minima below are conditional expressions: the builtin min costs several times more,
    # a sizeable part of a first selection.)
    for start in range(0, waves * slots, slots):
        last = (start + slots if start + slots < total else total) - 1
        g0, g1 = start // per_group, last // per_group
        p0, p1 = start - g0 * per_group, last - g1 * per_group
        base0 = g0 * group
        r0 = group if group < g_units - base0 else g_units - base0  # grouped units of the first position's group
        c0 = p0 // r0
        # Grouped side: the units lo..hi, and lo2..hi2 when the wave wraps inside a group (else
        # none: lo2 > hi2).
        lo2, hi2 = 0, -1
        if g0 == g1:
            c1 = p1 // r0
            if p1 - p0 + 1 >= r0:
                lo, hi = base0, base0 + r0 - 1
            else:
                lo, hi = base0 + p0 - c0 * r0, base0 + p1 - c1 * r0
                if lo > hi:  # wraps: to the group's end, then from its start
                    lo2, hi2, hi = base0, hi, base0 + r0 - 1
            if w_paired:  # columns c0..c1
                walked_n = (2 * c1 + 1 if 2 * c1 + 1 < w_blocks - 1 else w_blocks - 1) - 2 * c0 + 1
            else:
                walked_n = c1 - c0 + 1
        else:
            base1 = g1 * group
            r1 = group if group < g_units - base1 else g_units - base1
            c1 = p1 // r1
            lo = base0 if r0 * w_units - p0 >= r0 else base0 + p0 - c0 * r0
            hi = base1 + r1 - 1 if p1 + 1 >= r1 else base1 + p1 - c1 * r1
            if g1 - g0 >= 2 or c1 >= c0 - 1:
                walked_n = w_blocks  # every column
            elif w_paired:  # columns c0.. and ..c1
                walked_n = (w_blocks - 1 - 2 * c0 + 1) + (
                    (2 * c1 + 1 if 2 * c1 + 1 < w_blocks - 1 else w_blocks - 1) + 1
                )
            else:
                walked_n = (w_units - c0) + (c1 + 1)
        if g_paired:
            hi_block = 2 * hi + 1 if 2 * hi + 1 < last_block else last_block
            hi2_block = 2 * hi2 + 1 if 2 * hi2 + 1 < last_block else last_block
            grouped_n = hi_block - 2 * lo + hi2_block - 2 * lo2 + 2
        else:
            grouped_n = hi - lo + hi2 - lo2 + 2
        acc += grouped_n * g_size + walked_n * w_size
    return acc


def raster_footprint(
    num_m: int,
    num_n: int,
    rows_per_m: int,
    cols_per_n: int,
    slots: int,
    raster: str,
    group: int,
    pair_along: str | None = None,
    max_waves: int = 16,
) -> float:
    """The footprint (see `raster_footprints`) of one walk."""
    walks = [(raster, group)]
    return float(raster_footprints(num_m, num_n, rows_per_m, cols_per_n, slots, walks, pair_along, max_waves)[0])


# Raster groups `choose_raster` tries: this many cluster-rows or cluster-columns.
GROUP_SIZES = (8, 16)


@functools.lru_cache(maxsize=4096)
def choose_raster(
    num_m: int, num_n: int, rows_per_m: int, cols_per_n: int, slots: int, pair_along: str | None = None
) -> tuple[str, int, float]:
    """(raster, group_size, footprint): the walk with the smallest L2 working set.

    Groups of 8 or 16 along M or N are tried. Ties go to grouping along the pair's dimension
    (N for pairs along N, else M, as DeepGEMM groups), then to the smaller group.
    """
    preferred = ("n", "m") if pair_along == "n" else ("m", "n")
    walks = [(raster, group) for raster in preferred for group in GROUP_SIZES]
    if cluster_tiles(num_m, num_n, pair_along) <= max(1, slots):
        # One wave holds every tile, whatever the walk: the first walk, the whole grid's working set.
        return walks[0][0], walks[0][1], float(num_m * rows_per_m + num_n * cols_per_n)
    footprints = raster_footprints(num_m, num_n, rows_per_m, cols_per_n, slots, walks, pair_along)
    best = int(np.argmin(footprints))  # the first of equal footprints
    return walks[best][0], walks[best][1], float(footprints[best])
