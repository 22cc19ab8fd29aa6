"""Representative kernels for compute-sanitizer (.ci/gpu-sanitize): each config of CASES runs once
on a small problem with several tiles per CTA, checked against float64. Run it once without the
sanitizer first so that every kernel is compiled and cached (the sanitizer slows NVRTC too)."""

import sys
import warnings
from pathlib import Path

import torch

import jitgemm
from jitgemm.config import KernelConfig

sys.path.insert(0, str(Path(__file__).parent))  # python -P leaves the script's folder out
from gpu_helpers import assert_close, guarded_out, padded_operand, random_operand  # noqa: E402

# (name, config knobs, (M, N, K), a layout, b layout, with C)
CASES = [
    ("two_consumers", dict(block_n=128, num_stages=4), (300, 520, 200), "row", "row", False),
    (
        "cluster_multicast_A",
        dict(block_n=128, num_stages=4, cluster_size=2, multicast="A"),
        (260, 600, 200),
        "row",
        "col",
        False,
    ),
    (
        "cluster_multicast_B",
        dict(block_n=64, num_stages=4, cluster_size=2, multicast="B"),
        (520, 200, 130),
        "row",
        "col",
        False,
    ),
    (
        "split_k",
        dict(block_m=64, num_consumers=1, block_n=64, num_stages=6, split_k=3),
        (100, 300, 1000),
        "row",
        "row",
        False,
    ),
    (
        "split_k_cluster",
        dict(block_n=128, num_stages=4, cluster_size=2, multicast="B", split_k=2),
        (300, 300, 700),
        "row",
        "row",
        False,
    ),
    ("swap_ab", dict(block_n=80, num_stages=5, swap_ab=True), (200, 700, 300), "row", "col", False),
    (  # C read back transposed (ldmatrix) from the staged box, in pairs
        "swap_ab_c",
        dict(block_n=48, num_stages=6, swap_ab=True, has_c=True, cluster_size=2, multicast="B"),
        (150, 900, 300),
        "row",
        "col",
        True,
    ),
    (  # a swapped tile 8 rows past a multiple of 16: its last rows stored (C read) as two matrices
        "swap_ab_n40_c",
        dict(block_n=40, num_stages=6, swap_ab=True, has_c=True),
        (150, 5000, 300),  # 4 x 79 tiles: several per CTA
        "row",
        "col",
        True,
    ),
    (  # a pair sharing a 168-row K-major tile: 88 rows loaded by each CTA, 8 of them by both
        "swap_ab_n168_pair_a",
        dict(block_n=168, num_stages=4, swap_ab=True, cluster_size=2, multicast="A"),
        (1300, 2000, 300),
        "row",
        "col",
        False,
    ),
    # a 48-wide N-major B (and, swapped, M-major A) tile: one 64-wide piece, its last 16 columns
    # the next tile's or past the edge
    ("n48_piece", dict(block_m=64, num_consumers=1, block_n=48, num_stages=8), (300, 3000, 200), "row", "row", False),
    ("swap_ab_n48_piece", dict(block_n=48, num_stages=6, swap_ab=True), (150, 5000, 300), "col", "col", False),
    # stream-K: 132 ranges of about 3 K blocks over 5 x 6 tiles of 13: a tile shared by up to five clusters
    ("stream_k_c", dict(block_n=192, num_stages=4, stream_k=True, has_c=True), (600, 1100, 800), "row", "row", True),
    # stream-K past two waves: 31 x 23 = 713 tiles of m64n128, 528 whole, then 185 cut among 132 clusters
    (
        "stream_k_whole_then_cut",
        dict(block_m=64, num_consumers=1, block_n=128, num_stages=8, stream_k=True),
        (1984, 2900, 640),
        "row",
        "col",
        False,
    ),
    ("c_epilogue", dict(block_n=128, num_stages=4, has_c=True, out_dtype="fp32"), (300, 333, 200), "row", "row", True),
    ("b_tail", dict(block_n=144, num_stages=4, b_tail=True), (300, 500, 200), "row", "row", False),
    # one unswizzled output box per row block (176 = 11 x 16 columns), C read back from it
    ("whole_row_box_c", dict(block_n=176, num_stages=3, has_c=True), (300, 500, 200), "row", "row", True),
    (
        "decode_a_rows",
        dict(block_m=64, num_consumers=1, block_n=64, num_stages=8, a_rows=8),
        (5, 700, 500),
        "row",
        "row",
        False,
    ),
    (  # st.global / ld.global epilogue: C has rows of 602 bytes (runs of 2 bytes)
        "direct_c_split_k",
        dict(block_m=64, num_consumers=1, block_n=64, num_stages=6, split_k=3, has_c=True, out_direct=True),
        (100, 301, 1000),
        "row",
        "row",
        True,
    ),
]
UNALIGNED = (301, 203, 77)  # K and N odd: the operands are staged (staging.py), the result (odd N) stored directly
RAGGED = (301, 203, 77)  # rows ending mid-unit in padded rows (NaN past their ends): TMA reads them in place
DECODE = (2, 301, 999)  # 2 rows against a view of b 2 bytes into a unit
DECODE_COLS = (11, 133, 1001)  # 11 rows against W.t() of odd K in a padded view: the cols kernel


