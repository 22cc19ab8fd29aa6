"""Stream-K (KernelConfig.stream_k, sm_90a): the K blocks of all cluster tiles, end to end, cut
into one range per cluster. CPU checks: the ranges cover every K block once and name each tile's
splits as the fix-up needs; the template's device code walks the same ranges as
jitgemm.geometry (compiled for the host with the C++ compiler of this machine); the config
rules and the launch geometry."""

import random
import re
import shutil
import subprocess

import pytest

from jitgemm import geometry, registry
from jitgemm.config import KernelConfig
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
        assert [s[0] for s in segs] == list(range(len(segs)))  # split 0 holds K block 0
        assert {s[1] for s in segs} == {len(segs)} and len(segs) <= slots
        assert [s[4] for s in segs] == list(range(segs[0][4], segs[0][4] + len(segs)))  # neighbouring clusters
    # every cluster has work, and the ranges differ by at most one K block
    lengths = [sum(e - b for _, _, _, b, e in geometry.stream_k_segments(c, tiles, kb, ctas)) for c in range(ctas)]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("tiles,kb,ctas", [(264, 10, 132), (80, 128, 132), (5, 64, 132), (200, 64, 132), (133, 9, 132)])
def test_max_splits_is_the_most_clusters_sharing_a_tile(tiles, kb, ctas):
    assert geometry.stream_k_max_splits(tiles, kb, ctas) == max(len(v) for v in _walk(tiles, kb, ctas).values())


HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <algorithm>
using std::min;
#define __device__
#define __forceinline__ inline
%s
int main(int argc, char** argv) {
    const int tiles = atoi(argv[1]), num_k_blocks = atoi(argv[2]), ctas = atoi(argv[3]);
    const long long sk_total = (long long)tiles * num_k_blocks;
    for (int c = 0; c < ctas; ++c) {
        const long long sk_end = sk_bound(sk_total, c + 1, ctas);
        for (long long block = sk_bound(sk_total, c, ctas); block < sk_end;) {
            const Work w = sk_work(block, sk_end, c, ctas, num_k_blocks, sk_total);
            block = (long long)w.tile * num_k_blocks + w.kb_end;
            printf("%%d %%d %%d %%d %%d %%d\n", c, w.tile, w.split, w.splits, w.kb_begin, w.kb_end);
        }
    }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
def test_the_template_walks_the_ranges_of_geometry(tmp_path):
    source = render(KernelConfig(block_n=192, num_stages=4, stream_k=True))
    device_code = source[
        source.index("struct Work") : source.index("\n\n", source.index("__device__ __forceinline__ Work sk_work"))
    ]
    assert "sk_owner" in device_code and "sk_bound" in device_code
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
