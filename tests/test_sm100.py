"""The sm_100a (Blackwell, tcgen05) path, on the CPU.

There is no Blackwell GPU in this project: everything here renders, compiles with NVRTC for
sm_100a and reads the SASS; nothing runs a kernel. Covered:

- every config `heuristics.sm100.select` emits over a sweep of >= 100 problems (both input
  dtypes, all four layouts, 16-bit and fp32 output, with and without C, small M that swaps A and
  B) compiles, has the tcgen05 MMA (UTCHMMA) in its SASS and no local-memory spills;
- explicit configs for each variant (cta_group 1 and 2, one and two MMA consumers, swap_ab) do
  too, with the 2-CTA instructions where they belong;
- the layout / instruction-descriptor arithmetic, the structural rules, the heuristics' choices
  (each table row says why) and `explain`;
- `jitgemm precompile --arch sm_100a` and `jitgemm explain --arch sm_100a` without a GPU.
"""

from __future__ import annotations

import itertools
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from jitgemm import registry
from jitgemm.archs.sm100.layout import (
    SM_SHARED_MEMORY,
    SMEM_CAPACITY,
    TMEM_COLUMNS,
    instruction_descriptor,
    layout_of,
    structural_problems,
)
from jitgemm.compiler import compile_cubin
from jitgemm.config import KernelConfig
from jitgemm.heuristics import DeviceSpec, sm100
from jitgemm.problem import LAYOUTS, Problem
from jitgemm.render import kernel_name, render
from jitgemm.sass import find_tool, inspect_cubin

B200 = DeviceSpec("sm_100a", 148)

needs_cuobjdump = pytest.mark.skipif(
    find_tool("cuobjdump") is None,
    reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)",
)


def sm100_config(**kw) -> KernelConfig:
    base = dict(
        arch="sm_100a",
        dtype="bf16",
        out_dtype="bf16",
        a_major="K",
        b_major="K",
        block_m=128,
        block_n=128,
        block_k=64,
        num_stages=4,
        num_consumers=1,
    )
    base.update(kw)
    return KernelConfig(**base)


def compile_and_inspect(cfg: KernelConfig):
    result = compile_cubin(render(cfg), "sm_100a", name=f"{kernel_name(cfg)}.cu")
    return result, inspect_cubin(result.cubin)


# ----------------------------------------------------------------------------- the sweep

SHAPES = [
    (1, 4096, 4096),
    (16, 7168, 2048),
    (32, 32768, 8192),
    (64, 16384, 16384),
    (100, 3000, 512),
    (128, 65536, 8192),
    (256, 7168, 4096),
    (300, 300, 300),
    (777, 1234, 999),
    (1024, 1024, 1024),
    (2048, 256, 8192),
    (4096, 4096, 4096),
    (4096, 7168, 2048),
    (8192, 8192, 8192),
    (7168, 128, 4096),
    (100000, 64, 64),
    (6144, 24576, 1536),
    (2112, 7168, 512),
]
# (layout, dtype, output, has_c): 32 combinations; each shape takes 8 of them, rotating, so the
# sweep meets every combination several times without compiling the full cross product.
COMBOS = list(itertools.product(sorted(LAYOUTS), ("bf16", "fp16"), ("same", "fp32"), (False, True)))


def sweep_problems() -> list[Problem]:
    problems = []
    for i, (m, n, k) in enumerate(SHAPES):
        for j in range(8):
            layout, dtype, out, has_c = COMBOS[(5 * i + 4 * j) % len(COMBOS)]
            a_major, b_major = LAYOUTS[layout]
            problems.append(Problem(m, n, k, dtype, dtype if out == "same" else "fp32", a_major, b_major, has_c))
    return problems


SWEEP_PROBLEMS = sweep_problems()
SWEEP_CONFIGS = sorted({sm100.select(p, B200) for p in SWEEP_PROBLEMS}, key=lambda c: c.name)


