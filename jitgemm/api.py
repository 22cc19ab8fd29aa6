"""The public entry point: jitgemm.gemm."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import os
import threading
import warnings

import numpy as np
from cuda.bindings import driver

from . import context, decode, kernels, launch, plan, registry, runtime, staging
from .arrays import (
    GENERIC,
    HOST,
    LEGACY_STREAM,
    NUMPY_NAMES,
    TMA_ALIGN,
    UNRESOLVED,
    View,
    describe,
    lib_of,
    needs_consumer_stream,
    overlaps,
    resolve_device,
    stream_wait,
)
from .config import KernelConfig
from .heuristics import ENV_VAR as CONFIG_ENV_VAR
from .heuristics import DeviceSpec
from .problem import DTYPE_BYTES, MAX_OUTPUT_ELEMENTS, Problem


class FallbackCopyWarning(UserWarning):
    """An argument's layout cannot be read or written in place by the kernel, so jitgemm
    copies it: an operand TMA cannot read; an output (or C) that is not rows of unit-stride
    elements, or, on sm_100a, whose rows TMA cannot address (issued once per argument name and
    process)."""


@functools.cache
def device_spec(ordinal: int) -> DeviceSpec:
    info = runtime.device_info(ordinal)
    if info.arch is None:
        supported = ", ".join(
            f"{registry.get(name).compute_capability[0]}.{registry.get(name).compute_capability[1]} ({name})"
            for name in registry.ARCH_NAMES
        )
        raise RuntimeError(
            f"jitgemm runs kernels on compute capability {supported}; device {ordinal} "
            f"({info.name}) is compute capability "
            f"{info.compute_capability[0]}.{info.compute_capability[1]}"
        )
    if not registry.get(info.arch).verified_on_hardware:
        warnings.warn(
            f"jitgemm's {info.arch} kernels are compiled and checked in their SASS but have not "
            "yet run on such hardware; verify results on your device",
            RuntimeWarning,
            stacklevel=3,
        )
    return DeviceSpec(arch=info.arch, num_sms=info.num_sms)


# --------------------------------------------------------------------------------------------
# arguments that are not arrays
# --------------------------------------------------------------------------------------------
_DTYPE_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp32": "fp32",
}


def _out_dtype_name(out_dtype, input_dtype: str) -> str:
    if out_dtype is None:
        return input_dtype
    if isinstance(out_dtype, str):
        name = out_dtype
    else:
        try:
            name = np.dtype(out_dtype).name  # NumPy / CuPy / ml_dtypes dtypes and types
        except Exception:
            try:
                name = str(out_dtype)  # torch.float32, ...
            except Exception:
                name = ""
    alias = _DTYPE_ALIASES.get(name.removeprefix("torch."))
    if alias is None or alias not in (input_dtype, "fp32"):
        raise TypeError(
            f"out_dtype: expected None, the input dtype ({NUMPY_NAMES[input_dtype]}) or float32, got {out_dtype!r}"
        )
    return alias


def _stream_handle(stream) -> int:
    """The raw CUstream of a stream object or handle."""
    try:
        handle = _stream_value(stream)
    except Exception as exc:  # a stream object whose attributes or protocol raise
        raise TypeError(f"stream: {stream!r} could not be read as a CUDA stream: {exc}") from exc
    if isinstance(handle, int) and not isinstance(handle, bool) and 0 <= handle < 1 << 64:
        return handle
    raise TypeError(
        f"stream: expected None, a CuPy / PyTorch / cuda.core stream, an object with "
        f"__cuda_stream__, or a raw CUstream handle (int in [0, 2^64)), got {stream!r}"
    )


def _stream_value(stream):
    """The handle `stream` names (unchecked), or `stream` itself when it names none."""
    if isinstance(stream, (int, driver.CUstream)):
        return int(stream) if isinstance(stream, driver.CUstream) else stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:  # cuda.core and other protocol streams
        return protocol()[1]
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    return stream


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _scalar(value, argname: str) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{argname}: expected a real number (int or float), got {type(value).__name__} {value!r}")
    try:
        x = float(value)
    except (OverflowError, ValueError, TypeError):
        x = math.inf
    # The kernels take float32: a larger finite value would silently become inf.
    if not math.isfinite(x) or abs(x) > FLOAT32_MAX:
        raise ValueError(
            f"{argname}: expected a finite real number representable in float32 "
            f"(|x| <= {FLOAT32_MAX:.8g}), got {value!r}"
        )
    return x


# --------------------------------------------------------------------------------------------
# layouts TMA can use, and the fallback copies
# --------------------------------------------------------------------------------------------
_warned: set = set()
_warned_lock = threading.Lock()


def _warn_copy(argname: str, what: str) -> None:
    with _warned_lock:
        if argname in _warned:
            return
        _warned.add(argname)
    reason = (
        "TMA needs a unit-stride dimension and a 16-byte aligned base address and leading stride "
        "(rows padded to whole 16-byte units); a copy kernel stages it into aligned rows of a workspace "
        "reused across calls"
        if argname in ("a", "b")
        else "outputs and C of unit-stride, element-aligned rows are written and read in place at any "
        "alignment on sm_90a (other layouts, and unaligned rows on sm_100a, are not)"
    )
    warnings.warn(
        f"jitgemm.gemm: {argname} {what}: {reason}; this copy is made on every call with such a "
        f"layout (warned once per argument)",
        FallbackCopyWarning,
        stacklevel=5,
    )


def _operand_major(view: View) -> tuple:
    """(major the kernel reads, whether a copy is needed) for input `view`."""
    major = view.major()
    if major is None:
        return 1, True
    return major, not view.tma_readable(major)


def _row_major(view: View | None) -> bool:
    """Whether an output view (None: the result jitgemm allocates) is rows of unit-stride,
    element-aligned elements: what a kernel can store to in place, with TMA or else directly
    (out_direct)."""
    if view is None:
        return True
    unit_rows = view.strides is not None and (view.strides[1] == 1 or view.shape[1] == 1)
    return unit_rows and view.ptr % view.itemsize == 0


def _output_ready(view: View) -> bool:
    return _row_major(view) and view.tma_ready(1)


def _copy_reason(view: View) -> str:
    if view.strides is None:
        return "has leading dimensions that do not fold into rows of one stride, and is copied"
    return "cannot be read by TMA in place and is copied"


def _aligned(
    lib, rows: int, cols: int, major: int, dtype: str, dev: int, stream: int, argname: str, zero: bool
) -> View:
    """A fresh (rows, cols) buffer TMA can use with `major` innermost, rows padded to 16 bytes."""
    pad = TMA_ALIGN // (4 if dtype == "fp32" else 2)
    alloc = lib.zeros if zero else lib.empty
    if major == 1:
        return lib.window(alloc((rows, -(-cols // pad) * pad), dtype, dev, stream), rows, cols, False, argname)
    return lib.window(alloc((cols, -(-rows // pad) * pad), dtype, dev, stream), cols, rows, True, argname)


def _copy_in(view: View, major: int, argname: str, dev: int, stream: int) -> View:
    """A zero-padded copy of `view` in its own library, `major` innermost."""
    rows, cols = view.shape
    dst = _aligned(view.lib, rows, cols, major, view.dtype, dev, stream, argname, zero=True)
    view.lib.copy_(dst, view, stream)
    return dst


# --------------------------------------------------------------------------------------------
# kernel selection and launch
# --------------------------------------------------------------------------------------------
def _config_for(problem: Problem, dev: int, config: KernelConfig | None) -> KernelConfig:
    """The config for `problem` on device `dev`: `config` (checked), else JITGEMM_CONFIG, else
    the tuning file's entry (`jitgemm tune`), else the dispatch table's (`jitgemm precompile`),
    else the heuristics' choice (jitgemm.plan)."""
    # The device's name keys the tuning file: asked for only when the file has entries.
    return plan.choose(problem, device_spec(dev), lambda: runtime.device_info(dev).name, config)[0]


