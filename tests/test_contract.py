"""The input contract of jitgemm.gemm, on the CPU (issue 6).

Device arrays are small fake objects exposing ``__cuda_array_interface__``; their device is
derived from the fake pointer (the one driver query gemm makes for such arrays is replaced).
Every step of gemm that would touch the GPU is replaced by a tripwire, so a bad input must be
rejected with TypeError/ValueError before any of them; valid inputs must reach the tripwire.
"""

import contextlib
import ctypes
import gc
import weakref

import numpy as np
import pytest

import jitgemm
from jitgemm import api, arrays, launch
from jitgemm.arrays import dlpack, readers
from jitgemm.heuristics import DeviceSpec

DEVICE_BITS = 44  # fake pointers: device ordinal in the bits above this
HUGE_PTR = (1 << 44) + (1 << 43)  # a fake pointer on device 0 for arrays too large for fake_ptr


class ReachedGPU(Exception):
    """gemm got past validation and asked for the GPU."""


def _tripwire(*args, **kwargs):
    raise ReachedGPU


_next_ptr = {}


def fake_ptr(device: int, nbytes: int) -> int:
    base = (device + 1) << DEVICE_BITS
    ptr = _next_ptr.get(device, base + 4096)
    _next_ptr[device] = ptr + -(-max(nbytes, 1) // 4096) * 4096 + 4096
    return ptr


class FakeCAI:
    """A device array as seen through ``__cuda_array_interface__`` only."""

    TYPESTR = {"fp16": "<f2", "fp32": "<f4", "f64": "<f8", "i8": "|i1", "bf16": "<V2"}
    ITEMSIZE = {"fp16": 2, "fp32": 4, "f64": 8, "i8": 1, "bf16": 2}

    def __init__(self, shape, dtype="fp16", strides=None, device=0, ptr=None, **extra):
        itemsize = self.ITEMSIZE[dtype]
        if ptr is None:
            span = (
                itemsize * (1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides)))
                if strides
                else itemsize * int(np.prod(shape))
            )
            ptr = fake_ptr(device, span)
        self.dtype = "bfloat16" if dtype == "bf16" else None
        self.ptr, self.shape, self.itemsize = ptr, tuple(shape), itemsize
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": self.TYPESTR[dtype],
            "data": (ptr, False),
            "strides": None if strides is None else tuple(s * itemsize for s in strides),
            "version": 3,
            "stream": None,
            **extra,
        }

    def window(self, offset_elements, shape, strides, dtype="fp16"):
        """Another fake viewing this one's memory."""
        return FakeCAI(shape, dtype, strides, ptr=self.ptr + offset_elements * self.itemsize)


class Opaque:
    """Not an array at all."""


class Hostile:
    """Every attribute lookup raises something other than AttributeError."""

    def __getattr__(self, name):
        raise RuntimeError(f"no {name} for you")


class HostileCAI:
    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("the device is gone")


class HostileDLPack:
    def __dlpack__(self, **kw):
        raise RuntimeError("no export")

    def __dlpack_device__(self):
        raise RuntimeError("no device")


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    monkeypatch.setenv("JITGEMM_TUNED", "0")  # a tuning file would ask the driver for the device name
    monkeypatch.setattr(readers, "pointer_device", lambda ptr: (ptr >> DEVICE_BITS) - 1)
    monkeypatch.setattr(api, "device_spec", lambda ordinal: DeviceSpec("sm_90a", 132))
    for name in ("on_device", "current_device"):
        monkeypatch.setattr(api.context, name, _tripwire)
    monkeypatch.setattr(api, "stream_wait", _tripwire)
    monkeypatch.setattr(launch, "stream_is_capturing", _tripwire)
    monkeypatch.setattr(api.kernels, "get", _tripwire)


M, N, K = 64, 48, 32


def dev(shape, dtype="fp16", **kw):
    return FakeCAI(shape, dtype, **kw)


def host(shape, dtype=np.float16):
    return np.ones(shape, dtype)


def overlapping_out():
    a = dev((M, K + N), strides=(K + N, 1))
    return {"a": a.window(0, (M, K), (K + N, 1)), "out": a.window(K - 8, (M, N), (K + N, 1))}


def base(**over):
    args = {"a": dev((M, K)), "b": dev((K, N))}
    args.update(over)
    return args


def wrong_config():
    """A valid KernelConfig, but for bfloat16 inputs (the fakes are float16)."""
    return jitgemm.KernelConfig(dtype="bf16", out_dtype="bf16")


