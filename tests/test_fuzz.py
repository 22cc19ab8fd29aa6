"""Fuzzing the input contract on the CPU (issue 16): whatever gemm is given, it raises
TypeError/ValueError naming an argument, or passes validation - never anything else.

Device arrays are fake ``__cuda_array_interface__`` objects drawn by hypothesis: good ones
with some fields swapped for bad values (shapes negative, huge or not ints, strides of the
wrong length, zero, negative or huge, typestrs of other types or byte orders, pointers out of
range or of the wrong type, stream values the CAI spec refuses, read-only flags), beside
hostile objects. The GPU boundary is replaced by a sentinel: a call that reaches it passed
validation. KernelConfig and JITGEMM_CONFIG are fuzzed the same way.
"""

import json
import re
from dataclasses import fields
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitgemm
from jitgemm import api
from jitgemm.arrays import readers
from jitgemm.config import KernelConfig
from jitgemm.heuristics import DeviceSpec, check_config, config_from_env
from jitgemm.problem import Problem

H200 = DeviceSpec("sm_90a", 132)
ARGUMENTS = re.compile(r"^(a|b|out|c|alpha|beta|out_dtype|stream|config):")
FUZZ = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class PassedValidation(Exception):
    """gemm reached the GPU boundary: the drawn call was valid."""


def _passed(*args, **kwargs):
    raise PassedValidation


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setenv("JITGEMM_TUNED", "0")
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    monkeypatch.setattr(readers, "pointer_device", lambda ptr: 0)
    monkeypatch.setattr(api, "device_spec", lambda ordinal: H200)
    monkeypatch.setattr(api.context, "current_device", lambda: 0)
    # The first GPU work of each path: the device path enters the device's context, the host
    # path (NumPy) uploads in _gemm_host.
    monkeypatch.setattr(api.context, "on_device", _passed)
    monkeypatch.setattr(api, "_gemm_host", _passed)


class FakeArray:
    def __init__(self, cai, dtype=None):
        self.__cuda_array_interface__ = cai
        if dtype is not None:
            self.dtype = dtype


class Hostile:
    def __getattr__(self, name):
        raise RuntimeError(f"no {name}")


HUGE = [1 << 31, (1 << 31) - 1024, 1 << 40, 1 << 64, 1 << 70]
BAD_INTS = [-1, -(1 << 63), *HUGE]
NON_INTS = [1.5, 2.0, "2", None, True, [2], float("nan")]
sizes = st.one_of(st.integers(0, 48), st.sampled_from(BAD_INTS))
stream_values = st.sampled_from([None, None, 1, 2, 12345, 0, -1, 1 << 64, "1", True, 1.5, [1]])


@st.composite
def cai_arrays(draw, rows, cols, slot, dtype="fp16", clean=False):
    """A fake device array of shape (rows, cols), each field (unless `clean`) possibly replaced
    by a bad value."""

    def maybe(good, bad):
        return draw(st.one_of(st.just(good), bad)) if not clean and draw(st.integers(0, 7)) == 0 else good

    itemsize = 4 if dtype == "fp32" else 2
    shape = maybe(
        (rows, cols),
        st.one_of(
            st.tuples(sizes, sizes), st.lists(sizes, max_size=3).map(tuple), st.tuples(st.sampled_from(NON_INTS), sizes)
        ),
    )
    strides = maybe(
        None,
        st.one_of(
            st.lists(st.sampled_from([0, -2, 2, 4, 6, 16, 96, 1 << 40, 1 << 70, -(1 << 70)]), max_size=3).map(tuple),
            st.tuples(st.sampled_from([2.0, "2", None]), st.just(itemsize)),
        ),
    )
    typestr = {"fp16": "<f2", "fp32": "<f4", "bf16": "<V2"}[dtype]
    typestr = maybe(typestr, st.sampled_from([">f2", ">u2", ">V2", "<f8", "|i1", "f2", "", 2, None, "=f2", "|f2"]))
    ptr = (slot + 1) << 36  # disjoint arrays, 16-byte aligned
    ptr = maybe(ptr, st.sampled_from([0, 1, -16, 1 << 64, (1 << 64) - 16, "4096", 4096.0, None]))
    data = maybe(
        (ptr, False),
        st.one_of(
            st.tuples(st.just(ptr), st.sampled_from([True, 1, "no", None])),
            st.just((ptr,)),
            st.just((ptr, False, 0)),
            st.just(None),
            st.just([ptr, False]),
        ),
    )
    cai = {
        "shape": shape,
        "typestr": typestr,
        "data": data,
        "strides": strides,
        "version": 3,
        "stream": maybe(None, stream_values),
    }
    if not clean and draw(st.integers(0, 15)) == 0:
        cai["version"] = draw(st.sampled_from([0, 2, 7, True, "3", None]))
    if not clean and draw(st.integers(0, 31)) == 0:
        cai["mask"] = object()
    if not clean and draw(st.integers(0, 31)) == 0:
        del cai[draw(st.sampled_from(["shape", "typestr", "data"]))]
    return FakeArray(cai, "bfloat16" if dtype == "bf16" else None)


