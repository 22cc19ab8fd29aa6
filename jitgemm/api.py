"""The public entry point: jitgemm.gemm."""
from __future__ import annotations

import functools

from . import kernels, runtime
from .config import KernelConfig
from .heuristics import DeviceSpec, select
from .operands import DTYPE_NAMES, TMA_ALIGN, View, as_view
from .problem import DTYPE_BYTES, Problem

SUPPORTED_ARCHS = ("sm_90a",)


@functools.lru_cache(maxsize=None)
def device_spec(ordinal: int) -> DeviceSpec:
    info = runtime.device_info(ordinal)
    if info.arch not in SUPPORTED_ARCHS:
        raise RuntimeError(f"jitgemm runs kernels on {', '.join(SUPPORTED_ARCHS)} (compute capability "
                           f"9.0); device {ordinal} ({info.name}) is compute capability "
                           f"{info.compute_capability[0]}.{info.compute_capability[1]}")
    return DeviceSpec(arch=info.arch, num_sms=info.num_sms)


def _out_dtype_name(out_dtype, default: str) -> str:
    if out_dtype is None:
        return default
    name = out_dtype if isinstance(out_dtype, str) else getattr(out_dtype, "name", str(out_dtype))
    name = name.removeprefix("torch.")
    name = DTYPE_NAMES.get(name, name)
    if name not in ("bf16", "fp16", "fp32"):
        raise TypeError(f"out_dtype: expected None, float32 or the input dtype, got {out_dtype!r}")
    return name


def _stream_handle(stream, view: View) -> int:
    if stream is None:
        return view.lib.current_stream(view.device)
    for attr in ("ptr", "cuda_stream"):       # cupy.cuda.Stream, torch.cuda.Stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    if isinstance(stream, int) and stream >= 0:
        return stream
    raise TypeError(f"stream: expected None, a CuPy or PyTorch stream, or a raw handle (int), got {stream!r}")


