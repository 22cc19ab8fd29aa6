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
# bf16 inputs and output, A K-major and B N-major (layout "nt", B MN-major: it is loaded in
# 64-column pieces, so a block_n that is not a multiple of 64 reads and stores padding), 132 SMs.
# Each row: (M, N, K), expected (block_m, block_n, cluster_size, multicast), why.
DEEPSEEK = [(2112, 7168), (24576, 1536)]       # q/kv down-projection, q up-projection
LLAMA = [(4096, 4096), (14336, 4096)]          # Llama-3-8B attention projection, MLP up
TABLE = [
    # --- DeepSeek (2112, 7168)
    ((1, 2112, 7168), (64, 16, 1, "none"),
     "decode: 2112 / 16 = 132 column blocks fill the 132 SMs exactly; memory bound (A is one row)"),
    ((16, 2112, 7168), (64, 16, 1, "none"),
     "as M=1: the 16 rows of A are small next to B, so spreading N over all SMs wins"),
    ((64, 2112, 7168), (64, 32, 1, "none"),
     "64 rows of A are now re-read by every column block: 66 blocks of 32 balance A re-reads "
     "against SM coverage (block_n 16 would double the A traffic through L2)"),
    ((128, 2112, 7168), (64, 48, 1, "none"),
     "two m blocks of 64 x 44 column blocks = 88 tiles; block_m 128 would double each tile's MMA "
     "time while the problem is bound by L2 ingress"),
    ((4096, 2112, 7168), (128, 176, 2, "A"),
     "2112 = 12 x 176 exactly: 384 tiles = 192 pairs, 3 waves of 66 clusters with a 91% last "
     "wave (block_n 256 would leave 9 column blocks with a 25% full last one); pairs on "
     "neighbouring n blocks share A"),
    ((8192, 2112, 7168), (128, 176, 2, "A"),
     "as M=4096, twice the rows: 768 tiles, 6 waves, no padding along N"),
    # --- DeepSeek (24576, 1536)
    ((1, 24576, 1536), (64, 192, 1, "none"),
     "decode of a wide N: DRAM bound whatever the tile; 24576 / 192 = 128 blocks keeps one wave "
     "with whole 64-column pieces of B and the least SM time"),
    ((16, 24576, 1536), (64, 192, 1, "none"), "as M=1"),
    ((64, 24576, 1536), (64, 256, 1, "none"),
     "DRAM bound; with 64 real rows the wider 256 tile reads A fewer times (96 tiles)"),
    ((128, 24576, 1536), (128, 192, 1, "none"),
     "one m block of 128 (two warpgroups): 128 tiles of 192, a single wave, so no multicast"),
    ((4096, 24576, 1536), (128, 240, 2, "B"),
     "tensor-core bound: 103 column blocks of 240 x 32 m blocks = 25 waves with a 97% last wave "
     "(256 would give 24 waves with a 27% last one); pairs of m blocks share B"),
    ((8192, 24576, 1536), (128, 240, 2, "B"), "as M=4096: 50 waves, 94% last wave"),
    # --- Llama (4096, 4096)
    ((1, 4096, 4096), (64, 32, 1, "none"), "decode: 128 column blocks of 32 spread B over the SMs"),
    ((16, 4096, 4096), (64, 32, 1, "none"), "as M=1"),
    ((64, 4096, 4096), (64, 48, 1, "none"),
     "86 tiles of 48: fewer re-reads of the 64-row A than 128 tiles of 32"),
    ((128, 4096, 4096), (64, 64, 1, "none"),
     "2 x 64 = 128 tiles of 64x64, one wave, whole 64-column pieces of B"),
    ((4096, 4096, 4096), (128, 256, 2, "B"),
     "the classic: 512 tiles of 128x256, 4 waves (88% last); tensor-core bound; among the "
     "equal-time candidates sharing B over a 256x256 pair moves the least L2 traffic"),
    ((8192, 4096, 4096), (256, 112, 2, "B"),
     "tensor-core bound: 32 x 37 tiles of 256x112 = 9 waves with a 97% last wave beat 8 waves "
     "of 128x256 with a 76% last one"),
    # --- Llama (14336, 4096)
    ((1, 14336, 4096), (64, 112, 1, "none"),
     "decode: 14336 / 112 = 128 blocks, one wave; DRAM bound"),
    ((16, 14336, 4096), (64, 112, 1, "none"), "as M=1"),
    ((64, 14336, 4096), (64, 128, 1, "none"),
     "DRAM bound; 112 tiles of 128 (whole pieces of B, fewer A re-reads) need the least SM time"),
    ((128, 14336, 4096), (128, 128, 1, "none"),
     "one m block of 128: 112 tiles of 128x128, single wave, DRAM bound"),
    ((4096, 14336, 4096), (128, 176, 2, "A"),
     "tensor-core bound: 82 column blocks of 176 give 20 waves with an 88% last wave, better than "
     "the 14 waves of 128x256 with a 58% last one"),
    ((8192, 14336, 4096), (128, 176, 2, "A"), "as M=4096: 40 waves"),
]


