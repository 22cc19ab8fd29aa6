"""Serving-grade dispatch on the GPU (issue 18): the lean path (a problem seen before, called with
new arrays, reuses its launch and patches only the addresses), N-D activations (..., K), and the
serving benchmark in smoke mode. Every result is compared elementwise with a float64 reference
on fresh random data, with NaN-poisoned outputs."""

import json
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from gpu_helpers import assert_close, guard_untouched, guarded_out, nan_full, random_operand

import jitgemm
from jitgemm import api, launch

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(1818)


def rand(rows, cols, dtype, gen, major="row"):
    return random_operand(rows, cols, dtype, major, gen)


@pytest.fixture
def general_calls(monkeypatch):
    """The calls that went through the general path (the rest took a plan)."""
    calls = []
    monkeypatch.setattr(api, "_plans", {})  # no plans from earlier tests
    real = api._gemm
    monkeypatch.setattr(api, "_gemm", lambda *args: (calls.append(args), real(*args))[1])
    return calls


# ---------------------------------------------------------------- the lean path
@pytest.mark.parametrize("a_major, b_major", [("row", "row"), ("row", "col"), ("col", "col"), ("col", "row")])
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (72, 256, 512), (1000, 1000, 328)])
def test_new_arrays_of_a_seen_problem(m, n, k, a_major, b_major, gen, general_calls):
    """(Operands TMA cannot read in place, e.g. an M-major `a` with M = 77, are copied on every
    call and take the general path: issue 20.)"""
    import torch

    def operands():
        return rand(m, k, "bf16", gen, a_major), rand(k, n, "bf16", gen, b_major)

    a, b = operands()
    assert_close(jitgemm.gemm(a, b), a, b, "bf16")
    assert len(general_calls) == 1
    kept = []
    for _ in range(4):  # new arrays, results at new addresses; earlier results kept alive
        a, b = operands()
        res = jitgemm.gemm(a, b)
        kept.append((res, a, b))
    torch.cuda.synchronize()
    assert len(general_calls) == 1, "a seen problem with new arrays went through the general path"
    for res, a, b in kept:
        assert_close(res, a, b, "bf16")


@pytest.mark.parametrize("direct", [True, False], ids=["direct-address-writes", "driver-replace-address"])
def test_both_ways_of_patching_addresses(direct, gen, monkeypatch):
    """The addresses are written into the descriptors directly when the driver is seen to keep
    them in the first word, else by cuTensorMapReplaceAddress: both give right results."""
    import torch

    monkeypatch.setattr(api, "_plans", {})
    if not direct:
        monkeypatch.setattr(launch, "_address_is_first_word", lambda words, maps: False)
    m, n, k = 300, 520, 264
    c0 = rand(m, n, "fp32", gen)
    a, b = rand(m, k, "fp16", gen), rand(k, n, "fp16", gen, "col")
    jitgemm.gemm(a, b, c=c0, beta=0.5, out_dtype=torch.float32)
    for _ in range(3):
        a, b, c = rand(m, k, "fp16", gen), rand(k, n, "fp16", gen, "col"), rand(m, n, "fp32", gen)
        buf, out = guarded_out(m, n, "fp32")
        assert jitgemm.gemm(a, b, out, c=c, beta=0.5, out_dtype=torch.float32) is out
        torch.cuda.synchronize()
        assert guard_untouched(buf, m, n)
        assert_close(out, a, b, "fp32", c=c, beta=0.5)
    plan = next(p for p in api._plans.values() if p.out_given)  # used twice: re-pointed
    if direct:
        assert plan.call.direct in (True, False)
        print(f"direct address writes: {plan.call.direct}")  # what this driver allows
    else:
        assert plan.call.direct is False


def test_out_is_c_with_new_arrays(gen, general_calls):
    import torch

    m, n, k = 384, 256, 512
    for _ in range(3):
        a, b = rand(m, k, "bf16", gen), rand(k, n, "bf16", gen)
        buf, c = guarded_out(m, n, "bf16")
        c.copy_(rand(m, n, "bf16", gen))
        before = c.clone()
        assert jitgemm.gemm(a, b, c, c=c, alpha=-1.0, beta=2.0) is c
        torch.cuda.synchronize()
        assert guard_untouched(buf, m, n)
        assert_close(c, a, b, "bf16", c=before, alpha=-1.0, beta=2.0)
    assert len(general_calls) == 1


def test_a_misaligned_array_after_a_plan_is_copied(gen, general_calls):
    import torch

    m, n, k = 256, 128, 256
    a, b = rand(m, k, "bf16", gen), rand(k, n, "bf16", gen)
    jitgemm.gemm(a, b)
    flat = rand(1, m * k + 8, "bf16", gen).reshape(-1)
    shifted = flat[1 : 1 + m * k].view(m, k)  # 2 bytes off TMA's 16-byte alignment
    assert shifted.data_ptr() % 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", api.FallbackCopyWarning)
        res = jitgemm.gemm(shifted, b)
    torch.cuda.synchronize()
    assert_close(res, shifted, b, "bf16")
    assert len(general_calls) == 2
    a2 = rand(m, k, "bf16", gen)
    assert_close(jitgemm.gemm(a2, b), a2, b, "bf16")  # the plan again
    assert len(general_calls) == 2


