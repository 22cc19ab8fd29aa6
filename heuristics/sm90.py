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

How `select` gets there fast (the same choices as costing every candidate afresh, `_search`):
the layouts of each kind of problem (dtypes, majors, C) are screened once (`_layouts`); what N
makes of them once per N (`_by_n`); what depends on M only through its m block counts (the
candidates the rules let through, and the terms of the model that count work units and waves,
`_wave_terms`) once per M grain of 64 rows (`_skeleton`), so that a new M of a seen grain costs
only what the bytes it moves change (`_byte_terms`, a few dozen NumPy operations); and a span of
M whose every problem chooses the same candidate, as bounds at its ends prove (`_span_choice`:
every cost grows with M in a grain), gives that choice without costing from its second problem
on (the second pays for the proof).
"""

import functools
import operator
from typing import Any

import numpy as np

from jitgemm import geometry
from jitgemm.archs.sm90.layout import (
    BARRIER_BYTES,
    SMEM_CAPACITY,
    STREAM_K_SPLITS,
    WGMMA_M,
    KernelLayout,
    b_tail_fits,
    layout_of,
    pair_along,
    pipeline_bytes,
    splits_per_read,
    structural_problems,
)
from jitgemm.config import K_BLOCK_BYTES, KernelConfig
from jitgemm.geometry import Waves, ceil_div, choose_raster, covered_extent, kernel_shape
from jitgemm.problem import DTYPE_BYTES, Problem

from . import rules
from .cost import (
    Traffic,
    dram_latency_clk,
    dram_run_efficiency,
    epilogue_clk,
    mma_rate,
    output_bytes,
    slowest,
    tile_flops,
    tma_latency_clk,
)
from .device import ArchRates, DeviceSpec, arch_rates
from .rules import MIN_STAGES, base_config, stage_rule, with_fields
from .search import Candidate, Rejection, describe_layout, explanation, report_terms
from .sm90_checks import ACC_REG_LIMIT, SPLITK_ACC_REG_LIMIT, acc_regs, num_consumers_for

ARCH = "sm_90a"
RATES = arch_rates(ARCH)  # heuristics/calibration/sm_90a-132.json, measured on the H200 (RATES.md)

BLOCK_MS = (64, 128, 256)
# Tiles the cost model ranks: up to 256 wide. Wider ones (two wgmmas per atom, the output staged
# through a ring of buffers) run as forced configs; measured on the H200 (bf16, us) they are not
# reliably ahead: m128n384 B pairs ran 4096x24576x1536 in 458 and 4096x32768x512 in 230 against
# 467 and 234 for the chosen m128n256 B pairs, but 8192^3 in 1632 against 1602, and m128n320
# lost on all three. The model, given them, picks ones measured slower (m256n160, m256n176).
BLOCK_NS = tuple(range(16, 257, 16))
# swap_ab (D^T = B^T A^T, the user's M on the wgmma's N side) is costed only where M < N (and
# beyond one 64-row atom: `swap_possible`). Where M is the larger side it did not pay: measured
# on the H200 (bf16, medians of three interleaved passes, us) cuBLAS's own tile for
# 4096x576x7168, 128 x 160 swapped on 130 CTAs, ran 51.4 unpaired and 52.7 in pairs sharing B
# against 51.9 for the chosen 128x144 A pairs with a B tail (cuBLAS 48.7); 2048x576x7168 38.1
# against 34.3; 4096x768x4096 35.9 against 35.7.
CLUSTERS = ((1, "none"), (2, "A"), (2, "B"))

# Split-K: candidate maximum split counts (KernelConfig.split_k) and the bounds on them.
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
SPLIT_VALUES = np.asarray(SPLITS)
MIN_KB_PER_SPLIT = 4  # keep >= 4 K blocks per split: shorter ones do not amortise the fix-up

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
# Shared lines: the CTAs that read one operand tile at once request each of its 128-byte lines
# per k-block, one request per box row. A K-major row's k-block is one line; an MN-major
# operand narrower than a line (M or N <= 56: rows of 16-byte units, padded to 8 elements when
# staged) packs 8 / ceil(extent / 8) box rows into a line, all of them requested by every CTA
# of the tile's row or column. Fitted on the H200 calibration measurements
# (examples/data/calibration-sm_90a-132-2026-12-02.json: M-major A at M <= 64 measured 2-3.3x
# its modelled time with 84-828 tiles sharing A, 1.2x with a few). Chosen on the even-indexed
# half of its problems (the pick's measured time over the best candidate's, geomean 1.085 ->
# 1.066; 1, 2, 3, 4 clk: 1.067-1.071); on the other half, held out, 1.087 -> 1.077. Timed on
# the H200 against the model without it (examples/ab_choices.py, fresh seed 1843821192): the
# 35 of 300 choices it changes ran 1.155x faster (29 faster, 3 slower); 2 and 3 clk pick worse
# on both calibration sets (BENCHMARKS.md, session 4).
LINE_REQUEST_CLK = 1.5


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


def _zero_filled_a(problem: "Problem | _Shape", block_m, shares_a):
    """A pair sharing a K-major A whose rows, rounded to 8, fill at most half of one block
    (elementwise): the same tile unpaired loads only the rows of A that exist (`_a_rows`), but a
    multicast A cannot, so the pair loads whole boxes, at least half of each zero-filled by TMA,
    slowly. In the four calibration files of examples/data (two on the H200, two on an H100), where
    the model costs the two alike, such pairs ran slower than the same tile unpaired in all 41
    problems (1.015-2.38x, geomean 1.41x; 4 of 5 where it costs them apart). With less of the
    box past M the pairs ran 0.85-1.09x (five, M = 38..116; and 0.88-0.93x at M = 49 on an
    H100), pairs sharing an M-major A at small M about 0.9x (BENCHMARKS.md, session 12). (The
    swapped pass never meets the rule: its M is the user's N, above 64, its tiles at most 128
    rows.) It changes only at M = block_m / 2, a span edge (`_span`, asserted there)."""
    if problem.a_major != "K":
        return np.zeros(np.shape(block_m), dtype=bool)
    return np.asarray(shares_a, dtype=bool) & (ceil_div(problem.m, 8) * 16 <= np.asarray(block_m))


ZERO_FILL_MAX_M = max(BLOCK_MS) // 2  # past this M no block is half empty: `_zero_filled_a` is all False
ZERO_FILL_RULE = "no multicast A: M fills at most half of one block, which the unpaired tile loads alone (`_a_rows`)"


SHARED_WAVE_M_BLOCKS = 16
# N of a shared wave: at least 192. The swapped tiles of M = 192..768 (kernel N = the user's M)
# run at its rates on the H200 (bf16, N = K = 4096, us: M = 192 as m128n48 pairs in 16.6, M =
# 512 as m128n128 pairs in 25.5, both in one wave of 128 CTAs), but not at N = 128 (swapped
# m128n32 pairs ran 128x4096x7168 in 24.6 against 20.5 for the unswapped m64n128 pairs split 2).
SHARED_WAVE_MIN_N = 192


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
    return np.maximum(1, SPLIT_VALUES.searchsorted(most, side="right"))


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


@functools.cache
def _last_partial_rows(rest: int, block_m: int) -> int:
    """`partial_rows` of the last m block, of `rest` rows (partial_rows(m) is m - rest plus this)."""
    return partial_rows(rest, block_m, num_consumers_for(block_m))


# ----------------------------------------------------------------------------- cost model
#
# The model costs many candidates at once: `Tiles` holds tile layouts as columns (one element
# per candidate), `_Tiling` what tiling the problem with each of them counts, and every term
# below is elementwise over them. Every expression keeps the order of its operations as the
# model was written (floats round alike: the choices and the reported costs are the same to
# the bit); where one is rearranged, the comment says why it rounds alike.


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
        "fixed_clk",  # the larger of smem_clk and latency_clk
        "cluster_per_kb",  # cluster_size / K_BLOCK_BYTES (see `costs`)
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
    fixed_clk: np.ndarray
    cluster_per_kb: np.ndarray

    def __init__(self, configs: tuple, ints: np.ndarray, times: np.ndarray):
        self.configs = configs  # the configs the rows were made from (split_k 1)
        self.ints, self.times = ints, times
        # (zip stops at the last name: iterating an array to its end would raise an IndexError,
        # costly to format)
        self.__dict__.update(zip(self.INTS, ints))
        self.__dict__.update(zip(self.TIMES, times))

    @classmethod
    def of(cls, configs, laid=None) -> "Tiles":
        """The candidates `configs`. `laid`: per config, (a layout of its tile at any stage count,
        the shared memory of its own), where the caller has them (`_staged`); else its layout's."""
        if laid is None:
            laid = [(lay, lay.smem_bytes) for lay in map(layout_of, configs)]
        rows = np.array([_row(cfg, lay, smem) for cfg, (lay, smem) in zip(configs, laid)], dtype=np.int64)
        split_k, block_m, block_n, block_k, b_box, multicast, a_piece, b_piece, *rest = rows.reshape(len(configs), -1).T
        stages, cluster, acc, smem, stage_bytes, b_tail, out_elem, has_c = rest
        shares_a, shares_b = multicast == MULTICASTS.index("A"), multicast == MULTICASTS.index("B")
        flops = tile_flops(block_m, block_n, block_k)
        ints = (np.arange(len(configs)), split_k, block_m, block_n, b_box, shares_a, shares_b, a_piece, b_piece)
        ints += (stages, cluster, multicast, acc, smem, flops)
        # Shared memory, as DeepGEMM counts it: TMA writes of the stage (MN-major pieces padded
        # to the swizzle width) plus one wgmma read of each operand tile; a B tail takes a
        # second wgmma per atom, which reads the A tile again.
        smem_clk = (stage_bytes + ((1 + b_tail) * block_m + block_n) * K_BLOCK_BYTES) / RATES.smem_bytes_per_clk
        latency_clk = tma_latency_clk(RATES, stages)
        out_bytes = block_m * block_n * out_elem
        epilogue = [epilogue_clk(RATES, out_bytes, c, EPILOGUE_FIXED_CLK, C_LOAD_LATENCY_CLK) for c in (False, True)]
        times = (smem_clk, latency_clk, dram_latency_clk(RATES, stages), np.where(has_c, epilogue[1], epilogue[0]))
        times += (np.maximum(smem_clk, latency_clk), cluster / K_BLOCK_BYTES)
        return cls(tuple(configs), np.array(ints, dtype=np.int64), np.array(times, dtype=np.float64))

    def take(self, rows: np.ndarray, split_k: np.ndarray | None = None) -> "Tiles":
        """These rows (an index array), with split_k replaced when given."""
        ints = self.ints.take(rows, axis=1)
        if split_k is not None:
            ints[1] = split_k
        return Tiles(self.configs, ints, self.times.take(rows, axis=1))

    def __len__(self) -> int:
        return self.ints.shape[1]

    def config(self, i: int) -> KernelConfig:
        """The config of row i."""
        cfg = self.configs[self.origin[i]]
        return cfg if cfg.split_k == self.split_k[i] else with_fields(cfg, split_k=int(self.split_k[i]))