def _aligned_copy(view: View, major: int, argname: str) -> View:
    """A copy of `view` whose layout TMA accepts: unit stride along `major`, rows zero-padded
    to whole 16-byte units (the padding is read by TMA and must not add to the sum)."""
    lib = view.lib
    rows, cols = view.shape
    pad = TMA_ALIGN // view.itemsize
    if major == 1:
        buf = lib.zeros((rows, -(-cols // pad) * pad), view.dtype, view.device)
        dst = lib.slice2d(buf, rows, cols)
    else:
        buf = lib.zeros((cols, -(-rows // pad) * pad), view.dtype, view.device)
        dst = lib.transpose(lib.slice2d(buf, cols, rows))
    lib.copy_(dst, view.array)
    return lib.view(dst, argname)


def _tma_operand(view: View, argname: str) -> tuple:
    """(view, major) ready for TMA: the caller's memory when it qualifies, else an aligned copy."""
    major = view.major()
    if major is None:
        return _aligned_copy(view, 1, argname), 1
    if not view.tma_ready(major):
        return _aligned_copy(view, major, argname), major
    return view, major


def gemm(a, b, out=None, *, out_dtype=None, stream=None, config: KernelConfig | None = None):
    """Compute ``a @ b`` on the GPU with a JIT-compiled kernel.

    a:         (M, K) CuPy array or PyTorch CUDA tensor, bfloat16 or float16. Row-major or a
               transposed view of a row-major array (``x.T``); both are read without a copy.
    b:         (K, N), same dtype and device as `a`; row-major or a transposed view.
    out:       optional (M, N) array of the same library and device to write into; it must not
               overlap `a` or `b`.
    out_dtype: None (same as the inputs) or float32. Accumulation is always in float32.
    stream:    None (the library's current stream), a CuPy/PyTorch stream, or a raw handle.
    config:    an expert override of the kernel configuration (see `jitgemm explain`).
    Returns `out`, or a new array of `a`'s library on `a`'s device.
    """
    va, vb = as_view(a, "a"), as_view(b, "b")
    if va.dtype not in ("bf16", "fp16"):
        raise TypeError(f"a: expected bfloat16 or float16, got {va.dtype}")
    if vb.dtype != va.dtype:
        raise TypeError(f"b: expected the same dtype as a ({va.dtype}), got {vb.dtype}")
    if va.device != vb.device:
        raise ValueError(f"b: expected an array on device {va.device} like a, got device {vb.device}")
    (m, k), (kb, n) = va.shape, vb.shape
    if k != kb:
        raise ValueError(f"b: expected {k} rows to match a's {k} columns (a is {va.shape}), got shape {vb.shape}")
    odt = _out_dtype_name(out_dtype, va.dtype)
    if odt not in (va.dtype, "fp32"):
        raise TypeError(f"out_dtype: expected the input dtype ({va.dtype}) or float32, got {odt}")
    lib = va.lib
    if out is not None:
        vo = as_view(out, "out")
        if vo.shape != (m, n):
            raise ValueError(f"out: expected shape {(m, n)}, got {vo.shape}")
        if out_dtype is not None and vo.dtype != odt:
            raise TypeError(f"out: expected dtype {odt} (out_dtype), got {vo.dtype}")
        if vo.dtype not in (va.dtype, "fp32"):
            raise TypeError(f"out: expected dtype {va.dtype} or float32, got {vo.dtype}")
        if vo.device != va.device:
            raise ValueError(f"out: expected an array on device {va.device} like a, got device {vo.device}")
        odt = vo.dtype
    else:
        out = lib.empty((m, n), odt, va.device)
        vo = lib.view(out, "out")
    if m == 0 or n == 0:
        return out
    if k == 0:
        out[...] = 0
        return out
    handle = _stream_handle(stream, va)
    dev = va.device
    spec = device_spec(dev)

    va, a_major = _tma_operand(va, "a")
    vb, b_major = _tma_operand(vb, "b")
    # The output is written by TMA stores: it needs a row-major, 16-byte aligned layout.
    direct = vo.strides[1] == 1 and vo.tma_ready(1)
    vd = vo if direct else lib.view(lib.empty((m, -(-n // 16) * 16), odt, dev), "out")
    problem = Problem(m, n, k, va.dtype, odt, "K" if a_major == 1 else "M", "N" if b_major == 1 else "K")
    cfg = config if config is not None else select(problem, spec)
    kernel, lay = kernels.get(cfg, dev)

    dt = va.dtype
    if a_major == 1:
        map_a = runtime.tensor_map_2d(dt, va.ptr, k, m, va.leading_stride_bytes(1), lay.a.box, 128)
    else:
        map_a = runtime.tensor_map_2d(dt, va.ptr, m, k, va.leading_stride_bytes(0), lay.a.box, 128)
    if b_major == 1:
        map_b = runtime.tensor_map_2d(dt, vb.ptr, n, k, vb.leading_stride_bytes(1), lay.b.box, 128)
    else:
        map_b = runtime.tensor_map_2d(dt, vb.ptr, k, n, vb.leading_stride_bytes(0), lay.b.box, 128)
    map_d = runtime.tensor_map_2d(odt, vd.ptr, n, m, vd.leading_stride_bytes(1), lay.out_box, lay.out_swizzle)
    cluster = cfg.cluster_size
    tiles_m = -(-m // cfg.block_m)
    tiles_n = -(-n // cfg.block_n)
    if cfg.multicast == "A":
        tiles_n = -(-tiles_n // 2)
    elif cfg.multicast == "B":
        tiles_m = -(-tiles_m // 2)
    grid = min(tiles_m * tiles_n, spec.num_sms // cluster) * cluster
    runtime.ensure_context(dev)
    runtime.launch(kernel, grid, handle, [map_a, map_b, map_d], [m, n, k], [1.0, 0.0])
    if not direct:
        lib.copy_(out, lib.slice2d(vd.array, m, n))
    return out
