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
  `dram_stream_clk` (a CTA's time per stage streaming from DRAM: latency over the stages in
  flight plus its share of the read bandwidth), `mma_rate` (the tensor-core rate with the
  clock credit of a partly busy chip),
  `dram_run_efficiency` (DRAM efficiency of the contiguous runs TMA boxes read), `Traffic`
  (what a whole tiling reads, as each arch's `traffic` counts it).
- Configs and checks: `PROBLEM_FIELDS`, `with_fields`, `base_config`, `with_stages`,
  `field_mismatches`, `config_problems` (the checks every arch makes; each arch adds its own).
- Cost-model pieces every arch's model is built from: `kblock_terms`, `wave_terms`,
  `epilogue_clk`, `output_bytes`, `persistent_cost`, `report_terms`.
- Search: `screen` (the rules every arch applies after its own: structure, pipeline depth),
  `search` (arch check, candidates, ranking), `select_best` and `explain_search` (the bodies
  of each arch's `select` and `explain`).
- Ranking and reporting: `Candidate`, `Rejection`, `rank`, `best`, `explanation`,
  `problem_dict`, `device_dict`, `describe_layout`, `slowest`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

from jitgemm import registry
from jitgemm.config import KernelConfig
from jitgemm.archs.sm90.layout import layout_of
from jitgemm.geometry import kernel_shape
from jitgemm.problem import DTYPE_BYTES, Problem

# ----------------------------------------------------------------------------- device


@dataclass(frozen=True)
class ArchRates:
    """Per-SM, per-clock rates of one architecture, used to *compare* candidates.

    The cost is in modelled clock cycles at `clock_ghz` (the sustained SM clock under a GEMM
    load); measured bandwidths are converted to bytes per clock at that clock. Defaults are
    H200 numbers for 16-bit inputs, calibrated against H200 measurements (bf16, A K-major, B
    N-major, 132 SMs; per-call medians of CUDA-graph replays rotating through input copies
    that defeat L2). Most rates below were fixed by measurements taken before kernels were
    launched with programmatic dependent launch (PDL), quoted with each rate; `launch_clk` was
    refitted for PDL, and `l2_delivery_bytes_per_clk` and `load_latency_clk` were fixed with
    it. The model is checked against the PDL-era measurements in
    tests/test_heuristics.py::H200_MEASURED, which also lists where it still misranks:

    - `mma_flops_per_clk` 3200: sustained wgmma rate with every SM busy, 78% of the 4096 peak
      (the clock drops under a full tensor-core load). 4096^3 (m128n256 pairs) then models
      196 us against 190-194 measured, 4096x2112x7168 (m128n176 A pairs) 184 against 179-184.
    - `mma_peak_flops_per_clk` 4096: the rate when few SMs are busy (the chip stays under its
      power limit, the clock stays up): see `mma_rate`, rate = min(peak, 3200 x SMs / busy).
      Fixed by 4096x576x7168: the unsplit m128n192 (96 CTAs, one wave) runs in 54.6 us, 12%
      faster than 3200 FLOPs/clock allow (62.9 us of tensor-core time alone).
    - `l2_sm_bytes_per_clk` 96: L2 -> one SM. Fixed by 128x2112x7168 with m128n64 unsplit (33
      CTAs, 24 KB per k-block each: 23.1 us measured needs >= 74) and by m128n128 split 4
      ranking ahead of m64n128 on 128x4096x7168 (28.0 us measured; 80 would flip it). With
      PDL the unsplit m64n128 measures 22.9 us there and m64n128 pairs sharing B split 2
      21.7 (the choice now, see sm90.single_wave_rule); the former choice 25.2.
    - `l2_total_bytes_per_clk` 4500: about 7.9 TB/s of L2 -> SM reads chip-wide, which keeps
      4096x2112x7168 just L2 bound (32 KB of L2 reads per CTA and k-block) and puts
      4096x576x7168 m128n192 (96 CTAs x 40 KB a k-block) at 58.9 us against the measured 54.6,
      the m128n144/n160 A pairs at 59.8/57.0 against 60.3/61.1. (The unsplit m64n64 on
      128x4096x7168, measured 24.5 us, would need ~6000: it models 32.7.)
    - `l2_delivery_bytes_per_clk` 5000: the bytes landing in all SMs' shared memory, 8.75 TB/s,
      counting a multicast box once per CTA it lands in and an N-major B tile's 64-column
      pieces in full (a 224-wide tile lands 256 columns). Fixed by the wide tiles of the large
      shapes (medians of three interleaved passes, with the split-0 reducer): 4096x32768x512
      ran 244 us with m128n256 pairs sharing B against 263 for m128n224 pairs and 259 for
      m128n192 A pairs, 4096x24576x1536 478 with m128n256 B pairs against 499 for m128n240; a
      rate low enough to make those wider pieces cost, high enough that 4096^3 (m128n256
      pairs: 48 KB landing per CTA and k-block) stays tensor-core bound as measured.
    - `l2_shared_wave_gain` 1.5: both L2 -> SM terms above run this much faster in a "shared
      wave" (`sm90.shared_wave`): one wave of 128-row tiles over >= 16 m blocks, where every
      k-slab of B is read by that many CTAs at the same moment and each of A by the column
      blocks. Fixed by 4096x512x7168, m128n128 on 128 CTAs in 41.1 us (470 MB of L2 reads
      and deliveries: >= 6800 bytes a clock, where the multi-wave rates give 4500-5000), and
      4096x576x7168, 128x144 with a B tail in 55.3-56.0 unpaired and 52.4-53.3 as A pairs
      against 57.0-59.1 for 128x192 on 96 CTAs (bf16, medians of three interleaved passes).
    - `hbm_bytes_per_clk` 2400: the measured device-to-device copy bandwidth, 4.2 TB/s (the
      output and the split-K workspace go at this rate).
    - `dram_read_bytes_per_clk` 2550: read-only streaming, 4.46 TB/s, above the copy rate (no
      read/write turnarounds; 93% of the 4.8 TB/s peak). Fixed by 64x4096x7168 with m64n64
      (64 CTAs, 13 stages): 59.6 MB in 18.9 us end to end, which a stream at the copy rate
      plus the launch cannot reach.
    - `dram_latency_clk` 1000: the loaded DRAM round trip a CTA's stages must cover, 0.57 us.
      A CTA streaming from DRAM spends, per stage, this latency over the stages in flight plus
      its share of the read bandwidth (`dram_stream_clk`): per-CTA bytes in flight over the
      latency is the rate of a latency-bound stream. Fixed by the unsplit tiles of
      1x4096x7168 (22-43 CTAs, 6-8 stages: m64n128 29.5 us, m64n192 34.5, m64n96 36.3, m64n144
      38.4, modelled 27.5, 35.7, 31.7, 35.4) together with the deep m64n64 (13 stages) of 1x7168x2048 and
      64x4096x7168 (13.3 and 18.9 us; modelled 11.8 and 23.2: the latency makes the former too
      fast and the latter too slow, so it cannot go far either way).
    - `dram_run_overhead_bytes` 16: DRAM streams contiguous runs at run / (run + 16) of the
      bandwidth. A run is one row of one TMA box: 128 bytes K-major, a piece of the swizzle
      width MN-major (32-byte pieces stream at 67%, 64 at 80%, 128 at 89%). Fixed by the
      narrow N-major tiles of 128x576x7168: m64n48 (three 16-column pieces) 22.7 us unsplit
      against 16.8 for m64n32 and 16.7 for m64n64.
    - `load_latency_clk` 2000: the TMA round trip a tile's pipeline must cover under a full
      load (1.1 us at 1.75 GHz), so a k-block takes at least this over the stages in flight.
      Fixed by the pipeline depths of 4096^3 (bf16, medians of three interleaved passes):
      m128n128 B pairs ran 294 us with 3 stages against 208 with 4 and 206 with 5 (655 clocks
      of tensor-core time a k-block: 3 stages leave it latency bound, 4 just not); m128n256 B
      pairs 289 with 2 stages against 182 with 3; m128n192 A pairs 239 with 3 against 224 with 4.
    - `launch_clk` 2600: 1.5 us per launch: the kernel node of the graph, the CTAs' start
      (barriers, tensor-map prefetch), the first load's latency and the last tile's drain;
      constant per launch, so it shifts every candidate alike. Programmatic dependent launch
      overlaps part of it with the previous kernel: it was 4500 (2.6 us) without, fixed by
      the memory-bound small-M points (e.g. 128x32768x512 with m128n256 at the DRAM floor);
      with PDL those points run 1-3 us faster (128x4096x7168 m64n128: 23.2 us against 26.0).
    """
    mma_flops_per_clk: int = 3200        # dense 16-bit tensor-core FLOPs per SM per clock, all SMs busy
    mma_peak_flops_per_clk: int = 4096   # ... with few SMs busy (the clock credit, see mma_rate)
    smem_bytes_per_clk: int = 128        # shared-memory bandwidth per SM
    l2_sm_bytes_per_clk: int = 96        # L2 -> one SM ingress
    l2_total_bytes_per_clk: int = 4500   # L2 -> all SMs (7.9 TB/s at 1.75 GHz, calibrated, see above)
    l2_delivery_bytes_per_clk: int = 5000  # bytes landing in all SMs' shared memory (multicast counts per CTA)
    l2_shared_wave_gain: float = 1.5     # both L2 rates, in one wave of tiles sharing their operands
    hbm_bytes_per_clk: int = 2400        # DRAM copy bandwidth (H200: 4.2 TB/s at 1.75 GHz)
    dram_read_bytes_per_clk: int = 2550  # DRAM read-only streaming (4.46 TB/s)
    dram_latency_clk: int = 1000         # loaded DRAM round trip the stages in flight must cover
    dram_run_overhead_bytes: int = 16    # DRAM efficiency of a contiguous run: run / (run + this)
    load_latency_clk: int = 2000         # TMA load round trip under load the pipeline must cover
    launch_clk: int = 2600               # per launch: launch, ramp, first load, drain (1.5 us with PDL)
    clock_ghz: float = 1.75              # sustained SM clock the per-clock rates are quoted at


# sm_100a: placeholders until it is measured (sm100's model uses the tensor-core, shared-memory,
# L2 and latency rates; no clock credit; the ingress and run overhead the former sm_90a ones).
ARCH_RATES = {"sm_90a": ArchRates(),
              "sm_100a": ArchRates(mma_flops_per_clk=8192, mma_peak_flops_per_clk=8192, l2_sm_bytes_per_clk=64,
                                   l2_total_bytes_per_clk=8192, hbm_bytes_per_clk=4000,
                                   dram_read_bytes_per_clk=4000, dram_run_overhead_bytes=32,
                                   load_latency_clk=1000)}


def dram_stream_clk(rates: ArchRates, stages: int, bytes_per_stage: float, active: int) -> float:
    """Clock cycles one CTA spends per pipeline stage (k-block) streaming `bytes_per_stage` from
    DRAM while `active` CTAs stream.

    Two times in series: the loaded DRAM round trip over the stages the producer keeps in flight
    (`dram_latency_clk / (stages - 1)`: a CTA streaming alone is latency bound, so its rate is its
    bytes in flight over the latency), and the CTA's share of the read bandwidth (`active *
    bytes / dram_read_bytes_per_clk`: the queueing behind the other streams). More streaming CTAs
    get more of the bandwidth, deeper pipelines more per CTA.
    """
    latency = rates.dram_latency_clk / max(1, stages - 1) if bytes_per_stage > 0 else 0.0
    return latency + max(1, active) * bytes_per_stage / rates.dram_read_bytes_per_clk


def mma_rate(rates: ArchRates, num_sms: int, busy_ctas: int) -> float:
    """Sustained tensor-core FLOPs per SM and clock when a kernel keeps `busy_ctas` of the
    `num_sms` SMs busy: the clock drops under a full tensor-core load (power limit), so
    `mma_flops_per_clk` with every SM busy, more with fewer, in proportion (the same chip power),
    up to `mma_peak_flops_per_clk`."""
    busy = min(max(1, busy_ctas), num_sms)
    return min(float(rates.mma_peak_flops_per_clk), rates.mma_flops_per_clk * num_sms / busy)


def dram_run_efficiency(rates: ArchRates, run_bytes: float) -> float:
    """Fraction of the bandwidth DRAM delivers to a stream of `run_bytes` contiguous runs."""
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
        return registry.get(self.arch).smem_capacity

    @property
    def rates(self) -> ArchRates:
        return ARCH_RATES.get(self.arch, ArchRates())


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


# ----------------------------------------------------------------------------- configs

# Fields a config always takes from the problem, never from a tile choice or a forced config.
PROBLEM_FIELDS = ("dtype", "out_dtype", "a_major", "b_major", "has_c")


def with_fields(cfg: KernelConfig, **changes) -> KernelConfig:
    """`cfg` with the fields in `changes` replaced (validated again by KernelConfig)."""
    return KernelConfig(**{**cfg.to_dict(), **changes})


def base_config(problem: Problem, device: DeviceSpec, **tile) -> KernelConfig:
    """The config of `problem` on `device` with the tile fields in `tile` (block_m, block_n,
    num_consumers, cluster_size, multicast, swap_ab...): the device's arch, the problem's
    dtypes, majors and C, block_k = 128 bytes of K, and 2 pipeline stages (see `with_stages`)."""
    return KernelConfig(arch=device.arch, dtype=problem.dtype, out_dtype=problem.out_dtype,
                        a_major=problem.a_major, b_major=problem.b_major, has_c=problem.has_c,
                        block_k=128 // DTYPE_BYTES[problem.dtype], num_stages=2, **tile)


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


INT32_MAX = (1 << 31) - 1


def shape_problems(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> list[str]:
    """Where `cfg`'s tiling does not fit `problem`'s shape, in words: a_rows short of the rows
    the kernel stores, and 32-bit tile arithmetic that would wrap (the templates count work
    units, tiles x splits, in int and step past the last by the grid, and a raster group spans
    group_size rows or columns of tiles). Problem's size limits keep the tilings the heuristics
    choose clear of the latter; forced configs (a huge split_k or group_size) are not."""
    out = []
    km, kn = kernel_shape(cfg, problem.m, problem.n)
    if cfg.a_rows and km > cfg.a_rows:
        out.append(f"a_rows={cfg.a_rows} loads only that many rows of A per tile, but M={km} needs every "
                   f"row of its tiles (a_rows is for M <= a_rows: one m block)")
    num_m, num_n = ceil_div(km, cfg.block_m), ceil_div(kn, cfg.block_n)
    if num_m * num_n * cfg.split_k + device.num_sms > INT32_MAX:
        out.append(f"{num_m} x {num_n} tiles x {cfg.split_k} splits overflow the kernel's 32-bit work "
                   f"unit count (use larger tiles)")
    if cfg.group_size * max(num_m, num_n) > INT32_MAX:
        out.append(f"a raster group of {cfg.group_size} x {max(num_m, num_n)} tiles overflows the "
                   f"kernel's 32-bit tile index (use larger tiles or a smaller group_size)")
    return out


def config_problems(cfg: KernelConfig, problem: Problem, device: DeviceSpec,
                    structural: Callable[[KernelConfig], list[str]], layout_of_cfg: Callable,
                    arch_rules: Callable[[KernelConfig], list[str]] | None = None) -> list[str]:
    """The checks of every arch's `check_config`, in words (empty when `cfg` can run): the
    field mismatches, the fit of the tiling to the shape (`shape_problems`), the arch's
    structural rules (`structural(cfg)`, its layout module's structural_problems), the arch's
    own rules (`arch_rules(cfg)`), and, for a structurally sound config, the shared memory of
    its layout (`layout_of_cfg(cfg)`) against the device's.
    """
    out = field_mismatches(cfg, problem, device) + shape_problems(cfg, problem, device)
    found = structural(cfg)
    out.extend(found)
    if arch_rules is not None:
        out.extend(arch_rules(cfg))
    if not found:
        lay = layout_of_cfg(cfg)
        if lay.smem_bytes > device.smem_capacity:
            out.append(f"needs {lay.smem_bytes} bytes of shared memory ({cfg.num_stages} stages x "
                       f"{lay.stage_bytes} + {lay.out_bytes} output staging + barriers), more than "
                       f"the {device.smem_capacity} of {device.arch}")
    return out


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


def with_stages(cfg: KernelConfig, device: DeviceSpec,
                smem_of: Callable[[KernelConfig], int] | None = None) -> tuple[KernelConfig, int]:
    """(`cfg` with as many pipeline stages as fit the device's shared memory (capped at
    MAX_STAGES; at least 2), the count that fits (0 when not even 2 do)). `smem_of`: the
    arch's shared-memory formula, as for `max_stages`."""
    stages = max_stages(cfg, device.smem_capacity, MAX_STAGES, smem_of)
    return with_fields(cfg, num_stages=max(2, stages)), stages


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


@dataclass(frozen=True)
class Traffic:
    """Operand traffic of a whole problem for one tiling, in K-slices (x K x elem = bytes)."""
    cta_tiles: int        # tiles computed, including a pair's recomputed peer past the edge
    cluster_tiles: int    # work items of the persistent scheduler: tiles, or pairs of tiles
    l2_reads: int         # rows + columns read out of L2, all CTAs together (a shared operand once per pair)
    ingress: int          # rows + columns landing in shared memory, all CTAs together


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


# ----------------------------------------------------------------------------- cost pieces


def kblock_terms(rates: ArchRates, cfg: KernelConfig, tr: Traffic, slice_bytes: int,
                 smem_clk: float, mma_flops_per_clk: float | None = None) -> tuple[dict, float]:
    """(the per-k-block times of one CTA that do not depend on how many CTAs run, the bytes one
    CTA reads from L2 per k-block). The times, clock cycles: "mma" (tensor core on the tile),
    "smem" (the arch's shared-memory time, `smem_clk`), "l2_ingress" (the bytes landing in the
    CTA's shared memory over its L2 port) and "latency" (the TMA round trip over the pipeline
    depth). `slice_bytes`: one row or column of a k-block; `tr`: the tiling's traffic;
    `mma_flops_per_clk`: the tensor-core rate (default the rates', see `mma_rate`)."""
    ingress = tr.ingress * slice_bytes / tr.cta_tiles
    mma = mma_flops_per_clk or rates.mma_flops_per_clk
    terms = {"mma": 2 * cfg.block_m * cfg.block_n * cfg.block_k / mma,
             "smem": smem_clk,
             "l2_ingress": ingress / rates.l2_sm_bytes_per_clk,
             "latency": rates.load_latency_clk / max(1, cfg.num_stages - 1)}
    return terms, tr.l2_reads * slice_bytes / tr.cta_tiles


def wave_terms(rates: ArchRates, fixed: dict, l2_read: float, active_ctas: int, **more: float) -> tuple[dict, str]:
    """(the per-k-block times of one CTA while `active_ctas` CTAs run, the slowest of them): the
    `fixed` ones of `kblock_terms`, the CTA's share of the chip-wide L2 bandwidth ("l2") and the
    arch's `more`."""
    terms = {**fixed, "l2": active_ctas * l2_read / rates.l2_total_bytes_per_clk, **more}
    return terms, slowest(terms)


def epilogue_clk(rates: ArchRates, out_bytes: float, has_c: bool, fixed_clk: float, c_load_clk: float) -> float:
    """Clock cycles of writing `out_bytes` of output: staged through shared memory, plus the
    fixed cost; with C, the wait for its load and its bytes over the L2 port as well."""
    clk = out_bytes / rates.smem_bytes_per_clk + fixed_clk
    if has_c:
        clk += c_load_clk + out_bytes / rates.l2_sm_bytes_per_clk
    return clk


def output_bytes(problem: Problem) -> int:
    """DRAM bytes of the output: D written, and C read when the problem has one."""
    return problem.m * problem.n * DTYPE_BYTES[problem.out_dtype] * (2 if problem.has_c else 1)


def persistent_cost(w: Waves, cluster: int, wave_time: Callable[[int], tuple[float, str]],
                    hbm_clk: float, tail_clk: float = 0.0) -> tuple[float, float, str]:
    """(cost, SM-side time, bound) of a persistent kernel, clock cycles: every wave of `w` (work
    units of `cluster` CTAs) but the last takes the time of a full one, the last its own
    (`wave_time(active_ctas) -> (clocks, bound)`), then `tail_clk`; never below `hbm_clk`, the
    time to stream what must come from DRAM once (the bound is then "hbm")."""
    full, bound = wave_time(w.slots * cluster)
    last, _ = wave_time(w.last_wave_tiles * cluster)
    sm_time = (w.waves - 1) * full + last + tail_clk
    if hbm_clk >= sm_time:
        bound = "hbm"
    return max(sm_time, hbm_clk), sm_time, bound


def report_terms(w: Waves, tr: Traffic, bound: str, sm_clk: float, hbm_clk: float, k_bytes: int,
                 cfg: KernelConfig, smem_bytes: int) -> dict:
    """The cost terms every arch's `explain` reports for a candidate (JSON scalars): its waves,
    the last wave's utilisation, the CTA tiles, the bound, the SM-side and DRAM-floor cycles, the
    bytes read from L2 (`k_bytes`: K x the input element size), its shared memory and stages."""
    return {
        "waves": w.waves,
        "last_wave_util": round(w.last_wave_util, 4),
        "tiles": tr.cta_tiles,
        "bound": bound,
        "sm_cycles": round(sm_clk, 1),
        "hbm_cycles": round(hbm_clk, 1),
        "l2_bytes": tr.l2_reads * k_bytes,
        "smem_bytes": smem_bytes,
        "num_stages": cfg.num_stages,
    }


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


def slowest(terms: dict) -> str:
    """The name of the largest of the per-k-block time `terms` (the bound), ties by name."""
    return max(terms, key=lambda k: (terms[k], k))


# ----------------------------------------------------------------------------- search


def screen(problem: Problem, device: DeviceSpec, layouts: Iterable[tuple[str, str | None, dict]],
           structural: Callable[[KernelConfig], list[str]], rejected: list,
           smem_of: Callable[[KernelConfig], int] | None = None) -> Iterator[KernelConfig]:
    """The rules every arch applies after its own, in order, to tile layouts.

    `layouts` yields (description, the arch's first rule against the layout or None, the tile
    fields for `base_config`). A layout the arch's rule does not remove goes through the
    template's structural rules (`structural(cfg)`), then gets as many pipeline stages as fit
    (`with_stages`, with the arch's `smem_of`) and the pipeline-depth rule (`stage_rule`).
    Yields the staged config of each layout that passes; appends a Rejection to `rejected` for
    each one that does not, as it goes (so the caller's own rejections keep the layout order).
    """
    for desc, rule, tile in layouts:
        if rule is None:
            cfg = base_config(problem, device, **tile)
            rule = "; ".join(structural(cfg)) or None
        if rule is None:
            cfg, stages = with_stages(cfg, device, smem_of)
            rule = stage_rule(cfg.block_m, cfg.block_n, stages)
        if rule is not None:
            rejected.append(Rejection(desc, rule))
            continue
        yield cfg


def search(arch: str, candidates: Callable[[Problem, DeviceSpec], tuple[list, list]], problem: Problem,
           device: DeviceSpec) -> tuple[list[Candidate], list[Rejection]]:
    """(the legal candidates ranked best first, the rejections) of an arch's
    `candidates(problem, device)`. ValueError when `device` is not of `arch` or nothing is legal."""
    if device.arch != arch:
        raise ValueError(f"the {arch} heuristics do not select for {device.arch!r}")
    legal, rejected = candidates(problem, device)
    if not legal:
        raise ValueError(f"no legal {arch} configuration for {problem.describe()}")
    return rank(legal), rejected


Finish = Callable[[KernelConfig, Problem, DeviceSpec], KernelConfig]


def select_best(arch: str, candidates: Callable, finish: Finish, problem: Problem,
                device: DeviceSpec) -> KernelConfig:
    """An arch's `select`: the candidate its cost model ranks first (see `search`), completed by
    `finish(cfg, problem, device)` (the arch's raster choice)."""
    ranked, _ = search(arch, candidates, problem, device)
    return finish(ranked[0].config, problem, device)


def explain_search(arch: str, candidates: Callable, finish: Finish, problem: Problem, device: DeviceSpec,
                   top: int, **extra) -> dict:
    """An arch's `explain`: the report of a `search` (see `explanation`) with the best `top`
    candidates, each completed by `finish` as `select_best` completes its choice, the first of
    them chosen; `extra` keys (the cost model in words...) are added."""
    ranked, rejected = search(arch, candidates, problem, device)
    shown = [Candidate(finish(c.config, problem, device), c.cost, c.key, c.terms) for c in ranked[:max(1, top)]]
    return explanation(problem, device, shown[0].config, shown, rejected, top,
                       legal_candidates=len(ranked), **extra)


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


# KernelConfig fields that make another tile: a JITGEMM_CONFIG override that gives one re-derives
# the stages, the split and the raster (each arch's `config_with_fields`).
TILE_FIELDS = ("block_m", "block_n", "num_consumers", "cluster_size", "multicast", "out_dtype", "swap_ab")
