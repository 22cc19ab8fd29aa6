"""CPU tests of the decode kernels for unaligned weights (jitgemm/decode.py): when each runs,
their grids, their parameter block, the kernels as NVRTC compiles them, and emulations of their
addressing (every lane's loads, shuffles, realignments and tensor-core fragments, and the partial
sums' layout) against NumPy."""

import ctypes
import re

import numpy as np
import pytest

from jitgemm import api, compiler, decode
from jitgemm.arrays import View
from jitgemm.problem import MAX_DIM
from jitgemm.sass import find_tool, inspect_cubin

needs_cuobjdump = pytest.mark.skipif(find_tool("cuobjdump") is None, reason="needs cuobjdump (nvidia wheels)")


def view(shape, strides, ptr=1 << 20, dtype="bf16"):
    return View(None, None, ptr, shape, strides, dtype, 2, 0)


ROWS, COLS = decode.ROWS, decode.COLS


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (view((1, 4096), (4096, 1)), view((4096, 50257), (50257, 1)), ROWS),  # odd N
        (view((2, 4096), (1, 2)), view((4096, 48), (49, 1)), ROWS),  # a transposed; padded rows of b
        (view((1, 64), (64, 1)), view((64, 64), (64, 1), ptr=(1 << 20) + 2), ROWS),  # misaligned base
        (view((4, 4096), (1, 4)), view((4096, 50257), (50257, 1)), ROWS),
        (view((5, 4096), (4096, 1)), view((4096, 50257), (50257, 1)), None),  # M = 5: the staged GEMM
        (view((1, 4096), (4096, 1)), view((4096, 50256), (50256, 1)), None),  # TMA reads b
        (view((1, 63), (63, 1)), view((63, 9), (1, 63)), COLS),  # W.t() of odd K
        (view((16, 4100), (4100, 1)), view((4100, 9), (1, 4100)), COLS),  # K a multiple of 4
        (view((3, 64), (1, 3)), view((64, 9), (1, 72), ptr=(1 << 20) + 6), COLS),  # misaligned W
        (view((17, 63), (63, 1)), view((63, 9), (1, 63)), None),  # M = 17: the staged GEMM
        (view((1, 64), (64, 1)), view((64, 9), (1, 64)), None),  # TMA reads W.t()
        (view((1, 64), (64, 1)), view((64, 9), (18, 2)), None),  # no unit stride
        (view((1, 64), None), view((64, 9), (9, 1)), None),  # a's rows do not fold
        (view((1, 64), (64, 1)), view((64, 9), (9, 1), ptr=(1 << 20) + 1), None),  # not element-aligned
        (view((1, 63), (63, 1)), view((63, 9), (1, 63), ptr=(1 << 20) + 1), None),
    ],
)
def test_a_kernel_runs_a_few_rows_against_a_weight_tma_cannot_read(a, b, expected):
    b_major, b_copy = api._operand_major(b)
    assert decode.decoder_for(a, b, b_major, b_copy) is expected


@pytest.mark.parametrize("w_t", [False, True], ids=["row-major b", "W.t()"])
def test_host_arrays_run_the_gemm_on_their_aligned_uploads(monkeypatch, w_t):
    """NumPy operands are uploaded into aligned rows (api._gemm_host), so the GEMM reads them:
    no decoder, and a config to run."""
    from jitgemm.arrays import describe
    from jitgemm.heuristics import DeviceSpec

    monkeypatch.setattr(api, "device_spec", lambda ordinal: DeviceSpec("sm_90a", 132))
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    m, n, k = 2, 1001, 517
    a = np.zeros((m, k), np.float16)
    b = np.zeros((n, k), np.float16).T if w_t else np.zeros((k, n), np.float16)
    va, vb = describe(a, "a"), describe(b, "b")
    b_major, b_copy = api._operand_major(vb)
    assert decode.decoder_for(va, vb, b_major, b_copy) is (COLS if w_t else ROWS)  # on a device, it would run
    d = api._Decision(va, vb, None, None, m, n, k, "fp16", 1.0, None, 0, staged=True)
    assert d.decode is None and d.cfg.b_major == ("K" if w_t else "N")


def test_outputs_are_written_in_place_at_any_strides_but_unfolded_ones():
    assert decode.writes_in_place(None)
    assert decode.writes_in_place(view((2, 9), (1, 2)))  # column-major
    assert decode.writes_in_place(view((2, 9), (13, 1), ptr=(1 << 20) + 6))
    assert not decode.writes_in_place(view((2, 9), None))
    assert not decode.writes_in_place(view((2, 9), (9, 1), ptr=(1 << 20) + 1))