def test_the_sweep_covers_the_problem_space():
    ps = SWEEP_PROBLEMS
    assert len(ps) >= 100
    assert {p.dtype for p in ps} == {"bf16", "fp16"}
    assert {(p.a_major, p.b_major) for p in ps} == set(LAYOUTS.values())
    assert {p.out_dtype == "fp32" for p in ps} == {True, False}
    assert {p.has_c for p in ps} == {True, False}
    # ... and the heuristics use every variant of the template on it.
    cs = SWEEP_CONFIGS
    assert {c.swap_ab for c in cs} == {True, False}
    assert {c.cluster_size for c in cs} == {1, 2}
    assert {c.num_consumers for c in cs} == {1, 2}
    assert {c.multicast for c in cs if c.cluster_size == 2} == {"A", "B"}
    assert {c.out_dtype for c in cs} == {"bf16", "fp16", "fp32"}


@pytest.fixture(scope="module")
def sweep_results():
    """Compile every config of the sweep once, two at a time (the CI machine has 2 cores)."""

    def job(cfg):
        try:
            return cfg.name, compile_and_inspect(cfg)
        except Exception as exc:  # reported by the test of that config
            return cfg.name, exc

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(job, SWEEP_CONFIGS))


@pytest.mark.slow  # the fast subset compiles test_variant_compiles_to_the_expected_sass's variants
@needs_cuobjdump
@pytest.mark.parametrize("cfg", SWEEP_CONFIGS, ids=[c.name for c in SWEEP_CONFIGS])
def test_every_selected_config_compiles_with_tcgen05_and_no_spills(cfg, sweep_results):
    found = sweep_results[cfg.name]
    if isinstance(found, Exception):
        raise found
    result, report = found
    assert report.mma_counts.get("UTCHMMA", 0) > 0, f"no UTCHMMA in the SASS: {report.mma_counts}"
    assert "HGMMA" not in report.mma_counts
    assert not report.spills, (
        f"local memory: {report.local_loads} LDL, {report.local_stores} STL, "
        f"{report.stack_bytes} stack bytes, {report.registers} registers"
    )
    lay = layout_of(cfg)
    assert report.registers * lay.num_threads <= 65536
    assert lay.smem_bytes <= SMEM_CAPACITY


# ----------------------------------------------------------------------------- explicit variants

VARIANTS = {
    # cta_group::1, one consumer, every layout, 16-bit and fp32 out, with C.
    "1cta_1c_KK": sm100_config(),
    "1cta_1c_MN_C": sm100_config(a_major="M", b_major="N", has_c=True),
    "1cta_1c_MK_fp32_C": sm100_config(a_major="M", b_major="K", out_dtype="fp32", has_c=True),
    "1cta_1c_KN_fp16_n256": sm100_config(dtype="fp16", out_dtype="fp16", b_major="N", block_n=256, num_stages=3),
    "1cta_1c_n16_fp32": sm100_config(block_n=16, out_dtype="fp32", raster="n"),
    "1cta_1c_n48_bf16": sm100_config(block_n=48, group_size=16),
    # A second MMA consumer: 256 rows of A share the staged B tile.
    "1cta_2c_KK": sm100_config(block_m=256, num_consumers=2),
    "1cta_2c_MN_fp32_C": sm100_config(
        block_m=256, num_consumers=2, a_major="M", b_major="N", out_dtype="fp32", has_c=True, num_stages=3
    ),
    # The 2-CTA MMA (cta_group::2): each CTA holds half of B.
    "2cta_1c_KK": sm100_config(cluster_size=2, multicast="B"),
    "2cta_1c_KN_n256_C": sm100_config(cluster_size=2, multicast="B", b_major="N", block_n=256, has_c=True),
    "2cta_2c_MN": sm100_config(
        cluster_size=2, multicast="B", block_m=256, num_consumers=2, a_major="M", b_major="N", block_n=256, num_stages=3
    ),
    "2cta_1c_n16": sm100_config(cluster_size=2, multicast="B", block_n=16),
    # swap_ab: D^T = B^T A^T, the small M on the MMA's N.
    "swap_1cta_n16": sm100_config(swap_ab=True, block_n=16),
    "swap_1cta_n48_fp32_C": sm100_config(swap_ab=True, block_n=48, out_dtype="fp32", has_c=True),
    "swap_1cta_MN_n64_fp16_C": sm100_config(
        swap_ab=True, block_n=64, a_major="M", b_major="N", dtype="fp16", out_dtype="fp16", has_c=True
    ),
    "swap_2c_n32": sm100_config(swap_ab=True, block_n=32, block_m=256, num_consumers=2),
    "swap_2cta_A_Mmajor_n128": sm100_config(swap_ab=True, cluster_size=2, multicast="A", a_major="M"),
    "swap_2cta_2c_n64_C": sm100_config(
        swap_ab=True, cluster_size=2, multicast="A", block_m=256, num_consumers=2, block_n=64, has_c=True
    ),
}


