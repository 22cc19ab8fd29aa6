"""Without an NVIDIA driver (or GPU) every entry point that needs one raises jitgemm.NoGPUError
with one clear message, after its arguments are checked (issue 21, item 1).

`missing_driver` makes the driver library unloadable the way cuda.pathfinder reports it, so the
tests run on any machine; `real_machine` runs them as they are where there is no driver."""

import numpy as np
import pytest

import jitgemm
from jitgemm import api, runtime, tuning
from jitgemm.problem import Problem

MESSAGE = "jitgemm needs an NVIDIA GPU and driver (R580+ for CUDA 13)"


class DynamicLibNotFoundError(RuntimeError):
    """What cuda.pathfinder raises when libcuda.so cannot be found."""


def _clear_driver_caches():
    runtime.init_driver.cache_clear()
    runtime.device_info.cache_clear()
    api.device_spec.cache_clear()


@pytest.fixture(params=["missing_driver", "real_machine"])
def without_driver(request, monkeypatch):
    if request.param == "real_machine":
        if runtime.device_count() > 0:
            pytest.skip("this machine has a driver and a GPU")
        yield
        return
    _clear_driver_caches()

    def cu_init(flags):
        raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via system search.')

    monkeypatch.setattr(runtime.driver, "cuInit", cu_init)
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    yield
    monkeypatch.undo()
    _clear_driver_caches()


def _host(shape=(64, 64)):
    return np.ones(shape, np.float16)


def test_the_error_is_exported_and_a_runtime_error():
    assert jitgemm.NoGPUError is runtime.NoGPUError
    assert issubclass(jitgemm.NoGPUError, RuntimeError)
    assert issubclass(jitgemm.NoGPUError, jitgemm.CudaError)


def test_gemm_with_valid_numpy_inputs(without_driver):
    with pytest.raises(jitgemm.NoGPUError, match=r"R580\+ for CUDA 13\): the CUDA driver library could not be loaded"):
        jitgemm.gemm(_host(), _host())


def test_config_for(without_driver):
    with pytest.raises(jitgemm.NoGPUError) as info:
        jitgemm.config_for(Problem(64, 64, 64, "fp16"))
    assert str(info.value).startswith(MESSAGE)
    assert "DynamicLibNotFoundError" in str(info.value)  # the cause, in one line


def test_tune(without_driver):
    with pytest.raises(jitgemm.NoGPUError, match=r"^jitgemm needs an NVIDIA GPU and driver"):
        tuning.tune(Problem(256, 256, 256))


def test_device_count_stays_zero(without_driver):
    assert runtime.device_count() == 0  # the tests' GPU detection relies on it


def test_bad_arguments_are_still_reported_first(without_driver):
    with pytest.raises(ValueError, match="^b: expected shape"):
        jitgemm.gemm(_host((64, 32)), _host((64, 64)))
    with pytest.raises(TypeError, match="^b: expected dtype"):
        jitgemm.gemm(_host(), np.ones((64, 64), np.float32))
    with pytest.raises(ValueError, match="^alpha"):
        jitgemm.gemm(_host(), _host(), alpha=1e39)
    with pytest.raises(TypeError, match="^problem: expected a jitgemm.Problem"):
        jitgemm.config_for((64, 64, 64))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^device: expected an int"):
        jitgemm.config_for(Problem(64, 64, 64), device="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^device: expected a GPU ordinal"):
        tuning.tune(Problem(64, 64, 64), device=-1)
    with pytest.raises(ValueError, match="^top: expected an int >= 1"):
        tuning.tune(Problem(64, 64, 64), top=0)


def test_a_driver_without_a_device(monkeypatch):
    """cuInit's "no CUDA-capable device" is the same error, with the driver's words."""
    _clear_driver_caches()
    monkeypatch.setattr(runtime.driver, "cuInit", lambda flags: (runtime.driver.CUresult.CUDA_ERROR_NO_DEVICE,))
    try:
        with pytest.raises(
            jitgemm.NoGPUError, match=r"^jitgemm needs .*cuInit found no usable GPU: CUDA_ERROR_NO_DEVICE"
        ):
            jitgemm.config_for(Problem(64, 64, 64))
        assert runtime.device_count() == 0
    finally:
        monkeypatch.undo()
        _clear_driver_caches()
