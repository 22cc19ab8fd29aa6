"""Kernel selection for Blackwell (sm_100a, tcgen05), after DeepGEMM's sm100 rules.

How the config's fields read on sm_100a (kernel coordinates, swap_ab, the 2-CTA pair) is
documented in `jitgemm.archs.sm100.layout`. In short: with swap_ab the kernel runs D^T = B^T A^T, so
kernel M = user N and kernel N = user M; block_m = 128 per MMA consumer (1 or 2 consumers),
block_n = the MMA's N; cluster_size 2 is the cooperative 2-CTA MMA (cta_group::2), pairing
neighbouring kernel-M tiles so that the CTAs split the MMA-B tile, which is the user operand
named by `multicast` ('B', or 'A' under swap_ab).

Candidates: swap_ab off, or on when M is the small side (M < N and M <= 256: then the small M
becomes the MMA's N, which can be 16, instead of padding M up to 128 rows); 1 or 2 MMA
consumers (block_m 128 or 256 kernel rows); block_n 16..256 in steps of 16; one CTA, or a 2-CTA
pair along kernel M. Rules (in DeepGEMM's spirit) remove illegal or hopeless layouts: the TMEM
budget of 512 fp32 columns (consumers x block_n, doubled when the accumulator is
double-buffered), MN-major operands in whole 64-element swizzle rows, no 2-CTA pair for a
single wave, an odd SM count or a single kernel-M tile, too few pipeline stages. A cost model
ranks the rest and the L2 raster is chosen last, for the smallest working set.

The cost model counts clock cycles of a persistent CTA, wave by wave: per k-block the slowest of
tensor-core time (padded tiles included, so small M without swap_ab pays for 128 rows),
shared-memory reads of the UMMA operands (the 2-CTA MMA halves the B reads of each CTA; TMA
writes are not modelled), L2->SM ingress, TMA latency over the pipeline depth and the CTA's
share of the chip-wide L2 bandwidth; plus the writeback per tile, hidden behind the next tile's
main loop when the accumulator is double-buffered in TMEM; never below streaming the operands
from DRAM once.
"""

from __future__ import annotations

from jitgemm.archs.sm100.layout import (
    MN_PIECE,
    TMEM_COLUMNS,
    UMMA_M,
    layout_of,
    pair_along,
    smem_bytes,
    structural_problems,
)
from jitgemm.config import KernelConfig
from jitgemm.geometry import ceil_div, choose_raster, covered_extent, round_up, waves_of
from jitgemm.problem import DTYPE_BYTES, Problem

from . import rules
from .cost import Traffic, epilogue_clk, kblock_terms, output_bytes, persistent_cost, wave_terms
from .device import DeviceSpec, arch_rates
from .rules import config_problems, with_fields
from .search import Candidate, Rejection, describe_layout, explain_search, report_terms, screen, select_best

ARCH = "sm_100a"
# Placeholders until measured: heuristics/calibration/sm_100a-148.json (cost_of reads device.rates).
RATES = arch_rates(ARCH)

CONSUMERS = (1, 2)
BLOCK_NS = tuple(range(16, 257, 16))
CLUSTERS = (1, 2)
SWAP_MAX_M = 256  # swap_ab is considered only for M up to this (and M < N)

# Fixed per-tile costs of the writeback, clock cycles.
EPILOGUE_FIXED_CLK = 400  # TMEM loads, barriers, issuing the TMA stores
C_LOAD_LATENCY_CLK = 1000  # has_c: each staged C box is loaded and waited for


def kernel_mn(problem: Problem, swap_ab: bool) -> tuple[int, int]:
    """(kernel M, kernel N) of the problem: the user's (M, N), or (N, M) under swap_ab."""
    return (problem.n, problem.m) if swap_ab else (problem.m, problem.n)


def shared_operand(swap_ab: bool) -> str:
    """The user operand the two CTAs of a 2-CTA MMA split (the MMA-B side)."""
    return "A" if swap_ab else "B"


