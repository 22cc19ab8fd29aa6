"""Search, ranking and reporting, shared by every arch's `select` and `explain`:

- `screen` (the rules every arch applies after its own: structure, pipeline depth), `search` (arch
  check, candidates, ranking), `select_best` and `explain_search` (the bodies of each arch's
  `select` and `explain`);
- ranking: `Candidate`, `Rejection`, `rank`;
- the JSON-serialisable reports of `explain`: `explanation`, `report_terms` (a candidate's cost
  terms), `problem_dict`, `device_dict`, `describe_layout`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from typing import NamedTuple

import numpy as np

from jitgemm.config import KernelConfig
from jitgemm.geometry import Waves
from jitgemm.problem import Problem

from .cost import Traffic
from .device import DeviceSpec
from .rules import base_config, stage_rule, with_stages


# NamedTuples: a dataclass costs a millisecond of the first select's import.
class Candidate(NamedTuple):
    """A legal configuration with its modelled cost.

    `cost` is the modelled time (clock cycles) and the primary key; `key` holds the rest of the
    deterministic order (lower is better), ending in the config name so no two candidates tie.
    `terms` are the cost-model quantities reported by `explain` (JSON-serialisable scalars).
    """

    config: KernelConfig
    cost: float
    key: tuple
    terms: dict

    def sort_key(self) -> tuple:
        return (self.cost,) + tuple(self.key) + (self.config.name,)

    def to_dict(self) -> dict:
        out = {"config": self.config.to_dict(), "name": self.config.name, "cost": self.cost}
        out.update(self.terms)
        return out


class Rejection(NamedTuple):
    """A candidate removed by a rule: a short description of it and the rule, in words."""

    config: str
    rule: str

    def to_dict(self) -> dict:
        return {"config": self.config, "rule": self.rule}


def rank(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Candidates best first, by `Candidate.sort_key` (total and deterministic)."""
    return sorted(candidates, key=Candidate.sort_key)


def screen(
    problem: Problem,
    device: DeviceSpec,
    layouts: Iterable[tuple[str, str | None, dict]],
    structural: Callable[[KernelConfig], list[str]],
    rejected: list,
    smem_of: Callable[[KernelConfig, int], int],
) -> Iterator[KernelConfig]:
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


def search(
    arch: str, candidates: Callable[[Problem, DeviceSpec], tuple[list, list]], problem: Problem, device: DeviceSpec
) -> tuple[list[Candidate], list[Rejection]]:
    """(the legal candidates ranked best first, the rejections) of an arch's
    `candidates(problem, device)`. ValueError when `device` is not of `arch` or nothing is legal."""
    if device.arch != arch:
        raise ValueError(f"the {arch} heuristics do not select for {device.arch!r}")
    legal, rejected = candidates(problem, device)
    if not legal:
        raise ValueError(f"no legal {arch} configuration for {problem.describe()}")
    return rank(legal), rejected


Finish = Callable[[KernelConfig, Problem, DeviceSpec], KernelConfig]


def select_best(arch: str, candidates: Callable, finish: Finish, problem: Problem, device: DeviceSpec) -> KernelConfig:
    """An arch's `select`: the candidate its cost model ranks first (see `search`), completed by
    `finish(cfg, problem, device)` (the arch's raster choice)."""
    ranked, _ = search(arch, candidates, problem, device)
    return finish(ranked[0].config, problem, device)


def explain_search(
    arch: str, candidates: Callable, finish: Finish, problem: Problem, device: DeviceSpec, top: int, **extra
) -> dict:
    """An arch's `explain`: the report of a `search` (see `explanation`) with the best `top`
    candidates, each completed by `finish` as `select_best` completes its choice, the first of
    them chosen; `extra` keys (the cost model in words...) are added."""
    ranked, rejected = search(arch, candidates, problem, device)
    shown = [Candidate(finish(c.config, problem, device), c.cost, c.key, c.terms) for c in ranked[: max(1, top)]]
    return explanation(problem, device, shown[0].config, shown, rejected, top, legal_candidates=len(ranked), **extra)


def report_terms(
    w: Waves, tr: Traffic, bound: str, sm_clk: float, hbm_clk: float, k_bytes: int, cfg: KernelConfig, smem_bytes: int
) -> dict:
    """The cost terms every arch's `explain` reports for a candidate (JSON scalars): its waves,
    the last wave's utilisation, the CTA tiles, the bound, the SM-side and DRAM-floor cycles, the
    bytes read from L2 (`k_bytes`: K x the input element size), its shared memory and stages."""
    return {
        "waves": w.waves,
        "last_wave_util": round(float(w.last_wave_util), 4),
        "tiles": tr.cta_tiles,
        "bound": bound,
        "sm_cycles": round(float(sm_clk), 1),
        "hbm_cycles": round(float(hbm_clk), 1),
        "l2_bytes": tr.l2_reads * k_bytes,
        "smem_bytes": smem_bytes,
        "num_stages": cfg.num_stages,
    }


def describe_layout(block_m: int, block_n: int, cluster_size: int = 1, multicast: str = "none", **extra) -> str:
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
    if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
        value = value.item()  # the cost models' NumPy scalars
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def explanation(
    problem: Problem,
    device: DeviceSpec,
    chosen: KernelConfig,
    ranked: Sequence[Candidate],
    rejected: Sequence[Rejection],
    top: int = 5,
    **extra,
) -> dict:
    """The JSON-serialisable answer of `explain`: problem, device, chosen config, the best `top`
    candidates (ranked best first) with their cost terms, the rejections with their rules, and
    the calibration file the rates came from (`DeviceSpec.rates_source`)."""
    out = {
        "problem": problem_dict(problem),
        "device": device_dict(device),
        "chosen": chosen.to_dict(),
        "candidates": [c.to_dict() for c in list(ranked)[: max(0, top)]],
        "rejected": [r.to_dict() for r in rejected],
        "rates": device.rates_source,
    }
    out.update(extra)
    return _jsonable(out)
