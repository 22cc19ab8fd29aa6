"""CPU tests of the decode kernel for unaligned weights (jitgemm/decode.py): when it runs, its
grid, its parameter block, the kernel as NVRTC compiles it, and an emulation of its addressing
(every lane's loads, shuffles and realignments, and the partial sums' layout) against NumPy."""

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


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (view((1, 4096), (4096, 1)), view((4096, 50257), (50257, 1)), True),  # odd N
        (view((2, 4096), (1, 2)), view((4096, 48), (49, 1)), True),  # a transposed; padded rows of b
        (view((1, 64), (64, 1)), view((64, 64), (64, 1), ptr=(1 << 20) + 2), True),  # misaligned base
        (view((4, 4096), (1, 4)), view((4096, 50257), (50257, 1)), True),
        (view((5, 4096), (4096, 1)), view((4096, 50257), (50257, 1)), False),  # M = 5: the staged GEMM
        (view((1, 4096), (4096, 1)), view((4096, 50256), (50256, 1)), False),  # TMA reads b
        (view((1, 64), (64, 1)), view((64, 9), (1, 64)), False),  # b K-major (W.t()): not rows along N
        (view((1, 64), (64, 1)), view((64, 9), (18, 2)), False),  # no unit stride
        (view((1, 64), None), view((64, 9), (9, 1)), False),  # a's rows do not fold
        (view((1, 64), (64, 1)), view((64, 9), (9, 1), ptr=(1 << 20) + 1), False),  # not element-aligned
    ],
)
def test_the_kernel_runs_a_few_rows_against_a_weight_tma_cannot_read(a, b, expected):
    b_major = 1 if b.strides is not None and b.strides[1] == 1 else 0
    tma_ready = b_major == 1 and b.strides[0] * 2 % 16 == 0 and b.ptr % 16 == 0
    assert decode.reads_in_place(a, b, b_major, not tma_ready) == expected


def test_host_arrays_run_the_gemm_on_their_aligned_uploads(monkeypatch):
    """NumPy operands are uploaded into aligned rows (api._gemm_host), so the GEMM reads them:
    no decode kernel, and a config to run (before: AttributeError for a <= 4 rows of a
    against a row-major b of odd N)."""
    from jitgemm.arrays import describe
    from jitgemm.heuristics import DeviceSpec

    monkeypatch.setattr(api, "device_spec", lambda ordinal: DeviceSpec("sm_90a", 132))
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    m, n, k = 2, 1001, 517
    va, vb = describe(np.zeros((m, k), np.float16), "a"), describe(np.zeros((k, n), np.float16), "b")
    b_major, b_copy = api._operand_major(vb)
    assert decode.reads_in_place(va, vb, b_major, b_copy)  # on a device, it would run
    d = api._Decision(va, vb, None, None, m, n, k, "fp16", 1.0, None, 0, staged=True)
    assert not d.decode and d.cfg.b_major == "N"


def test_outputs_are_written_in_place_at_any_strides_but_unfolded_ones():
    assert decode.writes_in_place(None)
    assert decode.writes_in_place(view((2, 9), (1, 2)))  # column-major
    assert decode.writes_in_place(view((2, 9), (13, 1), ptr=(1 << 20) + 6))
    assert not decode.writes_in_place(view((2, 9), None))
    assert not decode.writes_in_place(view((2, 9), (9, 1), ptr=(1 << 20) + 1))


