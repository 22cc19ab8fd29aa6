"""The one launch path: a kernel's parameters packed once per call site (`KernelLaunch`), the
split-K workspace of each stream or captured graph, and cuLaunchKernelEx in the device's
primary context."""

from __future__ import annotations

import array
import ctypes
import threading

from cuda.bindings import driver

from . import context, geometry, runtime
from .config import KernelConfig
from .problem import Problem


class CaptureError(RuntimeError):
    """A call needs a kernel compiled or loaded while its stream captures a CUDA graph."""


def stream_is_capturing(stream) -> bool:
    """Whether `stream` (a handle, or its driver.CUstream) is being captured into a graph."""
    if not isinstance(stream, driver.CUstream):
        stream = driver.CUstream(stream)
    status = runtime.check(driver.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


class _Workspace:
    """Scratch of one (device, stream) outside graph capture, in regions (`REGIONS`): split-K's
    fp32 partial tiles and int tile counters, then the staged operands (staging.py).

    The counters start at zero and every launch leaves them at zero (the split that reduces a
    tile resets its counter), so launches that never overlap in time reuse the buffer without a
    memset: those of one stream here, those of one stream of one graph in _GraphWorkspaces.
    Threads sharing a stream share its workspace: `lock` is held from `ensure` until the launch
    (and its staging launch) is queued, so a thread growing the buffer never frees one another
    is about to launch on, and no thread stages its operands between another's staging and GEMM.
    """

    def __init__(self):
        self.ptr = 0
        self.sizes = (0,) * len(REGIONS)
        self.regions = _region_pointers(0, self.sizes)
        self.fitting: set = set()  # sizes asked for that fit: the buffer only grows, so they still do
        self.lock = threading.Lock()

    def ensure(self, sizes: tuple, stream: int) -> tuple:
        """The regions' pointers, each at least its size in `sizes`; grows for eager launches.
        The caller holds `lock` until its launch is queued. Allocation and free are ordered on
        the stream (a plain cuMemAlloc would wait for the whole device: a kernel of another
        stream that waits for this one would then never see it launched)."""
        if sizes in self.fitting:
            return self.regions
        if any(size > have for size, have in zip(sizes, self.sizes)):
            cu_stream = driver.CUstream(stream)
            if self.ptr:  # freed once the earlier launches on this stream are done with it
                runtime.check(driver.cuMemFreeAsync(self.ptr, cu_stream), "cuMemFreeAsync")
            sizes = tuple(
                _round(max(size, have * 3 // 2)) if size > have else have for size, have in zip(sizes, self.sizes)
            )
            self.ptr = int(runtime.check(driver.cuMemAllocAsync(sum(sizes), cu_stream), "cuMemAllocAsync(workspace)"))
            _zero_counters(self.ptr, sizes, cu_stream)
            self.sizes = sizes
            self.regions = _region_pointers(self.ptr, sizes)
        self.fitting.add(sizes)
        return self.regions


# The workspace's regions, in order: split-K partials, split-K tile counters, staged A, staged B.
REGIONS = ("partials", "counters", "staged_a", "staged_b")
_COUNTERS = REGIONS.index("counters")


def _region_pointers(ptr: int, sizes: tuple) -> tuple:
    pointers, offset = [], ptr
    for size in sizes:
        pointers.append(offset)
        offset += size
    return tuple(pointers)


def _zero_counters(ptr: int, sizes: tuple, cu_stream) -> None:
    if sizes[_COUNTERS]:
        start = _region_pointers(ptr, sizes)[_COUNTERS]
        runtime.check(driver.cuMemsetD32Async(start, 0, sizes[_COUNTERS] // 4, cu_stream), "cuMemsetD32Async")


def _round(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


_workspaces: dict = {}
_workspaces_lock = threading.Lock()


def _workspace(device: int, stream) -> _Workspace:
    """The workspace of `stream` (a handle, or its driver.CUstream), keyed by the stream's
    unique id, not its handle: the per-thread default stream has one handle in every thread,
    and a destroyed stream's handle can come back for a new stream while the old one's kernels
    still run."""
    if not isinstance(stream, driver.CUstream):
        stream = driver.CUstream(stream)
    stream_id = int(runtime.check(driver.cuStreamGetId(stream), "cuStreamGetId"))
    key = (device, stream_id)
    ws = _workspaces.get(key)
    if ws is None:
        with _workspaces_lock:
            ws = _workspaces.setdefault(key, _Workspace())
    return ws


class _GraphWorkspaces:
    """Scratch (split-K's, staged operands') of the launches captured into CUDA graphs.

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
        self.live: dict = {}  # (device, capture id, stream) -> [(pointer, region sizes)]
        self.tied: list = []  # (semaphore, key) of buffers that go with their graph
        self.private_streams: dict = {}  # device -> non-blocking stream for allocations

    def ensure(self, device: int, stream: int, sizes: tuple) -> tuple:
        """The regions' pointers (see _Workspace) for a launch being captured on `stream`."""
        cu_stream = driver.CUstream(stream)
        _, capture_id, graph, *_ = runtime.check(driver.cuStreamGetCaptureInfo(cu_stream), "cuStreamGetCaptureInfo")
        key = (device, int(capture_id), stream)
        with self.lock:
            buffers = self.live.get(key)
            if buffers is None:
                self._free_released(device)
                self._tie_to_graph(graph, key)  # first: if it fails, nothing is recorded
                buffers = self.live[key] = []
            found = buffers[-1] if buffers else None
            if found is None or any(size > have for size, have in zip(sizes, found[1])):
                # Earlier nodes of this graph keep the smaller buffer; both live with the graph.
                found = self._allocate(device, tuple(_round(size) for size in sizes))
                buffers.append(found)
            return _region_pointers(*found)

    def _allocate(self, device: int, sizes: tuple) -> tuple:
        """(pointer, region sizes), counters zeroed, on the private stream: a stream-ordered
        allocation there neither joins the capture nor synchronises the device."""
        with _relaxed_capture_mode():
            private = driver.CUstream(self._private_stream(device))
            ptr = int(runtime.check(driver.cuMemAllocAsync(sum(sizes), private), "cuMemAllocAsync(graph workspace)"))
            _zero_counters(ptr, sizes, private)
            runtime.check(driver.cuStreamSynchronize(private), "cuStreamSynchronize")
        return ptr, sizes

    def _private_stream(self, device: int) -> int:
        if device not in self.private_streams:
            flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
            self.private_streams[device] = int(runtime.check(driver.cuStreamCreate(flags), "cuStreamCreate"))
        return self.private_streams[device]

    def _tie_to_graph(self, graph, key: tuple) -> None:
        sem = _Semaphore.create()
        if sem is None:  # no POSIX semaphores: the buffers stay for the process
            return
        obj = runtime.check(
            driver.cuUserObjectCreate(
                sem.address,
                driver.CUhostFn(_Semaphore.post_address()),
                1,
                driver.CUuserObject_flags.CU_USER_OBJECT_NO_DESTRUCTOR_SYNC,
            ),
            "cuUserObjectCreate",
        )
        runtime.check(
            driver.cuGraphRetainUserObject(graph, obj, 1, driver.CUuserObjectRetain_flags.CU_GRAPH_USER_OBJECT_MOVE),
            "cuGraphRetainUserObject",
        )
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
        self.tied = still  # before freeing: a posted semaphore's memory is gone
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
            address = lib.malloc(64)  # sem_t is 32 bytes on Linux
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
        self.previous = runtime.check(
            driver.cuThreadExchangeStreamCaptureMode(mode), "cuThreadExchangeStreamCaptureMode"
        )

    def __exit__(self, *exc):
        runtime.check(driver.cuThreadExchangeStreamCaptureMode(self.previous), "cuThreadExchangeStreamCaptureMode")


_graph_workspaces = _GraphWorkspaces()


MAP_BYTES = 128  # a CUtensorMap
MAP_ALIGN = 64  # the driver's alignment of a CUtensorMap
_WORDS_PER_MAP = MAP_BYTES // 8


def _replace_address(tmap, address: int) -> None:
    """Point tensor map `tmap` (a CUtensorMap over jitgemm's own storage) at `address`."""
    err = driver.cuTensorMapReplaceAddress(tmap, address)[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        runtime.check((err,), f"cuTensorMapReplaceAddress({address:#x})")


def _address_is_first_word(words: memoryview, maps: list) -> bool:
    """Whether the driver's cuTensorMapReplaceAddress changes exactly the first 8 bytes of each
    of these descriptors, to the new address (little-endian), so that a call can write the
    address itself. Asked of the driver on every descriptor, with two addresses; any
    difference, or any error, leaves the driver call in charge. The descriptors are restored."""
    try:
        for i, tmap in enumerate(maps):
            first = i * _WORDS_PER_MAP
            saved = words[first : first + _WORDS_PER_MAP].tolist()
            try:
                for delta in (16, (1 << 32) + 48):
                    address = saved[0] + delta
                    _replace_address(tmap, address)
                    by_driver = words[first : first + _WORDS_PER_MAP].tolist()
                    if by_driver != [address] + saved[1:]:
                        return False
            finally:
                words[first : first + _WORDS_PER_MAP] = memoryview(array.array("Q", saved))
    except Exception:  # any driver error: the driver call stays in charge
        return False
    return True


class Launch:
    """A launch with its parameters packed once, queued on `stream` in the device's primary
    context: `launch_at(a, b, d, c)` gives it the operands' addresses (`repoint`) and queues
    it; calling it queues it as it stands. Launches that use the workspace (REGIONS) get
    their stream's, or their graph's under capture (`with_workspace`)."""

    __slots__ = ("device", "stream", "ctx", "ctx_handle", "cu_stream")

    def __init__(self, device: int, stream: int):
        self.device, self.stream = device, stream
        self.ctx = context.primary(device)
        self.ctx_handle = int(self.ctx)
        self.cu_stream = driver.CUstream(stream)  # for the capture check and the workspace's lookup

    def repoint(self, a: int, b: int, d: int, c: int) -> None:
        raise NotImplementedError

    def _dispatch(self) -> None:
        raise NotImplementedError

    def launch_at(self, a: int, b: int, d: int, c: int) -> None:
        """`repoint` at these addresses, then launch (in the device's context)."""
        if context.is_current(self.ctx_handle):  # the usual case, without a context manager's cost
            self.repoint(a, b, d, c)
            self._dispatch()
        else:
            with context.current(self.ctx):
                self.repoint(a, b, d, c)
                self._dispatch()

    def __call__(self) -> None:
        if context.is_current(self.ctx_handle):
            self._dispatch()
        else:
            with context.current(self.ctx):
                self._dispatch()

    def with_workspace(self, sizes: tuple, launch_with) -> None:
        """`launch_with(regions)`: the REGIONS' pointers of a workspace with at least `sizes`
        bytes in each, the graph's under capture, else the stream's (its lock held until the
        launches are queued: no other thread may grow or reuse it meanwhile)."""
        if stream_is_capturing(self.cu_stream):
            launch_with(_graph_workspaces.ensure(self.device, self.stream, sizes))
        else:
            ws = _workspace(self.device, self.cu_stream)
            with ws.lock:
                launch_with(ws.ensure(sizes, self.stream))


class KernelLaunch(Launch):
    """One kernel launch with its parameters packed once: the tensor maps (`arch.tensor_maps`
    order, copied into the launch's own storage), M, N, K, alpha, beta, and for split-K the
    workspace and tile-counter pointers (filled in at each call: a stream's workspace can grow
    between calls) and the split count. Calling it launches on `stream` in the device's primary
    context.

    `launch_at` (`repoint`, then launch) gives the maps new global addresses: a problem seen
    before with new arrays reuses the launch (kernel, grid, every other descriptor field) and
    patches only the addresses: written directly where the driver is seen to keep a map's
    address in its first word (`_address_is_first_word`, asked once per launch), else by
    cuTensorMapReplaceAddress. The driver copies the parameters when a launch is queued, so
    patching after a launch never touches one already queued; callers sharing one launch
    across threads hold a lock from `launch_at` until it returns."""

    __slots__ = (
        "kernel",
        "cfg",
        "grid",
        "tiles",
        "storage",
        "words",
        "maps",
        "roles",
        "words_of_roles",
        "direct",
        "ints",
        "floats",
        "pointers",
        "splits",
        "outputs",
        "params",
        "address",
        "config",
        "stage",
        "sources",
        "staged_maps",
        "staged_bytes",
        "workspace_sizes",
    )

    def __init__(
        self,
        kernel: runtime.LoadedKernel,
        cfg: KernelConfig,
        problem: Problem,
        maps: list,
        alpha: float,
        beta: float,
        grid: int,
        tiles: int,
        device: int,
        stream: int,
        roles: tuple = (),
        outputs: tuple = (),
        staged: tuple = (None, None),
        stage=None,
        sources: tuple = (0, 0),
    ):
        """`tiles`: the CTA tiles of one K split (the split-K workspace holds a partial of each).
        `roles`: for each map, the index of the operand it addresses in `repoint`'s arguments
        (a, b, d, c). `outputs`: under cfg.out_direct, D's address and row stride in bytes,
        then C's (with C), the kernel's last parameters. `staged`: for A and B, the
        staging.StagedOperand of an operand staged into the workspace by `stage` (its
        staging.StageLaunch) before each launch, or None; `sources`: the staged operands'
        addresses (`repoint` changes them), whose maps point into the workspace instead."""
        super().__init__(device, stream)
        self.kernel, self.cfg = kernel, cfg
        self.grid, self.tiles = grid, tiles
        # The maps, copied into storage of the launch's own (64-byte aligned), so that patching
        # them never changes a descriptor another launch shares (runtime caches them).
        self.storage = ctypes.create_string_buffer(len(maps) * MAP_BYTES + MAP_ALIGN)
        base = ctypes.addressof(self.storage)
        offset = -base % MAP_ALIGN
        base += offset
        for i, tmap in enumerate(maps):
            ctypes.memmove(base + i * MAP_BYTES, int(tmap.getPtr()), MAP_BYTES)
        self.words = memoryview(self.storage).cast("B")[offset : offset + len(maps) * MAP_BYTES].cast("Q")
        addresses = [base + i * MAP_BYTES for i in range(len(maps))]
        self.maps = [driver.CUtensorMap(_ptr=address) for address in addresses]  # views of the storage
        if [int(t.getPtr()) for t in self.maps] != addresses:
            raise RuntimeError("cuda.bindings' CUtensorMap(_ptr=...) did not wrap jitgemm's descriptor storage")
        self.roles = tuple(roles)
        self.stage, self.sources = stage, list(sources)
        self.staged_bytes = tuple(0 if op is None else op.nbytes for op in staged)
        is_staged = [role < 2 and staged[role] is not None for role in self.roles]
        self.words_of_roles = tuple((i * _WORDS_PER_MAP, role) for i, role in enumerate(self.roles) if not is_staged[i])
        self.staged_maps = tuple((i, role) for i, role in enumerate(self.roles) if is_staged[i])
        # Whether repoint may write the addresses itself; asked of the driver now, in the
        # device's context (the caller's), once per launch.
        self.direct = bool(self.roles) and _address_is_first_word(self.words, self.maps)
        self.ints = (ctypes.c_int * 3)(problem.m, problem.n, problem.k)
        self.floats = (ctypes.c_float * 2)(alpha, beta)
        ints, floats = ctypes.addressof(self.ints), ctypes.addressof(self.floats)
        args = addresses + [ints, ints + 4, ints + 8, floats, floats + 4]
        self.pointers = self.splits = None
        if cfg.split_k > 1 or cfg.stream_k:
            splits = geometry.partial_slots(cfg, tiles // cfg.cluster_size, problem.k, grid // cfg.cluster_size)
            self.pointers = (ctypes.c_void_p * 2)()
            self.splits = ctypes.c_int(splits)
            pointers = ctypes.addressof(self.pointers)
            args += [pointers, pointers + 8, ctypes.addressof(self.splits)]
        self.outputs = None
        if cfg.out_direct:
            self.outputs = (ctypes.c_uint64 * len(outputs))(*outputs)
            first = ctypes.addressof(self.outputs)
            args += [first + 8 * i for i in range(len(outputs))]
        self.params = (ctypes.c_void_p * len(args))(*args)
        self.address = ctypes.addressof(self.params)
        self.config = runtime.launch_config(kernel, grid, stream)
        self.workspace_sizes = self.workspace_bytes()

    def repoint(self, a: int, b: int, d: int, c: int) -> None:
        """Point each map at the operand its role names: a, b, d and c are addresses (c may be
        0 when no map reads it). Each a map reads must be 16-byte aligned (TMA's rule; the
        caller checks); D and C under out_direct need only their elements' alignment.
        Without direct writes this calls the driver: the device's context must be current
        (`launch_at` makes it so)."""
        operands = (a, b, d, c)
        if self.staged_maps:
            self.sources[:] = (a, b)
        if self.outputs is not None:  # under out_direct D and C are plain pointers
            self.outputs[0] = d
            if len(self.outputs) > 2:
                self.outputs[2] = c
        if self.direct:
            words = self.words
            for word, role in self.words_of_roles:
                words[word] = operands[role]
        else:
            for tmap, role in zip(self.maps, self.roles):
                _replace_address(tmap, operands[role])

    def _dispatch(self) -> None:
        if self.pointers is None and self.stage is None:
            self._launch()
        else:
            self.with_workspace(self.workspace_sizes, self._launch_with)

    def _launch_with(self, regions: tuple) -> None:
        """Launch with the workspace's `regions` (REGIONS' pointers): the staging first."""
        partials, counters, staged_a, staged_b = regions
        if self.pointers is not None:
            self.pointers[:] = (partials, counters)
        if self.stage is not None:
            staged = (staged_a, staged_b)
            for i, role in self.staged_maps:
                if self.direct:
                    self.words[i * _WORDS_PER_MAP] = staged[role]
                else:
                    _replace_address(self.maps[i], staged[role])
            src_a, src_b = (address if nbytes else 0 for address, nbytes in zip(self.sources, self.staged_bytes))
            self.stage.launch(src_a, staged_a, src_b, staged_b)
        self._launch()

    def workspace_bytes(self) -> tuple:
        """The sizes of the workspace's REGIONS this launch needs. Split-K: an fp32 partial
        tile per split (whichever split finishes last reduces a tile), and two counters per
        tile and math warpgroup, for the tiles geometry.partial_tiles names (every tile under
        split_k, the cut ones under stream_k)."""
        cfg = self.cfg
        if self.pointers is None:
            split_k = (0, 0)
        else:
            cluster = cfg.cluster_size
            tiles = geometry.partial_tiles(cfg, self.tiles // cluster, self.grid // cluster) * cluster
            split_k = (
                _round(tiles * self.splits.value * cfg.block_m * cfg.block_n * 4),
                _round(tiles * cfg.num_consumers * 8),
            )
        return split_k + tuple(_round(nbytes) for nbytes in self.staged_bytes)

    def _launch(self) -> None:
        err = driver.cuLaunchKernelEx(self.config, self.kernel.function, self.address, 0)[0]
        if err != driver.CUresult.CUDA_SUCCESS:
            runtime.check((err,), f"cuLaunchKernelEx({self.kernel.name}, grid={self.grid})")
