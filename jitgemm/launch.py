"""Grid size, split-K workspace and kernel arguments for one GEMM launch."""
from __future__ import annotations

import threading

from cuda.bindings import driver

from . import runtime
from .config import KernelConfig
from .layout import KernelLayout


class CaptureError(RuntimeError):
    """A call needs something (a compile, a bigger workspace) that cannot happen during graph capture."""


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


def stream_is_capturing(stream: int) -> bool:
    status = runtime.check(driver.cuStreamIsCapturing(driver.CUstream(stream)), "cuStreamIsCapturing")
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


class _Workspace:
    """Split-K scratch of one (device, stream): fp32 partial tiles, then int tile counters.

    The counters start at zero and every launch leaves them at zero (the last split of a tile
    resets its counter), so launches on one stream can reuse the buffer without a memset.
    Launches on one stream are ordered, so they never share it concurrently.
    """

    def __init__(self):
        self.ptr = 0
        self.partial_bytes = 0
        self.counter_bytes = 0
        self.lock = threading.Lock()

    def ensure(self, partial_bytes: int, counter_bytes: int, stream: int) -> tuple:
        with self.lock:
            return self._ensure(partial_bytes, counter_bytes, stream)

    def _ensure(self, partial_bytes: int, counter_bytes: int, stream: int) -> tuple:
        if partial_bytes > self.partial_bytes or counter_bytes > self.counter_bytes:
            if stream_is_capturing(stream):
                raise CaptureError("a split-K kernel needs a larger workspace during CUDA graph capture; "
                                   "run the same gemm once before capturing")
            partial_bytes = max(partial_bytes, self.partial_bytes) * 3 // 2
            counter_bytes = max(counter_bytes, self.counter_bytes) * 3 // 2
            if self.ptr:
                runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")
                runtime.check(driver.cuMemFree(self.ptr), "cuMemFree")
                self.ptr = 0
            partial_bytes = -(-partial_bytes // 256) * 256
            counter_bytes = -(-counter_bytes // 256) * 256
            self.ptr = int(runtime.check(driver.cuMemAlloc(partial_bytes + counter_bytes), "cuMemAlloc(split-K workspace)"))
            runtime.check(driver.cuMemsetD32Async(self.ptr + partial_bytes, 0, counter_bytes // 4,
                                                  driver.CUstream(stream)), "cuMemsetD32Async")
            self.partial_bytes, self.counter_bytes = partial_bytes, counter_bytes
        return self.ptr, self.ptr + self.partial_bytes


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
    units = cluster_tiles(cfg, m, n)
    extra = []
    if cfg.split_k > 1:
        splits = num_splits(cfg, k)
        units *= splits
        tiles = cluster_tiles(cfg, m, n) * cfg.cluster_size
        partial_bytes = tiles * splits * cfg.block_m * cfg.block_n * 4
        counter_bytes = tiles * cfg.num_consumers * 4
        partials, counters = _workspace(device, stream).ensure(partial_bytes, counter_bytes, stream)
        extra = [(partials, counters, splits)]
    grid = min(units, num_sms // cfg.cluster_size) * cfg.cluster_size
    runtime.launch(kernel, grid, stream, maps, [m, n, k], [alpha, beta], *extra)
