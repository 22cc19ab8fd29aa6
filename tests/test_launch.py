"""CPU tests of launch geometry: work units per K split and the split count."""

from jitgemm import registry
from jitgemm.config import KernelConfig
from jitgemm.geometry import num_splits

cluster_tiles = registry.get("sm_90a").cluster_tiles


def test_cluster_tiles_pair_up_along_the_multicast_side():
    plain = KernelConfig(block_m=128, block_n=128)
    assert cluster_tiles(plain, 1000, 1000) == 8 * 8
    pair_n = KernelConfig(block_m=128, block_n=128, cluster_size=2, multicast="A")
    assert cluster_tiles(pair_n, 1000, 5 * 128) == 8 * 3  # 5 column blocks -> 3 pairs
    pair_m = KernelConfig(block_m=128, block_n=128, cluster_size=2, multicast="B")
    assert cluster_tiles(pair_m, 3 * 128, 256) == 2 * 2  # 3 row blocks -> 2 pairs


def test_num_splits_never_leaves_a_split_empty():
    cfg = KernelConfig(split_k=8)
    assert num_splits(cfg, 4096) == 8
    assert num_splits(cfg, 200) == 4  # 4 K blocks of 64
    assert num_splits(cfg, 1) == 1
    assert num_splits(KernelConfig(), 4096) == 1


def _kernel(waits: bool):
    from jitgemm.runtime import LoadedKernel

    return LoadedKernel(
        module=None,
        function=None,
        name=f"k{waits}",
        smem_bytes=1024,
        num_threads=384,
        cluster_size=2,
        waits_for_previous_grid=waits,
    )


def _attribute_ids(cfg):
    return [cfg.attrs[i].id for i in range(cfg.numAttrs)]


def test_programmatic_launch_only_for_kernels_that_wait(monkeypatch):
    from cuda.bindings import driver

    from jitgemm import runtime

    ids = driver.CUlaunchAttributeID
    monkeypatch.delenv(runtime.ENV_PDL, raising=False)
    waiting = runtime.launch_config(_kernel(True), 132, 0)
    assert _attribute_ids(waiting) == [
        ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
    ]
    assert waiting.attrs[1].value.programmaticStreamSerializationAllowed == 1
    assert waiting.attrs[0].value.clusterDim.x == 2
    # A kernel without griddepcontrol.wait could read its inputs before the previous kernel wrote them.
    assert _attribute_ids(runtime.launch_config(_kernel(False), 132, 0)) == [ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION]
    monkeypatch.setenv(runtime.ENV_PDL, "0")
    assert _attribute_ids(runtime.launch_config(_kernel(True), 132, 0)) == [ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION]


def test_only_templates_that_wait_are_launched_programmatically():
    from jitgemm.render import render

    for name in registry.ARCH_NAMES:
        source = render(KernelConfig(arch=name, num_consumers=1))
        assert ("griddepcontrol.wait" in source) == registry.get(name).waits_for_previous_grid, name


def test_graph_workspace_semaphore_sees_the_cuda_callback():
    """CUDA calls libc's sem_post (as a CUhostFn) when a graph holding split-K buffers is gone."""
    import ctypes

    from jitgemm.launch import _Semaphore

    sem = _Semaphore.create()
    assert sem is not None
    assert not sem.try_wait_and_free()  # not posted yet: buffers stay
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_Semaphore.post_address())
    callback(sem.address)  # what the user object's destructor does
    assert sem.try_wait_and_free()


def test_graph_workspaces_free_only_released_buffers_of_the_current_device(monkeypatch):
    """The buffers of a destroyed graph are freed at the next capture on their device; those
    of live graphs, and of other devices (another context), stay."""
    import ctypes

    from cuda.bindings import driver

    from jitgemm import launch

    ok = driver.CUresult.CUDA_SUCCESS
    freed, modes = [], []
    monkeypatch.setattr(driver, "cuMemFreeAsync", lambda ptr, stream: (freed.append(ptr), (ok,))[1])
    monkeypatch.setattr(driver, "cuThreadExchangeStreamCaptureMode", lambda mode: (modes.append(mode), (ok, mode))[1])
    post = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(launch._Semaphore.post_address())
    ws = launch._GraphWorkspaces()
    ws.private_streams = {0: 11, 1: 12}
    graphs = {"gone on 0": (0, 1, 5), "alive on 0": (0, 2, 5), "gone on 1": (1, 3, 5)}
    for name, key in graphs.items():
        sem = launch._Semaphore.create()
        ws.tied.append((sem, key))
        ws.live[key] = [(1000 + key[1], (256, 256, 0, 0)), (2000 + key[1], (512, 256, 0, 0))]
        if name.startswith("gone"):
            post(sem.address)  # CUDA's destructor callback
    ws._free_released(0)
    assert sorted(freed) == [1001, 2001]
    assert set(ws.live) == {graphs["alive on 0"], graphs["gone on 1"]}
    assert [key for _, key in ws.tied] == [graphs["alive on 0"], graphs["gone on 1"]]
    assert len(modes) == 2  # relaxed capture mode set, then restored
    ws._free_released(1)
    assert sorted(freed) == [1001, 1003, 2001, 2003]


def test_stream_workspace_grows_only_and_answers_sizes_that_fit_without_the_driver(monkeypatch):
    """An eager stream's workspace: a larger size reallocates (the old buffer freed on the
    stream, the counters zeroed) by half again at least; sizes that fitted once are answered
    from the regions at hand, also after a later growth, without a driver call."""
    from cuda.bindings import driver

    from jitgemm import launch

    ok = driver.CUresult.CUDA_SUCCESS
    calls = []
    pointers = iter((1 << 20, 2 << 20, 3 << 20))
    monkeypatch.setattr(driver, "cuMemAllocAsync", lambda n, s: (calls.append(("alloc", n)), (ok, next(pointers)))[1])
    monkeypatch.setattr(driver, "cuMemFreeAsync", lambda p, s: (calls.append(("free", p)), (ok,))[1])
    monkeypatch.setattr(driver, "cuMemsetD32Async", lambda p, v, n, s: (calls.append(("zero", p, n)), (ok,))[1])
    ws = launch._Workspace()
    small, staged = (1000, 64, 0, 0), (0, 0, 4096, 0)
    first = ws.ensure(small, 0)
    assert first == (1 << 20, (1 << 20) + 1024, (1 << 20) + 1280, (1 << 20) + 1280)
    assert calls == [("alloc", 1280), ("zero", (1 << 20) + 1024, 64)]
    calls.clear()
    assert ws.ensure(small, 0) == first and calls == []  # fits: no driver call
    grown = ws.ensure(staged, 0)
    assert ws.sizes == (1024, 256, 4096, 0) and grown[0] == 2 << 20
    assert calls == [("free", 1 << 20), ("alloc", 1024 + 256 + 4096), ("zero", (2 << 20) + 1024, 64)]
    calls.clear()
    assert ws.ensure(small, 0) == grown and ws.ensure(staged, 0) == grown and calls == []
    bigger = ws.ensure((2000, 0, 0, 0), 0)  # partials past 1024: 1.5x the old size at least
    assert ws.sizes == (2048, 256, 4096, 0) and bigger[0] == 3 << 20