@pytest.mark.parametrize("shape, expected, why", TABLE, ids=[f"{m}x{n}x{k}" for (m, n, k), _, _ in TABLE])
def test_selection_table(shape, expected, why):
    m, n, k = shape
    cfg = select(Problem(m, n, k, "bf16", "bf16", "K", "N"), H200)
    got = (cfg.block_m, cfg.block_n, cfg.cluster_size, cfg.multicast)
    assert got == expected, f"{shape}: expected {expected} because {why}; got {cfg.name}"


def test_table_covers_the_issue_grid():
    ms = {1, 16, 64, 128, 4096, 8192}
    got = {(m, n, k) for (m, n, k), _, _ in TABLE}
    assert got == {(m, n, k) for m in ms for n, k in DEEPSEEK + LLAMA}


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
        # cluster divides the SM count; no multicast on a single wave
        assert device.num_sms % cfg.cluster_size == 0, where
        single_wave = -(-p.m // cfg.block_m) * -(-p.n // cfg.block_n) <= device.num_sms
        if single_wave:
            assert cfg.cluster_size == 1, where
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
def test_decode_spreads_n_over_the_sms(b_major):
    # No split-K yet: with one m block, the tiles come only from N, so block_n must be small
    # enough to give most SMs a column block. (At M=64 the re-reads of A start to count and
    # fewer, wider tiles can win: see the table.)
    for n, k in DEEPSEEK + LLAMA + [(7168, 2048), (576, 7168)]:
        for m in (1, 16):
            cfg = select(Problem(m, n, k, b_major=b_major), H200)
            tiles = -(-n // cfg.block_n)
            assert cfg.block_m == 64
            assert tiles >= min(H200.num_sms, n // 16) * 0.6, (m, n, k, cfg.name)


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
        assert {"config", "name", "cost", "waves", "last_wave_util", "l2_bytes", "smem_bytes"} <= set(c)
        KernelConfig.from_dict(c["config"])
    for r in e["rejected"]:
        assert set(r) == {"config", "rule"} and r["rule"]


def test_explain_names_the_rules():
    e = explain(Problem(64, 4096, 4096, out_dtype="fp32"), H200, top=3)
    rules = " | ".join(r["rule"] for r in e["rejected"])
    assert "block_m 256 only with a 16-bit output" in rules
    assert "single wave" in rules
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
    monkeypatch.setenv("JITGEMM_CONFIG", '{"multicast": "A", "block_n": 128}')
    cfg = config_from_env(p, H200)
    assert (cfg.cluster_size, cfg.multicast) == (2, "A")
    monkeypatch.setenv("JITGEMM_CONFIG", '{"cluster_size": 1}')
    assert config_from_env(p, H200).multicast == "none"
    # fields not given come from select
    monkeypatch.setenv("JITGEMM_CONFIG", '{"group_size": 3}')
    cfg = config_from_env(p, H200)
    assert cfg == KernelConfig(**{**select(p, H200).to_dict(), "group_size": 3})


@pytest.mark.parametrize("text, message", [
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
