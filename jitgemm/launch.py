"""Grid size, split-K workspace and kernel arguments for one GEMM launch."""
from __future__ import annotations

import ctypes
import threading

from cuda.bindings import driver

from . import layout_sm100, runtime
from .config import KernelConfig
from .layout import KernelLayout, kernel_multicast, kernel_shape


class CaptureError(RuntimeError):
    """A call needs a kernel compiled or loaded while its stream captures a CUDA graph."""


def cluster_tiles(cfg: KernelConfig, m: int, n: int) -> int:
    """Work items of one K split (sm_90a): kernel tiles, or tile pairs for a 2-CTA cluster."""
    km, kn = kernel_shape(cfg, m, n)
    tiles_m, tiles_n = -(-km // cfg.block_m), -(-kn // cfg.block_n)
    shared = kernel_multicast(cfg)
    if shared == "A":
        tiles_n = -(-tiles_n // 2)
    elif shared == "B":
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

    The counters start at zero and every launch leaves them at zero (the split that reduces a
    tile resets its counter), so launches that never overlap in time reuse the buffer without a
    memset: those of one stream here, those of one stream of one graph in _GraphWorkspaces.
    Threads sharing a stream share its workspace: `lock` is held from `ensure` until the launch
    is queued, so a thread growing the buffer never frees one another is about to launch on.
    """

    def __init__(self):
        self.ptr = 0
        self.partial_bytes = 0
        self.counter_bytes = 0
        self.lock = threading.Lock()

    def ensure(self, partial_bytes: int, counter_bytes: int, stream: int) -> tuple:
        """(partials, counters) pointers of at least these sizes; grows for eager launches.
        The caller holds `lock` until its launch is queued. Allocation and free are ordered on
        the stream (a plain cuMemAlloc would wait for the whole device: a kernel of another
        stream that waits for this one would then never see it launched)."""
        if partial_bytes > self.partial_bytes or counter_bytes > self.counter_bytes:
            cu_stream = driver.CUstream(stream)
            if self.ptr:   # freed once the earlier launches on this stream are done with it
                runtime.check(driver.cuMemFreeAsync(self.ptr, cu_stream), "cuMemFreeAsync")
            partial_bytes = _round(max(partial_bytes, self.partial_bytes * 3 // 2))
            counter_bytes = _round(max(counter_bytes, self.counter_bytes * 3 // 2))
            self.ptr = int(runtime.check(driver.cuMemAllocAsync(partial_bytes + counter_bytes, cu_stream),
                                         "cuMemAllocAsync(split-K workspace)"))
            runtime.check(driver.cuMemsetD32Async(self.ptr + partial_bytes, 0, counter_bytes // 4, cu_stream),
                          "cuMemsetD32Async")
            self.partial_bytes, self.counter_bytes = partial_bytes, counter_bytes
        return self.ptr, self.ptr + self.partial_bytes


def _round(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


_workspaces: dict = {}
_workspaces_lock = threading.Lock()


def _workspace(device: int, stream: int) -> _Workspace:
    """The workspace of `stream`, keyed by the stream's unique id, not its handle: the
    per-thread default stream has one handle in every thread, and a destroyed stream's handle
    can come back for a new stream while the old one's kernels still run."""
    stream_id = int(runtime.check(driver.cuStreamGetId(driver.CUstream(stream)), "cuStreamGetId"))
    key = (device, stream_id)
    ws = _workspaces.get(key)
    if ws is None:
        with _workspaces_lock:
            ws = _workspaces.setdefault(key, _Workspace())
    return ws


class _GraphWorkspaces:
    """Split-K scratch of the launches captured into CUDA graphs.

    Each (capture, stream) gets its own buffers, allocated and zeroed outside the graph while it
    is captured, so a replay is the kernels alone: no allocation or memset nodes between them,
    which would also break the programmatic (PDL) edges from one GEMM to the next. The buffers
    live as long as the graph and its executable copies: a CUDA user object owned by the graph
    posts a semaphore when the last of them is destroyed (CUDA calls it on an internal thread
    where no CUDA call is allowed), and the buffers are freed at the next capture.
    Replays of one graph are serialised by CUDA; instantiating one graph twice and replaying
    both copies concurrently would share the scratch, like any workspace-holding library call.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.live: dict = {}       # (device, capture id, stream) -> [(pointer, partial bytes, counter bytes)]
        self.tied: list = []       # (semaphore, key) of buffers that go with their graph
        self.private_streams: dict = {}   # device -> non-blocking stream for allocations

    def ensure(self, device: int, stream: int, partial_bytes: int, counter_bytes: int) -> tuple:
        cu_stream = driver.CUstream(stream)
        _, capture_id, graph, *_ = runtime.check(driver.cuStreamGetCaptureInfo(cu_stream), "cuStreamGetCaptureInfo")
        key = (device, int(capture_id), stream)
        with self.lock:
            buffers = self.live.get(key)
            if buffers is None:
                self._free_released(device)
                self._tie_to_graph(graph, key)     # first: if it fails, nothing is recorded
                buffers = self.live[key] = []
            found = buffers[-1] if buffers else None
            if found is None or partial_bytes > found[1] or counter_bytes > found[2]:
                # Earlier nodes of this graph keep the smaller buffer; both live with the graph.
                found = self._allocate(device, _round(partial_bytes), _round(counter_bytes))
                buffers.append(found)
            return found[0], found[0] + found[1]

    def _allocate(self, device: int, partial_bytes: int, counter_bytes: int) -> tuple:
        """(pointer, partial bytes, counter bytes), counters zeroed, on the private stream: a
        stream-ordered allocation there neither joins the capture nor synchronises the device."""
        with _relaxed_capture_mode():
            private = driver.CUstream(self._private_stream(device))
            ptr = int(runtime.check(driver.cuMemAllocAsync(partial_bytes + counter_bytes, private),
                                    "cuMemAllocAsync(split-K graph workspace)"))
            runtime.check(driver.cuMemsetD32Async(ptr + partial_bytes, 0, counter_bytes // 4, private), "cuMemsetD32Async")
            runtime.check(driver.cuStreamSynchronize(private), "cuStreamSynchronize")
        return ptr, partial_bytes, counter_bytes

    def _private_stream(self, device: int) -> int:
        if device not in self.private_streams:
            flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
            self.private_streams[device] = int(runtime.check(driver.cuStreamCreate(flags), "cuStreamCreate"))
        return self.private_streams[device]

    def _tie_to_graph(self, graph, key: tuple) -> None:
        sem = _Semaphore.create()
        if sem is None:          # no POSIX semaphores: the buffers stay for the process
            return
        obj = runtime.check(driver.cuUserObjectCreate(
            sem.address, driver.CUhostFn(_Semaphore.post_address()), 1,
            driver.CUuserObject_flags.CU_USER_OBJECT_NO_DESTRUCTOR_SYNC), "cuUserObjectCreate")
        runtime.check(driver.cuGraphRetainUserObject(
            graph, obj, 1, driver.CUuserObjectRetain_flags.CU_GRAPH_USER_OBJECT_MOVE), "cuGraphRetainUserObject")
        self.tied.append((sem, key))

    def _free_released(self, device: int) -> None:
        """Free the buffers of this device's graphs that are gone (their semaphore was posted);
        another device's wait for a capture there, where its context is current."""
        still, released = [], []
        for sem, key in self.tied:
            if key[0] == device and sem.try_wait_and_free():
                released.append(key)
            else:
                still.append((sem, key))
        self.tied = still          # before freeing: a posted semaphore's memory is gone
        if not released:
            return
        with _relaxed_capture_mode():
            private = driver.CUstream(self._private_stream(device))
            for key in released:
                for ptr, *_ in self.live.pop(key):
                    runtime.check(driver.cuMemFreeAsync(ptr, private), "cuMemFreeAsync")


class _Semaphore:
    """A POSIX semaphore in libc memory, for libc's sem_post to be called by CUDA on a graph's
    destruction. The memory is not Python's, so a post at interpreter exit cannot touch freed
    memory; it is freed once the post has been seen."""
    _libc = None

    def __init__(self, address: int):
        self.address = address

    @classmethod
    def _lib(cls):
        if cls._libc is None:
            lib = ctypes.CDLL(None)
            lib.malloc.restype = ctypes.c_void_p
            lib.malloc.argtypes = [ctypes.c_size_t]
            lib.free.argtypes = [ctypes.c_void_p]
            lib.sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
            lib.sem_trywait.argtypes = [ctypes.c_void_p]
            cls._libc = lib
        return cls._libc

    @classmethod
    def create(cls):
        """A new semaphore at zero, or None where libc has no POSIX semaphores."""
        try:
            lib = cls._lib()
            address = lib.malloc(64)                     # sem_t is 32 bytes on Linux
            if not address:
                return None
            if lib.sem_init(address, 0, 0) != 0:
                lib.free(address)
                return None
        except (OSError, AttributeError):
            return None
        return cls(address)

    @classmethod
    def post_address(cls) -> int:
        return ctypes.cast(cls._lib().sem_post, ctypes.c_void_p).value

    def try_wait_and_free(self) -> bool:
        """True (and the memory freed) once the semaphore was posted."""
        lib = self._lib()
        if lib.sem_trywait(self.address) != 0:
            return False
        lib.free(self.address)
        return True


class _relaxed_capture_mode:
    """Lets this thread allocate while a stream captures in global mode (as torch.cuda.graph does)."""

    def __enter__(self):
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        self.previous = runtime.check(driver.cuThreadExchangeStreamCaptureMode(mode), "cuThreadExchangeStreamCaptureMode")

    def __exit__(self, *exc):
        runtime.check(driver.cuThreadExchangeStreamCaptureMode(self.previous), "cuThreadExchangeStreamCaptureMode")


_graph_workspaces = _GraphWorkspaces()


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
    # fp32 partial tiles, a slot per split: whichever split finishes last reduces the tile
    partial_bytes = _round(tiles * splits * cfg.block_m * cfg.block_n * 4)
    counter_bytes = _round(tiles * cfg.num_consumers * 8)   # parked and started, per tile and warpgroup
    if stream_is_capturing(stream):
        partials, counters = _graph_workspaces.ensure(device, stream, partial_bytes, counter_bytes)
        runtime.launch(kernel, grid, stream, maps, [m, n, k], [alpha, beta], (partials, counters, splits))
        return
    ws = _workspace(device, stream)
    with ws.lock:
        partials, counters = ws.ensure(partial_bytes, counter_bytes, stream)
        runtime.launch(kernel, grid, stream, maps, [m, n, k], [alpha, beta], (partials, counters, splits))
