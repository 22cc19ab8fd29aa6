"""CPU tests of the sm_90a template: rendering, NVRTC compilation and the SASS it produces."""

import dataclasses
import re

import jinja2
import pytest

from jitgemm import compiler, registry
from jitgemm.archs.sm90.layout import SMEM_CAPACITY, layout_of, structural_problems
from jitgemm.archs.sm90.render import b_slices
from jitgemm.config import KernelConfig
from jitgemm.render import kernel_name, render
from jitgemm.sass import inspect_cubin

# One config per template knob value: majors, dtypes, output dtypes, consumers, tile sizes,
# cluster/multicast side and the C epilogue.
KNOB_CONFIGS = [
    KernelConfig(),
    KernelConfig(dtype="fp16", out_dtype="fp16", a_major="M", b_major="K"),
    KernelConfig(out_dtype="fp32", a_major="M", b_major="N", num_stages=5),
    KernelConfig(block_m=64, num_consumers=1, block_n=112, num_stages=6, b_major="K"),
    KernelConfig(block_m=256, block_n=128, num_stages=3, a_major="M", b_major="K"),
    KernelConfig(block_n=208, num_stages=3, has_c=True),
    KernelConfig(block_n=256, num_stages=3, cluster_size=2, multicast="A", a_major="M"),
    KernelConfig(block_n=128, num_stages=4, cluster_size=2, multicast="B", b_major="N", raster="n"),
    KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=13, split_k=3, a_rows=16),
    KernelConfig(block_n=176, num_stages=4, cluster_size=2, multicast="A", has_c=True, b_tail=True),
    KernelConfig(block_n=384, num_stages=3, cluster_size=2, multicast="B"),
    KernelConfig(block_n=336, num_stages=3, b_tail=True, a_major="M", dtype="fp16", out_dtype="fp32"),
    KernelConfig(block_n=160, num_stages=5, cluster_size=2, multicast="B", swap_ab=True),
    KernelConfig(
        block_m=256, block_n=96, num_stages=4, swap_ab=True, a_major="M", b_major="K", dtype="fp16", out_dtype="fp16"
    ),
    KernelConfig(block_n=96, num_stages=6, cluster_size=2, multicast="A", swap_ab=True, has_c=True, b_major="K"),
    # outputs written (and C read) with st.global / ld.global (issue 20)
    KernelConfig(num_stages=4, has_c=True, out_direct=True, out_dtype="fp32"),
    KernelConfig(block_m=64, num_consumers=1, block_n=128, num_stages=6, split_k=3, has_c=True, out_direct=True),
    KernelConfig(block_n=64, num_stages=5, swap_ab=True, a_major="M", out_direct=True),
    KernelConfig(block_n=48, num_stages=6, swap_ab=True, has_c=True, out_direct=True, dtype="fp16", out_dtype="fp16"),
    KernelConfig(block_n=256, num_stages=4, b_major="K", out_direct=True),
    # swapped tiles 8 rows past a multiple of 16 (the user's M in tiles of 168, 216, ...)
    KernelConfig(block_n=168, num_stages=4, swap_ab=True, b_major="K"),
    KernelConfig(block_n=216, num_stages=3, cluster_size=2, multicast="B", swap_ab=True, has_c=True, b_major="K"),
    KernelConfig(block_n=168, num_stages=4, cluster_size=2, multicast="A", swap_ab=True, b_major="K"),
    KernelConfig(block_n=40, num_stages=6, swap_ab=True, has_c=True, out_direct=True, dtype="fp16", out_dtype="fp16"),
    # ... and unswapped, B K-major: one unswizzled store box of the whole row
    KernelConfig(block_n=168, num_stages=4, b_major="K", has_c=True, cluster_size=2, multicast="A"),
    KernelConfig(block_m=64, num_consumers=1, block_n=72, num_stages=8, b_major="K", out_dtype="fp32", split_k=3),
    # stream-K: its ranges cut tiles, summed by the split-K fix-up (pairs, C, a direct epilogue)
    KernelConfig(block_n=192, num_stages=4, stream_k=True, a_major="M"),
    KernelConfig(num_stages=5, stream_k=True, cluster_size=2, multicast="B", raster="n", has_c=True, out_dtype="fp32"),
    KernelConfig(block_m=64, num_consumers=1, block_n=128, num_stages=8, stream_k=True, has_c=True, out_direct=True),
]


