"""The decode kernels for unaligned weights (issue 20, jitgemm/decode.py): a of M <= 4 rows against
a row-major b whose rows TMA cannot read, and of M <= 16 rows against a K-major b (W.t()) whose
columns TMA cannot read, read in place. Every result against a float64 reference, into
NaN-poisoned outputs with guard bands; the call must run the decode kernel (not the staged
GEMM) and leave its counters ready for the next launch."""

import warnings

import pytest
from gpu_helpers import assert_close, guard_untouched, guarded_out, torch_dtype

import jitgemm
from jitgemm import api, decode, launch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(2026)


def randn(shape, dtype, gen):
    import torch

    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(torch_dtype(dtype))


def weight(k, n, dtype, layout, gen):
    """(K, N) with rows TMA cannot read: "odd" contiguous rows of an N not a multiple of 8,
    "padded" rows of a larger stride that is not whole 16-byte units either ("nan-padded": NaN
    in the padding; rows padded to whole units TMA reads in place, test_gpu_unaligned.py),
    "shifted" a view starting 2 bytes into a unit; "W.t() ..." the same of W (N, K), as
    b = W.t() (K-major)."""
    if layout.startswith("W.t() "):
        return weight(n, k, dtype, layout[6:], gen).t()
    pad = 3 if (n + 3) % 8 else 5
    if layout == "odd":
        return randn((k, n), dtype, gen)
    if layout == "padded":
        return randn((k, n + pad), dtype, gen)[:, :n]
    if layout == "nan-padded":  # the padding NaN: no product may read it (0 * NaN is NaN)
        w = randn((k, n + pad), dtype, gen)
        w[:, n:] = float("nan")
        return w[:, :n]
    return randn((k, n + 8), dtype, gen)[:, 1 : n + 1]


def decoded(*args, **kw):
    """gemm, failing unless the decode kernel ran it (no copies, no staging)."""
    created = []
    real = decode.DecodeLaunch

    def recording(*a, **k):
        created.append(1)
        return real(*a, **k)

    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("error", jitgemm.FallbackCopyWarning)
        mp.setattr(decode, "DecodeLaunch", recording)
        api._plans.clear()
        res = jitgemm.gemm(*args, **kw)
    assert created, "the decode kernel did not run"
    return res


CASES = [  # (m, n, k, dtype, b layout); (a b of one row TMA reads in place: test_gpu_unaligned.py)
    (1, 3, 2, "bf16", "odd"),
    (2, 5, 3, "fp16", "odd"),
    (1, 7, 17, "bf16", "padded"),
    (2, 9, 4097, "bf16", "shifted"),
    (1, 33, 960, "fp16", "shifted"),
    (2, 247, 33, "bf16", "odd"),
    (1, 249, 1023, "bf16", "padded"),
    (2, 1023, 2049, "fp16", "padded"),
    (1, 2049, 7, "bf16", "odd"),
    (2, 16332, 960, "bf16", "odd"),
    (1, 50257, 4096, "bf16", "odd"),
    (2, 4096, 4096, "fp16", "shifted"),
    (3, 1001, 517, "bf16", "odd"),
    (4, 247, 2049, "fp16", "padded"),
    (3, 16332, 960, "fp16", "shifted"),
    (4, 50257, 4096, "bf16", "odd"),
    # K-major b (the cols kernel): K < 8, one strip, column blocks past N, two n8 products
    (1, 3, 3, "bf16", "W.t() odd"),
    (2, 5, 7, "fp16", "W.t() odd"),
    (1, 64, 9, "bf16", "W.t() padded"),
    (5, 65, 33, "bf16", "W.t() shifted"),
    (8, 17, 4097, "fp16", "W.t() odd"),
    (9, 130, 1023, "bf16", "W.t() padded"),
    (16, 1001, 517, "fp16", "W.t() odd"),
    (3, 4144, 14084, "bf16", "W.t() shifted"),
    (2, 4225, 780, "bf16", "W.t() odd"),
    (12, 32008, 725, "fp16", "W.t() odd"),
    (16, 2062, 17852, "bf16", "W.t() padded"),
    (6, 4096, 4096, "bf16", "W.t() shifted"),  # K a multiple of 8, a misaligned view
    (2, 1001, 517, "bf16", "nan-padded"),
    (4, 65, 1001, "fp16", "W.t() nan-padded"),
    (16, 257, 77, "bf16", "W.t() nan-padded"),
]


@pytest.mark.parametrize("m, n, k, dtype, layout", CASES)
@pytest.mark.parametrize("epilogue", ["plain", "fp32", "c", "out=c fp32"])
def test_decode_is_exact_for_every_layout_and_epilogue(gen, m, n, k, dtype, layout, epilogue):
    import torch

    a = randn((m, k), dtype, gen)
    b = weight(k, n, dtype, layout, gen)
    odt = "fp32" if "fp32" in epilogue else dtype
    buf, out = guarded_out(m, n, odt)
    c, kw = None, {}
    if epilogue == "c":
        c = randn((m, n), odt, gen)
        kw = {"c": c, "alpha": 0.5, "beta": -2.0}
    elif epilogue.startswith("out=c"):
        out.copy_(randn((m, n), odt, gen))
        c = out.clone()
        kw = {"c": out, "beta": 1.0}
    decoded(a, b, out=out, **kw)
    torch.cuda.synchronize()
    assert_close(out, a, b, odt, c=c, alpha=kw.get("alpha", 1.0), beta=kw.get("beta", 1.0))
    assert guard_untouched(buf, m, n)


