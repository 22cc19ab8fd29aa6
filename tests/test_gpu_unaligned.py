"""Outputs TMA cannot address (issue 20): odd N, misaligned bases and row strides. sm_90a kernels
store D and read C in place with st.global / ld.global (KernelConfig.out_direct), in runs as
wide as the alignment allows; nothing is copied and nothing outside the output is written.
Every result against a float64 reference, into NaN-poisoned outputs with guard bands."""

import dataclasses
import warnings

import pytest
from gpu_helpers import assert_close, latin_shapes, padded_operand, random_operand, torch_dtype

import jitgemm
from jitgemm import api, staging
from jitgemm.problem import Problem

pytestmark = pytest.mark.gpu

ODD = [3, 5, 7, 9, 33, 1023, 2049]
# Every odd size on every axis, plus shapes where each persistent CTA runs several tiles.
SHAPES = latin_shapes(ODD) + [(4099, 3001, 515), (2049, 9, 2049)]
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
LAYOUT_IDS = ["".join(x[0] for x in lay) for lay in LAYOUTS]


@pytest.fixture(scope="module")
def gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(2020)


def framed(m, n, dtype, offset, pad):
    """A NaN frame and an (m, n) window in it starting `offset` elements into a row of
    n + pad elements: a base and row stride as misaligned as offset and pad make them."""
    import torch

    frame = torch.full((m + 2, n + pad), float("nan"), device="cuda", dtype=torch_dtype(dtype))
    return frame, (slice(1, m + 1), slice(offset, offset + n))


def outside_untouched(frame, window) -> bool:
    import torch

    inside = torch.zeros(frame.shape, dtype=torch.bool, device=frame.device)
    inside[window] = True
    return bool(torch.isnan(frame[~inside].float()).all())


def gemm_no_output_copy(*args, **kw):
    """gemm, failing if it copies out or c through an aligned buffer (operands may still be
    copied): every buffer gemm makes for a copy is made by api._aligned, named by argument."""
    made = []
    aligned = api._aligned

    def recording(lib, rows, cols, major, dtype, dev, stream, argname, zero):
        made.append(argname)
        return aligned(lib, rows, cols, major, dtype, dev, stream, argname, zero)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "_aligned", recording)
        res = jitgemm.gemm(*args, **kw)
    assert not {"out", "c"} & set(made), made
    return res


@pytest.mark.parametrize("with_c", [False, True], ids=["noC", "C"])
@pytest.mark.parametrize("out_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_odd_sizes_every_layout(shape, layout, out_dtype, with_c, gen):
    import torch

    m, n, k = shape
    a = random_operand(m, k, "bf16", layout[0], gen)
    b = random_operand(k, n, "bf16", layout[1], gen)
    c = random_operand(m, n, out_dtype, "row", gen) if with_c else None
    kw = dict(c=c, beta=-0.5) if with_c else {}
    # 1) a result jitgemm allocates: N odd, rows of 2N (or 4N) bytes
    fresh = gemm_no_output_copy(a, b, out_dtype=torch_dtype(out_dtype), **kw)
    assert fresh.shape == (m, n)
    # 2) a window of a NaN frame, base 3 elements in, row stride odd
    frame, window = framed(m, n, out_dtype, 3, 11)
    out = frame[window]
    res = gemm_no_output_copy(a, b, out, **kw)
    torch.cuda.synchronize()
    assert res is out
    assert outside_untouched(frame, window), "the kernel wrote outside the output"
    assert_close(fresh, a, b, out_dtype, c=c, beta=-0.5)
    assert_close(out, a, b, out_dtype, c=c, beta=-0.5)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(1023, 2049, 33), (9, 33, 1023), (2049, 3, 7)], ids=str)
def test_fp16_and_offsets_of_c(shape, dtype, gen):
    """C misaligned differently from out (each run width chosen per matrix)."""
    import torch

    m, n, k = shape
    a, b = random_operand(m, k, dtype, "row", gen), random_operand(k, n, dtype, "col", gen)
    c_frame, c_window = framed(m, n, dtype, 1, 5)
    c_frame[c_window] = random_operand(m, n, dtype, "row", gen)
    frame, window = framed(m, n, dtype, 2, 7)
    res = gemm_no_output_copy(a, b, frame[window], c=c_frame[c_window], beta=2.0)
    torch.cuda.synchronize()
    assert outside_untouched(frame, window)
    assert_close(res, a, b, dtype, c=c_frame[c_window], beta=2.0)