def others():
    return st.sampled_from([None, Hostile(), [[1.0]], "array", 3.0, np.ones((2, 2), np.float16)])


def mostly(good: list, bad: list, clean: bool = False):
    """One of `good`, or (unless `clean`) one in eight times one of `bad`."""
    return st.integers(0, 7).flatmap(lambda i: st.sampled_from(bad if i == 0 and not clean else good))


SCALARS = (
    [1.0, 0, -2, 0.5, np.float32(2), Fraction(1, 3), 3.4e38],
    [10**400, -1e39, 3.5e38, float("nan"), float("inf"), "1", None, True, 1j],
)
OUT_DTYPES = ([None, "float32"], ["float16", np.float32, "bfloat16", "int8", 5, object()])
STREAMS = (
    [None, 0, 7, type("S", (), {"__cuda_stream__": lambda self: (0, 5)})()],
    [-1, 1 << 64, True, 1.5, "s", Hostile(), type("S", (), {"__cuda_stream__": lambda self: (0, -5)})()],
)
CONFIGS = (
    [None, KernelConfig(dtype="fp16", out_dtype="fp16")],
    [
        KernelConfig(),
        KernelConfig(dtype="fp16", out_dtype="fp16", block_m=64, num_consumers=1, a_rows=8),
        KernelConfig(dtype="fp16", out_dtype="fp16", split_k=32),
        {"block_m": 128},
        "x",
    ],
)


@st.composite
def gemm_calls(draw):
    """(a, b, keyword arguments); one call in three clean: every value valid, except that
    sizes, the output dtype and the config may not fit together."""
    clean = draw(st.integers(0, 2)) == 0
    m, n, k = (draw(mostly(list(range(41)) + [64, 4096], [(1 << 31) - 1024, 1 << 31], clean)) for _ in range(3))
    a = draw(others()) if not clean and draw(st.integers(0, 15)) == 0 else draw(cai_arrays(m, k, 0, clean=clean))
    b = draw(cai_arrays(k, n, 1, clean=clean))
    out = draw(st.one_of(st.none(), cai_arrays(m, n, 2, "fp32", clean=clean)))
    c = draw(st.one_of(st.none(), cai_arrays(m, n, 3, "fp16" if out is None else "fp32", clean=clean)))
    if not clean and draw(st.integers(0, 15)) == 0:
        out, c = draw(others()), draw(others())
    alpha, beta, out_dtype, stream, config = (
        draw(mostly(*values, clean)) for values in (SCALARS, SCALARS, OUT_DTYPES, STREAMS, CONFIGS)
    )
    return a, b, dict(out=out, c=c, alpha=alpha, beta=beta, out_dtype=out_dtype, stream=stream, config=config)


@FUZZ
@given(gemm_calls())
def test_gemm_raises_only_errors_naming_an_argument(cpu_only, call):
    a, b, kwargs = call
    try:
        jitgemm.gemm(a, b, **kwargs)
    except PassedValidation:
        pass
    except (TypeError, ValueError) as exc:
        assert ARGUMENTS.match(str(exc)), f"{type(exc).__name__} names no argument: {exc}"


FIELD_VALUES = st.one_of(
    st.integers(-3, 600),
    st.sampled_from(BAD_INTS + NON_INTS + [0, 1, 2, 64, 128, 256]),
    st.booleans(),
    st.floats(allow_nan=True),
    st.sampled_from(["bf16", "fp16", "fp32", "K", "M", "N", "A", "B", "none", "m", "n", "sm_90a", "sm_100a", ""]),
    st.none(),
)
FIELD_NAMES = [f.name for f in fields(KernelConfig)]


@FUZZ
@given(
    st.dictionaries(st.sampled_from(FIELD_NAMES), FIELD_VALUES, max_size=6),
    st.dictionaries(st.text(max_size=8), FIELD_VALUES, max_size=2),
)
def test_kernel_config_raises_only_value_errors(known, unknown):
    for make in (lambda: KernelConfig(**known), lambda: KernelConfig.from_dict({**known, **unknown})):
        try:
            cfg = make()
        except ValueError:
            continue
        assert all(type(getattr(cfg, f.name)) is type(f.default) for f in fields(KernelConfig))


def _json_text(fields_):
    return json.dumps(fields_, allow_nan=True)


@FUZZ
@given(
    st.one_of(
        st.dictionaries(
            st.sampled_from(FIELD_NAMES + ["block_q"]),
            FIELD_VALUES.filter(lambda v: not isinstance(v, int) or abs(v) < 1 << 70),
            max_size=4,
        ).map(_json_text),
        st.text(max_size=40),
        st.sampled_from(["[" * 5000, '{"a_rows": 8}', "null", "[]"]),
    )
)
def test_env_config_raises_only_value_errors(text):
    problem = Problem(4096, 4096, 4096)
    try:
        cfg = config_from_env(problem, H200, environ={"JITGEMM_CONFIG": text})
    except ValueError as exc:
        assert str(exc).startswith("JITGEMM_CONFIG"), exc
        return
    assert cfg is None or check_config(cfg, problem, H200) == []