@needs_cuobjdump
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_compiles_to_the_expected_sass(name):
    cfg = VARIANTS[name]
    result, report = compile_and_inspect(cfg)
    sass = report.sass
    assert report.mma_counts.get("UTCHMMA", 0) > 0
    assert not report.spills
    assert "LDTM" in sass  # tcgen05.ld: the writeback reads TMEM
    assert "UTCBAR" in sass  # tcgen05.commit
    assert "UTMALDG" in sass and "UTMASTG" in sass
    if cfg.has_c:
        assert sass.count("UTMALDG") >= 3  # A, B and the C boxes
    two_cta = [line for line in sass.splitlines() if "UTCHMMA" in line and ".2CTA" in line]
    if cfg.cluster_size == 2:
        assert two_cta, "cta_group::2 MMA expected"
        assert "UTMALDG.2D.2CTA" in sass  # loads complete on the even CTA's barrier
        assert "UTCBAR.2CTA.MULTICAST" in sass  # commits reach both CTAs
        assert "UTCATOMSWS.2CTA" in sass  # cooperative TMEM allocation
    else:
        assert not two_cta and ".2CTA" not in sass


def test_2cta_source_uses_one_cta_group_and_the_pair_barriers():
    src = render(VARIANTS["2cta_1c_KK"])
    assert '#define TCGEN05_CTA_GROUP ".cta_group::2"' in src
    assert "cta_group::1" not in src
    assert "umma_commit_multicast(mma2tma(ps.stage), (u16)0x3)" in src
    assert "umma_commit_multicast(mma2ld(consumer, acc.stage), (u16)0x3)" in src
    assert "mbar_expect_tx(full, CLUSTER * STAGE_BYTES)" in src  # the byte count covers both CTAs
    assert "mbar_init(ld2mma(c, a), 128 * CLUSTER)" in src
    # Release: a cluster barrier, then the dealloc.
    tail = src[src.rindex("tcgen05_fence_before();") :]
    assert tail.index("cluster_sync()") < tail.index("tmem_dealloc")


def test_source_is_self_contained_and_keeps_the_parameter_convention():
    for cfg in (VARIANTS["1cta_1c_MN_C"], VARIANTS["swap_1cta_n16"]):
        src = render(cfg)
        assert "#include" not in src
        assert 'extern "C" __global__' in src and kernel_name(cfg) in src
        params = re.search(re.escape(kernel_name(cfg)) + r"\((.*?)\)\n\{", src, re.S).group(1)
        names = re.findall(r"(\w+)\s*(?:,|$)", params.replace("\n", " "))
        expected = ["map_a", "map_b", "map_d"] + (["map_c"] if cfg.has_c else []) + ["M", "N", "K", "alpha", "beta"]
        assert names == expected
        for role in (
            "tma2mma",
            "mma2tma",
            "mma2ld",
            "ld2mma",
            "PipeState",
            "tmem_alloc",
            "tmem_relinquish",
            "tmem_dealloc",
            "tile_of",
        ):
            assert role in src


