"""The README's `pytest -q` runs the fast subset, CI runs everything (issue 21, item 6)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = """
import pytest

def test_fast():
    pass

@pytest.mark.slow
def test_slow():
    pass
"""


def _collected(tmp_path, *args) -> set:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
        + ["-p", "no:cacheprovider", "--collect-only", "-q", *args, str(tmp_path / "test_sample.py")],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return set(re.findall(r"::(test_\w+)", out))


def test_a_plain_run_leaves_the_slow_tests_out_and_ci_puts_them_back(tmp_path):
    assert _collected(tmp_path) == {"test_fast"}
    assert _collected(tmp_path, "-m", "slow or not slow") == {"test_fast", "test_slow"}  # the last -m wins


def test_the_ci_scripts_run_everything():
    for script in ("run", "gpu", "gpu-offline"):
        text = (ROOT / ".ci" / script).read_text()
        assert all('-m "slow or not slow"' in line for line in text.splitlines() if "pytest -q" in line), script