def config_for(problem: Problem, device: int = 0) -> KernelConfig:
    """The config `gemm` runs for `problem` on GPU `device` when it is given none: from
    JITGEMM_CONFIG, else the tuning file (`jitgemm tune`), else the dispatch table (`jitgemm
    precompile`), else the heuristics.

    Raises TypeError / ValueError for a bad argument, :class:`jitgemm.NoGPUError` without a
    GPU or driver."""
    check_problem_and_device(problem, device)
    return _config_for(problem, device, None)


def check_problem_and_device(problem, device) -> None:
    """TypeError / ValueError, naming the argument, unless `problem` is a Problem and `device` a
    GPU ordinal (whether that GPU exists is the driver's to say)."""
    if not isinstance(problem, Problem):
        raise TypeError(f"problem: expected a jitgemm.Problem, got {type(problem).__name__} {problem!r}")
    if not isinstance(device, int) or isinstance(device, bool):
        raise TypeError(f"device: expected an int GPU ordinal, got {type(device).__name__} {device!r}")
    if device < 0:
        raise ValueError(f"device: expected a GPU ordinal >= 0, got {device}")


def _kernel(cfg: KernelConfig, problem: Problem, dev: int, stream: int):
    if not kernels.is_loaded(cfg, dev) and launch.stream_is_capturing(stream):
        raise launch.CaptureError(
            f"jitgemm.gemm: the stream is capturing a CUDA graph, but kernel {cfg.name} for "
            f"{problem.describe()} is not loaded on device {dev}, and loading or compiling it cannot "
            f"be captured. Warm up first: run the same gemm once before the capture (or precompile "
            f"it with `jitgemm precompile` and run it once)"
        )
    return kernels.get(cfg, dev, problem=problem)