# ----------------------------------------------------------------------------- layout


def test_instruction_descriptor_fields():
    # bf16 x bf16 -> f32, K-major both, M=128, N=128.
    d = instruction_descriptor(sm100_config(), 128)
    assert (d >> 4) & 3 == 1  # D = f32
    assert (d >> 7) & 7 == 1 and (d >> 10) & 7 == 1  # A, B = bf16
    assert (d >> 15) & 1 == 0 and (d >> 16) & 1 == 0  # both K-major
    assert (d >> 17) & 0x3F == 128 >> 3
    assert (d >> 24) & 0x1F == 128 >> 4
    assert d & 0b1111 == 0 and (d >> 23) & 1 == 0 and (d >> 29) == 0
    # fp16, A M-major and B N-major, the 2-CTA M=256, N=48.
    d = instruction_descriptor(sm100_config(dtype="fp16", a_major="M", b_major="N", block_n=48), 256)
    assert (d >> 7) & 7 == 0 and (d >> 10) & 7 == 0
    assert (d >> 15) & 1 == 1 and (d >> 16) & 1 == 1
    assert (d >> 17) & 0x3F == 6 and (d >> 24) & 0x1F == 16
    # swap_ab: the MMA's A is the user's B, so the major bits swap too.
    d = instruction_descriptor(sm100_config(swap_ab=True, a_major="M", b_major="K", block_n=32), 128)
    assert (d >> 15) & 1 == 0 and (d >> 16) & 1 == 1


def test_layout_of_the_2cta_pair():
    lay = layout_of(sm100_config(cluster_size=2, multicast="B", b_major="N", block_n=256))
    assert lay.cta_group == 2 and lay.umma_m == 256 and lay.umma_n == 256
    assert lay.a.box == (64, 128) and lay.a.tile_bytes == 128 * 128
    # Each CTA loads half of B: two 64-column MN-major pieces of the 256.
    assert lay.b.shared_by_pair and lay.b.num_pieces == 2 and lay.b.box == (64, 64)
    assert lay.expect_tx_bytes == 2 * (lay.a.tile_bytes + lay.b.tile_bytes)
    assert lay.acc_stages == 2 and lay.tmem_alloc_columns == 512
    assert lay.num_threads == 256


def test_layout_of_swap_ab_and_two_consumers():
    lay = layout_of(sm100_config(swap_ab=True, block_m=256, num_consumers=2, block_n=32, out_dtype="fp32"))
    assert lay.mma_a is lay.b and lay.mma_b is lay.a
    assert lay.b.box == (64, 256) and lay.a.box == (64, 32)  # user B: 256 kernel rows; user A: 32
    # D is written as boxes 32 columns (128 bytes of fp32) wide and chunk_cols user-M rows high.
    assert lay.out_swizzle == 128 and lay.out_box == (32, 32) and lay.boxes_per_chunk == 4
    assert lay.tmem_columns == 2 * 2 * 32 and lay.tmem_alloc_columns == 128
    assert lay.num_threads == 384
    arch = registry.get("sm_100a")
    assert arch.cluster_tiles(lay.config, m=32, n=1000) == 4  # kernel M = N = 1000 -> 4 tiles of 256
    assert arch.grid_size(lay.config, Problem(32, 100000, 64), num_sms=148) == 148


def test_tmem_is_single_buffered_when_two_buffers_do_not_fit():
    lay = layout_of(sm100_config(block_m=256, num_consumers=2, block_n=256, num_stages=2))
    assert lay.acc_stages == 1 and lay.tmem_columns == TMEM_COLUMNS == lay.tmem_alloc_columns


