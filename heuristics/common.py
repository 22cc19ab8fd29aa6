"""Arch-independent pieces of kernel selection, shared by `sm90` and `sm100`.

Everything here is pure Python and deterministic (no dict/set ordering, no hashing, no clocks).
The names below are a stable interface for the per-arch modules:

- `DeviceSpec`: what selection knows about a GPU (arch, SM count) and the per-arch rates the
  cost models use (`device.rates`).
- Stage arithmetic: `max_stages`, `stage_rule`, and the constants `MAX_STAGES`, `MIN_STAGES`,
  `MIN_STAGES_SMALL_TILE`, `SMALL_TILE_ELEMS`.
- Wave quantisation: `Waves`, `waves_of`.
- L2 raster: `tile_order`, `raster_footprint`, `choose_raster` (the tile walk of the templates'
  persistent scheduler, groups of block-rows or block-columns, optionally 2-CTA clusters).
- Operand traffic: `covered_extent` (how much of a dimension the TMA boxes of all blocks read),
  `dram_clk_per_byte` (per-CTA DRAM streaming rate with `a` CTAs streaming),
  `dram_run_efficiency` (DRAM efficiency of the contiguous runs TMA boxes read).
- Ranking and reporting: `Candidate`, `Rejection`, `rank`, `best`, `explanation`,
  `problem_dict`, `device_dict`, `describe_layout`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

from jitgemm.config import KernelConfig
from jitgemm.layout import SMEM_CAPACITY, layout_of
from jitgemm.problem import Problem

# ----------------------------------------------------------------------------- device


@dataclass(frozen=True)
class ArchRates:
    """Per-SM, per-clock rates of one architecture, used to *compare* candidates.

    The cost is in modelled clock cycles at `clock_ghz` (the sustained SM clock under a GEMM
    load); measured bandwidths are converted to bytes per clock at that clock. Defaults are
    H200 numbers for 16-bit inputs, calibrated against H200 measurements (bf16, graph-replayed):

    - `mma_flops_per_clk` 3200: sustained wgmma rate, 78% of the 4096 peak (the clock drops under
      a full tensor-core load). 4096^3 (m128n256 pairs) then models 194 us, in line with its
      measured parity with cuBLAS at the usual 700-750 TFLOP/s (at 4096: 152 us, 900 TFLOP/s),
      and 4096x2112x7168 (m128n176 A pairs, measured 1.06x cuBLAS) 181 us.
    - `l2_total_bytes_per_clk` 4500: about 7.9 TB/s of L2 -> SM reads chip-wide, which keeps
      4096x2112x7168 just L2 bound (32 KB of L2 reads per CTA and k-block). 4096x576x7168 with
      m128n176 (one wave of 128 CTAs, 521 MB out of L2) models 66.6 us against the measured
      83.5 us (-20%; the former constants gave 43-49 us); fitting it exactly (~3600) would make
      4096x2112x7168 and 128x7168x16384 20-25% too slow.
    - `hbm_bytes_per_clk` 2400: the measured device-to-device copy bandwidth, 4.2 TB/s.
    - `cta_dram_bytes_per_clk` 40: about 70 GB/s, what one CTA streaming alone can pull from
      DRAM (one TMA producer with a few stages in flight against a loaded DRAM latency of 1-2
      us; the middle of the 60-80 GB/s measured). With the copy bandwidth it gives the per-CTA
      DRAM rate when `a` CTAs stream: 1 / (1/cta + a * q), q chosen so that all SMs streaming
      get exactly the copy bandwidth (see `dram_clk_per_byte`).
    - `dram_run_overhead_bytes` 32: DRAM streams contiguous runs at run / (run + 32) of the copy
      bandwidth (row activations and sector granularity are paid per run, not per byte). TMA
      reads one run per row of a box: 128 bytes for a K-major operand, the whole tile width of
      an MN-major one. Set so that 128-byte runs stream at 80%, which puts 1x7168x2048 (m64n64,
      112 CTAs, N-major B: 0.79x cuBLAS, ~66% of the copy bandwidth) within ~10% of its
      measurement.
    """
    mma_flops_per_clk: int = 3200        # dense 16-bit tensor-core FLOPs per SM per clock, sustained
    smem_bytes_per_clk: int = 128        # shared-memory bandwidth per SM
    l2_sm_bytes_per_clk: int = 64        # L2 -> one SM ingress
    l2_total_bytes_per_clk: int = 4500   # L2 -> all SMs (7.9 TB/s at 1.75 GHz, calibrated, see above)
    hbm_bytes_per_clk: int = 2400        # DRAM copy bandwidth (H200: 4.2 TB/s at 1.75 GHz)
    cta_dram_bytes_per_clk: int = 40     # DRAM -> one CTA streaming alone (70 GB/s at 1.75 GHz)
    dram_run_overhead_bytes: int = 32    # DRAM efficiency of a contiguous run: run / (run + this)
    load_latency_clk: int = 1000         # TMA load round trip the pipeline must cover
    clock_ghz: float = 1.75              # sustained SM clock the per-clock rates are quoted at


ARCH_RATES = {"sm_90a": ArchRates(), "sm_100a": ArchRates(mma_flops_per_clk=8192, l2_total_bytes_per_clk=8192,
                                                            hbm_bytes_per_clk=4000)}


def dram_clk_per_byte(rates: ArchRates, num_sms: int, active: int) -> float:
    """Clock cycles one CTA spends per byte it streams from DRAM while `active` CTAs stream.

    Two limits in series: what a CTA alone can pull (`cta_dram_bytes_per_clk`) and DRAM
    queueing, which grows with the number of streams: 1/cta + active * q. q is set so that
    `num_sms` streams together get the copy bandwidth (num_sms / hbm per byte and CTA); with
    fewer streams each gets more, up to the per-CTA limit, and the chip gets less than the copy
    bandwidth: that is the credit for spreading a memory-bound problem over more SMs.
    """
    per_cta = 1.0 / rates.cta_dram_bytes_per_clk
    q = max(0.0, 1.0 / rates.hbm_bytes_per_clk - per_cta / max(1, num_sms))
    return per_cta + max(1, active) * q


def dram_run_efficiency(rates: ArchRates, run_bytes: float) -> float:
    """Fraction of the copy bandwidth DRAM delivers to a stream of `run_bytes` contiguous runs."""
    return run_bytes / (run_bytes + rates.dram_run_overhead_bytes)


@dataclass(frozen=True)
class DeviceSpec:
    """What selection needs to know about a GPU; built from a live device or from CLI flags."""
    arch: str = "sm_90a"
    num_sms: int = 132

    def __post_init__(self):
        # The arch is checked by `select` (which names the supported ones), not here.
        if not isinstance(self.num_sms, int) or self.num_sms < 1:
            raise ValueError(f"DeviceSpec.num_sms must be a positive int, got {self.num_sms!r}")

    @property
    def smem_capacity(self) -> int:
        """Dynamic shared memory one CTA may request (bytes)."""
        if self.arch not in SMEM_CAPACITY:
            raise ValueError(f"unknown arch {self.arch!r}; known: {sorted(SMEM_CAPACITY)}")
        return SMEM_CAPACITY[self.arch]

    @property
    def rates(self) -> ArchRates:
        return ARCH_RATES.get(self.arch, ArchRates())


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


# ----------------------------------------------------------------------------- stages

MAX_STAGES = 16             # pipeline depth cap (KernelConfig accepts 2..16)
MIN_STAGES = 3              # fewer cannot hide TMA latency
MIN_STAGES_SMALL_TILE = 4   # ... and small tiles run through stages faster
SMALL_TILE_ELEMS = 128 * 192


def _smem_bytes(cfg: KernelConfig) -> int:
    return layout_of(cfg).smem_bytes


def max_stages(cfg: KernelConfig, capacity: int, cap: int = MAX_STAGES,
               smem_of: Callable[[KernelConfig], int] | None = None) -> int:
    """Most pipeline stages (2..`cap`) for which `cfg` fits `capacity` bytes of shared memory, or
    0 when not even 2 stages fit. `cfg.num_stages` is ignored.

    `smem_of(cfg) -> bytes` is the arch's shared-memory formula (default: the sm_90a layout,
    `layout_of(cfg).smem_bytes`). It must grow with `num_stages`; the answer is solved from the
    per-stage slope and then checked, so it costs a handful of calls, not one per stage count.
    `cap` must stay within the stage range KernelConfig accepts (2..16).
    """
    smem_of = smem_of or _smem_bytes

    def smem(stages: int) -> int:
        return smem_of(KernelConfig(**{**cfg.to_dict(), "num_stages": stages}))

    base = smem(2)
    if base > capacity:
        return 0
    if cap <= 2:
        return 2
    slope = max(1, smem(3) - base)
    best = min(cap, 2 + (capacity - base) // slope)
    while best > 2 and smem(best) > capacity:       # guard against a non-affine formula
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
        return (f"only {stages} pipeline stages fit shared memory; tiles smaller than 128x192 "
                f"need >= {MIN_STAGES_SMALL_TILE}")
    return None


# ----------------------------------------------------------------------------- waves


@dataclass(frozen=True)
class Waves:
    """Wave quantisation of `tiles` equal work items over `slots` concurrent workers."""
    tiles: int
    slots: int
    waves: int              # ceil(tiles / slots)
    last_wave_tiles: int    # tiles in the last wave (== slots when it is full)

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


# ----------------------------------------------------------------------------- raster

RASTERS = ("m", "n")
GROUP_SIZES = (8, 16)


def tile_order(num_m: int, num_n: int, raster: str, group: int, pair: str = "none"):
    """Yield, in launch order, the (m_block, n_block) pairs of each *cluster tile*.

    Mirrors the persistent scheduler of the templates: with `pair` "A" the two CTAs of a cluster
    take neighbouring n blocks of one m block (they share the A tile), with "B" neighbouring m
    blocks of one n block; cluster tiles are walked in groups of `group` cluster-rows
    (raster "m") or cluster-columns (raster "n"). A peer past the edge recomputes the last block,
    so it is reported as that block (what it loads). Each item is a tuple of 1 or 2 (m, n).
    """
    grid_m = ceil_div(num_m, 2) if pair == "B" else num_m
    grid_n = ceil_div(num_n, 2) if pair == "A" else num_n
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
        if pair == "A":
            yield tuple((cm, min(2 * cn + r, num_n - 1)) for r in (0, 1))
        elif pair == "B":
            yield tuple((min(2 * cm + r, num_m - 1), cn) for r in (0, 1))
        else:
            yield ((cm, cn),)


def raster_footprint(num_m: int, num_n: int, rows_per_m: int, cols_per_n: int, slots: int,
                     raster: str, group: int, pair: str = "none", max_waves: int = 16) -> float:
    """Mean L2 working set of one k-block, in operand rows+columns, over the waves of a walk.

    A wave is `slots` consecutive cluster tiles (the ones the persistent CTAs hold at once). Its
    working set is (distinct m blocks) * rows_per_m + (distinct n blocks) * cols_per_n; multiply by
    the bytes of one K slice to get bytes. Only the first `max_waves` waves are walked.
    """
    slots = max(1, slots)
    sizes = []
    ms: set = set()
    ns: set = set()
    for t, item in enumerate(tile_order(num_m, num_n, raster, group, pair)):
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


def choose_raster(num_m: int, num_n: int, rows_per_m: int, cols_per_n: int, slots: int,
                  pair: str = "none") -> tuple[str, int, float]:
    """(raster, group_size, footprint): the walk with the smallest L2 working set.

    Groups of 8 or 16 along M or N are tried. Ties go to grouping along the multicast pair's
    side (N for pair "A", else M, as DeepGEMM groups), then to the smaller group.
    """
    preferred = ("n", "m") if pair == "A" else ("m", "n")
    best = None
    for raster in preferred:
        for group in GROUP_SIZES:
            fp = raster_footprint(num_m, num_n, rows_per_m, cols_per_n, slots, raster, group, pair)
            if best is None or fp < best[2]:
                best = (raster, group, fp)
    return best


# ----------------------------------------------------------------------------- traffic


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


# ----------------------------------------------------------------------------- ranking


@dataclass
class Candidate:
    """A legal configuration with its modelled cost.

    `cost` is the modelled time (clock cycles) and the primary key; `key` holds the rest of the
    deterministic order (lower is better), ending in the config name so no two candidates tie.
    `terms` are the cost-model quantities reported by `explain` (JSON-serialisable scalars).
    """
    config: KernelConfig
    cost: float
    key: tuple = ()
    terms: dict = field(default_factory=dict)

    def sort_key(self) -> tuple:
        return (self.cost,) + tuple(self.key) + (self.config.name,)

    def to_dict(self) -> dict:
        out = {"config": self.config.to_dict(), "name": self.config.name, "cost": self.cost}
        out.update(self.terms)
        return out


@dataclass(frozen=True)
class Rejection:
    """A candidate removed by a rule: a short description of it and the rule, in words."""
    config: str
    rule: str

    def to_dict(self) -> dict:
        return {"config": self.config, "rule": self.rule}


def rank(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Candidates best first, by `Candidate.sort_key` (total and deterministic)."""
    return sorted(candidates, key=Candidate.sort_key)


