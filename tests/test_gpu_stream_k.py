"""Stream-K on the GPU (KernelConfig.stream_k): every result checked elementwise against float64
in NaN-poisoned, guarded outputs, over shapes where clusters own whole tiles, cut tiles and
tiles shared by three clusters; the split-K fix-up's counters left at zero; repeated calls
bit-identical; and no co-residency needed (test_gpu_splitk.py's blocker)."""

import subprocess
import sys
from pathlib import Path

import pytest
from gpu_helpers import assert_close, guard_untouched, guarded_out, random_operand
from test_gpu_splitk import CO_RESIDENCY, _counters

import jitgemm
from jitgemm import geometry, registry
from jitgemm.config import KernelConfig
from jitgemm.problem import Problem

pytestmark = pytest.mark.gpu

STREAM_K_CONFIGS = [
    KernelConfig(block_n=192, num_stages=4, stream_k=True),
    KernelConfig(block_n=128, num_stages=5, stream_k=True, a_major="M", b_major="K"),
    KernelConfig(num_stages=5, stream_k=True, cluster_size=2, multicast="B", raster="n", has_c=True, out_dtype="fp32"),
    KernelConfig(block_m=64, num_consumers=1, block_n=128, num_stages=8, stream_k=True, has_c=True),
]
# (M, N, K): 2-3 clusters a tile (long K, few tiles), a cut tile per cluster, several cut
# tiles a cluster (short K), one tile of two K blocks, odd sizes, over two waves of tiles (whole
# tiles in waves, then the cut range)
SHAPES = [(640, 1536, 8192), (300, 1000, 3000), (1000, 1400, 200), (64, 128, 128), (129, 777, 1501), (4000, 2900, 1000)]


@pytest.fixture(scope="module")
def gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(2107)


@pytest.mark.parametrize("cfg", STREAM_K_CONFIGS, ids=lambda c: c.name)
def test_results_counters_and_repeats(cfg, gen):
    import torch

    stream = torch.cuda.current_stream().cuda_stream
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    arch = registry.get(cfg.arch)
    cut = whole_then_cut = 0
    for m, n, k in SHAPES:
        la = "row" if cfg.a_major == "K" else "col"
        lb = "row" if cfg.b_major == "N" else "col"
        a, b = random_operand(m, k, cfg.dtype, la, gen), random_operand(k, n, cfg.dtype, lb, gen)
        c = random_operand(m, n, cfg.out_dtype, "row", gen) if cfg.has_c else None
        buf, out = guarded_out(m, n, cfg.out_dtype)
        jitgemm.gemm(a, b, out=out, c=c, beta=0.5, config=cfg)
        assert not _counters(stream).any(), f"{cfg.name} {m}x{n}x{k}: counters left non-zero"
        assert_close(out, a, b, cfg.out_dtype, c=c, beta=0.5)
        assert guard_untouched(buf, m, n), f"{cfg.name} {m}x{n}x{k}: wrote outside the output"
        first = out.clone()
        for _ in range(2):
            jitgemm.gemm(a, b, out=out, c=c, beta=0.5, config=cfg)
            assert torch.equal(out, first), f"{cfg.name} {m}x{n}x{k}: the sum changed between runs"
        p = Problem(m, n, k, cfg.dtype, cfg.out_dtype, cfg.a_major, cfg.b_major, cfg.has_c)
        tiles = arch.cluster_tiles(cfg, m, n)
        ctas = arch.grid_size(cfg, p, sms) // cfg.cluster_size
        cut = max(cut, geometry.partial_slots(cfg, tiles, k, ctas))
        whole_then_cut += 0 < geometry.stream_k_whole_tiles(tiles, ctas) < tiles
    assert cut >= 3  # the shapes cut some tile between three clusters
    assert whole_then_cut  # and some cluster takes whole tiles before its cut range


def test_stream_k_needs_no_co_residency():
    pytest.importorskip("cupy")
    split_cfg = "cfg = KernelConfig(block_m=64, num_consumers=1, block_n=128, num_stages=8, split_k=3)"
    assert split_cfg in CO_RESIDENCY
    script = CO_RESIDENCY.replace(
        split_cfg, "cfg = KernelConfig(block_m=64, num_consumers=1, block_n=128, num_stages=8, stream_k=True)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=200, cwd=Path(__file__).parent.parent
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "both finished" in result.stdout