def test_overlapping_out_is_still_refused_after_a_plan(gen):
    m, n, k = 128, 128, 128
    buf = rand(m, k + n, "bf16", gen)
    a, b = buf[:, :k], rand(k, n, "bf16", gen)
    jitgemm.gemm(a, b, nan_full((m, k + n), "bf16")[:, k:])
    with pytest.raises(ValueError, match="^out: overlaps a"):
        jitgemm.gemm(a, b, buf[:, k - 8 : k - 8 + n])


def test_threads_sharing_a_plan(gen):
    """Threads calling one problem on one stream share one plan (one launch object): each must
    launch with its own addresses."""
    import torch

    m, n, k = 200, 256, 320
    b = rand(k, n, "bf16", gen)
    a0 = rand(m, k, "bf16", gen)
    jitgemm.gemm(a0, b)
    inputs = [[rand(m, k, "bf16", gen) for _ in range(25)] for _ in range(4)]
    torch.cuda.synchronize()
    results, errors = [[] for _ in inputs], []
    barrier = threading.Barrier(len(inputs))

    def work(i):
        try:
            barrier.wait()
            for a in inputs[i]:
                results[i].append(jitgemm.gemm(a, b))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    torch.cuda.synchronize()
    for ins, outs in zip(inputs, results):
        for a, res in zip(ins, outs):
            assert_close(res, a, b, "bf16")


def test_graph_capture_of_a_seen_problem_with_new_arrays(gen, general_calls):
    import torch

    m, n, k = 512, 384, 256
    a, b = rand(m, k, "bf16", gen), rand(k, n, "bf16", gen)
    a2, b2 = rand(m, k, "bf16", gen), rand(k, n, "bf16", gen)
    out, other = nan_full((m, n), "bf16"), nan_full((m, n), "bf16")
    side = torch.cuda.Stream()  # plans are per stream: the capture's stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        jitgemm.gemm(a, b, torch.empty_like(out))  # the plan
    side.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        jitgemm.gemm(a2, b2, out)  # the plan, re-pointed while capturing
    with torch.cuda.stream(side):
        jitgemm.gemm(a, b, other)  # the same plan, re-pointed again after the capture
    side.synchronize()
    assert len(general_calls) == 1
    assert_close(other, a, b, "bf16")
    for _ in range(2):
        a2.copy_(rand(m, k, "bf16", gen))
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        assert_close(out, a2, b2, "bf16")


# ---------------------------------------------------------------- N-D activations
def _flat(x, cols):
    return x.reshape(-1, cols)  # a copy where needed: the reference only reads it


