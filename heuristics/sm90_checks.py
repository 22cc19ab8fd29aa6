"""What makes an sm_90a config unable to run a problem (`check_config`), apart from the cost
model (heuristics/sm90.py) so that a config from the dispatch table, the tuning file or the
caller is checked without importing it: the register split of the template, accumulator
limits and split-K's reducer."""

from __future__ import annotations

from jitgemm.archs.sm90.layout import WGMMA_M, layout_of, structural_problems
from jitgemm.config import KernelConfig
from jitgemm.problem import Problem

from .device import DeviceSpec
from .rules import config_problems

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

SPLITK_ACC_REG_LIMIT = 96  # split 0 holds its accumulators and a whole split of partials in
# registers: m128n224 (112 accumulators) split 2 spills (NVRTC, sm_90a)


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
    return (
        config_problems(cfg, problem, device, structural_problems, layout_of, _register_problems)
        or split_problems(cfg, problem, device)
        or epilogue_problems(cfg, problem)
    )


def epilogue_problems(cfg: KernelConfig, problem: Problem) -> list[str]:
    """Why `cfg`'s epilogue cannot store `problem`'s output, in words: an unswapped tile 8 past a
    multiple of 16 stages its output rows as one unswizzled box that only TMA stores, and an
    output whose rows are not whole 16-byte units is written directly (plan.with_epilogue)."""
    if cfg.block_n % 16 and not cfg.swap_ab and not problem.aligned_out:
        return [
            f"block_n={cfg.block_n} unswapped stores the output with TMA, whose rows here are not whole "
            "16-byte units (a block_n that is a multiple of 16 writes them directly)"
        ]
    return []


def split_problems(cfg: KernelConfig, problem: Problem, device: DeviceSpec) -> list[str]:
    """Why `cfg`'s split-K cannot run `problem`, in words: the split that reduces a tile holds a
    batch of partials in registers besides its accumulators. (Any number of work units can run:
    no split waits for one that has not started; the heuristics keep split-K to one wave, see
    `split_choices`, because that is where it pays.)"""
    if cfg.split_k == 1 and not cfg.stream_k:
        return []
    regs = _acc_regs_of(cfg)
    if regs > SPLITK_ACC_REG_LIMIT:
        what = "stream_k" if cfg.stream_k else f"split_k={cfg.split_k}"
        return [
            f"{what} with {regs} accumulators per math thread: the split-K reducer "
            f"needs <= {SPLITK_ACC_REG_LIMIT} (it holds a split of partials in registers too)"
        ]
    return []