BAD = [
    # (id, arguments, exception, words the message must contain: the argument first)
    ("a-not-array", lambda: base(a=[[1.0, 2.0]]), TypeError, ["a:", "got list"]),
    ("b-not-array", lambda: base(b=Opaque()), TypeError, ["b:", "got Opaque"]),
    ("out-not-array", lambda: base(out="x"), TypeError, ["out:", "got str"]),
    ("c-not-array", lambda: base(c=3.0), TypeError, ["c:", "got float"]),
    ("a-1d", lambda: base(a=dev((M,))), ValueError, ["a:", "2-D", "1-D"]),
    ("b-3d", lambda: base(b=dev((2, K, N))), ValueError, ["b:", "2-D", "3-D"]),
    ("out-1d", lambda: base(out=dev((M * N,))), ValueError, ["out:", "2-D", "1-D"]),
    ("inner-mismatch", lambda: base(b=dev((K + 1, N))), ValueError, ["b:", f"({K}, N)", f"({K + 1}, {N})"]),
    (
        "a-float32",
        lambda: base(a=dev((M, K), "fp32"), b=dev((K, N), "fp32")),
        TypeError,
        ["a:", "bfloat16 or float16", "float32"],
    ),
    ("a-float64", lambda: base(a=dev((M, K), "f64")), TypeError, ["a:", "unsupported dtype", "<f8"]),
    ("b-int8", lambda: base(b=dev((K, N), "i8")), TypeError, ["b:", "unsupported dtype", "|i1"]),
    ("mixed-dtypes", lambda: base(b=dev((K, N), "bf16")), TypeError, ["b:", "float16", "bfloat16"]),
    ("b-other-device", lambda: base(b=dev((K, N), device=1)), ValueError, ["b:", "device 0", "device 1"]),
    ("out-other-device", lambda: base(out=dev((M, N), device=1)), ValueError, ["out:", "device 0", "device 1"]),
    ("c-other-device", lambda: base(c=dev((M, N), device=2)), ValueError, ["c:", "device 0", "device 2"]),
    ("host-a-device-b", lambda: base(a=host((M, K))), ValueError, ["b:", "NumPy host array like a", "device array"]),
    ("device-a-host-b", lambda: base(b=host((K, N))), ValueError, ["b:", "device array like a", "NumPy"]),
    (
        "host-ab-device-out",
        lambda: base(a=host((M, K)), b=host((K, N)), out=dev((M, N))),
        ValueError,
        ["out:", "NumPy host array"],
    ),
    ("device-ab-host-c", lambda: base(c=host((M, N))), ValueError, ["c:", "device array like a"]),
    ("out-shape", lambda: base(out=dev((M, N + 1))), ValueError, ["out:", f"({M}, {N})", f"({M}, {N + 1})"]),
    ("out-dtype", lambda: base(out=dev((M, N), "bf16")), TypeError, ["out:", "float16", "float32", "bfloat16"]),
    (
        "out-vs-out_dtype",
        lambda: base(out=dev((M, N)), out_dtype="float32"),
        TypeError,
        ["out:", "float32 (out_dtype)", "float16"],
    ),
    (
        "out-readonly",
        lambda: base(out=FakeCAI((M, N), data=(fake_ptr(0, M * N * 2), True))),
        ValueError,
        ["out:", "writable", "read-only"],
    ),
    ("c-shape", lambda: base(c=dev((N, M))), ValueError, ["c:", f"({M}, {N})", f"({N}, {M})"]),
    ("c-dtype", lambda: base(c=dev((M, N), "fp32")), TypeError, ["c:", "float16 (the output dtype)", "float32"]),
    (
        "c-dtype-vs-out",
        lambda: base(out=dev((M, N), "fp32"), c=dev((M, N))),
        TypeError,
        ["c:", "float32 (the output dtype)", "float16"],
    ),
    ("out-overlaps-a", lambda: base(**overlapping_out()), ValueError, ["out:", "overlaps a"]),
    ("out-is-b", lambda: (lambda b: base(a=dev((K, K)), b=b, out=b))(dev((K, K))), ValueError, ["out:", "overlaps b"]),
    (
        "out-partly-c",
        lambda: (lambda buf: base(c=buf.window(0, (M, N), (N + 8, 1)), out=buf.window(8, (M, N), (N + 8, 1))))(
            dev((M, N + 8))
        ),
        ValueError,
        ["out:", "partially overlaps c", "out=c"],
    ),
    ("a-broadcast", lambda: base(a=dev((M, K), strides=(0, 1))), ValueError, ["a:", "positive", "(0, 1)", "broadcast"]),
    ("b-reversed", lambda: base(b=dev((K, N), strides=(-N, 1))), ValueError, ["b:", "positive", f"(-{N}, 1)"]),
    ("c-broadcast-cols", lambda: base(c=dev((M, N), strides=(1, 0))), ValueError, ["c:", "positive"]),
    (
        "out-odd-strides",
        lambda: base(out=_byte_strides(dev((M, N)), (2 * N + 1, 2))),
        ValueError,
        ["out:", "multiples of the element size", f"({2 * N + 1}, 2) bytes"],
    ),
    (
        "cai-no-data",
        lambda: base(a=type("Bad", (), {"__cuda_array_interface__": {"shape": (M, K)}})()),
        TypeError,
        ["a:", "'shape', 'typestr' and 'data'"],
    ),
    ("cai-version", lambda: base(b=FakeCAI((K, N), version=7)), ValueError, ["b:", "version 7"]),
    ("cai-mask", lambda: base(b=FakeCAI((K, N), mask=object())), ValueError, ["b:", "mask"]),
    ("cai-stream-0", lambda: base(a=FakeCAI((M, K), stream=0)), ValueError, ["a:", "'stream' must not be 0"]),
    (
        "dlpack-host",
        lambda: base(
            b=type("HostDL", (), {"__dlpack__": lambda self, **kw: None, "__dlpack_device__": lambda self: (1, 0)})()
        ),
        ValueError,
        ["b:", "DLPack device type 1", "not CUDA memory"],
    ),
    ("out_dtype-int8", lambda: base(out_dtype="int8"), TypeError, ["out_dtype:", "float16", "float32", "'int8'"]),
    ("out_dtype-other-half", lambda: base(out_dtype="bfloat16"), TypeError, ["out_dtype:", "float16", "'bfloat16'"]),
    ("alpha-str", lambda: base(alpha="2"), TypeError, ["alpha:", "real number", "'2'"]),
    ("beta-complex", lambda: base(beta=1j), TypeError, ["beta:", "real number", "complex"]),
    ("alpha-none", lambda: base(alpha=None), TypeError, ["alpha:", "NoneType"]),
    ("stream-str", lambda: base(stream="s0"), TypeError, ["stream:", "'s0'"]),
    ("stream-negative", lambda: base(stream=-5), TypeError, ["stream:", "-5"]),
    ("config-dict", lambda: base(config={"block_m": 128}), TypeError, ["config:", "KernelConfig", "dict"]),
    ("config-mismatch", lambda: base(config=wrong_config()), ValueError, ["config:", "dtype", "bf16", "fp16"]),
    # sizes the kernels' 32-bit ints and the 64-bit address space cannot hold (issue 16)
    ("a-rows-2^31", lambda: base(a=dev((1 << 31, K), ptr=HUGE_PTR)), ValueError, ["a:", "dimension 0", "32-bit"]),
    ("b-cols-2^31", lambda: base(b=dev((K, 1 << 31), ptr=HUGE_PTR)), ValueError, ["b:", "dimension 1", "32-bit"]),
    ("k-2^32", lambda: base(a=dev((M, 1 << 32), ptr=HUGE_PTR)), ValueError, ["a:", "dimension 1"]),
    (
        "output-2^40",
        lambda: base(a=dev((1 << 21, 8), ptr=HUGE_PTR), b=dev((8, (1 << 19) + 8), ptr=HUGE_PTR)),
        ValueError,
        ["b:", "output elements", "2^40"],
    ),
    (
        "a-stride-2^50",
        lambda: base(a=dev((M, K), strides=(1 << 50, 1), ptr=HUGE_PTR)),
        ValueError,
        ["a:", "spans", "bytes"],
    ),
    ("b-past-2^64", lambda: base(b=dev((K, N), ptr=(1 << 64) - 64)), ValueError, ["b:", "64-bit address space"]),
    # N-D a (..., K) with out and c (..., N) (issue 18, item 5); b stays 2-D
    ("a-0d", lambda: base(a=dev(())), ValueError, ["a:", "2-D", "0-D"]),
    ("b-3d-with-3d-a", lambda: base(a=dev((2, 32, K)), b=dev((1, K, N))), ValueError, ["b:", "2-D", "3-D"]),
    (
        "3d-a-inner-mismatch",
        lambda: base(a=dev((2, 32, K)), b=dev((K + 1, N))),
        ValueError,
        ["b:", f"({K}, N)", f"(2, 32, {K})"],
    ),
    (
        "3d-a-2d-out",
        lambda: base(a=dev((2, 32, K)), out=dev((M, N))),
        ValueError,
        ["out:", f"(2, 32, {N})", "leading dimensions of a", f"({M}, {N})"],
    ),
    ("3d-a-2d-c", lambda: base(a=dev((2, 32, K)), c=dev((M, N))), ValueError, ["c:", f"(2, 32, {N})"]),
    ("2d-a-3d-out", lambda: base(out=dev((1, M, N))), ValueError, ["out:", f"({M}, {N})", f"(1, {M}, {N})"]),
    ("3d-a-other-batch-out", lambda: base(a=dev((2, 32, K)), out=dev((4, 16, N))), ValueError, ["out:"]),
    (
        "3d-a-rows-2^32",
        lambda: base(a=dev((1 << 16, 1 << 16, 16), ptr=HUGE_PTR), b=dev((16, N))),
        ValueError,
        ["a:", "leading dimensions", "32-bit"],
    ),
    ("3d-out-overlaps-3d-a", lambda: base(**_nd_overlapping_out()), ValueError, ["out:", "overlaps a"]),
    ("4d-a-broadcast", lambda: base(a=dev((2, 2, 16, K), strides=(0, 16 * K, K, 1))), ValueError, ["a:", "positive"]),
    (
        "numpy-3d-a-2d-out",
        lambda: base(a=host((2, 32, K)), b=host((K, N)), out=host((M, N))),
        ValueError,
        ["out:", f"(2, 32, {N})"],
    ),
    # non-native byte order: the bytes would be read as little-endian (issue 16)
    (
        "numpy-big-endian-a",
        lambda: base(a=host((M, K), ">f2"), b=host((K, N))),
        TypeError,
        ["a:", "float16", "non-native byte order", "'>f2'"],
    ),
    ("numpy-big-endian-b", lambda: base(a=host((M, K)), b=host((K, N), ">f2")), TypeError, ["b:", "non-native"]),
    (
        "numpy-big-endian-out",
        lambda: base(a=host((M, K)), b=host((K, N)), out=host((M, N), ">f4")),
        TypeError,
        ["out:", "non-native"],
    ),
    (
        "numpy-big-endian-c",
        lambda: base(a=host((M, K)), b=host((K, N)), c=host((M, N), ">f2")),
        TypeError,
        ["c:", "non-native"],
    ),
    ("cai-big-endian-f2", lambda: base(a=_typestr(dev((M, K)), ">f2")), TypeError, ["a:", "big-endian", "'>f2'"]),
    ("cai-big-endian-u2", lambda: base(b=_typestr(dev((K, N)), ">u2")), TypeError, ["b:", "big-endian", "'>u2'"]),
    (
        "cai-big-endian-bf16",
        lambda: base(a=_typestr(dev((M, K), "bf16"), ">V2"), b=dev((K, N), "bf16")),
        TypeError,
        ["a:", "big-endian"],
    ),
    # hostile objects, malformed interfaces, scalars that overflow (issue 16)
    ("a-getattr-raises", lambda: base(a=Hostile()), TypeError, ["a:", "got Hostile"]),
    ("b-cai-property-raises", lambda: base(b=HostileCAI()), TypeError, ["b:", "got HostileCAI"]),
    ("c-dlpack-device-raises", lambda: base(c=HostileDLPack()), TypeError, ["c:", "__dlpack_device__"]),
    (
        "cai-strides-1-entry",
        lambda: base(a=_byte_strides(dev((M, K)), (2,))),
        ValueError,
        ["a:", "'strides'", "one entry per dimension"],
    ),
    (
        "cai-strides-floats",
        lambda: base(b=_byte_strides(dev((K, N)), (2.0 * N, 2.0))),
        TypeError,
        ["b:", "'strides'", "tuple of ints"],
    ),
    ("cai-strides-2^70", lambda: base(a=_byte_strides(dev((M, K)), (1 << 70, 2))), ValueError, ["a:", "spans"]),
    ("cai-shape-negative", lambda: base(a=_cai(dev((M, K)), shape=(-M, K))), ValueError, ["a:", "negative"]),
    ("cai-shape-float", lambda: base(a=_cai(dev((M, K)), shape=(float(M), K))), TypeError, ["a:", "'shape'"]),
    ("cai-typestr-int", lambda: base(b=_typestr(dev((K, N)), 2)), TypeError, ["b:", "unsupported dtype"]),
    ("cai-ptr-2^64", lambda: base(a=FakeCAI((M, K), data=(1 << 64, False))), ValueError, ["a:", "64-bit address"]),
    ("cai-ptr-negative", lambda: base(a=FakeCAI((M, K), data=(-4096, False))), ValueError, ["a:", "pointer"]),
    ("cai-ptr-str", lambda: base(out=FakeCAI((M, N), data=("4096", False))), TypeError, ["out:", "'data'"]),
    ("cai-data-3", lambda: base(c=FakeCAI((M, N), data=(4096, False, 0))), TypeError, ["c:", "'data'"]),
    ("cai-stream-minus-1", lambda: base(a=FakeCAI((M, K), stream=-1)), ValueError, ["a:", "'stream'", "[1, 2^64)"]),
    ("cai-stream-2^64", lambda: base(b=FakeCAI((K, N), stream=1 << 64)), ValueError, ["b:", "'stream'"]),
    ("cai-stream-str", lambda: base(a=FakeCAI((M, K), stream="1")), TypeError, ["a:", "'stream'", "'1'"]),
    ("cai-stream-true", lambda: base(a=FakeCAI((M, K), stream=True)), TypeError, ["a:", "'stream'", "True"]),
    ("cai-stream-float", lambda: base(out=FakeCAI((M, N), stream=1.5)), TypeError, ["out:", "'stream'"]),
    ("cai-version-true", lambda: base(b=FakeCAI((K, N), version=True)), ValueError, ["b:", "version True"]),
    ("alpha-10^400", lambda: base(alpha=10**400), ValueError, ["alpha:", "finite", "float32"]),
    ("beta-1e39", lambda: base(beta=-1e39), ValueError, ["beta:", "float32"]),
    ("alpha-1e39", lambda: base(alpha=1e39), ValueError, ["alpha:", "float32", "1e+39"]),
    ("alpha-nan", lambda: base(alpha=float("nan")), ValueError, ["alpha:", "finite"]),
    ("beta-inf", lambda: base(beta=np.inf), ValueError, ["beta:", "finite"]),
    ("stream-true", lambda: base(stream=True), TypeError, ["stream:", "True"]),
    ("stream-2^64", lambda: base(stream=1 << 64), TypeError, ["stream:", "2^64"]),
    ("stream-protocol-raises", lambda: base(stream=Hostile()), TypeError, ["stream:", "could not be read"]),
    (
        "stream-protocol-huge",
        lambda: base(stream=type("S", (), {"__cuda_stream__": lambda self: (0, -1)})()),
        TypeError,
        ["stream:"],
    ),
    (
        "numpy-float64",
        lambda: base(a=host((M, K), np.float64), b=host((K, N), np.float64)),
        TypeError,
        ["a:", "unsupported dtype float64"],
    ),
    ("numpy-mismatch", lambda: base(a=host((M, K)), b=host((K + 3, N))), ValueError, ["b:", f"({K}, N)"]),
    (
        "numpy-broadcast",
        lambda: base(a=np.broadcast_to(host((1, K)), (M, K)), b=host((K, N))),
        ValueError,
        ["a:", "positive", "broadcast"],
    ),
    (
        "numpy-readonly-out",
        lambda: base(a=host((M, K)), b=host((K, N)), out=_readonly(host((M, N)))),
        ValueError,
        ["out:", "read-only"],
    ),
    (
        "numpy-out-is-a",
        lambda: (lambda x: base(a=x, b=host((K, K)), out=x))(host((K, K))),
        ValueError,
        ["out:", "overlaps a"],
    ),
]


