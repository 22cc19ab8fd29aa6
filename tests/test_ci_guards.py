"""The guards of the GPU run (.ci/gpu): it fails when no GPU test ran, and a hanging test ends it."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HAS_GPU

GPU_TEST = """
import pytest

@pytest.mark.gpu
def test_on_the_gpu():
    pass

def test_on_the_cpu():
    pass
"""
HANGING_TEST = """
import time

def test_hangs():
    time.sleep(60)
"""


def _run(tmp_path, source, **env):
    shutil.copy(Path(__file__).parent / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_it.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present: the GPU tests run")
def test_a_gpu_run_without_a_gpu_fails(tmp_path):
    assert _run(tmp_path, GPU_TEST).returncode == 0  # skips, as CI on a CPU does
    required = _run(tmp_path, GPU_TEST, JITGEMM_REQUIRE_GPU="1")
    assert required.returncode != 0 and "JITGEMM_REQUIRE_GPU=1" in required.stdout + required.stderr


def test_a_hanging_test_ends_the_run(tmp_path):
    start = time.monotonic()
    result = _run(tmp_path, HANGING_TEST, JITGEMM_TEST_TIMEOUT="2")
    assert result.returncode != 0 and time.monotonic() - start < 40
    assert "Timeout" in result.stderr and "test_hangs" in result.stderr


def test_the_sanitizer_job_expects_every_case_the_warm_up_ran():
    """Each tool must pass as many cases as tests/sanitize_cases.py ran without a sanitizer, not
    a count written into the script (it said 11 when there were 12, failing with 0 errors)."""
    import re

    script = (Path(__file__).parent.parent / ".ci" / "gpu-sanitize").read_text()
    checks = re.findall(r"""grep -c '\^ok ' "\$log"\)" -ne (\S+) \]""", script)
    assert checks == ['"$cases"']
    assert """cases=$(grep -c '^ok ' "$OUT/sanitize-warmup.log")""" in script