@pytest.mark.parametrize("cfg", KNOB_CONFIGS, ids=lambda c: c.name)
def test_compiles_to_hgmma_without_spills(cfg):
    source = render(cfg)
    assert "#include" not in source, "templates must stay header-free for NVRTC"
    result = compiler.compile_cubin(source, "sm_90a", name=f"{kernel_name(cfg)}.cu")
    report = inspect_cubin(result.cubin)
    assert report.mma_counts.get("HGMMA", 0) > 0, "no wgmma (HGMMA) in the SASS"
    assert not report.spills, (
        f"local memory use: stack={report.stack_bytes} LDL={report.local_loads} STL={report.local_stores}"
    )
    assert kernel_name(cfg) in report.sass
    # The register split must have taken effect (ptxas reports C7508 otherwise, which fails the compile).
    assert "USETMAXREG" in report.sass


def test_rendering_is_deterministic_and_config_specific():
    a, b = KNOB_CONFIGS[0], KNOB_CONFIGS[1]
    assert render(a) == render(a)
    assert render(a) != render(b)
    src = render(KNOB_CONFIGS[3])  # block_n = 112
    assert "wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16" in src


def test_transpose_flags_follow_operand_majors():
    # wgmma reads K-major operands with transpose 0 and MN-major ones with transpose 1.
    for a_major, b_major, flags in (("K", "K", "0, 0"), ("K", "N", "0, 1"), ("M", "K", "1, 0"), ("M", "N", "1, 1")):
        src = render(KernelConfig(a_major=a_major, b_major=b_major))
        assert re.search(r"p, 1, 1, " + flags + r";", src), (a_major, b_major)


def test_multicast_kernels_use_cluster_features():
    src = render(KNOB_CONFIGS[6])
    assert "tma_load_multicast(" in src.split("TMA producer")[1]
    assert "cluster_sync();" in src
    plain = render(KNOB_CONFIGS[0])
    assert "tma_load_multicast(dst" not in plain


def test_strict_undefined_rejects_missing_variables():
    from jitgemm.render import environment as _environment

    env = _environment()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing_value }}").render()


def test_compile_error_names_the_source():
    with pytest.raises(compiler.CompileError, match="rendered source: /tmp/x.cu"):
        compiler.compile_cubin("this is not C++", "sm_90a", source_path="/tmp/x.cu")


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(block_m=64, num_consumers=2), "multiple of 64 rows"),
        (dict(cluster_size=2, multicast="none"), "needs multicast"),
        (dict(block_n=192, cluster_size=2, multicast="B", b_major="N"), "even number of 64-wide pieces"),
        (dict(a_rows=16, a_major="M"), "a_rows needs a K-major A"),
    ],
)
def test_layout_rejects_configs_the_template_cannot_honour(bad, message):
    cfg = KernelConfig(**bad)
    assert any(message in p for p in structural_problems(cfg))
    with pytest.raises(ValueError, match=message):
        layout_of(cfg)


def test_config_validation_messages():
    with pytest.raises(ValueError, match="block_n must be a multiple of 8"):
        KernelConfig(block_n=100)
    with pytest.raises(ValueError, match="multicast needs cluster_size 2"):
        KernelConfig(multicast="A")
    with pytest.raises(ValueError, match="unknown KernelConfig fields"):
        KernelConfig.from_dict({"block_q": 1})
    cfg = KNOB_CONFIGS[5]
    assert KernelConfig.from_dict(cfg.to_dict()) == cfg


