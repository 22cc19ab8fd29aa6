"""CUDA driver plumbing through cuda-python: devices, module load, TMA descriptors, launch configs."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import NamedTuple

from cuda.bindings import driver

from . import envflags, registry


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


class NoGPUError(CudaError):
    """No usable NVIDIA GPU: the CUDA driver library could not be loaded, or it found no device
    (or is too old). Raised by the first call that needs the GPU, after its arguments are checked."""


DRIVER_REQUIREMENT = "jitgemm needs an NVIDIA GPU and driver (R580+ for CUDA 13)"
# cuInit results that mean "no usable GPU here" rather than a failure of jitgemm's own calls.
_NO_GPU_RESULTS = {
    getattr(driver.CUresult, name)
    for name in (
        "CUDA_ERROR_NO_DEVICE",
        "CUDA_ERROR_STUB_LIBRARY",
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
        "CUDA_ERROR_DEVICE_UNAVAILABLE",
    )
    if hasattr(driver.CUresult, name)
}


def check(result, what: str):
    """Unpack a cuda-python (err, *values) tuple, raising CudaError on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        raise CudaError(f"{what} failed: {_text(name)} ({_text(text)})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@functools.lru_cache(maxsize=1)
def init_driver() -> None:
    """Load and initialise the CUDA driver (once; a failure is raised again on the next call).
    Raises NoGPUError when there is no driver library or no device."""
    try:
        result = driver.cuInit(0)
    except (RuntimeError, OSError) as exc:  # cuda.pathfinder's DynamicLibNotFoundError, a failed dlopen
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise NoGPUError(f"{DRIVER_REQUIREMENT}: the CUDA driver library could not be loaded ({detail})") from exc
    err = result[0] if isinstance(result, tuple) else result
    if err in _NO_GPU_RESULTS:
        raise NoGPUError(f"{DRIVER_REQUIREMENT}: cuInit found no usable GPU: {getattr(err, 'name', err)}")
    check(result, "cuInit")


def device_count() -> int:
    try:
        init_driver()
        return check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    except (CudaError, RuntimeError, OSError):
        return 0


class DeviceInfo(NamedTuple):
    ordinal: int
    name: str
    compute_capability: tuple
    num_sms: int
    smem_per_block_optin: int

    @property
    def arch(self) -> str | None:
        """The kernel target for this device (sm_90a, sm_100a), or None where jitgemm has none."""
        return registry.name_of(self.compute_capability)


@functools.cache
def device_info(ordinal: int) -> DeviceInfo:
    init_driver()
    dev = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    attr = driver.CUdevice_attribute

    def get(a):
        return check(driver.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a.name})")

    # The driver fills the whole buffer: the name ends at the first NUL.
    name = _text(check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")).split("\x00", 1)[0].strip()
    return DeviceInfo(
        ordinal=ordinal,
        name=name,
        compute_capability=(
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        ),
        num_sms=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        smem_per_block_optin=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
    )


class LoadedKernel(NamedTuple):
    module: object
    function: object
    name: str
    smem_bytes: int
    num_threads: int
    cluster_size: int
    waits_for_previous_grid: bool = False  # the kernel calls griddepcontrol.wait (see launch_config)


def load_kernel(
    cubin: bytes, name: str, smem_bytes: int, num_threads: int, cluster_size: int, waits_for_previous_grid: bool = False
) -> LoadedKernel:
    """Load a cubin into the current context and prepare its kernel for launch."""
    module = check(driver.cuModuleLoadData(cubin), f"cuModuleLoadData({name})")
    function = check(driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
    check(
        driver.cuFuncSetAttribute(
            function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes
        ),
        f"setting {smem_bytes} bytes of dynamic shared memory for {name}",
    )
    return LoadedKernel(module, function, name, smem_bytes, num_threads, cluster_size, waits_for_previous_grid)


# ---- TMA descriptors ----
_TMA_DTYPES = {
    "bf16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    "fp16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    "fp32": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
}
_SWIZZLES = {
    0: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
    32: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
    64: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
    128: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
}
_tensor_maps: OrderedDict = OrderedDict()
_tensor_maps_lock = threading.Lock()
TENSOR_MAP_CACHE_SIZE = 4096


def tensor_map_2d(dtype: str, ptr: int, inner: int, outer: int, outer_stride_bytes: int, box: tuple, swizzle: int):
    """A 2-D tiled TMA descriptor (reused across calls with the same pointer and geometry)."""
    # TMA's limits, checked here rather than left to the driver's error or a wrapped integer
    if not (1 <= inner <= 1 << 32 and 1 <= outer <= 1 << 32):
        raise ValueError(f"tensor map dims ({inner}, {outer}) must be in [1, 2^32]")
    if not (0 < outer_stride_bytes < 1 << 40 and outer_stride_bytes % 16 == 0) or not 0 <= ptr < 1 << 64 or ptr % 16:
        raise ValueError(
            f"tensor map stride {outer_stride_bytes} must be a multiple of 16 below 2^40 and "
            f"address {ptr:#x} 16-byte aligned"
        )
    key = (dtype, ptr, inner, outer, outer_stride_bytes, box, swizzle)
    with _tensor_maps_lock:
        found = _tensor_maps.get(key)
        if found is not None:
            _tensor_maps.move_to_end(key)
            return found
    tmap = check(
        driver.cuTensorMapEncodeTiled(
            _TMA_DTYPES[dtype],
            2,
            ptr,
            [driver.cuuint64_t(inner), driver.cuuint64_t(outer)],
            [driver.cuuint64_t(outer_stride_bytes)],
            [driver.cuuint32_t(box[0]), driver.cuuint32_t(box[1])],
            [driver.cuuint32_t(1), driver.cuuint32_t(1)],
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            _SWIZZLES[swizzle],
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ),
        f"cuTensorMapEncodeTiled(dims=({inner}, {outer}), stride={outer_stride_bytes}, box={box})",
    )
    with _tensor_maps_lock:
        _tensor_maps[key] = tmap
        if len(_tensor_maps) > TENSOR_MAP_CACHE_SIZE:
            _tensor_maps.popitem(last=False)
    return tmap


_launch_configs: dict = {}
ENV_PDL = "JITGEMM_PDL"


def programmatic_launch(kernel: LoadedKernel) -> bool:
    """Launch with programmatic dependent launch (PDL): the kernel may start while the previous
    kernel of the stream finishes, and waits in-kernel (griddepcontrol.wait) before it touches
    global memory. Only for kernels that wait; JITGEMM_PDL=0 (false, no, off) turns it off."""
    return kernel.waits_for_previous_grid and envflags.flag(ENV_PDL, True)


def launch_config(kernel: LoadedKernel, grid: int, stream: int):
    """The launch configuration of `kernel` on `stream`: `grid` CTAs, its block,
    shared memory and cluster, and PDL where `programmatic_launch` allows it."""
    pdl = programmatic_launch(kernel)
    key = (kernel.name, grid, stream, pdl)
    cfg = _launch_configs.get(key)
    if cfg is None:
        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = kernel.num_threads, 1, 1
        cfg.sharedMemBytes = kernel.smem_bytes
        cfg.hStream = driver.CUstream(stream)
        cluster = driver.CUlaunchAttribute()
        cluster.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z = kernel.cluster_size, 1, 1
        attrs = [cluster]
        if pdl:
            serialization = driver.CUlaunchAttribute()
            serialization.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            serialization.value.programmaticStreamSerializationAllowed = 1
            attrs.append(serialization)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        if len(_launch_configs) > 1024:
            _launch_configs.clear()
        _launch_configs[key] = cfg
    return cfg
