"""Autotuning: time the heuristics' best candidates for a problem on the local GPU and keep the
fastest in the tuning file (jitgemm.tuned); `gemm` then runs that config for the problem.

The heuristics rank configs with a cost model; where the model is wrong (BENCHMARKS.md lists
the known misrankings) a measurement on the user's GPU is not. `tune` times the model's best
`top` candidates (plus the unsplit variant of each split-K one) on fresh random inputs, each
call of a graph on the next of up to 20 copies (up to 512 MB of them, so that large operands do
not stay in L2), with CUDA-graph replays (the per-call cost of a stream of GEMMs, launch
included), in interleaved passes, after checking each kernel's result. The fastest replaces
the heuristics' choice if it is at least MIN_GAIN faster in every pass; the choice is written
to the tuning file under the device and the problem, together with every time measured.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cuda.bindings import driver

from . import api, context, runtime
from .arrays import DeviceMemory, numpy_dtype
from .config import KernelConfig
from .heuristics import DeviceSpec, check_config, explain
from .problem import DTYPE_BYTES, Problem
from .tuned import device_key, problem_key, write_entry

L2_DEFEAT_BYTES = 512 << 20  # inputs rotated per graph: several times the L2
CALLS_PER_GRAPH = 20  # calls per graph, each on the next copy of the inputs
REPLAYS = 7  # graph replays per candidate and pass (their median counts)
PASSES = 3  # interleaved passes over the candidates (the median counts)
# A candidate replaces the heuristics' choice only when it is at least this much faster in
# every pass: on the H200 the large, power-bound shapes drift by 1-3% from pass to pass, so
# smaller gains there were noise (and lost in the next run), while the misrankings the tuner
# fixes are 2.5-6% in every pass.
MIN_GAIN = 0.02
# A candidate's whole output is checked elementwise against a float64 reference (see
# output_error), in chunks of rows: the rounding of the output (its unit roundoff) plus 2K fp32
# roundoffs of the magnitudes summed, as the GPU tests bound it (tests/gpu_helpers.py).
ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
SUBNORMAL_ROUNDOFF = {"bf16": 2.0**-134, "fp16": 2.0**-25, "fp32": 2.0**-150}  # half the smallest subnormal
FP32_ROUNDOFF = 2.0**-24
CHECK_ROWS = 1024


# ----------------------------------------------------------------------------- candidates


def candidates(problem: Problem, spec: DeviceSpec, top: int) -> list[KernelConfig]:
    """The heuristics' choice first, then the next best of `top` modelled candidates, each
    split-K one followed by its unsplit variant (the model misranks splits most)."""
    report = explain(problem, spec, top=top)
    found = [KernelConfig.from_dict(report["chosen"])]
    for c in report["candidates"]:
        cfg = KernelConfig.from_dict(c["config"])
        variants = [cfg]
        if cfg.split_k > 1:
            variants.append(dataclasses.replace(cfg, split_k=1))
        for v in variants:
            if v not in found and not check_config(v, problem, spec):
                found.append(v)
    return found


# ----------------------------------------------------------------------------- measuring


@dataclass
class TuneResult:
    problem: Problem
    device: str
    best: KernelConfig  # the heuristics' choice unless another candidate beat it (`pick`)
    times_us: dict  # config name -> per-call microseconds (median of the passes)
    passes_us: dict  # config name -> per-call microseconds of each pass
    path: Path | None  # where the choice was recorded (None: not recorded)

    @property
    def chosen_by_heuristics(self) -> str:
        return next(iter(self.times_us))


class _Operand:
    """A 2-D view (shape, element strides) of device memory, exposed through
    ``__cuda_array_interface__`` so `gemm` takes it as any other device array."""

    def __init__(self, memory, shape: tuple, strides: tuple, dtype: str):
        self.memory, self.shape, self.strides, self.dtype_name = memory, shape, strides, dtype
        self.dtype = numpy_dtype(dtype)  # names bfloat16, which has no typestr of its own

    @property
    def __cuda_array_interface__(self) -> dict:
        item = self.dtype.itemsize
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "descr": self.dtype.descr,
            "data": (self.memory.ptr, False),
            "strides": tuple(s * item for s in self.strides),
            "version": 3,
            "stream": None,
        }


def _device_operand(host: np.ndarray, major_inner: bool, dtype: str, stream: int) -> _Operand:
    """`host` (rows x cols, float32) on the device in `dtype`, laid out row-major when
    `major_inner`, else column-major (a transposed view), its leading dimension padded to 16
    bytes, which `gemm` reads in place whatever the logical row's length: the tuner times the
    kernel, not the staging copy a contiguous array of a ragged row length gets."""
    dense = host if major_inner else host.T
    pad = 16 // numpy_dtype(dtype).itemsize
    stored = np.zeros((dense.shape[0], -(-dense.shape[1] // pad) * pad), numpy_dtype(dtype))
    stored[:, : dense.shape[1]] = dense
    memory = DeviceMemory(stored.nbytes, stream)
    runtime.check(
        driver.cuMemcpyHtoDAsync(memory.ptr, stored.ctypes.data, stored.nbytes, driver.CUstream(stream)),
        "cuMemcpyHtoDAsync",
    )
    runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")
    lead = stored.shape[1]
    return _Operand(memory, host.shape, (lead, 1) if major_inner else (1, lead), dtype)


def _download(out: _Operand, stream: int) -> np.ndarray:
    """The row-major `out` on the host, in its own dtype (the padding of its rows dropped)."""
    host = np.empty((out.shape[0], out.strides[0]), out.dtype)
    runtime.check(
        driver.cuMemcpyDtoHAsync(host.ctypes.data, out.memory.ptr, host.nbytes, driver.CUstream(stream)),
        "cuMemcpyDtoHAsync",
    )
    runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")
    return host[:, : out.shape[1]]


def output_error(out, ref: np.ndarray, out_dtype: str, magnitude, k: int, row0: int = 0) -> str | None:
    """What is wrong with `out` (any array of rows `row0`... of the output) against `ref`, its
    float64 reference, or None. Every element must be within the rounding of the output
    (unit roundoff x |ref|, or half a subnormal step) plus 2K fp32 roundoffs of `magnitude`, a bound on the sum of
    |a_ik| |b_kj| (+ |c_ij|) it adds up (the worst-case fp32 accumulation error is K of them). A
    NaN or infinity fails (a poisoned element that was never written)."""
    out = np.asarray(out, dtype=np.float64)
    bound = (
        ROUNDOFF[out_dtype] * np.abs(ref)
        + SUBNORMAL_ROUNDOFF[out_dtype]
        + 2 * max(k, 1) * FP32_ROUNDOFF * magnitude
        + 2.0**-40
    )
    bad = ~(np.abs(out - ref) <= bound)  # NaN compares false: bad
    if not bad.any():
        return None
    r, c = np.argwhere(bad)[0]
    bound_rc = np.broadcast_to(bound, bad.shape)[r, c]
    return (
        f"{int(bad.sum())} elements out of tolerance, the first at ({row0 + r}, {c}): "
        f"{out[r, c]!r} instead of {ref[r, c]!r} (bound {bound_rc:.3g})"
    )


def _graph_us(run_calls, stream: int) -> float:
    """Median per-call microseconds of REPLAYS replays of a CUDA graph of `run_calls()` on `stream`."""
    s = driver.CUstream(stream)
    runtime.check(
        driver.cuStreamBeginCapture(s, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        "cuStreamBeginCapture",
    )
    try:
        run_calls()
    except BaseException:
        err, graph = driver.cuStreamEndCapture(s)  # end the capture; the calls' error wins
        if err == driver.CUresult.CUDA_SUCCESS and graph is not None:
            driver.cuGraphDestroy(graph)
        raise
    graph = runtime.check(driver.cuStreamEndCapture(s), "cuStreamEndCapture")
    exe = start = end = None
    try:
        exe = runtime.check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        start = runtime.check(driver.cuEventCreate(0), "cuEventCreate")
        end = runtime.check(driver.cuEventCreate(0), "cuEventCreate")
        runtime.check(driver.cuGraphLaunch(exe, s), "cuGraphLaunch")  # warm-up
        times = []
        for _ in range(REPLAYS):
            runtime.check(driver.cuEventRecord(start, s), "cuEventRecord")
            runtime.check(driver.cuGraphLaunch(exe, s), "cuGraphLaunch")
            runtime.check(driver.cuEventRecord(end, s), "cuEventRecord")
            runtime.check(driver.cuEventSynchronize(end), "cuEventSynchronize")
            ms = runtime.check(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime")
            times.append(ms * 1e3 / CALLS_PER_GRAPH)
        return statistics.median(times)
    finally:
        for event in (start, end):
            if event is not None:
                driver.cuEventDestroy(event)
        if exe is not None:
            driver.cuGraphExecDestroy(exe)
        driver.cuGraphDestroy(graph)


def pick(passes: dict, heuristics_choice: str) -> str:
    """The name to run from {name: per-pass microseconds}: the fastest by median if it beat
    `heuristics_choice` by MIN_GAIN in every pass, else `heuristics_choice`."""
    fastest = min(passes, key=lambda name: statistics.median(passes[name]))
    wins = all(h >= (1 + MIN_GAIN) * f for h, f in zip(passes[heuristics_choice], passes[fastest]))
    return fastest if wins else heuristics_choice


_streams: dict = {}


def _stream(device: int) -> int:
    """This process's non-blocking tuning stream on `device` (kept: its memory is freed on it)."""
    if device not in _streams:
        _streams[device] = int(runtime.check(driver.cuStreamCreate(1), "cuStreamCreate"))
    return _streams[device]


