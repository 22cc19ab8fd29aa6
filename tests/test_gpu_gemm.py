"""GPU correctness sweep (issue 2): every value of {1, 7, 64, 127, 128, 129, 1000, 4096} on every
axis, all four layouts, float16 and bfloat16, each output dtype, against a float64 reference,
with NaN-poisoned outputs and a guard band that must stay untouched."""

import pytest
from gpu_helpers import assert_close, guard_untouched, guarded_out, latin_shapes, random_operand

import jitgemm

pytestmark = pytest.mark.gpu

SIZES = [1, 7, 64, 127, 128, 129, 1000, 4096]
# plus a few shapes with many tiles per persistent CTA
SHAPES = latin_shapes(SIZES) + [(4096, 4096, 4096), (1000, 1000, 1000), (129, 4096, 4096)]
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
CUPY_SHAPE = (1000, 2112, 7168)


@pytest.fixture(scope="module")
def gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(1234)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("out_dtype", ["same", "fp32"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["".join(x[0] for x in lay) for lay in LAYOUTS])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_sweep_torch(shape, layout, dtype, out_dtype, gen):
    import torch

    m, n, k = shape
    odt = dtype if out_dtype == "same" else "fp32"
    a = random_operand(m, k, dtype, layout[0], gen)
    b = random_operand(k, n, dtype, layout[1], gen)
    # 1) into a guarded, NaN-poisoned view (TMA stores clipped at the edges)
    buf, out = guarded_out(m, n, odt)
    res = jitgemm.gemm(a, b, out=out, out_dtype=None if out_dtype == "same" else torch.float32)
    assert res is out
    torch.cuda.synchronize()
    assert guard_untouched(buf, m, n), "the kernel wrote outside the output"
    assert_close(out, a, b, odt)
    # 2) into a fresh array allocated by jitgemm (exercises the unaligned-output fallback)
    fresh = jitgemm.gemm(a, b, out_dtype=None if out_dtype == "same" else torch.float32)
    assert fresh.shape == (m, n) and fresh.dtype == out.dtype
    assert_close(fresh, a, b, odt)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_cupy_in_cupy_out(dtype):
    cp = pytest.importorskip("cupy")
    if dtype == "bf16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        np_dtype = ml_dtypes.bfloat16
    else:
        np_dtype = cp.float16
    m, n, k = CUPY_SHAPE
    try:
        a = cp.random.randn(m, k).astype(np_dtype)
        b = cp.random.randn(k, n).astype(np_dtype)
    except Exception as exc:  # CuPy builds without bfloat16 support
        pytest.skip(f"CuPy cannot make {dtype} arrays here: {exc}")
    out = cp.full((m, n), cp.nan, dtype=np_dtype)
    res = jitgemm.gemm(a, b, out=out)
    assert isinstance(res, cp.ndarray) and res is out
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    got = res.astype(cp.float64)
    assert not cp.isnan(got).any()
    err = float(cp.linalg.norm(got - ref) / cp.linalg.norm(ref))
    assert err <= {"bf16": 1e-2, "fp16": 2e-3}[dtype], err
    fresh = jitgemm.gemm(a.T.copy().T, b)  # a transposed view of a contiguous array
    assert isinstance(fresh, cp.ndarray)
    err = float(cp.linalg.norm(fresh.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    assert err <= {"bf16": 1e-2, "fp16": 2e-3}[dtype], err
