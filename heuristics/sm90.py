"""Kernel selection for Hopper (sm_90a), after DeepGEMM's sm90 rules, plus split-K.

Candidates: block_m in {64, 128, 256} (256 only with a 16-bit output), block_n in 16..256 step
16, block_k = 128 bytes of K, and a cluster of 1, or 2 CTAs sharing the A tile (same m block,
neighbouring n blocks) or the B tile (same n block, neighbouring m blocks); each with split_k in
SPLITS (the K range of a tile shared by up to that many CTAs, kept to >= MIN_KB_PER_SPLIT K
blocks a split and to one wave of work units, where splitting pays). The math
warpgroup count follows block_m (1 for 64, 2 above) and the pipeline gets as many stages as fit
shared memory beside the epilogue's staging (capped at MAX_STAGES; `stage_smem`). In a "shared
wave" (`shared_wave`: one wave of 128-row tiles over >= 16 m blocks) pairs sharing A are
allowed and an N-major B tile not a multiple of 64 wide is also costed with a narrow tail
(`with_tail`). Rules remove illegal or hopeless layouts; a cost model ranks the rest; the L2
raster (groups of 8 or 16 block-rows or -columns) is chosen last, for the smallest working set.

The cost model counts clock cycles of a persistent CTA, wave by wave over the work units
(cluster tiles x splits; so wave quantisation and the last wave's utilisation are in it): per
k-block the slowest of tensor-core time (at the rate the busy SMs' clock allows), shared-memory
traffic (TMA writes and wgmma reads), L2->SM ingress, TMA latency over the pipeline depth, the
CTA's share of the chip-wide L2 bandwidth (which a multicast operand halves; both L2 terms run
faster in a shared wave) and its DRAM
streaming time (the loaded DRAM latency over the stages in flight, in series with the CTA's
share of the read bandwidth, with runs of contiguous bytes that stream the better the longer
they are); plus, per unit, the split-K fix-up (fp32 partials to the workspace and back: their
bytes, the other splits' store, fence and count that split 0 waits for, and the dependent L2
round trips of its read-back, serial after the main loop) and the epilogue (the template
overlaps neither with the main loop); the whole never below the time to stream the operands (and the workspace) from DRAM
once; plus a fixed cost per launch, more for a split-K launch.
Rates: device.ArchRates; their calibration against H200 measurements: heuristics/RATES.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from jitgemm import geometry
from jitgemm.archs.sm90.layout import (
    SMEM_CAPACITY,
    WGMMA_M,
    KernelLayout,
    layout_of,
    pair_along,
    pipeline_bytes,
    splits_per_read,
    structural_problems,
)
from jitgemm.config import K_BLOCK_BYTES, KernelConfig
from jitgemm.geometry import Waves, ceil_div, choose_raster, covered_extent, kernel_shape, waves_of
from jitgemm.problem import DTYPE_BYTES, Problem

from . import rules
from .cost import (
    Traffic,
    dram_latency_clk,
    dram_run_efficiency,
    dram_stream_clk,
    epilogue_clk,
    mma_rate,
    output_bytes,
    persistent_time,
    slowest,
    tile_flops,
    tma_latency_clk,
)
from .device import DeviceSpec, arch_rates
from .rules import MIN_STAGES, config_problems, with_fields
from .search import Candidate, Rejection, describe_layout, explanation, report_terms, screen

ARCH = "sm_90a"
RATES = arch_rates(ARCH)  # heuristics/calibration/sm_90a-132.json, measured on the H200 (RATES.md)

# Register split of the template (setmaxnreg in templates/sm90/gemm.cu.j2). The math
# warpgroups can only take what the producer gives back: with two, producer + 2 x math must
# not exceed 3 x the LAUNCH_REGS a thread of 384 starts with (setmaxnreg.inc waits forever
# otherwise).
PRODUCER_REGS = 40
CONSUMER_REGS = 232
LAUNCH_REGS = 168  # per thread of a 384-thread CTA: 65536 / 384, in units of 8
REGISTER_FILE = 65536  # 32-bit registers per SM
ACC_REG_LIMIT = 128  # fp32 accumulators per math thread that still leave room (no spills)
WIDE_ACC_REG_LIMIT = 192  # ... with one m64 atom per math warpgroup (NVRTC, sm_90a: m128n384
# and m128n336 with a B tail compile without spills; m256n192, two
# atoms with an M-major A, spills)
THREADS_PER_WARPGROUP = 128

BLOCK_MS = (64, 128, 256)
# Tiles the cost model ranks: up to 256 wide. Wider ones (two wgmmas per atom, the output staged
# through a ring of buffers) run as forced configs; measured on the H200 (bf16, us) they are not
# reliably ahead: m128n384 B pairs ran 4096x24576x1536 in 458 and 4096x32768x512 in 230 against
# 467 and 234 for the chosen m128n256 B pairs, but 8192^3 in 1632 against 1602, and m128n320
# lost on all three. The model, given them, picks ones measured slower (m256n160, m256n176).
BLOCK_NS = tuple(range(16, 257, 16))
# swap_ab (D^T = B^T A^T, the user's M on the wgmma's N side) is forced-only as well: measured on
# the H200 (bf16, medians of three interleaved passes, us) cuBLAS's own tile for 4096x576x7168,
# 128 x 160 swapped on 130 CTAs, ran 51.4 unpaired and 52.7 in pairs sharing B against 51.9 for
# the chosen 128x144 A pairs with a B tail (cuBLAS 48.7); 2048x576x7168 38.1 against 34.3;
# 4096x768x4096 35.9 against 35.7; decode tiles with a 16-wide wgmma N ran within 3% of the choice.
CLUSTERS = ((1, "none"), (2, "A"), (2, "B"))

# Split-K: candidate maximum split counts (KernelConfig.split_k) and the bounds on them.
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
SPLIT_VALUES = np.asarray(SPLITS)
MIN_KB_PER_SPLIT = 4  # keep >= 4 K blocks per split: shorter ones do not amortise the fix-up
SPLITK_ACC_REG_LIMIT = 96  # split 0 holds its accumulators and a whole split of partials in
# registers: m128n224 (112 accumulators) split 2 spills (NVRTC, sm_90a)

# Fixed per-tile costs of the epilogue, clock cycles.
EPILOGUE_FIXED_CLK = 400  # drain the last wgmma, barriers, issue the TMA stores
C_LOAD_LATENCY_CLK = 1000  # has_c: the C tile is loaded after the main loop and waited for
# Split-K fix-up, serial after the main loop (templates/sm90/gemm.cu.j2, "split-K fix-up"):
# splits 1.. store their partials, fence and count in; split 0 sees the count (its own
# acquiring load): two L2 round trips; then it reads the partials back, a batch of splits at a
# time with all of a batch's loads in flight together (see readback_rounds).
L2_ROUND_TRIP_CLK = 1200  # a strong global load/atomic to L2 and back, under load (fitted
# with the split-K reducer: 128x4096x7168 m64n128 B pairs split 2
# 20.6 us against m128n128 split 4 23.7)
SPLITK_SYNC_ROUND_TRIPS = 2  # the other splits' store fence, then split 0's load of the count.
# Split 0 leads by layout.REDUCER_LEAD_KBLOCKS K blocks, which
# hides most of the first (0.2-0.6 us measured); not modelled: with
# one round trip the model prefers 1x4096x7168 split 2, measured
# 18.2 us against 16.7 unsplit
PARTIAL_BYTES = 4  # fp32 partial sums
# Split-K's extra per launch, beyond the fix-up terms: ~0.9 us measured against unsplit
# launches (with PDL and the split-0 reducer): 1x4096x7168 m64n64 split 2 ran 18.6 us against
# 16.7 unsplit, 64x4096x7168 19.2 against 17.8, while 128x2112x7168 m128n64 split 3 (13.9)
# beats the unsplit m64n64 (16.2).
SPLITK_LAUNCH_CLK = 1500


def num_consumers_for(block_m: int) -> int:
    """Math warpgroups: one for block_m <= 64, two above (each owns block_m / 2 rows)."""
    return 1 + (block_m > 64)  # (an int for an int, elementwise over arrays)


def acc_regs(block_m: int, block_n: int, num_consumers: int) -> int:
    """fp32 accumulator registers per math thread: (rows per warpgroup / 64) * block_n / 2."""
    return (block_m // num_consumers // WGMMA_M) * (block_n // 2)


def register_budget(num_consumers: int) -> int:
    """Registers the CTA holds after setmaxnreg: producer warpgroup + math warpgroups."""
    return THREADS_PER_WARPGROUP * (PRODUCER_REGS + num_consumers * CONSUMER_REGS)


# ----------------------------------------------------------------------------- rules


def _acc_regs_of(cfg: KernelConfig) -> int:
    """`acc_regs` of a config (0 when block_m does not split into the math warpgroups' atoms)."""
    return (
        acc_regs(cfg.block_m, cfg.block_n, cfg.num_consumers) if cfg.block_m % (WGMMA_M * cfg.num_consumers) == 0 else 0
    )


def acc_reg_limit(block_m: int, num_consumers: int) -> int:
    """Most fp32 accumulators per math thread that compile without spills."""
    return WIDE_ACC_REG_LIMIT if block_m // num_consumers == WGMMA_M else ACC_REG_LIMIT


def _register_problems(cfg: KernelConfig) -> list[str]:
    out = []
    regs = _acc_regs_of(cfg)
    limit = acc_reg_limit(cfg.block_m, cfg.num_consumers)
    if regs > limit:
        out.append(
            f"{regs} fp32 accumulator registers per math thread (block_m={cfg.block_m} over "
            f"{cfg.num_consumers} warpgroup(s) x block_n={cfg.block_n}) exceed {limit} "
            f"of the {CONSUMER_REGS} a math thread gets: it would spill"
        )
    budget = register_budget(cfg.num_consumers)
    if budget > REGISTER_FILE:
        out.append(f"the register split needs {budget} registers, more than the {REGISTER_FILE} of an SM")
    return out


def check_config(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> list[str]:
    """Why `cfg` cannot run `problem` on `device` (sm_90a), in words; empty when it can."""
    return config_problems(cfg, problem, device, structural_problems, layout_of, _register_problems) or split_problems(
        cfg, problem, device
    )


def _pre_rule(problem: Problem, device: DeviceSpec, block_m: int, block_n: int, cluster: int) -> str | None:
    """The rules (in DeepGEMM's spirit) that remove a tile layout before costing whatever the
    shape (the multicast side's block count is `_side_rule`; the single-wave rule on multicast
    depends on the split count: see `single_wave_rule`), or None."""
    if block_m == 256 and problem.out_dtype == "fp32":
        return "block_m 256 only with a 16-bit output (an fp32 output tile leaves too little shared memory)"
    regs = acc_regs(block_m, block_n, num_consumers_for(block_m))
    if regs > ACC_REG_LIMIT:
        return (
            f"register budget: {regs} accumulator registers per math thread > {ACC_REG_LIMIT} "
            f"(at least one of block_m, block_n must be <= 128)"
        )
    if cluster > 1 and device.num_sms % cluster:
        return f"no multicast: the SM count {device.num_sms} is odd"
    return None


def _nothing_to_share(problem: Problem, block_m, block_n, shares_a):
    """A pair sharing A (else B) has one block on the other side: nothing to share (elementwise)."""
    side = np.where(shares_a, ceil_div(problem.n, block_n), ceil_div(problem.m, block_m))
    return side < 2


def _side_rule(multicast: str) -> str:
    return f"no multicast {multicast}: only one {'n' if multicast == 'A' else 'm'} block, nothing to share"


def split_problems(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> list[str]:
    """Why `cfg`'s split-K cannot run `problem`, in words: the split that reduces a tile holds a
    batch of partials in registers besides its accumulators. (Any number of work units can run:
    no split waits for one that has not started; the heuristics keep split-K to one wave, see
    `split_choices`, because that is where it pays.)"""
    if cfg.split_k == 1:
        return []
    regs = _acc_regs_of(cfg)
    if regs > SPLITK_ACC_REG_LIMIT:
        return [
            f"split_k={cfg.split_k} with {regs} accumulators per math thread: the split-K reducer "
            f"needs <= {SPLITK_ACC_REG_LIMIT} (it holds a split of partials in registers too)"
        ]
    return []


SHARED_WAVE_M_BLOCKS = 16
SHARED_WAVE_MIN_N = 512


def shared_wave(problem: Problem, device: DeviceSpec, block_m, block_n, splits, cluster):
    """One wave of work units (tiles x splits) of tiles of at least 128 rows over at least
    SHARED_WAVE_M_BLOCKS m blocks, N at least SHARED_WAVE_MIN_N: the CTAs walk K together, every
    k-slab of B is read by the CTAs of its column at the same moment and each of A by those of
    its row (device.ArchRates.l2_shared_wave_gain, see RATES.md). Measured on the H200 (bf16, us, the choice
    with the gain against the one without): 4096x576x7168 52.4 against 56.6, 4096x512x7168 42.0
    against 61.2, 2048x1536x7168 60.0 against 74.4, 4096x768x4096 35.9 against 43.4,
    2048x2048x7168 82.9 against 84.9, 2048x576x7168 34.5 against 33.6. 64-row tiles are left
    out: with them 2048x576x7168 took m64n144 A pairs with a B tail, 42.9 (one math warpgroup
    of 64 rows runs its SM's tensor cores well below the model's rate). Elementwise over arrays."""
    num_m = ceil_div(problem.m, block_m)
    work = num_m * ceil_div(problem.n, block_n) * splits
    return _wide_wave_tiles(problem, block_m, num_m) & (work <= device.num_sms // cluster * cluster)


def _wide_wave_tiles(problem: Problem, block_m, num_m):
    """`shared_wave` but for its one-wave condition: tiles of `block_m` rows in `num_m` m blocks."""
    return (block_m >= 128) & (num_m >= SHARED_WAVE_M_BLOCKS) & (problem.n >= SHARED_WAVE_MIN_N)


def _shared_wave_possible(problem: Problem) -> bool:
    """Whether any layout can run `problem` in a shared wave: tiles of 128 rows make the most m
    blocks of those it takes."""
    return bool(_wide_wave_tiles(problem, 128, ceil_div(problem.m, 128)))


def _multicast_is_single_wave(problem: Problem, device: DeviceSpec, block_m, block_n, splits, shares_a):
    """Where `single_wave_rule` removes a pair sharing A (else B) (elementwise over arrays)."""
    num_m = ceil_div(problem.m, block_m)
    exempt = np.where(shares_a, shared_wave(problem, device, block_m, block_n, splits, 2), num_m == 2)
    return ~exempt & (num_m * ceil_div(problem.n, block_n) * splits <= device.num_sms)


def _single_wave_splits(problem: Problem, device: DeviceSpec, block_m, num_m, tiles, shares_a):
    """Up to how many splits `single_wave_rule` removes a pair sharing A (else B) of `tiles`
    tiles in `num_m` m blocks: the rule applies at split s exactly when s <= this (0: never).
    Pairs run only on an even SM count (`_pre_rule`), where a wave of pairs is within the grid
    whenever it is within the SM count, so whether the rule's exception applies does not
    depend on the split (elementwise over arrays)."""
    exempt = np.where(shares_a, _wide_wave_tiles(problem, block_m, num_m), num_m == 2)
    return np.where(exempt, 0, device.num_sms // tiles)


def single_wave_rule(
    problem: Problem, device: DeviceSpec, block_m: int, block_n: int, splits: int, multicast: str
) -> str | None:
    """DeepGEMM's rule, counted in work units: no multicast when tiles x K splits fit one wave
    of CTAs (a cluster then only constrains the schedule). None when the rule does not apply.

    Exceptions, measured on the H200 (bf16, PDL on):
    - a pair sharing B when M is exactly two m blocks. The whole problem is then column pairs
      whose B tile dominates the traffic, and multicast halves the L2 reads of it even in one
      wave: m64n128 pairs sharing B ran 128x7168x2048 in 11.1 us against 12.6 unpaired,
      128x7168x16384 in 65.9 against 73.3 (the previous choice, m128n128 split 2) and
      128x4096x7168 split 2 in 21.7 against 22.9 for the best unpaired tile;
    - a pair sharing A in a shared wave (`shared_wave`): 4096x576x7168 ran 128x144 A pairs
      with a B tail in 52.4-53.3 us against 53.6-56.0 unpaired."""
    if not _multicast_is_single_wave(problem, device, block_m, block_n, splits, multicast == "A"):
        return None
    num_tiles = ceil_div(problem.m, block_m) * ceil_div(problem.n, block_n)
    what = f"{num_tiles} tiles" if splits == 1 else f"{num_tiles} tiles x {splits} splits"
    return f"no multicast: the problem is a single wave ({what} <= {device.num_sms} SMs)"


def _split_count(units, k_blocks: int, split_slots):
    """How many of SPLITS (a prefix of them) `split_choices` allows a layout of `units` cluster
    units per split over `k_blocks` K blocks, on a grid of `split_slots` cluster slots (0 for
    a tile whose accumulators leave no room for split-K; elementwise over arrays)."""
    most = np.minimum(k_blocks // MIN_KB_PER_SPLIT, split_slots // units)
    return np.maximum(1, np.searchsorted(SPLIT_VALUES, most, side="right"))


def _split_slots(device: DeviceSpec, cluster, acc):
    """The cluster slots split-K may fill with tiles of `acc` accumulators per math thread
    (0 where split-K's reducer has no room; elementwise over arrays)."""
    return np.where(acc <= SPLITK_ACC_REG_LIMIT, np.maximum(1, device.num_sms // cluster), 0)


def split_choices(
    problem: Problem, device: DeviceSpec, block_m: int, block_n: int, cluster: int, multicast: str, block_k: int
) -> list[int]:
    """The split_k values worth costing for a layout: 1, and each of SPLITS that leaves every
    split >= MIN_KB_PER_SPLIT K blocks and the work units (cluster tiles x splits) within one
    wave of the persistent grid; only 1 for tiles of more than SPLITK_ACC_REG_LIMIT
    accumulators per math thread."""
    units = cluster_tiles_of(problem, block_m, block_n, multicast)
    slots = _split_slots(device, cluster, acc_regs(block_m, block_n, num_consumers_for(block_m)))
    return list(SPLITS[: int(_split_count(units, ceil_div(problem.k, block_k), slots))])


def cluster_tiles_of(problem: Problem, block_m: int, block_n: int, multicast: str) -> int:
    """Work items of one K split of an unswapped tiling: tiles, or pairs sharing `multicast`."""
    return geometry.cluster_tiles(
        ceil_div(problem.m, block_m), ceil_div(problem.n, block_n), {"A": "n", "B": "m"}.get(multicast)
    )


def readback_rounds(lay: KernelLayout, splits: int) -> int:
    """Dependent L2 round trips split 0 of a tile needs to read the other splits' partials
    back: one per batch of `jitgemm.archs.sm90.layout.read_batch(lay)` splits (0 without split-K).

    The template's read-back loop runs over the batches outermost, with the splits of a batch,
    the 64-row atoms and the float4 columns of a math thread unrolled inside it, so all loads of
    one batch are in flight together. An atom whose rows are all past M skips its loads, which
    shortens a round, not the number of rounds (atom 0 of the first warpgroup always holds a
    live row); the bytes of the skipped rows are left out by `partial_rows`.
    """
    return int(_readback_rounds(splits_per_read(lay.config.split_k, lay.acc_regs), splits))


def _readback_rounds(batch, splits):
    return np.where(splits > 1, ceil_div(np.maximum(splits - 1, 0), batch), 0)


def partial_rows(m: int, block_m: int, num_consumers: int) -> int:
    """Rows of fp32 partials one split stores for all m blocks of one column of tiles.

    Mirrors the template: a math thread stores rows r and r + 8 together (one float4) when row r
    of its warpgroup is below M, so a 64-row atom stores 2 x min(8, live) rows per 16-row group:
    M = 1 stores 2 rows, not 64.
    """
    wg_m = block_m // num_consumers
    full, rest = divmod(m, block_m)
    total = full * block_m
    for wg in range(num_consumers):
        live = min(max(0, rest - wg * wg_m), wg_m)  # rows of the last tile in this warpgroup
        groups, tail = divmod(live, 16)
        total += groups * 16 + 2 * min(8, tail)
    return total


# ----------------------------------------------------------------------------- cost model
#
# The model costs many candidates at once: `Tiles` holds tile layouts as columns (one element
# per candidate), `_Tiling` what tiling the problem with each of them counts, and every term
# below is elementwise over them.


MULTICASTS = ("A", "B", "none")  # in the order of their names (the ranking's tie-break)


class Tiles:
    """Candidates as columns: tile layouts with what the cost model reads of their layouts.

    The columns are the rows of two tables, `ints` and `times` (the clock cycles the tile alone
    takes, at RATES), so that `take` is two gathers."""

    INTS = (
        "origin",  # per row: its index in `configs`
        "split_k",
        "block_m",
        "block_n",
        "b_box",  # columns of B one tile loads (see b_box_of)
        "shares_a",
        "shares_b",
        "a_piece",  # MN elements per TMA box (MN-major: a DRAM run, see dram_runs)
        "b_piece",
        "num_stages",
        "cluster_size",
        "multicast",  # the index of cfg.multicast in MULTICASTS
        "acc_regs",
        "smem_bytes",
        "flops",  # tensor-core FLOPs of one k-block
    )
    TIMES = (
        "smem_clk",  # per k-block: shared-memory traffic (see _times)
        "latency_clk",  # the TMA round trip over the pipeline depth
        "dram_latency_clk",  # the loaded DRAM round trip over the stages in flight
        "epilogue_clk",  # per unit
    )
    origin: np.ndarray
    split_k: np.ndarray
    block_m: np.ndarray
    block_n: np.ndarray
    b_box: np.ndarray
    shares_a: np.ndarray
    shares_b: np.ndarray
    a_piece: np.ndarray
    b_piece: np.ndarray
    num_stages: np.ndarray
    cluster_size: np.ndarray
    multicast: np.ndarray
    acc_regs: np.ndarray
    smem_bytes: np.ndarray
    flops: np.ndarray
    smem_clk: np.ndarray
    latency_clk: np.ndarray
    dram_latency_clk: np.ndarray
    epilogue_clk: np.ndarray

    def __init__(self, configs: tuple, ints: np.ndarray, times: np.ndarray):
        self.configs = configs  # the configs the rows were made from (split_k 1)
        self.ints, self.times = ints, times
        self.__dict__.update(zip(self.INTS + self.TIMES, (*ints, *times)))

    @classmethod
    def of(cls, configs) -> Tiles:
        rows = [(cfg, layout_of(cfg)) for cfg in configs]
        ints = np.array([_ints(i, cfg, lay) for i, (cfg, lay) in enumerate(rows)], dtype=np.int64)
        times = np.array([_times(cfg, lay) for cfg, lay in rows], dtype=np.float64)
        shape = (len(rows), len(cls.INTS)), (len(rows), len(cls.TIMES))
        return cls(tuple(configs), ints.reshape(shape[0]).T.copy(), times.reshape(shape[1]).T.copy())

    def take(self, rows: np.ndarray, split_k: np.ndarray | None = None) -> Tiles:
        """These rows (an index array), with split_k replaced when given."""
        ints = self.ints[:, rows]
        if split_k is not None:
            ints[1] = split_k
        return Tiles(self.configs, ints, self.times[:, rows])

    def __len__(self) -> int:
        return self.ints.shape[1]

    def config(self, i: int) -> KernelConfig:
        """The config of row i."""
        cfg = self.configs[self.origin[i]]
        return cfg if cfg.split_k == self.split_k[i] else with_fields(cfg, split_k=int(self.split_k[i]))


def _ints(origin: int, cfg: KernelConfig, lay: KernelLayout) -> tuple:
    """The int columns of `Tiles` of one config."""
    return (
        origin,
        cfg.split_k,
        cfg.block_m,
        cfg.block_n,
        _b_box(cfg, lay),
        cfg.multicast == "A",
        cfg.multicast == "B",
        lay.a.piece_extent,
        lay.b.piece_extent,
        cfg.num_stages,
        cfg.cluster_size,
        MULTICASTS.index(cfg.multicast),
        lay.acc_regs,
        lay.smem_bytes,
        tile_flops(cfg.block_m, cfg.block_n, cfg.block_k),
    )


def _times(cfg: KernelConfig, lay: KernelLayout) -> tuple:
    """The time columns of `Tiles` of one config. Shared memory, as DeepGEMM counts it: TMA
    writes of the stage (MN-major pieces padded to the swizzle width) plus one wgmma read of
    each operand tile; a B tail takes a second wgmma per atom, which reads the A tile again."""
    a_reads = 2 if cfg.b_tail else 1
    smem = lay.a.tile_bytes + lay.b.tile_bytes + (a_reads * cfg.block_m + cfg.block_n) * K_BLOCK_BYTES
    out_bytes = cfg.block_m * cfg.block_n * DTYPE_BYTES[cfg.out_dtype]
    return (
        smem / RATES.smem_bytes_per_clk,
        tma_latency_clk(RATES, cfg.num_stages),
        dram_latency_clk(RATES, cfg.num_stages),
        epilogue_clk(RATES, out_bytes, cfg.has_c, EPILOGUE_FIXED_CLK, C_LOAD_LATENCY_CLK),
    )


def _b_box(cfg: KernelConfig, lay: KernelLayout) -> int:
    b = lay.mma_b
    return cfg.block_n if b.major_is_k or b.tail else b.num_pieces * b.piece_extent


def b_box_of(cfg: KernelConfig) -> int:
    """Columns of the wgmma's B operand (B, or A under swap_ab) one tile loads: block_n, or
    (MN-major) whole pieces of the layout's swizzle width (64 columns for 128-byte swizzling;
    narrower swizzles for narrow tiles), unless the tile ends in a narrow tail (`b_tail`).
    Never fewer than block_n."""
    return _b_box(cfg, layout_of(cfg))


@dataclass(frozen=True)
class _Tiling:
    """What tiling the problem with each layout of a `Tiles` counts, whatever the split
    (elementwise): blocks, cluster units, the rows and columns read (see `traffic`), and the
    operand rows streamed from DRAM, each operand weighted by the DRAM efficiency of its runs
    (see dram_runs; a scalar where every run is alike)."""

    num_m: Any
    num_n: Any
    units: Any  # cluster units (tiles, or pairs of tiles) of one split
    l2_reads: Any  # rows + columns read out of L2, all CTAs together
    lands: Any  # ... landing in shared memory (a shared tile in both CTAs of its pair)
    covered_b: Any  # columns of B the boxes of all column blocks cover
    dram_rows: Any

    def take(self, rows: np.ndarray) -> _Tiling:
        return _Tiling(*(v[rows] if np.ndim(v) else v for v in vars(self).values()))


def _tiling(problem: Problem, t: Tiles) -> _Tiling:
    """`_Tiling` of `problem` with the layouts of `t` (whose majors are the problem's)."""
    num_m, num_n, units, l2_reads, lands, covered_b = _traffic(
        problem, t.block_m, t.block_n, t.b_box, t.shares_a, t.shares_b
    )
    # Each operand weighted by the DRAM efficiency of its runs: one K block of a K-major row,
    # else a piece of an MN-major one.
    elem = DTYPE_BYTES[problem.dtype]
    a_run = K_BLOCK_BYTES if problem.a_major == "K" else np.minimum(t.a_piece, problem.m) * elem
    b_run = K_BLOCK_BYTES if problem.b_major == "K" else np.minimum(t.b_piece, problem.n) * elem
    dram_rows = problem.m / dram_run_efficiency(RATES, a_run) + covered_b / dram_run_efficiency(RATES, b_run)
    return _Tiling(num_m, num_n, units, l2_reads, lands, covered_b, dram_rows)


def traffic(problem: Problem, block_m: int, block_n: int, b_box: int, multicast: str) -> Traffic:
    """Operand traffic of a tiling sharing `multicast`."""
    _, _, units, l2_reads, lands, _ = _traffic(problem, block_m, block_n, b_box, multicast == "A", multicast == "B")
    return Traffic(int(units) * (1 if multicast == "none" else 2), int(units), int(l2_reads), int(lands))


def _traffic(problem: Problem, block_m, block_n, b_box, shares_a, shares_b) -> tuple:
    """(m blocks, n blocks, cluster units of one split, rows + columns read out of L2, landing
    in shared memory, columns of B covered) of tilings whose pairs share A or B (elementwise)."""
    m, n = problem.m, problem.n
    num_m, num_n = ceil_div(m, block_m), ceil_div(n, block_n)
    pair_m, pair_n = 1 + shares_b, 1 + shares_a  # tiles of a cluster unit along M, N
    covered_b = covered_extent(n, block_n, b_box)
    # A pair whose peer falls past the edge recomputes the last block, reading it again: A's
    # rows of the last m block (block_m is a multiple of 64: A's boxes never overhang), B's
    # columns of the last n block (which its box, never narrower than a block, covers).
    grid_m, grid_n = ceil_div(num_m, pair_m), ceil_div(num_n, pair_n)  # cluster units along M, N
    a_reads = grid_n * (m + shares_b * ((m - 1) % block_m + 1) * (num_m % 2))  # once per column of units
    b_reads = grid_m * (covered_b + shares_a * ((n - 1) % block_n + 1) * (num_n % 2))  # ... per row
    units = grid_m * grid_n
    # A shared tile lands in both CTAs of its pair.
    return num_m, num_n, units, a_reads + b_reads, a_reads * pair_n + b_reads * pair_m, covered_b


def dram_runs(problem: Problem, cfg: KernelConfig) -> tuple[int, int]:
    """Contiguous bytes per DRAM run of A and of B: one row of one TMA box. A K-major box row is
    one K block (128 bytes); an MN-major operand is loaded in pieces of its swizzle width, one
    box each, so its runs are a piece wide (128 bytes for 64-column pieces, 64 or 32 for the
    narrow swizzles of narrow tiles; clipped at the matrix edge). The pieces of one K row are
    adjacent but separate requests: measured, m64n48 (three 16-column pieces) streams
    128x576x7168 in 22.7 us against 16.8 for m64n32 (one 32-column piece) and 16.7 for m64n64."""
    lay, elem = layout_of(cfg), DTYPE_BYTES[problem.dtype]
    a_run = K_BLOCK_BYTES if lay.a.major_is_k else min(lay.a.piece_extent, problem.m) * elem
    b_run = K_BLOCK_BYTES if lay.b.major_is_k else min(lay.b.piece_extent, problem.n) * elem
    return a_run, b_run


def costs(problem: Problem, device: DeviceSpec, t: Tiles, til: _Tiling, report: bool = False) -> dict:
    """Model the run time of each candidate of `t` (`til` its tiling of `problem`), clock
    cycles: a dict of arrays, "cost", "sm_time", "traffic" and "splits" (what `_order` ranks
    by), and with `report` the other terms `explain` reports (see `_terms`). The model reads
    tiles in user coordinates: swap_ab configs (forced only) are not modelled. Rates: RATES
    (`device.rates` of every sm_90a device)."""
    r = RATES
    cluster = t.cluster_size
    k_blocks = ceil_div(problem.k, K_BLOCK_BYTES // DTYPE_BYTES[problem.dtype])
    splits = np.minimum(t.split_k, k_blocks)  # at most one per K block, so no split is empty
    kb_unit = ceil_div(k_blocks, splits)  # the longest split's K blocks
    cta_tiles = til.units * cluster  # including a pair's recomputed peer past the edge
    tr = Traffic(cta_tiles, til.units, til.l2_reads, til.lands)

    w = waves_of(til.units * splits, device.num_sms // cluster)
    # CTAs busy in a full wave (the first row) and in the last (the second): every term that
    # depends on them is counted for both at once.
    active = np.array((w.slots, w.last_wave_tiles)) * cluster
    l2_gain = 1.0
    if _shared_wave_possible(problem):
        work = til.num_m * til.num_n * splits
        shared = _wide_wave_tiles(problem, t.block_m, til.num_m) & (work <= device.num_sms // cluster * cluster)
        l2_gain = np.where(shared, r.l2_shared_wave_gain, 1.0)

    # Per k-block of one CTA (`Tiles` holds the times of the tile alone). The tensor-core rate
    # follows the CTAs the persistent grid keeps busy (the clock credit).
    ingress = til.lands * K_BLOCK_BYTES / cta_tiles  # bytes landing in one CTA per k-block
    mma = t.flops / mma_rate(r, device.num_sms, active[0])
    l2_ingress = ingress / r.l2_sm_bytes_per_clk
    fixed = np.maximum(np.maximum(mma, t.smem_clk), np.maximum(l2_ingress, t.latency_clk))
    l2_read = til.l2_reads * K_BLOCK_BYTES / cta_tiles
    # Bytes per CTA per k-block that come from DRAM: A once, B once per column block as its
    # boxes cover it (the overhang of padded pieces is fetched by both neighbours at the same
    # time: it comes from DRAM twice), spread over the tiles (the m blocks of a column share B
    # through L2).
    dram_read = til.dram_rows * K_BLOCK_BYTES / cta_tiles
    l2 = active * (l2_read / l2_gain) / r.l2_total_bytes_per_clk
    dram = dram_stream_clk(r, t.dram_latency_clk, dram_read, active)
    delivery = active * ingress / (r.l2_delivery_bytes_per_clk * l2_gain)
    slowest_clk = np.maximum(np.maximum(fixed, l2), np.maximum(dram, delivery))

    # Per launch: the kernel's launch, ramp and drain; split-K's measured extra besides.
    split = splits > 1
    if report or split.any():
        fixup, rounds, ws_total = _splitk_terms(problem, t, splits, til.num_m, cta_tiles, active)
        launch = r.launch_clk + np.where(split, SPLITK_LAUNCH_CLK, 0)
    else:  # nothing to fix up
        fixup, rounds, ws_total, launch = 0.0, 0, 0, r.launch_clk
    clk = kb_unit * slowest_clk + fixup + t.epilogue_clk  # of a unit, in a full wave and in the last
    sm_time = persistent_time(w, clk[0], clk[1])

    # The DRAM floor: the operands at the read-only streaming rate, output and workspace at the
    # copy rate.
    dram_bytes = til.dram_rows * problem.k * DTYPE_BYTES[problem.dtype]
    hbm_time = dram_bytes / r.dram_read_bytes_per_clk + (output_bytes(problem) + ws_total) / r.hbm_bytes_per_clk
    out = {"cost": np.maximum(sm_time, hbm_time) + launch, "sm_time": sm_time, "traffic": tr, "splits": splits}
    if report:
        terms = {"mma": mma, "smem": t.smem_clk, "l2_ingress": l2_ingress, "latency": t.latency_clk}
        terms.update(l2=l2[0], dram=dram[0], delivery=delivery[0])
        out.update(
            bound=np.where(hbm_time >= sm_time, "hbm", slowest(terms)[0]),
            hbm_time=hbm_time,
            waves=w,
            kb_unit=kb_unit,
            dram_efficiency=np.broadcast_to((problem.m + til.covered_b) / til.dram_rows, sm_time.shape),
            launch=launch,
            fixup=fixup[0],
            rounds=rounds,
            ws_total=ws_total,
        )
    return out


def _splitk_terms(problem: Problem, t: Tiles, splits, num_m, cta_tiles, active) -> tuple:
    """(the split-K fix-up of a unit while `active` CTAs run (0 without a split), its L2 round
    trips, the workspace bytes). Splits 1.. park their fp32 partial tiles (only live rows) in
    the workspace; split 0 reads them back and runs the epilogue."""
    r = RATES
    rows_of = [partial_rows(problem.m, b, num_consumers_for(b)) for b in BLOCK_MS]
    rows = np.array(rows_of)[np.searchsorted(BLOCK_MS, t.block_m)]  # per column of tiles, split
    ws_tile = rows / num_m * t.block_n * PARTIAL_BYTES  # bytes one split of a tile stores
    ws_total = (splits - 1) * rows * t.block_n * PARTIAL_BYTES * (cta_tiles // num_m)
    split = splits > 1
    rounds = np.where(
        split, SPLITK_SYNC_ROUND_TRIPS + _readback_rounds(splits_per_read(t.split_k, t.acc_regs), splits), 0
    )
    own = (splits - 1) * ws_tile / r.l2_sm_bytes_per_clk  # split 0 reads the others back
    # on average a CTA moves 2 (S - 1) / S partials: splits 1.. store one, split 0 reads S - 1
    chip = active * 2 * (splits - 1) / splits * ws_tile / r.l2_total_bytes_per_clk
    return np.where(split, rounds * L2_ROUND_TRIP_CLK + np.maximum(own, chip), 0.0), rounds, ws_total


def _terms(problem: Problem, device: DeviceSpec, t: Tiles, c: dict, i: int) -> dict:
    """The cost terms `explain` reports for candidate `i` of `costs`' answer `c` (with `report`)."""
    w, tr = c["waves"], c["traffic"]
    elem = DTYPE_BYTES[problem.dtype]
    wave = Waves(int(w.tiles[i]), int(w.slots[i]), int(w.waves[i]), int(w.last_wave_tiles[i]))
    row_traffic = Traffic(*(int(getattr(tr, f)[i]) for f in Traffic.__dataclass_fields__))
    cost = float(c["cost"][i])
    return {
        "split_k": int(c["splits"][i]),
        "units": wave.tiles,
        "kb_per_unit": int(c["kb_unit"][i]),
        **report_terms(
            wave,
            row_traffic,
            str(c["bound"][i]),
            float(c["sm_time"][i]),
            float(c["hbm_time"][i]),
            problem.k * elem,
            t.config(i),
            int(t.smem_bytes[i]),
        ),
        "dram_efficiency": round(float(c["dram_efficiency"][i]), 4),
        "launch_cycles": int(c["launch"][i]),
        "splitk_cycles": round(float(c["fixup"][i]), 1),
        "splitk_round_trips": int(c["rounds"][i]),
        "model_us": round(cost / (device.rates.clock_ghz * 1e3), 2),
        "workspace_bytes": int(c["ws_total"][i]),
        "acc_regs": int(t.acc_regs[i]),
    }


def _order(t: Tiles, c: dict, top: int) -> list[int]:
    """The first `top` candidates, best first. The modelled cost decides; ties (every candidate
    at the DRAM floor, or several tensor-core bound) go to the faster SM-side time, then to less
    L2 traffic (robust if the L2 rates are off), then to fewer splits, no cluster, the smaller
    tile (less padding), block_m, block_n, the multicast side, and last the config name."""
    cost = c["cost"].round(6)
    # Only the rows as cheap as the top-th cheapest can be among the first `top`.
    rows = np.flatnonzero(cost <= np.partition(cost, min(top, len(cost)) - 1)[min(top, len(cost)) - 1])
    if len(rows) == 1:
        return [int(rows[0])]
    keys = (
        cost[rows],
        np.round(c["sm_time"][rows], 6),
        c["traffic"].l2_reads[rows],
        c["splits"][rows],
        t.cluster_size[rows],
        (t.block_m * t.block_n)[rows],
        t.block_m[rows],
        t.block_n[rows],
        t.multicast[rows],
    )
    order = np.lexsort(keys[::-1])
    # Rows tied on every numeric key with the last one shown are sorted by name with it.
    shown = list(order[:top])
    tied = tuple(k[shown[-1]] for k in keys)
    for i in order[top:]:
        if tuple(k[i] for k in keys) != tied:
            break
        shown.append(i)
    shown.sort(key=lambda i: (tuple(k[i] for k in keys), t.config(rows[i]).name))
    return [int(rows[i]) for i in shown[:top]]


def cost_of(problem: Problem, device: DeviceSpec, cfg: KernelConfig) -> Candidate:
    """`cfg` costed on `problem` with the terms `explain` reports (see `costs`)."""
    if cfg.swap_ab:
        raise ValueError(f"{cfg.name}: the sm_90a cost model does not model swap_ab configs")
    t = Tiles.of([cfg])
    c = costs(problem, device, t, _tiling(problem, t), report=True)
    return Candidate(cfg, round(float(c["cost"][0]), 6), (), _terms(problem, device, t, c, 0))


# ----------------------------------------------------------------------------- search


def stage_smem(cfg: KernelConfig, stages: int) -> int:
    """Shared memory of `cfg` with `stages` stages as the stage count is chosen: with a staging
    buffer for every store box of the tile, unless that leaves fewer than MIN_STAGES stages
    (tiles wider than 256), which stage their output through a ring of fewer buffers
    (`layout.epilogue_buffers`). A deeper pipeline bought with fewer buffers did not pay:
    measured on the H200 (bf16, medians of three passes, us), m128n256 B pairs with 4 stages and
    2 of the 4 boxes staged at a time ran 8192^3 in 1659 against 1617 with 3 stages and all 4,
    4096x32768x512 in 250 against 247, 4096x24576x1536 in 493 against 486."""
    lay = layout_of(cfg)  # (the stages and the staging of any stage count's layout are alike)
    if pipeline_bytes(lay.stage_bytes, MIN_STAGES, cfg.num_consumers) + lay.out_bytes_whole <= SMEM_CAPACITY:
        return pipeline_bytes(lay.stage_bytes, stages, cfg.num_consumers) + lay.out_bytes_whole
    return layout_of(with_fields(cfg, num_stages=stages)).smem_bytes


def with_stages(cfg: KernelConfig, device: DeviceSpec) -> tuple[KernelConfig, int]:
    """(`cfg` with as many pipeline stages as fit shared memory (capped; at least 2; see
    `stage_smem`), the count that fits (0 when not even 2 do))."""
    return rules.with_stages(cfg, device, stage_smem)


def with_raster(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> KernelConfig:
    """`cfg` with the L2 raster (side and group size) of the smallest working set (see `_raster`)."""
    return with_fields(cfg, **_raster(cfg, problem, device, b_box_of(cfg), cfg.split_k))


def _raster(cfg: KernelConfig, problem: Problem, device: DeviceSpec, b_box: int, split_k: int) -> dict:
    """The raster fields of the smallest working set of `cfg`'s tiles, which load `b_box`
    columns of B, split `split_k` ways. With split-K the consecutive work units of a wave are
    the splits of fewer tiles."""
    splits = int(geometry.splits_used(split_k, cfg.block_k, problem.k))
    slots = max(1, device.num_sms // cfg.cluster_size // splits)
    km, kn = kernel_shape(cfg, problem.m, problem.n)  # swap_ab tiles are in kernel coordinates
    raster, group, _ = choose_raster(
        ceil_div(km, cfg.block_m), ceil_div(kn, cfg.block_n), cfg.block_m, b_box, slots, pair_along(cfg)
    )
    return {"raster": raster, "group_size": group}


def with_split(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> KernelConfig:
    """`cfg` with the split_k the cost model prefers for its tile (1 when splitting never pays)."""
    choices = split_choices(problem, device, cfg.block_m, cfg.block_n, cfg.cluster_size, cfg.multicast, cfg.block_k)
    t = Tiles.of([cfg]).take(np.zeros(len(choices), dtype=int), np.asarray(choices))
    return t.config(_order(t, costs(problem, device, t, _tiling(problem, t)), 1)[0])


def with_tail(cfg: KernelConfig, device: DeviceSpec) -> KernelConfig | None:
    """`cfg` loading B's last columns as a narrow tail instead of a padded piece (its smaller
    stages may make room for one more), or None where it has no tail. Costed only in a shared
    wave: measured on the H200 (bf16, us), 4096x576x7168 runs 128x144 with a tail in 55.3-56.0
    (A pairs 52.4-53.3) against 58.4-62.2 padded; but on the three-wave 4096x2112x7168 128x176
    A pairs ran 194 with a tail against 173 padded and 128x208 294 against 191 for 128x192, and
    at M = 128 the tailed m64n96 split 3 ran 18.1 and m64n80 split 2 20.7 against 14.5."""
    tail = with_fields(cfg, b_tail=True, split_k=1)
    return None if structural_problems(tail) else with_stages(tail, device)[0]


@dataclass(frozen=True)
class _Layouts:
    """Every tile layout of one kind of problem (device, dtypes, majors, C), in the rules'
    order, with what the rules that do not look at the shape said of each: the rules before
    the multicast side's (`pre`) and the structural and pipeline-depth rules (`post`)."""

    descriptions: tuple
    fields: tuple  # the tile fields of each layout
    pre: tuple  # a rule's words, or None
    post: tuple
    row: np.ndarray  # of each layout that no such rule removes: its row of `tiles`, else -1
    tiles: Tiles  # those layouts, staged (split_k 1), then their B-tail variants
    tail_of: np.ndarray  # per B-tail variant (the rows of `tiles` past the staged layouts): its layout's row
    split_slots: np.ndarray  # per row of `tiles`: see `_split_slots`


@functools.lru_cache(maxsize=64)
def _layouts(device: DeviceSpec, *kind) -> _Layouts:
    """The layouts of one kind of problem (dtype, out_dtype, a_major, b_major, has_c)."""
    like = Problem(1, 1, 1, *kind)  # a problem of that kind: the rules below read no shape
    descriptions, fields, pre, post, staged = [], [], [], [], []
    for cluster, multicast in CLUSTERS:
        for block_m in BLOCK_MS:
            for block_n in BLOCK_NS:
                tile = dict(
                    block_m=block_m,
                    block_n=block_n,
                    num_consumers=num_consumers_for(block_m),
                    cluster_size=cluster,
                    multicast=multicast,
                )
                descriptions.append(describe_layout(block_m, block_n, cluster, multicast))
                fields.append(tile)
                rule = _pre_rule(like, device, block_m, block_n, cluster)
                pre.append(rule)
                later = None
                if rule is None:
                    rejected: list = []
                    staged.extend(screen(like, device, [("", None, tile)], structural_problems, rejected, stage_smem))
                    later = rejected[0].rule if rejected else None
                post.append(later)
    row = np.full(len(fields), -1)
    row[[i for i, (p, q) in enumerate(zip(pre, post)) if p is None and q is None]] = np.arange(len(staged))
    tails = [with_tail(cfg, device) for cfg in staged]
    tail_of = np.array([i for i, tail in enumerate(tails) if tail is not None], dtype=int)
    tiles = Tiles.of(staged + [tails[i] for i in tail_of])
    split_slots = _split_slots(device, tiles.cluster_size, tiles.acc_regs)
    return _Layouts(tuple(descriptions), tuple(fields), tuple(pre), tuple(post), row, tiles, tail_of, split_slots)


def _layouts_of(problem: Problem, device: DeviceSpec) -> _Layouts:
    return _layouts(device, problem.dtype, problem.out_dtype, problem.a_major, problem.b_major, problem.has_c)


@dataclass(frozen=True)
class _Search:
    """The legal candidates of a problem, costed (`costs`), and the layouts' fate."""

    layouts: _Layouts
    candidates: Tiles
    costs: dict
    single_wave: np.ndarray  # per row of the layouts: removed by the single-wave rule at its largest split
    largest_split: np.ndarray


SPLIT_INDEX = np.arange(len(SPLITS))


def _search(problem: Problem, device: DeviceSpec, report: bool = False) -> _Search:
    """Every legal (tile layout, split) and B-tail candidate of `problem`, costed (with the
    terms `explain` reports when `report`)."""
    if device.arch != ARCH:
        raise ValueError(f"the {ARCH} heuristics do not select for {device.arch!r}")
    lay = _layouts_of(problem, device)
    t = lay.tiles
    til = _tiling(problem, t)
    # The splits of each layout: SPLITS[first:end]. A pair is removed when it has one block on
    # the side it pairs along, or when its largest split is a single wave; its other splits are
    # costed only where the single-wave rule lets them (multicast only when the work units
    # exceed one wave).
    count = _split_count(til.units, ceil_div(problem.k, K_BLOCK_BYTES // DTYPE_BYTES[problem.dtype]), lay.split_slots)
    paired = t.cluster_size > 1
    tiles = til.num_m * til.num_n
    single = _single_wave_splits(problem, device, t.block_m, til.num_m, tiles, t.shares_a)
    first = np.where(paired, np.searchsorted(SPLIT_VALUES, single, side="right"), 0)
    single_at_largest = paired & (first >= count)
    end = np.where(paired & (np.where(t.shares_a, til.num_n, til.num_m) < 2), 0, count)
    # A B-tail variant is costed unsplit, in a shared wave, where its layout is costed unsplit.
    staged = len(t) - len(lay.tail_of)
    first[staged:], end[staged:] = 0, 0
    if _shared_wave_possible(problem):
        wave = tiles[staged:] <= device.num_sms // t.cluster_size[staged:] * t.cluster_size[staged:]
        shared = _wide_wave_tiles(problem, t.block_m[staged:], til.num_m[staged:]) & wave
        end[staged:] = (first[lay.tail_of] == 0) & (end[lay.tail_of] > 0) & shared
    rows, split = np.nonzero((first[:, None] <= SPLIT_INDEX) & (SPLIT_INDEX < end[:, None]))
    if not len(rows):
        raise ValueError(f"no legal {ARCH} configuration for {problem.describe()}")
    candidates = t.take(rows, SPLIT_VALUES[split])
    costed = costs(problem, device, candidates, til.take(rows), report)
    return _Search(lay, candidates, costed, single_at_largest[:staged], SPLIT_VALUES[count[:staged] - 1])


def _rejections(problem: Problem, device: DeviceSpec, s: _Search) -> list[Rejection]:
    """The layouts the rules removed, in the rules' order, each with the first rule that did."""
    out = []
    lay = s.layouts
    for i, (desc, tile) in enumerate(zip(lay.descriptions, lay.fields)):
        rule = lay.pre[i]
        if rule is None and tile["cluster_size"] > 1:
            if _nothing_to_share(problem, tile["block_m"], tile["block_n"], tile["multicast"] == "A"):
                rule = _side_rule(tile["multicast"])
        rule = rule or lay.post[i]
        if rule is None and s.single_wave[lay.row[i]]:
            split = int(s.largest_split[lay.row[i]])
            rule = single_wave_rule(problem, device, tile["block_m"], tile["block_n"], split, tile["multicast"])
        if rule is not None:
            out.append(Rejection(desc, rule))
    return out


COST_MODEL = (
    "cycles of a persistent CTA, wave by wave over the work units (cluster tiles x K splits): "
    "per k-block the max of tensor-core, shared-memory traffic (TMA writes + wgmma reads), "
    "L2->SM ingress, latency/(stages-1), the CTA's share of chip L2 bandwidth and its DRAM "
    "streaming time (DRAM latency/(stages-1) + its share of the read bandwidth); plus the "
    "split-K fix-up and the epilogue per unit; never below streaming operands and workspace "
    "from DRAM once; plus a fixed cost per launch (more with split-K)"
)


def _a_rows(cfg: KernelConfig, problem: Problem) -> int:
    """The rows of A `cfg` loads: only those that exist when the whole of M fits one tile row.
    TMA boxes that are mostly out of bounds (M = 1 in a 64-row box) stream measurably slower on
    the H200 (1x4096x7168 ran 32.8 us against 19.2 us at M = 64 with the same kernel)."""
    rows = ceil_div(problem.m, 8) * 8
    if problem.a_major != "K" or cfg.multicast == "A" or rows >= cfg.block_m:
        return cfg.a_rows
    return rows


def _finish(t: Tiles, i: int, problem: Problem, device: DeviceSpec) -> KernelConfig:
    """Candidate `i` completed: its split, the raster order (`with_raster`) and the rows of A to load."""
    cfg, split_k = t.configs[t.origin[i]], int(t.split_k[i])
    raster = _raster(cfg, problem, device, int(t.b_box[i]), split_k)
    return with_fields(cfg, split_k=split_k, a_rows=_a_rows(cfg, problem), **raster)


def select(problem: Problem, device: DeviceSpec) -> KernelConfig:
    """The configuration the cost model ranks first (deterministic; heuristics.select memoises it)."""
    s = _search(problem, device)
    return _finish(s.candidates, _order(s.candidates, s.costs, 1)[0], problem, device)


def explain(problem: Problem, device: DeviceSpec, top: int = 5) -> dict:
    """Why `select` chose what it chose: the best `top` candidates with their modelled cost and
    terms (split_k, units, kb_per_unit, splitk_cycles, workspace_bytes among them) and the
    layouts the rules removed (see search.explanation for the keys)."""
    s = _search(problem, device, report=True)
    t, c = s.candidates, s.costs
    shown = [
        Candidate(_finish(t, i, problem, device), round(float(c["cost"][i]), 6), (), _terms(problem, device, t, c, i))
        for i in _order(t, c, max(1, top))
    ]
    return explanation(
        problem,
        device,
        shown[0].config,
        shown,
        _rejections(problem, device, s),
        top,
        legal_candidates=len(t),
        cost_model=COST_MODEL,
        clock_ghz=device.rates.clock_ghz,
    )


def config_with_fields(chosen: KernelConfig, data: dict, problem: Problem, device: DeviceSpec) -> KernelConfig:
    """`chosen` with the fields of a JITGEMM_CONFIG override, and those that follow from them
    re-derived by these rules (see heuristics.config_from_env)."""
    merged = {**chosen.to_dict(), **data}
    if "block_m" in data and "num_consumers" not in data:
        merged["num_consumers"] = num_consumers_for(merged["block_m"])
    if "multicast" in data and "cluster_size" not in data:
        merged["cluster_size"] = 1 if merged["multicast"] == "none" else 2
    if "cluster_size" in data and "multicast" not in data:
        if merged["cluster_size"] == 1:
            merged["multicast"] = "none"
        elif merged["multicast"] == "none":  # pair along the longer side by default
            merged["multicast"] = "A" if problem.n >= problem.m else "B"
    if merged["swap_ab"]:
        # swap_ab takes none of select's per-tile extras (layout.structural_problems), and
        # select's pair would pair other tiles: unpaired unless a pair is given
        extras = (("b_tail", False), ("a_rows", 0), ("split_k", 1)) + (
            (("cluster_size", 1), ("multicast", "none"))
            if "cluster_size" not in data and "multicast" not in data
            else ()
        )
        for field, off in extras:
            if field not in data:
                merged[field] = off
    cfg = KernelConfig(**merged)
    tile_changed = any(k in data for k in rules.TILE_FIELDS)
    if not (tile_changed or "split_k" in data):
        return cfg
    if tile_changed and structural_problems(cfg) and "cluster_size" not in data and "multicast" not in data:
        # select's pairing does not fit the tile that was given: run without a cluster
        cfg = with_fields(cfg, cluster_size=1, multicast="none")
    if not structural_problems(cfg):
        if tile_changed and "num_stages" not in data:
            cfg, _ = with_stages(cfg, device)
        if tile_changed and "split_k" not in data and not cfg.swap_ab:
            cfg = with_split(cfg, problem, device)  # select's split was for its own tile
        if "raster" not in data and "group_size" not in data:
            cfg = with_raster(cfg, problem, device)
    return cfg
