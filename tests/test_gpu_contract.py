"""The gemm contract on the GPU (issue 6): every kind of array in and out, c / alpha / beta in the
epilogue, empty problems, user streams, CUDA graphs, threads on a cold cache, a second GPU and the
fallback copies. Every check compares with a float64 reference on fresh random data, with
NaN-poisoned outputs."""

import dataclasses
import threading
import warnings

import numpy as np
import pytest
from gpu_helpers import assert_close, guard_untouched, guarded_out, nan_full, random_operand, torch_dtype

import jitgemm
from jitgemm import api, heuristics, kernels, launch
from jitgemm.config import KernelConfig

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(4321)


def rand(rows, cols, dtype, gen, major="row"):
    return random_operand(rows, cols, dtype, major, gen)


# ---------------------------------------------------------------- c, alpha, beta
@pytest.mark.parametrize("dtype, odt", [("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp32"), ("fp16", "fp32")])
@pytest.mark.parametrize("shape", [(256, 256, 256), (129, 200, 1000), (1000, 72, 64)])
def test_c_alpha_beta_in_epilogue(shape, dtype, odt, gen):
    import torch

    m, n, k = shape
    a, b = rand(m, k, dtype, gen), rand(k, n, dtype, gen, "col")
    c = rand(m, n, odt, gen)
    buf, out = guarded_out(m, n, odt)
    res = jitgemm.gemm(a, b, out, c=c, alpha=0.75, beta=-1.5)
    assert res is out
    torch.cuda.synchronize()
    assert guard_untouched(buf, m, n)
    assert_close(out, a, b, odt, c=c, alpha=0.75, beta=-1.5)
    fresh = jitgemm.gemm(a, b, c=c, alpha=2.0, beta=0.5, out_dtype=torch_dtype(odt))
    assert fresh.dtype == torch_dtype(odt)
    assert_close(fresh, a, b, odt, c=c, alpha=2.0, beta=0.5)


def test_alpha_without_c(gen):
    a, b = rand(300, 200, "bf16", gen), rand(200, 160, "bf16", gen)
    assert_close(jitgemm.gemm(a, b, alpha=-3.0), a, b, "bf16", alpha=-3.0)


@pytest.mark.parametrize("odt", ["bf16", "fp32"])
def test_out_is_c_accumulates_in_place(odt, gen):
    import torch

    m, n, k = 384, 256, 512
    a, b = rand(m, k, "bf16", gen), rand(k, n, "bf16", gen)
    buf, c = guarded_out(m, n, odt)
    c.copy_(rand(m, n, odt, gen))
    before = c.clone()
    res = jitgemm.gemm(a, b, c, c=c, alpha=1.0, beta=1.0)
    assert res is c
    torch.cuda.synchronize()
    assert guard_untouched(buf, m, n)
    assert_close(c, a, b, odt, c=before)


def test_beta_zero_does_not_read_c(gen):
    a, b = rand(200, 300, "fp16", gen), rand(300, 100, "fp16", gen)
    c = nan_full((200, 100), "fp16")
    res = jitgemm.gemm(a, b, c=c, beta=0.0, alpha=2.0)
    assert_close(res, a, b, "fp16", alpha=2.0)


# ---------------------------------------------------------------- empty problems
@pytest.mark.parametrize("odt", ["bf16", "fp32"])
def test_k0_gives_zeros_or_beta_c(odt, gen):
    import torch

    a, b = (
        torch.empty((70, 0), device="cuda", dtype=torch.bfloat16),
        torch.empty((0, 40), device="cuda", dtype=torch.bfloat16),
    )
    out = nan_full((70, 40), odt)
    assert jitgemm.gemm(a, b, out) is out
    assert bool((out == 0).all())
    c = rand(70, 40, odt, gen)
    res = jitgemm.gemm(a, b, c=c, beta=-0.5, out_dtype=torch_dtype(odt))
    torch.testing.assert_close(res, (c.float() * -0.5).to(c.dtype))
    ref = (c.float() * 3).to(c.dtype)
    assert jitgemm.gemm(a, b, c, c=c, beta=3.0) is c
    torch.testing.assert_close(c, ref)


@pytest.mark.parametrize("m, n, k", [(0, 64, 64), (64, 0, 64), (0, 0, 0), (0, 64, 0)])
def test_zero_size(m, n, k):
    import torch

    a = torch.empty((m, k), device="cuda", dtype=torch.float16)
    b = torch.empty((k, n), device="cuda", dtype=torch.float16)
    res = jitgemm.gemm(a, b)
    assert res.shape == (m, n) and res.dtype == torch.float16 and res.device == a.device
    res32 = jitgemm.gemm(a, b, out_dtype=torch.float32)
    assert res32.shape == (m, n) and res32.dtype == torch.float32


