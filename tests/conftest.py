import faulthandler
import os
import sys
import threading

import pytest

# .ci/gpu sets these: a GPU run where no GPU test ran fails, and a test that hangs (a kernel
# waiting forever) ends the run with every thread's traceback instead of stalling it.
REQUIRE_GPU = os.environ.get("JITGEMM_REQUIRE_GPU") == "1"
TEST_TIMEOUT_S = float(os.environ.get("JITGEMM_TEST_TIMEOUT", "0"))


def _gpu_available() -> tuple[bool, str]:
    try:
        from jitgemm import runtime

        if runtime.device_count() == 0:
            return False, "no CUDA device"
        major, minor = runtime.device_info(0).compute_capability
        return major == 9, f"device 0 is compute capability {major}.{minor}"
    except Exception as exc:  # no driver, no libcuda: the GPU tests skip
        return False, f"{type(exc).__name__}: {exc}"


HAS_GPU, GPU_REASON = _gpu_available()
_gpu_passed = 0


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    if REQUIRE_GPU:
        raise pytest.UsageError(f"JITGEMM_REQUIRE_GPU=1 but the GPU tests cannot run: {GPU_REASON}")
    skip = pytest.mark.skip(reason="needs an sm_90 (Hopper) CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _timed_out(config, nodeid: str) -> None:
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    sys.stderr.write(f"\nTimeout: {nodeid} ran past {TEST_TIMEOUT_S:g} s; the stacks of every thread:\n")
    faulthandler.dump_traceback(sys.stderr)
    sys.stderr.flush()
    os._exit(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if TEST_TIMEOUT_S <= 0:
        yield
        return
    watchdog = threading.Timer(TEST_TIMEOUT_S, _timed_out, (item.config, item.nodeid))
    watchdog.daemon = True
    watchdog.start()
    # A thread stuck in a call that holds the GIL stops the timer too: faulthandler's own
    # thread needs no GIL and ends the process a little later.
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S + 30, exit=True)
    try:
        yield
    finally:
        watchdog.cancel()
        faulthandler.cancel_dump_traceback_later()


def pytest_runtest_logreport(report):
    global _gpu_passed
    if report.when == "call" and report.passed and "gpu" in report.keywords:
        _gpu_passed += 1


def pytest_terminal_summary(terminalreporter):
    if HAS_GPU or REQUIRE_GPU:
        terminalreporter.write_line(f"GPU tests passed: {_gpu_passed}")


def pytest_sessionfinish(session, exitstatus):
    if REQUIRE_GPU and _gpu_passed == 0 and exitstatus == 0:
        session.exitstatus = 1  # not one GPU test ran: the GPU run proves nothing


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty, private cache root for the test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("JITGEMM_CACHE_DIR", str(root))
    return root
