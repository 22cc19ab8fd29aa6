"""examples/calibrate.py on the GPU (issue 19, item 3): `measure --smoke` checks and times every
candidate of its problems and writes a measurement file that `fit` turns into a calibration
file jitgemm loads. The rest is in test_calibration.py."""

import json
import os
import subprocess
import sys

import pytest
from child_process import child_pythonpath
from example_scripts import EXAMPLES

from jitgemm.heuristics.device import load_calibration

pytestmark = pytest.mark.gpu


def _script(*args):
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "calibrate.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHONPATH=child_pythonpath()),
    )


def test_measure_smoke_then_fit(tmp_path):
    measured = tmp_path / "measured.json"
    done = _script("measure", "--smoke", "--seed", "1919", "--out", measured)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(measured.read_text())
    assert data["complete"] and not data["simulated"] and len(data["problems"]) == data["count"] == 6
    assert data["kind"].startswith("sm_90a-") and data["gpu_before"].get("name") and data["git_commit"]
    for row in data["problems"]:
        assert len(row["candidates"]) >= 2, row
        for cand in row["candidates"]:
            assert cand["passed"] and 0 <= cand["error"] <= 1 and 0 <= cand["graph_error"] <= 1, cand
            assert cand["us"] > 0 and len(cand["rounds_us"]) == data["rounds"] == 2, cand
    out = tmp_path / "calibration" / f"{data['kind']}.json"
    out.parent.mkdir()
    fitted = _script("fit", measured, "--out", out, "--max-evals", "30")
    assert fitted.returncode == 0, fitted.stdout[-4000:] + fitted.stderr[-4000:]
    calibration = load_calibration(out)
    assert calibration.measured and calibration.provenance["gpu"] == data["gpu_before"]["name"]
    print(done.stdout[-3000:] + fitted.stdout[-3000:])
