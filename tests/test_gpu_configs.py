"""Forced kernel configurations on the GPU (issue 3): every knob value the heuristics can emit,
checked against a float64 reference on fresh random data with NaN-poisoned, guarded outputs."""

import dataclasses
import itertools

import pytest
from gpu_helpers import assert_close, guard_untouched, guarded_out, random_operand

import jitgemm
from jitgemm import api, geometry, registry
from jitgemm.archs.sm90.layout import SMEM_CAPACITY, layout_of
from jitgemm.config import KernelConfig

pytestmark = pytest.mark.gpu


# (name, config knobs, (M, N, K)): shapes chosen so each knob meets its edge case.
CASES = [
    ("cluster1_2consumers_n256", dict(block_n=256, num_stages=3), (1000, 1000, 1000)),
    ("cluster1_1consumer_m64", dict(block_m=64, num_consumers=1, block_n=128, num_stages=6), (200, 300, 500)),
    ("m128_1consumer", dict(block_m=128, num_consumers=1, block_n=128, num_stages=5), (300, 700, 900)),
    ("m256_2consumers", dict(block_m=256, num_consumers=2, block_n=128, num_stages=3), (1000, 600, 700)),
    ("n112", dict(block_n=112, num_stages=5), (777, 1000, 600)),
    ("n144", dict(block_n=144, num_stages=4), (700, 1000, 300)),
    ("n208", dict(block_n=208, num_stages=3), (700, 1000, 300)),
    # narrow tiles: an N-major B this narrow uses a 32- or 64-byte swizzle (16/32-wide pieces)
    ("n16", dict(block_m=64, num_consumers=1, block_n=16, num_stages=8), (100, 100, 1000)),
    ("n32", dict(block_m=64, num_consumers=1, block_n=32, num_stages=8), (100, 300, 1000)),
    ("n48", dict(block_m=64, num_consumers=1, block_n=48, num_stages=8), (70, 500, 700)),
    ("n48_splitk", dict(block_m=64, num_consumers=1, block_n=48, num_stages=8, split_k=3), (16, 1000, 3000)),
    # multicast A: the pair shares the A tile along N; 5 column blocks -> the last pair is half empty
    ("mcastA_odd_pairs", dict(block_n=128, num_stages=4, cluster_size=2, multicast="A"), (520, 5 * 128 - 3, 700)),
    # multicast B: the pair shares the B tile along M; 3 row blocks -> odd
    ("mcastB_odd_pairs", dict(block_n=128, num_stages=4, cluster_size=2, multicast="B"), (3 * 128 - 5, 600, 700)),
    (
        "mcastA_n256_raster_n",
        dict(block_n=256, num_stages=3, cluster_size=2, multicast="A", raster="n", group_size=16),
        (2048, 2048, 1024),
    ),
    (
        "mcastB_1consumer",
        dict(block_m=128, num_consumers=1, block_n=128, num_stages=4, cluster_size=2, multicast="B"),
        (640, 384, 256),
    ),
    # K of one block, and fewer K blocks than stages
    ("k_one_block", dict(block_n=128, num_stages=6), (512, 512, 64)),
    ("k_fewer_than_stages", dict(block_n=128, num_stages=6), (512, 512, 3 * 64 - 5)),
    # split-K: partial sums in fp32, split 0 adds the others in order
    ("splitk4", dict(block_m=64, num_consumers=1, block_n=64, num_stages=8, split_k=4), (64, 1000, 4096)),
    ("splitk3_uneven_k", dict(block_n=128, num_stages=5, split_k=3), (300, 520, 7 * 64 + 1)),
    ("splitk_more_than_kblocks", dict(block_n=128, num_stages=4, split_k=8), (128, 256, 200)),
    ("splitk_cluster", dict(block_n=128, num_stages=4, cluster_size=2, multicast="B", split_k=2), (3 * 128, 384, 2048)),
    # split 0 (the reducer) leads by REDUCER_LEAD_KBLOCKS K blocks: the whole lead (25 + 17 K
    # blocks), and a lead capped at half a split with uneven shares of the rest
    (
        "splitk2_reducer_lead",
        dict(block_m=64, num_consumers=1, block_n=128, num_stages=8, split_k=2),
        (128, 520, 64 * 41 + 17),
    ),
    (
        "splitk6_capped_lead",
        dict(block_m=64, num_consumers=1, block_n=64, num_stages=13, split_k=6),
        (100, 300, 64 * 60 + 3),
    ),
    # decode: only the rows of A that exist are loaded; the rest of the tile is never written
    ("a_rows8", dict(block_m=64, num_consumers=1, block_n=64, num_stages=13, a_rows=8), (3, 700, 2000)),
    (
        "a_rows16_splitk",
        dict(block_m=64, num_consumers=1, block_n=64, num_stages=13, a_rows=16, split_k=3),
        (13, 1000, 3000),
    ),
    ("a_rows_2consumers", dict(block_m=128, num_consumers=2, block_n=128, num_stages=5, a_rows=104), (100, 520, 900)),
    # B tails: the columns past the last 64-wide piece load as a narrower piece (16, 32 or 3 x 16
    # wide); the last tile's tail lies partly or wholly past N
    (
        "b_tail_n144_mcastA",
        dict(block_n=144, num_stages=5, cluster_size=2, multicast="A", b_tail=True),
        (700, 1000, 900),
    ),
    (
        "b_tail_n160_splitk",
        dict(block_m=64, num_consumers=1, block_n=160, num_stages=6, split_k=3, b_tail=True),
        (64, 700, 3000),
    ),
    ("b_tail_n176", dict(block_n=176, num_stages=4, b_tail=True), (300, 1000, 500)),
    ("b_tail_n80", dict(block_m=64, num_consumers=1, block_n=80, num_stages=8, b_tail=True), (100, 333, 700)),
    # wider than 256 (N-major B only): one wgmma per 256-column slice, output through a ring of
    # staging buffers; several tiles per CTA so the ring wraps across tiles
    ("wide_n384_mcastB", dict(block_n=384, num_stages=3, cluster_size=2, multicast="B"), (2947, 3000, 200)),
    ("wide_n336_b_tail", dict(block_n=336, num_stages=3, b_tail=True), (2600, 3000, 300)),
]