class _Kernel:
    """A selected, loaded kernel for one problem on one device and stream: builds launches."""

    def __init__(self, problem: Problem, cfg: KernelConfig, dev: int, stream: int):
        self.problem, self.cfg, self.dev, self.stream = problem, cfg, dev, stream
        self.arch = registry.get(cfg.arch)
        self.kernel, self.lay = _kernel(cfg, problem, dev, stream)
        self.grid = self.arch.grid_size(cfg, problem, device_spec(dev).num_sms)
        self.tiles = self.arch.cluster_tiles(cfg, problem.m, problem.n) * cfg.cluster_size

    def launch(
        self, va: View, vb: View, vd: View, vc: View | None, alpha: float, beta: float, staged: tuple = (None, None)
    ) -> launch.KernelLaunch:
        """The launch for these views; `staged`: the staging.StagedOperand of A and of B where
        that operand is staged (its map then reads the workspace), else None."""
        stage = None
        if staged != (None, None):
            stage = staging.StageLaunch(staging.KERNEL.get(self.cfg.arch, self.dev), staged, self.stream)
        # a staged operand's maps read its rows in the workspace
        a_rows, b_rows = (view if op is None else op.kernel_view(view) for view, op in zip((va, vb), staged))
        maps = self.arch.tensor_maps(self.problem, self.lay, a_rows, b_rows, vd, vc)
        outputs: tuple = ()
        if self.cfg.out_direct:
            outputs = (vd.ptr, vd.leading_stride_bytes(1))
            if vc is not None:
                outputs += (vc.ptr, vc.leading_stride_bytes(1))
        return launch.KernelLaunch(
            self.kernel,
            self.cfg,
            self.problem,
            maps,
            alpha,
            beta,
            self.grid,
            self.tiles,
            self.dev,
            self.stream,
            self.arch.map_operands(self.lay, vc is not None),
            outputs,
            staged,
            stage,
            (va.ptr, vb.ptr),
        )


# --------------------------------------------------------------------------------------------
# the lean path: problems seen before, with any arrays
# --------------------------------------------------------------------------------------------
PLAN_CACHE_SIZE = 4096
ADDRESS_LIMIT = 1 << 64
_MISALIGNED = TMA_ALIGN - 1  # address bits TMA needs clear


class _Plan:
    """A problem seen before, for CuPy and torch arrays: everything about a call but the
    arrays' addresses (the arrays' types, shapes, strides, dtypes and devices, the scalars,
    out_dtype, config and stream, and whether out is c) keys it, and it holds the loaded
    kernel's launch with its grid and packed parameters.

    A call with new arrays (the usual case in a model) makes only the checks that depend on
    the addresses, patches the addresses into the launch's tensor maps and launches. Those
    checks are the general path's, or stricter: every address 16-byte aligned where TMA reads
    or writes it, an operand the staging kernel copies (staging.py) or an out or c written or
    read directly (out_direct) element-aligned (else the general path decides), the operand's bytes within the 64-bit address space, and `out` apart
    from a, b and c (else the general path's exact overlap test decides, and raises or
    copies). Anything the checks do not clear goes through the general path."""

    __slots__ = (
        "lib",
        "call",
        "lock",
        "dev",
        "stream",
        "out_shape",
        "odt",
        "out_given",
        "c_given",
        "uses_c",
        "out_is_c",
        "spans",
        "last",
        "last_a",
        "last_b",
        "out_align",
        "a_align",
        "b_align",
    )

    def __init__(
        self,
        lib,
        call: launch.KernelLaunch,
        dev: int,
        stream: int,
        out_shape: tuple,
        odt: str,
        views: tuple,
        uses_c: bool,
        aligns: tuple,
    ):
        """`aligns`: the address bits a, b, and out and c, must have clear (see `_aligns`)."""
        va, vb, vo, vc = views  # vo and vc as the caller passed them (None when not given)
        self.a_align, self.b_align, self.out_align = aligns
        self.lib, self.call, self.lock = lib, call, threading.Lock()
        self.dev, self.stream, self.out_shape, self.odt = dev, stream, out_shape, odt
        self.out_given, self.c_given, self.uses_c = vo is not None, vc is not None, uses_c
        self.out_is_c = vo is not None and vc is not None and vo.same_memory(vc)
        self.spans = tuple(0 if v is None else v.span() for v in views)
        self.last = tuple(ADDRESS_LIMIT - span for span in self.spans)  # the highest base address
        self.last_a, self.last_b = self.last[:2]

    def run(self, pa: int, pb: int, out, po: int, pc: int, explicit_stream: bool):
        """The result, or None when the addresses need the general path."""
        if pa & self.a_align or pb & self.b_align or pa > self.last_a or pb > self.last_b:
            return None
        if (self.out_given or self.c_given) and not self._out_and_c_clear(pa, pb, po, pc):
            return None
        if out is None:
            lib, stream = self.lib, self.stream
            if explicit_stream and lib.current_stream(self.dev) != stream:
                with lib.stream_scope(stream, self.dev):
                    out = lib.empty(self.out_shape, self.odt, self.dev, stream)
            else:
                out = lib.empty(self.out_shape, self.odt, self.dev, stream)
            po = lib.data_ptr(out)
            if po & self.out_align:
                return None  # an unusual allocation: let the general path handle it
        lock = self.lock
        lock.acquire()  # one launch object: patched and queued by one thread at a time
        try:
            self.call.launch_at(pa, pb, po, pc)
        finally:
            lock.release()
        return out

    def _out_and_c_clear(self, pa: int, pb: int, po: int, pc: int) -> bool:
        """The address checks of a given out and c: aligned where the kernel reads them, within
        the address space, out apart from a, b and (unless it is c) c."""
        last, spans = self.last, self.spans
        if self.c_given and (pc > last[3] or (self.uses_c and pc & self.out_align)):
            return False
        if not self.out_given:
            return True
        span = spans[2]
        return not (
            po & self.out_align
            or po > last[2]
            or not (po + span <= pa or pa + spans[0] <= po)
            or not (po + span <= pb or pb + spans[1] <= po)
            or (self.c_given and not self.out_is_c and not (po + span <= pc or pc + spans[3] <= po))
        )