def _nd_overlapping_out():
    rows = K + N  # a (2, 32, K) and an out (2, 32, N) in the columns of one (2, 32, K + N) buffer
    buf = dev((2, 32, rows))
    strides = (32 * rows, rows, 1)
    return {"a": buf.window(0, (2, 32, K), strides), "out": buf.window(K - 8, (2, 32, N), strides)}


def _byte_strides(fake, strides):
    fake.__cuda_array_interface__["strides"] = strides
    return fake


def _cai(fake, **fields):
    fake.__cuda_array_interface__.update(fields)
    return fake


def _typestr(fake, typestr):
    fake.__cuda_array_interface__["typestr"] = typestr
    return fake


def _readonly(x):
    x.flags.writeable = False
    return x


@pytest.mark.parametrize("make, exc, words", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_input_is_rejected_before_the_gpu(make, exc, words):
    kwargs = make()
    a, b = kwargs.pop("a"), kwargs.pop("b")
    with pytest.raises(exc) as info:
        jitgemm.gemm(a, b, **kwargs)
    message = str(info.value)
    assert message.startswith(words[0]), f"the message must name the argument first: {message}"
    for word in words[1:]:
        assert word in message, f"{word!r} missing from: {message}"


GOOD = [
    ("row-major", lambda: base()),
    ("transposed-views", lambda: base(a=dev((M, K), strides=(1, M)), b=dev((K, N), strides=(1, K)))),
    ("bf16", lambda: base(a=dev((M, K), "bf16"), b=dev((K, N), "bf16"))),
    ("fp32-out", lambda: base(out=dev((M, N), "fp32"))),
    ("out_dtype-float32", lambda: base(out_dtype=np.float32)),
    ("c-alpha-beta", lambda: base(c=dev((M, N)), alpha=2, beta=np.float32(0.5))),
    ("out-is-c", lambda: (lambda c: base(out=c, c=c))(dev((M, N)))),
    ("strided-fallback", lambda: base(a=dev((M, K), strides=(2 * K, 2)))),
    (
        "disjoint-columns-of-one-buffer",
        lambda: (lambda buf: base(a=buf.window(0, (M, K), (K + N, 1)), out=buf.window(K, (M, N), (K + N, 1))))(
            dev((M, K + N))
        ),
    ),
    ("size-1-dims-any-stride", lambda: base(a=dev((1, K), strides=(0, 1)), b=dev((K, 1), strides=(1, 0)))),
    ("largest-dims", lambda: base(a=dev(((1 << 31) - 1024, 16), ptr=HUGE_PTR), b=dev((16, 64)))),
    ("size-1-dim-huge-stride", lambda: base(a=dev((1, K), strides=(1 << 62, 1)))),
    ("stream-int", lambda: base(stream=7)),
    ("stream-protocol", lambda: base(stream=type("S", (), {"__cuda_stream__": lambda self: (0, 99)})())),
    ("config-that-fits", lambda: base(config=jitgemm.KernelConfig(dtype="fp16", out_dtype="fp16"))),
    ("3d-a", lambda: base(a=dev((2, 32, K)))),
    ("4d-a-out-c", lambda: base(a=dev((2, 2, 16, K)), out=dev((2, 2, 16, N), "fp32"), c=dev((2, 2, 16, N), "fp32"))),
    ("3d-a-m-major", lambda: base(a=dev((2, 32, K), strides=(32, 1, M)))),
    ("3d-a-padded-rows", lambda: base(a=dev((2, 32, K), strides=(32 * (K + 8), K + 8, 1)))),
    ("3d-a-not-foldable", lambda: base(a=dev((2, 32, K), strides=(K, 2 * K, 1)))),
    ("3d-a-size-1-any-stride", lambda: base(a=dev((1, M, K), strides=(0, K, 1)))),
    ("3d-out-not-foldable", lambda: base(a=dev((2, 32, K)), out=dev((2, 32, N), strides=(N, 2 * N, 1)))),
    ("3d-out-is-c", lambda: (lambda c: base(a=dev((2, 32, K)), out=c, c=c))(dev((2, 32, N)))),
    (
        "3d-disjoint-columns",
        lambda: (
            lambda buf: base(
                a=buf.window(0, (2, 32, K), (32 * (K + N), K + N, 1)),
                out=buf.window(K, (2, 32, N), (32 * (K + N), K + N, 1)),
            )
        )(dev((2, 32, K + N))),
    ),
]


@pytest.mark.parametrize("make", [case[1] for case in GOOD], ids=[case[0] for case in GOOD])
def test_valid_input_reaches_the_gpu(make):
    """The other side of the table: valid inputs pass validation (and only then ask for the GPU)."""
    kwargs = make()
    with pytest.raises(ReachedGPU):
        jitgemm.gemm(kwargs.pop("a"), kwargs.pop("b"), **kwargs)


# ---- NumPy: empty problems are answered on the host, without a GPU ----
@pytest.mark.parametrize("m, n", [(0, 5), (4, 0), (0, 0)])
def test_numpy_zero_size_output(m, n):
    res = jitgemm.gemm(np.ones((m, 3), np.float16), np.ones((3, n), np.float16))
    assert isinstance(res, np.ndarray) and res.shape == (m, n) and res.dtype == np.float16


def test_numpy_k0_gives_zeros():
    out = np.full((4, 6), np.nan, np.float32)
    res = jitgemm.gemm(np.ones((4, 0), np.float16), np.ones((0, 6), np.float16), out)
    assert res is out and not out.any()


def test_numpy_k0_gives_beta_c_and_accumulates_in_place():
    c = np.arange(24, dtype=np.float16).reshape(4, 6)
    res = jitgemm.gemm(np.ones((4, 0), np.float16), np.ones((0, 6), np.float16), c=c, beta=0.5, alpha=3.0)
    assert res is not c and res.dtype == np.float16
    np.testing.assert_array_equal(res, np.arange(24, dtype=np.float16).reshape(4, 6) * 0.5)
    res = jitgemm.gemm(np.ones((4, 0), np.float16), np.ones((0, 6), np.float16), c, c=c, beta=2.0)
    assert res is c
    np.testing.assert_array_equal(c, np.arange(24, dtype=np.float16).reshape(4, 6) * 2)


def test_numpy_k0_out_dtype():
    res = jitgemm.gemm(np.ones((2, 0), np.float16), np.ones((0, 3), np.float16), out_dtype="float32")
    assert res.dtype == np.float32 and res.shape == (2, 3) and not res.any()


def test_numpy_bfloat16_k0():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.ones((2, 0), ml_dtypes.bfloat16)
    res = jitgemm.gemm(a, np.ones((0, 3), ml_dtypes.bfloat16))
    assert res.dtype == ml_dtypes.bfloat16 and res.shape == (2, 3)


# ---- pieces of the contract that are plain functions ----
@pytest.mark.parametrize(
    "stream, handle",
    [
        (0, 0),
        (12345, 12345),
        (type("TorchLike", (), {"cuda_stream": 77})(), 77),
        (type("CupyLike", (), {"ptr": 88})(), 88),
        (type("Protocol", (), {"__cuda_stream__": lambda self: (0, 99)})(), 99),
    ],
)
def test_stream_handles(stream, handle):
    assert api._stream_handle(stream) == handle


@pytest.mark.parametrize("bad", [True, -1, 1.5, "0", None, 1 << 64])
def test_stream_handle_rejects(bad):
    with pytest.raises(TypeError, match="^stream:"):
        api._stream_handle(bad)


@pytest.mark.parametrize("spelling", ["float32", "fp32", np.float32, np.dtype("float32")])
def test_out_dtype_spellings(spelling):
    assert api._out_dtype_name(spelling, "fp16") == "fp32"


def _view(shape, strides, ptr=1 << 20, itemsize=2):
    return arrays.View(None, None, ptr, shape, strides, "fp16", itemsize, 0)


@pytest.mark.parametrize(
    "x, y, expected",
    [
        (_view((4, 4), (8, 1)), _view((4, 4), (8, 1), ptr=(1 << 20) + 8), False),  # left and right halves
        (_view((4, 4), (8, 1)), _view((4, 4), (8, 1), ptr=(1 << 20) + 6), True),  # one column shared
        (_view((4, 4), (4, 1)), _view((4, 4), (1, 4)), True),  # a buffer and its transpose
        (_view((4, 4), (4, 1)), _view((4, 4), (4, 1), ptr=(1 << 20) + 32), False),  # back to back
        (_view((0, 4), (4, 1)), _view((4, 4), (4, 1)), False),  # empty
    ],
)
def test_overlaps_is_exact(x, y, expected):
    assert arrays.overlaps(x, y) is expected


@pytest.mark.parametrize(
    "shape, strides, ptr, ready",
    [
        ((64, 32), (32, 1), 1 << 20, True),
        ((64, 32), (32, 1), (1 << 20) + 2, False),  # misaligned base
        ((64, 7), (8, 1), 1 << 20, False),  # ragged row: 14 bytes
        ((64, 32), (36, 1), 1 << 20, False),  # leading stride 72 bytes
        ((64, 32), (40, 1), 1 << 20, True),  # padded rows of 80 bytes
    ],
)
def test_tma_ready(shape, strides, ptr, ready):
    assert arrays.View(None, None, ptr, shape, strides, "fp16", 2, 0).tma_ready(1) is ready


@pytest.mark.parametrize(
    "shape, strides, ptr, readable",
    [
        ((64, 32), (32, 1), 1 << 20, True),
        ((64, 32), (32, 1), (1 << 20) + 2, False),  # misaligned base
        ((64, 7), (8, 1), 1 << 20, True),  # ragged row of 14 bytes in rows of 16: loads as zeros past it
        ((64, 7), (7, 1), 1 << 20, False),  # contiguous ragged rows: each starts at its own offset
        ((64, 32), (36, 1), 1 << 20, False),  # leading stride 72 bytes
        ((64, 1021), (1024, 1), 1 << 20, True),  # a slice x[:, :1021]
    ],
)
def test_tma_readable_operands_may_end_mid_unit(shape, strides, ptr, readable):
    """Operands (loads) need a 16-byte base and leading stride only; outputs (stores) also rows of
    whole units (tma_ready)."""
    view = arrays.View(None, None, ptr, shape, strides, "fp16", 2, 0)
    assert view.tma_readable(1) is readable
    assert view.tma_ready(1) is (readable and shape[1] * 2 % 16 == 0)


def test_fake_pointer_device_mapping_is_used():
    """The fixture's pointer->device map is what gemm consults (the tripwire test above would
    pass vacuously otherwise)."""
    x = dev((4, 4), device=3)
    assert arrays.resolve_device(arrays.describe(x, "x"), "x").device == 3


# --------------------------------------------------------------------------------------------
# DeviceArray's own DLPack export, read back on the CPU (the fake pointer is never dereferenced)
# --------------------------------------------------------------------------------------------
class FakeMemory:
    """Stands in for arrays.DeviceMemory: a pointer, and no context to make current."""

    def __init__(self, ptr):
        self.ptr, self.nbytes = ptr, 0

    def current(self):
        return contextlib.nullcontext()


def _capsule_api(name, restype, *argtypes):
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_name = _capsule_api("PyCapsule_GetName", ctypes.c_char_p, ctypes.py_object)
_capsule_pointer = _capsule_api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_capsule_set_name = _capsule_api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_USED = ctypes.c_char_p(b"used_dltensor")  # the name a consumer gives a capsule it took


def _device_array(dtype, shape=(3, 5), device=1, stream=1):
    return arrays.DeviceArray(FakeMemory(fake_ptr(device, 4096)), shape, dtype, device, stream)


@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("dtype, code, bits", [("bf16", 4, 16), ("fp16", 2, 16), ("fp32", 2, 32)])
def test_dlpack_export_fields(dtype, code, bits, versioned):
    arr = _device_array(dtype)
    assert arr.__dlpack_device__() == (2, 1)
    cap = arr.__dlpack__(stream=-1, max_version=(1, 0) if versioned else None)
    name = b"dltensor_versioned" if versioned else b"dltensor"
    assert _capsule_name(cap) == name
    address = _capsule_pointer(cap, name)
    struct = dlpack.DLManagedTensorVersioned if versioned else dlpack.DLManagedTensor
    managed = struct.from_address(address)
    if versioned:
        assert (managed.version.major, managed.version.minor) == (1, 0) and managed.flags == 0
    t = managed.dl_tensor
    assert t.data == arr.ptr and t.byte_offset == 0 and t.ndim == 2
    assert (t.device.device_type, t.device.device_id) == (2, 1)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)
    assert (t.shape[0], t.shape[1]) == (3, 5) and (t.strides[0], t.strides[1]) == (5, 1)
    assert managed.deleter


