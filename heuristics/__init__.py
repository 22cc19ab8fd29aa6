"""Kernel-configuration heuristics (shipped as `jitgemm.heuristics`).

- `select(problem, device) -> KernelConfig`: pure, deterministic, cached per (problem, device).
- `explain(problem, device, top=5) -> dict`: the choice, the best candidates with their modelled
  cost, and the layouts the rules removed (JSON-serialisable; printed by `jitgemm explain`).
- `check_config(config, problem, device) -> list[str]`: why a forced config cannot run.
- `config_from_env(problem, device)`: the `JITGEMM_CONFIG` override, validated.
- `require_valid(config, problem, device, source)`: check_config that raises ValueError.

Each arch's rules (`sm90`, `sm100`) are reached through its backend in `jitgemm.registry`;
shared pieces in `device` (DeviceSpec, the rates of each device kind, from calibration/<kind>.json;
how they are calibrated: RATES.md),
`rules` (config checks, stage arithmetic), `tiles` (block counts, wave quantisation, the
scheduler's tile walk and raster), `cost` (the pieces of the cost models) and `search`
(screening, ranking, explain's reports).
"""

from __future__ import annotations

import functools
import os
from dataclasses import fields

from jitgemm import registry
from jitgemm.config import KernelConfig, parse_json
from jitgemm.problem import Problem

from .device import DeviceSpec
from .rules import field_mismatches

__all__ = [
    "DeviceSpec",
    "select",
    "explain",
    "check_config",
    "config_from_env",
    "require_valid",
    "ENV_VAR",
    "SUPPORTED_ARCHS",
]

ENV_VAR = "JITGEMM_CONFIG"
SUPPORTED_ARCHS = registry.ARCH_NAMES


def _arch_module(arch: str):
    """The rules of `arch` (ValueError for an arch without a backend)."""
    return registry.get(arch).rules


@functools.lru_cache(maxsize=4096)
def select(problem: Problem, device: DeviceSpec) -> KernelConfig:
    """The kernel configuration for `problem` on `device` (a repeated problem: one dictionary
    lookup)."""
    return _arch_module(device.arch).select(problem, device)


def explain(problem: Problem, device: DeviceSpec, top: int = 5) -> dict:
    """JSON-serialisable account of the choice: keys "problem", "device", "chosen" (a
    KernelConfig dict), "candidates" (the best `top`, each {"config", "name", "cost", ...cost
    terms}) and "rejected" (each {"config": description, "rule": why})."""
    return _arch_module(device.arch).explain(problem, device, top)


def check_config(config: KernelConfig, problem: Problem, device: DeviceSpec) -> list[str]:
    """Human-readable reasons why `config` cannot run `problem` on `device`; empty when it can."""
    if not isinstance(config, KernelConfig):
        return [f"expected a jitgemm.KernelConfig, got {type(config).__name__}"]
    if device.arch not in registry.ARCH_NAMES:
        return [f"the device arch {device.arch!r} is not supported; supported: {list(SUPPORTED_ARCHS)}"]
    if config.arch != device.arch:
        # The arch rules of the config would not apply to this device at all.
        return field_mismatches(config, problem, device)
    checker = getattr(registry.get(device.arch).checks, "check_config", None)
    if checker is None:  # an arch module without its own checks: the common ones
        return field_mismatches(config, problem, device)
    return checker(config, problem, device)


def require_valid(config: KernelConfig, problem: Problem, device: DeviceSpec, source: str = "config") -> KernelConfig:
    """`config` if it can run `problem` on `device`, else ValueError naming `source` and the reasons."""
    reasons = check_config(config, problem, device)
    if reasons:
        name = config.name if isinstance(config, KernelConfig) else repr(config)
        raise ValueError(
            f"{source}: {name} cannot run {problem.describe()} on {device.arch} "
            f"({device.num_sms} SMs): " + "; ".join(reasons)
        )
    return config


_FIELD_TYPES = {f.name: type(f.default) for f in fields(KernelConfig)}


def _parse_env(text: str) -> dict:
    data = parse_json(text, f"{ENV_VAR} must be a JSON object of KernelConfig fields")
    if not isinstance(data, dict):
        raise ValueError(f"{ENV_VAR} must be a JSON object of KernelConfig fields, got {type(data).__name__}")
    unknown = sorted(k for k in data if k not in _FIELD_TYPES)
    if unknown:
        raise ValueError(f"{ENV_VAR}: unknown KernelConfig fields {unknown}; known: {sorted(_FIELD_TYPES)}")
    for key in sorted(data):
        want, value = _FIELD_TYPES[key], data[key]
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if not ok:
            raise ValueError(f"{ENV_VAR}: field {key!r} must be {want.__name__}, got {value!r}")
    return data


def config_from_env(problem: Problem, device: DeviceSpec, environ=None) -> KernelConfig | None:
    """The configuration forced by the `JITGEMM_CONFIG` environment variable, or None when unset.

    The variable holds a JSON object of KernelConfig fields, e.g.
    `{"block_m": 128, "block_n": 208, "cluster_size": 2, "multicast": "A"}`. Fields left out are
    taken from `select`'s choice, except those that follow from the ones given, which are
    re-derived by the same rules: num_consumers from block_m, cluster_size and multicast from each
    other (and no cluster when select's pairing does not fit the tile given; a cluster given
    without a side keeps select's side, or pairs along the longer side where select's choice
    was unpaired, and takes the other side where only that one can pair the tile),
    num_stages (as many as fit), split_k (the cost model's best for that tile) and a_rows (the
    rows of A loaded, by select's rule) when the tile changes, select's B tail kept only where
    the tile given can end in one (never added), and the raster when the tile or split_k
    changes. `{"split_k": 4}` alone keeps select's tile and
    splits its K range up to 4 ways; `{"split_k": 1}` turns split-K off; `{"stream_k": true}` keeps
    select's tile and cuts its K blocks by stream-K instead (split_k 1; an unswapped choice only). `{"swap_ab": true}`
    (tile fields then in kernel coordinates, see jitgemm.geometry) drops select's B tail, a_rows,
    split-K and pair unless given. On sm_100a the same by
    the sm100 rules: num_consumers = block_m // 128, multicast 'A' under swap_ab else 'B' for a
    2-CTA pair (and 'none' without), num_stages and the raster by sm100's rules when the tile or
    swap_ab changes. arch comes from the
    device and dtype, out_dtype, a_major, b_major, has_c from the problem: giving a different
    value is an error. Raises ValueError naming JITGEMM_CONFIG and the reasons.
    """
    env = os.environ if environ is None else environ
    text = env.get(ENV_VAR, "")
    if not text.strip():
        return None
    data = _parse_env(text)
    try:
        cfg = _arch_module(device.arch).config_with_fields(select(problem, device), data, problem, device)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{ENV_VAR}={text!r}: {exc}") from None
    reasons = check_config(cfg, problem, device)
    if reasons:
        raise ValueError(
            f"{ENV_VAR}={text!r} gives {cfg.name}, which cannot run {problem.describe()} "
            f"on {device.arch} ({device.num_sms} SMs): " + "; ".join(reasons)
        )
    return cfg