def run() -> None:
    gen = torch.Generator(device="cuda").manual_seed(99)
    for name, knobs, (m, n, k), la, lb, with_c in CASES:
        cfg = KernelConfig(a_major="K" if la == "row" else "M", b_major="N" if lb == "row" else "K", **knobs)
        a, b = random_operand(m, k, cfg.dtype, la, gen), random_operand(k, n, cfg.dtype, lb, gen)
        c = random_operand(m, n, cfg.out_dtype, "row", gen) if with_c else None
        _, out = guarded_out(m, n, cfg.out_dtype)
        jitgemm.gemm(a, b, out=out, c=c, beta=0.5, config=cfg)
        torch.cuda.synchronize()
        assert_close(out, a, b, cfg.out_dtype, c=c, beta=0.5)
        print("ok", name, flush=True)
    m, n, k = UNALIGNED
    for lb in ("row", "col"):  # B staged row by row, and gathered from a column-major b
        a, b = random_operand(m, k, "bf16", "row", gen), random_operand(k, n, "bf16", lb, gen)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", jitgemm.FallbackCopyWarning)
            out = jitgemm.gemm(a, b)
        torch.cuda.synchronize()
        assert_close(out, a, b, "bf16")
    print("ok unaligned", flush=True)
    m, n, k = RAGGED
    for la, lb in (("row", "row"), ("col", "col")):
        a, b = padded_operand(m, k, la, gen), padded_operand(k, n, lb, gen)
        out = jitgemm.gemm(a, b, out_dtype=torch.float32)
        torch.cuda.synchronize()
        assert_close(out, a, b, "fp32")
    print("ok ragged", flush=True)
    # the decode kernel (decode.py): b read in place, its first and last units element by
    # element, two strips and a K split; twice, so that the second launch reads the counters
    # the first reset
    m, n, k = DECODE
    a, b = random_operand(m, k, "fp16", "row", gen), random_operand(k, n + 5, "fp16", "row", gen)[:, 1 : n + 1]
    c = random_operand(m, n, "fp32", "row", gen)
    for _ in range(2):
        out = jitgemm.gemm(a, b, c=c, beta=0.5, out_dtype="fp32")
        torch.cuda.synchronize()
        assert_close(out, a, b, "fp32", c=c, beta=0.5)
    print("ok decode", flush=True)
    # the K-major decode kernel: W's last column units element by element, three strips (the
    # last mostly past N), a K split, two n8 products
    m, n, k = DECODE_COLS
    a = random_operand(m, k, "bf16", "row", gen)
    b = random_operand(n, k + 3, "bf16", "row", gen)[:, 1 : k + 1].t()
    for _ in range(2):
        out = jitgemm.gemm(a, b)
        torch.cuda.synchronize()
        assert_close(out, a, b, "bf16")
    print("ok decode cols", flush=True)


if __name__ == "__main__":
    sys.exit(run())
