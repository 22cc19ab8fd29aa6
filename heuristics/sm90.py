"""Kernel selection for Hopper (sm_90a)."""
from __future__ import annotations

from jitgemm.config import KernelConfig
from jitgemm.problem import Problem

from .common import DeviceSpec, ceil_div, max_stages


def select(problem: Problem, device: DeviceSpec) -> KernelConfig:
    if problem.m <= 64:
        block_m, consumers = 64, 1
    else:
        block_m, consumers = 128, 2
    if problem.out_dtype == "fp32" or ceil_div(problem.m, block_m) * ceil_div(problem.n, 256) < device.num_sms:
        block_n = 128
    else:
        block_n = 256
    base = KernelConfig(arch=device.arch, dtype=problem.dtype, out_dtype=problem.out_dtype,
                        a_major=problem.a_major, b_major=problem.b_major, block_m=block_m,
                        block_n=block_n, num_stages=2, num_consumers=consumers, has_c=problem.has_c)
    stages = max_stages(base, device.smem_capacity)
    return KernelConfig(**{**base.to_dict(), "num_stages": stages})