# ---------------------------------------------------------------- arrays of every kind
def test_cupy_in_cupy_out_with_c():
    cp = pytest.importorskip("cupy")
    import torch

    a = cp.random.standard_normal((513, 300), dtype=cp.float32).astype(cp.float16)
    b = cp.random.standard_normal((300, 264), dtype=cp.float32).astype(cp.float16).T.copy().T
    c = cp.random.standard_normal((513, 264), dtype=cp.float32)
    out = cp.full((513, 264), cp.nan, dtype=cp.float32)
    res = jitgemm.gemm(a, b, out, c=c, alpha=0.5, beta=2.0)
    assert res is out
    ta, tb, tc = (torch.as_tensor(x, device="cuda") for x in (a, b, c))
    assert_close(torch.as_tensor(res, device="cuda"), ta, tb, "fp32", c=tc, alpha=0.5, beta=2.0)
    fresh = jitgemm.gemm(a, b)
    assert isinstance(fresh, cp.ndarray) and fresh.dtype == cp.float16
    assert_close(torch.as_tensor(fresh, device="cuda"), ta, tb, "fp16")


class RawCAI:
    """Nothing but __cuda_array_interface__, naming the stream that produced the data."""

    def __init__(self, tensor, stream):
        self._tensor = tensor
        cai = dict(tensor.__cuda_array_interface__)
        cai["version"], cai["stream"] = 3, stream
        self.__cuda_array_interface__ = cai


def test_raw_cuda_array_interface(gen):
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the data is produced on a side stream ...
        a, b = rand(300, 500, "fp16", gen), rand(500, 200, "fp16", gen, "col")
        c = rand(300, 200, "fp16", gen)
    # ... which the interface names: gemm must order its work after it.
    res = jitgemm.gemm(
        RawCAI(a, side.cuda_stream), RawCAI(b, side.cuda_stream), c=RawCAI(c, side.cuda_stream), beta=-1.0
    )
    assert isinstance(res, jitgemm.DeviceArray)
    assert res.__cuda_array_interface__["stream"] == side.cuda_stream  # computed on the producer's stream
    side.synchronize()
    got = torch.as_tensor(res, device="cuda")
    assert got.shape == (300, 200) and got.dtype == torch.float16
    assert_close(got, a, b, "fp16", c=c, beta=-1.0)
    out = nan_full((300, 200), "fp16")
    assert jitgemm.gemm(RawCAI(a, 1), RawCAI(b, 1), RawCAI(out, 1)).__class__ is RawCAI
    torch.cuda.synchronize()
    assert_close(out, a, b, "fp16")


class DLPackOnly:
    """Nothing but the DLPack protocol (like an array of a library jitgemm does not know)."""

    def __init__(self, tensor):
        self._tensor = tensor

    def __dlpack__(self, **kwargs):
        return self._tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_dlpack_objects(dtype, gen):
    import torch

    if dtype == "bf16":
        pytest.importorskip("ml_dtypes")  # cuda.core reads bfloat16 DLPack tensors through it
    a, b = rand(200, 320, dtype, gen), rand(320, 136, dtype, gen)
    res = jitgemm.gemm(DLPackOnly(a), DLPackOnly(b))
    assert isinstance(res, jitgemm.DeviceArray)
    got = torch.from_dlpack(res)
    torch.cuda.synchronize()
    assert got.shape == (200, 136) and got.dtype == torch_dtype(dtype)
    assert_close(got, a, b, dtype)


def test_jax_arrays():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU backend here")
    key = jax.random.PRNGKey(0)
    a = jax.random.normal(key, (256, 384), dtype=jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(1), (384, 128), dtype=jnp.float32).astype(jnp.bfloat16)
    res = jitgemm.gemm(a, b)
    assert isinstance(res, jax.Array) and res.dtype == jnp.bfloat16 and res.shape == (256, 128)
    assert_close(np.asarray(res, np.float64), np.asarray(a, np.float64), np.asarray(b, np.float64), "bf16")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_numpy_in_numpy_out(dtype):
    if dtype == "bf16":
        np_dtype = pytest.importorskip("ml_dtypes").bfloat16
    else:
        np_dtype = np.float16
    rng = np.random.default_rng(7)
    a = rng.standard_normal((300, 129)).astype(np_dtype)
    b = rng.standard_normal((200, 129)).astype(np_dtype).T  # a transposed view
    c = rng.standard_normal((300, 200)).astype(np.float32)
    res = jitgemm.gemm(a, b, c=c, alpha=0.5, beta=2.0, out_dtype=np.float32)
    assert isinstance(res, np.ndarray) and res.dtype == np.float32 and res.shape == (300, 200)
    assert_close(res, a, b, "fp32", c=c, alpha=0.5, beta=2.0)
    out = np.full((300, 200), np.nan, np_dtype)
    assert jitgemm.gemm(a, b, out) is out
    assert_close(out, a, b, dtype)


