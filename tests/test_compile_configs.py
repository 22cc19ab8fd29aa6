"""Render and NVRTC-compile every distinct sm_90a config the heuristics emit over a sweep of
problems, split-K ones included, and check the SASS (HGMMA present, no local-memory spills).
CPU only: NVRTC and cuobjdump need no GPU."""

import itertools
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from jitgemm import kernels
from jitgemm.heuristics import DeviceSpec, select
from jitgemm.problem import LAYOUTS, Problem
from jitgemm.sass import find_tool, inspect_cubin

# M from decode to large prefill, plus odd sizes; (N, K) from DeepSeek-V3 and Llama layers,
# plus odd shapes. Each problem gets one (dtype, output, layout) combination in turn, so the
# sweep covers every combination without multiplying the config count by 16.
MS = [1, 3, 16, 64, 128, 200, 333, 1000, 2048, 4096, 6000, 8192, 16384]
NKS = [
    (2112, 7168),
    (24576, 1536),
    (32768, 512),
    (7168, 16384),
    (4096, 7168),
    (7168, 2048),
    (576, 7168),
    (4096, 4096),
    (14336, 4096),
    (4096, 14336),
    (6144, 4096),
    (28672, 8192),
    (8192, 28672),
    (1000, 1000),
    (777, 333),
    (129, 4100),
]
COMBOS = [(dtype, out, layout) for dtype in ("bf16", "fp16") for out in ("same", "fp32") for layout in sorted(LAYOUTS)]
DEVICE = DeviceSpec("sm_90a", 132)
# The sweep compiles every distinct config (minutes on 2 cores): test_render_compile.py compiles
# one config per template knob in the fast subset.
pytestmark = pytest.mark.slow


def sweep_problems() -> list:
    out = []
    for i, (m, (n, k)) in enumerate(itertools.product(MS, NKS)):
        dtype, odt, layout = COMBOS[(i * 7) % len(COMBOS)]
        a_major, b_major = LAYOUTS[layout]
        out.append(Problem(m, n, k, dtype, dtype if odt == "same" else "fp32", a_major, b_major, has_c=(i % 7 == 3)))
    return out


def distinct_configs(problems) -> list:
    seen = {}
    for p in problems:
        seen.setdefault(select(p, DEVICE), p)
    return sorted(seen, key=lambda c: c.name)


def test_sweep_covers_the_space():
    problems = sweep_problems()
    assert len(problems) >= 200
    assert {p.dtype for p in problems} == {"bf16", "fp16"}
    assert {p.layout for p in problems} == set(LAYOUTS)
    assert {p.out_dtype for p in problems} == {"bf16", "fp16", "fp32"}
    assert {p.has_c for p in problems} == {False, True}
    cfgs = distinct_configs(problems)
    # the sweep reaches every knob the heuristics turn
    assert {c.block_m for c in cfgs} == {64, 128, 256}
    assert {c.multicast for c in cfgs} == {"none", "A", "B"}
    assert {c.raster for c in cfgs} == {"m", "n"} and {c.group_size for c in cfgs} == {8, 16}
    assert any(c.block_n % 64 for c in cfgs)  # odd widths such as 112 or 208
    assert any(c.block_n < 64 for c in cfgs)  # narrow tiles: 64- and 32-byte swizzled B/A pieces
    # split-K kernels (the fix-up path of the template), also inside a 2-CTA cluster and with C
    splits = [c for c in cfgs if c.split_k > 1]
    assert splits and any(c.cluster_size == 2 for c in splits) and any(c.has_c for c in splits)
    assert {(c.dtype, c.out_dtype, c.a_major, c.b_major) for c in cfgs} >= {
        (d, o, a, b) for d in ("bf16", "fp16") for o in (d, "fp32") for a, b in LAYOUTS.values()
    }


def _check(cfg):
    """None when `cfg` compiles to wgmma without spills, else a line saying what went wrong."""
    try:
        built = kernels.build(cfg)
        report = inspect_cubin(built.cubin)
    except Exception as exc:  # noqa: BLE001 - collect every failure, then report them all
        return f"{cfg.name}: {type(exc).__name__}: {str(exc)[:2000]}"
    problems = []
    if report.mma_counts.get("HGMMA", 0) == 0:
        problems.append("no HGMMA in the SASS")
    if report.spills:
        problems.append(f"local memory: stack={report.stack_bytes} LDL={report.local_loads} STL={report.local_stores}")
    if "USETMAXREG" not in report.sass:
        problems.append("no USETMAXREG: the register split did not take effect")
    return f"{cfg.name}: " + "; ".join(problems) if problems else None


def test_every_selected_config_compiles_without_spills(tmp_cache):
    if find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    problems = sweep_problems()
    cfgs = distinct_configs(problems)
    kernels.default_cache()  # resolve the (temporary) cache root once, before the threads
    start = time.perf_counter()
    # NVRTC releases the GIL and cuobjdump is a subprocess: two threads use both CI cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(_check, cfgs))
    seconds = time.perf_counter() - start
    print(
        f"\n{len(cfgs)} distinct sm_90a configs from {len(problems)} problems: rendered, compiled "
        f"and SASS-checked in {seconds:.1f} s"
    )
    failures = [r for r in results if r]
    assert not failures, f"{len(failures)} of {len(cfgs)} configs failed:\n" + "\n".join(failures)
