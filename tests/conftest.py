import os

import pytest


def _gpu_available() -> bool:
    try:
        from jitgemm import runtime
        if runtime.device_count() == 0:
            return False
        major, _ = runtime.device_info(0).compute_capability
        return major == 9
    except Exception:
        return False


HAS_GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an sm_90 (Hopper) CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty, private cache root for the test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("JITGEMM_CACHE_DIR", str(root))
    return root
