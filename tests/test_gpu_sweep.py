"""examples/sweep.py on the GPU (issue 19, item 1): its check is the GPU tests' bound, and the
sweep in smoke mode runs, checks every result and exits 0. The rest is in test_sweep_script.py."""

import json
import os
import subprocess
import sys

import pytest
from child_process import child_pythonpath
from example_scripts import EXAMPLES, load_example
from gpu_helpers import nan_full, random_operand, worst_error

import jitgemm

pytestmark = pytest.mark.gpu

SCRIPT = EXAMPLES / "sweep.py"


@pytest.fixture(scope="module")
def sweep():
    return load_example("sweep")


@pytest.mark.parametrize(
    "dtype, out_dtype, with_c", [("bf16", "bf16", False), ("fp16", "fp16", True), ("bf16", "fp32", True)]
)
def test_the_check_is_the_gpu_tests_bound(sweep, dtype, out_dtype, with_c):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(1901)
    m, n, k = 200, 136, 1000
    a, b = random_operand(m, k, dtype, "row", gen), random_operand(k, n, dtype, "col", gen)
    c = random_operand(m, n, out_dtype, "row", gen) if with_c else None
    out = nan_full((m, n), out_dtype)
    jitgemm.gemm(a, b, out, c=c, beta=0.5)
    torch.cuda.synchronize()
    a64, b64 = a.double(), b.double()
    mine = sweep.error_ratio(
        out.double(), a64 @ b64, a64.abs() @ b64.abs(), k, out_dtype, None if c is None else c.double(), 0.5
    )
    theirs = worst_error(out, a, b, out_dtype, c=c, beta=0.5)
    assert mine == pytest.approx(theirs, rel=1e-9) and mine <= 1.0


@pytest.mark.parametrize("calls_per_graph", [20, 1])
def test_sweep_smoke(tmp_path, calls_per_graph):
    """examples/sweep.py --smoke: 8 small problems (every layout, both dtypes, C, fp32 outputs,
    unaligned N or K), every result checked before and after timing; a fresh process. Timed
    back to back (graphs of 20 calls, the default) and as lone calls."""
    report = tmp_path / "sweep.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke",
            "--seed",
            "1919",
            "--json",
            str(report),
            "--markdown",
            str(tmp_path / "sweep.md"),
            "--calls-per-graph",
            str(calls_per_graph),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHONPATH=child_pythonpath()),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads(report.read_text())
    rows = result["rows"]
    assert result["complete"] and len(rows) == result["count"] == 8
    assert result["calls_per_graph"] == calls_per_graph
    assert result["failures"] == 0 and result["checked"] == 8
    for row in rows:
        assert row["passed"] and set(row["checks"]) >= {"jitgemm", "jitgemm_graph"}, row
        assert all(0.0 <= err <= 1.0 for err in row["checks"].values()), row
        assert row["jitgemm_us"] > 0 and row["cublas_us"] > 0 and row["config"]
    assert {r["layout"] for r in rows} == {"nt", "nn", "tn", "tt"}
    assert result["summary"]["in_statistics"] + len(result["summary"]["unfair"]["indices"]) == 8
    assert "the 8 worst, all problems:" in done.stdout or result["summary"]["in_statistics"] < 8
    print(done.stdout[-3000:])
