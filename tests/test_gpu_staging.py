"""Operands TMA cannot read in place (issue 20), staged by the copy kernel (jitgemm/staging.py)
into the launch's workspace: no buffer allocated per call, padding written as zeros, reused
across calls and new arrays (the lean path), owned by the graph in a capture, beside split-K's
scratch in one workspace. Every result against a float64 reference, into NaN-poisoned outputs."""

import warnings

import pytest
from gpu_helpers import assert_close, guard_untouched, guarded_out, random_operand

import jitgemm
from jitgemm import api, launch, runtime

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(2021)


def gemm_staged(*args, **kw):
    """gemm, failing if any operand is copied by its library (api._aligned makes those buffers)."""
    made = []
    aligned = api._aligned

    def recording(lib, rows, cols, major, dtype, dev, stream, argname, zero):
        made.append(argname)
        return aligned(lib, rows, cols, major, dtype, dev, stream, argname, zero)

    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore", jitgemm.FallbackCopyWarning)
        mp.setattr(api, "_aligned", recording)
        res = jitgemm.gemm(*args, **kw)
    assert not {"a", "b"} & set(made), f"copied by the library: {made}"
    return res


def check_staged(m, n, k, layout, gen):
    """One staged gemm of fresh operands (`layout`: A then B, "r" row-major, "c" a transposed
    view) into a guarded, NaN-poisoned output, checked against float64."""
    import torch

    a = random_operand(m, k, "bf16", "row" if layout[0] == "r" else "col", gen)
    b = random_operand(k, n, "bf16", "row" if layout[1] == "r" else "col", gen)
    buf, out = guarded_out(m, n, "bf16")
    gemm_staged(a, b, out=out)
    torch.cuda.synchronize()
    assert_close(out, a, b, "bf16")
    assert guard_untouched(buf, m, n)


def _staged_regions(stream: int) -> list:
    """(pointer, bytes) of the stream's staged-operand regions."""
    ws = launch._workspace(0, stream)
    pointers = launch._region_pointers(ws.ptr, ws.sizes)
    return [(pointers[launch.REGIONS.index(r)], ws.sizes[launch.REGIONS.index(r)]) for r in ("staged_a", "staged_b")]


@pytest.mark.parametrize("layout", ["rr", "rc", "cr", "cc"])
def test_padding_is_written_whatever_the_workspace_held(gen, layout):
    """Odd K in every layout: the staged rows' last 16-byte unit is part padding, which TMA may
    read; with the workspace filled with NaN between calls, results stay exact."""
    import torch
    from cuda.bindings import driver

    stream = torch.cuda.current_stream().cuda_stream
    m, n, k = 300, 260, 1001
    for _ in range(2):
        check_staged(m, n, k, layout, gen)
        for ptr, nbytes in _staged_regions(stream):  # NaN (0xFFFF) over everything staged
            if nbytes:
                runtime.check(driver.cuMemsetD16Async(ptr, 0xFFFF, nbytes // 2, driver.CUstream(stream)), "memset")
        torch.cuda.synchronize()


@pytest.mark.parametrize(
    "m, n, k, layout",
    [
        (1, 70, 19143, "rr"),  # B: 19143 rows of 9 units, several rows per block
        (6, 1040, 6640, "cc"),  # A: 6640 rows of one unit (M-major, M = 6)
        (7, 23412, 494, "rr"),  # B: rows of 2927 units, several blocks across a row
        (300, 33, 2049, "cr"),  # both staged, rows of 38 and 5 units
    ],
)
def test_narrow_and_wide_rows(gen, m, n, k, layout):
    """Each operand's own part of the staging grid: rows narrower than a block share it, rows
    wider than a block span several; every row and unit lands once (the result is exact)."""
    check_staged(m, n, k, layout, gen)


def test_new_arrays_reuse_the_plan_and_the_workspace(gen):
    """A served layer with an odd hidden size: new arrays each call, one plan, no allocations."""
    import torch

    m, n, k = 515, 4096, 2049
    w = random_operand(n, k, "bf16", "row", gen)
    gemm_staged(random_operand(m, k, "bf16", "row", gen), w.t())
    plans = len(api._plans)
    for _ in range(3):
        x = random_operand(m, k, "bf16", "row", gen)
        res = gemm_staged(x, w.t())
        torch.cuda.synchronize()
        assert_close(res, x, w.t(), "bf16")
    assert len(api._plans) == plans


def test_split_k_and_staging_share_the_workspace(gen, monkeypatch):
    """Few tiles and a long odd K (the heuristics split K): split-K's partials and counters and
    both staged operands in one workspace."""
    import torch

    monkeypatch.setattr(api, "_plans", {})
    m, n, k = 129, 4097, 8191
    for _ in range(2):
        a = random_operand(m, k, "bf16", "row", gen)
        b = random_operand(n, k, "bf16", "row", gen).t()
        buf, out = guarded_out(m, n, "bf16")
        gemm_staged(a, b, out=out)
        torch.cuda.synchronize()
        assert_close(out, a, b, "bf16")
        assert guard_untouched(buf, m, n)
    (plan,) = api._plans.values()
    assert plan.call.cfg.split_k > 1 and plan.call.stage is not None


def test_a_captured_graph_stages_what_its_inputs_hold_at_replay(gen):
    import torch

    m, n, k = 257, 1000, 777
    a = random_operand(m, k, "bf16", "row", gen)
    b = random_operand(k, n, "bf16", "row", gen)
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    gemm_staged(a, b, out=out)  # warm-up: kernels loaded before the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        gemm_staged(a, b, out=out)
    for _ in range(2):
        a.copy_(random_operand(m, k, "bf16", "row", gen))
        b.copy_(random_operand(k, n, "bf16", "row", gen))
        out.fill_(float("nan"))
        graph.replay()
        # an eager call between replays stages into its own stream's workspace
        other = gemm_staged(random_operand(m, k, "bf16", "row", gen), b)
        torch.cuda.synchronize()
        assert_close(out, a, b, "bf16")
        assert other.shape == (m, n)


def test_threads_on_their_own_streams(gen):
    import threading

    import torch

    shapes = [(300, 1001, 517), (77, 2049, 1023), (1025, 513, 3001)]
    errors = []

    def work(i, shape):
        try:
            m, n, k = shape
            g = torch.Generator(device="cuda").manual_seed(300 + i)
            with torch.cuda.stream(torch.cuda.Stream()):
                for _ in range(3):
                    a = random_operand(m, k, "bf16", "row", g)
                    b = random_operand(k, n, "bf16", "col", g)
                    res = gemm_staged(a, b)
                    torch.cuda.current_stream().synchronize()
                    assert_close(res, a, b, "bf16")
        except BaseException as exc:
            errors.append((shape, exc))

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(shapes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