@pytest.mark.parametrize(
    "make_a",
    [
        lambda gen: rand(4 * 96, 320, "bf16", gen).view(4, 96, 320),  # (batch, seq, hidden)
        lambda gen: rand(2 * 3 * 50, 320, "bf16", gen).view(2, 3, 50, 320),  # 4-D
        lambda gen: rand(4 * 96, 320, "bf16", gen, "col").view(4, 96, 320),  # M-major: folds with stride 1
        lambda gen: rand(96 * 4, 320, "bf16", gen).view(96, 4, 320).transpose(0, 1),  # does not fold: copied
        lambda gen: rand(4 * 96, 328, "bf16", gen)[:, :320].view(4, 96, 320),  # padded rows
        lambda gen: rand(96, 320, "bf16", gen).view(1, 96, 320),  # a batch of one
    ],
    ids=["3d", "4d", "3d-m-major", "3d-permuted", "3d-padded", "1x96"],
)
def test_nd_activations(make_a, gen):
    import torch

    a = make_a(gen)
    lead, k = tuple(a.shape[:-1]), a.shape[-1]
    w = rand(264, k, "bf16", gen)  # an nn.Linear weight: b = w.t()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", api.FallbackCopyWarning)
        res = jitgemm.gemm(a, w.t())
        assert res.shape == (*lead, 264) and res.dtype == torch.bfloat16
        assert_close(_flat(res, 264), _flat(a, k), w.t(), "bf16")
        # out and c of shape (..., N), fp32; then a second call with new arrays (a plan)
        for _ in range(2):
            a2 = make_a(gen)
            c = rand(a2.numel() // k, 264, "fp32", gen).view(*lead, 264)
            out = nan_full((*lead, 264), "fp32")
            assert jitgemm.gemm(a2, w.t(), out, c=c, alpha=0.5, beta=-1.0) is out
            torch.cuda.synchronize()
            assert_close(_flat(out, 264), _flat(a2, k), w.t(), "fp32", c=_flat(c, 264), alpha=0.5, beta=-1.0)


def test_nd_out_that_does_not_fold_and_out_is_c(gen):
    import torch

    a = rand(6 * 40, 256, "fp16", gen).view(6, 40, 256)
    b = rand(256, 136, "fp16", gen)
    base = nan_full((40, 6, 136), "fp16")
    out = base.transpose(0, 1)  # (6, 40, 136) whose leading dimensions do not fold
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", api.FallbackCopyWarning)
        assert jitgemm.gemm(a, b, out) is out
    torch.cuda.synchronize()
    assert_close(_flat(out, 136), _flat(a, 256), b, "fp16")
    c = rand(240, 136, "fp16", gen).view(6, 40, 136)
    before = c.clone()
    assert jitgemm.gemm(a, b, c, c=c, beta=0.25) is c
    torch.cuda.synchronize()
    assert_close(_flat(c, 136), _flat(a, 256), b, "fp16", c=_flat(before, 136), beta=0.25)


def test_nd_zero_size_leading_dimensions(gen):
    import torch

    b = rand(64, 32, "bf16", gen)
    for lead in [(0, 5), (3, 0), (0,)]:
        a = torch.empty((*lead, 64), device="cuda", dtype=torch.bfloat16)
        res = jitgemm.gemm(a, b)
        assert res.shape == (*lead, 32) and res.dtype == torch.bfloat16


def test_nd_cupy():
    cp = pytest.importorskip("cupy")
    import torch

    a = cp.random.standard_normal((3, 70, 256), dtype=cp.float32).astype(cp.float16)
    w = cp.random.standard_normal((200, 256), dtype=cp.float32).astype(cp.float16)
    res = jitgemm.gemm(a, w.T)
    assert isinstance(res, cp.ndarray) and res.shape == (3, 70, 200)
    ta, tw = torch.as_tensor(a, device="cuda"), torch.as_tensor(w, device="cuda")
    assert_close(torch.as_tensor(res, device="cuda").reshape(-1, 200), ta.reshape(-1, 256), tw.t(), "fp16")
    permuted = a.transpose(1, 0, 2).copy().transpose(1, 0, 2)  # does not fold
    out = cp.full((3, 70, 200), cp.nan, dtype=cp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", api.FallbackCopyWarning)
        assert jitgemm.gemm(permuted, w.T, out) is out
    assert_close(torch.as_tensor(out, device="cuda").reshape(-1, 200), ta.reshape(-1, 256), tw.t(), "fp32")


class RawCAI:
    def __init__(self, tensor):
        self._tensor = tensor
        self.__cuda_array_interface__ = dict(tensor.__cuda_array_interface__, version=3, stream=None)


def test_nd_raw_cuda_array_interface(gen):
    import torch

    a = rand(2 * 64, 192, "fp16", gen).view(2, 64, 192)
    b = rand(192, 80, "fp16", gen)
    res = jitgemm.gemm(RawCAI(a), RawCAI(b))
    assert isinstance(res, jitgemm.DeviceArray) and res.shape == (2, 64, 80)
    torch.cuda.synchronize()
    got = torch.as_tensor(res, device="cuda")
    assert got.shape == (2, 64, 80)
    assert_close(got.reshape(-1, 80), a.reshape(-1, 192), b, "fp16")
    back = torch.from_dlpack(res)  # the N-D DLPack export
    assert back.shape == (2, 64, 80) and torch.equal(back, got)
    permuted = a.transpose(0, 1).contiguous().transpose(0, 1)  # does not fold: copied by the driver
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", api.FallbackCopyWarning)
        res = jitgemm.gemm(RawCAI(permuted), RawCAI(b))
    torch.cuda.synchronize()
    assert_close(torch.as_tensor(res, device="cuda").reshape(-1, 80), a.reshape(-1, 192), b, "fp16")


def test_nd_numpy():
    rng = np.random.default_rng(18)
    a = rng.standard_normal((3, 50, 136)).astype(np.float16)
    b = rng.standard_normal((136, 72)).astype(np.float16)
    res = jitgemm.gemm(a, b)
    assert isinstance(res, np.ndarray) and res.shape == (3, 50, 72)
    assert_close(res.reshape(-1, 72), a.reshape(-1, 136), b, "fp16")
    permuted = a.transpose(1, 0, 2).copy().transpose(1, 0, 2)
    out = np.full((3, 50, 72), np.nan, np.float32)
    assert jitgemm.gemm(permuted, b, out) is out
    assert_close(out.reshape(-1, 72), a.reshape(-1, 136), b, "fp32")


# ---------------------------------------------------------------- the serving benchmark, smoke mode
def test_serving_benchmark_smoke():
    """examples/serving.py with few calls, every result checked; a fresh process."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "serving.py"), "--calls", "12", "--check", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["checked_results"] == 2 * 12
    assert [p["pass"] for p in report["passes"]] == [1, 2]
    print(json.dumps(report, indent=1))
