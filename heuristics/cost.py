"""Pieces of the cost models, clock cycles of a persistent CTA, that every arch's model is built
from (each arch's `cost_of` combines them with its own terms):

- rates under load: `mma_rate` (the tensor-core rate with the clock credit of a partly busy chip),
  `dram_latency_clk` (the loaded DRAM round trip over the stages in flight: with its share of
  the read bandwidth in series, a CTA's time per stage streaming from DRAM, which sm_90a's
  per-wave terms add up), `dram_run_efficiency` (DRAM efficiency of the contiguous runs TMA
  boxes read);
- `Traffic` (what a whole tiling reads, as each arch's `traffic` counts it), `output_bytes`;
- per-k-block and per-wave times: `kblock_terms` (with `tile_flops` and `tma_latency_clk`),
  `wave_terms`, `slowest` (the bound);
- per tile and per launch: `epilogue_clk`, `persistent_cost` (`persistent_time` its SM side).

Every piece takes scalars or NumPy arrays (one element per candidate): sm_90a costs all its
candidates at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jitgemm.geometry import Waves
from jitgemm.problem import DTYPE_BYTES, Problem

from .device import ArchRates


def dram_latency_clk(rates: ArchRates, stages: int) -> float:
    """The loaded DRAM round trip over the stages the producer of a `stages`-deep pipeline keeps
    in flight (`dram_latency_clk / (stages - 1)`: a CTA streaming alone is latency bound, so its
    rate is its bytes in flight over the latency)."""
    return rates.dram_latency_clk / np.maximum(1, stages - 1)


def mma_rate(rates: ArchRates, num_sms: int, busy_ctas: int) -> float:
    """Sustained tensor-core FLOPs per SM and clock when a kernel keeps `busy_ctas` of the
    `num_sms` SMs busy: the clock drops under a full tensor-core load (power limit), so
    `mma_flops_per_clk` with every SM busy, more with fewer, in proportion (the same chip power),
    up to `mma_peak_flops_per_clk`."""
    busy = np.minimum(np.maximum(1, busy_ctas), num_sms)
    return np.minimum(float(rates.mma_peak_flops_per_clk), rates.mma_flops_per_clk * num_sms / busy)


def dram_run_efficiency(rates: ArchRates, run_bytes: float) -> float:
    """Fraction of the bandwidth DRAM delivers to a stream of `run_bytes` contiguous runs."""
    return run_bytes / (run_bytes + rates.dram_run_overhead_bytes)


class Traffic(NamedTuple):  # (a NamedTuple: a dataclass costs a millisecond of the first select's import)
    """Operand traffic of a whole problem for one tiling, in K-slices (x K x elem = bytes)."""

    cta_tiles: int  # tiles computed, including a pair's recomputed peer past the edge
    cluster_tiles: int  # work items of the persistent scheduler: tiles, or pairs of tiles
    l2_reads: int  # rows + columns read out of L2, all CTAs together (a shared operand once per pair)
    ingress: int  # rows + columns landing in shared memory, all CTAs together


def kblock_terms(
    rates: ArchRates,
    tile: tuple,
    tr: Traffic,
    slice_bytes: int,
    smem_clk: float,
    mma_flops_per_clk: float | None = None,
) -> tuple[dict, float]:
    """(the per-k-block times of one CTA that do not depend on how many CTAs run, the bytes one
    CTA reads from L2 per k-block). The times, clock cycles: "mma" (tensor core on the tile),
    "smem" (the arch's shared-memory time, `smem_clk`), "l2_ingress" (the bytes landing in the
    CTA's shared memory over its L2 port) and "latency" (the TMA round trip over the pipeline
    depth). `tile`: (block_m, block_n, block_k, num_stages); `slice_bytes`: one row or column of
    a k-block; `tr`: the tiling's traffic;
    `mma_flops_per_clk`: the tensor-core rate (default the rates', see `mma_rate`)."""
    block_m, block_n, block_k, num_stages = tile
    ingress = tr.ingress * slice_bytes / tr.cta_tiles
    mma = rates.mma_flops_per_clk if mma_flops_per_clk is None else mma_flops_per_clk
    terms = {
        "mma": tile_flops(block_m, block_n, block_k) / mma,
        "smem": smem_clk,
        "l2_ingress": ingress / rates.l2_sm_bytes_per_clk,
        "latency": tma_latency_clk(rates, num_stages),
    }
    return terms, tr.l2_reads * slice_bytes / tr.cta_tiles


def tile_flops(block_m: int, block_n: int, block_k: int) -> int:
    """Tensor-core FLOPs of one k-block of a block_m x block_n tile."""
    return 2 * block_m * block_n * block_k


def tma_latency_clk(rates: ArchRates, stages: int) -> float:
    """The TMA load round trip over the depth of a `stages`-deep pipeline."""
    return rates.load_latency_clk / np.maximum(1, stages - 1)


def wave_terms(rates: ArchRates, fixed: dict, l2_read, active_ctas, **more) -> tuple[dict, object, object]:
    """(the per-k-block times of one CTA while `active_ctas` CTAs run, the name of the slowest
    (the bound), its time): the `fixed` ones of `kblock_terms`, the CTA's share of the chip-wide
    L2 bandwidth ("l2") and the arch's `more`."""
    terms = {**fixed, "l2": active_ctas * l2_read / rates.l2_total_bytes_per_clk, **more}
    return (terms, *slowest(terms))


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


def slowest(terms: dict) -> tuple:
    """(the name of the largest of the per-k-block time `terms` (the bound), ties to the later
    name; its time), elementwise over arrays of candidates."""
    names = sorted(terms, reverse=True)  # argmax takes the first of equal maxima
    values = np.stack(np.broadcast_arrays(*(terms[k] for k in names)))
    return np.asarray(names)[values.argmax(axis=0)], values.max(axis=0)


def persistent_cost(w: Waves, cluster, wave_time: Callable, hbm_clk, tail_clk=0.0) -> tuple:
    """(cost, SM-side time, bound) of a persistent kernel, clock cycles: every wave of `w` (work
    units of `cluster` CTAs) but the last takes the time of a full one, the last its own
    (`wave_time(active_ctas) -> (clocks, bound)`), then `tail_clk`; never below `hbm_clk`, the
    time to stream what must come from DRAM once (the bound is then "hbm")."""
    full, bound = wave_time(w.slots * cluster)
    last, _ = wave_time(w.last_wave_tiles * cluster)
    sm_time = persistent_time(w, full, last, tail_clk)
    bound = np.where(hbm_clk >= sm_time, "hbm", bound)
    return np.maximum(sm_time, hbm_clk), sm_time, bound


def persistent_time(w: Waves, full_clk, last_clk, tail_clk=0.0):
    """SM-side time of a persistent kernel: every wave of `w` but the last takes `full_clk`, the
    last `last_clk`, then `tail_clk`."""
    return (w.waves - 1) * full_clk + last_clk + tail_clk
