"""Arch-independent pieces of kernel selection: the device description and smem arithmetic."""
from __future__ import annotations

from dataclasses import dataclass

from jitgemm.config import KernelConfig
from jitgemm.layout import SMEM_CAPACITY, layout_of

MAX_STAGES = 8


@dataclass(frozen=True)
class DeviceSpec:
    """What selection needs to know about a GPU; built from a live device or from CLI flags."""
    arch: str = "sm_90a"
    num_sms: int = 132

    @property
    def smem_capacity(self) -> int:
        return SMEM_CAPACITY[self.arch]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def max_stages(cfg: KernelConfig, capacity: int, cap: int = MAX_STAGES) -> int:
    """Most pipeline stages (up to `cap`) for which `cfg` fits `capacity` bytes of shared memory."""
    best = 0
    for stages in range(2, cap + 1):
        trial = KernelConfig(**{**cfg.to_dict(), "num_stages": stages})
        if layout_of(trial).smem_bytes <= capacity:
            best = stages
    return best