def tmem_columns(num_consumers: int, block_n: int) -> int:
    """TMEM columns the accumulators take: block_n fp32 columns per consumer, double-buffered
    when that fits the 512 columns (as jitgemm.archs.sm100.layout lays it out)."""
    single = num_consumers * block_n
    return 2 * single if 2 * single <= TMEM_COLUMNS else single


# ----------------------------------------------------------------------------- rules


def check_config(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> list[str]:
    """Why `cfg` cannot run `problem` on `device` (sm_100a), in words; empty when it can."""
    return config_problems(cfg, problem, device, structural_problems, layout_of)


def _layout_rejection(
    problem: Problem, device: DeviceSpec, swap_ab: bool, consumers: int, block_n: int, cluster: int
) -> str | None:
    """The first rule that removes a tile layout before costing, or None."""
    if swap_ab and not (problem.m < problem.n and problem.m <= SWAP_MAX_M):
        return f"swap_ab only for a small M (M < N and M <= {SWAP_MAX_M}); here M={problem.m}, N={problem.n}"
    km, kn = kernel_mn(problem, swap_ab)
    if consumers == 2 and km <= UMMA_M:
        return (
            f"a second MMA consumer needs more than {UMMA_M} kernel-M rows "
            f"(kernel M = {km}{' = N, swap_ab' if swap_ab else ''}): its half of the tile would be padding"
        )
    cols = tmem_columns(consumers, block_n)
    if cols > TMEM_COLUMNS:
        return f"TMEM budget: {consumers} accumulator(s) x {block_n} fp32 columns = {cols} > {TMEM_COLUMNS} columns"
    b_major_is_k = (problem.a_major if swap_ab else problem.b_major) == "K"
    if not b_major_is_k and (block_n // cluster) % MN_PIECE:
        return (
            f"the MN-major user {shared_operand(swap_ab)} is the MMA-B side: each CTA needs whole "
            f"64-element swizzle rows, block_n / cluster = {block_n // cluster}"
        )
    if cluster > 1:
        if device.num_sms % cluster:
            return f"no 2-CTA MMA: the SM count {device.num_sms} is odd"
        num_m = ceil_div(km, consumers * UMMA_M)
        if num_m < 2:
            return "no 2-CTA MMA: a single kernel-M tile, nothing to pair"
        tiles = num_m * ceil_div(kn, block_n)
        if tiles <= device.num_sms:
            return f"no 2-CTA MMA: the problem is a single wave ({tiles} tiles <= {device.num_sms} SMs)"
    return None


# ----------------------------------------------------------------------------- cost model


def traffic(km: int, kn: int, block_m: int, block_n: int, a_box: int, b_box: int, cluster: int) -> Traffic:
    num_m, num_n = ceil_div(km, block_m), ceil_div(kn, block_n)
    a_cov = covered_extent(km, block_m, a_box)
    b_cov = covered_extent(kn, block_n, b_box)
    if cluster == 2:
        grid_m = ceil_div(num_m, 2)
        # An odd last pair recomputes (and reloads) the last A tile; each CTA of a pair loads
        # half of the B tile, so B is read once per pair.
        last_a = km - (num_m - 1) * block_m
        a_all = num_n * (a_cov + (last_a if num_m % 2 else 0))
        reads = a_all + grid_m * b_cov
        return Traffic(2 * grid_m * num_n, grid_m * num_n, reads, reads)
    reads = num_n * a_cov + num_m * b_cov
    return Traffic(num_m * num_n, num_m * num_n, reads, reads)


def cost_of(problem: Problem, device: DeviceSpec, cfg: KernelConfig) -> Candidate:
    """Model the run time of `cfg` on `problem` (clock cycles) and keep the terms for `explain`."""
    r = device.rates
    lay = layout_of(cfg)
    elem = DTYPE_BYTES[problem.dtype]
    out_elem = DTYPE_BYTES[problem.out_dtype]
    km, kn = kernel_mn(problem, cfg.swap_ab)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    pair = cfg.cluster_size
    a_box = round_up(bm, MN_PIECE) if not lay.mma_a.major_is_k else bm
    b_box = lay.mma_b.tile_bytes // (bk * elem) * pair  # MMA-B columns the pair loads
    tr = traffic(km, kn, bm, bn, a_box, b_box, pair)
    k_blocks = ceil_div(problem.k, bk)
    slice_bytes = bk * elem

    # Per k-block of one CTA. The tensor core of each CTA does block_m x block_n (its rows of
    # the pair's M=256 MMA). UMMA reads A once per consumer row block and the CTA's part of B
    # once per consumer.
    t_smem = (bm + cfg.num_consumers * (bn // pair)) * slice_bytes / r.smem_bytes_per_clk
    per_cta, l2_read = kblock_terms(r, (bm, bn, bk, cfg.num_stages), tr, slice_bytes, t_smem)

    # Writeback: the consumers' warpgroups run in parallel, each over its 128 x block_n part.
    epilogue = epilogue_clk(r, UMMA_M * bn * out_elem, problem.has_c, EPILOGUE_FIXED_CLK, C_LOAD_LATENCY_CLK)
    overlapped = lay.acc_stages == 2

    w = waves_of(tr.cluster_tiles, device.num_sms // pair)

    def wave_time(active_ctas: int) -> tuple[float, str]:
        _, bound, slowest_clk = wave_terms(r, per_cta, l2_read, active_ctas)
        main = k_blocks * slowest_clk
        if overlapped:
            # The MMA runs the next tile while the writeback drains this one.
            return max(main, epilogue), bound if main >= epilogue else "epilogue"
        return main + epilogue, bound

    hbm_time = ((problem.m + problem.n) * problem.k * elem + output_bytes(problem)) / r.hbm_bytes_per_clk
    # (with the accumulator double-buffered, the last tile's writeback follows the last wave)
    cost, sm_time, bound = persistent_cost(w, pair, wave_time, hbm_time, epilogue if overlapped else 0.0)
    terms = {
        **report_terms(w, tr, bound, sm_time, hbm_time, problem.k * elem, cfg, lay.smem_bytes),
        "tmem_columns": lay.tmem_columns,
        "acc_stages": lay.acc_stages,
        "swap_ab": cfg.swap_ab,
        "cta_group": lay.cta_group,
    }
    # Ties go to the faster SM-side time, then less L2 traffic, then no swap, then the 2-CTA
    # MMA (DeepGEMM prefers the cluster once waves tie), then the smaller tile.
    key = (round(float(sm_time), 6), tr.l2_reads, cfg.swap_ab, -pair, bm * bn, bm, bn)
    return Candidate(cfg, round(float(cost), 6), key, terms)


# ----------------------------------------------------------------------------- search


def with_stages(cfg: KernelConfig, device: DeviceSpec) -> tuple[KernelConfig, int]:
    """(`cfg` with as many pipeline stages as fit shared memory (capped; at least 2), the count
    that fits (0 when not even 2 do))."""
    return rules.with_stages(cfg, device, smem_of=rules.at_stages(smem_bytes))


def with_raster(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> KernelConfig:
    """`cfg` with the L2 raster (side and group size, over kernel tiles) of the smallest working set."""
    lay = layout_of(cfg)
    km, kn = kernel_mn(problem, cfg.swap_ab)
    b_cols = lay.mma_b.tile_bytes // (cfg.block_k * DTYPE_BYTES[cfg.dtype]) * cfg.cluster_size
    raster, group, _ = choose_raster(
        ceil_div(km, cfg.block_m),
        ceil_div(kn, cfg.block_n),
        cfg.block_m,
        b_cols,
        device.num_sms // cfg.cluster_size,
        pair_along(cfg),
    )
    return with_fields(cfg, raster=raster, group_size=group)


def _layouts(problem: Problem, device: DeviceSpec):
    """(description, first rule against it or None, tile fields) of every sm_100a tile layout."""
    for swap_ab in (False, True):
        for cluster in CLUSTERS:
            for consumers in CONSUMERS:
                for block_n in BLOCK_NS:
                    multicast = shared_operand(swap_ab) if cluster == 2 else "none"
                    extra = {"swap_ab": True} if swap_ab else {}
                    yield (
                        describe_layout(UMMA_M * consumers, block_n, cluster, multicast, **extra),
                        _layout_rejection(problem, device, swap_ab, consumers, block_n, cluster),
                        dict(
                            block_m=UMMA_M * consumers,
                            block_n=block_n,
                            num_consumers=consumers,
                            cluster_size=cluster,
                            multicast=multicast,
                            swap_ab=swap_ab,
                        ),
                    )


def candidates(problem: Problem, device: DeviceSpec) -> tuple[list[Candidate], list[Rejection]]:
    """All legal candidates (costed, unranked, raster not yet chosen) and the rejected layouts."""
    rejected = []
    legal = [
        cost_of(problem, device, cfg)
        for cfg in screen(
            problem, device, _layouts(problem, device), structural_problems, rejected, rules.at_stages(smem_bytes)
        )
    ]
    return legal, rejected


COST_MODEL = (
    "cycles of a persistent CTA, wave by wave: per k-block the max of tensor-core time "
    "(padded tiles included), UMMA shared-memory operand reads (halved for B by the 2-CTA "
    "MMA), L2->SM ingress, latency/(stages-1) and the CTA's share of chip L2 bandwidth; "
    "plus the writeback per tile, hidden behind the next tile's MMAs when the TMEM "
    "accumulator is double-buffered; never below streaming the operands from DRAM once"
)


def select(problem: Problem, device: DeviceSpec) -> KernelConfig:
    """The configuration the cost model ranks first (deterministic; heuristics.select memoises it)."""
    return select_best(ARCH, candidates, with_raster, problem, device)


def explain(problem: Problem, device: DeviceSpec, top: int = 5) -> dict:
    """Why `select` chose what it chose: the best `top` candidates with their modelled cost and
    the layouts the rules removed (see search.explanation for the keys)."""
    return explain_search(
        ARCH,
        candidates,
        with_raster,
        problem,
        device,
        top,
        cost_model=COST_MODEL,
        note="sm_100a kernels are compiled and SASS-checked only; they have not run on Blackwell hardware",
    )


def config_with_fields(chosen: KernelConfig, data: dict, problem: Problem, device: DeviceSpec) -> KernelConfig:
    """`chosen` with the fields of a JITGEMM_CONFIG override, and those that follow from them
    re-derived by these rules: one MMA consumer per 128 kernel rows; a 2-CTA pair splits the
    MMA-B side, the user's B, or A under swap_ab (see heuristics.config_from_env)."""
    merged = {**chosen.to_dict(), **data}
    if "block_m" in data and "num_consumers" not in data:
        merged["num_consumers"] = max(1, merged["block_m"] // UMMA_M)
    if "multicast" in data and "cluster_size" not in data:
        merged["cluster_size"] = 1 if merged["multicast"] == "none" else 2
    if "multicast" not in data and ("cluster_size" in data or "swap_ab" in data):
        merged["multicast"] = ("A" if merged["swap_ab"] else "B") if merged["cluster_size"] == 2 else "none"
    cfg = KernelConfig(**merged)
    if any(k in data for k in rules.TILE_FIELDS) and not structural_problems(cfg):
        if "num_stages" not in data:
            cfg, _ = with_stages(cfg, device)
        if "raster" not in data and "group_size" not in data:
            cfg = with_raster(cfg, problem, device)
    return cfg
