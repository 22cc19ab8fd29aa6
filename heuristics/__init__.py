"""Kernel-configuration heuristics: `select(problem, device) -> KernelConfig` (pure, deterministic)."""
from __future__ import annotations

from jitgemm.config import KernelConfig
from jitgemm.problem import Problem

from . import sm90
from .common import DeviceSpec

__all__ = ["DeviceSpec", "select"]


def select(problem: Problem, device: DeviceSpec) -> KernelConfig:
    if device.arch == "sm_90a":
        return sm90.select(problem, device)
    raise ValueError(f"no heuristics for arch {device.arch!r}; supported: ['sm_90a']")