# ---------------------------------------------------------------- the plan cache
def test_repeated_calls_see_new_data_and_new_outputs(gen):
    import torch

    a, b = rand(256, 256, "bf16", gen), rand(256, 256, "bf16", gen)
    buf, out = guarded_out(256, 256, "bf16")
    for _ in range(3):
        a.copy_(rand(256, 256, "bf16", gen))
        b.copy_(rand(256, 256, "bf16", gen))
        out.fill_(float("nan"))
        jitgemm.gemm(a, b, out)
        torch.cuda.synchronize()
        assert_close(out, a, b, "bf16")
        assert guard_untouched(buf, 256, 256)
        kept = [jitgemm.gemm(a, b) for _ in range(3)]  # fresh results at (mostly) new addresses
        for r in kept:
            assert_close(r, a, b, "bf16")


# ---------------------------------------------------------------- streams
def test_torch_user_streams(gen):
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # the current stream
        a, b = rand(1000, 1000, "bf16", gen), rand(1000, 1000, "bf16", gen)
        res = jitgemm.gemm(a, b)
        out = nan_full((1000, 1000), "fp32")
        jitgemm.gemm(a, b, out)
    s.synchronize()
    assert_close(res, a, b, "bf16")
    assert_close(out, a, b, "fp32")
    s2 = torch.cuda.Stream()
    s2.wait_stream(s)
    res2 = jitgemm.gemm(a, b, stream=s2)  # stream= with torch's default stream current
    out2 = nan_full((1000, 1000), "bf16")
    jitgemm.gemm(a, b, out2, stream=s2.cuda_stream)
    s2.synchronize()
    assert_close(res2, a, b, "bf16")
    assert_close(out2, a, b, "bf16")


def test_cupy_user_stream():
    cp = pytest.importorskip("cupy")
    import torch

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.random.standard_normal((700, 900), dtype=cp.float32).astype(cp.float16)
        b = cp.random.standard_normal((900, 500), dtype=cp.float32).astype(cp.float16)
        res = jitgemm.gemm(a, b)
    s.synchronize()
    ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
    assert_close(torch.as_tensor(res, device="cuda"), ta, tb, "fp16")
    s2 = cp.cuda.Stream(non_blocking=True)
    res2 = jitgemm.gemm(a, b, stream=s2)
    s2.synchronize()
    assert_close(torch.as_tensor(res2, device="cuda"), ta, tb, "fp16")


# ---------------------------------------------------------------- programmatic dependent launch
CHAIN_STEPS = 4


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize(
    "m, width, knobs",
    [
        (1, 2048, {}),  # few CTAs: the next kernel starts at once and must wait
        (128, 4096, dict(split_k=2)),  # split-K workspace and counters
        (1000, 1024, dict(cluster_size=2, multicast="B", block_n=128, num_stages=4)),
    ],
)
def test_chained_calls_wait_for_the_previous_kernel(m, width, knobs, capture, gen):
    """Back-to-back dependent calls with no synchronisation: each call reads the previous one's
    output (read after write), and a last call overwrites the first call's input (write after
    read). Kernels are launched with programmatic dependent launch, so one that touched global
    memory before griddepcontrol.wait would read stale data or clobber an input here."""
    import torch

    from jitgemm.problem import Problem

    problem = Problem(m, width, width, "bf16", "bf16", "K", "N")
    spec = api.device_spec(0)
    cfg = dataclasses.replace(heuristics.select(problem, spec), **knobs)
    assert not heuristics.check_config(cfg, problem, spec)
    w = rand(width, width, "bf16", gen) * width**-0.5  # keeps the chain's values near 1
    x0, z = rand(m, width, "bf16", gen), rand(m, width, "bf16", gen)
    x0_initial = x0.clone()
    outs = [nan_full((m, width), "bf16") for _ in range(CHAIN_STEPS)]

    def chain():
        prev = x0
        for out in outs:
            jitgemm.gemm(prev, w, out, config=cfg)
            prev = out
        jitgemm.gemm(z, w, x0, config=cfg)  # x0 was the first call's input

    chain()  # eager (and warm-up for capture)
    if capture:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            chain()
        x0.copy_(x0_initial)
        for out in outs:
            out.fill_(float("nan"))
        g.replay()
    torch.cuda.synchronize()
    assert_close(outs[0], x0_initial, w, "bf16")
    for prev, out in zip(outs, outs[1:]):
        assert_close(out, prev, w, "bf16")
    assert_close(x0, z, w, "bf16")


