"""Rules every arch's selection shares: config construction and the checks every arch makes
(each arch adds its own), and the stage arithmetic and pipeline-depth rule.

- Configs and checks: `PROBLEM_FIELDS`, `with_fields`, `base_config`, `field_mismatches`,
  `shape_problems`, `config_problems`.
- Stages: `max_stages`, `with_stages`, `stage_rule`, and the constants `MAX_STAGES`, `MIN_STAGES`,
  `MIN_STAGES_SMALL_TILE`, `SMALL_TILE_ELEMS`.

Arch-specific knowledge (the shared-memory formula, the layout, structural rules) comes in as
parameters from the per-arch modules; kernel coordinates are jitgemm.geometry's.
"""

from __future__ import annotations

from collections.abc import Callable

from jitgemm.config import K_BLOCK_BYTES, KernelConfig
from jitgemm.geometry import ceil_div, kernel_shape
from jitgemm.problem import DTYPE_BYTES, Problem

from .device import DeviceSpec

# Fields a config always takes from the problem, never from a tile choice or a forced config.
PROBLEM_FIELDS = ("dtype", "out_dtype", "a_major", "b_major", "has_c")
# Fields that make another tile: a JITGEMM_CONFIG override that gives one re-derives the stages,
# the split and the raster (each arch's `config_with_fields`).
TILE_FIELDS = ("block_m", "block_n", "num_consumers", "cluster_size", "multicast", "out_dtype", "swap_ab")


def with_fields(cfg: KernelConfig, **changes) -> KernelConfig:
    """`cfg` with the fields in `changes` replaced, validated again as KernelConfig's constructor
    validates (its `__post_init__`; copied with `derived`: a few times cheaper than building it
    field by field, which a first selection pays for its choice)."""
    out = cfg.derived(**changes)
    out.__post_init__()
    return out


def base_config(problem: Problem, device: DeviceSpec, **tile) -> KernelConfig:
    """The config of `problem` on `device` with the tile fields in `tile` (block_m, block_n,
    num_consumers, cluster_size, multicast, swap_ab...): the device's arch, the problem's
    dtypes, majors and C, block_k = 128 bytes of K, and 2 pipeline stages (see `with_stages`)."""
    return KernelConfig(
        arch=device.arch,
        dtype=problem.dtype,
        out_dtype=problem.out_dtype,
        a_major=problem.a_major,
        b_major=problem.b_major,
        has_c=problem.has_c,
        block_k=K_BLOCK_BYTES // DTYPE_BYTES[problem.dtype],
        num_stages=2,
        **tile,
    )