@pytest.mark.parametrize("m, b_layout", [(2, "odd"), (11, "W.t() odd")])
@pytest.mark.parametrize("a_layout", ["transposed", "3-D"])
def test_a_of_any_strides_and_the_result_it_allocates(gen, a_layout, m, b_layout):
    import torch

    n, k = 1001, 517
    a = randn((k, m), "bf16", gen).T if a_layout == "transposed" else randn((1, m, k), "bf16", gen)
    b = weight(k, n, "bf16", b_layout, gen)
    got = decoded(a, b)
    torch.cuda.synchronize()
    assert got.shape == (*a.shape[:-1], n) and got.dtype == torch.bfloat16
    assert_close(got.reshape(m, n), a.reshape(m, k), b, "bf16")


@pytest.mark.parametrize("decoder, m, layout", [(decode.ROWS, 1, "odd"), (decode.COLS, 7, "W.t() odd")])
def test_new_arrays_reuse_the_plan_and_the_counters_are_left_at_zero(gen, decoder, m, layout):
    """Repeated calls on one stream (the lean path, new arrays each time) stay exact: the
    last warp of each strip resets its counter for the next launch."""
    import torch

    n, k = 3001, 2049
    api._plans.clear()
    for i in range(4):
        a, b = randn((m, k), "fp16", gen), weight(k, n, "fp16", layout, gen)
        got = jitgemm.gemm(a, b)
        torch.cuda.synchronize()
        assert_close(got, a, b, "fp16")
        if i == 0:
            assert any(isinstance(p.call, decode.DecodeLaunch) for p in api._plans.values())
    ws = launch._workspace(0, torch.cuda.current_stream().cuda_stream)
    strips = decoder.split_for(n, k, torch.cuda.get_device_properties(0).multi_processor_count).strips
    counters = launch._region_pointers(ws.ptr, ws.sizes)[launch.REGIONS.index("counters")]
    held = torch.empty(strips, dtype=torch.int32, device="cuda")
    from cuda.bindings import driver

    driver.cuMemcpyDtoD(held.data_ptr(), counters, strips * 4)
    assert int(held.abs().sum()) == 0


@pytest.mark.parametrize("m, layout", [(2, "padded"), (13, "W.t() padded")])
def test_a_captured_graph_decodes_what_its_inputs_hold_at_replay(gen, m, layout):
    import torch

    n, k = 777, 1501
    a, b = randn((m, k), "bf16", gen), weight(k, n, "bf16", layout, gen)
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    decoded(a, b, out=out)  # loaded before the capture
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        jitgemm.gemm(a, b, out=out)
    for _ in range(2):
        a.copy_(randn((m, k), "bf16", gen))
        b.copy_(randn((k, n), "bf16", gen))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, a, b, "bf16")


@pytest.mark.parametrize("decoder, k, layout", [(decode.ROWS, 1024, "odd"), (decode.COLS, 1023, "W.t() odd")])
def test_more_rows_or_a_forced_config_run_the_staged_gemm(gen, decoder, k, layout):
    import torch

    n = 1001
    b = weight(k, n, "bf16", layout, gen)
    b_major = "N" if decoder is decode.ROWS else "K"
    for m, config in ((decoder.max_m + 1, None), (1, "forced")):
        a = randn((m, k), "bf16", gen)
        api._plans.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", jitgemm.FallbackCopyWarning)
            cfg = jitgemm.config_for(jitgemm.Problem(m, n, k, "bf16", b_major=b_major)) if config else None
            got = jitgemm.gemm(a, b, config=cfg)
        torch.cuda.synchronize()
        assert_close(got, a, b, "bf16")
        assert not any(isinstance(p.call, decode.DecodeLaunch) for p in api._plans.values())


@pytest.mark.parametrize("m, layout", [(2, "odd"), (9, "W.t() odd")])
def test_host_arrays_against_such_a_weight_run_the_gemm_on_aligned_uploads(gen, m, layout):
    import numpy as np

    n, k = 1001, 517
    a, b = randn((m, k), "fp16", gen), weight(k, n, "fp16", layout, gen)
    a_host, b_host = a.cpu().numpy(), b.cpu().numpy()  # (b's layout kept: W.t() as a transposed view)
    assert b_host.strides[0] == (2 if layout.startswith("W.t()") else 2 * n)
    got = jitgemm.gemm(a_host, b_host)
    assert isinstance(got, np.ndarray)
    import torch

    assert_close(torch.from_numpy(got).cuda(), a, b, "fp16")
