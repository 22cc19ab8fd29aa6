"""Grid size, split-K workspace and kernel arguments for one GEMM launch."""
from __future__ import annotations

import threading

from cuda.bindings import driver

from . import layout_sm100, runtime
from .config import KernelConfig
from .layout import KernelLayout


class CaptureError(RuntimeError):
    """A call needs a kernel compiled or loaded while its stream captures a CUDA graph."""


def cluster_tiles(cfg: KernelConfig, m: int, n: int) -> int:
    """Work items of one K split: tiles, or tile pairs for a 2-CTA cluster."""
    tiles_m, tiles_n = -(-m // cfg.block_m), -(-n // cfg.block_n)
    if cfg.multicast == "A":
        tiles_n = -(-tiles_n // 2)
    elif cfg.multicast == "B":
        tiles_m = -(-tiles_m // 2)
    return tiles_m * tiles_n


def num_splits(cfg: KernelConfig, k: int) -> int:
    """K splits actually used: at most one per K block, so no split is empty."""
    return max(1, min(cfg.split_k, -(-k // cfg.block_k)))


def grid_size(cfg: KernelConfig, m: int, n: int, k: int, num_sms: int) -> int:
    """CTAs to launch: persistent, at most one per SM, a multiple of the cluster size."""
    if cfg.arch == "sm_100a":
        return layout_sm100.grid_size(cfg, m, n, num_sms)
    units = cluster_tiles(cfg, m, n) * num_splits(cfg, k)
    return min(units, num_sms // cfg.cluster_size) * cfg.cluster_size


def stream_is_capturing(stream: int) -> bool:
    status = runtime.check(driver.cuStreamIsCapturing(driver.CUstream(stream)), "cuStreamIsCapturing")
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


class _Workspace:
    """Split-K scratch of one (device, stream) outside graph capture: fp32 partial tiles, then
    int tile counters.

    The counters start at zero and every launch leaves them at zero (the last split of a tile
    resets its counter), so launches on one stream reuse the buffer without a memset. Launches
    on one stream are ordered, so they never share it concurrently.
    """

    def __init__(self):
        self.ptr = 0
        self.partial_bytes = 0
        self.counter_bytes = 0
        self.lock = threading.Lock()

    def ensure(self, partial_bytes: int, counter_bytes: int, stream: int) -> tuple:
        with self.lock:
            if partial_bytes > self.partial_bytes or counter_bytes > self.counter_bytes:
                self._grow(max(partial_bytes, self.partial_bytes * 3 // 2),
                           max(counter_bytes, self.counter_bytes * 3 // 2), stream)
            return self.ptr, self.ptr + self.partial_bytes

    def _grow(self, partial_bytes: int, counter_bytes: int, stream: int) -> None:
        if self.ptr:   # earlier launches on this stream may still use the old buffer
            runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")
            runtime.check(driver.cuMemFree(self.ptr), "cuMemFree")
            self.ptr = 0
        partial_bytes, counter_bytes = _round(partial_bytes), _round(counter_bytes)
        self.ptr = int(runtime.check(driver.cuMemAlloc(partial_bytes + counter_bytes), "cuMemAlloc(split-K workspace)"))
        runtime.check(driver.cuMemsetD32Async(self.ptr + partial_bytes, 0, counter_bytes // 4,
                                              driver.CUstream(stream)), "cuMemsetD32Async")
        self.partial_bytes, self.counter_bytes = partial_bytes, counter_bytes


def _round(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


_workspaces: dict = {}
_workspaces_lock = threading.Lock()


def _workspace(device: int, stream: int) -> _Workspace:
    key = (device, stream)
    ws = _workspaces.get(key)
    if ws is None:
        with _workspaces_lock:
            ws = _workspaces.setdefault(key, _Workspace())
    return ws


def launch_gemm(kernel, lay: KernelLayout, num_sms: int, device: int, stream: int, maps: list,
                m: int, n: int, k: int, alpha: float, beta: float) -> None:
    """Launch a loaded GEMM kernel: maps are (A, B, D[, C]) tensor maps."""
    cfg = lay.config
    grid = grid_size(cfg, m, n, k, num_sms)
    if cfg.split_k == 1:
        runtime.launch(kernel, grid, stream, maps, [m, n, k], [alpha, beta])
        return
    splits = num_splits(cfg, k)
    tiles = cluster_tiles(cfg, m, n) * cfg.cluster_size
    partial_bytes = _round(tiles * splits * cfg.block_m * cfg.block_n * 4)
    counter_bytes = _round(tiles * cfg.num_consumers * 4)
    if not stream_is_capturing(stream):
        partials, counters = _workspace(device, stream).ensure(partial_bytes, counter_bytes, stream)
        runtime.launch(kernel, grid, stream, maps, [m, n, k], [alpha, beta], (partials, counters, splits))
        return
    # Under graph capture the workspace is a stream-ordered allocation of the graph itself
    # (alloc, memset, kernel, free nodes), so every replay, on any stream, gets its own.
    cu_stream = driver.CUstream(stream)
    ptr = int(runtime.check(driver.cuMemAllocAsync(partial_bytes + counter_bytes, cu_stream),
                            "cuMemAllocAsync(split-K workspace)"))
    runtime.check(driver.cuMemsetD32Async(ptr + partial_bytes, 0, counter_bytes // 4, cu_stream), "cuMemsetD32Async")
    runtime.launch(kernel, grid, stream, maps, [m, n, k], [alpha, beta], (ptr, ptr + partial_bytes, splits))
    runtime.check(driver.cuMemFreeAsync(ptr, cu_stream), "cuMemFreeAsync")
