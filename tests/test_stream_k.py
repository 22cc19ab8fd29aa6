"""Stream-K (KernelConfig.stream_k, sm_90a): whole tiles in waves, then the K blocks of the last
one to two waves' worth of tiles, end to end, cut into one range per cluster, each walked from
its end. CPU checks: the ranges cover every K block once and name each tile's splits as the
fix-up needs; the template's device code walks the same ranges as jitgemm.geometry (compiled
for the host with the C++ compiler of this machine); the config rules, the launch geometry and
the cost model's pricing of forced stream-K configs."""

import random
import re
import shutil
import subprocess

import pytest

from jitgemm import geometry, heuristics, registry
from jitgemm.config import KernelConfig
from jitgemm.heuristics import DeviceSpec, sm90
from jitgemm.problem import Problem
from jitgemm.render import render

CASES = [(1, 1, 1), (1, 7, 3), (5, 64, 132), (80, 128, 132), (132, 56, 132), (264, 8, 132), (3, 300, 132), (7, 5, 40)]
CASES += [
    (t, kb, c)
    for t, kb, c in (
        (random.Random(i).randint(1, 400), random.Random(-i).randint(1, 300), 1 + i % 132) for i in range(60)
    )
]


def _walk(tiles: int, kb: int, ctas: int) -> dict:
    """tile -> [(split, splits, kb_begin, kb_end, cluster)] of geometry.stream_k_segments."""
    out: dict = {}
    for c in range(ctas):
        for tile, split, splits, begin, end in geometry.stream_k_segments(c, tiles, kb, ctas):
            out.setdefault(tile, []).append((split, splits, begin, end, c))
    return out


@pytest.mark.parametrize("tiles,kb,ctas", CASES)
def test_ranges_cover_every_k_block_once_and_name_the_splits(tiles, kb, ctas):
    ctas = min(ctas, tiles * kb)  # (a launch never has more clusters than K blocks)
    walk = _walk(tiles, kb, ctas)
    assert sorted(walk) == list(range(tiles))
    slots = geometry.stream_k_max_splits(tiles, kb, ctas)
    for segs in walk.values():
        segs.sort(key=lambda s: s[2])
        assert segs[0][2] == 0 and segs[-1][3] == kb  # from the first K block to the last
        assert all(a[3] == b[2] for a, b in zip(segs, segs[1:]))  # no gap, no overlap
        assert [s[0] for s in segs] == list(range(len(segs)))[::-1]  # split 0 holds the last K block
        assert {s[1] for s in segs} == {len(segs)} and len(segs) <= slots
        assert [s[4] for s in segs] == list(range(segs[0][4], segs[0][4] + len(segs)))  # neighbouring clusters
    # every cluster has work, and the ranges differ by at most one K block
    lengths = [sum(e - b for _, _, _, b, e in geometry.stream_k_segments(c, tiles, kb, ctas)) for c in range(ctas)]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("tiles,kb,ctas", CASES)
def test_the_workspace_holds_the_cut_tiles(tiles, kb, ctas):
    """The kernel indexes a cut tile's partials and counters from the first cut tile: every tile
    shared by clusters lands inside geometry.partial_tiles, and only those use it."""
    ctas = min(ctas, tiles * kb)
    cfg = KernelConfig(stream_k=True)
    held = geometry.partial_tiles(cfg, tiles, ctas)
    whole = geometry.stream_k_whole_tiles(tiles, ctas)
    shared = {
        t for c in range(ctas) for t, _, splits, *_ in geometry.stream_k_segments(c, tiles, kb, ctas) if splits > 1
    }
    assert all(0 <= t - whole < held for t in shared)
    assert held == tiles - whole and geometry.partial_tiles(KernelConfig(split_k=2), tiles, ctas) == tiles


@pytest.mark.parametrize("tiles,kb,ctas", CASES[:30])
def test_cluster_blocks_is_the_longest_walk(tiles, kb, ctas):
    ctas = min(ctas, tiles * kb)
    longest = max(sum(e - b for *_, b, e in geometry.stream_k_segments(c, tiles, kb, ctas)) for c in range(ctas))
    assert geometry.stream_k_cluster_blocks(tiles, kb, ctas) == longest