@pytest.mark.parametrize("versioned", [False, True])
def test_dlpack_capsule_keeps_the_array_alive(versioned):
    """Unconsumed: the capsule's destructor frees the export. Consumed: only the deleter does."""
    max_version = (1, 0) if versioned else None
    arr = _device_array("bf16")
    alive = weakref.ref(arr)
    cap = arr.__dlpack__(max_version=max_version)  # stream None: the legacy stream, as produced
    del arr
    gc.collect()
    assert alive() is not None  # the capsule holds the memory's owner
    del cap
    gc.collect()
    assert alive() is None

    arr = _device_array("fp16")
    alive = weakref.ref(arr)
    cap = arr.__dlpack__(stream=-1, max_version=max_version)
    name = _capsule_name(cap)
    address = _capsule_pointer(cap, name)
    struct = dlpack.DLManagedTensorVersioned if versioned else dlpack.DLManagedTensor
    assert _capsule_set_name(cap, _USED) == 0  # what a consumer does when it takes the tensor
    del arr, cap
    gc.collect()
    assert alive() is not None  # the consumer's tensor still needs it
    struct.from_address(address).deleter(address)  # the consumer is done
    gc.collect()
    assert alive() is None


def test_dlpack_export_orders_the_consumer_stream(monkeypatch):
    waits = []
    monkeypatch.setattr(dlpack, "stream_wait", lambda *args: waits.append(args))
    arr = _device_array("bf16", device=2, stream=7)
    for stream in (7, -1):  # the producing stream; "do not synchronise"
        arr.__dlpack__(stream=stream)
    assert waits == []
    arr.__dlpack__(stream=9)
    arr.__dlpack__()  # None: the legacy default stream
    assert waits == [(9, 7, 2), (arrays.LEGACY_STREAM, 7, 2)]
    with pytest.raises(ValueError, match="ambiguous"):
        arr.__dlpack__(stream=0)
    with pytest.raises(BufferError):
        arr.__dlpack__(stream=-1, dl_device=(1, 0))
    with pytest.raises(BufferError):
        arr.__dlpack__(stream=-1, copy=True)
    arr.__dlpack__(stream=-1, dl_device=(2, 2), copy=False)


