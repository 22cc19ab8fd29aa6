"""Raw device memory through the driver, for the arrays jitgemm allocates itself: stream-ordered
allocations, strided 2-D copies, ordering one stream after another, and the device of a pointer.
"""

from __future__ import annotations

import itertools
import threading
import weakref

from cuda.bindings import driver

from .. import context, runtime


def _free(ptr: int, stream: int, ctx) -> None:
    """Release stream-ordered device memory (at garbage collection, on any thread: quietly, so
    not through jitgemm.context, which raises when the context is gone at shutdown)."""
    if driver.cuCtxPushCurrent(ctx)[0] != driver.CUresult.CUDA_SUCCESS:
        return  # the process is shutting down and the context is gone
    try:
        if driver.cuMemFreeAsync(ptr, driver.CUstream(stream))[0] != driver.CUresult.CUDA_SUCCESS:
            driver.cuMemFree(ptr)  # the stream no longer exists
    finally:
        driver.cuCtxPopCurrent()


class DeviceMemory:
    """`nbytes` of stream-ordered device memory, freed on `stream` when garbage-collected.
    Needs the device's context current when created."""

    def __init__(self, nbytes: int, stream: int):
        self.nbytes = nbytes
        self.ptr = int(
            runtime.check(driver.cuMemAllocAsync(nbytes, driver.CUstream(stream)), f"cuMemAllocAsync({nbytes})")
        )
        self.context = runtime.check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        weakref.finalize(self, _free, self.ptr, stream, self.context)

    def current(self):
        """The memory's context, current on this thread for the block."""
        return context.current(self.context)


_events = threading.local()


def stream_wait(consumer: int, producer: int, device: int) -> None:
    """Make `consumer` wait for the work queued so far on `producer` (no host synchronisation)."""
    cache = getattr(_events, "by_device", None)
    if cache is None:
        cache = _events.by_device = {}
    event = cache.get(device)
    if event is None:
        event = cache[device] = runtime.check(
            driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate"
        )
    runtime.check(driver.cuEventRecord(event, driver.CUstream(producer)), "cuEventRecord")
    runtime.check(driver.cuStreamWaitEvent(driver.CUstream(consumer), event, 0), "cuStreamWaitEvent")


def copy_2d(
    dst_ptr: int,
    dst_strides: tuple,
    src_ptr: int,
    src_strides: tuple,
    shape: tuple,
    itemsize: int,
    stream: int,
    dst_host: bool = False,
    src_host: bool = False,
) -> None:
    """Copy a (rows, cols) strided array (strides in elements) with 2-D driver copies: one when
    both sides share a unit-stride dimension, else one per row or column."""
    mem = driver.CUmemorytype
    rows, cols = shape
    if rows == 0 or cols == 0:
        return
    if src_strides[1] == 1 and dst_strides[1] == 1 or cols == 1:
        plan = [(0, 0, cols * itemsize, rows, src_strides[0], dst_strides[0])]
    elif src_strides[0] == 1 and dst_strides[0] == 1 or rows == 1:
        plan = [(0, 0, rows * itemsize, cols, src_strides[1], dst_strides[1])]
    elif rows <= cols:  # element by element along each row
        plan = [
            (i * src_strides[0], i * dst_strides[0], itemsize, cols, src_strides[1], dst_strides[1])
            for i in range(rows)
        ]
    else:
        plan = [
            (j * src_strides[1], j * dst_strides[1], itemsize, rows, src_strides[0], dst_strides[0])
            for j in range(cols)
        ]
    for src_off, dst_off, width, height, src_pitch, dst_pitch in plan:
        p = driver.CUDA_MEMCPY2D()
        p.srcMemoryType = mem.CU_MEMORYTYPE_HOST if src_host else mem.CU_MEMORYTYPE_DEVICE
        p.dstMemoryType = mem.CU_MEMORYTYPE_HOST if dst_host else mem.CU_MEMORYTYPE_DEVICE
        if src_host:
            p.srcHost = src_ptr + src_off * itemsize
        else:
            p.srcDevice = src_ptr + src_off * itemsize
        if dst_host:
            p.dstHost = dst_ptr + dst_off * itemsize
        else:
            p.dstDevice = dst_ptr + dst_off * itemsize
        p.srcPitch = max(src_pitch * itemsize, width) if height > 1 else width
        p.dstPitch = max(dst_pitch * itemsize, width) if height > 1 else width
        p.WidthInBytes = width
        p.Height = height
        runtime.check(driver.cuMemcpy2DAsync(p, driver.CUstream(stream)), "cuMemcpy2DAsync")


def copy_nd(
    dst_ptr: int,
    dst_strides: tuple,
    src_ptr: int,
    src_strides: tuple,
    shape: tuple,
    itemsize: int,
    stream: int,
    dst_host: bool = False,
    src_host: bool = False,
) -> None:
    """Copy an N-D strided array (strides in elements, shape of 2 or more dimensions): one
    `copy_2d` of the last two dimensions per index of the others."""
    for index in itertools.product(*(range(n) for n in shape[:-2])):
        dst_offset = sum(i * s for i, s in zip(index, dst_strides)) * itemsize
        src_offset = sum(i * s for i, s in zip(index, src_strides)) * itemsize
        copy_2d(
            dst_ptr + dst_offset,
            tuple(dst_strides[-2:]),
            src_ptr + src_offset,
            tuple(src_strides[-2:]),
            tuple(shape[-2:]),
            itemsize,
            stream,
            dst_host,
            src_host,
        )


def pointer_device(ptr: int) -> int:
    """The CUDA ordinal owning device pointer `ptr` (a driver query)."""
    runtime.init_driver()
    err, ordinal = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    if err != driver.CUresult.CUDA_SUCCESS:
        return -1
    return int(ordinal)