@pytest.mark.parametrize(
    "kw",
    [
        dict(block_n=16, num_stages=2),
        dict(block_n=256, num_stages=2),
        dict(block_m=256, num_consumers=2, block_n=64, num_stages=2),
        dict(block_n=128, num_stages=3, cluster_size=2, multicast="B"),
    ],
)
def test_one_cta_per_sm_even_with_few_stages(kw):
    # each CTA holds its TMEM columns (all 512 for the widest accumulators) while it runs: a second
    # CTA on the SM could wait for them forever, so the shared memory asked for leaves no room for one
    lay = layout_of(sm100_config(**kw))
    assert 2 * (lay.smem_bytes + 1024) > SM_SHARED_MEMORY and lay.smem_bytes <= SMEM_CAPACITY


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(block_m=64), "block_m must be 128 per MMA consumer"),
        (dict(block_m=128, num_consumers=2), "block_m must be 128 per MMA consumer"),
        (dict(cluster_size=2, multicast="A"), "multicast must be 'B'"),
        (dict(cluster_size=2, multicast="B", swap_ab=True), "multicast must be 'A'"),
        (dict(b_major="N", block_n=96), "whole 64-element swizzle rows"),
        (dict(b_major="N", block_n=64, cluster_size=2, multicast="B"), "whole 64-element swizzle rows"),
        (dict(swap_ab=True, a_major="M", block_n=32), "whole 64-element swizzle rows"),
        (dict(block_m=256, num_consumers=2, block_n=272 - 16, split_k=2), "split_k"),
        (dict(b_major="N", block_n=160, b_tail=True), "b_tail is not implemented"),
    ],
)
def test_structural_rules(kw, words):
    problems = structural_problems(sm100_config(**kw))
    assert any(words in p for p in problems), problems
    with pytest.raises(ValueError, match="cannot be laid out for sm_100a"):
        layout_of(sm100_config(**kw))


# ----------------------------------------------------------------------------- heuristics