def test_last_blocks_load_only_the_rows_inside(monkeypatch):
    """The last block of an operand along its rows (M for A, N for B) loads only the rows inside
    the problem: a K-major operand through an edge map whose box has those rows, an MN-major one
    without its pieces wholly past them; the stage's transaction bytes follow. Not for a
    multicast operand nor one loading fixed fewer rows (a_rows)."""
    from jitgemm import runtime
    from jitgemm.problem import Problem

    cfg = KernelConfig(block_m=128, block_n=128, num_stages=4)  # A K-major, B N-major
    lay = layout_of(cfg)
    assert lay.a.edge and lay.b.edge
    assert lay.a.edge_box and not lay.a.edge_pieces and lay.b.edge_pieces and not lay.b.edge_box
    src = render(cfg)
    assert "TensorMap map_a_edge" in src and "map_b_edge" not in src
    assert "const bool a_edge = m0 + 128 > M;" in src
    assert "if (a_edge) stage_tx -= (u32)(m0 + 128 - M) * 128u;" in src
    assert "tma_load(dst, a_edge ? &map_a_edge : &map_a, full, k0, mn);" in src
    assert "const int b_edge_pieces = min(2, (N - n0 + 63) / 64);" in src and "if (p >= b_edge_pieces) break;" in src
    assert "mbar_expect_tx(full, stage_tx);" in src
    # the edge map's box: the rows of the last m block inside M (all 128 where 128 divides M)
    boxes = []
    monkeypatch.setattr(
        runtime, "tensor_map_2d", lambda dtype, ptr, inner, outer, stride, box, swizzle: boxes.append(box)
    )

    class View:
        ptr = 1 << 20

        def leading_stride_bytes(self, dim):
            return 1 << 14

    arch = registry.get("sm_90a")
    for m, rows in ((300, 44), (256, 128)):
        boxes.clear()
        arch.tensor_maps(Problem(m, 320, 512, "bf16", "bf16", "K", "N"), lay, View(), View(), View(), None)
        assert boxes == [lay.a.box, lay.b.box, lay.out_box, (64, rows)]  # A, B, D, then A's edge
    assert not layout_of(KernelConfig(block_m=128, block_n=128, num_stages=4, cluster_size=2, multicast="A")).a.edge
    assert not layout_of(KernelConfig(block_m=128, block_n=128, num_stages=4, a_rows=40)).a.edge
    swapped = render(KernelConfig(block_m=128, block_n=96, num_stages=6, b_major="K", swap_ab=True))
    # under swap_ab A's rows (M) run along the kernel's N: its tiles start at n0
    assert "const bool a_edge = n0 + 96 > M;" in swapped and "const bool b_edge = m0 + 128 > N;" in swapped


def test_b_tail_loads_no_padding_columns():
    """A 144-wide N-major B tile: two 64-wide pieces (128-byte swizzle) and a 16-wide tail (32-byte
    swizzle) with its own tensor map and a second, narrower wgmma; padded, it lands 192 columns."""
    padded = layout_of(KernelConfig(block_n=144, num_stages=5))
    tailed = layout_of(KernelConfig(block_n=144, num_stages=5, b_tail=True))
    assert padded.b.tail is None and padded.b.tx_bytes == 192 * 128
    assert tailed.b.num_pieces == 2 and tailed.b.main_extent == 128 and tailed.b.tx_bytes == 144 * 128
    tail = tailed.b.tail
    assert (tail.extent, tail.swizzle, tail.box, tail.num_pieces) == (16, 32, (16, 64), 1)
    assert tailed.stage_tx_bytes == tailed.stage_bytes == (128 + 144) * 128
    src = render(KernelConfig(block_n=144, num_stages=5, b_tail=True))
    assert "TensorMap map_b_tail" in src and "tma_load(dst, &map_b_tail, full, mn, k0);" in src
    assert "m64n128k16" in src and "m64n16k16" in src and "m64n144k16" not in src
    # its accumulators follow the main wgmma's: d[64..71] of the 72 per atom
    assert '"+f"(d[64])' in src and '"+f"(d[71])' in src
    three = layout_of(KernelConfig(block_n=176, num_stages=4, b_tail=True)).b.tail
    assert (three.extent, three.num_pieces, three.piece_extent) == (48, 3, 16)
    for bad in (
        dict(block_n=128),
        dict(block_n=144, b_major="K"),
        dict(block_n=144, cluster_size=2, multicast="B"),
        dict(block_m=64, num_consumers=1, block_n=48),
    ):
        problems = structural_problems(KernelConfig(b_tail=True, **bad))
        assert any("b_tail needs" in p for p in problems), bad