def tune(problem: Problem, device: int = 0, top: int = 6, record: bool = True, progress=None) -> TuneResult:
    """Time the candidates for `problem` on GPU `device` and (with `record`) keep the one
    `pick` chooses in the tuning file. Every candidate's result is checked first (the whole
    output, elementwise against a float64 reference, on a NaN-filled output): a wrong result raises
    RuntimeError. `progress(name, us)`, if given, is called after each timing. Without a GPU or
    driver: :class:`jitgemm.NoGPUError` (after the arguments are checked)."""
    api.check_problem_and_device(problem, device)
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"top: expected an int >= 1 (how many candidates to time), got {top!r}")
    context.make_current(device)
    spec = api.device_spec(device)
    name = runtime.device_info(device).name
    p = problem
    cands = candidates(p, spec, top)
    stream = _stream(device)
    try:
        rng = np.random.default_rng(0)
        per_copy = (p.m * p.k + p.k * p.n) * DTYPE_BYTES[p.dtype] + p.m * p.n * DTYPE_BYTES[p.out_dtype] * (
            2 if p.has_c else 1
        )
        free, _ = runtime.check(driver.cuMemGetInfo(), "cuMemGetInfo")
        copies = max(2, min(CALLS_PER_GRAPH, math.ceil(L2_DEFEAT_BYTES / per_copy), int(free // 4 // per_copy)))
        a_host = rng.standard_normal((p.m, p.k), dtype=np.float32)
        b_host = rng.standard_normal((p.k, p.n), dtype=np.float32)
        c_host = rng.standard_normal((p.m, p.n), dtype=np.float32) if p.has_c else None
        operands = []
        for _ in range(copies):  # the same values in every copy: only their addresses rotate
            a = _device_operand(a_host, p.a_major == "K", p.dtype, stream)
            b = _device_operand(b_host, p.b_major == "N", p.dtype, stream)
            c = _device_operand(c_host, True, p.out_dtype, stream) if p.has_c else None
            out = _device_operand(np.full((p.m, p.n), np.nan, np.float32), True, p.out_dtype, stream)
            operands.append((a, b, c, out))

        as_stored = lambda x, dt: x.astype(numpy_dtype(dt)).astype(np.float64)  # noqa: E731
        b_ref = as_stored(b_host, p.dtype)
        ref = np.empty((p.m, p.n))
        for r0 in range(0, p.m, CHECK_ROWS):  # in row chunks: the float64 copies of A stay small
            ref[r0 : r0 + CHECK_ROWS] = as_stored(a_host[r0 : r0 + CHECK_ROWS], p.dtype) @ b_ref
            if p.has_c:
                ref[r0 : r0 + CHECK_ROWS] += as_stored(c_host[r0 : r0 + CHECK_ROWS], p.out_dtype)
        # sum_k |a_ik| |b_kj| <= |a_i| |b_j| (Cauchy-Schwarz): a bound of each element's
        # magnitudes from row and column norms, without a second product.
        b_norms = np.sqrt((b_ref * b_ref).sum(axis=0))
        a_norms = np.concatenate(
            [
                np.sqrt((as_stored(a_host[r0 : r0 + CHECK_ROWS], p.dtype) ** 2).sum(axis=1))
                for r0 in range(0, p.m, CHECK_ROWS)
            ]
        )
        del b_ref

        def magnitude(r0):
            rows = a_norms[r0 : r0 + CHECK_ROWS, None] * b_norms[None, :]
            return rows + np.abs(as_stored(c_host[r0 : r0 + CHECK_ROWS], p.out_dtype)) if p.has_c else rows

        def call(cfg, i):
            a, b, c, out = operands[i % copies]
            api.gemm(a, b, out, c=c, stream=stream, config=cfg)

        out0 = operands[0][3]
        for cfg in cands:
            # NaN (all ones) again before each candidate: a kernel that skips part of the output
            # must not pass on what the previous one wrote.
            nbytes = out0.memory.nbytes
            runtime.check(
                driver.cuMemsetD8Async(out0.memory.ptr, 0xFF, nbytes, driver.CUstream(stream)), "cuMemsetD8Async"
            )
            call(cfg, 0)
            got = _download(out0, stream)
            for r0 in range(0, p.m, CHECK_ROWS):
                wrong = output_error(
                    got[r0 : r0 + CHECK_ROWS], ref[r0 : r0 + CHECK_ROWS], p.out_dtype, magnitude(r0), p.k, r0
                )
                if wrong:
                    raise RuntimeError(
                        f"jitgemm.tuning: config {cfg.name} computed a wrong result for "
                        f"{p.describe()} ({wrong}); please report it"
                    )
        passes: dict = {cfg.name: [] for cfg in cands}
        for _ in range(PASSES):
            for cfg in cands:
                us = _graph_us(lambda cfg=cfg: [call(cfg, i) for i in range(CALLS_PER_GRAPH)], stream)
                passes[cfg.name].append(us)
                if progress is not None:
                    progress(cfg.name, us)
    finally:
        # before the inputs are freed; an error here must not hide one above
        driver.cuStreamSynchronize(driver.CUstream(stream))
    times = {n: statistics.median(v) for n, v in passes.items()}
    best = next(cfg for cfg in cands if cfg.name == pick(passes, cands[0].name))
    path = None
    if record:
        path = write_entry(
            device_key(name, spec),
            problem_key(p),
            {
                "config": best.to_dict(),
                "name": best.name,
                "us": round(times[best.name], 3),
                "heuristics_choice": cands[0].name,
                "times_us": {n: round(t, 3) for n, t in times.items()},
                "passes_us": {n: [round(t, 3) for t in v] for n, v in passes.items()},
                "min_gain": MIN_GAIN,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            },
        )
    return TuneResult(p, name, best, times, passes, path)