_plans: dict = {}
_plans_lock = threading.Lock()


def _aligns(views: tuple, staged: tuple, out_direct: bool, odt: str) -> tuple:
    """The address bits a `_Plan` needs clear in a, b, and out and c: TMA's 16 bytes, or
    their elements' alignment where the kernel does not read them by TMA (an operand the
    staging kernel copies, an out and c written and read directly)."""
    a_align, b_align = (_MISALIGNED if op is None else v.itemsize - 1 for v, op in zip(views, staged))
    return a_align, b_align, DTYPE_BYTES[odt] - 1 if out_direct else _MISALIGNED


def _plannable(key, lib, views: tuple) -> bool:
    """Whether a call may keep a plan under `key`: keyed (a lean-path library's call), and
    every array of that one library (None: not given)."""
    return key is not None and lib.fast and all(v.lib is lib for v in views if v is not None)


def _remember(key, plan: _Plan) -> None:
    with _plans_lock:
        if key not in _plans and len(_plans) >= PLAN_CACHE_SIZE:
            del _plans[next(iter(_plans))]  # the oldest
        _plans[key] = plan


def gemm(
    a, b, out=None, *, c=None, alpha=1.0, beta=1.0, out_dtype=None, stream=None, config: KernelConfig | None = None
):
    """Compute ``alpha * (a @ b) + beta * c`` (or ``alpha * (a @ b)`` without `c`) on the GPU
    with a JIT-compiled Hopper kernel; scaling and the addition of `c` happen in the kernel's
    epilogue. Accumulation is in float32.

    Parameters
    ----------
    a : array, shape (M, K) or (..., K), bfloat16 or float16
        A CuPy array, a PyTorch CUDA tensor, any object with ``__cuda_array_interface__``
        (version 3; its ``stream`` is waited for) or ``__dlpack__`` (JAX, Numba, ...), or a NumPy
        host array (then every array argument must be NumPy: they are copied to the current
        GPU, computed there, and the result is NumPy; the call waits for the GPU). Any positive
        strides: row-major arrays and transposed views (``x.T``) are read in place when TMA
        allows it (16-byte aligned base address and leading stride, unit inner stride; rows
        that end mid-unit in padded rows, such as a slice ``x[:, :1021]``, are read in place);
        other layouts are copied into an aligned buffer, with a one-time
        :class:`FallbackCopyWarning` naming the argument, except a `b` whose rows along N (or
        columns along K, as ``W.t()``) have unit stride when `a` has at most four (sixteen)
        rows: a decode kernel then reads `b` in place (unless `config` or ``JITGEMM_CONFIG``
        forces the GEMM). Zero (broadcast) and negative strides
        raise ValueError. An N-D `a` (..., K), such as activations (batch, seq, hidden) as
        ``F.linear`` takes them, is computed as one (M, K) matrix of M = prod(...) rows: read in
        place when its leading dimensions step through memory with one stride (a row-major
        array or padded rows; also a (..., K) view of a contiguous (K, ...) array), otherwise
        copied (with the one-time warning). The result then has shape (..., N).
    b : array, shape (K, N)
        Same dtype, kind (device or host) and device as `a`; same layout rules; 2-D.
    out : array, shape (M, N) or (..., N) (`a`'s leading dimensions), optional
        Written in place and returned. Its dtype is the input dtype or float32 (and must equal
        `out_dtype` when that is given). It may be `c` itself (in-place accumulation,
        ``out=c``) but must not overlap `a` or `b`, nor overlap `c` other than being exactly
        `c`. Rows of unit-stride elements are written in place at any alignment (odd N, a
        misaligned view: on sm_90a the kernel then stores with st.global instead of TMA); other
        layouts (column-major, or leading dimensions that do not fold into rows of one stride),
        and unaligned rows on sm_100a, are written through an aligned buffer and copied in, with
        a one-time :class:`FallbackCopyWarning`.
    c : array, shape (M, N) or (..., N), optional (keyword-only)
        The addend, in the output dtype, on the same device as `a`. It is read by the kernel
        in place when its rows are unit-stride, as `out` is written; other layouts (and, on
        sm_100a, rows TMA cannot address) are copied first, with a one-time warning.
        With ``beta == 0`` it is not read (BLAS convention: NaNs in `c` do not propagate).
    alpha : real number, default 1.0 (keyword-only)
        Scales ``a @ b``; passed to the kernel as float32, so it must be finite and within
        float32's range (ValueError otherwise).
    beta : real number, default 1.0 (keyword-only)
        Scales `c`; ignored without `c`. Passed to the kernel as float32 (finite, in range).
    out_dtype : None, float32 or the input dtype (keyword-only)
        The result dtype when `out` is not given (None: the input dtype). Accepts NumPy /
        CuPy / torch dtypes or their names ("float32", "bfloat16", "float16").
    stream : None, a stream object, or a raw CUstream handle (int) (keyword-only)
        Where the work is queued. None: the current stream of `a`'s library (CuPy's or
        torch's current stream on `a`'s device); for a ``__cuda_array_interface__`` object, the
        stream it names; for DLPack objects and NumPy arrays, the legacy default stream.
        Accepts ``torch.cuda.Stream``, ``cupy.cuda.Stream``, ``cuda.core`` streams and anything
        with ``__cuda_stream__``. Arrays jitgemm allocates (the result, fallback copies) are
        allocated and filled on this stream. No device-wide synchronisation is done (NumPy
        inputs wait for this stream only).
    config : KernelConfig, optional (keyword-only)
        An expert override of the kernel configuration (see ``jitgemm explain``); it is checked
        against the problem and device and rejected with ValueError when it does not fit.
        Without it, the ``JITGEMM_CONFIG`` environment variable, then the tuning file
        (``jitgemm tune``, see :mod:`jitgemm.tuning`), then the dispatch table (written by
        ``jitgemm precompile``, see :mod:`jitgemm.dispatch`), then the heuristics, decide.

    Returns
    -------
    `out` when given; otherwise a new (M, N) array ((..., N) for an N-D `a`) of `a`'s library
    on `a`'s device: a CuPy array, a torch tensor, a NumPy array, an array of `a`'s
    ``__array_namespace__()`` (JAX, ...) made with its ``from_dlpack``, or else a
    :class:`jitgemm.DeviceArray`
    (``__cuda_array_interface__`` and ``__dlpack__``). Zero-size M or N returns an empty
    result without a launch; K = 0 returns zeros, or ``beta * c``, without a GEMM launch.

    Raises
    ------
    TypeError, ValueError
        For any bad argument, naming it, what it got and what was expected, before any work
        is queued on the GPU: wrong ndim, mismatched inner dimensions, unsupported or mixed
        dtypes, arrays on different devices or host mixed with device, `out` / `c` of the
        wrong shape, dtype or device, `out` overlapping an input, zero or negative strides,
        objects that are not arrays, bad scalars, streams or configs.
    jitgemm.launch.CaptureError
        When the stream is capturing a CUDA graph and the kernel is not loaded yet (run the
        call once before capturing).

    A call whose problem was seen before (the arrays' shapes, strides, dtypes and device, the
    scalars, out_dtype, config and stream; CuPy and torch arrays), with the same arrays or new
    ones, reuses its kernel, launch geometry and TMA descriptors, patching only the arrays'
    addresses; the kernel is compiled once per configuration and process (and cached on
    disk), also when many threads ask for it at once.
    """
    lib = lib_of(a)
    if lib is not None and lib.fast:
        plan = None
        try:
            ka, pa = lib.parts(a)
            dev = ka[-1]
            if dev < 0:
                key = None  # not a device array: the general path says what is wrong
            else:
                kb, pb = lib.parts(b)
                ko, po = (None, 0) if out is None else lib.parts(out)
                kc, pc = (None, 0) if c is None else lib.parts(c)
                key = (
                    ka,
                    kb,
                    ko,
                    kc,
                    po == pc,
                    # TMA-aligned addresses or not: a plan that writes a misaligned output
                    # directly (out_direct) does not serve the aligned calls too
                    not (pa | pb | po | pc) & _MISALIGNED,
                    alpha.__class__,
                    alpha,
                    beta.__class__,
                    beta,
                    out_dtype,
                    config,
                    lib.current_stream(dev) if stream is None else _stream_handle(stream),
                )
                plan = _plans.get(key)
        except (AttributeError, TypeError):  # mixed kinds of arrays, odd arguments: the general path
            key = None
        if plan is not None:
            result = plan.run(pa, pb, out, po, pc, stream is not None)
            if result is not None:
                return result
        return _gemm(a, b, out, c, alpha, beta, out_dtype, stream, config, key)
    return _gemm(a, b, out, c, alpha, beta, out_dtype, stream, config, None)


