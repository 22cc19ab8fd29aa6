"""Outputs TMA cannot address (issue 20), on the CPU: which problems say so, and which configs
write them directly (plan.with_epilogue)."""

import dataclasses

import numpy as np
import pytest

from jitgemm import plan
from jitgemm.config import KernelConfig
from jitgemm.heuristics import DeviceSpec, check_config, sm90
from jitgemm.problem import Problem

H200 = DeviceSpec("sm_90a", 132)
B200 = DeviceSpec("sm_100a", 148)


@pytest.mark.parametrize(
    "n, out_dtype, aligned", [(64, "bf16", True), (60, "bf16", False), (60, "fp32", True), (7, "fp32", False)]
)
def test_problems_know_whether_tma_can_address_the_output(n, out_dtype, aligned):
    p = Problem(64, n, 64, "bf16", out_dtype)
    assert p.aligned_out == aligned
    assert ("not 16-byte aligned" in p.describe()) == (not aligned)
    assert Problem(64, n, 64, "bf16", out_dtype, aligned_out=True).aligned_out


def test_the_aligned_flag_is_checked():
    with pytest.raises(ValueError, match="aligned_out"):
        Problem(64, 64, 64, aligned_out=1)


@pytest.mark.parametrize("seed", range(3))
def test_unaligned_outputs_are_written_directly_on_sm90_only(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        m, n, k = (int(x) for x in rng.integers(1, 5000, 3))
        a_major, b_major = ("K", "M")[rng.integers(2)], ("K", "N")[rng.integers(2)]
        p = Problem(m, n, k, "bf16", a_major=a_major, b_major=b_major, has_c=bool(rng.integers(2)))
        cfg, _ = plan.choose(p, H200)
        assert not check_config(cfg, p, H200), cfg.name
        assert cfg.out_direct == (not p.aligned_out)
        # the heuristics' tile: only the epilogue differs from the aligned problem's choice
        aligned, _ = plan.choose(dataclasses.replace(p, aligned_out=True), H200)
        if p.has_c and aligned.swap_ab:  # a C read directly keeps the tile narrowing would take
            aligned = sm90._ranked_first(dataclasses.replace(p, aligned_out=True), H200)
        assert cfg == dataclasses.replace(aligned, out_direct=cfg.out_direct)
        # sm_100a kernels store with TMA only (an unaligned output is copied)
        assert not plan.choose(p, B200)[0].out_direct


def test_the_epilogue_follows_the_problem_whatever_gives_the_config():
    unaligned, aligned = Problem(300, 301, 64, "bf16"), Problem(300, 304, 64, "bf16")
    assert plan.choose(unaligned, H200, config=KernelConfig())[0].out_direct
    assert not plan.choose(aligned, H200, config=KernelConfig(out_direct=True))[0].out_direct
    # the tile stays the one given
    cfg, source = plan.choose(unaligned, H200, config=KernelConfig(block_n=64, num_stages=5))
    assert (cfg.block_n, cfg.num_stages, cfg.out_direct, source) == (64, 5, True, "argument")
