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

from dataclasses import dataclass

from .config import KernelConfig


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def kernel_shape(cfg: KernelConfig, m: int, n: int) -> tuple[int, int]:
    """(kernel M, kernel N) of a user problem with D of shape (m, n)."""
    return (n, m) if cfg.swap_ab else (m, n)


def cluster_tiles(tiles_m: int, tiles_n: int, pair_along: str | None) -> int:
    """Work items of one K split: tiles, or pairs of neighbouring tiles along kernel 'm' or 'n'
    (an odd last one a pair by itself); the scheduler's `num_cluster_tiles`."""
    if pair_along == "m":
        tiles_m = ceil_div(tiles_m, 2)
    elif pair_along == "n":
        tiles_n = ceil_div(tiles_n, 2)
    return tiles_m * tiles_n


def num_splits(cfg: KernelConfig, k: int) -> int:
    """K splits actually used: at most one per K block, so no split is empty."""
    return max(1, min(cfg.split_k, ceil_div(k, cfg.block_k)))


def persistent_grid(units: int, cluster_size: int, num_sms: int) -> int:
    """CTAs to launch for `units` work units: at most one per SM, a multiple of the cluster size."""
    return min(units, num_sms // cluster_size) * cluster_size


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def covered_extent(size: int, block: int, box: int) -> int:
    """Elements of one dimension read by all blocks together, when block i (origin i*block)
    loads `box` >= `block` elements clipped at `size` (TMA does not fetch out-of-bounds
    elements). With box == block this is `size`; a wider box (MN-major pieces wider than the
    block, e.g. 3 x 64 for a block of 176) re-reads part of the neighbouring block.
    """
    nblocks = ceil_div(size, block)
    if box <= block:
        return size
    # Blocks whose whole box is inside: j * block + box <= size.
    full = 0 if size < box else min(nblocks, (size - box) // block + 1)
    total = full * box
    for j in range(full, nblocks):
        total += min(box, size - j * block)
    return total


@dataclass(frozen=True)
class Waves:
    """Wave quantisation of `tiles` equal work items over `slots` concurrent workers."""

    tiles: int
    slots: int
    waves: int  # ceil(tiles / slots)
    last_wave_tiles: int  # tiles in the last wave (== slots when it is full)

    @property
    def last_wave_util(self) -> float:
        """Fraction of the workers busy in the last wave."""
        return self.last_wave_tiles / self.slots

    @property
    def efficiency(self) -> float:
        """tiles / (waves * slots): 1.0 when every wave is full."""
        return self.tiles / (self.waves * self.slots)


def waves_of(tiles: int, slots: int) -> Waves:
    """Waves of a persistent kernel with `slots` workers (CTAs or clusters) over `tiles` items."""
    slots = max(1, min(slots, tiles)) if tiles else max(1, slots)
    waves = ceil_div(tiles, slots) if tiles else 0
    last = tiles - (waves - 1) * slots if waves else 0
    return Waves(tiles, slots, waves, last)


# Raster groups `choose_raster` tries: this many cluster-rows or cluster-columns.
GROUP_SIZES = (8, 16)


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
    """Mean L2 working set of one k-block, in operand rows+columns, over the waves of a walk.

    A wave is `slots` consecutive cluster tiles (the ones the persistent CTAs hold at once). Its
    working set is (distinct m blocks) * rows_per_m + (distinct n blocks) * cols_per_n; multiply by
    the bytes of one K slice to get bytes. Only the first `max_waves` waves are walked.
    """
    slots = max(1, slots)
    sizes = []
    ms: set = set()
    ns: set = set()
    for t, item in enumerate(tile_order(num_m, num_n, raster, group, pair_along)):
        for m, n in item:
            ms.add(m)
            ns.add(n)
        if (t + 1) % slots == 0:
            sizes.append(len(ms) * rows_per_m + len(ns) * cols_per_n)
            ms, ns = set(), set()
            if len(sizes) >= max_waves:
                break
    if ms and len(sizes) < max_waves:
        sizes.append(len(ms) * rows_per_m + len(ns) * cols_per_n)
    return sum(sizes) / len(sizes) if sizes else 0.0


def choose_raster(
    num_m: int, num_n: int, rows_per_m: int, cols_per_n: int, slots: int, pair_along: str | None = None
) -> tuple[str, int, float]:
    """(raster, group_size, footprint): the walk with the smallest L2 working set.

    Groups of 8 or 16 along M or N are tried. Ties go to grouping along the pair's dimension
    (N for pairs along N, else M, as DeepGEMM groups), then to the smaller group.
    """
    preferred = ("n", "m") if pair_along == "n" else ("m", "n")
    options = [
        (raster, group, raster_footprint(num_m, num_n, rows_per_m, cols_per_n, slots, raster, group, pair_along))
        for raster in preferred
        for group in GROUP_SIZES
    ]
    return min(options, key=lambda option: option[2])  # the first of equal footprints