# ---------------------------------------------------------------- CUDA graphs
@pytest.mark.parametrize("with_c", [False, True])
def test_graph_capture_and_replay(with_c, gen):
    import torch

    m, n, k = 512, 384, 256
    a, b = rand(m, k, "bf16", gen), rand(k, n, "bf16", gen)
    c = rand(m, n, "bf16", gen) if with_c else None
    out = nan_full((m, n), "bf16")
    jitgemm.gemm(a, b, out, c=c, beta=0.5)  # warm-up: compiles and loads the kernel
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        jitgemm.gemm(a, b, out, c=c, beta=0.5)
    for _ in range(2):
        a.copy_(rand(m, k, "bf16", gen))
        b.copy_(rand(k, n, "bf16", gen))
        if with_c:
            c.copy_(rand(m, n, "bf16", gen))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert_close(out, a, b, "bf16", c=c, beta=0.5 if with_c else 1.0)


def test_split_k_graph_workspace_lives_with_the_graph(gen):
    """A captured split-K call gets scratch outside the graph (no memset nodes), which is
    freed once the graph is destroyed, at the next capture."""
    import gc
    import time

    import torch

    m, n, k = 128, 512, 4096
    a, b = rand(m, k, "bf16", gen), rand(k, n, "bf16", gen)
    cfg = KernelConfig(block_m=64, block_n=64, num_stages=8, num_consumers=1, split_k=4)
    out = nan_full((m, n), "bf16")
    jitgemm.gemm(a, b, out, config=cfg)
    torch.cuda.synchronize()

    def captured():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            jitgemm.gemm(a, b, out, config=cfg)
        return g

    before = set(launch._graph_workspaces.live)
    g = captured()
    (mine,) = set(launch._graph_workspaces.live) - before
    for _ in range(3):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert_close(out, a, b, "bf16")
    del g
    gc.collect()
    deadline = time.monotonic() + 10  # CUDA runs the destructor asynchronously
    while mine in launch._graph_workspaces.live and time.monotonic() < deadline:
        time.sleep(0.05)
        captured()  # each capture frees what was released
    assert mine not in launch._graph_workspaces.live


def test_graph_capture_needing_a_compile_raises(gen):
    import torch

    a, b = rand(256, 256, "fp16", gen), rand(256, 256, "fp16", gen)
    spec = api.device_spec(0)
    problem = jitgemm.Problem(256, 256, 256, "fp16", "fp16")
    cfg = jitgemm.heuristics.select(problem, spec)
    cold = dataclasses.replace(cfg, group_size=cfg.group_size + 5)  # a config no one has loaded
    assert not kernels.is_loaded(cold, 0)
    out = nan_full((256, 256), "fp16")
    g = torch.cuda.CUDAGraph()
    with pytest.raises(launch.CaptureError, match="run the same gemm once before the capture"):
        with torch.cuda.graph(g):
            jitgemm.gemm(a, b, out, config=cold)
    torch.cuda.synchronize()
    jitgemm.gemm(a, b, out, config=cold)  # outside a capture the same call compiles and runs
    torch.cuda.synchronize()
    assert_close(out, a, b, "fp16")