LAYOUTS = [("row", "row"), ("col", "col")]


@pytest.fixture(scope="module")
def gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(4321)


def forced_config(knobs, dtype, out_dtype, a_layout, b_layout, has_c=False):
    """The table's knobs for this problem; a wider (fp32) output tile may cost pipeline stages.
    a_rows applies to a K-major (row-major) A only: an M-major A loads whole tiles; b_tail to an
    N-major (row-major) B only."""
    if a_layout == "col":
        knobs = {key: value for key, value in knobs.items() if key != "a_rows"}
    if b_layout == "col":
        knobs = {key: value for key, value in knobs.items() if key != "b_tail"}
    cfg = KernelConfig(
        dtype=dtype,
        out_dtype=out_dtype,
        a_major="K" if a_layout == "row" else "M",
        b_major="N" if b_layout == "row" else "K",
        has_c=has_c,
        **knobs,
    )
    while layout_of(cfg).smem_bytes > SMEM_CAPACITY and cfg.num_stages > 2:
        cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def check_forced(cfg, shape, layout, gen):
    """Run `cfg` on fresh random operands into a NaN-poisoned, guarded output and check it
    against float64; returns (out, b) for a second run into the same buffer."""
    import torch

    m, n, k = shape
    a = random_operand(m, k, cfg.dtype, layout[0], gen)
    b = random_operand(k, n, cfg.dtype, layout[1], gen)
    buf, out = guarded_out(m, n, cfg.out_dtype)
    jitgemm.gemm(a, b, out=out, config=cfg)
    torch.cuda.synchronize()
    assert guard_untouched(buf, m, n), f"{cfg.name} wrote outside the output"
    assert_close(out, a, b, cfg.out_dtype)
    return out, b


@pytest.mark.parametrize("layout", LAYOUTS, ids=["rr", "cc"])
@pytest.mark.parametrize("name, knobs, shape", CASES, ids=[c[0] for c in CASES])
def test_forced_config(name, knobs, shape, layout, gen):
    m, n, k = shape
    if knobs.get("block_n", 0) > 256 and layout[1] == "col":
        pytest.skip("tiles wider than 256 need an N-major (row-major) B")
    for dtype, out_dtype in (("bf16", "bf16"), ("fp16", "fp32")):
        cfg = forced_config(knobs, dtype, out_dtype, *layout)
        if cfg.num_stages < 3:
            continue  # an fp32 tile this wide leaves too few stages: the heuristics never emit it
        out, b = check_forced(cfg, shape, layout, gen)
        # Run again on fresh data into the same buffer: split-K counters must have been reset.
        a2 = random_operand(m, k, dtype, layout[0], gen)
        out.fill_(float("nan"))
        jitgemm.gemm(a2, b, out=out, config=cfg)
        assert_close(out, a2, b, out_dtype)