def test_wide_tiles_take_two_wgmmas_and_a_ring_of_staging_buffers():
    """Past 256 columns (the widest wgmma) a tile takes one wgmma per 256-column slice, then its
    tail; a whole tile of output staging would not fit beside 3 stages, so its store boxes take
    turns in a ring of as many buffers as fit."""
    wide = KernelConfig(block_n=384, num_stages=3, cluster_size=2, multicast="B")
    lay = layout_of(wide)
    assert [(s["n"], s["first_acc"], s["offset"]) for s in b_slices(lay)] == [(256, 0, 0), (128, 128, 4 * 8192)]
    assert lay.num_out_pieces == 6 and lay.out_bufs == 2 and lay.out_bytes == 2 * 2 * 64 * 128
    assert lay.out_bytes_whole == 128 * 384 * 2 and lay.smem_bytes <= SMEM_CAPACITY
    src = render(wide)
    assert "m64n256k16" in src and "m64n128k16" in src and "out_box++ % OUT_BUFS" in src
    tailed = layout_of(KernelConfig(block_n=336, num_stages=3, b_tail=True))
    assert [(s["n"], s["first_acc"], s["offset"]) for s in b_slices(tailed)] == [
        (256, 0, 0),
        (64, 128, 32768),
        (16, 160, 40960),
    ]
    # A tile whose whole staging fits keeps one buffer per box and stores them together.
    whole = layout_of(KernelConfig(block_n=256, num_stages=3))
    assert whole.out_bufs == whole.num_out_pieces == 4 and "out_box" not in render(
        KernelConfig(block_n=256, num_stages=3)
    )
    assert layout_of(KernelConfig(block_n=256, num_stages=4)).out_bufs == 2  # a 4th stage only fits beside a ring
    assert any("needs an N-major B" in p for p in structural_problems(KernelConfig(block_n=384, b_major="K")))


def test_layout_arithmetic():
    lay = layout_of(KernelConfig(block_m=128, block_n=256, num_stages=3))
    assert lay.stage_bytes == 128 * 128 + 256 * 128  # A and B tiles, 128 bytes per row
    assert lay.smem_bytes <= 232448
    assert lay.num_threads == 384 and lay.wg_m == 64
    assert lay.acc_regs == 128
    nn = layout_of(KernelConfig(block_n=208, b_major="N", num_stages=3))
    assert nn.b.num_pieces == 4 and nn.b.tile_bytes == 4 * 64 * 128  # MN-major: 64-wide pieces
    # 208 = 13 x 16 columns: one unswizzled box per row block, not 13 32-byte ones (whole_row_box),
    # except for the direct epilogue; 96 = 3 x 32 keeps 64-byte boxes
    assert nn.out_swizzle == 0 and nn.out_box == (208, 64) and nn.num_out_pieces == 1
    assert nn.out_bytes == 2 * 64 * 208 * 2  # the same bytes as 13 boxes
    direct = layout_of(KernelConfig(block_n=208, b_major="N", num_stages=3, out_direct=True))
    assert direct.out_swizzle == 32 and direct.num_out_pieces == 13
    assert layout_of(KernelConfig(block_n=96, num_stages=3)).out_box == (32, 64)
    decode = layout_of(KernelConfig(block_m=64, num_consumers=1, block_n=64, a_rows=8))
    assert decode.a.box == (64, 8) and decode.a.tile_bytes == 64 * 128  # loads 8 rows of 64
    assert decode.stage_tx_bytes == 8 * 128 + 64 * 128 and decode.stage_bytes == 2 * 64 * 128