class _LegacyOnly:
    """A DLPack producer of before max_version: consumers fall back to the legacy capsule."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, stream=None):
        return self.arr.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_dlpack_export_read_by_cuda_core(dtype, legacy):
    """An independent consumer (cuda.core, reading bfloat16 through ml_dtypes) agrees."""
    pytest.importorskip("ml_dtypes")
    utils = pytest.importorskip("cuda.core.utils")
    arr = _device_array(dtype, shape=(4, 6))
    alive = weakref.ref(arr)
    smv = utils.StridedMemoryView.from_dlpack(_LegacyOnly(arr) if legacy else arr, stream_ptr=-1)
    assert (smv.ptr, tuple(smv.shape), smv.device_id) == (arr.ptr, (4, 6), 1)
    assert smv.strides is None or tuple(smv.strides) == (6, 1)
    assert smv.dtype == arrays.numpy_dtype(dtype)
    del arr
    gc.collect()
    assert alive() is not None
    del smv
    gc.collect()
    assert alive() is None


def test_tensor_maps_refuse_what_tma_cannot_address():
    from jitgemm import runtime

    for dims, stride, ptr in [
        ((1 << 33, 8), 16, 0x1000),
        ((8, 0), 16, 0x1000),
        ((8, 8), 1 << 40, 0x1000),
        ((8, 8), 24, 0x1000),
        ((8, 8), 16, 0x1008),
        ((8, 8), 16, 1 << 64),
    ]:
        with pytest.raises(ValueError, match="tensor map"):
            runtime.tensor_map_2d("bf16", ptr, *dims, stride, (64, 8), 128)


def test_numpy_big_endian_bfloat16_is_refused():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    swapped = np.dtype(ml_dtypes.bfloat16).newbyteorder(">")
    with pytest.raises(TypeError, match="^a: bfloat16 in non-native byte order"):
        jitgemm.gemm(np.ones((4, 8), swapped), np.ones((8, 4), ml_dtypes.bfloat16))