def _gemm(a, b, out, c, alpha, beta, out_dtype, stream, config, plan_key):
    """The general path: validate everything, then compute (and remember a plan when it can)."""
    alpha = _scalar(alpha, "alpha")
    beta = _scalar(beta, "beta")
    if config is not None and not isinstance(config, KernelConfig):
        raise TypeError(f"config: expected None or a jitgemm.KernelConfig, got {type(config).__name__}")
    explicit = None if stream is None else _stream_handle(stream)

    va = describe(a, "a", LEGACY_STREAM if explicit is None else explicit)
    # The stream the work goes to; known before b, out and c are described, because a DLPack
    # producer is handed the consumer stream when it exports.
    if explicit is not None:
        handle = explicit
    elif va.lib.fast and any(needs_consumer_stream(x) for x in (b, out, c) if x is not None):
        handle = va.lib.current_stream(va.device)
    elif va.lib.fast:
        handle = None  # looked up after validation
    else:
        handle = va.stream if va.stream is not None else LEGACY_STREAM
    consumer = LEGACY_STREAM if handle is None else handle

    if va.dtype not in ("bf16", "fp16"):
        raise TypeError(f"a: expected dtype bfloat16 or float16, got {NUMPY_NAMES[va.dtype]}")
    vb = _describe_like(b, "b", va, consumer)
    if vb.nd is not None:
        raise ValueError(f"b: expected a 2-D array (K, N), got {len(vb.full_shape)}-D with shape {vb.full_shape}")
    if vb.dtype != va.dtype:
        raise TypeError(f"b: expected dtype {NUMPY_NAMES[va.dtype]} (the dtype of a), got {NUMPY_NAMES[vb.dtype]}")
    (m, k), (kb, n) = va.shape, vb.shape
    if kb != k:
        raise ValueError(
            f"b: expected shape ({k}, N) so that its rows match the {k} columns of a "
            f"(a has shape {va.full_shape}), got shape {vb.shape}"
        )
    if m * n > MAX_OUTPUT_ELEMENTS:
        raise ValueError(
            f"b: a {va.full_shape} @ b {vb.shape} has {m * n} output elements, more than the "
            f"{MAX_OUTPUT_ELEMENTS} (2^40) the kernels can count in 32-bit tiles"
        )
    odt = _out_dtype_name(out_dtype, va.dtype)
    # The result's shape: (M, N), or (..., N) for an N-D a (..., K).
    out_shape = (*va.full_shape[:-1], n)
    rows = "rows of a" if va.nd is None else "the leading dimensions of a"
    vo = None
    if out is not None:
        vo = _describe_like(out, "out", va, consumer)
        if vo.full_shape != out_shape:
            raise ValueError(f"out: expected shape {out_shape} ({rows}, columns of b), got {vo.full_shape}")
        if out_dtype is not None and vo.dtype != odt:
            raise TypeError(f"out: expected dtype {NUMPY_NAMES[odt]} (out_dtype), got {NUMPY_NAMES[vo.dtype]}")
        if vo.dtype not in (va.dtype, "fp32"):
            raise TypeError(
                f"out: expected dtype {NUMPY_NAMES[va.dtype]} (the input dtype) or float32, got {NUMPY_NAMES[vo.dtype]}"
            )
        if vo.readonly:
            raise ValueError("out: expected a writable array, got a read-only one")
        odt = vo.dtype
    vc = None
    if c is not None:
        vc = _describe_like(c, "c", va, consumer)
        if vc.full_shape != out_shape:
            raise ValueError(f"c: expected shape {out_shape} ({rows}, columns of b), got {vc.full_shape}")
        if vc.dtype != odt:
            raise TypeError(f"c: expected dtype {NUMPY_NAMES[odt]} (the output dtype), got {NUMPY_NAMES[vc.dtype]}")
    if vo is not None:
        for name, v in (("a", va), ("b", vb)):
            if overlaps(vo, v):
                raise ValueError(f"out: overlaps {name}; the output must not share memory with a or b")
        if vc is not None and overlaps(vo, vc) and not vo.same_memory(vc):
            raise ValueError(
                "out: partially overlaps c; pass out=c (the same array) to accumulate in "
                "place, or arrays that do not overlap"
            )

    named = [("a", va), ("b", vb), ("out", vo), ("c", vc)]
    named = [(name, resolve_device(v, name)) for name, v in named if v is not None]
    first = next(((name, v.device) for name, v in named if v.device >= 0), None)
    dev = first[1] if first is not None else None
    for name, v in named:
        if dev is not None and v.device not in (dev, UNRESOLVED):
            raise ValueError(
                f"{name}: expected an array on device {dev} (the device of {first[0]}), "
                f"got an array on device {v.device}"
            )
    views = dict(named)
    va, vb, vo, vc = views["a"], views["b"], views.get("out"), views.get("c")

    if va.is_host:
        return _gemm_host(va, vb, vo, vc, m, n, k, out_shape, odt, alpha, beta, explicit, config)
    if dev is None:  # only empty raw arrays: no memory anywhere to say which device
        dev = context.current_device()
    # Layouts, copies and the kernel configuration are decided (and a bad config rejected)
    # before any work is queued.
    decision = _Decision(va, vb, vo, vc, m, n, k, odt, beta, config, dev) if m and n and k else None
    if handle is None:
        handle = va.lib.current_stream(dev)
    with contextlib.ExitStack() as scopes:
        scopes.enter_context(context.on_device(dev))
        for lib in {v.lib for _, v in named if v.lib.fast}:
            if lib.current_stream(dev) != handle:
                scopes.enter_context(lib.stream_scope(handle, dev))
        for _, v in named:
            if v.stream is not None and v.stream != handle:
                stream_wait(handle, v.stream, dev)
        return _gemm_device(a, va, vb, vo, vc, m, n, k, out_shape, odt, alpha, beta, decision, dev, handle, plan_key)