TABLE = [
    # (m, n, k, layout, why, expectation)
    (
        4096,
        4096,
        4096,
        "nn",
        "many waves of large tiles: the 2-CTA MMA (pair along M, splitting B) halves each CTA's B reads",
        lambda c: c.cluster_size == 2 and c.multicast == "B" and not c.swap_ab and c.block_n >= 128,
    ),
    (
        8192,
        8192,
        8192,
        "nt",
        "N-major B on the 2-CTA MMA: each CTA's half of block_n must be whole 64-column swizzle rows",
        lambda c: c.cluster_size == 2 and (c.block_n // 2) % 64 == 0,
    ),
    (
        64,
        16384,
        16384,
        "nn",
        "small M, large N and K: swap A and B so M=64 is the MMA's N instead of padding it to 128 rows",
        lambda c: c.swap_ab and c.block_n == 64 and c.block_m == 128,
    ),
    (
        128,
        65536,
        8192,
        "nn",
        "swapped and big enough for a 2-CTA pair: under swap_ab the pair splits user A",
        lambda c: c.swap_ab and c.cluster_size == 2 and c.multicast == "A",
    ),
    (
        65536,
        16,
        4096,
        "nn",
        "swap_ab only when M is the small side; the small N is already the MMA's N",
        lambda c: not c.swap_ab and c.block_n == 16,
    ),
    (
        300,
        300,
        300,
        "nt",
        "a single wave: no 2-CTA pair and no second consumer",
        lambda c: c.cluster_size == 1 and c.num_consumers == 1,
    ),
    (
        16,
        16,
        16,
        "nn",
        "a tiny problem takes the smallest tile",
        lambda c: c.block_m == 128 and c.block_n == 16 and c.cluster_size == 1,
    ),
]


@pytest.mark.parametrize("m, n, k, layout, why, expect", TABLE, ids=[f"{r[0]}x{r[1]}x{r[2]}_{r[3]}" for r in TABLE])
def test_select_table(m, n, k, layout, why, expect):
    problem = Problem(m, n, k, "bf16", "bf16", *LAYOUTS[layout])
    cfg = sm100.select(problem, B200)
    assert expect(cfg), f"{why}: got {cfg.name}"
    assert sm100.check_config(cfg, problem, B200) == []


def test_no_2cta_pair_on_an_odd_sm_count():
    cfg = sm100.select(Problem(4096, 4096, 4096), DeviceSpec("sm_100a", 147))
    assert cfg.cluster_size == 1


def test_every_sweep_choice_is_legal_and_within_the_budgets():
    for p in SWEEP_PROBLEMS:
        cfg = sm100.select(p, B200)
        assert sm100.check_config(cfg, p, B200) == [], (p, cfg.name)
        lay = layout_of(cfg)
        assert lay.tmem_columns <= TMEM_COLUMNS
        assert cfg.num_stages >= 3
        assert not cfg.swap_ab or p.m < p.n
        assert cfg.multicast == ("none" if cfg.cluster_size == 1 else ("A" if cfg.swap_ab else "B"))
        assert sm100.select(p, B200) == cfg  # deterministic


def test_explain_has_the_shape_of_the_sm90_report():
    problem = Problem(64, 4096, 7168, "bf16", "fp32", "K", "N", has_c=True)
    report = sm100.explain(problem, B200, top=3)
    json.dumps(report)
    assert {"problem", "device", "chosen", "candidates", "rejected"} <= set(report)
    assert report["chosen"] == sm100.select(problem, B200).to_dict()
    assert 1 <= len(report["candidates"]) <= 3
    for c in report["candidates"]:
        assert {"config", "name", "cost"} <= set(c)
        assert c["name"] == KernelConfig.from_dict(c["config"]).name
    assert [c["cost"] for c in report["candidates"]] == sorted(c["cost"] for c in report["candidates"])
    assert report["rejected"] and all(set(r) == {"config", "rule"} for r in report["rejected"])
    assert any("64-element swizzle rows" in r["rule"] for r in report["rejected"])
    assert any("TMEM budget" in r["rule"] or "single wave" in r["rule"] for r in report["rejected"])


def test_sm100_heuristics_refuse_other_archs():
    with pytest.raises(ValueError, match="sm_100a"):
        sm100.select(Problem(128, 128, 128), DeviceSpec("sm_90a", 132))


def test_check_config_names_the_problems():
    problem = Problem(4096, 4096, 4096, "bf16", "bf16", "K", "N")
    reasons = sm100.check_config(sm100_config(b_major="K", num_stages=16, block_n=256), problem, B200)
    assert any("b_major" in r for r in reasons)
    assert any("shared memory" in r for r in reasons)


# ----------------------------------------------------------------------------- CLI


def test_cli_explain_sm100(tmp_cache):
    from click.testing import CliRunner

    from jitgemm.cli import main

    result = CliRunner().invoke(
        main, ["explain", "64", "16384", "16384", "--layout", "nn", "--arch", "sm_100a", "--num-sms", "148", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["chosen"]["arch"] == "sm_100a" and report["chosen"]["swap_ab"] is True


@needs_cuobjdump
def test_cli_precompile_sm100(tmp_cache):
    from click.testing import CliRunner

    from jitgemm.cli import main

    result = CliRunner().invoke(
        main,
        [
            "precompile",
            "--m",
            "64,4096",
            "--n",
            "4096",
            "--k",
            "4096",
            "--arch",
            "sm_100a",
            "--num-sms",
            "148",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["arch"] == "sm_100a"
    assert [k["status"] for k in summary["kernels"]] == ["compiled", "compiled"]
    assert {k["config"]["arch"] for k in summary["kernels"]} == {"sm_100a"}


def test_kernels_prepare_uses_the_sm100_layout():
    from jitgemm import kernels
    from jitgemm.archs.sm100 import layout as sm100_layout

    src = kernels.prepare(VARIANTS["swap_1cta_n16"])
    assert isinstance(src.layout, sm100_layout.KernelLayout)