def test_output_staging_boxes():
    """Every unswapped tile width and output dtype: the boxes tile the row exactly, within TMA's
    box limits, and stage the same bytes as boxes of the widest dividing swizzle would (so the
    stage counts the heuristics choose do not depend on how the rows are boxed); a row goes as
    one unswizzled box exactly where only 32-byte boxes would divide it into several."""
    for block_n in range(16, 257, 16):
        for out_dtype, elem in (("bf16", 2), ("fp32", 4)):
            for block_m, consumers in ((64, 1), (128, 2), (128, 1)):
                knobs = dict(block_m=block_m, num_consumers=consumers, block_n=block_n, num_stages=2)
                cfg = KernelConfig(out_dtype=out_dtype, **knobs)  # 2 stages: every box staged at once
                lay = layout_of(cfg)
                widest = next(w for w in (128, 64, 32) if block_n % (w // elem) == 0)
                whole = widest == 32 and block_n * elem > 32
                assert lay.out_swizzle == (0 if whole else widest), cfg.name
                cols, rows = lay.out_box
                assert rows == lay.wg_m and cols * lay.num_out_pieces == block_n and cols <= 256
                assert (cols * elem) % 16 == 0
                staged = consumers * lay.wg_m * block_n * elem
                assert lay.out_bytes_whole == -(-staged // 1024) * 1024, cfg.name
    # Wider than a TMA box: 32-byte pieces, staged through a ring.
    for block_n in (272, 336):
        wide = layout_of(KernelConfig(block_n=block_n, b_major="N", num_stages=3))
        assert wide.out_swizzle == 32 and wide.out_box == (16, 64) and wide.out_bufs < wide.num_out_pieces
    # Where the pieces would take turns in a ring, they stay pieces: the config then takes the
    # same shared memory with and without out_direct (which plan.choose may switch after checking it).
    deep = KernelConfig(block_m=64, num_consumers=1, block_n=112, num_stages=9)
    tma, direct = layout_of(deep), layout_of(dataclasses.replace(deep, out_direct=True))
    assert tma.out_swizzle == direct.out_swizzle == 32 and tma.out_bufs < tma.num_out_pieces
    assert tma.smem_bytes == direct.smem_bytes <= SMEM_CAPACITY
    shallow = layout_of(dataclasses.replace(deep, num_stages=6))
    assert shallow.out_swizzle == 0
    assert shallow.smem_bytes == layout_of(dataclasses.replace(deep, num_stages=6, out_direct=True)).smem_bytes


def test_swap_ab_puts_the_users_m_on_the_wgmma_n_side():
    # 4096x576x7168 as cuBLAS tiles it: kernel M (the user's N) in 64-row atoms, kernel N (the
    # user's M) 160 wide; the pair shares the user's B tile, which is the wgmma's A operand.
    cfg = KernelConfig(block_n=160, num_stages=5, cluster_size=2, multicast="B", swap_ab=True)
    lay = layout_of(cfg)
    assert (lay.a.extent, lay.a.box, lay.a.multicast) == (160, (64, 160), False)
    assert (lay.b.extent, lay.b.box, lay.b.pieces_per_rank, lay.b.multicast) == (128, (64, 64), 1, True)
    assert lay.mma_a is lay.b and lay.mma_b is lay.a
    assert lay.out_box == (64, 160) and lay.num_out_pieces == 1 and lay.acc_regs == 80
    src = render(cfg)
    assert "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16" in src
    assert re.search(r"p, 1, 1, 1, 0;", src)  # B's N-major tile is the MN-major wgmma A
    assert "const int kernel_m = N, kernel_n = M;" in src
    assert (
        "tma_load(dst, a_edge ? &map_a_edge : &map_a, full, k0, mn);" in src and "const int mn = n0 + p * 160;" in src
    )
    assert "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in src
    cluster_tiles = registry.get("sm_90a").cluster_tiles
    # kernel tiles: ceil(576 / 128) = 5 along kernel M, ceil(4096 / 160) = 26 along kernel N, in
    # pairs along kernel N (the shared B tile is the kernel's A)
    assert cluster_tiles(cfg, 4096, 576) == 5 * 13


def test_swap_ab_rules():
    base = dict(block_n=160, num_stages=4, swap_ab=True)
    for bad in (
        dict(out_dtype="fp32"),
        dict(split_k=2),
        dict(block_m=64, num_consumers=1, a_rows=8),
        dict(b_tail=True),
    ):
        problems = structural_problems(KernelConfig(**{**base, **bad}))
        assert any("swap_ab needs a 16-bit output" in p for p in problems), bad
    assert not structural_problems(KernelConfig(**base))
    assert not structural_problems(KernelConfig(**base, has_c=True))  # C read back transposed
    assert any("wgmma's N" in p for p in structural_problems(KernelConfig(**{**base, "block_n": 288})))


def test_swapped_tiles_eight_rows_past_a_multiple_of_16():
    # The user's M = 1300 in 8 tiles of 168 rows (1344), not of 176 (1408).
    cfg = KernelConfig(block_n=168, num_stages=4, swap_ab=True, b_major="K", has_c=True)
    lay = layout_of(cfg)
    assert (lay.a.extent, lay.a.box, lay.a.tile_bytes) == (168, (64, 168), 168 * 128)
    assert lay.stage_bytes % 1024 == 0 and lay.out_box == (64, 168) and lay.acc_regs == 84
    src = render(cfg)
    assert "wgmma.mma_async.sync.aligned.m64n168k16.f32.bf16.bf16" in src
    # ten steps of 16 rows of D, then the last 8 as two 8x8 matrices (C read back the same way)
    assert "for (u32 j = 0; j < BLOCK_N / 16; ++j)" in src
    assert "stmatrix.sync.aligned.m8n8.x2.trans.shared.b16" in src and "ldmatrix.sync.aligned.m8n8.x2.trans" in src
    assert "const float* d = &acc[p][BLOCK_N / 2 - 4];" in src
    # widths that are multiples of 16 render exactly as before: no x2 helpers
    assert "x2.trans" not in render(dataclasses.replace(cfg, block_n=176))
    for bad in (dict(a_major="M"), dict(swap_ab=False, b_major="N")):  # wgmma's N side must be K-major
        problems = structural_problems(dataclasses.replace(cfg, **bad))
        assert any("not a multiple of 16) needs a K-major operand on wgmma's N side" in p for p in problems), bad
    problems = structural_problems(dataclasses.replace(cfg, swap_ab=False, out_direct=True))
    assert any("unswapped stores the output with TMA, not out_direct" in p for p in problems)
    assert not structural_problems(dataclasses.replace(cfg, out_direct=True))  # swapped: boxes of 64 columns
    # unswapped (B K-major): D's 168 columns are staged and stored as one unswizzled box
    plain = layout_of(dataclasses.replace(cfg, swap_ab=False))
    assert (plain.out_swizzle, plain.out_piece_cols, plain.num_out_pieces, plain.out_bufs) == (0, 168, 1, 1)
    assert (plain.b.box, plain.acc_regs) == ((64, 168), 84)
    # an fp32 row is boxed by 8 columns (32 bytes) as any fp32 tile's
    wide = layout_of(dataclasses.replace(cfg, swap_ab=False, has_c=False, out_dtype="fp32"))
    assert (wide.out_swizzle, wide.out_piece_cols) == (32, 8)
    # a pair sharing the user's A (K-major, 168 rows): halves of 84 rows would not be whole 8-row
    # swizzle atoms, so each CTA loads 88 (rows 0 and 80), both landing in both CTAs
    pair = layout_of(dataclasses.replace(cfg, cluster_size=2, multicast="A"))
    assert (pair.a.box, pair.a.step, pair.a.step_bytes, pair.a.pieces_per_rank) == ((64, 88), 80, 80 * 128, 1)
    assert pair.a.tx_bytes == 2 * 88 * 128 and pair.a.tile_bytes == 168 * 128
    src = render(dataclasses.replace(cfg, cluster_size=2, multicast="A"))
    assert "const int mn = n0 + p * 80;" in src and "p * 10240;" in src
    # whole halves keep their pieces back to back (and render as before)
    even = layout_of(dataclasses.replace(cfg, block_n=176, cluster_size=2, multicast="A")).a
    assert (even.box, even.step, even.step_bytes, even.piece_step) == ((64, 88), 88, 88 * 128, 0)
