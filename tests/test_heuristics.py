"""CPU tests of the heuristics layer (issue 3): selection tables, properties of every selected
config, explain, the expert override (check_config, JITGEMM_CONFIG) and the shared helpers."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from jitgemm.config import KernelConfig
from jitgemm.layout import layout_of, structural_problems
from jitgemm.problem import LAYOUTS, Problem
from jitgemm import heuristics
from jitgemm.heuristics import DeviceSpec, check_config, config_from_env, explain, select
from jitgemm.heuristics import common, sm90

H200 = DeviceSpec("sm_90a", 132)
CAPACITY = 232448

# ----------------------------------------------------------------------------- the table
# bf16 inputs and output, A K-major and B N-major (layout "nt", B MN-major: loaded in pieces of
# the layout's swizzle width, 64 columns for tiles >= 64 wide (so block_n 176 reads 192), 32 or
# 16 for narrower tiles), 132 SMs. The model reads B in DRAM runs of the tile's width (64-byte
# runs stream at 67% of the copy bandwidth, 128-byte at 80%, 256-byte at 89%, 384-byte at 92%),
# and the split-K fix-up of the template costs 2 L2 round trips (store fence, the tile's atomic)
# plus, for the last split, one dependent round of loads per split (the read-back loop runs over
# the splits outermost: see sm90.readback_rounds), ~600 clocks each, whatever the tile's width.
# Times are the model's (explain's model_us); "x% ahead" means the candidate named models x%
# slower.
# Each row: (M, N, K), expected (block_m, block_n, cluster_size, multicast, split_k), why.
DEEPSEEK = [(2112, 7168), (24576, 1536)]       # q/kv down-projection, q up-projection
LLAMA = [(4096, 4096), (14336, 4096)]          # Llama-3-8B attention projection, MLP up
TABLE = [
    # --- DeepSeek (2112, 7168)
    ((1, 2112, 7168), (64, 80, 1, "none", 4),
     "decode, DRAM bound: 27 column blocks of 80 (two 64-wide pieces: 256-byte runs, 89% of "
     "DRAM) x 4 K splits = 108 units of 28 K blocks, a 6-round-trip fix-up: 11.29 us, 0.4% "
     "ahead of m64n96 split 6 (132 units, 8 round trips), 30% ahead of the best unsplit tile "
     "(m64n16, 32-byte runs: 14.66 us)"),
    ((16, 2112, 7168), (64, 80, 1, "none", 4), "as M=1: 11.56 us, 0.2% ahead of m64n64 split 4"),
    ((64, 2112, 7168), (64, 64, 1, "none", 4),
     "33 column blocks of 64 x 4 splits = 132 units, 128-byte runs: 12.34 us; 80-wide tiles "
     "re-read the 64 rows of A less often but turn L2 bound (m64n80 split 4: 12.48); unsplit, "
     "m64n32 streams from half the SMs (16.37)"),
    ((128, 2112, 7168), (64, 192, 1, "none", 4),
     "2 m blocks of 64 x 11 column blocks of 192 (384-byte runs) x 4 splits = 88 units: "
     "14.84 us, 0.5% ahead of m64n128 split 2, 12% ahead of the best unsplit tile (m64n64, "
     "66 tiles, shared-memory bound: 16.65)"),
    ((4096, 2112, 7168), (128, 176, 2, "A", 1),
     "2112 = 12 x 176 exactly: 384 tiles = 192 pairs, 3 waves of 66 clusters with a 91% last "
     "wave; pairs on neighbouring n blocks share A; L2 bound, 181 us, 5% ahead of m256n96 "
     "pairs; 3 waves of units: split-K is not considered (at most 2)"),
    ((8192, 2112, 7168), (128, 176, 2, "A", 1), "as M=4096, twice the rows: 6 waves"),
    # --- DeepSeek (24576, 1536)
    ((1, 24576, 1536), (64, 192, 1, "none", 1),
     "decode of a wide N: 128 column blocks of 192, one wave, 384-byte runs, DRAM bound: "
     "20.09 us; K is only 24 blocks and splitting it only adds units past one wave: the best "
     "split (m64n192 pairs sharing A, split 2) models 23.27"),
    ((16, 24576, 1536), (64, 192, 1, "none", 1), "as M=1"),
    ((64, 24576, 1536), (64, 192, 1, "none", 1), "as M=1, at the DRAM floor"),
    ((128, 24576, 1536), (128, 208, 1, "none", 1),
     "one m block of 128 (two warpgroups): 119 tiles of 208, a single wave, at the DRAM floor "
     "(20.71 us); the best split (m128n192 pairs, split 2) models 29.9"),
    ((4096, 24576, 1536), (128, 240, 2, "B", 1),
     "tensor-core bound: 103 column blocks of 240 x 32 m blocks = 25 waves with a 97% last wave "
     "(256 would give 24 waves with a 27% last one); pairs of m blocks share B"),
    ((8192, 24576, 1536), (128, 240, 2, "B", 1), "as M=4096: 50 waves, 94% last wave"),
    # --- Llama (4096, 4096)
    ((1, 4096, 4096), (64, 96, 1, "none", 3),
     "decode: 43 column blocks of 96 (256-byte runs) x 3 splits = 129 units of 22 K blocks, "
     "a 5-round-trip fix-up: 11.39 us, 1% ahead of m64n128 split 4, 9% ahead of the best "
     "unsplit tile (m64n32, 64-byte runs: 12.40)"),
    ((16, 4096, 4096), (64, 96, 1, "none", 3), "as M=1: 11.62 us against 12.44 unsplit"),
    ((64, 4096, 4096), (64, 96, 1, "none", 3),
     "as M=1: 12.40 us, 0.5% ahead of m64n64 split 2; A is re-read 43 times, not 128 "
     "(m64n32 unsplit: 13.03)"),
    ((128, 4096, 4096), (64, 128, 1, "none", 1),
     "2 x 32 = 64 tiles of 64x128, shared-memory bound, 256-byte runs: 14.35 us, 1% ahead of "
     "m64n192 split 2 (14.48)"),
    ((4096, 4096, 4096), (128, 256, 2, "B", 1),
     "the classic: 512 tiles of 128x256, 4 waves (88% last); tensor-core bound; among the "
     "equal-time candidates sharing B over a 256x256 pair moves the least L2 traffic"),
    ((8192, 4096, 4096), (128, 256, 2, "B", 1),
     "tensor-core bound: 8 waves of 128x256 pairs; the same time as 256x128 sharing A, with "
     "less L2 traffic"),
    # --- Llama (14336, 4096)
    ((1, 14336, 4096), (64, 224, 1, "none", 2),
     "decode: 64 column blocks of 224 (256-wide pieces: 512-byte runs, 94%) x 2 splits = 128 "
     "units: 31.92 us, 0.9% ahead of the unsplit m64n112 (128 blocks, 256-byte runs: 32.20)"),
    ((16, 14336, 4096), (64, 112, 1, "none", 1),
     "as M=1, but 16 rows of partials make the split's fix-up 29% dearer (3216 vs 2502 "
     "clocks): the unsplit 128 blocks of 112 win, 32.24 us against 32.37 for m64n224 split 2"),
    ((64, 14336, 4096), (64, 112, 1, "none", 1), "as M=16: m64n224 split 2 models 33.88 us against 32.35"),
    ((128, 14336, 4096), (128, 112, 1, "none", 1),
     "one m block of 128: 128 tiles of 128x112, single wave, L2 and DRAM bound (34.43 us); "
     "m128n224 split 2 models 36.03"),
    ((4096, 14336, 4096), (128, 208, 2, "B", 1),
     "tensor-core bound: 69 column blocks of 208 x 16 m-block pairs = 17 waves with a 73% last "
     "wave, 1% ahead of 14 waves of 128x256 with a 58% last one"),
    ((8192, 14336, 4096), (128, 208, 2, "B", 1), "as M=4096: 34 waves"),
]

# The rest of the public benchmark set (examples/public_shapes.txt): with TABLE, every shape of
# it is pinned here.
PUBLIC = [
    ((128, 576, 7168), (64, 64, 1, "none", 4),
     "2 m blocks of 64 x 9 column blocks of 64 x 4 splits = 72 units of 28 K blocks, L2 bound: "
     "7.25 us, 2% ahead of m64n48 split 3; the former m64n16 (measured 0.51x cuBLAS), which "
     "re-reads A 36 times, models 10.72 as the best unsplit tile"),
    ((128, 4096, 7168), (128, 128, 1, "none", 4),
     "32 tiles of 128x128 x 4 splits = 128 units of 28 K blocks, DRAM bound: 21.86 us, 1% "
     "ahead of m128n112 split 3, 14% ahead of the best unsplit tile (m64n128, 64 tiles, "
     "shared-memory bound: 24.88)"),
    ((128, 7168, 16384), (128, 224, 1, "none", 4),
     "256 K blocks: 32 tiles of 128x224 x 4 splits = 128 units of 64 K blocks each, 512-byte "
     "runs, DRAM bound: 69.19 us against 69.75 for m128n176 split 3 and 82.88 for the best "
     "unsplit tile (m64n192, 76 tiles); A is read 32 times, not 112 (m64n128, measured 0.80x)"),
    ((128, 7168, 2048), (64, 192, 1, "none", 1),
     "2 m blocks of 64 x 38 column blocks of 192 (384-byte runs) = 76 tiles, DRAM bound: "
     "10.66 us against 11.13 for m128n96; only 32 K blocks: the best split (m128n112 split 2) "
     "models 12.11"),
    ((128, 32768, 512), (128, 256, 1, "none", 1),
     "one m block: 128 tiles of 128x256, one wave at the DRAM floor (10.52 us); 8 K blocks "
     "leave nothing to split (m128n256 pairs, split 2: 20.96)"),
    ((4096, 576, 7168), (128, 160, 2, "A", 2),
     "576 = 4 column blocks of 160 (the last 96 wide) in pairs sharing A: 32 x 2 pairs x 2 "
     "splits = 128 units, 2 waves of 66 clusters (94% last), L2 bound with 426 MB through L2: "
     "62.98 us, only 0.6% ahead of the unsplit m128n192 (96 tiles, 440 MB, tensor-core bound: "
     "63.36) and 6% ahead of m128n176 (66.61; measured 83.5 us)"),
    ((4096, 32768, 512), (128, 224, 2, "B", 1),
     "tensor-core bound: 147 column blocks of 224 x 16 m-block pairs = 36 waves (64% last); "
     "ties m256n112 sharing A, with less L2 traffic"),
    ((4096, 4096, 7168), (128, 256, 2, "B", 1), "as 4096^3: 4 waves of 128x256 pairs, tensor-core bound"),
    ((4096, 7168, 2048), (128, 256, 2, "B", 1),
     "tensor-core bound: 28 column blocks of 256 x 16 m-block pairs = 7 waves (79% last); "
     "0.1% ahead of 8 waves of 128x224"),
    ((4096, 7168, 16384), (128, 256, 2, "B", 1), "as 4096x7168x2048, 8x the K: 7 waves, no split"),
    ((8192, 8192, 8192), (128, 224, 2, "B", 1),
     "tensor-core bound: 37 column blocks of 224 x 32 m-block pairs = 18 waves (94% last), 1.6% "
     "ahead of 16 waves of 128x256 with a 52% last one; ties m256n112 sharing A, with less L2 "
     "traffic"),
    ((1, 4096, 7168), (64, 96, 1, "none", 3),
     "43 column blocks of 96 (256-byte runs) x 3 splits = 129 units of 38 K blocks: 18.21 us, "
     "0.8% ahead of m64n128 split 4, 18% ahead of the best unsplit tile (m64n32, 64-byte runs: "
     "21.52)"),
    ((16, 4096, 7168), (64, 96, 1, "none", 3), "as M=1: 18.47 us against 21.59 unsplit"),
    ((64, 4096, 7168), (64, 96, 1, "none", 3),
     "as M=1: 19.34 us; A is re-read 43 times instead of 128 (m64n32 unsplit: 22.62)"),
    ((1, 7168, 2048), (64, 112, 1, "none", 2),
     "64 column blocks of 112 (256-byte runs) x 2 splits of 16 K blocks = 128 units: 9.67 us, "
     "only 0.4% ahead of the unsplit m64n64 (112 blocks, 128-byte runs: 9.71)"),
    ((16, 7168, 2048), (64, 64, 1, "none", 1),
     "112 column blocks of 64 (128-byte runs), one wave: 9.73 us; 16 rows of partials make "
     "m64n112 split 2 dearer than at M=1 (9.89)"),
    ((64, 7168, 2048), (64, 64, 1, "none", 1), "as M=16: 9.80 us against 10.65 for m64n112 split 2"),
]


def _select_nt(shape):
    m, n, k = shape
    return select(Problem(m, n, k, "bf16", "bf16", "K", "N"), H200)


def _got(cfg):
    return (cfg.block_m, cfg.block_n, cfg.cluster_size, cfg.multicast, cfg.split_k)


@pytest.mark.parametrize("shape, expected, why", TABLE + PUBLIC,
                         ids=[f"{m}x{n}x{k}" for (m, n, k), _, _ in TABLE + PUBLIC])
def test_selection_table(shape, expected, why):
    cfg = _select_nt(shape)
    assert _got(cfg) == expected, f"{shape}: expected {expected} because {why}; got {cfg.name}"


def test_table_covers_the_issue_grid_and_the_public_set():
    ms = {1, 16, 64, 128, 4096, 8192}
    got = {(m, n, k) for (m, n, k), _, _ in TABLE}
    assert got == {(m, n, k) for m in ms for n, k in DEEPSEEK + LLAMA}
    public = {tuple(map(int, line.split())) for line in
              (Path(__file__).parent.parent / "examples" / "public_shapes.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    pinned = [shape for shape, _, _ in TABLE + PUBLIC]
    assert len(pinned) == len(set(pinned))
    assert {shape for shape, _, _ in PUBLIC} <= public <= set(pinned)


# ----------------------------------------------------------------------------- properties


def _problems():
    ms = [1, 7, 16, 64, 100, 128, 129, 1000, 4096, 8192]
    nks = [(2112, 7168), (24576, 1536), (4096, 4096), (14336, 4096), (576, 7168), (7168, 2048),
           (1000, 1000), (129, 77), (32768, 512), (16, 16)]
    combos = [(d, o, lay, c) for d in ("bf16", "fp16") for o in ("same", "fp32")
              for lay in sorted(LAYOUTS) for c in (False, True)]
    out = []
    for i, (m, (n, k)) in enumerate((m, nk) for m in ms for nk in nks):
        d, o, lay, c = combos[(i * 5) % len(combos)]
        a_major, b_major = LAYOUTS[lay]
        out.append(Problem(m, n, k, d, d if o == "same" else "fp32", a_major, b_major, c))
    return out


PROBLEMS = _problems()
DEVICES = [H200, DeviceSpec("sm_90a", 114), DeviceSpec("sm_90a", 133), DeviceSpec("sm_90a", 78)]


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: f"{d.num_sms}sms")
def test_every_selected_config_is_sound(device):
    for p in PROBLEMS:
        cfg = select(p, device)
        lay = layout_of(cfg)
        where = f"{p.describe()} -> {cfg.name}"
        # the problem's own fields, the device's arch
        assert (cfg.arch, cfg.dtype, cfg.out_dtype, cfg.a_major, cfg.b_major, cfg.has_c) == \
            (device.arch, p.dtype, p.out_dtype, p.a_major, p.b_major, p.has_c), where
        assert cfg.block_k * 2 == 128, where
        # fits shared memory; at least 3 stages, 4 for tiles under 128x192
        assert lay.smem_bytes <= device.smem_capacity == CAPACITY, where
        assert cfg.num_stages >= 3, where
        if cfg.block_m * cfg.block_n < 128 * 192:
            assert cfg.num_stages >= 4, where
        # and no deeper than the cap, nor shallower than what fits
        assert cfg.num_stages == common.MAX_STAGES or layout_of(
            KernelConfig(**{**cfg.to_dict(), "num_stages": cfg.num_stages + 1})).smem_bytes > CAPACITY, where
        # cluster divides the SM count; no multicast on a single wave of work units
        assert device.num_sms % cfg.cluster_size == 0, where
        tiles = -(-p.m // cfg.block_m) * -(-p.n // cfg.block_n)
        splits = sm90.splits_used(cfg, p.k)
        if tiles * splits <= device.num_sms:
            assert cfg.cluster_size == 1, where
        # split-K: one of the candidate counts, >= 4 K blocks a split, <= 2 waves of units
        assert cfg.split_k in sm90.SPLITS and splits == cfg.split_k, where
        if cfg.split_k > 1:
            assert -(-p.k // cfg.block_k) >= sm90.MIN_KB_PER_SPLIT * cfg.split_k, where
            units = sm90.cluster_tiles_of(p, cfg.block_m, cfg.block_n, cfg.multicast) * cfg.split_k
            assert units <= sm90.MAX_SPLIT_WAVES * (device.num_sms // cfg.cluster_size), where
        # register budget: 64K per SM after setmaxnreg, accumulators that do not spill
        assert sm90.register_budget(cfg.num_consumers) <= 65536, where
        assert lay.acc_regs <= sm90.ACC_REG_LIMIT, where
        # consumer rule and DeepGEMM's block_m 256 rule
        assert cfg.num_consumers == (1 if cfg.block_m <= 64 else 2), where
        if cfg.block_m == 256:
            assert p.out_dtype != "fp32", where
        assert cfg.block_m in (64, 128, 256) and cfg.block_n % 16 == 0, where
        assert cfg.group_size in (8, 16) and cfg.raster in ("m", "n"), where
        assert not structural_problems(cfg), where
        assert check_config(cfg, p, device) == [], where


def test_odd_sm_count_never_clusters():
    dev = DeviceSpec("sm_90a", 133)
    for p in PROBLEMS:
        assert select(p, dev).cluster_size == 1
    rules = {r["rule"] for r in explain(Problem(8192, 8192, 8192), dev)["rejected"]}
    assert any("SM count 133 is odd" in r for r in rules)


def test_large_problems_use_multicast_and_big_tiles():
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 24576, 1536)]:
        cfg = select(Problem(m, n, k), H200)
        assert cfg.cluster_size == 2 and cfg.multicast in ("A", "B")
        assert cfg.block_m * cfg.block_n >= 128 * 176


@pytest.mark.parametrize("b_major", ["N", "K"])
def test_decode_spreads_the_work_over_the_sms(b_major):
    # With one m block the work units come from N and from split-K: together they must give
    # most SMs a stream of B (a memory-bound decode GEMM gets the copy bandwidth only from
    # many SMs).
    for n, k in DEEPSEEK + LLAMA + [(7168, 2048), (576, 7168), (4096, 7168)]:
        for m in (1, 16):
            cfg = select(Problem(m, n, k, b_major=b_major), H200)
            units = -(-n // cfg.block_n) * sm90.splits_used(cfg, k)
            assert cfg.block_m * -(-m // cfg.block_m) <= 128
            assert units >= min(H200.num_sms, n // 16) * 0.6, (m, n, k, cfg.name)


def test_selection_is_deterministic_and_cached():
    p = Problem(4096, 2112, 7168)
    first = select(p, H200)
    sm90.select.cache_clear()
    assert select(p, H200) == first
    assert explain(p, H200)["chosen"] == first.to_dict()


def test_selection_does_not_depend_on_hash_seed():
    code = ("from jitgemm.problem import Problem\n"
            "from jitgemm.heuristics import select, DeviceSpec\n"
            "for s in [(1,7168,2048),(4096,4096,4096),(8192,2112,7168),(1000,1000,1000),(333,129,77)]:\n"
            "    print(select(Problem(*s), DeviceSpec()).name)\n")
    outs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             cwd=Path(__file__).parent, check=True)
        outs.add(res.stdout)
    assert len(outs) == 1


def test_select_rejects_unknown_arch():
    with pytest.raises(ValueError, match="no heuristics for arch 'sm_80'"):
        select(Problem(128, 128, 128), DeviceSpec("sm_80", 108))


# ----------------------------------------------------------------------------- cost model


def test_large_problems_do_not_split():
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 2112, 7168), (4096, 7168, 16384),
                    (4096, 24576, 1536), (8192, 4096, 4096)]:
        for layout in ("nt", "nn"):
            a_major, b_major = LAYOUTS[layout]
            assert select(Problem(m, n, k, a_major=a_major, b_major=b_major), H200).split_k == 1


def test_cost_model_knows_mn_major_b_padding():
    # Block_n 176 loads three 64-column pieces (192 columns) when B is N-major, 176 when K-major.
    p_n = Problem(4096, 2112, 7168, b_major="N")
    p_k = Problem(4096, 2112, 7168, b_major="K")
    base = dict(block_m=128, block_n=176, num_stages=4, num_consumers=2)
    c_n = sm90.cost_of(p_n, H200, KernelConfig(b_major="N", **base))
    c_k = sm90.cost_of(p_k, H200, KernelConfig(b_major="K", **base))
    assert c_n.terms["l2_bytes"] > c_k.terms["l2_bytes"]
    assert layout_of(KernelConfig(b_major="N", **base)).smem_bytes > layout_of(KernelConfig(b_major="K", **base)).smem_bytes
    # A multiple of 64 costs the same either way.
    base["block_n"] = 128
    c_n = sm90.cost_of(p_n, H200, KernelConfig(b_major="N", **base))
    c_k = sm90.cost_of(p_k, H200, KernelConfig(b_major="K", **base))
    assert c_n.terms["l2_bytes"] == c_k.terms["l2_bytes"]


def test_cost_model_reads_b_padding_from_the_layout():
    # Narrow N-major tiles load pieces as wide as the layout's swizzle, not 64 columns.
    p = Problem(1, 4096, 4096)
    for block_n in (16, 32, 48, 64, 80, 176):
        cfg = KernelConfig(block_m=64, block_n=block_n, num_consumers=1, num_stages=4)
        b = layout_of(cfg).b
        assert sm90.b_box_of(cfg) == b.num_pieces * b.piece_extent
        assert sm90.cost_of(p, H200, cfg).terms["l2_bytes"] == (
            sm90.traffic(p, 64, block_n, sm90.b_box_of(cfg), "none").l2_reads * 4096 * 2)
    assert sm90.b_box_of(KernelConfig(block_n=176)) == 192
    assert sm90.b_box_of(KernelConfig(block_n=176, b_major="K")) == 176


def test_dram_rate_credits_more_streaming_ctas():
    r = H200.rates
    per_cta = [1 / common.dram_clk_per_byte(r, 132, a) for a in (1, 16, 64, 112, 128, 132)]
    chip = [a / common.dram_clk_per_byte(r, 132, a) for a in (1, 16, 64, 112, 128, 132)]
    assert per_cta == sorted(per_cta, reverse=True)          # each CTA gets less ...
    assert chip == sorted(chip)                              # ... but the chip gets more
    assert per_cta[0] <= r.cta_dram_bytes_per_clk            # a CTA alone: at most ~70 GB/s
    assert chip[-1] == pytest.approx(r.hbm_bytes_per_clk)    # all SMs: the copy bandwidth
    # Wider contiguous runs stream better; 128-byte runs at 80%.
    assert common.dram_run_efficiency(r, 128) == pytest.approx(0.8)
    assert common.dram_run_efficiency(r, 64) < common.dram_run_efficiency(r, 512) < 1


def test_split_k_cost_terms():
    p = Problem(128, 7168, 16384)
    base = KernelConfig(block_m=128, block_n=224, num_stages=3)
    one = sm90.cost_of(p, H200, base)
    four = sm90.cost_of(p, H200, KernelConfig(**{**base.to_dict(), "split_k": 4}))
    assert (one.terms["split_k"], one.terms["units"], one.terms["kb_per_unit"]) == (1, 32, 256)
    assert (four.terms["split_k"], four.terms["units"], four.terms["kb_per_unit"]) == (4, 128, 64)
    assert one.terms["workspace_bytes"] == one.terms["splitk_cycles"] == 0
    # the workspace: 4 splits x 128 rows x 32 tiles x 224 columns of fp32
    assert four.terms["workspace_bytes"] == 4 * 128 * 32 * 224 * 4
    # the fix-up: store fence + atomic, then one round of loads per split
    assert four.terms["splitk_round_trips"] == 2 + 4
    assert four.terms["splitk_cycles"] >= 6 * sm90.L2_ROUND_TRIP_CLK
    assert four.cost < one.cost                             # 4x the streaming SMs pay for it
    # a launch never uses more splits than K blocks (jitgemm.launch.num_splits)
    short = Problem(128, 7168, 200)                          # 4 K blocks
    cfg = KernelConfig(**{**base.to_dict(), "split_k": 8})
    assert sm90.splits_used(cfg, short.k) == 4 == sm90.cost_of(short, H200, cfg).terms["split_k"]


def test_splits_used_matches_the_launch():
    launch = pytest.importorskip("jitgemm.launch")
    for split_k in (1, 2, 3, 8, 32):
        for k in (1, 63, 64, 65, 200, 7168):
            cfg = KernelConfig(split_k=split_k)
            assert sm90.splits_used(cfg, k) == launch.num_splits(cfg, k)
            assert sm90.cluster_tiles_of(Problem(1000, 3000, k), 128, 128, "A") == \
                launch.cluster_tiles(KernelConfig(cluster_size=2, multicast="A"), 1000, 3000)


def test_partial_rows_and_readback_mirror_the_template():
    from importlib import resources
    src = resources.files("jitgemm.templates").joinpath("sm90_gemm.cu.j2").read_text()
    fixup = src[src.index("split-K fix-up"):src.index("---- epilogue")]
    # rows: a thread stores rows r and r + 8 (one float4) when row r is live
    assert "warp * 16 + lane / 4 < rows_left" in fixup
    assert sm90.partial_rows(1, 64, 1) == 2                 # M = 1 stores rows 0 and 8
    assert sm90.partial_rows(16, 64, 1) == 16
    assert sm90.partial_rows(20, 64, 1) == 16 + 8
    assert sm90.partial_rows(64, 128, 2) == 64               # the second warpgroup stores nothing
    assert sm90.partial_rows(4096, 128, 2) == 4096
    # the read-back the model assumes, one round trip per split: in the template the loop over
    # the splits encloses the (unrolled) loop over the float4 columns and the loads
    load = fixup.index("ld.global.cg")
    s_loop, j_loop = fixup.rindex("for (int s", 0, load), fixup.rindex("for (int j", 0, load)
    assert s_loop < j_loop < load, "the split-K read-back no longer loops over the splits outermost"
    depth, end = 0, None
    for pos in range(fixup.index("{", s_loop), len(fixup)):
        depth += {"{": 1, "}": -1}.get(fixup[pos], 0)
        if depth == 0:
            end = pos
            break
    assert end is not None and load < end, "the read-back loads are outside the loop over the splits"
    assert [sm90.readback_rounds(s) for s in (1, 2, 3, 4, 8, 32)] == [0, 2, 3, 4, 8, 32]
    # one split's loads are all in flight: the round trips do not grow with the tile
    p = Problem(128, 7168, 16384)
    for block_m, block_n in [(64, 64), (128, 224), (256, 128)]:
        cfg = KernelConfig(block_m=block_m, block_n=block_n, num_consumers=1 if block_m == 64 else 2,
                           num_stages=3, split_k=4)
        assert sm90.cost_of(p, H200, cfg).terms["splitk_round_trips"] == sm90.SPLITK_SYNC_ROUND_TRIPS + 4


def test_multicast_halves_the_shared_operand_traffic():
    p = Problem(4096, 4096, 4096)
    plain = sm90.traffic(p, 128, 256, 256, "none")
    share_a = sm90.traffic(p, 128, 256, 256, "A")
    share_b = sm90.traffic(p, 128, 256, 256, "B")
    a_rows = 16 * 4096      # 16 column blocks each read all 4096 rows of A
    b_cols = 32 * 4096      # 32 row blocks each read all 4096 columns of B
    assert plain.l2_reads == a_rows + b_cols
    assert share_a.l2_reads == a_rows // 2 + b_cols
    assert share_b.l2_reads == a_rows + b_cols // 2
    assert share_a.ingress == plain.ingress == share_b.ingress


def test_odd_pairs_pay_for_the_recomputed_peer():
    # 3 column blocks with multicast A: the second pair's peer recomputes the last block.
    t = sm90.traffic(Problem(512, 384, 64), 128, 128, 128, "A")
    assert t.cluster_tiles == 4 * 2 and t.cta_tiles == 16


def test_wave_quantisation_in_the_cost():
    # Same tile, 132 vs 133 tiles: the 133rd tile costs a whole second wave.
    p132 = Problem(128 * 12, 128 * 11, 16384)
    p133 = Problem(128 * 7, 128 * 19, 16384)
    cfg = KernelConfig(block_m=128, block_n=128, num_stages=4)
    c132, c133 = sm90.cost_of(p132, H200, cfg), sm90.cost_of(p133, H200, cfg)
    assert (c132.terms["waves"], c133.terms["waves"]) == (1, 2)
    assert c133.terms["last_wave_util"] == pytest.approx(1 / 132, abs=1e-3)
    assert c133.terms["bound"] != "hbm"
    assert c133.cost > 1.5 * c132.cost


# ----------------------------------------------------------------------------- explain


def test_explain_is_json_and_complete():
    p = Problem(4096, 2112, 7168)
    e = explain(p, H200, top=4)
    json.loads(json.dumps(e))
    assert set(e) >= {"problem", "device", "chosen", "candidates", "rejected"}
    assert e["problem"]["m"] == 4096 and e["device"] == {"arch": "sm_90a", "num_sms": 132, "smem_capacity": CAPACITY}
    assert e["chosen"] == select(p, H200).to_dict()
    cands = e["candidates"]
    assert len(cands) == 4
    assert cands[0]["config"] == e["chosen"] and cands[0]["name"] == select(p, H200).name
    costs = [c["cost"] for c in cands]
    assert costs == sorted(costs)
    for c in cands:
        assert {"config", "name", "cost", "waves", "last_wave_util", "l2_bytes", "smem_bytes", "split_k",
                "units", "kb_per_unit", "splitk_cycles", "workspace_bytes", "model_us"} <= set(c)
        assert c["split_k"] == c["config"]["split_k"]
        KernelConfig.from_dict(c["config"])
    for r in e["rejected"]:
        assert set(r) == {"config", "rule"} and r["rule"]


def test_explain_shows_split_k():
    p = Problem(128, 7168, 16384)
    e = explain(p, H200, top=10)
    assert e["chosen"]["split_k"] == select(p, H200).split_k == 4
    assert e["candidates"][0]["split_k"] == 4 and e["candidates"][0]["units"] == 128
    assert {c["split_k"] for c in e["candidates"]} > {4}      # other split counts were costed
    assert "split-K" in e["cost_model"]


def test_explain_names_the_rules():
    e = explain(Problem(64, 4096, 512, out_dtype="fp32"), H200, top=3)
    rules = " | ".join(r["rule"] for r in e["rejected"])
    assert "block_m 256 only with a 16-bit output" in rules
    assert "single wave" in rules and "splits <=" in rules   # 8 K blocks: at most 2 splits
    e = explain(Problem(8192, 8192, 8192), H200)
    rules = " | ".join(r["rule"] for r in e["rejected"])
    assert "register budget" in rules
    assert "pipeline stages" in rules
    assert "even number of 64-wide pieces" in rules     # B is N-major: multicast B needs whole pairs


# ----------------------------------------------------------------------------- check_config


def _cfg(**kw):
    return KernelConfig(**{**select(Problem(4096, 4096, 4096), H200).to_dict(), **kw})


def test_check_config_accepts_the_selection_and_names_mismatches():
    p = Problem(4096, 4096, 4096)
    assert check_config(_cfg(), p, H200) == []
    reasons = check_config(_cfg(dtype="fp16", b_major="K", has_c=True), p, H200)
    text = " | ".join(reasons)
    assert "dtype is 'fp16' but the problem has 'bf16'" in text
    assert "b_major is 'K' but the problem has 'N'" in text
    assert "has_c is True but the problem has False" in text
    assert check_config(_cfg(arch="sm_100a"), p, H200)[0] == "arch is 'sm_100a' but the device is 'sm_90a'"


def test_check_config_smem_registers_structure():
    p = Problem(4096, 4096, 4096)
    too_deep = check_config(_cfg(num_stages=8), p, H200)
    assert any("shared memory" in r and "232448" in r for r in too_deep)
    spills = check_config(_cfg(block_m=128, block_n=256, num_consumers=1, cluster_size=1,
                               multicast="none", num_stages=3), p, H200)
    assert any("256 fp32 accumulator registers" in r for r in spills)
    structure = check_config(_cfg(block_m=64, num_consumers=2, block_n=128), p, H200)
    assert any("multiple of 64 rows" in r for r in structure)
    assert any("swap_ab" in r for r in check_config(_cfg(swap_ab=True), p, H200))
    assert check_config("not a config", p, H200)


def test_check_config_accepts_split_k():
    for shape in [(128, 7168, 16384), (4096, 4096, 4096), (1, 4096, 7168), (1000, 1000, 64)]:
        p = Problem(*shape)
        cfg = select(p, H200)
        for split_k in (1, 2, 3, 8, 32):
            forced = KernelConfig(**{**cfg.to_dict(), "split_k": split_k})
            assert check_config(forced, p, H200) == [], (shape, split_k)


def test_require_valid_raises_with_reasons():
    p = Problem(4096, 4096, 4096)
    with pytest.raises(ValueError, match=r"config: .* cannot run .*shared memory"):
        heuristics.require_valid(_cfg(num_stages=8), p, H200)
    assert heuristics.require_valid(_cfg(), p, H200) == _cfg()


# ----------------------------------------------------------------------------- JITGEMM_CONFIG


def test_env_unset_or_empty_gives_none(monkeypatch):
    p = Problem(256, 256, 256)
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    assert config_from_env(p, H200) is None
    monkeypatch.setenv("JITGEMM_CONFIG", "  ")
    assert config_from_env(p, H200) is None


def test_env_partial_override_rederives_dependent_fields(monkeypatch):
    p = Problem(4096, 4096, 4096, "fp16", "fp32", "M", "K")
    monkeypatch.setenv("JITGEMM_CONFIG", json.dumps({"block_m": 64, "block_n": 208}))
    cfg = config_from_env(p, H200)
    assert (cfg.block_m, cfg.block_n, cfg.num_consumers) == (64, 208, 1)
    assert (cfg.dtype, cfg.out_dtype, cfg.a_major, cfg.b_major) == ("fp16", "fp32", "M", "K")
    assert cfg.num_stages == common.max_stages(cfg, CAPACITY)
    assert check_config(cfg, p, H200) == []
    # multicast implies the cluster; cluster 1 implies no multicast
    monkeypatch.setenv("JITGEMM_CONFIG", '{"multicast": "A", "block_m": 128, "block_n": 128}')
    cfg = config_from_env(p, H200)
    assert (cfg.cluster_size, cfg.multicast) == (2, "A")
    monkeypatch.setenv("JITGEMM_CONFIG", '{"cluster_size": 1}')
    assert config_from_env(p, H200).multicast == "none"
    # fields not given come from select
    monkeypatch.setenv("JITGEMM_CONFIG", '{"group_size": 3}')
    cfg = config_from_env(p, H200)
    assert cfg == KernelConfig(**{**select(p, H200).to_dict(), "group_size": 3})


def test_env_split_k(monkeypatch):
    p = Problem(4096, 4096, 4096)
    chosen = select(p, H200)
    assert chosen.split_k == 1
    # split_k alone keeps select's tile; the raster follows the split
    monkeypatch.setenv("JITGEMM_CONFIG", '{"split_k": 3}')
    cfg = config_from_env(p, H200)
    assert cfg.split_k == 3 and check_config(cfg, p, H200) == []
    assert (cfg.block_m, cfg.block_n, cfg.cluster_size, cfg.num_stages) == \
        (chosen.block_m, chosen.block_n, chosen.cluster_size, chosen.num_stages)
    assert cfg == sm90.with_raster(KernelConfig(**{**chosen.to_dict(), "split_k": 3}), p, H200)
    # a split chosen by select is kept when only the raster changes, re-derived with the tile,
    # and turned off by split_k 1
    q = Problem(128, 7168, 16384)
    assert select(q, H200).split_k == 4
    monkeypatch.setenv("JITGEMM_CONFIG", '{"group_size": 3}')
    assert config_from_env(q, H200).split_k == 4
    monkeypatch.setenv("JITGEMM_CONFIG", '{"block_m": 64, "block_n": 128}')
    cfg = config_from_env(q, H200)
    assert cfg.split_k == sm90.with_split(KernelConfig(**{**cfg.to_dict(), "split_k": 1}), q, H200).split_k
    monkeypatch.setenv("JITGEMM_CONFIG", '{"block_m": 64, "block_n": 128, "split_k": 2}')
    assert config_from_env(q, H200).split_k == 2
    monkeypatch.setenv("JITGEMM_CONFIG", '{"split_k": 1}')
    assert config_from_env(q, H200) == sm90.with_raster(KernelConfig(**{**select(q, H200).to_dict(),
                                                                        "split_k": 1}), q, H200)


@pytest.mark.parametrize("text, message", [
    ('{"split_k": 0}', "JITGEMM_CONFIG=.*split_k must be in \\[1, 32\\]"),
    ('{"split_k": 33}', "JITGEMM_CONFIG=.*split_k must be in \\[1, 32\\]"),
    ('{"split_k": 2.0}', "JITGEMM_CONFIG: field 'split_k' must be int"),
    ("{not json", "JITGEMM_CONFIG must be a JSON object"),
    ("[1, 2]", "JITGEMM_CONFIG must be a JSON object"),
    ('{"block_q": 1}', r"JITGEMM_CONFIG: unknown KernelConfig fields \['block_q'\]"),
    ('{"block_n": "128"}', "JITGEMM_CONFIG: field 'block_n' must be int"),
    ('{"has_c": 1}', "JITGEMM_CONFIG: field 'has_c' must be bool"),
    ('{"block_n": 100}', "JITGEMM_CONFIG=.*block_n must be a multiple of 16"),
    ('{"dtype": "fp16"}', "JITGEMM_CONFIG=.*dtype is 'fp16' but the problem has 'bf16'"),
    ('{"block_m": 128, "block_n": 256, "num_stages": 9}', "JITGEMM_CONFIG=.*shared memory"),
    ('{"block_m": 128, "block_n": 256, "num_consumers": 1}', "JITGEMM_CONFIG=.*accumulator registers"),
    ('{"block_n": 192, "multicast": "B"}', "JITGEMM_CONFIG=.*even number of 64-wide pieces"),
])
def test_env_errors_name_the_variable(monkeypatch, text, message):
    monkeypatch.setenv("JITGEMM_CONFIG", text)
    with pytest.raises(ValueError, match=message):
        config_from_env(Problem(4096, 4096, 4096), H200)


# ----------------------------------------------------------------------------- sm_100a dispatch


def test_sm100_dispatch_is_lazy(monkeypatch):
    calls = []
    fake = types.ModuleType("jitgemm.heuristics.sm100")
    fake.select = lambda p, d: calls.append(("select", p, d)) or "picked"
    fake.explain = lambda p, d, top: calls.append(("explain", p, d, top)) or {"chosen": "x"}
    monkeypatch.setitem(sys.modules, "jitgemm.heuristics.sm100", fake)
    monkeypatch.setattr(heuristics, "sm100", fake, raising=False)
    dev = DeviceSpec("sm_100a", 148)
    p = Problem(1, 2, 3)
    assert select(p, dev) == "picked"
    assert explain(p, dev, top=2) == {"chosen": "x"}
    assert [c[0] for c in calls] == ["select", "explain"] and calls[1][3] == 2


# ----------------------------------------------------------------------------- common helpers


def test_waves_of():
    w = common.waves_of(512, 132)
    assert (w.waves, w.last_wave_tiles) == (4, 116)
    assert w.last_wave_util == pytest.approx(116 / 132)
    assert w.efficiency == pytest.approx(512 / 528)
    assert common.waves_of(100, 132).waves == 1
    assert common.waves_of(264, 132).last_wave_util == 1.0


def test_max_stages_matches_brute_force():
    for cfg in [KernelConfig(), KernelConfig(block_m=64, block_n=16, num_consumers=1),
                KernelConfig(block_m=256, block_n=128, out_dtype="fp32"),
                KernelConfig(block_n=112, b_major="N"), KernelConfig(block_n=256, out_dtype="fp32")]:
        brute = 0
        for s in range(2, common.MAX_STAGES + 1):
            if layout_of(KernelConfig(**{**cfg.to_dict(), "num_stages": s})).smem_bytes <= CAPACITY:
                brute = s
        assert common.max_stages(cfg, CAPACITY) == brute, cfg.name


def test_stage_rule():
    assert common.stage_rule(128, 256, 3) is None
    assert "need >= 3" in common.stage_rule(128, 256, 2)
    assert "need >= 4" in common.stage_rule(128, 128, 3)
    assert common.stage_rule(128, 128, 4) is None


def test_covered_extent():
    assert common.covered_extent(1000, 128, 128) == 1000
    # blocks of 112 loading 128 columns: each re-reads 16 of its neighbour, clipped at the edge
    assert common.covered_extent(1000, 112, 128) == 8 * 128 + (1000 - 8 * 112)
    assert common.covered_extent(100, 16, 64) == sum(min(64, 100 - j * 16) for j in range(7))


@pytest.mark.parametrize("pair", ["none", "A", "B"])
@pytest.mark.parametrize("raster", ["m", "n"])
def test_tile_order_visits_every_tile_once(pair, raster):
    num_m, num_n = 7, 5
    seen = []
    for item in common.tile_order(num_m, num_n, raster, 3, pair):
        seen.extend(item)
        if pair == "A":
            assert item[0][0] == item[1][0]          # same m block: they share A
        if pair == "B":
            assert item[0][1] == item[1][1]          # same n block: they share B
    assert set(seen) == {(m, n) for m in range(num_m) for n in range(num_n)}
    dupes = len(seen) - num_m * num_n
    assert dupes == {"none": 0, "A": num_m, "B": num_n}[pair]   # peers past the edge


def test_choose_raster_minimises_the_working_set():
    # A tall-thin grid: grouping along M (the long side) keeps fewer B columns live.
    raster, group, fp = common.choose_raster(64, 8, 128, 256, 132)
    for r in "mn":
        for g in (8, 16):
            assert fp <= common.raster_footprint(64, 8, 128, 256, 132, r, g)
    # Selected configs carry the raster choose_raster picks.
    p = Problem(8192, 8192, 8192)
    cfg = select(p, H200)
    b_box = -(-cfg.block_n // 64) * 64
    r, g, _ = common.choose_raster(-(-p.m // cfg.block_m), -(-p.n // cfg.block_n), cfg.block_m, b_box,
                                   H200.num_sms // cfg.cluster_size, cfg.multicast)
    assert (cfg.raster, cfg.group_size) == (r, g)


def test_register_split_matches_the_template():
    from importlib import resources
    src = resources.files("jitgemm.templates").joinpath("sm90_gemm.cu.j2").read_text()
    assert f"setmaxnreg_dec<{sm90.PRODUCER_REGS}>" in src
    assert f"setmaxnreg_inc<{sm90.CONSUMER_REGS}>" in src