MIN_UNITS_PER_CTA = 3


def many_tiles_shape(cfg, shape):
    """`shape` grown (keeping its edges: the remainders of M and N, and K) until each CTA of the
    persistent grid runs at least MIN_UNITS_PER_CTA work units. a_rows tiles grow along N only."""
    m, n, k = shape
    num_sms = api.device_spec(0).num_sms
    bm, bn = (cfg.block_n, cfg.block_m) if cfg.swap_ab else (cfg.block_m, cfg.block_n)  # user M, N
    splits = geometry.num_splits(cfg, k)
    while registry.get(cfg.arch).cluster_tiles(cfg, m, n) * splits < MIN_UNITS_PER_CTA * (num_sms // cfg.cluster_size):
        if cfg.a_rows or -(-n // bn) <= -(-m // bm):
            n += bn
        else:
            m += bm
    return m, n, k


@pytest.mark.parametrize("layout", LAYOUTS, ids=["rr", "cc"])
@pytest.mark.parametrize("name, knobs, shape", CASES, ids=[c[0] for c in CASES])
def test_forced_config_many_tiles_per_cta(name, knobs, shape, layout, gen):
    """Each knob again where every CTA walks several tiles: staging buffers, barriers' phases,
    split-K counters and pairs must carry over from one tile to the next."""
    if knobs.get("block_n", 0) > 256 and layout[1] == "col":
        pytest.skip("tiles wider than 256 need an N-major (row-major) B")
    cfg = forced_config(knobs, "bf16", "bf16", *layout)
    check_forced(cfg, many_tiles_shape(cfg, shape), layout, gen)


# swap_ab (kernel coordinates: block_m along the user's N, block_n along the user's M): a 16-bit
# output stored transposed; edges along both kernel dimensions, pairs sharing either operand,
# two atoms per warpgroup, several tiles per CTA, and a decode-like M of 5 on a 16-wide wgmma N.
SWAP_CASES = [
    ("swap_mcastB_odd_pairs", dict(block_n=160, num_stages=5, cluster_size=2, multicast="B"), (1000, 577, 700)),
    ("swap_mcastA", dict(block_n=128, num_stages=5, cluster_size=2, multicast="A"), (600, 650, 300)),
    ("swap_2_atoms", dict(block_m=256, block_n=96, num_stages=4), (300, 1000, 500)),
    ("swap_many_tiles", dict(block_n=80, num_stages=6), (3000, 1100, 200)),
    ("swap_decode_n16", dict(block_m=64, num_consumers=1, block_n=16, num_stages=8), (5, 700, 1000)),
    ("swap_4_atoms_n48", dict(block_m=256, num_consumers=1, block_n=48, num_stages=5), (100, 600, 400)),
]


@pytest.mark.parametrize("layout", LAYOUTS + [("row", "col"), ("col", "row")], ids=["rr", "cc", "rc", "cr"])
@pytest.mark.parametrize("name, knobs, shape", SWAP_CASES, ids=[c[0] for c in SWAP_CASES])
def test_forced_swap_ab(name, knobs, shape, layout, gen):
    for dtype in ("bf16", "fp16"):
        check_forced(forced_config({**knobs, "swap_ab": True}, dtype, dtype, *layout), shape, layout, gen)


@pytest.mark.parametrize("layout", LAYOUTS + [("row", "col"), ("col", "row")], ids=["rr", "cc", "rc", "cr"])
@pytest.mark.parametrize("name, knobs, shape", SWAP_CASES, ids=[c[0] for c in SWAP_CASES])
def test_forced_swap_ab_many_tiles_per_cta(name, knobs, shape, layout, gen):
    cfg = forced_config({**knobs, "swap_ab": True}, "bf16", "bf16", *layout)
    check_forced(cfg, many_tiles_shape(cfg, shape), layout, gen)


@pytest.mark.parametrize("in_place", [False, True], ids=["c", "out_is_c"])
@pytest.mark.parametrize("many_tiles", [False, True], ids=["one_tile", "many_tiles"])
@pytest.mark.parametrize("layout", LAYOUTS + [("row", "col"), ("col", "row")], ids=["rr", "cc", "rc", "cr"])
@pytest.mark.parametrize("name, knobs, shape", SWAP_CASES, ids=[c[0] for c in SWAP_CASES])
def test_forced_swap_ab_with_c(name, knobs, shape, layout, many_tiles, in_place, gen):
    """The swapped epilogue adds C read back transposed from its staged box (odd N: C read and
    D written directly), into a separate output or in place, alone on its CTA or several tiles
    per CTA."""
    dtype = "fp16" if in_place else "bf16"
    cfg = forced_config({**knobs, "swap_ab": True}, dtype, dtype, *layout, has_c=True)
    check_forced_with_c(cfg, many_tiles_shape(cfg, shape) if many_tiles else shape, layout, in_place, gen)


# Tiles 8 past a multiple of 16 (the operand on wgmma's N side K-major): swapped, the last 8
# rows of D stored (C read back) as two 8x8 matrices; unswapped, D staged and stored as one
# unswizzled box of the whole row. Edges along M (1300 = 7 x 168 + 124) and N (1304 = 7 x 168 +
# 128), pairs, split-K, fp32 outputs, a decode-like M on a 40-wide wgmma N.
EIGHT_CASES = [
    ("swap_n168_edges", dict(block_n=168, num_stages=4, swap_ab=True), (1300, 1000, 700)),
    (
        "swap_n216_mcastB",
        dict(block_n=216, num_stages=3, cluster_size=2, multicast="B", swap_ab=True),
        (1700, 577, 500),
    ),
    ("swap_n40_decode", dict(block_m=64, num_consumers=1, block_n=40, num_stages=6, swap_ab=True), (37, 700, 1000)),
    # pairs sharing the 168-row K-major tile: each CTA loads 88 rows (at 0 and 80), 8 in common
    (
        "swap_n168_mcastA",
        dict(block_n=168, num_stages=4, cluster_size=2, multicast="A", swap_ab=True),
        (1300, 1000, 700),
    ),
    ("n168_mcastB", dict(block_n=168, num_stages=4, cluster_size=2, multicast="B"), (1000, 1304, 700)),
    (
        "swap_n216_mcastA",
        dict(block_n=216, num_stages=3, cluster_size=2, multicast="A", swap_ab=True),
        (1700, 900, 500),
    ),
    ("swap_n152_mcastA", dict(block_n=152, num_stages=5, cluster_size=2, multicast="A", swap_ab=True), (600, 700, 900)),
    # (unswapped: N keeps D's rows whole 16-byte units, as the whole-row box needs)
    ("n168_mcastA", dict(block_n=168, num_stages=4, cluster_size=2, multicast="A"), (1000, 1304, 700)),
    ("n72_splitk", dict(block_m=64, num_consumers=1, block_n=72, num_stages=8, split_k=3), (200, 520, 3000)),
]


def eight_layouts(knobs) -> list:
    """The layouts that put a K-major operand on wgmma's N side: A row-major (swapped), B
    column-major (unswapped)."""
    return [("row", "row"), ("row", "col")] if knobs.get("swap_ab") else [("row", "col"), ("col", "col")]


@pytest.mark.parametrize("with_c", [False, True], ids=["plain", "c"])
@pytest.mark.parametrize("many_tiles", [False, True], ids=["one_tile", "many_tiles"])
@pytest.mark.parametrize("second_layout", [False, True], ids=["layout1", "layout2"])
@pytest.mark.parametrize("name, knobs, shape", EIGHT_CASES, ids=[c[0] for c in EIGHT_CASES])
def test_forced_eight_past_16(name, knobs, shape, second_layout, many_tiles, with_c, gen):
    layout = eight_layouts(knobs)[second_layout]
    dtypes = [("bf16", "bf16"), ("fp16", "fp16")] + ([] if knobs.get("swap_ab") else [("bf16", "fp32")])
    for dtype, odt in dtypes:
        cfg = forced_config(knobs, dtype, odt, *layout, has_c=with_c)
        run_shape = many_tiles_shape(cfg, shape) if many_tiles else shape
        if with_c:
            check_forced_with_c(cfg, run_shape, layout, dtype == "fp16", gen)
        else:
            check_forced(cfg, run_shape, layout, gen)


def knobs_of(name):
    return next(knobs for case, knobs, _ in CASES if case == name)


C_KNOBS = [
    knobs_of(name)
    for name in (
        "cluster1_2consumers_n256",
        "mcastA_odd_pairs",
        "splitk3_uneven_k",
        "b_tail_n144_mcastA",
        "mcastB_1consumer",
        "wide_n384_mcastB",
    )
]


@pytest.mark.parametrize("in_place", [False, True], ids=["c", "out_is_c"])
@pytest.mark.parametrize("many_tiles", [False, True], ids=["one_tile", "many_tiles"])
@pytest.mark.parametrize("knobs", C_KNOBS, ids=["plain", "mcastA", "splitk", "b_tail", "mcastB", "wide_ring"])
@pytest.mark.parametrize("odt", ["fp32", "bf16"])
def test_forced_config_with_c(knobs, odt, many_tiles, in_place, gen):
    cfg = forced_config(knobs, "bf16", odt, "row", "row", has_c=True)
    if cfg.num_stages < 3:
        pytest.skip("an fp32 tile this wide leaves too few stages: the heuristics never emit it")
    shape = (515, 5 * 128 - 3 + 3, 700)
    check_forced_with_c(cfg, many_tiles_shape(cfg, shape) if many_tiles else shape, ("row", "row"), in_place, gen)


def check_forced_with_c(cfg, shape, layout, in_place, gen):
    """`check_forced` with a row-major C (alpha 0.5, beta -2): a separate array, or (`in_place`)
    the output itself holding C."""
    import torch

    m, n, k = shape
    a = random_operand(m, k, cfg.dtype, layout[0], gen)
    b = random_operand(k, n, cfg.dtype, layout[1], gen)
    c = random_operand(m, n, cfg.out_dtype, "row", gen)
    buf, out = guarded_out(m, n, cfg.out_dtype)
    if in_place:
        out.copy_(c)
        c, before = out, c
    jitgemm.gemm(a, b, out=out, c=c, alpha=0.5, beta=-2.0, config=cfg)
    torch.cuda.synchronize()
    assert guard_untouched(buf, m, n), f"{cfg.name} wrote outside the output"
    assert_close(out, a, b, cfg.out_dtype, c=before if in_place else c, alpha=0.5, beta=-2.0)


def test_split_k_inside_a_captured_graph(gen):
    """Under capture the split-K workspace is allocated by the graph itself, so a graph captured
    on torch's private stream works after a warm-up on another stream, and replays stay right."""
    import torch

    m, n, k = 16, 1000, 4096
    cfg = forced_config(knobs_of("splitk4"), "bf16", "bf16", "row", "row")
    a = random_operand(m, k, "bf16", "row", gen)
    b = random_operand(k, n, "bf16", "row", gen)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    jitgemm.gemm(a, b, out=out, config=cfg)  # loads the kernel (on the current stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        jitgemm.gemm(a, b, out=out, config=cfg)
    for _ in range(3):
        a.copy_(random_operand(m, k, "bf16", "row", gen))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, a, b, "bf16")


def all_forced_configs() -> list[KernelConfig]:
    """Every config the forced-config tests here and in test_gpu_splitk run (for .ci/gpu-offline,
    which precompiles them, and .ci/gate.py, which records their keys)."""
    from test_gpu_splitk import SPLIT_CONFIGS

    layouts = LAYOUTS + [("row", "col"), ("col", "row")]
    configs = set(SPLIT_CONFIGS)
    for (_, knobs, _), lay, (dt, odt), c in itertools.product(
        CASES, layouts, (("bf16", "bf16"), ("fp16", "fp32"), ("bf16", "fp32")), (False, True)
    ):
        if knobs.get("block_n", 0) > 256 and lay[1] == "col":
            continue  # as the tests: wider than 256 needs a row-major B
        cfg = forced_config(knobs, dt, odt, *lay, has_c=c)
        if cfg.num_stages >= 3:  # fewer stages the tests never run
            configs.add(cfg)
    for (_, knobs, _), lay, dt in itertools.product(SWAP_CASES, layouts, ("bf16", "fp16")):
        configs.add(forced_config({**knobs, "swap_ab": True}, dt, dt, *lay))
    for (_, knobs, _), c in itertools.product(EIGHT_CASES, (False, True)):
        for lay in eight_layouts(knobs):
            for dt, odt in [("bf16", "bf16"), ("fp16", "fp16")] + ([] if knobs.get("swap_ab") else [("bf16", "fp32")]):
                configs.add(forced_config(knobs, dt, odt, *lay, has_c=c))
    return sorted(configs, key=lambda cfg: cfg.to_json())