def best(candidates: Sequence[Candidate]) -> Candidate:
    if not candidates:
        raise ValueError("no legal kernel configuration")
    return min(candidates, key=Candidate.sort_key)


def describe_layout(block_m: int, block_n: int, cluster_size: int = 1, multicast: str = "none",
                    **extra) -> str:
    """Short text for a tile layout, e.g. 'm128n208 cluster2 multicast A'."""
    text = f"m{block_m}n{block_n}"
    if cluster_size > 1:
        text += f" cluster{cluster_size} multicast {multicast}"
    for k in sorted(extra):
        text += f" {k}={extra[k]}"
    return text


def problem_dict(problem: Problem) -> dict:
    out = asdict(problem)
    out["layout"] = problem.layout
    return out


def device_dict(device: DeviceSpec) -> dict:
    return {"arch": device.arch, "num_sms": device.num_sms, "smem_capacity": device.smem_capacity}


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def explanation(problem: Problem, device: DeviceSpec, chosen: KernelConfig,
                ranked: Sequence[Candidate], rejected: Sequence[Rejection], top: int = 5,
                **extra) -> dict:
    """The JSON-serialisable answer of `explain`: problem, device, chosen config, the best `top`
    candidates (ranked best first) with their cost terms, and the rejections with their rules."""
    out = {
        "problem": problem_dict(problem),
        "device": device_dict(device),
        "chosen": chosen.to_dict(),
        "candidates": [c.to_dict() for c in list(ranked)[:max(0, top)]],
        "rejected": [r.to_dict() for r in rejected],
    }
    out.update(extra)
    return _jsonable(out)