class _Decision:
    """How one call runs: the problem, the kernel configuration, and which inputs are copied."""

    __slots__ = (
        "problem",
        "decode",
        "cfg",
        "a_major",
        "a_copy",
        "b_major",
        "b_copy",
        "has_c",
        "c_copy",
        "d_in_place",
        "out_ready",
        "c_ready",
    )
    cfg: KernelConfig

    def __init__(
        self,
        va: View,
        vb: View,
        vo: View | None,
        vc: View | None,
        m: int,
        n: int,
        k: int,
        odt: str,
        beta: float,
        config: KernelConfig | None,
        dev: int,
        staged: bool = False,
    ):
        """`vo` None: the result is allocated (row-major, N columns). `staged`: host arrays,
        uploaded into aligned buffers (every output TMA-ready). `decode`: the decoder whose
        kernel runs the call (decode.py: a few rows of a against a b TMA cannot read, the kernel
        configuration not forced), else None; `cfg` is unset until `gemm_instead`."""
        self.a_major, self.a_copy = _operand_major(va)
        self.b_major, self.b_copy = _operand_major(vb)
        self.has_c = vc is not None and beta != 0.0
        self.decode = (
            decode.decoder_for(va, vb, self.b_major, self.b_copy)
            if not staged  # (host arrays are uploaded into aligned rows: the GEMM reads them)
            and config is None
            and not os.environ.get(CONFIG_ENV_VAR, "").strip()
            and decode.writes_in_place(vo)
            and (not self.has_c or decode.writes_in_place(vc))
            else None
        )
        # The output rows TMA cannot address but a kernel can store to in place (odd N, a
        # misaligned view): out_direct kernels do, others go through aligned copies.
        out_ready = _output_ready(vo) if vo is not None else n * DTYPE_BYTES[odt] % TMA_ALIGN == 0
        d_unaligned = not out_ready and _row_major(vo)
        c_ready = vc is None or _output_ready(vc)
        c_unaligned = self.has_c and not c_ready and _row_major(vc)
        self.problem = Problem(
            m,
            n,
            k,
            va.dtype,
            odt,
            "K" if self.a_major == 1 else "M",
            "N" if self.b_major == 1 else "K",
            self.has_c,
            aligned_out=staged or not (d_unaligned or c_unaligned),
        )
        self.out_ready, self.c_ready = out_ready, c_ready
        if self.decode is None:  # (cfg is set by `_choose`)
            self._choose(vo, vc, dev, config)

    def _choose(self, vo: View | None, vc: View | None, dev: int, config: KernelConfig | None) -> None:
        self.cfg = cfg = _config_for(self.problem, dev, config)
        self.d_in_place = self.out_ready or (cfg.out_direct and _row_major(vo))
        self.c_copy = self.has_c and not (self.c_ready or (cfg.out_direct and _row_major(vc)))

    def gemm_instead(self, vo: View, vc: View | None, dev: int) -> None:
        """The GEMM (its operands staged) where the decode kernel cannot be had now."""
        self.decode = None
        self._choose(vo, vc, dev, None)

    def copy_outputs_instead(self) -> bool:
        """Run the config's TMA-epilogue twin, the output (and C) through aligned copies, where
        the out_direct kernel cannot be had now (a CUDA-graph capture, JITGEMM_OFFLINE=1) and
        the twin may be: False when there is no twin."""
        if not self.cfg.out_direct:
            return False
        self.cfg = dataclasses.replace(self.cfg, out_direct=False)
        self.d_in_place = self.out_ready
        self.c_copy = self.has_c and not self.c_ready
        return True