@pytest.mark.parametrize("decoder", [ROWS, COLS], ids=["rows", "cols"])
@pytest.mark.parametrize("n", [1, 3, 64, 248, 249, 4097, 16332, 50257, 151655])
@pytest.mark.parametrize("k", [1, 7, 17, 960, 4096, 14336])
def test_the_grid_gives_every_row_to_one_split_of_whole_granules(decoder, n, k):
    s = decoder.split_for(n, k, 132)
    splits = s.groups * decode.WARPS_PER_BLOCK
    assert s.strips * decoder.strip >= n > (s.strips - 1) * decoder.strip
    assert s.rows % decoder.granule == 0
    assert splits * s.rows >= k > (splits - decode.WARPS_PER_BLOCK) * s.rows  # no group without rows
    assert s.blocks == s.strips * s.groups
    if s.groups > 1:  # K is split in more groups only to shorten the waves, in splits of at least min_split_rows
        assert s.rows >= decoder.min_split_rows
    slots = 132 * decode.BLOCKS_PER_SM
    if decoder.block_overhead is None:
        waves = -(-s.blocks // slots)
        assert s.blocks / (waves * slots) >= 0.75 or s.blocks <= slots  # full waves (or nearly), or a single one
    else:
        dearer = decoder._replace(block_overhead=decoder.block_overhead * 4).split_for(n, k, 132)
        assert dearer.groups <= s.groups  # a dearer block: never more of them


@pytest.mark.parametrize("decoder", [ROWS, COLS], ids=["rows", "cols"])
@pytest.mark.parametrize("n", [2, 64, 1000, 50257])
def test_the_last_split_ends_inside_32_bits_at_the_largest_k(decoder, n):
    s = decoder.split_for(n, MAX_DIM, 132)
    assert s.groups * decode.WARPS_PER_BLOCK * s.rows < 1 << 31  # (k0 + rows_per_split in the kernels)
    assert s.groups * decode.WARPS_PER_BLOCK * s.rows >= MAX_DIM


# ROWS fills the waves; COLS's counts are the fastest an H100 ran (session 28's sweep: every
# count of its held-out shapes and named shapes).
@pytest.mark.parametrize(
    "decoder, n, k, groups",
    [(ROWS, 50257, 4096, 5), (ROWS, 151655, 4096, 3), (ROWS, 1001, 2049, 17), (ROWS, 32001, 4096, 2)]
    + [(COLS, 4144, 14084, 4), (COLS, 14336, 4095, 1), (COLS, 122931, 647, 1), (COLS, 2406, 14805, 6)]
    + [(COLS, 10512, 5428, 3), (COLS, 39639, 3874, 2), (COLS, 5279, 9393, 3), (COLS, 11008, 4100, 3)],
)
def test_the_group_count_is_the_fastest_measured(decoder, n, k, groups):
    assert decoder.split_for(n, k, 132).groups == groups


def test_the_split_cost_counts_waves_of_a_blocks_bytes_and_overhead():
    # 1x14336x4095: 224 strips of 64 columns, 264 slots on 132 SMs
    assert COLS.split_cost(14336, 4095, 132, 1, 43_000) == 1 * (64 * 4095 * 2 + 43_000)  # one wave, all of K a block
    assert COLS.split_cost(14336, 4095, 132, 8, 43_000) == 7 * (64 * 8 * 64 * 2 + 43_000)  # 1792 blocks of 512 rows
    assert COLS.split_rows(4095, 8) == 64 and COLS.split_rows(4095, 1) == 512
    assert COLS.group_counts(4095) == [1, 2, 3, 4, 6, 8]  # 8 splits of at least 64 rows a group


def test_fewer_groups_where_blocks_stream_much():
    # many strips: one wave of long blocks beats more waves of shorter ones
    assert COLS.split_for(14336, 4095, 132).groups < COLS._replace(block_overhead=0).split_for(14336, 4095, 132).groups


@pytest.mark.parametrize("m, rows", [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_the_rows_kernel_sums_one_two_or_four_rows(m, rows):
    assert ROWS.kernel_rows(m) == rows


@pytest.mark.parametrize("m, rows", [(1, 8), (8, 8), (9, 16), (16, 16)])
def test_the_cols_kernel_sums_one_or_two_n8_products(m, rows):
    assert COLS.kernel_rows(m) == rows


@pytest.mark.parametrize(
    "decoder, strip, constants",
    [
        (ROWS, 31 * 8, {"STRIP": "31 * 8", "ROWS_IN_FLIGHT": ROWS.granule, "MAX_M": ROWS.max_m}),
        (COLS, 64, {"STRIP": COLS.strip, "WINDOW": COLS.granule, "MAX_M": COLS.max_m}),
    ],
    ids=["rows", "cols"],
)
def test_the_host_uses_the_kernels_constants(decoder, strip, constants):
    source = decoder.kernel.source()
    assert decoder.strip == strip
    for name, value in constants.items():
        assert f"constexpr int {name} = {value};" in source
    assert f"constexpr int THREADS = {decode.THREADS};" in source
    assert f"__launch_bounds__(THREADS, {decode.BLOCKS_PER_SM}) {decoder.kernel.name}(" in source
    fields = re.search(r"struct DecodeArgs \{(.*?)\};", source, re.S).group(1)
    names = re.findall(r"(\w+)(?:,|;)", re.sub(r"//.*", "", fields))
    assert names == [name for name, _ in decode._DecodeArgs._fields_]


@needs_cuobjdump
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("decoder", [ROWS, COLS], ids=["rows", "cols"])
def test_the_kernel_compiles_without_spills_to_two_blocks_a_sm(decoder, arch):
    from test_staging import _kernel_params

    cubin = compiler.compile_cubin(decoder.kernel.source(), arch, name="decode.cu").cubin
    assert _kernel_params(cubin) == [(0, 0, ctypes.sizeof(decode._DecodeArgs))]
    report = inspect_cubin(cubin)
    assert not report.spills and report.registers <= 65536 // (decode.THREADS * 2)
    assert "LDG.E.128" in report.sass  # b's aligned 16-byte units
    if decoder is COLS:  # m16n8k16 products: 2 a window and block, per n8 product and input dtype
        assert report.mma_counts == {"HMMA": 2 * 4 * (1 + 2) * 2}


# ---- the rows kernel's addressing, emulated lane by lane -------------------------------------------
def _emulate(a: np.ndarray, b_mem: bytes, b_first: int, b_row: int, n: int) -> np.ndarray:
    """What decode_rows computes for a (M, K) against b (K, N), b[k, j] the 16-bit element at
    byte b_first + 2 * (k * b_row + j) of `b_mem` (whose other bytes lie outside the caller's
    allocation: a load that touches them fails), with the kernel's grid, loads, shuffles,
    realignment, element-wise fallback, partial-sum layout and reduction order."""
    m, k = a.shape
    s = ROWS.split_for(n, k, 132)
    end = b_first + 2 * ((k - 1) * b_row + n)

    def unit(at: int) -> bytes:
        assert b_first <= at and at + 16 <= end, "a load outside b's bytes"
        return b_mem[at : at + 16]

    def element(row: int, col: int) -> int:
        at = b_first + 2 * (row * b_row + col)
        return int.from_bytes(b_mem[at : at + 2], "little")

    rows = ROWS.kernel_rows(m)  # the kernel instance's (3 rows run the 4-row kernel, the fourth zero)
    a = np.concatenate([a, np.zeros((rows - m, k))])
    quads = rows * ROWS.strip // 4  # a group's sums, as the kernel lays them out (QUADS float4)
    partials = np.full((s.strips * s.groups * quads, 4), np.nan)
    out = np.full((m, n), np.nan)
    for strip in range(s.strips):
        strip_col = strip * ROWS.strip
        for group in range(s.groups):
            block_sums = np.zeros((decode.WARPS_PER_BLOCK, quads, 4))
            for warp in range(decode.WARPS_PER_BLOCK):
                split = group * decode.WARPS_PER_BLOCK + warp
                acc = np.zeros((32, rows, 8))
                for row in range(split * s.rows, min(k, (split + 1) * s.rows)):
                    at = b_first + 2 * (row * b_row + strip_col)
                    units = [(at & ~15) + 16 * lane for lane in range(32)]
                    whole = [b_first <= u and u + 16 <= end for u in units]
                    lo = [unit(u) if w else bytes(16) for u, w in zip(units, whole)]
                    for lane in range(31):
                        col0 = strip_col + 8 * lane
                        if whole[lane] and whole[lane + 1] and col0 + 8 <= n:
                            pair = lo[lane] + lo[lane + 1]
                            cols = np.frombuffer(pair[at & 15 :][:16], "<u2")
                        else:
                            cols = np.array([element(row, col0 + j) if col0 + j < n else 0 for j in range(8)])
                        acc[lane] += np.outer(a[:, row], _bf16_to_float(cols))
                for lane in range(31):
                    for mm in range(rows):
                        first = (mm * ROWS.strip + lane * 8) // 4
                        block_sums[warp, first : first + 2] = acc[lane, mm].reshape(2, 4)
            at = (strip * s.groups + group) * quads
            partials[at : at + quads] = block_sums.sum(axis=0)
        # the strip's last group adds the groups and writes the outputs
        strip_sums = partials[strip * s.groups * quads : (strip + 1) * s.groups * quads].reshape(s.groups, quads, 4)
        for q, sums in enumerate(strip_sums.sum(axis=0)):
            mm = q * 4 // ROWS.strip
            for j in range(4):
                col = strip_col + q * 4 % ROWS.strip + j
                if col < n and mm < m:
                    out[mm, col] = sums[j]
    return out


def _bf16_to_float(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize(
    "m, n, k, b_row, offset",
    [
        (1, 3, 5, 3, 0),
        (2, 9, 17, 9, 2),
        (1, 249, 40, 249, 14),  # two strips, the second of one column
        (2, 497, 33, 501, 6),  # padded rows, two strips plus one column
        (1, 250, 300, 250, 10),  # K split
        (2, 1023, 24, 1023, 4),
        (3, 300, 70, 301, 8),  # the 4-row kernel, its fourth row unused
        (4, 17, 129, 17, 12),
    ],
)
def test_the_emulated_kernel_reads_every_element_once_and_stays_inside_b(m, n, k, b_row, offset):
    rng = np.random.default_rng(7)
    b = rng.standard_normal((k, b_row), dtype=np.float32)
    b_bits = (b.view(np.uint32) >> 16).astype("<u2")  # truncated to bf16
    b_exact = _bf16_to_float(b_bits)[:, :n]
    # b's bytes at a 16-byte unit plus `offset`, with rows of b_row elements, the last row cut at n
    span = b_bits.tobytes()[: 2 * ((k - 1) * b_row + n)]
    b_mem = bytes(offset) + span + bytes(32)
    a = rng.standard_normal((m, k))
    got = _emulate(a, b_mem, offset, b_row, n)
    np.testing.assert_allclose(got, a @ b_exact, rtol=1e-12, atol=1e-12)


# ---- the cols kernel's addressing and fragments, emulated lane by lane ----------------------
def _mma_16x8x16(a_regs: list, b_regs: list) -> list:
    """What mma.sync.m16n8k16 (row.col) returns to each lane, given each lane's four A and two
    B registers (pairs of elements, the lower first), as the PTX ISA lays out the fragments:
    lane (g, t) holds A[g][2t..2t+1], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..], B[2t..2t+1][g],
    B[2t+8..2t+9][g], and gets D[g][2t..2t+1], D[g+8][2t..2t+1]."""
    a, b = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for reg, (row, col) in zip(a_regs[lane], ((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            a[row, col : col + 2] = reg
        for reg, row in zip(b_regs[lane], (2 * t, 2 * t + 8)):
            b[row : row + 2, g] = reg
    d = a @ b
    return [
        np.concatenate([d[lane // 4, 2 * (lane % 4) : 2 * (lane % 4) + 2], d[lane // 4 + 8, 2 * (lane % 4) :][:2]])
        for lane in range(32)
    ]


def _emulate_cols(a: np.ndarray, b_mem: bytes, b_first: int, b_row: int, n: int) -> np.ndarray:
    """What decode_cols computes for a (M, K) against b (K, N), b[k, j] the 16-bit element at
    byte b_first + 2 * (j * b_row + k) of `b_mem` (a load outside b's bytes fails), with the
    kernel's grid, loads, realignment, element-wise fallback, fragments, partial-sum layout and
    reduction order."""
    m, k = a.shape
    s = COLS.split_for(n, k, 132)
    end = b_first + 2 * ((n - 1) * b_row + k)
    strip_len, rows = COLS.strip, COLS.kernel_rows(m)

    def column_words(col: int, kk: int, k_end: int) -> np.ndarray:  # load_column + column_words
        at = b_first + 2 * (col * b_row + kk)
        unit, shift = at & ~15, at & 15
        if col < n and kk + 8 <= k_end and unit >= b_first and unit + (32 if shift else 16) <= end:
            return np.frombuffer(b_mem[unit : unit + 32][shift : shift + 16], "<u2")
        return np.array(
            [
                _element(b_mem, b_first + 2 * (col * b_row + kk + j)) if col < n and kk + j < k_end else 0
                for j in range(8)
            ]
        )

    partials = np.full((s.strips * s.groups, rows * strip_len), np.nan)
    out = np.full((m, n), np.nan)
    for strip in range(s.strips):
        for group in range(s.groups):
            block_sums = np.zeros((decode.WARPS_PER_BLOCK, rows * strip_len))
            warps = decode.WARPS_PER_BLOCK
            k0, k1 = group * warps * s.rows, min(k, (group + 1) * warps * s.rows)
            for warp in range(warps):
                acc = np.zeros((32, strip_len // 16, rows // 8, 4))
                for kw in range(k0 + warp * COLS.granule, k1, warps * COLS.granule):  # the warps' windows in turn
                    words = {}  # (lane, block, 0 or 8) -> the column's 8 elements as floats
                    act = {}  # (lane, h) -> a's 8 elements
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        kk = kw + 8 * t
                        for h in range(rows // 8):
                            r = 8 * h + g
                            act[lane, h] = np.array([a[r, kk + j] if r < m and kk + j < k1 else 0.0 for j in range(8)])
                        for j in range(strip_len // 16):
                            for i in (0, 8):
                                col = strip * strip_len + 16 * j + g + i
                                words[lane, j, i] = _bf16_to_float(column_words(col, kk, k1))
                    for j in range(strip_len // 16):
                        for h in range(rows // 8):
                            for half in (0, 1):  # k = 8t + 4 * half + 0..3
                                e = slice(4 * half, 4 * half + 4)
                                a_regs = [
                                    [
                                        words[lane, j, 0][e][:2],
                                        words[lane, j, 8][e][:2],
                                        words[lane, j, 0][e][2:],
                                        words[lane, j, 8][e][2:],
                                    ]
                                    for lane in range(32)
                                ]
                                b_regs = [[act[lane, h][e][:2], act[lane, h][e][2:]] for lane in range(32)]
                                for lane, d in enumerate(_mma_16x8x16(a_regs, b_regs)):
                                    acc[lane, j, h] += d
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    for j in range(strip_len // 16):
                        for h in range(rows // 8):
                            for r in range(4):
                                row, col = 8 * h + 2 * t + r % 2, 16 * j + g + 8 * (r // 2)
                                block_sums[warp, row * strip_len + col] = acc[lane, j, h, r]
            partials[strip * s.groups + group] = block_sums.sum(axis=0)
        # the strip's last group adds the groups and writes the outputs
        sums = partials[strip * s.groups : (strip + 1) * s.groups].sum(axis=0)
        for q, v in enumerate(sums):
            row, col = q // strip_len, strip * strip_len + q % strip_len
            if row < m and col < n:
                out[row, col] = v
    return out


def _element(mem: bytes, at: int) -> int:
    return int.from_bytes(mem[at : at + 2], "little")


@pytest.mark.parametrize(
    "m, n, k, b_row, offset",
    [
        (1, 3, 5, 5, 0),  # one window, element-wise (K < 8)
        (2, 17, 41, 41, 2),  # odd K: columns start at every offset
        (8, 70, 100, 103, 6),  # padded columns, two strips
        (9, 20, 300, 301, 14),  # two n8 products; K split
        (16, 33, 77, 77, 4),
        (5, 130, 64, 64, 10),  # K a multiple of 8 in a misaligned view
        (4, 40, 56, 57, 2),  # K ends 24 elements into the last window (its last lane reads none)
        (3, 24, 1500, 1503, 6),  # K split over three groups of 8 splits
    ],
)
def test_the_emulated_cols_kernel_sums_every_product_once_and_stays_inside_b(m, n, k, b_row, offset):
    rng = np.random.default_rng(11)
    w = rng.standard_normal((n, b_row), dtype=np.float32)  # W (N, K), b = W.t()
    w_bits = (w.view(np.uint32) >> 16).astype("<u2")  # truncated to bf16
    b_exact = _bf16_to_float(w_bits)[:, :k].T
    span = w_bits.tobytes()[: 2 * ((n - 1) * b_row + k)]
    b_mem = bytes(offset) + span + bytes(32)
    a = _bf16_to_float((rng.standard_normal((m, k), dtype=np.float32).view(np.uint32) >> 16).astype("<u2"))
    got = _emulate_cols(a, b_mem, offset, b_row, n)
    np.testing.assert_allclose(got, a @ b_exact, rtol=1e-12, atol=1e-12)