@pytest.mark.parametrize("out_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("offset", [1, 2, 4, 8])
def test_run_widths(offset, out_dtype, gen):
    """N and the row stride multiples of 8 elements, the base `offset` elements in: runs of 2,
    4, 8 or 16 bytes (16-bit) and 4, 8, 16 (fp32)."""
    import torch

    m, n, k = 777, 264, 520
    a, b = random_operand(m, k, "bf16", "row", gen), random_operand(k, n, "bf16", "row", gen)
    c_frame, c_window = framed(m, n, out_dtype, offset, 16)
    c_frame[c_window] = random_operand(m, n, out_dtype, "row", gen)
    frame, window = framed(m, n, out_dtype, offset, 16)
    res = gemm_no_output_copy(a, b, frame[window], c=c_frame[c_window], beta=0.75)
    torch.cuda.synchronize()
    assert outside_untouched(frame, window)
    assert_close(res, a, b, out_dtype, c=c_frame[c_window], beta=0.75)


# Each knob of the epilogue with out_direct, on a shape where each CTA runs several tiles.
PLAIN = dict(swap_ab=False, b_tail=False, a_rows=0, split_k=1, cluster_size=1, multicast="none", num_stages=3)
KNOBS = {
    "swap_ab": {**PLAIN, "swap_ab": True, "block_m": 128, "block_n": 64, "num_consumers": 2},
    "split_k": {**PLAIN, "block_m": 64, "block_n": 128, "num_consumers": 1, "split_k": 3},
    "ring": {**PLAIN, "block_m": 128, "block_n": 256, "num_consumers": 2, "num_stages": 4},
    "pair_A": {**PLAIN, "block_m": 128, "block_n": 128, "num_consumers": 2, "cluster_size": 2, "multicast": "A"},
    "pair_B": {**PLAIN, "block_m": 128, "block_n": 128, "num_consumers": 2, "cluster_size": 2, "multicast": "B"},
    "b_tail": {**PLAIN, "block_m": 128, "block_n": 144, "num_consumers": 2, "b_tail": True},
}


# swap_ab takes no C; with C each store box has a buffer of its own (no ring).
KNOB_CASES = [(knob, c) for knob in sorted(KNOBS) for c in (False, True) if not (c and knob in ("swap_ab", "ring"))]


@pytest.mark.parametrize("knob, with_c", KNOB_CASES, ids=[f"{k}-{'C' if c else 'noC'}" for k, c in KNOB_CASES])
def test_epilogue_knobs(knob, with_c, gen):
    import torch

    m, n, k = (301, 4099, 1543) if knob == "swap_ab" else (2049, 3001, 1543)
    problem = Problem(m, n, k, "bf16", a_major="K", b_major="N", has_c=with_c, aligned_out=False)
    cfg = dataclasses.replace(api.config_for(problem), group_size=8, raster="m", **KNOBS[knob])
    assert cfg.out_direct
    a, b = random_operand(m, k, "bf16", "row", gen), random_operand(k, n, "bf16", "row", gen)
    c = random_operand(m, n, "bf16", "row", gen) if with_c else None
    frame, window = framed(m, n, "bf16", 1, 3)
    res = jitgemm.gemm(a, b, frame[window], c=c, beta=1.5, config=cfg)
    torch.cuda.synchronize()
    assert outside_untouched(frame, window)
    assert_close(res, a, b, "bf16", c=c, beta=1.5)


def test_seen_problem_with_new_unaligned_outputs(gen):
    """The lean path: a problem seen before, new outputs at other misalignments."""
    import torch

    m, n, k = 513, 1001, 777
    a, b = random_operand(m, k, "bf16", "row", gen), random_operand(k, n, "bf16", "row", gen)
    frame, window = framed(m, n, "bf16", 1, 9)
    jitgemm.gemm(a, b, frame[window])
    for offset in (1, 2, 5, 1):
        a2, b2 = random_operand(m, k, "bf16", "row", gen), random_operand(k, n, "bf16", "row", gen)
        frame, window = framed(m, n, "bf16", offset, 9)
        res = gemm_no_output_copy(a2, b2, frame[window])
        fresh = gemm_no_output_copy(a2, b2)
        torch.cuda.synchronize()
        assert outside_untouched(frame, window)
        assert_close(res, a2, b2, "bf16")
        assert_close(fresh, a2, b2, "bf16")


def test_unaligned_benchmark_smoke(tmp_path):
    """examples/unaligned.py --smoke in a fresh process: three pairs (one a decode, decode.py),
    each result checked first."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from child_process import child_pythonpath

    script = Path(__file__).resolve().parent.parent / "examples" / "unaligned.py"
    report = tmp_path / "unaligned.json"
    done = subprocess.run(
        [sys.executable, str(script), "--smoke", "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=child_pythonpath()),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = json.loads(report.read_text())["rows"]
    assert len(rows) == 3
    for row in rows:
        assert row["jitgemm_us"] > 0 and row["aligned_us"] > 0 and row["cublas_us"] > 0
        assert ("decode" if row["unaligned"][0] <= 2 else "_od") in row["config"]


RAGGED = [(1000, 1539, 1021), (129, 4099, 2047), (777, 93, 515), (5, 300, 77), (1, 3, 1), (7, 3, 2)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape", RAGGED, ids=[f"{m}x{n}x{k}" for m, n, k in RAGGED])
def test_ragged_rows_in_padded_rows_are_read_in_place(shape, layout, gen):
    """Operands whose rows end mid-unit in rows padded to whole units (slices of wider arrays)
    are read by TMA in place: no staging, no copy, no warning; the NaN past each row end never
    reaches the result (TMA loads the elements past the extent as zeros)."""
    import torch

    m, n, k = shape
    a = padded_operand(m, k, layout[0], gen)
    b = padded_operand(k, n, layout[1], gen)
    launches = []
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("error", jitgemm.FallbackCopyWarning)
        real = staging.StageLaunch.launch
        mp.setattr(staging.StageLaunch, "launch", lambda self, *args: (launches.append(args), real(self, *args)))
        mp.setattr(api, "_copy_in", lambda view, major, argname, *rest: pytest.fail(f"{argname} was copied"))
        out = jitgemm.gemm(a, b, out_dtype=torch.float32)
    torch.cuda.synchronize()
    assert not launches
    assert_close(out, a, b, "fp32")