def _describe_like(obj, argname: str, va: View, stream: int) -> View:
    view = describe(obj, argname, stream)
    if view.is_host != va.is_host:
        if va.is_host:
            raise ValueError(
                f"{argname}: expected a NumPy host array like a, got a device array "
                f"({type(obj).__name__}); pass all arrays on the host or all on the GPU"
            )
        raise ValueError(
            f"{argname}: expected a device array like a, got a NumPy host array; "
            f"pass all arrays on the host or all on the GPU"
        )
    return view


def _gemm_device(a, va, vb, vo, vc, m, n, k, out_shape, odt, alpha, beta, decision, dev, handle, plan_key):
    lib = va.lib
    out_given = vo is not None
    if not out_given:
        vo = lib.view(lib.empty(out_shape, odt, dev, handle), "out")
    # A result of another library is made from ours only once the work on it is queued.
    result = (lambda: vo.array) if out_given else (lambda: lib.result(vo.array, a))
    if decision is None:
        if m and n:  # K = 0: a @ b is all zeros
            if vc is not None and beta != 0.0:
                vo.lib.scale_(vo, vc, beta, handle)
            else:
                vo.lib.zero_(vo, handle)
        return result()

    d = decision
    if d.decode is not None:
        call = _decode_launch(d.decode, d.has_c, va, vb, vo, vc, alpha, beta, dev, handle)
        if call is not None:
            call()
            if _plannable(plan_key, lib, (va, vb, vc, vo)):
                operands = (va, vb, vo if out_given else None, vc)
                aligns = (va.itemsize - 1, vb.itemsize - 1, DTYPE_BYTES[odt] - 1)
                _remember(plan_key, _Plan(lib, call, dev, handle, out_shape, odt, operands, d.has_c, aligns))
            return result()
        d.gemm_instead(vo if out_given else None, vc, dev)
    try:
        kern = _Kernel(d.problem, d.cfg, dev, handle)
    except (launch.CaptureError, kernels.OfflineError):
        # A view TMA cannot store to, met first inside a capture or offline, where only the
        # TMA-epilogue kernel may be loaded or cached: as before out_direct, through copies.
        if not d.copy_outputs_instead():
            raise
        kern = _Kernel(d.problem, d.cfg, dev, handle)
    staged = _staged_operands(d, va, vb, dev, handle)
    if d.a_copy:
        _warn_copy("a", _copy_reason(va))
        if staged[0] is None:
            va = _copy_in(va, d.a_major, "a", dev, handle)
    if d.b_copy:
        _warn_copy("b", _copy_reason(vb))
        if staged[1] is None:
            vb = _copy_in(vb, d.b_major, "b", dev, handle)
    vc_k = vc if d.has_c else None
    if d.c_copy:
        _warn_copy("c", _copy_reason(vc))
        vc_k = _copy_in(vc, 1, "c", dev, handle)
    if d.d_in_place:
        vd = vo
    elif d.c_copy and vo.same_memory(vc):
        vd = vc_k  # out=c: accumulate in the aligned copy of c, then copy back
    else:
        if out_given:
            _warn_copy(
                "out",
                "cannot be written in place"
                + (" (its leading dimensions do not fold into rows of one stride)" if vo.strides is None else "")
                + "; the result is copied into it",
            )
        vd = _aligned(vo.lib, m, n, 1, odt, dev, handle, "out", zero=False)
    call = kern.launch(va, vb, vd, vc_k, alpha, beta, staged)
    call()
    if vd is not vo:
        vo.lib.copy_(vo, vd, handle)
    elif (
        not d.c_copy
        and (staged[0] is not None or not d.a_copy)
        and (staged[1] is not None or not d.b_copy)
        and _plannable(plan_key, lib, (va, vb, vc, vo))
    ):
        operands = (va, vb, vo if out_given else None, vc)
        aligns = _aligns(operands, staged, d.cfg.out_direct, odt)
        _remember(plan_key, _Plan(lib, call, dev, handle, out_shape, odt, operands, d.has_c, aligns))
    return result()


