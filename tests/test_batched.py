"""N-D activations on the CPU (issue 18, item 5): `a` of shape (..., K) is folded into M rows
when its leading dimensions step through memory with one stride, and copied otherwise; the
result, `out` and `c` have shape (..., N). The GPU side is in test_gpu_serving.py, the plans of N-D
calls in test_lean_path.py."""

import numpy as np
import pytest
from test_contract import ReachedGPU, cpu_only, dev  # noqa: F401  (cpu_only: an autouse fixture)

import jitgemm
from jitgemm import api, arrays
from jitgemm.arrays import GENERIC, View, libraries, memory
from jitgemm.arrays.views import fold_rows, fold_view


def contiguous(shape):
    return tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))


@pytest.mark.parametrize(
    "shape, strides, row",
    [
        ((2, 3, 4), (12, 4, 1), 4),  # row-major (batch, seq, hidden)
        ((2, 3, 8), (48, 16, 1), 16),  # padded rows
        ((2, 3, 5, 8), (120, 40, 8, 1), 8),  # 4-D
        ((2, 3, 4), (3, 1, 6), 1),  # a (batch, seq, hidden) view of a contiguous (hidden, batch, seq)
        ((2, 3, 4), (4, 8, 1), None),  # x.transpose(0, 1) of a contiguous (seq, batch, hidden)
        ((2, 3, 8), (50, 16, 1), None),  # batch stride not a whole number of rows
        ((1, 5, 4), (999, 4, 1), 4),  # size-1 dimensions: any stride
        ((5, 1, 4), (4, -7, 1), 4),
        ((1, 1, 4), (0, 0, 1), 0),  # one row: its stride is never stepped
        ((3, 4), (4, 1), 4),  # 2-D: the row stride itself
    ],
)
def test_fold_rows(shape, strides, row):
    assert fold_rows(shape, strides) == row


def test_views_of_nd_arrays_are_folded():
    view = arrays.describe(dev((2, 32, 48)), "a")
    assert view.shape == (64, 48) and view.strides == (48, 1) and view.full_shape == (2, 32, 48)
    assert view.major() == 1 and view.nd == ((2, 32, 48), (32 * 48, 48, 1))
    m_major = arrays.describe(dev((2, 32, 48), strides=(32, 1, 64)), "a")
    assert m_major.shape == (64, 48) and m_major.strides == (1, 64) and m_major.major() == 0
    permuted = arrays.describe(dev((2, 32, 48), strides=(48, 96, 1)), "a")
    assert permuted.shape == (64, 48) and permuted.strides is None
    assert permuted.major() is None and not permuted.tma_ready(1) and not api._output_ready(permuted)
    assert arrays.describe(dev((2, 32)), "a").nd is None  # 2-D: as before


def test_overlap_and_same_memory_use_the_arrays_own_geometry():
    buf = dev((2, 32, 64))
    strides = (32 * 64, 64, 1)
    left = arrays.describe(buf.window(0, (2, 32, 32), strides), "a")
    right = arrays.describe(buf.window(32, (2, 32, 32), strides), "out")
    assert left.strides is None or left.strides == (64, 1)
    assert not arrays.overlaps(left, right)  # the address ranges meet; the elements do not
    assert arrays.overlaps(left, arrays.describe(buf.window(24, (2, 32, 32), strides), "out"))
    again = arrays.describe(buf.window(0, (2, 32, 32), strides), "c")
    assert left.same_memory(again) and not left.same_memory(right)


# ---- the host (NumPy) side without a GPU: empty problems --------------------------------
def test_numpy_nd_k0_and_empty_leading_dimensions():
    a = np.ones((2, 3, 0), np.float16)
    res = jitgemm.gemm(a, np.ones((0, 5), np.float16))
    assert res.shape == (2, 3, 5) and not res.any()
    c = np.arange(30, dtype=np.float16).reshape(2, 3, 5)
    res = jitgemm.gemm(a, np.ones((0, 5), np.float16), c=c, beta=0.5)
    np.testing.assert_array_equal(res, c * np.float16(0.5))
    # out written in place through a layout that does not fold
    base = np.full((3, 2, 5), np.nan, np.float32)
    out = base.transpose(1, 0, 2)
    assert jitgemm.gemm(a, np.ones((0, 5), np.float16), out) is out and not base.any()
    empty = jitgemm.gemm(np.ones((0, 4, 8), np.float16), np.ones((8, 6), np.float16))
    assert empty.shape == (0, 4, 6) and empty.dtype == np.float16
    empty = jitgemm.gemm(np.ones((3, 0, 8), np.float16), np.ones((8, 6), np.float16), out_dtype="float32")
    assert empty.shape == (3, 0, 6) and empty.dtype == np.float32