# ---------------------------------------------------------------- threads, cold cache
def test_threads_on_a_cold_cache(tmp_cache, monkeypatch):
    import torch

    from jitgemm import compiler

    monkeypatch.setattr(kernels, "_loaded", {})  # nothing loaded in this process ...
    monkeypatch.setattr(api, "_plans", {})  # ... and no call plans: every call compiles or waits
    compiled = []
    real = compiler.compile_cubin

    def counting(source, arch, name, **kw):
        compiled.append(name)
        return real(source, arch, name=name, **kw)

    monkeypatch.setattr(compiler, "compile_cubin", counting)
    shapes = [(256, 256, 256)] * 4 + [(128, 512, 64), (128, 512, 64), (520, 136, 320), (64, 64, 1000)]
    errors, barrier = [], threading.Barrier(len(shapes))

    def work(i, shape):
        try:
            m, n, k = shape
            g = torch.Generator(device="cuda").manual_seed(100 + i)
            a, b = rand(m, k, "bf16", g), rand(k, n, "bf16", g)
            torch.cuda.synchronize()
            barrier.wait()
            res = jitgemm.gemm(a, b)
            torch.cuda.synchronize()
            assert_close(res, a, b, "bf16")
        except BaseException as exc:  # reported below, with the thread's shape
            errors.append((shape, exc))

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(shapes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert compiled, "the cache was not cold"
    assert len(compiled) == len(set(compiled)), f"a kernel was compiled twice: {compiled}"


# ---------------------------------------------------------------- a second GPU
def test_second_gpu(gen):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torch.cuda.set_device(0)
    g1 = torch.Generator(device="cuda:1").manual_seed(9)
    a = torch.randn((300, 400), generator=g1, device="cuda:1").to(torch.bfloat16)
    b = torch.randn((400, 200), generator=g1, device="cuda:1").to(torch.bfloat16)
    c = torch.randn((300, 200), generator=g1, device="cuda:1").to(torch.bfloat16)
    res = jitgemm.gemm(a, b, c=c, beta=2.0)
    assert res.device == torch.device("cuda:1")
    assert torch.cuda.current_device() == 0, "gemm changed the caller's current device"
    torch.cuda.synchronize(1)
    assert_close(res, a, b, "bf16", c=c, beta=2.0)


# ---------------------------------------------------------------- layouts TMA cannot use
def _fallback_cases(gen):
    """(arguments copied, gemm arguments, the output's frame or None, the output's window in
    it) for layouts TMA cannot use in place; outputs of unit-stride rows at any alignment are
    written in place (out_direct) and copy nothing."""
    import torch

    m, n, k = 200, 136, 264
    big_a = rand(m, k + 1, "bf16", gen)
    yield {"a"}, dict(a=big_a[:, 1:], b=rand(k, n, "bf16", gen)), None, None  # base off by 2 bytes
    b_strided = rand(2 * k, 2 * n, "bf16", gen)[::2, ::2]  # no unit stride
    yield {"b"}, dict(a=rand(m, k, "bf16", gen), b=b_strided), None, None
    yield {"a"}, dict(a=rand(m, 7, "bf16", gen), b=rand(7, n, "bf16", gen)), None, None  # rows of 14 bytes
    c = rand(m, n, "bf16", gen, "col")  # a column-major c
    yield {"c"}, dict(a=rand(m, k, "bf16", gen), b=rand(k, n, "bf16", gen), c=c, beta=-1.0), None, None
    window = (slice(1, m + 1), slice(1, n + 1))
    frame = torch.full((m + 2, n + 9), float("nan"), device="cuda", dtype=torch.bfloat16)
    # a misaligned out: stored directly
    yield set(), dict(a=rand(m, k, "bf16", gen), b=rand(k, n, "bf16", gen), out=frame[window]), frame, window
    frame = torch.full((m + 2, n + 9), float("nan"), device="cuda", dtype=torch.bfloat16)
    cin = frame[window]
    cin.copy_(rand(m, n, "bf16", gen))
    # out=c, misaligned: read and written in place
    yield set(), dict(a=rand(m, k, "bf16", gen), b=rand(k, n, "bf16", gen), out=cin, c=cin, beta=1.0), frame, window
    # a column-major out: computed into an aligned buffer, then copied in
    frame = torch.full((n + 2, m + 9), float("nan"), device="cuda", dtype=torch.bfloat16)
    window_t = (slice(1, n + 1), slice(1, m + 1))
    yield {"out"}, dict(a=rand(m, k, "bf16", gen), b=rand(k, n, "bf16", gen), out=frame[window_t].T), frame, window_t


def test_fallback_copies_are_correct_and_warn_once_per_argument(gen, monkeypatch):
    import torch

    monkeypatch.setattr(api, "_warned", set())
    warned = set()
    for copied, kw, frame, window in _fallback_cases(gen):
        c_before = kw["c"].clone() if "c" in kw else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = jitgemm.gemm(kw["a"], kw["b"], kw.get("out"), c=kw.get("c"), beta=kw.get("beta", 1.0))
            torch.cuda.synchronize()
        names = [str(w.message).split()[1] for w in caught if issubclass(w.category, api.FallbackCopyWarning)]
        assert sorted(names) == sorted(copied - warned), (copied, names)
        warned |= copied
        if frame is not None:
            assert res is kw["out"]
            inside = torch.zeros(frame.shape, dtype=torch.bool, device="cuda")
            inside[window] = True
            assert bool(torch.isnan(frame[~inside].float()).all()), "wrote outside out"
        assert_close(res, kw["a"], kw["b"], "bf16", c=c_before, beta=kw.get("beta", 1.0))
    assert warned == {"a", "b", "c", "out"}