def field_mismatches(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> list[str]:
    """Where `cfg` does not belong to `problem` on `device`: its arch, then PROBLEM_FIELDS."""
    out = []
    if cfg.arch != device.arch:
        out.append(f"arch is {cfg.arch!r} but the device is {device.arch!r}")
    for name in PROBLEM_FIELDS:
        want, got = getattr(problem, name), getattr(cfg, name)
        if want != got:
            out.append(f"{name} is {got!r} but the problem has {want!r}")
    return out


INT32_MAX = (1 << 31) - 1  # the templates count work units and tile indices in int


def shape_problems(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> list[str]:
    """Where `cfg`'s tiling does not fit `problem`'s shape, in words: a_rows short of the rows
    the kernel stores, and 32-bit tile arithmetic that would wrap (the templates count work
    units, tiles x splits, in int and step past the last by the grid, and a raster group spans
    group_size rows or columns of tiles). Problem's size limits keep the tilings the heuristics
    choose clear of the latter; forced configs (a huge split_k or group_size) are not."""
    out = []
    km, kn = kernel_shape(cfg, problem.m, problem.n)
    if cfg.a_rows and km > cfg.a_rows:
        out.append(
            f"a_rows={cfg.a_rows} loads only that many rows of A per tile, but M={km} needs every "
            f"row of its tiles (a_rows is for M <= a_rows: one m block)"
        )
    num_m, num_n = ceil_div(km, cfg.block_m), ceil_div(kn, cfg.block_n)
    if num_m * num_n * cfg.split_k + device.num_sms > INT32_MAX:
        out.append(
            f"{num_m} x {num_n} tiles x {cfg.split_k} splits overflow the kernel's 32-bit work "
            f"unit count (use larger tiles)"
        )
    if cfg.group_size * max(num_m, num_n) > INT32_MAX:
        out.append(
            f"a raster group of {cfg.group_size} x {max(num_m, num_n)} tiles overflows the "
            f"kernel's 32-bit tile index (use larger tiles or a smaller group_size)"
        )
    return out


def config_problems(
    cfg: KernelConfig,
    problem: Problem,
    device: DeviceSpec,
    structural: Callable[[KernelConfig], list[str]],
    layout_of_cfg: Callable,
    arch_rules: Callable[[KernelConfig], list[str]] | None = None,
) -> list[str]:
    """The checks of every arch's `check_config`, in words (empty when `cfg` can run): the
    field mismatches, the fit of the tiling to the shape (`shape_problems`), the arch's structural rules (`structural(cfg)`, its layout module's
    structural_problems), the arch's own rules (`arch_rules(cfg)`), and, for a structurally sound
    config, the shared memory of its layout (`layout_of_cfg(cfg)`) against the device's.
    """
    out = field_mismatches(cfg, problem, device) + shape_problems(cfg, problem, device)
    found = structural(cfg)
    out.extend(found)
    if arch_rules is not None:
        out.extend(arch_rules(cfg))
    if not found:
        lay = layout_of_cfg(cfg)
        if lay.smem_bytes > device.smem_capacity:
            out.append(
                f"needs {lay.smem_bytes} bytes of shared memory ({cfg.num_stages} stages x "
                f"{lay.stage_bytes} + {lay.out_bytes} output staging + barriers), more than "
                f"the {device.smem_capacity} of {device.arch}"
            )
    return out


# Pipeline depth (see `stage_rule`).
MAX_STAGES = 16  # pipeline depth cap (KernelConfig accepts 2..16)
MIN_STAGES = 3  # fewer cannot hide TMA latency
MIN_STAGES_SMALL_TILE = 4  # ... and small tiles run through stages faster
SMALL_TILE_ELEMS = 128 * 192


def max_stages(
    cfg: KernelConfig, capacity: int, cap: int = MAX_STAGES, *, smem_of: Callable[[KernelConfig, int], int]
) -> int:
    """Most pipeline stages (2..`cap`) for which `cfg` fits `capacity` bytes of shared memory, or
    0 when not even 2 stages fit. `cfg.num_stages` is ignored.

    `smem_of(cfg, stages) -> bytes` is the arch's shared-memory formula (e.g. its layout's
    smem_bytes with that many stages, see `at_stages`). It must grow with the stage count; the
    answer is solved from the per-stage slope and then checked, so it costs a handful of calls,
    not one per stage count.
    `cap` must stay within the stage range KernelConfig accepts (2..16).
    """

    def smem(stages: int) -> int:
        return smem_of(cfg, stages)

    base = smem(2)
    if base > capacity:
        return 0
    if cap <= 2:
        return 2
    slope = max(1, smem(3) - base)
    best = min(cap, 2 + (capacity - base) // slope)
    while best > 2 and smem(best) > capacity:  # guard against a non-affine formula
        best -= 1
    while best < cap and smem(best + 1) <= capacity:
        best += 1
    return best


def stage_rule(block_m: int, block_n: int, stages: int) -> str | None:
    """The pipeline-depth rule: why `stages` is too shallow for a block_m x block_n tile, or None.

    At least 3 stages to hide TMA latency; at least 4 for tiles smaller than 128x192, whose
    k-blocks go by faster (DeepGEMM's rule).
    """
    if stages < MIN_STAGES:
        return f"only {stages} pipeline stage(s) fit shared memory (need >= {MIN_STAGES})"
    if block_m * block_n < SMALL_TILE_ELEMS and stages < MIN_STAGES_SMALL_TILE:
        return (
            f"only {stages} pipeline stages fit shared memory; tiles smaller than 128x192 "
            f"need >= {MIN_STAGES_SMALL_TILE}"
        )
    return None


def at_stages(smem_of: Callable[[KernelConfig], int]) -> Callable[[KernelConfig, int], int]:
    """A `max_stages` formula from `smem_of(cfg)`, a formula that reads the stage count from the config."""
    return lambda cfg, stages: smem_of(cfg.derived(num_stages=stages))  # (max_stages keeps 2..16)


def with_stages(
    cfg: KernelConfig, device: DeviceSpec, smem_of: Callable[[KernelConfig, int], int]
) -> tuple[KernelConfig, int]:
    """(`cfg` with as many pipeline stages as fit the device's shared memory (capped at
    MAX_STAGES; at least 2), the count that fits (0 when not even 2 do)). `smem_of`: the
    arch's shared-memory formula, as for `max_stages`."""
    stages = max_stages(cfg, device.smem_capacity, MAX_STAGES, smem_of=smem_of)
    return cfg.derived(num_stages=max(2, stages)), stages  # (max_stages keeps 2..MAX_STAGES)