def _row(cfg: KernelConfig, lay: KernelLayout, smem_bytes: int) -> tuple:
    """What `Tiles.of` reads of one config, its layout `lay` and its shared memory `smem_bytes`."""
    return (
        cfg.split_k,
        cfg.block_m,
        cfg.block_n,
        cfg.block_k,
        _b_box(cfg, lay),
        MULTICASTS.index(cfg.multicast),
        lay.a.piece_extent,
        lay.b.piece_extent,
        cfg.num_stages,
        cfg.cluster_size,
        lay.acc_regs,
        smem_bytes,
        lay.stage_bytes,  # (the operand tiles' shared memory)
        cfg.b_tail,
        DTYPE_BYTES[cfg.out_dtype],
        cfg.has_c,
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


class _Record(tuple):
    """The tables below: tuples whose fields are the names annotated in the class body (built
    positionally; a field given a value defaults to it), as typing.NamedTuple makes them but
    cheaper to define: a NamedTuple class compiles its constructor, 0.1-0.25 ms each, a
    millisecond of the first select's import for these eight."""

    def __init_subclass__(cls):
        cls._fields = tuple(cls.__annotations__)
        cls._field_defaults = {name: vars(cls)[name] for name in cls._fields if name in vars(cls)}
        for i, name in enumerate(cls._fields):
            setattr(cls, name, property(operator.itemgetter(i)))

    def __new__(cls, *values):
        if len(values) < len(cls._fields):
            values += tuple(cls._field_defaults[name] for name in cls._fields[len(values) :])
        return tuple.__new__(cls, values)

    def _replace(self, **changes):
        return type(self)(*(changes.get(name, value) for name, value in zip(self._fields, self)))


class _Tiling(_Record):
    """What tiling the problem with each layout of a `Tiles` counts, whatever the split
    (elementwise): blocks, cluster units, the rows and columns read (see `traffic`), the
    operand rows streamed from DRAM, each operand weighted by the DRAM efficiency of its runs
    (see dram_runs); and, where counted for a device, its slots for the clusters."""

    num_m: Any
    num_n: Any
    tiles: Any  # num_m * num_n
    units: Any  # cluster units (tiles, or pairs of tiles) of one split
    l2_reads: Any  # rows + columns read out of L2, all CTAs together
    lands: Any  # ... landing in shared memory (a shared tile in both CTAs of its pair)
    covered_b: Any  # columns of B the boxes of all column blocks cover
    dram_rows: Any
    slots: np.ndarray | None = None  # clusters the persistent grid runs at once (`_slots`)
    wave_slots: np.ndarray | None = None  # CTAs of a wave of clusters (`_slots`)
    wide: np.ndarray | None = None  # `_wide_wave_tiles` of each layout

    def take(self, rows: np.ndarray) -> "_Tiling":
        """These rows (an index array)."""
        if self.lands is None:  # (not counted)
            num_m, num_n, tiles, units = np.array((self.num_m, self.num_n, self.tiles, self.units)).take(rows, axis=1)
            l2_reads = lands = dram_rows = None
        else:
            ints = (self.num_m, self.num_n, self.tiles, self.units, self.l2_reads, self.lands)
            num_m, num_n, tiles, units, l2_reads, lands = np.array(ints).take(rows, axis=1)
            dram_rows = self.dram_rows[rows]
        covered_b = self.covered_b[rows] if np.ndim(self.covered_b) else self.covered_b
        more = (None if v is None else v[rows] for v in (self.slots, self.wave_slots, self.wide))
        return _Tiling(num_m, num_n, tiles, units, l2_reads, lands, covered_b, dram_rows, *more)


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
    dram_rows = np.broadcast_to(dram_rows, num_m.shape)
    return _Tiling(num_m, num_n, num_m * num_n, units, l2_reads, lands, covered_b, dram_rows)


def _slots(device: DeviceSpec, cluster) -> tuple:
    """(the clusters of `cluster` CTAs a persistent grid runs at once (at least 1), the CTAs of a
    wave of them), elementwise."""
    return np.maximum(1, device.num_sms // cluster), device.num_sms // cluster * cluster


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
    narrow swizzles of 32- and 16-wide tiles and of B tails; clipped at the matrix edge). The
    pieces of one K row are adjacent but separate requests: measured, m64n48 in three 16-column
    pieces streamed 128x576x7168 in 22.7 us against 16.8 for m64n32 (one 32-column piece) and
    16.7 for m64n64 (so a 48-wide tile now loads one 64-wide piece, layout.mn_major_swizzle)."""
    lay, elem = layout_of(cfg), DTYPE_BYTES[problem.dtype]
    a_run = K_BLOCK_BYTES if lay.a.major_is_k else min(lay.a.piece_extent, problem.m) * elem
    b_run = K_BLOCK_BYTES if lay.b.major_is_k else min(lay.b.piece_extent, problem.n) * elem
    return a_run, b_run


_RATE_TABLES: dict = {}  # see `_rate_table`


def _rate_table(rates: ArchRates, of: int | str):
    """For an SM count `of`: `mma_rate` of every count of busy CTAs a persistent grid on that
    many SMs can have (up to one pair past the SMs: a grid always runs one cluster), by that
    count. For "wave": the divisors of `_byte_terms`' rows of bytes per CTA while CTAs run
    (the chip's L2 delivery, L2 read and DRAM read rates); for "fixup", of its rows of partials
    read back (over the CTA's L2 port, its share of the chip's in a full wave and in the last).
    At `rates`: made again when they change (as `heuristics.device.costing_with` changes them)."""
    got = _RATE_TABLES.get(of)
    if got is None or got[0] is not rates:
        if of == "wave":
            per_wave = [rates.l2_delivery_bytes_per_clk, rates.l2_total_bytes_per_clk, rates.dram_read_bytes_per_clk]
            table = np.array(per_wave, dtype=float)[:, None, None]
        elif of == "fixup":
            table = np.array([rates.l2_sm_bytes_per_clk] + 2 * [rates.l2_total_bytes_per_clk])[:, None]
        else:
            table = mma_rate(rates, int(of), np.arange(int(of) + 3))
        got = _RATE_TABLES[of] = rates, table
    return got[1]


def _k_blocks(problem: "Problem | _Shape") -> int:
    """K blocks of `problem`: 128 bytes of K each, whatever the tile."""
    return ceil_div(problem.k, K_BLOCK_BYTES // DTYPE_BYTES[problem.dtype])


def costs(
    problem: Problem, device: DeviceSpec, t: Tiles, til: _Tiling, report: bool = False, unsplit: bool = False
) -> dict:
    """Model the run time of each candidate of `t` (`til` its tiling of `problem`), clock
    cycles: a dict of arrays, "cost", "sm_time", "l2_reads" and "splits" (what `_order` ranks
    by; "splits" the int 1 with `unsplit`, which says that no candidate splits), and with
    `report` the other terms `explain` reports (see `_terms`). The model reads tiles in user
    coordinates: a swap_ab config is costed as the config of the transposed problem it runs as
    (`transposed`, `unswapped`). Rates: RATES (`device.rates` of every sm_90a device). In two
    parts: `_wave_terms`, which M enters only through its m block counts, and `_byte_terms`."""
    k_blocks = _k_blocks(problem)
    shared = til.wide is not None or _shared_wave_possible(problem)
    if shared and til.wide is None:
        til = til._replace(wide=_wide_wave_tiles(problem, t.block_m, til.num_m))
    split_cols = None
    if not unsplit or report:
        splits = np.minimum(t.split_k, k_blocks)  # (no split is empty)
        split_cols = _split_columns(splits, t.block_n, t.split_k, t.acc_regs)
    w = _wave_terms(device, t, til, k_blocks, shared, report, split_cols)
    lines = _shared_line_clk(problem, w.active, til.num_m * (1 + t.shares_a), til.num_n * (1 + t.shares_b))
    moved = np.array((til.lands, til.l2_reads, np.broadcast_to(til.dram_rows, til.num_m.shape)), dtype=float)
    return _byte_terms(problem, t, w, moved, np.maximum(w.fixed, lines), report, til, lines)


class _Waves(_Record):
    """The terms of `costs` that depend on how the work units of each candidate fill the grid,
    not on the bytes they move (M enters them only through its m block counts): see
    `_wave_terms`."""

    splits: Any  # K splits used, or the int 1 where no candidate splits
    kb_unit: Any  # K blocks of the longest split
    work: Any  # work units (cluster units x splits)
    busy: np.ndarray  # units a full wave runs
    full_waves: np.ndarray  # the waves but the last
    last: np.ndarray  # units of the last wave
    active: np.ndarray  # CTAs busy in a full wave (row 0) and in the last (row 1)
    cta_per_kb: np.ndarray  # CTA tiles x `Tiles.cluster_per_kb` (see `_byte_terms`)
    mma: np.ndarray  # tensor-core time per k-block (at the clock credit of `active[0]`)
    fixed: np.ndarray  # the larger of mma and `Tiles.fixed_clk`
    l2_gain: np.ndarray | None  # the shared-wave gain of both L2 rates; None: no candidate has one
    delivery_rate: Any  # the L2 delivery rate, times l2_gain
    launch: Any  # clock cycles per launch
    # Split-K (where no candidate splits: split None, the others 0; see `_splitk_terms`):
    split: np.ndarray | None  # where a candidate splits
    rounds: Any  # dependent L2 round trips of the fix-up
    round_trip_clk: Any  # ... their clock cycles
    fixup_reads: Any  # splits but split 0 (row 0), and 2 (S - 1) / S per CTA of `active` (rows 1, 2)
    ws_units: Any  # splits 1.. x column bytes x the tiles of a column (workspace = this x partial rows)
    num_m: Any  # m blocks
    column_bytes: Any  # bytes of fp32 partials of one row of a tile


def _wave_terms(
    device: DeviceSpec,
    t: Tiles,
    til: _Tiling,
    k_blocks: int,
    shared: bool,
    report: bool,
    split_cols=None,
    legal=None,
) -> _Waves:
    """`_Waves` of the candidates `t`, tiled `til`, over `k_blocks` K blocks; `shared`: whether
    any layout can run in a shared wave (`_shared_wave_possible`; then `til.wide` is counted);
    `split_cols`: `_split_columns` of the K splits each candidate uses (at most `k_blocks`),
    None where every candidate is unsplit (the scalar 1 stands for its splits); `legal`: where
    the rules let a candidate through, 0 or 1 (the launch of the others costs infinity), when
    not all (only with every candidate unsplit)."""
    r = RATES
    cluster, units = t.cluster_size, til.units
    splits = None if split_cols is None else split_cols[0]
    if splits is None:
        kb_unit, work = k_blocks, units
    else:
        kb_unit = ceil_div(k_blocks, splits)  # the longest split's K blocks
        work = units * splits
    # `waves_of(work, slots)` (work >= 1): every wave but the last keeps `busy` units running.
    slots, wave_slots = _slots(device, cluster) if til.slots is None else (til.slots, til.wave_slots)
    busy = np.minimum(slots, work)
    full_waves, last = np.divmod(work - 1, busy)  # (the last wave's units: the remainder + 1)
    last += 1
    # CTAs busy in a full wave (the first row) and in the last (the second): every term that
    # depends on them is counted for both at once.
    active = np.array((busy, last))
    active *= cluster
    # The tensor-core rate follows the CTAs the persistent grid keeps busy (the clock credit,
    # `mma_rate`); shared-memory traffic and latency are the tile's (`Tiles.fixed_clk`).
    mma = t.flops / _rate_table(r, device.num_sms)[active[0]]
    fixed = np.maximum(mma, t.fixed_clk)
    # In a shared wave both L2 rates are faster.
    l2_gain, delivery_rate = None, r.l2_delivery_bytes_per_clk
    if shared:
        in_wave = til.wide & ((til.tiles if splits is None else til.tiles * splits) <= wave_slots)
        if np.count_nonzero(in_wave):
            l2_gain = np.where(in_wave, r.l2_shared_wave_gain, 1.0)
            delivery_rate = delivery_rate * l2_gain
    # Per launch: the kernel's launch, ramp and drain; split-K's measured extra besides.
    split = None if splits is None else splits > 1
    if split is not None and (report or np.count_nonzero(split)):
        launch = np.array((r.launch_clk, r.launch_clk + SPLITK_LAUNCH_CLK)).take(split)  # (unsplit, split)
        more = _splitk_terms(split_cols, til.num_m, units * cluster, active)
    else:
        launch, split, more = r.launch_clk, None, (0, 0, 0, 0, 0, 0)
    if legal is not None:  # (unsplit: the launch is the same for every candidate)
        launch = np.array((np.inf, launch)).take(legal)
    return _Waves(
        1 if splits is None else splits,
        kb_unit,
        work,
        busy,
        full_waves,
        last,
        active,
        units * t.cluster_per_kb,
        mma,
        fixed,
        l2_gain,
        delivery_rate,
        launch,
        split,
        *more,
    )


def _splitk_terms(split_cols, num_m, cta_tiles, active) -> tuple:
    """The split-K columns of `_Waves`, but for `split`, of the candidates split as
    `split_cols` says (`_split_columns`). Splits 1.. park their fp32 partial tiles (only live
    rows) in the workspace; split 0 reads them back (a batch of splits a round trip) and runs
    the epilogue."""
    # (rows indexed, not unpacked: iterating over an array ends in an IndexError, costly to format)
    splits, others, twice_others, column_bytes = split_cols[0], split_cols[1], split_cols[2], split_cols[3]
    ws_row_bytes, rounds, round_trip_clk = split_cols[4], split_cols[5], split_cols[6]
    # What a CTA reads back, in partial tiles: split 0 the others' over its own L2 port; on
    # average a CTA moves 2 (S - 1) / S partials over its share of the chip's (splits 1.. store
    # one, split 0 reads S - 1).
    reads = np.empty((3, len(others)))
    reads[0] = others
    reads[1:] = active * twice_others / splits
    ws_units = ws_row_bytes * (cta_tiles // num_m)
    return rounds, round_trip_clk, reads, ws_units, num_m, column_bytes


def _split_columns(splits, block_n, split_k, acc_regs) -> np.ndarray:
    """What `_splitk_terms` reads of candidates split `splits` ways (of at most `split_k`),
    with tiles `block_n` wide of `acc_regs` accumulators per math thread, whatever the
    problem, as rows: the splits, the others (splits - 1), twice the others, the bytes of
    fp32 partials of one row of a tile, those of the others together, the dependent L2
    round trips of the fix-up (`_fixup_rounds`) and their clock cycles (integers:
    elementwise)."""
    others = splits - 1
    column_bytes = block_n * PARTIAL_BYTES
    rounds = _fixup_rounds(others, split_k, acc_regs)
    return np.array(
        (splits, others, 2 * others, column_bytes, others * column_bytes, rounds, rounds * L2_ROUND_TRIP_CLK)
    )


def _fixup_rounds(others, split_k, acc_regs):
    """Dependent L2 round trips of the split-K fix-up of tiles of `acc_regs` accumulators split
    `others` + 1 ways, of at most `split_k` (0 unsplit; elementwise)."""
    return np.where(others > 0, SPLITK_SYNC_ROUND_TRIPS + ceil_div(others, splits_per_read(split_k, acc_regs)), 0)


def _byte_terms(
    problem: Problem, t: Tiles, w: _Waves, moved: np.ndarray, floor, report=False, til=None, lines=None
) -> dict:
    """`costs` of the candidates `t` with wave terms `w`, whose tiles land `moved[0]` rows and
    columns in shared memory, read `moved[1]` from L2 and stream `moved[2]` from DRAM (all CTAs
    together, per K slice; see `_Tiling`), and whose k-blocks take at least `floor` (per row
    of `w.active`: the largest of `w.fixed` and the shared-line term `lines`, whatever the bytes
    they move); with `report`, the terms `explain` reports (`til` their tiling)."""
    r = RATES
    # Per k-block of one CTA (`Tiles` holds the times of the tile alone). Bytes per CTA, one row
    # each: landing in its shared memory; read from L2; from DRAM (A once, B once per column
    # block as its boxes cover it: the overhang of padded pieces is fetched by both neighbours
    # at the same time, so it comes from DRAM twice), spread over the CTA tiles, a pair's
    # recomputed peer past the edge included (the m blocks of a column share B through L2):
    # rows * K_BLOCK_BYTES / (units * cluster), computed as rows / (units * cluster_per_kb),
    # which rounds alike (the two scalings by K_BLOCK_BYTES, a power of 2, are exact).
    per_cta = moved / w.cta_per_kb
    l2_ingress = per_cta[0] / r.l2_sm_bytes_per_clk
    # While `active` CTAs run, one row each: the L2 delivery into every CTA's shared memory,
    # the CTA's share of the chip-wide L2 bandwidth and its DRAM streaming time
    # (`dram_stream_clk`: the loaded latency over the stages in flight, in series with its
    # share of the read bandwidth).
    rates = _rate_table(r, "wave")
    if w.l2_gain is None:  # (a gain of 1 changes no term)
        per_wave = per_cta[:, None] * w.active
        per_wave /= rates
    else:  # in a shared wave both L2 rates are faster
        per_cta[1] /= w.l2_gain
        per_wave = per_cta[:, None] * w.active
        per_wave[0] /= w.delivery_rate
        per_wave[1:] /= rates[1:]
    per_wave[2] += t.dram_latency_clk
    # the slowest (maxima are exact, in any order)
    clk = np.maximum(np.maximum(floor, l2_ingress), np.maximum(np.maximum(per_wave[0], per_wave[1]), per_wave[2]))

    # Per unit, in a full wave and in the last: its k-blocks, split-K's fix-up (serial after the
    # main loop: the other splits' store fence and count, the read-back of their partials over
    # the CTA's L2 port or its share of the chip's, whichever is slower), the epilogue.
    clk *= w.kb_unit
    fixup, ws_total = 0.0, 0
    if w.split is not None:
        m = problem.m  # (block_m >> 7 is the index of block_m in BLOCK_MS)
        rows = np.array([m - m % b + _last_partial_rows(m % b, b) for b in BLOCK_MS])[t.block_m >> 7]
        # Bytes one split of a tile stores (the scaling by PARTIAL_BYTES, a power of 2, is
        # exact in either order), and all of them.
        ws_tile = rows / w.num_m * w.column_bytes
        ws_total = w.ws_units * rows
        reads = w.fixup_reads * ws_tile
        reads /= _rate_table(r, "fixup")
        fixup = w.round_trip_clk + np.maximum(reads[0], reads[1:])  # (0 unsplit)
        clk += fixup
    clk += t.epilogue_clk
    sm_time = w.full_waves * clk[0] + clk[1]  # `persistent_time`

    # The DRAM floor: the operands at the read-only streaming rate, output and workspace at the
    # copy rate.
    # (dram_rows * K * the element size: a power of 2, whose scaling is exact in either order)
    hbm_time = moved[2] * (problem.k * DTYPE_BYTES[problem.dtype]) / r.dram_read_bytes_per_clk
    hbm_time += (output_bytes(problem) + ws_total) / r.hbm_bytes_per_clk
    cost = np.maximum(sm_time, hbm_time)
    cost += w.launch
    out = {"cost": cost, "sm_time": sm_time, "l2_reads": moved[1], "splits": w.splits}
    if report:
        terms = {"mma": w.mma, "smem": t.smem_clk, "l2_ingress": l2_ingress, "latency": t.latency_clk}
        terms["shared_lines"] = lines[0]
        terms.update(l2=per_wave[1, 0], dram=per_wave[2, 0], delivery=per_wave[0, 0])
        cta_tiles = til.units * t.cluster_size
        out.update(
            bound=np.where(hbm_time >= sm_time, "hbm", slowest(terms)[0]),
            hbm_time=hbm_time,
            traffic=Traffic(cta_tiles, til.units, til.l2_reads, til.lands),
            waves=Waves(w.work, w.busy, w.full_waves + 1, w.last),
            kb_unit=w.kb_unit,
            dram_efficiency=np.broadcast_to((problem.m + til.covered_b) / moved[2], sm_time.shape),
            launch=w.launch,
            fixup=fixup[0],
            rounds=w.rounds,
            ws_total=ws_total,
        )
    return out


def _requests_per_line(major: str, extent: int, mn_major: str) -> int:
    """Box rows of an operand's k-block in one 128-byte line (`LINE_REQUEST_CLK`): 1 for a
    K-major operand, else 8 / ceil(min(extent, 64) / 8) (floored, at least 1)."""
    if major != mn_major:
        return 1
    return max(1, 8 // -(-min(extent, 64) // 8))


def _shared_line_clk(problem: "Problem | _Shape", active, a_groups, b_groups) -> np.ndarray:
    """Per k-block (rows as `active`'s: a full wave, the last), the requests the busiest line
    of an operand tile serves: the CTAs reading the tile at once (the active CTAs over the m
    blocks for A, the n blocks for B, at least 1; a multicast pair's CTAs request once: over
    `a_groups`, m blocks x (1 + shares_a), and `b_groups`) times its box rows per line, at
    LINE_REQUEST_CLK each. Depends on M only through the m block counts and ceil(M / 8), which
    are constant in a span of M (`_span`)."""
    a_line = _requests_per_line(problem.a_major, problem.m, "M")
    b_line = _requests_per_line(problem.b_major, problem.n, "N")
    if a_line == b_line:
        # The busier operand is the one over fewer groups: every quotient, maximum and product
        # rounds alike (each rounding is monotonic), once instead of once per operand.
        share = np.maximum(active / np.minimum(a_groups, b_groups), 1)
        return LINE_REQUEST_CLK * (share if a_line == 1 else share * a_line)
    a_share = np.maximum(active / a_groups, 1)
    b_share = np.maximum(active / b_groups, 1)
    return LINE_REQUEST_CLK * np.maximum(a_share * a_line, b_share * b_line)


def _terms(problem: Problem, device: DeviceSpec, t: Tiles, c: dict, i: int) -> dict:
    """The cost terms `explain` reports for candidate `i` of `costs`' answer `c` (with `report`)."""
    w, tr = c["waves"], c["traffic"]
    elem = DTYPE_BYTES[problem.dtype]
    wave = Waves(int(w.tiles[i]), int(w.slots[i]), int(w.waves[i]), int(w.last_wave_tiles[i]))
    row_traffic = Traffic(*(int(getattr(tr, f)[i]) for f in Traffic._fields))
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
    tile (less padding), block_m, block_n, the multicast side, and last the config name. Costs
    (and SM-side times) are compared rounded to 6 decimals, as NumPy's `round` rounds them."""
    cost = c["cost"]
    if top == 1:
        # The rows whose rounded cost can be the least (`round` never reorders), rounded.
        low = float(cost[cost.argmin()])
        rows = (cost <= low + (1e-5 + low * 1e-12)).nonzero()[0]
        if len(rows) == 1:
            return [int(rows[0])]
        rounded = [_round6(x) for x in cost[rows].tolist()]
        least = min(rounded)
        keep = [i for i, x in enumerate(rounded) if x == least]
        rows, rounded = rows[keep], [least] * len(keep)
    else:
        cost = cost.round(6)
        # Only the rows as cheap as the top-th cheapest can be among the first `top`.
        rows = (cost <= np.partition(cost, min(top, len(cost)) - 1)[min(top, len(cost)) - 1]).nonzero()[0]
        rounded = cost[rows].tolist()
    if len(rows) == 1:
        return [int(rows[0])]
    # The keys of those rows, in plain Python (they are few).
    bm, bn, cluster, multicast = t.ints[_ORDER_COLUMNS[:, None], rows].tolist()
    keys = list(
        zip(
            rounded,
            [_round6(x) for x in c["sm_time"][rows].tolist()],
            c["l2_reads"][rows].tolist(),
            c["splits"][rows].tolist() if np.ndim(c["splits"]) else [c["splits"]] * len(rows),
            cluster,
            [m * n for m, n in zip(bm, bn)],
            bm,
            bn,
            multicast,
        )
    )
    order = sorted(range(len(rows)), key=keys.__getitem__)
    # Rows tied on every numeric key with the last one shown are sorted by name with it.
    shown = order[:top]
    for i in order[top:]:
        if keys[i] != keys[shown[-1]]:
            break
        shown.append(i)
    if any(keys[i] == keys[j] for i, j in zip(shown, shown[1:])):
        shown.sort(key=lambda i: (keys[i], t.config(rows[i]).name))
    return [int(rows[i]) for i in shown[:top]]


def _round6(x: float) -> float:
    """NumPy's `round(x, 6)` of a float (x * 1e6 rounded half to even, over 1e6)."""
    return round(x * 1e6) / 1e6


_ORDER_COLUMNS = np.array([Tiles.INTS.index(name) for name in ("block_m", "block_n", "cluster_size", "multicast")])


def cost_of(problem: Problem, device: DeviceSpec, cfg: KernelConfig) -> Candidate:
    """`cfg` costed on `problem` with the terms `explain` reports (see `costs`)."""
    if cfg.swap_ab:  # costed as the config of the transposed problem it runs as
        plain = cost_of(transposed(problem), device, unswapped(cfg, problem))
        return Candidate(cfg, plain.cost, (), plain.terms)
    t = Tiles.of([cfg])
    if cfg.stream_k:
        c = stream_k_costs(problem, device, t, report=True)
    else:
        c = costs(problem, device, t, _tiling(problem, t), report=True)
    return Candidate(cfg, round(float(c["cost"][0]), 6), (), _terms(problem, device, t, c, 0))


def costs_of(problem: Problem, device: DeviceSpec, configs: list) -> np.ndarray:
    """The modelled cost (clock cycles) of each of `configs` on `problem`, costed all at once as
    select costs its candidates (the same numbers as `cost_of`): the swapped ones as the
    configs of the transposed problem they run as, the stream-K ones by `stream_k_costs`."""
    both = [cfg.name for cfg in configs if cfg.swap_ab and cfg.stream_k]
    if both:
        raise ValueError(f"configs: stream_k does not run swapped: {both}")
    out = np.empty(len(configs))
    for swap, stream_k in ((False, False), (True, False), (False, True)):
        rows = [i for i, cfg in enumerate(configs) if (cfg.swap_ab, cfg.stream_k) == (swap, stream_k)]
        if rows:
            p = transposed(problem) if swap else problem
            t = Tiles.of([unswapped(configs[i], problem) if swap else configs[i] for i in rows])
            out[rows] = (stream_k_costs(p, device, t) if stream_k else costs(p, device, t, _tiling(p, t)))["cost"]
    return out


# Stream-K (KernelConfig.stream_k; geometry.stream_k_segments) cuts the K blocks of the last one
# to two waves' worth of tiles into one equal range per cluster: every cluster busy to the end,
# at the price of the split-K fix-up of the tiles cut between clusters. `select` does not choose
# it: a rule choosing it where these costs are lower changed 10 of the recorded choices and 79
# of the dense ones; 23 of those, forced, ran 0.937x as fast as the wave order's choices
# (geomean; 8 faster, 13 slower, 0.60 to 1.35x; H100, 2026-12-07, BENCHMARKS.md session 22).
# Forced configs (config=, tuning files) are costed by it (`cost_of`, `costs_of`).


def stream_k_costs(problem: Problem, device: DeviceSpec, t: Tiles, report: bool = False) -> dict:
    """`costs` of the candidates `t` (stream_k, unswapped) on `problem`: every cluster busy to the end
    (no wave quantisation), running its K blocks (its whole tiles', then its share of the cut
    range's) at the tile's k-block time with every CTA busy, the epilogues of the tiles it
    reduces (at most ceil(tiles / clusters)), and the fix-up of a tile cut between `splits`
    clusters (two where the cut range is a wave or more; else about clusters / cut tiles + 1),
    with the workspace of the cut tiles."""
    til = _tiling(problem, t)
    k_blocks = _k_blocks(problem)
    units, cluster = til.units, t.cluster_size
    ctas = np.minimum(_slots(device, cluster)[0], units * k_blocks)  # clusters launched (grid_size)
    cut = units - geometry.stream_k_whole_tiles(units, ctas)
    # (the most clusters sharing a cut tile, as geometry.stream_k_max_splits counts them tile by
    # tile: 2 where a range is a tile or longer, else about clusters per tile + 1)
    splits = np.where(cut >= ctas, 2, ceil_div(ctas, np.maximum(cut, 1)) + 1)
    splits = np.where(cut == 0, 1, np.minimum(splits, k_blocks))
    split_cols = _split_columns(splits, t.block_n, STREAM_K_SPLITS, t.acc_regs)
    w = _wave_terms(device, t, til, k_blocks, False, report, split_cols)
    active = np.array((ctas, ctas)) * cluster
    mma = t.flops / _rate_table(RATES, device.num_sms)[active[0]]
    # (the workspace of the cut tiles: `_splitk_terms` counts it per m block)
    cut_tiles = ceil_div(cut * cluster, til.num_m) * til.num_m
    fixup = _splitk_terms(split_cols, til.num_m, cut_tiles, active) if w.split is not None else ()
    w = w._replace(
        kb_unit=geometry.stream_k_cluster_blocks(units, k_blocks, ctas),
        work=ctas,
        busy=ctas,
        full_waves=np.zeros_like(ctas),
        last=ctas,
        active=active,
        mma=mma,
        fixed=np.maximum(mma, t.fixed_clk),
        **dict(zip(("rounds", "round_trip_clk", "fixup_reads", "ws_units", "num_m", "column_bytes"), fixup)),
    )
    times = t.times.copy()
    times[Tiles.TIMES.index("epilogue_clk")] *= ceil_div(units, ctas)
    t = Tiles(t.configs, t.ints, times)
    lines = _shared_line_clk(problem, w.active, til.num_m * (1 + t.shares_a), til.num_n * (1 + t.shares_b))
    moved = np.array((til.lands, til.l2_reads, til.dram_rows), dtype=float)
    return _byte_terms(problem, t, w, moved, np.maximum(w.fixed, lines), report, til, lines)


# ----------------------------------------------------------------------------- search


def stage_smem(cfg: KernelConfig, stages: int) -> int:
    """Shared memory of `cfg` with `stages` stages as the stage count is chosen: with a staging
    buffer for every store box of the tile, unless that leaves fewer than MIN_STAGES stages
    (tiles wider than 256), which stage their output through a ring of fewer buffers
    (`layout.epilogue_buffers`). A deeper pipeline bought with fewer buffers did not pay:
    measured on the H200 (bf16, medians of three passes, us), m128n256 B pairs with 4 stages and
    2 of the 4 boxes staged at a time ran 8192^3 in 1659 against 1617 with 3 stages and all 4,
    4096x32768x512 in 250 against 247, 4096x24576x1536 in 493 against 486."""
    return _stage_smem(layout_of(cfg), stages)


def _stage_smem(lay: KernelLayout, stages: int) -> int:
    """`stage_smem` of the config of `lay`: the stages and the staging of any stage count's
    layout are alike."""
    cfg = lay.config
    if pipeline_bytes(lay.stage_bytes, MIN_STAGES, cfg.num_consumers) + lay.out_bytes_whole <= SMEM_CAPACITY:
        return pipeline_bytes(lay.stage_bytes, stages, cfg.num_consumers) + lay.out_bytes_whole
    return layout_of(cfg.derived(num_stages=stages)).smem_bytes


def with_stages(cfg: KernelConfig, device: DeviceSpec) -> tuple[KernelConfig, int]:
    """(`cfg` with as many pipeline stages as fit shared memory (capped; at least 2; see
    `stage_smem`), the count that fits (0 when not even 2 do))."""
    return _staged(cfg, device)[:2]


def _staged(
    cfg: KernelConfig, device: DeviceSpec, lay: KernelLayout | None = None
) -> tuple[KernelConfig, int, KernelLayout, int]:
    """`with_stages`, then a layout of `cfg` (at any stage count: they differ only in their
    shared memory; `lay` where the caller has one) and the shared memory of the staged config
    (`stage_smem`)."""
    lay = layout_of(cfg) if lay is None else lay  # (one layout for every stage count tried)
    capacity, whole = device.smem_capacity, lay.out_bytes_whole
    if pipeline_bytes(lay.stage_bytes, MIN_STAGES, cfg.num_consumers) + whole <= SMEM_CAPACITY:
        # `_stage_smem` grows by one stage and its two barriers a stage: solved as `max_stages` does
        per_stage = lay.stage_bytes + 2 * BARRIER_BYTES
        stages = (capacity - pipeline_bytes(lay.stage_bytes, 0, cfg.num_consumers) - whole) // per_stage
        stages = 0 if stages < 2 else min(stages, rules.MAX_STAGES)
    else:
        stages = rules.max_stages(cfg, capacity, smem_of=lambda _, stages: _stage_smem(lay, stages))
    staged = cfg.derived(num_stages=max(2, stages))  # (at most MAX_STAGES)
    return staged, stages, lay, _stage_smem(lay, staged.num_stages)


def with_raster(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> KernelConfig:
    """`cfg` with the L2 raster (side and group size) of the smallest working set (see `_raster`)."""
    return with_fields(cfg, **_raster(cfg, problem, device, b_box_of(cfg), cfg.split_k))


def _raster(cfg: KernelConfig, problem: Problem, device: DeviceSpec, b_box: int, split_k: int) -> dict:
    """The raster fields of the smallest working set of `cfg`'s tiles, which load `b_box`
    columns of B, split `split_k` ways. With split-K the consecutive work units of a wave are
    the splits of fewer tiles."""
    splits = min(split_k, ceil_div(problem.k, cfg.block_k))  # (`geometry.splits_used`)
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
    staged = _staged_tail(cfg, device)
    return None if staged is None else staged[0]


def _staged_tail(cfg: KernelConfig, device: DeviceSpec) -> tuple[KernelConfig, int, KernelLayout, int] | None:
    """`_staged` of `cfg`'s B-tail variant (see `with_tail`), or None where it has no tail."""
    if cfg.b_major != "N":  # (a tail needs an N-major B, `structural_problems`: skip making one)
        return None
    tail = cfg.derived(b_tail=True, split_k=1)
    return None if structural_problems(tail) else _staged(tail, device)


class _Layouts(_Record):
    """Every tile layout of one kind of problem (device, dtypes, majors, C), in the rules'
    order, with what the rules that do not look at the shape said of each: the rules before
    the multicast side's (`pre`) and the structural and pipeline-depth rules (`post`)."""

    fields: tuple  # the tile fields of each layout
    pre: tuple  # a rule's words, or None
    post: tuple
    row: np.ndarray  # of each layout that no such rule removes: its row of `tiles`, else -1
    tiles: Tiles  # those layouts, staged (split_k 1), then their B-tail variants
    tail_of: np.ndarray  # per B-tail variant (the rows of `tiles` past the staged layouts): its layout's row
    split_slots: np.ndarray  # per row of `tiles`: see `_split_slots`
    half_split_slots: np.ndarray  # split_slots // 2
    split_count: np.ndarray  # `_split_count` of its most splits, most = 0..max(split_slots)
    splits_up_to: np.ndarray  # how many of SPLITS are <= s, s = 0..num_sms
    # Per row of `tiles` and each of SPLITS (row-major, see `_split_candidates`): the row,
    # then `_split_columns` of that split.
    split_table: np.ndarray
    # What a problem's M makes of a row of `tiles` depends on its block_m, its multicast and
    # (an M-major A) the pieces of A it loads only: the rows' classes, which `_by_m` counts.
    classes: tuple  # (block_m, the index of the multicast in MULTICASTS, a_piece or 0) of each class
    by_m_index: np.ndarray  # `_by_m`'s table per row of `tiles`, from its classes' rows one after the other
    # Per row of `tiles`, the rows of `per_row`: `_Tiling.slots`, `_Tiling.wave_slots`, the
    # tiles of a cluster unit along N (2 for a pair sharing A, else 1) and along M, its class.
    per_row: np.ndarray
    unpaired_a: np.ndarray  # ... not a pair sharing A
    # The (block_n, b_box) of the tiles that load B past their columns (see `covered_extent`),
    # and per row of `tiles`, the index of its own (that count, for a tile that does not).
    wide_boxes: tuple
    box_of: np.ndarray

    @property
    def staged(self) -> int:
        """The rows of `tiles` that are layouts (the B-tail variants follow them)."""
        return len(self.tiles) - len(self.tail_of)

    @property
    def slots(self) -> np.ndarray:
        return self.per_row[0]

    @property
    def wave_slots(self) -> np.ndarray:
        return self.per_row[1]

    @property
    def pair_n(self) -> np.ndarray:
        return self.per_row[2]

    @property
    def pair_m(self) -> np.ndarray:
        return self.per_row[3]

    @property
    def class_of(self) -> np.ndarray:
        return self.per_row[4]


@functools.cache
def _tile_layouts() -> tuple:
    """The tile fields of every tile layout, in the rules' order: the same for every kind of problem."""
    tiles = [
        dict(
            block_m=block_m,
            block_n=block_n,
            num_consumers=num_consumers_for(block_m),
            cluster_size=cluster,
            multicast=multicast,
        )
        for cluster, multicast in CLUSTERS
        for block_m in BLOCK_MS
        for block_n in BLOCK_NS
    ]
    return tuple(tiles)


def _split_table(tiles: Tiles) -> np.ndarray:
    """`_Layouts.split_table` of the rows of `tiles`."""
    rows, split = np.divmod(np.arange(len(tiles) * len(SPLITS)), len(SPLITS))
    splits = SPLIT_VALUES[split]
    return np.concatenate(([rows], _split_columns(splits, tiles.block_n[rows], splits, tiles.acc_regs[rows])))


@functools.lru_cache(maxsize=64)
def _layouts(device: DeviceSpec, *kind) -> _Layouts:
    """The layouts of one kind of problem (dtype, out_dtype, a_major, b_major, has_c)."""
    like = Problem(1, 1, 1, *kind)  # a problem of that kind: the rules below read no shape
    fields = _tile_layouts()
    base = base_config(like, device)  # validated once: each tile's config derives from it
    pre, post, staged, laid = [], [], [], []  # laid: (layout, shared memory) of each staged config
    for tile in fields:
        rule = _pre_rule(like, device, tile["block_m"], tile["block_n"], tile["cluster_size"])
        pre.append(rule)
        later = None
        if rule is None:
            # `search.screen`'s rules, in its order: structure, then the pipeline depth
            cfg = base.derived(**tile)
            later = "; ".join(structural_problems(cfg)) or None
            if later is None:
                # (past layout_of's memo: each kind's configs are laid out once, here; it would only keep them)
                cfg, stages, lay, smem = _staged(cfg, device, layout_of.__wrapped__(cfg))
                later = stage_rule(cfg.block_m, cfg.block_n, stages)
            if later is None:
                staged.append(cfg)
                laid.append((lay, smem))
        post.append(later)
    row = np.full(len(fields), -1)
    row[[i for i, (p, q) in enumerate(zip(pre, post)) if p is None and q is None]] = np.arange(len(staged))
    tails = [(i, tail) for i, cfg in enumerate(staged) if (tail := _staged_tail(cfg, device)) is not None]
    tail_of = np.array([i for i, _ in tails], dtype=int)
    tiles = Tiles.of(staged + [tail[0] for _, tail in tails], laid + [tail[2:] for _, tail in tails])
    split_slots = _split_slots(device, tiles.cluster_size, tiles.acc_regs)
    a_pieces = tiles.a_piece if like.a_major == "M" else np.zeros(len(tiles), dtype=int)
    keys = list(zip(tiles.block_m.tolist(), tiles.multicast.tolist(), a_pieces.tolist()))
    classes = tuple(sorted(set(keys)))
    class_of = np.array([classes.index(key) for key in keys], dtype=int)
    boxes = list(zip(tiles.block_n.tolist(), tiles.b_box.tolist()))
    wide_boxes = tuple(sorted({(block_n, box) for block_n, box in boxes if box > block_n}))
    box_of = [wide_boxes.index(pair) if pair in wide_boxes else len(wide_boxes) for pair in boxes]
    return _Layouts(
        tuple(fields),
        tuple(pre),
        tuple(post),
        row,
        tiles,
        tail_of,
        split_slots,
        split_slots // 2,
        _split_count(1, 4 * int(split_slots.max()), np.arange(split_slots.max() + 1)),
        SPLIT_VALUES.searchsorted(np.arange(device.num_sms + 1), side="right"),
        _split_table(tiles),
        classes,
        class_of * _BY_M + np.arange(_BY_M)[:, None],
        np.array((*_slots(device, tiles.cluster_size), 1 + tiles.shares_a, 1 + tiles.shares_b, class_of)),
        tiles.shares_a == 0,
        wide_boxes,
        np.array(box_of, dtype=int),
    )


def _kind(problem: Problem) -> tuple:
    return problem.dtype, problem.out_dtype, problem.a_major, problem.b_major, problem.has_c


def _layouts_of(problem: Problem, device: DeviceSpec) -> _Layouts:
    return _layouts(device, *_kind(problem))


class _ByN(_Record):
    """What a problem's N makes of the rows of a `_Layouts` (see `_traffic`), elementwise."""

    # Rows: n blocks, cluster units along N, the columns of B one row of cluster units reads,
    # and the groups the CTAs reading B spread over (n blocks x (1 + shares_b), see
    # `_shared_line_clk`).
    counts: np.ndarray
    covered_b: Any
    b_dram: np.ndarray  # the columns of B streamed from DRAM, weighted by the DRAM efficiency of their runs
    can_share: np.ndarray  # 0 for a pair sharing A with one n block (nothing to share), else 1


@functools.lru_cache(maxsize=256)
def _by_n(device: DeviceSpec, kind: tuple, n: int) -> _ByN:
    """`_ByN` of N = `n` for the layouts of `kind` (see `_layouts`)."""
    lay = _layouts(device, *kind)
    t = lay.tiles
    num_n = -(-n // t.block_n)
    grid_n = (num_n + t.shares_a) // lay.pair_n  # (`ceil_div`)
    covered_b = n
    if lay.wide_boxes:  # (counted once per box width, in plain integers)
        covered = [covered_extent(n, block, box) for block, box in lay.wide_boxes] + [n]
        covered_b = np.array(covered, dtype=np.int64).take(lay.box_of)
    # A pair sharing A whose peer falls past the edge re-reads the last n block.
    b_cols = covered_b + (num_n & t.shares_a) * ((n - 1) % t.block_n + 1)
    if kind[3] == "K":
        b_dram = np.full(len(t), covered_b / dram_run_efficiency(RATES, K_BLOCK_BYTES))
    else:
        b_dram = covered_b / dram_run_efficiency(RATES, np.minimum(t.b_piece, n) * DTYPE_BYTES[kind[0]])
    counts = np.array((num_n, grid_n, b_cols, num_n * lay.pair_m))
    return _ByN(counts, covered_b, b_dram, (num_n >= 2) | lay.unpaired_a)


_BY_M = 7  # the rows of `_by_m`'s table


def _by_m(problem: "Problem | _Shape", lay: _Layouts) -> np.ndarray:
    """Per row of `lay.tiles`, one row each: m blocks, cluster units along M (twice, to multiply
    by `_ByN.counts`: see `_rows`), whether the single-wave rule's exception applies (1 for an
    unpaired tile: the rule does not), whether a pair sharing B has two m blocks to share (1
    for the others), whether the tiles are wide enough for a shared wave (`_wide_wave_tiles`),
    and the groups the CTAs reading A spread over (m blocks x (1 + shares_a), see
    `_shared_line_clk`); counted once per class of rows. M enters them through its m block
    counts only."""
    m = problem.m
    wide_n = problem.n >= SHARED_WAVE_MIN_N
    ints: list = []  # the classes' rows one after the other, `_BY_M` columns each
    for block_m, multicast, _ in lay.classes:
        num_m = -(-m // block_m)
        wide = block_m >= 128 and num_m >= SHARED_WAVE_M_BLOCKS and wide_n
        if multicast == 1:  # a pair sharing B
            grid_m = -(-num_m // 2)
            ints += (num_m, grid_m, grid_m, num_m == 2, num_m >= 2, wide, num_m)
        elif multicast == 0:  # a pair sharing A
            ints += (num_m, num_m, num_m, wide, True, wide, 2 * num_m)
        else:
            ints += (num_m, num_m, num_m, True, True, wide, num_m)
    return np.array(ints, dtype=np.int64).take(lay.by_m_index)  # (a dtype given: no type to find)


def _a_side(problem: "Problem | _Shape", lay: _Layouts) -> tuple[list, list]:
    """(the rows of A one column of cluster units reads (see `_traffic`); the rows of A
    streamed from DRAM, weighted by the DRAM efficiency of their runs), of each class of
    `lay.classes`."""
    m = problem.m
    # A pair sharing B whose peer falls past the edge re-reads the last m block.
    rows = [m + ((m - 1) % b + 1) * (-(-m // b) % 2) if mc == 1 else m for b, mc, _ in lay.classes]
    if problem.a_major == "K":
        return rows, [m / dram_run_efficiency(RATES, K_BLOCK_BYTES)] * len(rows)
    elem = DTYPE_BYTES[problem.dtype]
    return rows, [m / dram_run_efficiency(RATES, min(piece, m) * elem) for _, _, piece in lay.classes]


class _Rows(_Record):
    """A problem's tiling by every row of the `_Layouts` of its kind, with what the rules that
    look at the shape read of each (per row, see `_by_m`): `exempt` from the single-wave rule,
    a pair that `can_share`; and the tables it was counted from."""

    layouts: _Layouts
    tiling: _Tiling
    k_blocks: int
    exempt: np.ndarray
    can_share: np.ndarray
    m_side: np.ndarray  # `_by_m`'s table
    by_n: _ByN
    made: np.ndarray  # rows: tiles, cluster units, columns of B read out of L2 (all CTAs together)

    def splits(self, device: DeviceSpec) -> tuple:
        """(first, end, count), per row: the rules let SPLITS[first:end] through, of the
        SPLITS[:count] that `split_choices` allows. A pair is removed when it has one block on
        the side it pairs along, or when its largest split is a single wave; its other splits
        are costed only where the single-wave rule lets them (multicast only when the work
        units exceed one wave). A B-tail variant is costed unsplit, in a shared wave, where its
        layout is costed unsplit."""
        lay, til = self.layouts, self.tiling
        count = lay.split_count[np.minimum(self.k_blocks // MIN_KB_PER_SPLIT, lay.split_slots // til.units)]
        # Up to how many splits `single_wave_rule` removes a pair (0: never, and for unpaired
        # tiles): the rule applies at split s exactly when s <= this. Pairs run only on an even
        # SM count (`_pre_rule`), where a wave of pairs is within the grid whenever it is within
        # the SM count, so whether the rule's exception applies (`exempt`) does not depend on
        # the split.
        first = lay.splits_up_to[np.where(self.exempt, 0, device.num_sms // til.tiles)]
        end = count * self.can_share  # (can_share: 0 or 1)
        first[lay.staged :] = 0
        if til.wide is None:
            end[lay.staged :] = 0
        else:
            end[lay.staged :] = (first[lay.tail_of] == 0) & (end[lay.tail_of] > 0) & self.tail_shared()
        return first, end, count

    def unsplit(self, device: DeviceSpec) -> np.ndarray | None:
        """`legal_unsplit` when no row can split (every `split_choices` is [1]); else None."""
        lay, til = self.layouts, self.tiling
        if self.k_blocks >= 2 * MIN_KB_PER_SPLIT and np.count_nonzero(til.units <= lay.half_split_slots):
            return None  # a layout splits (`_split_count`)
        return self.legal_unsplit(device)

    def legal_unsplit(self, device: DeviceSpec) -> np.ndarray:
        """Where the rules let a row through unsplit (`splits`' first == 0 < end: the single-wave
        rule removes split 1 of a pair exactly where its tiles fit the SMs and its exception
        does not apply, and every `split_choices` holds 1), as 0 or 1."""
        lay, til = self.layouts, self.tiling
        legal = (self.exempt | (til.tiles > device.num_sms)) & self.can_share
        if til.wide is None:
            legal[lay.staged :] = 0
        else:
            legal[lay.staged :] = legal[lay.tail_of] & self.tail_shared()
        return legal

    def tail_shared(self):
        """Per B-tail variant: whether its tiles run in a shared wave (`shared_wave`, unsplit)."""
        lay, til = self.layouts, self.tiling
        if til.wide is None:
            return False
        rows = slice(lay.staged, None)
        return til.wide[rows] & (til.tiles[rows] <= lay.wave_slots[rows])


def _rows(problem: "Problem | _Shape", device: DeviceSpec, moves: bool = True) -> _Rows:
    """The tiling of `problem` by every layout of its kind, and what the rules read of each;
    without `moves`, the tiling's counts of the rows and columns moved (`_Tiling.l2_reads`,
    `lands`, `dram_rows`, which M enters at every row) are left out (None)."""
    if device.arch != ARCH:
        raise ValueError(f"the {ARCH} heuristics do not select for {device.arch!r}")
    kind = _kind(problem)
    lay = _layouts(device, *kind)
    by_n = _by_n(device, kind, problem.n)
    m_side = _by_m(problem, lay)
    # `_traffic`, with what depends on one of M and N counted once for each: tiles, cluster
    # units, and the columns of B read out of L2 (all CTAs together), at once.
    made = m_side[:3] * by_n.counts[:3]
    # (rows indexed, not unpacked: see `_splitk_terms`)
    tiles, units, b_reads = made[0], made[1], made[2]
    num_m, exempt, can_share, wide = m_side[0], m_side[3], m_side[4], m_side[5]
    num_n, grid_n = by_n.counts[0], by_n.counts[1]
    l2_reads = lands = dram_rows = None
    if moves:
        a_rows, a_dram = _a_side(problem, lay)
        a_reads = grid_n * np.array(a_rows).take(lay.class_of)
        l2_reads = a_reads + b_reads
        lands = a_reads * lay.pair_n + b_reads * lay.pair_m  # a shared tile lands in both CTAs of its pair
        dram_rows = np.array(a_dram).take(lay.class_of) + by_n.b_dram
    til = _Tiling(
        num_m,
        num_n,
        tiles,
        units,
        l2_reads,
        lands,
        by_n.covered_b,
        dram_rows,
        lay.slots,
        lay.wave_slots,
        wide if _shared_wave_possible(problem) else None,
    )
    k_blocks = _k_blocks(problem)
    return _Rows(lay, til, k_blocks, exempt, can_share & by_n.can_share, m_side, by_n, made)


class _Search(_Record):
    """The legal candidates of a problem, costed (`costs`), and the layouts' fate."""

    layouts: _Layouts
    candidates: Tiles
    costs: dict
    first: np.ndarray  # per row of the layouts: see `_Rows.splits`
    count: np.ndarray


SPLIT_INDEX = np.arange(len(SPLITS))
# SPLIT_RANGES[first * (len(SPLITS) + 1) + end]: whether each of SPLITS is one of SPLITS[first:end]
# (see `_Rows.splits`).
SPLIT_RANGES = (
    (np.arange(len(SPLITS) + 1)[:, None, None] <= SPLIT_INDEX) & (SPLIT_INDEX < np.arange(len(SPLITS) + 1)[:, None])
).reshape(-1, len(SPLITS))


def _split_candidates(first, end) -> np.ndarray:
    """The (row, split) pairs the rules let through (`_Rows.splits`' first and end per row), as
    the indices of their columns of `_Layouts.split_table`."""
    return np.flatnonzero(SPLIT_RANGES.take(first * (len(SPLITS) + 1) + end, axis=0))


def _search(problem: Problem, device: DeviceSpec, report: bool = False, rows: _Rows | None = None) -> _Search:
    """Every legal (tile layout, split) and B-tail candidate of `problem`, costed (with the
    terms `explain` reports when `report`); `rows`: `_rows` of the problem, when known."""
    r = _rows(problem, device) if rows is None else rows
    lay, t = r.layouts, r.layouts.tiles
    first, end, count = r.splits(device)
    end = np.where(_zero_filled_a(problem, t.block_m, t.shares_a), 0, end)
    chosen = lay.split_table.take(_split_candidates(first, end), axis=1)
    rows, splits = chosen[0], chosen[1]
    if not len(rows):
        raise ValueError(f"no legal {ARCH} configuration for {problem.describe()}")
    candidates = t.take(rows, splits)
    costed = costs(problem, device, candidates, r.tiling.take(rows), report)
    return _Search(lay, candidates, costed, first, count)


def _best(problem: Problem, device: DeviceSpec) -> "tuple[_Skeleton, int, dict | None]":
    """(the `_skeleton` of the problem's kind, N, K and M grain, the index of its candidate that
    `_order` ranks first, the candidates' `_grain_costs`); or, from the second problem of a span
    of M on (`_span`), the span's own choice where the bounds prove one (`_span_choice`), and
    None for the costs (not computed)."""
    if device.arch != ARCH:
        raise ValueError(f"the {ARCH} heuristics do not select for {device.arch!r}")
    s = _skeleton(device, _kind(problem), problem.n, problem.k, -(-problem.m // M_GRAIN))
    if s is None:
        raise ValueError(f"no legal {ARCH} configuration for {problem.describe()}")
    span = _span(problem.m)
    seen = s.spans.get(span)
    if seen is None:
        seen = s.spans[span] = [0, None]  # [problems of the span selected, its own choice]
    seen[0] += 1
    if seen[1] is None and seen[0] >= SPAN_PROOF_AFTER:
        seen[1] = _span_choice(problem, s, span)
    if seen[1] is not None and seen[1] >= 0:
        return s, seen[1], None
    c = _grain_costs(problem, s)
    return s, _order(s.candidates, c, 1)[0], c


SPAN_ROWS = 8  # see `_span`
SPAN_PROOF_AFTER = 2  # a span's own choice is sought at its second problem (see `_best`)


def _span(m: int) -> tuple[int, int]:
    """The least and the largest M of the span of `m`: SPAN_ROWS rows while M is within
    SPAN_ROWS grains (where a grain's rows differ much in size), then the M grain (a span
    never crosses a grain)."""
    rows = SPAN_ROWS if m <= SPAN_ROWS * M_GRAIN else M_GRAIN
    last = -(-m // rows) * rows
    return last - rows + 1, last


def _grain_costs(problem, s: "_Skeleton") -> dict:
    """`costs` of the candidates of `s` for `problem` (a Problem or a `_Shape` of its grain),
    those the rules remove at infinity."""
    a_rows, a_dram = _a_side(problem, s.layouts)
    # (`_traffic`: the rows and columns moved, a shared tile landing in both CTAs of its pair)
    moved = np.array((a_rows, a_rows, a_dram)).take(s.class_of, axis=1)
    moved[:2] *= s.a_moves  # (A's DRAM rows are streamed once)
    moved += s.b_moved
    floor = s.floor
    if floor is None:
        floor = np.maximum(s.waves.fixed, _shared_line_clk(problem, s.waves.active, *s.line_groups))
    c = _byte_terms(problem, s.candidates, s.waves, moved, floor)
    # The skeleton keeps the candidates of the least M of its grain: a rule of M itself is here.
    if problem.a_major == "K" and problem.m <= ZERO_FILL_MAX_M:
        t = s.candidates
        c["cost"] = np.where(_zero_filled_a(problem, t.block_m, t.shares_a), np.inf, c["cost"])
    return c


def _span_choice(problem: Problem, s: "_Skeleton", span: tuple[int, int]) -> int:
    """The candidate of `s` that every problem of the span of M (least, largest) chooses, where
    the bounds prove one (else -1): in a span every candidate's cost grows with M (the
    skeleton is the same, every row and column counted grows with M or stays, and so does
    every term built from them: sums, products and quotients by the same positive numbers,
    maxima; the shared-line term, which falls as M grows, is constant in a span), so in the
    span it lies between its cost at the least M and at the largest (a candidate that
    `_zero_filled_a` removes is infinite at every M of a span or at none). A
    candidate whose largest cost is below every other candidate's least cost by more than the
    rounding of `_order` is first for every M of the span, whatever the other keys."""
    rest = (problem.n, problem.k, *_kind(problem))
    least = _grain_costs(_Shape(span[0], *rest), s)["cost"]
    most = _grain_costs(_Shape(span[1], *rest), s)["cost"]
    first = int(most.argmin())
    bound = float(most[first])
    below = least > bound + (1e-5 + bound * 1e-9)  # (`_order` compares costs rounded to 6 decimals)
    below[first] = True
    return first if np.count_nonzero(below) == len(below) else -1


M_GRAIN = 64  # every block_m is a multiple of this: the m block counts of M follow from ceil(M / M_GRAIN)
assert not any(block_m % M_GRAIN for block_m in BLOCK_MS)
# `_zero_filled_a` removes candidates only at whole spans of M (`_span_choice` bounds finite costs).
assert all((block_m // 2) % SPAN_ROWS == 0 for block_m in BLOCK_MS) and ZERO_FILL_MAX_M <= SPAN_ROWS * M_GRAIN


class _Skeleton(_Record):
    """What select costs alike for every problem of one kind, N, K and ceil(M / M_GRAIN): the
    candidates (`_search`'s, but for the rule of M itself, `_zero_filled_a`, which
    `_grain_costs` applies; or, where no layout can split, every layout, those the rules
    remove at an infinite launch cost), their wave terms (`_Waves`) and what the bytes they
    move take from N. M enters all of them only through its m block counts (`_by_m`)."""

    layouts: _Layouts
    candidates: Tiles
    waves: _Waves
    class_of: np.ndarray  # per candidate: its class of `layouts.classes`
    # The rows landing in shared memory, read out of L2 and streamed from DRAM (all CTAs
    # together, per K slice): per row of A (`_a_side`'s rows, landing and read; its DRAM rows
    # are streamed once), and of B (see `_traffic`).
    a_moves: np.ndarray
    b_moved: np.ndarray
    # The largest of `_Waves.fixed` and `_shared_line_clk`, where every M of the grain has the
    # same; else None, and `_shared_line_clk`'s groups.
    floor: np.ndarray | None
    line_groups: tuple | None
    spans: dict  # (the least M, the largest) of a span of the grain -> see `_best`


@functools.lru_cache(maxsize=256)
def _skeleton(device: DeviceSpec, kind: tuple, n: int, k: int, m_grains: int, plain: bool = False) -> _Skeleton | None:
    """`_Skeleton` of the problems of `kind` with N = n, K = k and ceil(M / M_GRAIN) = m_grains
    (None when no candidate is legal); with `plain`, of every layout unsplit, those that
    cannot run swapped (`_runs_swapped`) or that the rules remove at infinity (as
    `_plain_costs` costs them)."""
    like = _Shape((m_grains - 1) * M_GRAIN + 1, n, k, *kind)  # (the least M of the grain)
    r = _rows(like, device, moves=False)
    lay, t = r.layouts, r.layouts.tiles
    split_cols = None  # (every candidate unsplit)
    rows = None  # every layout
    if plain:
        legal = r.legal_unsplit(device) & _swappable(device, kind)
        if not np.count_nonzero(legal):
            return None
    elif (legal := r.unsplit(device)) is None:
        first, end, _ = r.splits(device)
        chosen = lay.split_table.take(_split_candidates(first, end), axis=1)
        if not chosen.shape[1]:
            return None
        rows, split_cols = chosen[0], chosen[1:]
        t = t.take(rows, split_cols[0])
    elif not np.count_nonzero(legal):
        return None
    m_side, n_side, made = (a if rows is None else a.take(rows, axis=1) for a in (r.m_side, r.by_n.counts, r.made))
    per_row = lay.per_row if rows is None else lay.per_row.take(rows, axis=1)
    # (rows indexed, not unpacked: see `_splitk_terms`)
    slots, wave_slots, pair_n, pair_m, class_of = per_row[0], per_row[1], per_row[2], per_row[3], per_row[4]
    num_m, wide, a_groups = m_side[0], m_side[5], m_side[6]
    num_n, grid_n, b_groups = n_side[0], n_side[1], n_side[3]
    tiles, units, b_reads = made[0], made[1], made[2]
    if r.tiling.wide is None:
        wide = None
    til = _Tiling(num_m, num_n, tiles, units, None, None, None, None, slots, wave_slots, wide)
    w = _wave_terms(device, t, til, r.k_blocks, wide is not None, False, split_cols, legal)
    # M enters the shared-line term through its m block counts and, for an M-major A of one
    # grain, ceil(M / 8) (`_requests_per_line`): the same for every M of any other grain.
    floor, groups = None, (a_groups, b_groups)
    if m_grains > 1 or kind[2] == "K":
        floor, groups = np.maximum(w.fixed, _shared_line_clk(like, w.active, *groups)), None
    a_moves = np.array((grid_n * pair_n, grid_n), dtype=float)
    b_moved = np.array((b_reads * pair_m, b_reads, r.by_n.b_dram if rows is None else r.by_n.b_dram[rows]), dtype=float)
    return _Skeleton(lay, t, w, class_of, a_moves, b_moved, floor, groups, {})


class _Shape(_Record):
    """The fields of a `Problem` that `_rows` reads (a problem of a kind, N, K and M grain)."""

    m: int
    n: int
    k: int
    dtype: str
    out_dtype: str
    a_major: str
    b_major: str
    has_c: bool


def _rejections(problem: Problem, device: DeviceSpec, s: _Search) -> list[Rejection]:
    """The layouts the rules removed, in the rules' order, each with the first rule that did."""
    out = []
    lay = s.layouts
    # The pairs whose every split the single-wave rule removes, and the largest split of each.
    single_wave = (lay.tiles.cluster_size > 1) & (s.first >= s.count)
    largest_split = SPLIT_VALUES[s.count - 1]
    for i, tile in enumerate(lay.fields):
        rule = lay.pre[i]
        if rule is None and tile["cluster_size"] > 1:
            if _nothing_to_share(problem, tile["block_m"], tile["block_n"], tile["multicast"] == "A"):
                rule = _side_rule(tile["multicast"])
            elif _zero_filled_a(problem, tile["block_m"], tile["multicast"] == "A"):
                rule = ZERO_FILL_RULE
        rule = rule or lay.post[i]
        if rule is None and single_wave[lay.row[i]]:
            split = int(largest_split[lay.row[i]])
            rule = single_wave_rule(problem, device, tile["block_m"], tile["block_n"], split, tile["multicast"])
        if rule is not None:
            desc = describe_layout(tile["block_m"], tile["block_n"], tile["cluster_size"], tile["multicast"])
            out.append(Rejection(desc, rule))  # (described here, not in `_tile_layouts`: select never asks)
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
    return _completed(cfg, split_k, _a_rows(cfg, problem), raster["raster"], raster["group_size"])


@functools.lru_cache(maxsize=4096)
def _completed(cfg: KernelConfig, split_k: int, a_rows: int, raster: str, group_size: int) -> KernelConfig:
    """`cfg` with these fields (memoised: many problems end in the same config)."""
    return with_fields(cfg, split_k=split_k, a_rows=a_rows, raster=raster, group_size=group_size)


def select(problem: Problem, device: DeviceSpec) -> KernelConfig:
    """The configuration the cost model ranks first, swapped (`_swap_ranked`) where that costs
    less, `narrowed` (deterministic; heuristics.select memoises it)."""
    return narrowed(_ranked_first(problem, device), problem, device)


def narrowed(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> KernelConfig:
    """A swapped `cfg` 8 narrower where that keeps its count of tiles along the user's M: the
    same grid with fewer padded rows (M = 1300 in 8 tiles of 168 instead of 176), and as many
    pipeline stages or more (the narrower tile takes less shared memory). The candidates' widths
    step by 16 (BLOCK_NS: more would slow every select); 8 narrower needs a K-major A
    (layout.structural_problems; a pair sharing it loads two overlapping boxes). Unswapped
    tiles are left alone: an unaligned output cannot take them (sm90_checks.epilogue_problems).
    So is a C read back into an output whose rows are not whole 16-byte units: the direct
    epilogue reads and writes the narrower tile's tail slower than the rows it saves (H200,
    2026-12-06, graph replays of the wider tile / the narrower: 533 x 3731 x 421 0.84,
    526 x 7809 x 1033 0.87, 1712 x 9903 x 7180 0.95; 8 such problems 0.95 geomean, against
    1.01 with C aligned and 1.02 without C)."""
    if not cfg.swap_ab or (problem.has_c and not problem.aligned_out):
        return cfg
    if -(-problem.m // (cfg.block_n - 8)) != -(-problem.m // cfg.block_n):
        return cfg
    return _narrowed(cfg, device)


@functools.lru_cache(maxsize=1024)
def _narrowed(cfg: KernelConfig, device: DeviceSpec) -> KernelConfig:
    """`narrowed` once the tile count is known to stay (memoised: many problems end in the same config)."""
    narrow = with_fields(cfg, block_n=cfg.block_n - 8)
    return cfg if structural_problems(narrow) else with_stages(narrow, device)[0]


def _ranked_first(problem: Problem, device: DeviceSpec) -> KernelConfig:
    """`select` before `narrowed`."""
    s, best, c = _best(problem, device)
    chosen = _finish(s.candidates, best, problem, device)
    if not swap_possible(problem):
        return chosen
    q = transposed(problem)
    sq = _skeleton(device, _kind(q), q.n, q.k, -(-q.m // M_GRAIN), plain=True)
    if sq is None:
        return chosen
    cq = _grain_costs(q, sq)
    own = _round6(float((c or _grain_costs(problem, s))["cost"][best]))
    if not _round6(float(cq["cost"].min())) < own:  # no swapped candidate costs less
        return chosen
    # the cheapest swapped candidate: the transposed problem's first, unless it cannot run swapped
    swap = _swap_ranked(problem, device, sq.candidates, cq, 1) or _swap_ranked(problem, device, sq.candidates, cq)
    return swap[0][2] if swap and swap[0][0] < own else chosen


# ----------------------------------------------------------------------------- swap_ab
#
# Under swap_ab the kernel runs the transposed problem D^T = B^T A^T (jitgemm.geometry): the
# user's M lands on the wgmma's N side, in steps of 16 rather than of 64-row atoms. A swapped
# candidate is the unswapped config of the transposed problem with the roles of A and B
# exchanged, and is costed as that. It matters where M is a few hundred rows and N large: the
# user's M then splits into tiles that fill one wave without padding. Measured on the H200
# (bf16, b = W.t(), N = K = 4096, us, graph replays, 2026-12-02): M = 320 ran 18.9 swapped
# (128 CTAs of 64 x 160) against 34.0 unswapped (87 CTAs of 128 x 144, the last m block half
# past M) and 18.7 for cuBLAS; M = 576 28.2 against 37.6 (cuBLAS 30.8).


def swap_possible(problem: Problem) -> bool:
    """Whether swapped candidates are costed: the swapped epilogue's limits (a 16-bit output;
    see layout.structural_problems), M < N (the smaller side on the wgmma's N) and M beyond
    one 64-row atom. Up to one atom an unswapped tile loads only M's rows (`_a_rows`) and can
    split K, which a swapped one cannot; there the model would prefer an unsplit swapped
    m64n16 on 33 CTAs to 132 CTAs of split m64n64 for 1x2112x7168 (its DRAM streaming term
    does not see how few CTAs are left to stream)."""
    return problem.out_dtype != "fp32" and WGMMA_M < problem.m < problem.n


@functools.lru_cache(maxsize=1024)
def transposed(problem: Problem) -> Problem:
    """The problem D^T = B^T A^T that a swapped config of `problem` runs as (memoised: select
    asks twice)."""
    return Problem(
        problem.n,
        problem.m,
        problem.k,
        problem.dtype,
        problem.out_dtype,
        "K" if problem.b_major == "K" else "M",
        "K" if problem.a_major == "K" else "N",
        problem.has_c,
    )


_OTHER_OPERAND = {"A": "B", "B": "A", "none": "none"}


def swapped(cfg: KernelConfig, problem: Problem) -> KernelConfig:
    """The swap_ab config of `problem` that runs as `cfg` runs its transpose (tile fields in
    kernel coordinates; `multicast` names the user's operand, the other side of the kernel's)."""
    return _swapped(cfg, problem.a_major, problem.b_major)


@functools.lru_cache(maxsize=4096)
def _swapped(cfg: KernelConfig, a_major: str, b_major: str) -> KernelConfig:
    """`swapped` (memoised: many problems end in the same config)."""
    return with_fields(cfg, swap_ab=True, a_major=a_major, b_major=b_major, multicast=_OTHER_OPERAND[cfg.multicast])


def unswapped(cfg: KernelConfig, problem: Problem) -> KernelConfig:
    """The config of `transposed(problem)` that the swap_ab config `cfg` runs as (`swapped`'s inverse)."""
    t = transposed(problem)
    return with_fields(
        cfg, swap_ab=False, a_major=t.a_major, b_major=t.b_major, multicast=_OTHER_OPERAND[cfg.multicast]
    )


SWAP_TRIES = 4  # the transposed problem's candidates tried, cheapest first, for ones that run swapped


def _swap_ranked(problem: Problem, device: DeviceSpec, t: Tiles, c: dict, tries: int = SWAP_TRIES) -> list[tuple]:
    """(rounded cost, index, swapped config) of the swapped candidates of `problem`, cheapest
    first: of the first `tries` candidates `t` of the transposed problem, costed `c` (those
    that cannot run swapped at infinity: `_plain_costs`, or a plain `_skeleton`'s),
    those whose completed config has no a_rows and lays out swapped."""
    q, out = transposed(problem), []
    for i in _order(t, c, tries):
        if not np.isfinite(c["cost"][i]):
            break
        cfg = _finish(t, i, q, device)
        swap = None if cfg.a_rows else swapped(cfg, problem)
        if swap is not None and not structural_problems(swap):
            out.append((_round6(float(c["cost"][i])), i, swap))
    return out


SWAP_MAX_BLOCK_M = 128  # see `_runs_swapped`


def _runs_swapped(t: Tiles, lay: _Layouts) -> np.ndarray:
    """Where the candidates `t` (of the layouts `lay`) can run swapped, whatever the shape:
    unsplit, no B-tail variant (a layout row from `lay.staged` on), tiles of SWAP_MAX_BLOCK_M
    kernel rows at most. The model prices 256-row tiles below their measured times in either
    orientation; swapped, they lost to the unswapped choice on the H200 (bf16, us, N = K =
    4096): m256n112 ran M = 896 in 51.1 against 44.9 for m128n256, m256n128 M = 1024 in 52.3
    against 46.0, and m256n80 M = 640 in 34.3 against 31.8 for the swapped m128n160."""
    return (t.split_k == 1) & (t.origin < lay.staged) & (t.block_m <= SWAP_MAX_BLOCK_M)


@functools.lru_cache(maxsize=64)
def _swappable(device: DeviceSpec, kind: tuple) -> np.ndarray:
    """`_runs_swapped` of every layout of `kind`, for a plain `_skeleton`."""
    lay = _layouts(device, *kind)
    return _runs_swapped(lay.tiles, lay)


def _plain_costs(t: Tiles, lay: _Layouts, c: dict) -> dict:
    """`costs` `c` of the candidates `t` with those that do not run swapped (`_runs_swapped`)
    at infinity."""
    return {**c, "cost": np.where(_runs_swapped(t, lay), c["cost"], np.inf)}


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
    q = transposed(problem)
    if swap_possible(problem) and _skeleton(device, _kind(q), q.n, q.k, -(-q.m // M_GRAIN)) is not None:
        # the swapped candidates, with the terms of the transposed problem they run as
        sq = _search(q, device, report=True)
        swaps = _swap_ranked(problem, device, sq.candidates, _plain_costs(sq.candidates, sq.layouts, sq.costs))
        shown += [Candidate(cfg, cost, (), _terms(q, device, sq.candidates, sq.costs, i)) for cost, i, cfg in swaps]
        shown.sort(key=lambda cand: cand.cost)  # (stable: on a tie the unswapped candidate stays first)
    chosen = narrowed(shown[0].config, problem, device)
    if chosen != shown[0].config:  # listed first, ahead of the candidate it narrows
        shown.insert(0, cost_of(problem, device, chosen))
    return explanation(
        problem,
        device,
        chosen,
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
    if merged["stream_k"] and "split_k" not in data:
        merged["split_k"] = 1  # stream-K cuts the K blocks itself
    if chosen.swap_ab and not merged["swap_ab"] and "block_n" not in data and merged["block_n"] % 16:
        merged["block_n"] += 8  # a `narrowed` width is for swapped tiles: unswapped, the one it narrowed
    # select's per-tile extras were for its own tile: for a tile given, the rows of A loaded are
    # re-derived (at the end, for the pairing settled; zeroed first, as select's rows may not fit
    # the tile given) and a B tail is kept only where the tile can end in one (fields given stay
    # as given)
    tile_changed = any(k in data for k in rules.TILE_FIELDS)
    rederive_rows = tile_changed and "a_rows" not in data and not merged["swap_ab"]
    if rederive_rows:
        merged["a_rows"] = 0
    cfg = KernelConfig(**merged)
    if tile_changed and "b_tail" not in data and cfg.b_tail and not b_tail_fits(cfg):
        cfg = with_fields(cfg, b_tail=False)
    if "cluster_size" in data and "multicast" not in data and cfg.cluster_size == 2 and structural_problems(cfg):
        other = with_fields(cfg, multicast="B" if cfg.multicast == "A" else "A")
        if "b_tail" not in data and other.b_tail and not b_tail_fits(other):  # (a pair sharing B takes no tail)
            other = with_fields(other, b_tail=False)
        if not structural_problems(other):  # the side kept or taken by default cannot pair this tile; the other can
            cfg = other
    if not (tile_changed or "split_k" in data or "stream_k" in data):
        return cfg
    if tile_changed and structural_problems(cfg) and "cluster_size" not in data and "multicast" not in data:
        # select's pairing does not fit the tile that was given: run without a cluster
        cfg = with_fields(cfg, cluster_size=1, multicast="none")
    if not structural_problems(cfg):
        if tile_changed and "num_stages" not in data:
            cfg, _ = with_stages(cfg, device)
        if tile_changed and "split_k" not in data and not cfg.swap_ab and not cfg.stream_k:
            cfg = with_split(cfg, problem, device)  # select's split was for its own tile
        if "raster" not in data and "group_size" not in data:
            cfg = with_raster(cfg, problem, device)
    if rederive_rows:  # (for the pairing settled above)
        cfg = with_fields(cfg, a_rows=_a_rows(cfg, problem))
    return cfg