def _decode_launch(
    decoder: decode.Decoder,
    has_c: bool,
    va: View,
    vb: View,
    vd: View,
    vc: View | None,
    alpha,
    beta,
    dev: int,
    stream: int,
):
    """`decoder`'s launch (decode.py) for these views, or None where its kernel cannot be had
    now (met first inside a capture, or not in the disk cache under JITGEMM_OFFLINE=1)."""
    spec = device_spec(dev)
    kernel = decoder.kernel.get_unless_blocked(spec.arch, dev, stream)
    if kernel is None:
        return None
    vc_k = vc if has_c else None
    return decode.DecodeLaunch(decoder, kernel, va, vb, vd, vc_k, alpha, beta, spec.num_sms, dev, stream)


def _staged_operands(d: _Decision, va: View, vb: View, dev: int, stream: int) -> tuple:
    """For A and B, the staging.StagedOperand of an operand the staging kernel copies, or None:
    not copied, or copied by its library (a layout the kernel cannot stage, or the kernel not
    to be had: met first inside a capture, or not in the disk cache under JITGEMM_OFFLINE=1)."""
    staged = (
        staging.staged_operand(va, d.a_major) if d.a_copy else None,
        staging.staged_operand(vb, d.b_major) if d.b_copy else None,
    )
    if staged == (None, None):
        return staged
    if staging.KERNEL.get_unless_blocked(d.cfg.arch, dev, stream) is None:
        return None, None
    return staged


def _gemm_host(va, vb, vo, vc, m, n, k, out_shape, odt, alpha, beta, explicit, config):
    """NumPy in, NumPy out: upload aligned copies, compute on the current GPU, download."""
    lib = va.lib
    if vo is None:
        vo = lib.view(lib.empty(out_shape, odt, HOST, None), "out")
    if m == 0 or n == 0:
        return vo.array
    if k == 0:  # a @ b is all zeros
        if vc is not None and beta != 0.0:
            lib.scale_(vo, vc, beta, None)
        else:
            lib.zero_(vo, None)
        return vo.array
    dev = context.current_device()
    stream = explicit if explicit is not None else LEGACY_STREAM
    d = _Decision(va, vb, vo, vc, m, n, k, odt, beta, config, dev, staged=True)
    with context.on_device(dev):
        kern = _Kernel(d.problem, d.cfg, dev, stream)
        staged = []  # host buffers that must live until the stream has read them
        da = _upload(va, d.a_major, dev, stream, staged)
        db = _upload(vb, d.b_major, dev, stream, staged)
        dc = _upload(vc, 1, dev, stream, staged) if d.has_c else None
        dd = dc if d.has_c else _aligned(GENERIC, m, n, 1, odt, dev, stream, "out", zero=False)
        kern.launch(da, db, dd, dc, alpha, beta)()
        host = lib.empty((m, dd.strides[0]), odt, HOST, None)
        runtime.check(
            driver.cuMemcpyDtoHAsync(host.ctypes.data, dd.ptr, host.nbytes, driver.CUstream(stream)),
            "cuMemcpyDtoHAsync",
        )
        runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")
    lib.copy_(vo, lib.view(host[:, :n], "out"), None)
    return vo.array


def _upload(view: View, major: int, dev: int, stream: int, staged: list) -> View:
    """A zero-padded device copy of host `view`, `major` innermost, as a View."""
    rows, cols = view.shape
    array: np.ndarray = view.array  # type: ignore[assignment]  # a host view holds a NumPy array
    if view.nd is not None:
        array = array.reshape(rows, cols)  # a view where the leading dimensions fold, else a copy
    host = array if major == 1 else array.T
    pad = TMA_ALIGN // view.itemsize
    staging = np.zeros((host.shape[0], -(-host.shape[1] // pad) * pad), host.dtype)
    staging[:, : host.shape[1]] = host
    staged.append(staging)
    device = GENERIC.empty(staging.shape, view.dtype, dev, stream)
    runtime.check(
        driver.cuMemcpyHtoDAsync(device.ptr, staging.ctypes.data, staging.nbytes, driver.CUstream(stream)),
        "cuMemcpyHtoDAsync",
    )
    if major == 1:
        return GENERIC.window(device, rows, cols, False, "upload")
    return GENERIC.window(device, cols, rows, True, "upload")