# ---- the driver's strided copies of an N-D array, run in host memory --------------------
def _host_copy_2d(dst_ptr, dst_strides, src_ptr, src_strides, shape, itemsize, stream, dst_host=False, src_host=False):
    dst = _at(dst_ptr, shape, dst_strides, itemsize)
    dst[...] = _at(src_ptr, shape, src_strides, itemsize)


def _at(ptr, shape, strides, itemsize):
    class Interface:
        __array_interface__ = {
            "shape": tuple(shape),
            "typestr": f"<u{itemsize}",
            "data": (ptr, False),
            "strides": tuple(s * itemsize for s in strides),
            "version": 3,
        }

    return np.asarray(Interface())


def _generic_view(array: np.ndarray) -> View:
    view = View(
        array,
        GENERIC,
        array.ctypes.data,
        array.shape,
        tuple(s // array.itemsize for s in array.strides),
        "fp16",
        2,
        0,
    )
    return fold_view(view, "x")


def _padded(x):
    big = np.zeros((*x.shape[:-1], x.shape[-1] + 8), x.dtype)
    big[..., : x.shape[-1]] = x
    return big[..., : x.shape[-1]]


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x,  # folds: one 2-D copy
        _padded,  # folds, rows padded
        lambda x: x.transpose(1, 0, 2).copy().transpose(1, 0, 2),  # does not fold
    ],
    ids=["contiguous", "padded", "not-foldable"],
)
def test_generic_copies_of_nd_arrays(make, monkeypatch):
    """GENERIC (arrays of other libraries) copies an N-D operand to an aligned 2-D buffer and
    an aligned result into an N-D out, whatever its strides, with 2-D driver copies."""
    monkeypatch.setattr(memory, "copy_2d", _host_copy_2d)
    monkeypatch.setattr(libraries, "copy_2d", _host_copy_2d)
    x = np.arange(4 * 3 * 8, dtype=np.float16).reshape(4, 3, 8)
    src = make(x.copy())
    buf = np.zeros((12, 16), np.float16)  # an aligned (M, K + padding) buffer
    dst = fold_view(View(buf, GENERIC, buf.ctypes.data, (12, 8), (16, 1), "fp16", 2, 0), "copy")
    GENERIC.copy_(dst, _generic_view(src), 0)
    np.testing.assert_array_equal(buf[:, :8], x.reshape(12, 8))
    back = np.zeros((3, 4, 8), np.float16).transpose(1, 0, 2)  # an N-D out that does not fold
    GENERIC.copy_(_generic_view(back), dst, 0)
    np.testing.assert_array_equal(back, x)


def test_generic_copy_of_a_4d_array_that_does_not_fold(monkeypatch):
    monkeypatch.setattr(memory, "copy_2d", _host_copy_2d)
    monkeypatch.setattr(libraries, "copy_2d", _host_copy_2d)
    x = np.arange(2 * 3 * 4 * 8, dtype=np.float16).reshape(2, 3, 4, 8)
    src = x.transpose(1, 0, 2, 3).copy().transpose(1, 0, 2, 3)
    assert _generic_view(src).strides is None
    buf = np.zeros((24, 8), np.float16)
    dst = View(buf, GENERIC, buf.ctypes.data, (24, 8), (8, 1), "fp16", 2, 0)
    GENERIC.copy_(dst, _generic_view(src), 0)
    np.testing.assert_array_equal(buf, x.reshape(24, 8))


def test_library_copies_split_a_buffers_rows_without_a_copy():
    """The array libraries copy between an N-D operand and jitgemm's 2-D aligned buffer by seeing
    the buffer with the operand's shape: a view, so that writes land in the buffer."""
    lib = arrays.lib_of(np.zeros(1))
    x = np.arange(4 * 3 * 8, dtype=np.float16).reshape(4, 3, 8)
    permuted = x.transpose(1, 0, 2).copy().transpose(1, 0, 2)
    buf = np.zeros((12, 16), np.float16)
    window = lib.view(buf[:, :8], "copy")
    lib.copy_(window, lib.view(permuted, "a"), None)
    np.testing.assert_array_equal(buf[:, :8], x.reshape(12, 8))
    transposed = np.zeros((8, 16), np.float16)[:, :12].T  # an M-major (12, 8) buffer
    lib.copy_(lib.view(transposed, "copy"), lib.view(permuted, "a"), None)
    np.testing.assert_array_equal(transposed, x.reshape(12, 8))
    out = np.zeros((3, 4, 8), np.float16).transpose(1, 0, 2)
    lib.copy_(lib.view(out, "out"), window, None)
    np.testing.assert_array_equal(out, x)
