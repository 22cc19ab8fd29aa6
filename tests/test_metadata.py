"""The package metadata says what jitgemm needs (issue 21, item 7): the lowest cuda-core with
what the code imports, the driver requirement, and the license file the metadata declares."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")


@pytest.fixture(scope="module")
def project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _lower_bound(project, name):
    for dep in project["dependencies"]:
        found = re.fullmatch(rf"{re.escape(name)}>=([0-9.]+)", dep.replace(" ", ""))
        if found:
            return tuple(int(x) for x in found.group(1).split("."))
    raise AssertionError(f"{name} has no lower bound in {project['dependencies']}")


def test_cuda_core_bound_has_what_the_code_uses(project):
    # cuda.core.utils (StridedMemoryView) arrived in 0.5; bfloat16 DLPack through ml_dtypes in 0.6.
    assert _lower_bound(project, "cuda-core") >= (0, 6)
    from cuda.core.utils import StridedMemoryView

    assert hasattr(StridedMemoryView, "from_dlpack")


def test_the_driver_requirement_is_stated(project):
    assert "R580" in project["description"] and "CUDA 13" in project["description"]
    assert "Environment :: GPU :: NVIDIA CUDA :: 13" in project["classifiers"]
    readme = (ROOT / "README.md").read_text()
    assert "NVIDIA driver R580 or newer" in readme


def test_the_declared_license_is_shipped(project):
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and 'THE SOFTWARE IS PROVIDED "AS IS"' in text
