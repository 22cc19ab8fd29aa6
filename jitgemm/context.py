"""CUDA contexts, in one place: every launch, copy and allocation of jitgemm runs in the device's
primary context (the one CuPy, torch and the runtime API share), made current for the call and
the caller's restored after."""

from __future__ import annotations

import contextlib
import threading

from cuda.bindings import driver

from . import runtime

_primary: dict = {}
_primary_lock = threading.Lock()


def primary(ordinal: int):
    """The device's primary context (retained once per process)."""
    found = _primary.get(ordinal)
    if found is None:
        runtime.init_driver()
        with _primary_lock:
            found = _primary.get(ordinal)
            if found is None:
                dev = runtime.check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
                found = _primary[ordinal] = runtime.check(
                    driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain"
                )
    return found


def is_current(handle: int) -> bool:
    """Whether the context of this handle (int(ctx)) is current on this thread."""
    now = driver.cuCtxGetCurrent()[1]
    return now is not None and int(now) == handle


@contextlib.contextmanager
def current(ctx):
    """Make `ctx` current for the block (nothing to do when it already is), then restore."""
    if is_current(int(ctx)):
        yield
        return
    runtime.check(driver.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    try:
        yield
    finally:
        driver.cuCtxPopCurrent()


def on_device(ordinal: int):
    """A block in the device's primary context."""
    return current(primary(ordinal))


def make_current(ordinal: int) -> None:
    """Leave the device's primary context current on this thread (loading kernels, the tuner)."""
    runtime.init_driver()
    ctx = runtime.check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is not None and int(ctx) != 0 and int(runtime.check(driver.cuCtxGetDevice(), "cuCtxGetDevice")) == ordinal:
        return
    runtime.check(driver.cuCtxSetCurrent(primary(ordinal)), "cuCtxSetCurrent")


def current_device() -> int:
    """The ordinal of the current context's device (0 when no context is current)."""
    runtime.init_driver()
    ctx = runtime.check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        return 0
    return int(runtime.check(driver.cuCtxGetDevice(), "cuCtxGetDevice"))