@pytest.mark.parametrize("n", [1, 3, 248, 249, 4097, 16332, 50257, 151655])
@pytest.mark.parametrize("k", [1, 7, 17, 960, 4096, 14336])
def test_the_grid_gives_every_row_to_one_split_of_whole_row_groups(n, k):
    s = decode.split_for(n, k, 132)
    splits = s.groups * decode.WARPS_PER_BLOCK
    assert s.strips * decode.STRIP >= n > (s.strips - 1) * decode.STRIP
    assert s.rows % decode.ROWS_IN_FLIGHT == 0
    assert splits * s.rows >= k > (splits - decode.WARPS_PER_BLOCK) * s.rows  # no group without rows
    assert s.blocks == s.strips * s.groups
    if s.groups > 1:  # K is split in more groups only to fill the waves, in splits of at least MIN_SPLIT_ROWS
        assert s.rows >= decode.MIN_SPLIT_ROWS
    slots = 132 * decode.BLOCKS_PER_SM
    waves = -(-s.blocks // slots)
    fill = s.blocks / (waves * slots)
    assert fill >= 0.75 or s.blocks <= slots  # full waves (or nearly), or a single one


@pytest.mark.parametrize("n", [2, 64, 1000, 50257])
def test_the_last_split_ends_inside_32_bits_at_the_largest_k(n):
    s = decode.split_for(n, MAX_DIM, 132)
    assert s.groups * decode.WARPS_PER_BLOCK * s.rows < 1 << 31  # (k0 + rows_per_split in the kernel)
    assert s.groups * decode.WARPS_PER_BLOCK * s.rows >= MAX_DIM


@pytest.mark.parametrize("n, k, groups", [(50257, 4096, 5), (151655, 4096, 3), (1001, 2049, 17), (32001, 4096, 2)])
def test_groups_fill_the_waves(n, k, groups):
    assert decode.split_for(n, k, 132).groups == groups


def _source() -> str:
    return decode.KERNEL.source()


def test_the_host_uses_the_kernels_constants():
    source = _source()
    assert "constexpr int STRIP = 31 * 8;" in source and decode.STRIP == 31 * 8
    assert f"constexpr int ROWS_IN_FLIGHT = {decode.ROWS_IN_FLIGHT};" in source
    assert f"constexpr int MAX_M = {decode.MAX_ROWS};" in source
    assert f"constexpr int THREADS = {decode.THREADS};" in source
    assert f"__launch_bounds__(THREADS, {decode.BLOCKS_PER_SM})" in source
    fields = re.search(r"struct DecodeArgs \{(.*?)\};", source, re.S).group(1)
    names = re.findall(r"(\w+)(?:,|;)", re.sub(r"//.*", "", fields))
    assert names == [name for name, _ in decode._DecodeArgs._fields_]


@needs_cuobjdump
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_the_kernel_compiles_without_spills_to_two_blocks_a_sm(arch):
    from test_staging import _kernel_params

    cubin = compiler.compile_cubin(_source(), arch, name="decode.cu").cubin
    assert _kernel_params(cubin) == [(0, 0, ctypes.sizeof(decode._DecodeArgs))]
    report = inspect_cubin(cubin)
    assert not report.spills and report.registers <= 65536 // (decode.THREADS * 2)
    assert "LDG.E.128" in report.sass  # b's aligned 16-byte units


# ---- the kernel's addressing, emulated lane by lane -------------------------------------------
def _emulate(a: np.ndarray, b_mem: bytes, b_first: int, b_row: int, n: int) -> np.ndarray:
    """What decode_rows computes for a (M, K) against b (K, N), b[k, j] the 16-bit element at
    byte b_first + 2 * (k * b_row + j) of `b_mem` (whose other bytes lie outside the caller's
    allocation: a load that touches them fails), with the kernel's grid, loads, shuffles,
    realignment, element-wise fallback, partial-sum layout and reduction order."""
    m, k = a.shape
    s = decode.split_for(n, k, 132)
    end = b_first + 2 * ((k - 1) * b_row + n)

    def unit(at: int) -> bytes:
        assert b_first <= at and at + 16 <= end, "a load outside b's bytes"
        return b_mem[at : at + 16]

    def element(row: int, col: int) -> int:
        at = b_first + 2 * (row * b_row + col)
        return int.from_bytes(b_mem[at : at + 2], "little")

    rows = decode.kernel_rows(m)  # the kernel instance's (3 rows run the 4-row kernel, the fourth zero)
    a = np.concatenate([a, np.zeros((rows - m, k))])
    quads = rows * decode.STRIP // 4  # a group's sums, as the kernel lays them out (QUADS float4)
    partials = np.full((s.strips * s.groups * quads, 4), np.nan)
    out = np.full((m, n), np.nan)
    for strip in range(s.strips):
        strip_col = strip * decode.STRIP
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
                        first = (mm * decode.STRIP + lane * 8) // 4
                        block_sums[warp, first : first + 2] = acc[lane, mm].reshape(2, 4)
            at = (strip * s.groups + group) * quads
            partials[at : at + quads] = block_sums.sum(axis=0)
        # the strip's last group adds the groups and writes the outputs
        strip_sums = partials[strip * s.groups * quads : (strip + 1) * s.groups * quads].reshape(s.groups, quads, 4)
        for q, sums in enumerate(strip_sums.sum(axis=0)):
            mm = q * 4 // decode.STRIP
            for j in range(4):
                col = strip_col + q * 4 % decode.STRIP + j
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
