"""The lean path of gemm on the CPU (issue 18, item 3): a problem seen before, called with new
arrays, reuses its launch and patches only the addresses; whatever the address checks do not
clear goes through the general path, which decides (and raises) as before.

The arrays are fakes of a lean-path library (`FakeLib`, registered like CuPy and torch); the
driver is replaced: tensor maps are 128 bytes whose first word is the address, the launch is
recorded with the addresses its maps hold when it is queued."""

import contextlib
import ctypes
import threading
import warnings

import numpy as np
import pytest
from cuda.bindings import driver

import jitgemm
from jitgemm import api, context, decode, kernels, launch, registry, runtime, staging
from jitgemm.arrays import View, libraries
from jitgemm.arrays.views import ITEMSIZE, checked_view
from jitgemm.heuristics import DeviceSpec

OK = driver.CUresult.CUDA_SUCCESS
STREAM = 7
CTX = 1234


class FakeTensor:
    _next = 1 << 32

    def __init__(self, shape, dtype="bf16", strides=None, ptr=None, device=0):
        if strides is None:
            strides = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
        if ptr is None:
            ptr = FakeTensor._next
            FakeTensor._next += -(-max(int(np.prod(shape)), 1) * ITEMSIZE[dtype] // 4096) * 4096 + 4096
        self.shape, self.strides, self.dtype, self.ptr, self.device = tuple(shape), tuple(strides), dtype, ptr, device

    def window(self, offset, shape, strides):
        return FakeTensor(shape, self.dtype, strides, self.ptr + offset * ITEMSIZE[self.dtype], self.device)


class FakeLib(libraries.ArrayLib):
    name = "fake"
    fast = True

    def __init__(self):
        self.ops = []

    def view(self, array, argname):
        view = View(
            array, self, array.ptr, array.shape, array.strides, array.dtype, ITEMSIZE[array.dtype], array.device
        )
        return checked_view(view, argname)

    def parts(self, array):
        return (array.__class__, array.shape, array.strides, array.dtype, array.device), array.ptr

    def data_ptr(self, array):
        return array.ptr

    def device_of(self, array):
        return array.device

    def current_stream(self, device):
        return STREAM

    def stream_scope(self, handle, device):
        return contextlib.nullcontext()

    def empty(self, shape, dtype, device, stream):
        self.ops.append(("empty", tuple(shape)))
        return FakeTensor(shape, dtype, device=device)

    zeros = empty

    def window(self, array, rows, cols, transpose, argname):
        shape, strides = ((cols, rows), array.strides[::-1]) if transpose else ((rows, cols), array.strides)
        return self.view(FakeTensor(shape, array.dtype, strides, array.ptr, array.device), argname)

    def copy_(self, dst, src, stream):
        self.ops.append(("copy", dst.ptr, src.ptr))


class Driver:
    """The driver calls of a launch, faked: maps, address replacement, the launch itself."""

    def __init__(self, monkeypatch, address_word=0):
        self.address_word = address_word  # where the fake driver keeps a map's address
        self.maps = []  # keeps the fake descriptors alive
        self.launches = []  # (launch, addresses its maps hold) when queued
        self.replaced = 0
        monkeypatch.setattr(runtime, "tensor_map_2d", self.tensor_map_2d)
        monkeypatch.setattr(driver, "cuTensorMapReplaceAddress", self.replace_address)
        monkeypatch.setattr(driver, "cuCtxGetCurrent", lambda: (OK, CTX))
        monkeypatch.setattr(launch.KernelLaunch, "_launch", lambda call: self.launch(call))

    def tensor_map_2d(self, dtype, ptr, inner, outer, stride, box, swizzle):
        assert ptr % 16 == 0 and stride % 16 == 0
        tmap = driver.CUtensorMap()
        words = (ctypes.c_uint64 * 16).from_address(tmap.getPtr())
        words[:] = [inner, outer, stride, box[0], box[1], swizzle] + [0xABC] * 10
        words[self.address_word] = ptr
        self.maps.append(tmap)
        return tmap

    def replace_address(self, tmap, address):
        self.replaced += 1
        (ctypes.c_uint64 * 16).from_address(tmap.getPtr())[self.address_word] = address
        return (OK,)

    def launch(self, call):
        words = [(ctypes.c_uint64 * 16).from_address(int(t.getPtr())) for t in call.maps]
        self.launches.append((call, [w[self.address_word] for w in words]))


class FakeWorkspace:
    """A stream's workspace at a fixed address, its regions as launch.py lays them out."""

    BASE = 1 << 44

    def __init__(self):
        self.lock = threading.Lock()

    def ensure(self, sizes, stream):
        return launch._region_pointers(self.BASE, tuple(launch._round(size) for size in sizes))


def _decoded(call, regions) -> tuple:
    args = call.args
    return args.a, args.b, args.out, args.c, *regions[:2]


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("JITGEMM_TUNED", "0")
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    lib = FakeLib()
    monkeypatch.setitem(libraries._LIBS_BY_TYPE, FakeTensor, lib)
    monkeypatch.setattr(api, "device_spec", lambda ordinal: DeviceSpec("sm_90a", 132))
    monkeypatch.setattr(api.context, "on_device", lambda ordinal: contextlib.nullcontext())
    monkeypatch.setattr(context, "primary", lambda ordinal: driver.CUcontext(CTX))
    monkeypatch.setattr(launch, "stream_is_capturing", lambda stream: False)
    monkeypatch.setattr(kernels, "is_loaded", lambda cfg, ordinal: True)

    def get(cfg, ordinal, problem=None):
        kernel = runtime.LoadedKernel(None, None, "fake_kernel", 1024, 384, cfg.cluster_size, True)
        return kernel, registry.get(cfg.arch).layout_of(cfg)

    monkeypatch.setattr(kernels, "get", get)
    stage_kernel = runtime.LoadedKernel(None, None, "fake_stage", 0, 256, 1, True)
    monkeypatch.setattr(staging.KERNEL, "get", lambda arch, ordinal: stage_kernel)
    monkeypatch.setattr(staging.KERNEL, "is_loaded", lambda arch, ordinal: True)
    decode_kernel = runtime.LoadedKernel(None, None, "fake_decode", 0, 256, 1, True)
    for decoder in decode.DECODERS:
        monkeypatch.setattr(decoder.kernel, "get", lambda arch, ordinal: decode_kernel)
        monkeypatch.setattr(decoder.kernel, "is_loaded", lambda arch, ordinal: True)
    lib.decodes = []  # (a, b, out, c, partials, counters) of each decode launch
    monkeypatch.setattr(
        decode.DecodeLaunch, "_launch_with", lambda call, regions: lib.decodes.append(_decoded(call, regions))
    )
    lib.stages = []  # (src_a, dst_a, src_b, dst_b) of each staging launch
    monkeypatch.setattr(staging.StageLaunch, "launch", lambda self, *addresses: lib.stages.append(addresses))
    workspace = FakeWorkspace()
    monkeypatch.setattr(launch, "_workspace", lambda device, stream: workspace)
    monkeypatch.setattr(api, "_plans", {})
    general = []
    real = api._gemm
    monkeypatch.setattr(api, "_gemm", lambda *args: (general.append(args), real(*args))[1])
    lib.general = general
    lib.driver = Driver(monkeypatch)
    return lib


M, N, K = 96, 64, 128


def at_roles(call, *operands) -> list:
    """The addresses `call`'s tensor maps should hold: each map's operand (a, b, d[, c]), the
    edge maps (the last block of a K-major operand) included."""
    return [operands[role] for role in call.roles]


def test_new_arrays_of_a_seen_problem_patch_only_the_addresses(fake):
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    first = jitgemm.gemm(a, b)
    assert len(fake.general) == 1 and len(fake.driver.launches) == 1
    call, addresses = fake.driver.launches[0]
    # a, b, d and the edge map of A (a box of the rows of its last block inside M)
    assert call.roles == (0, 1, 2, 0)
    assert addresses == [a.ptr, b.ptr, first.ptr, a.ptr]
    for _ in range(3):
        a2, b2 = FakeTensor((M, K)), FakeTensor((K, N))
        res = jitgemm.gemm(a2, b2)
        assert res.shape == (M, N) and res.dtype == "bf16"
        again, addresses = fake.driver.launches[-1]
        assert again is call  # the same launch: kernel, grid, parameters
        assert addresses == [a2.ptr, b2.ptr, res.ptr, a2.ptr]
    assert len(fake.general) == 1
    assert call.direct is True and fake.driver.replaced == 8  # asked once, at the first launch: 2 addresses x 4 maps


def test_only_the_addresses_change(fake):
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    jitgemm.gemm(a, b)
    call = fake.driver.launches[0][0]
    before = bytes(call.words)
    params = bytes(call.params)
    jitgemm.gemm(FakeTensor((M, K)), FakeTensor((K, N)))
    after = bytes(call.words)
    changed = {i // 8 for i in range(len(before)) if before[i] != after[i]}
    assert changed <= {0, 16, 32, 48}  # the first word of each map
    assert bytes(call.params) == params


def test_the_driver_call_patches_when_the_address_is_not_the_first_word(fake, monkeypatch):
    fake.driver = Driver(monkeypatch, address_word=3)
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    jitgemm.gemm(a, b)
    a2, b2 = FakeTensor((M, K)), FakeTensor((K, N))
    res = jitgemm.gemm(a2, b2)
    call, addresses = fake.driver.launches[-1]
    assert call.direct is False
    assert addresses == at_roles(call, a2.ptr, b2.ptr, res.ptr)
    assert len(fake.general) == 1


def test_addresses_are_patched_in_the_devices_context(fake, monkeypatch):
    """From a thread where another context is current, the driver patches the descriptors (and
    the kernel is launched) with the device's primary context pushed."""
    fake.driver = Driver(monkeypatch, address_word=3)  # the driver call patches
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    jitgemm.gemm(a, b)
    stack = [999]  # another context is current
    monkeypatch.setattr(driver, "cuCtxGetCurrent", lambda: (OK, stack[-1]))
    monkeypatch.setattr(driver, "cuCtxPushCurrent", lambda ctx: (stack.append(int(ctx)), (OK,))[1])
    monkeypatch.setattr(driver, "cuCtxPopCurrent", lambda: (OK, stack.pop()))
    seen = []
    replace = fake.driver.replace_address
    monkeypatch.setattr(driver, "cuTensorMapReplaceAddress", lambda t, p: (seen.append(stack[-1]), replace(t, p))[1])
    x = FakeTensor((M, K))
    res = jitgemm.gemm(x, b)
    assert seen == [CTX] * len(fake.driver.launches[-1][0].roles) and stack == [999]
    assert fake.driver.launches[-1][1] == at_roles(fake.driver.launches[-1][0], x.ptr, b.ptr, res.ptr)


@pytest.mark.parametrize("cfg", [dict(b_tail=True, block_n=160, b_major="N"), dict()])
def test_map_operands_match_tensor_maps(cfg, monkeypatch):
    """Each arch's map_operands names the operand of each map tensor_maps builds, in order."""
    from jitgemm.config import KernelConfig
    from jitgemm.problem import Problem

    seen = []
    monkeypatch.setattr(runtime, "tensor_map_2d", lambda dtype, ptr, *rest: seen.append(ptr))
    for arch_name in registry.ARCH_NAMES:
        arch = registry.get(arch_name)
        if arch_name == "sm_90a":
            config = KernelConfig(arch=arch_name, **cfg)
        else:
            config = KernelConfig(arch=arch_name, num_consumers=1)
        lay = arch.layout_of(config)
        for has_c in (False, True):
            problem = Problem(256, 320, 512, "bf16", "bf16", "K", "N", has_c)
            views = [FakeLib().view(FakeTensor(shape), "x") for shape in ((256, 512), (512, 320), (256, 320))]
            views.append(FakeLib().view(FakeTensor((256, 320)), "c") if has_c else None)
            seen.clear()
            arch.tensor_maps(problem, lay, *views)
            roles = arch.map_operands(lay, has_c)
            assert seen == [views[r].ptr for r in roles], (arch_name, cfg, has_c)


def test_out_given_and_out_is_c(fake):
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    out = FakeTensor((M, N), "fp32")
    jitgemm.gemm(a, b, out)
    out2, a2 = FakeTensor((M, N), "fp32"), FakeTensor((M, K))
    assert jitgemm.gemm(a2, b, out2) is out2
    assert fake.driver.launches[-1][1] == at_roles(fake.driver.launches[-1][0], a2.ptr, b.ptr, out2.ptr)
    assert len(fake.general) == 1
    # out = c: d and c maps both at c
    c = FakeTensor((M, N))
    jitgemm.gemm(a, b, c, c=c, beta=0.5)
    c2 = FakeTensor((M, N))
    assert jitgemm.gemm(a2, b, c2, c=c2, beta=0.5) is c2
    assert fake.driver.launches[-1][1] == at_roles(fake.driver.launches[-1][0], a2.ptr, b.ptr, c2.ptr, c2.ptr)
    assert len(fake.general) == 2
    # c apart from out
    c3, o3 = FakeTensor((M, N)), FakeTensor((M, N))
    jitgemm.gemm(a, b, o3, c=c3, beta=0.5)
    c4, o4 = FakeTensor((M, N)), FakeTensor((M, N))
    jitgemm.gemm(a, b, o4, c=c4, beta=0.5)
    assert fake.driver.launches[-1][1] == at_roles(fake.driver.launches[-1][0], a.ptr, b.ptr, o4.ptr, c4.ptr)
    assert len(fake.general) == 3


def test_overlaps_are_still_refused_after_a_plan(fake):
    buf = FakeTensor((M, K + N))
    left, b = buf.window(0, (M, K), (K + N, 1)), FakeTensor((K, N))
    jitgemm.gemm(left, b, FakeTensor((M, N), strides=(K + N, 1)))  # the plan: out with a's row stride
    calls = len(fake.general)
    with pytest.raises(ValueError, match="^out: overlaps a"):
        jitgemm.gemm(left, b, buf.window(K - 8, (M, N), (K + N, 1)))
    # interleaved with a, yet disjoint: the address ranges meet, and the general path's exact
    # test allows it
    jitgemm.gemm(left, b, buf.window(K, (M, N), (K + N, 1)))
    assert len(fake.general) == calls + 2
    assert fake.driver.launches[-1][1] == at_roles(fake.driver.launches[-1][0], left.ptr, b.ptr, buf.ptr + 2 * K)
    square = FakeTensor((K, K))
    jitgemm.gemm(FakeTensor((M, K)), square, FakeTensor((M, K)))
    with pytest.raises(ValueError, match="^out: overlaps b"):
        jitgemm.gemm(FakeTensor((M, K)), square, square.window(0, (M, K), (K, 1)))


def test_partial_overlap_of_out_and_c_after_a_plan(fake):
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    buf = FakeTensor((M, N + 8))
    jitgemm.gemm(a, b, FakeTensor((M, N), strides=(N + 8, 1)), c=FakeTensor((M, N), strides=(N + 8, 1)))
    with pytest.raises(ValueError, match="^out: partially overlaps c"):
        jitgemm.gemm(a, b, buf.window(8, (M, N), (N + 8, 1)), c=buf.window(0, (M, N), (N + 8, 1)))


def test_misaligned_operands_are_staged_and_keep_a_plan(fake):
    """An operand TMA cannot read in place is staged by the copy kernel into the workspace (no
    library copy, no allocation); the GEMM's map reads the workspace, and new arrays of the
    same misalignment take the lean path, which patches the staging launch's source."""
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    jitgemm.gemm(a, b)
    shifted = FakeTensor((M, K), ptr=FakeTensor((M, K + 8)).ptr + 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jitgemm.gemm(shifted, b)
    assert len(fake.general) == 2
    assert not [op for op in fake.ops if op[0] in ("copy", "empty") and op[1] != (M, N)]
    assert any(issubclass(w.category, jitgemm.FallbackCopyWarning) for w in caught) or "a" in api._warned
    staged_a = launch._region_pointers(FakeWorkspace.BASE, (0, 0, 0, 0))[2]
    assert fake.stages[-1] == (shifted.ptr, staged_a, 0, FakeWorkspace.BASE + launch._round(M * K * 2))
    _, addresses = fake.driver.launches[-1]
    assert addresses[:2] == [staged_a, b.ptr]
    again = FakeTensor((M, K), ptr=FakeTensor((M, K + 8)).ptr + 24)
    jitgemm.gemm(again, b)
    assert len(fake.general) == 2 and fake.stages[-1][0] == again.ptr
    assert fake.driver.launches[-1][1][:2] == [staged_a, b.ptr]
    # the plan of aligned arrays is still there
    jitgemm.gemm(FakeTensor((M, K)), b)
    assert len(fake.general) == 2 and len(fake.stages) == 2


def test_operands_are_copied_by_their_library_where_the_staging_kernel_cannot_be_had(fake, monkeypatch):
    """Under JITGEMM_OFFLINE=1 without the staging kernel in the cache, a misaligned operand is
    copied as before staging, and such calls keep no plan."""

    def offline(arch, ordinal):
        raise kernels.OfflineError("not in the cache")

    monkeypatch.setattr(staging.KERNEL, "get", offline)
    b = FakeTensor((K, N))
    for offset in (8, 24):
        shifted = FakeTensor((M, K), ptr=FakeTensor((M, K + 8)).ptr + offset)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jitgemm.gemm(shifted, b)
        assert any(op[0] == "copy" and op[2] == shifted.ptr for op in fake.ops)
    assert len(fake.general) == 2 and not fake.stages


@pytest.mark.parametrize("bad, exc", [(dict(alpha=True), TypeError), (dict(beta=True), TypeError)])
def test_scalars_that_compare_equal_are_still_checked(fake, bad, exc):
    a, b, c = FakeTensor((M, K)), FakeTensor((K, N)), FakeTensor((M, N))
    jitgemm.gemm(a, b, c=c)  # alpha = beta = 1.0
    with pytest.raises(exc):
        jitgemm.gemm(a, b, c=c, **bad)


def test_the_key_covers_everything_but_the_addresses(fake):
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    jitgemm.gemm(a, b)
    for other in (
        dict(a=FakeTensor((M + 1, K))),
        dict(b=FakeTensor((K, N), strides=(1, K))),
        dict(a=FakeTensor((M, K), device=1), b=FakeTensor((K, N), device=1)),
        dict(alpha=2.0),
        dict(out_dtype="float32"),
        dict(stream=99),
    ):
        args = dict(a=FakeTensor((M, K)), b=FakeTensor((K, N)))
        args.update(other)
        before = len(fake.general)
        jitgemm.gemm(args.pop("a"), args.pop("b"), **args)
        assert len(fake.general) == before + 1, other


def test_plans_are_bounded_oldest_first(fake, monkeypatch):
    monkeypatch.setattr(api, "PLAN_CACHE_SIZE", 3)
    b = FakeTensor((K, N))
    for m in (16, 32, 48, 64):
        jitgemm.gemm(FakeTensor((m, K)), b)
    assert [key[0][1] for key in api._plans] == [(32, K), (48, K), (64, K)]
    jitgemm.gemm(FakeTensor((64, K)), b)
    assert len(fake.general) == 4


def test_threads_sharing_a_plan_launch_their_own_addresses(fake):
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    jitgemm.gemm(a, b)
    expected, errors = [], []
    barrier = threading.Barrier(4)

    def work():
        try:
            barrier.wait()
            for _ in range(200):
                x, y = FakeTensor((M, K)), FakeTensor((K, N))
                res = jitgemm.gemm(x, y)
                expected.append(at_roles(fake.driver.launches[0][0], x.ptr, y.ptr, res.ptr))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    launched = sorted(addresses for _, addresses in fake.driver.launches[1:])
    assert launched == sorted(expected)


# ---- N-D through the lean path's plans (fake arrays, fake driver) -------------------------
def test_nd_a_gets_plans_too(fake):
    b = FakeTensor((64, 48))
    first = jitgemm.gemm(FakeTensor((2, 40, 64)), b)
    assert first.shape == (2, 40, 48)
    x = FakeTensor((2, 40, 64))
    res = jitgemm.gemm(x, b)
    assert res.shape == (2, 40, 48) and len(fake.general) == 1
    assert fake.driver.launches[-1][1] == at_roles(fake.driver.launches[-1][0], x.ptr, b.ptr, res.ptr)
    out, x = FakeTensor((2, 40, 48), "fp32"), FakeTensor((2, 40, 64))
    jitgemm.gemm(FakeTensor((2, 40, 64)), b, FakeTensor((2, 40, 48), "fp32"))
    assert jitgemm.gemm(x, b, out) is out and len(fake.general) == 2
    assert fake.driver.launches[-1][1] == at_roles(fake.driver.launches[-1][0], x.ptr, b.ptr, out.ptr)


def test_nd_a_that_does_not_fold_is_copied(fake):
    x = FakeTensor((2, 40, 64), strides=(64, 128, 1))  # x.transpose(0, 1) of a contiguous (40, 2, 64)
    b = FakeTensor((64, 48))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        api._warned.discard("a")
        res = jitgemm.gemm(x, b)
    assert res.shape == (2, 40, 48)
    (copy,) = [op for op in fake.ops if op[0] == "copy"]
    assert copy[2] == x.ptr
    assert fake.driver.launches[-1][1][0] == copy[1]  # the kernel reads the copy
    assert any("do not fold" in str(w.message) for w in caught)
    assert not api._plans  # copies: no plan


@pytest.mark.parametrize("where", ["offline", "capture"])
def test_a_misaligned_out_met_where_its_kernel_cannot_be_had_goes_through_a_copy(fake, monkeypatch, where):
    """An out view TMA cannot store to needs the out_direct kernel; offline (not in the disk
    cache) or first met inside a graph capture (not loaded), the call runs the TMA-epilogue twin
    through an aligned buffer, copied into out, as before out_direct."""
    if where == "offline":
        fake_get = kernels.get

        def get(cfg, ordinal, problem=None):
            if cfg.out_direct:
                raise kernels.OfflineError(f"{cfg.name} is not in the disk cache")
            return fake_get(cfg, ordinal, problem)

        monkeypatch.setattr(kernels, "get", get)
    else:
        monkeypatch.setattr(launch, "stream_is_capturing", lambda stream: True)
        monkeypatch.setattr(kernels, "is_loaded", lambda cfg, ordinal: not cfg.out_direct)
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    out = FakeTensor((M, N + 8)).window(1, (M, N), (N + 8, 1))  # 2 bytes past a 16-byte boundary
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitgemm.FallbackCopyWarning)
        assert jitgemm.gemm(a, b, out) is out
    call = fake.driver.launches[-1][0]
    assert not call.cfg.out_direct
    assert any(op[0] == "copy" and op[1] == out.ptr for op in fake.ops)  # the result copied into out


def test_an_out_that_is_not_element_aligned_is_copied(fake):
    """st.global of 2-byte runs at an odd address would fault: such an out goes through an
    aligned buffer, copied into it."""
    a, b = FakeTensor((M, K)), FakeTensor((K, N))
    out = FakeTensor((M, N), strides=(N + 8, 1), ptr=FakeTensor((M, N + 8)).ptr + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitgemm.FallbackCopyWarning)
        assert jitgemm.gemm(a, b, out) is out
    assert any(op[0] == "copy" and op[1] == out.ptr for op in fake.ops)


def test_a_decode_seen_before_patches_only_the_addresses(fake):
    """M = 1 against a b of odd N (decode.py): the decode launch is packed once; new arrays
    reach it through the plan, their addresses element-aligned only."""
    k, n = 64, 45
    a, b = FakeTensor((1, k)), FakeTensor((k, n))
    first = jitgemm.gemm(a, b)
    assert first.shape == (1, n) and len(fake.general) == 1 and not fake.driver.launches and not fake.stages
    call = next(p.call for p in api._plans.values())
    sums = decode.ROWS.split_for(n, k, 132)
    assert call.workspace_sizes[:2] == (sums.strips * sums.groups * decode.ROWS.strip * 4, sums.strips * 4)
    counters = FakeWorkspace.BASE + launch._round(call.workspace_sizes[0])
    assert fake.decodes[-1] == (a.ptr, b.ptr, first.ptr, 0, FakeWorkspace.BASE, counters)
    assert (call.args.m, call.args.n, call.args.k, call.args.b_row) == (1, n, k, n)
    a2, b2 = FakeTensor((1, k)), FakeTensor((k, n))  # new arrays: the plan serves them
    second = jitgemm.gemm(a2, b2)
    assert len(fake.general) == 1 and fake.decodes[-1][:4] == (a2.ptr, b2.ptr, second.ptr, 0)
    # b 2 bytes into a unit (another plan: not every address is 16-byte aligned), then again
    for offset in (2, 6):
        b3 = FakeTensor((k, n), ptr=FakeTensor((k, n + 8)).ptr + offset)
        third = jitgemm.gemm(a2, b3)
        assert len(fake.general) == 2 and fake.decodes[-1][:4] == (a2.ptr, b3.ptr, third.ptr, 0)


def test_a_k_major_decode_runs_the_cols_kernel_at_up_to_sixteen_rows(fake):
    """M = 16 against W.t() of odd K (b's columns along K, decode.py's COLS): packed with the
    stride of W's rows and partials for two n8 products; 17 rows run the staged GEMM."""
    k, n = 63, 45
    w = FakeTensor((n, k))
    b = w.window(0, (k, n), (1, k))  # W.t()
    a = FakeTensor((16, k))
    got = jitgemm.gemm(a, b)
    assert got.shape == (16, n) and not fake.driver.launches and not fake.stages
    call = next(p.call for p in api._plans.values())
    assert isinstance(call, decode.DecodeLaunch)
    assert (call.args.m, call.args.n, call.args.k, call.args.b_row) == (16, n, k, k)
    sums = decode.COLS.split_for(n, k, 132)
    assert call.workspace_sizes[:2] == (sums.strips * sums.groups * 16 * decode.COLS.strip * 4, sums.strips * 4)
    assert fake.decodes[-1][:4] == (a.ptr, b.ptr, got.ptr, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitgemm.FallbackCopyWarning)
        jitgemm.gemm(FakeTensor((17, k)), b)
    assert len(fake.decodes) == 1 and fake.stages  # the GEMM, b staged
