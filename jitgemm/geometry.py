"""Launch geometry, defined once: kernel coordinates, tile counts, 2-CTA pairs, K splits, the
persistent grid. The heuristics, the launch and the tests read these; the templates walk the
same tiles (their scheduler: `tile_of` in each template).

A problem D[M, N] runs in kernel coordinates (M, N), or (N, M) under `swap_ab` (D^T = B^T A^T).
A 2-CTA cluster takes a pair of tiles that share one operand tile; a "work unit" is one K split
of one cluster tile (a tile, or a pair); the grid is persistent: at most one CTA per SM, each
walking work units.
"""
from __future__ import annotations

from .config import KernelConfig


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def kernel_shape(cfg: KernelConfig, m: int, n: int) -> tuple[int, int]:
    """(kernel M, kernel N) of a user problem with D of shape (m, n)."""
    return (n, m) if cfg.swap_ab else (m, n)


def cluster_tiles(tiles_m: int, tiles_n: int, pair_along: str | None) -> int:
    """Work items of one K split: tiles, or pairs of neighbouring tiles along kernel 'm' or 'n'
    (an odd last one a pair by itself)."""
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