def test_the_launch_gives_every_cluster_a_k_block():
    """A cluster of an empty range would count among a tile's splits and never arrive: where
    anything is cut, the grid has no more clusters than the cut range has K blocks."""
    sm90 = registry.get("sm_90a")
    rng = random.Random(5)
    for _ in range(300):
        p = Problem(rng.randint(1, 4000), rng.randint(1, 4000), rng.randint(1, 600))
        cfg = KernelConfig(block_m=64, num_consumers=1, block_n=128, num_stages=8, stream_k=True)
        tiles, kb = sm90.cluster_tiles(cfg, p.m, p.n), geometry.k_blocks(cfg, p.k)
        ctas = sm90.grid_size(cfg, p, 132)
        cut = tiles - geometry.stream_k_whole_tiles(tiles, ctas)
        assert cut == 0 or ctas <= cut * kb, p.describe()
        lengths = [sum(e - b for *_, b, e in geometry.stream_k_segments(c, tiles, kb, ctas)) for c in range(ctas)]
        assert min(lengths) >= 1, p.describe()


@pytest.mark.parametrize("tiles,kb,ctas", [(102, 250, 66), (51, 250, 66), (69, 160, 66), (7, 100, 40)])
def test_clusters_walk_their_ranges_at_the_same_k_offsets(tiles, kb, ctas):
    """Walked from its end, a range's pieces that start a tile begin at the range's start (at K
    block 0, as every cluster's does), and those that end a tile end at the range's end (at the
    tile's last K block, as every cluster's does): neighbours read the same K slices together."""
    whole = geometry.stream_k_whole_tiles(tiles, ctas)
    for c in range(ctas):
        elapsed = 0
        for _, _, _, begin, end in geometry.stream_k_segments(c, tiles, kb, ctas)[whole // ctas :]:
            if begin == 0:
                assert elapsed == 0 or end == kb  # a piece from K block 0 comes first (or is a whole tile)
            elapsed += end - begin
        pieces = geometry.stream_k_segments(c, tiles, kb, ctas)[whole // ctas :]
        assert pieces[-1][4] == kb or len(pieces) == 1  # the piece to a tile's end comes last


@pytest.mark.parametrize("tiles,kb,ctas", [(208, 253, 66), (264, 10, 132), (400, 7, 13), (131, 9, 132), (133, 9, 66)])
def test_only_the_last_one_to_two_waves_are_cut(tiles, kb, ctas):
    """Whole tiles first, in waves (the same count for every cluster); the K blocks of the last
    one to two waves' worth of tiles cut; nothing cut where the tiles make whole waves."""
    whole = geometry.stream_k_whole_tiles(tiles, ctas)
    cut = tiles - whole
    assert (cut == 0) == (tiles % ctas == 0)
    assert cut == 0 or cut == tiles < 2 * ctas or ctas < cut < 2 * ctas
    for c in range(ctas):
        segs = geometry.stream_k_segments(c, tiles, kb, ctas)
        assert [s[0] for s in segs[: whole // ctas]] == list(range(c, whole, ctas))
        assert all(s[1:] == (0, 1, 0, kb) for s in segs[: whole // ctas])
        assert all(s[0] >= whole for s in segs[whole // ctas :])


@pytest.mark.parametrize("tiles,kb,ctas", [(264, 10, 132), (80, 128, 132), (5, 64, 132), (200, 64, 132), (133, 9, 132)])
def test_max_splits_is_the_most_clusters_sharing_a_tile(tiles, kb, ctas):
    assert geometry.stream_k_max_splits(tiles, kb, ctas) == max(len(v) for v in _walk(tiles, kb, ctas).values())


HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <algorithm>
using std::min;
using std::max;
#define __device__
#define __forceinline__ inline
%s
int main(int argc, char** argv) {
    const int tiles = atoi(argv[1]), num_k_blocks = atoi(argv[2]), ctas = atoi(argv[3]);
    for (int c = 0; c < ctas; ++c) {
        StreamK walk(tiles, num_k_blocks, c, ctas);
        for (Work w; walk.next(w);) {
            printf("%%d %%d %%d %%d %%d %%d\n", c, w.tile, w.split, w.splits, w.kb_begin, w.kb_end);
        }
    }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
def test_the_template_walks_the_ranges_of_geometry(tmp_path):
    source = render(KernelConfig(block_n=192, num_stages=4, stream_k=True))
    device_code = source[source.index("struct Work") : source.index("\n};\n", source.index("struct StreamK")) + 4]
    assert "bool next(Work& w)" in device_code
    (tmp_path / "walk.cpp").write_text(HARNESS % device_code)
    subprocess.run(["g++", "-O1", "-o", str(tmp_path / "walk"), str(tmp_path / "walk.cpp")], check=True)
    for tiles, kb, ctas in CASES:
        ctas = min(ctas, tiles * kb)
        out = subprocess.run(
            [str(tmp_path / "walk"), str(tiles), str(kb), str(ctas)], capture_output=True, text=True, check=True
        ).stdout
        got = [tuple(map(int, line.split())) for line in out.splitlines()]
        want = [(c, *seg) for c in range(ctas) for seg in geometry.stream_k_segments(c, tiles, kb, ctas)]
        assert got == want, (tiles, kb, ctas)


def test_config_rules():
    assert KernelConfig(stream_k=True).name.endswith("_stk")
    with pytest.raises(ValueError, match="stream_k cuts K itself: split_k must be 1"):
        KernelConfig(stream_k=True, split_k=2)
    sm90 = registry.get("sm_90a")
    assert any("stream-K" in p for p in sm90.structural_problems(KernelConfig(stream_k=True, swap_ab=True)))
    sm100 = registry.get("sm_100a")
    bad = KernelConfig(arch="sm_100a", block_m=256, block_n=128, stream_k=True)
    assert any("stream_k" in p for p in sm100.structural_problems(bad))


def test_launch_geometry():
    """The grid: one CTA per SM (pair), at most one cluster per K block of all tiles; the
    workspace's partial slots per tile: the most clusters sharing a tile."""
    sm90 = registry.get("sm_90a")
    p = Problem(640, 4096, 8192)  # 5 x 16 tiles of 128 x 256, 128 K blocks each
    cfg = KernelConfig(block_n=256, num_stages=3, stream_k=True)
    assert sm90.work_units(cfg, p) == 80 * 128
    assert sm90.grid_size(cfg, p, 132) == 132
    assert geometry.partial_slots(cfg, 80, p.k, 132) == 3  # ranges of 77-78 K blocks: a tile meets up to 3
    pair = KernelConfig(block_n=256, num_stages=3, stream_k=True, cluster_size=2, multicast="B", raster="n")
    assert sm90.grid_size(pair, p, 132) == 132  # 66 clusters over 40 pair tiles
    tiny = Problem(64, 128, 128)  # one tile of 2 K blocks: 2 clusters, one K block each
    assert sm90.grid_size(cfg, tiny, 132) == 2 and geometry.partial_slots(cfg, 1, tiny.k, 2) == 2
    assert re.search(r"\bint num_splits\b", render(cfg))  # the slots reach the kernel


# ----------------------------------------------------------------------------- the heuristics

H200 = DeviceSpec("sm_90a", 132)


def test_where_the_tiles_make_whole_waves_stream_k_costs_what_the_wave_order_does():
    """Stream-K of tiles that make whole waves cuts none: the model prices the two schedules
    alike (measured on an H100, 1536x2112x16000 nn, m128n192 B pairs, 66 pair tiles: 129.9 us in
    the wave order, 131.4 under stream-K)."""
    p = Problem(1536, 2112, 16000, a_major="K", b_major="K")
    wave = KernelConfig(a_major="K", b_major="K", block_n=192, num_stages=4, cluster_size=2, multicast="B", raster="n")
    stk = KernelConfig(**{**wave.to_dict(), "stream_k": True})
    assert sm90.cluster_tiles_of(p, 128, 192, "B") == 66
    wave_cost, stk_cost = sm90.costs_of(p, H200, [wave, stk])
    assert stk_cost == pytest.approx(wave_cost, rel=1e-9)
    # one more pair row of tiles: the wave order takes a second wave, stream-K an eleventh more K blocks
    q = Problem(1536, 2304, 16000, a_major="K", b_major="K")
    wave_cost, stk_cost = sm90.costs_of(q, H200, [wave, stk])
    assert 1.5 < wave_cost / stk_cost < 2


def test_a_forced_stream_k_config_is_costed_per_cluster():
    """cost_of reports a stream-K config's clusters as its units and each cluster's K blocks:
    72 pair tiles of 250 K blocks over 66 clusters, 272 or 273 each."""
    p = Problem(1536, 2304, 16000, a_major="K", b_major="K")
    cfg = KernelConfig(
        a_major="K", b_major="K", block_n=192, num_stages=4, cluster_size=2, multicast="B", raster="n", stream_k=True
    )
    terms = sm90.cost_of(p, H200, cfg).terms
    assert (terms["units"], terms["kb_per_unit"]) == (66, 273)
    assert terms["splitk_cycles"] > 0  # the cut tiles' fix-up
    assert not heuristics.select(p, H200).stream_k  # (select does not choose it)
    with pytest.raises(ValueError, match="stream_k does not run swapped"):
        sm90.costs_of(p, H200, [KernelConfig(**{**cfg.to_dict(), "swap_ab": True})])
