"""The README as a reference (issue 21, item 10): its layout table says what `gemm` actually does
with each pair of operands, and names DeepGEMM's equivalent by DeepGEMM's own rule."""

import re
from pathlib import Path

import numpy as np
import pytest

from jitgemm import api
from jitgemm.arrays import describe
from jitgemm.config import KernelConfig
from jitgemm.problem import LAYOUTS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
M, N, K = 64, 96, 128


def _layout_rows() -> dict:
    rows = {}
    for line in README.splitlines():
        found = re.match(r"\| `(nt|nn|tn|tt)`(?: \(default\))? \| (.*)", line)
        if found:
            rows[found.group(1)] = [cell.strip() for cell in found.group(2).strip(" |").split(" | ")]
    return rows


def _operand(described: str, shape: tuple):
    """The array the table's "as passed" cell describes: row-major, or .T of a contiguous array."""
    rows, cols = shape
    if described.startswith("row-major"):
        return np.zeros((rows, cols), np.float16)
    assert re.match(r"`[A-Z]\.T`, `[A-Z]` a contiguous", described), described
    return np.zeros((cols, rows), np.float16).T


def test_the_table_has_every_layout_once():
    assert sorted(_layout_rows()) == sorted(LAYOUTS)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_row_is_what_gemm_reads(name, monkeypatch):
    a_cell, b_cell, deepgemm, cblas, cublas, torch_expr = _layout_rows()[name]
    monkeypatch.setattr(api, "_config_for", lambda *args: KernelConfig())  # no GPU: the layout is decided before
    a, b = _operand(a_cell, (M, K)), _operand(b_cell, (K, N))
    decision = api._Decision(describe(a, "a", 0), describe(b, "b", 0), None, None, M, N, K, "fp16", 1.0, None, 0)
    assert decision.problem.layout == name
    assert not decision.a_copy and not decision.b_copy  # read in place
    a_major, b_major = LAYOUTS[name]
    # DeepGEMM: first letter N for a K-major A, else T; second T for a K-major B, else N.
    expected = ("n" if a_major == "K" else "t") + ("t" if b_major == "K" else "n")
    assert deepgemm.strip("`*") == expected
    # CBLAS, row-major: an operand stored transposed (a .T view) is T.
    assert cblas == f"{'N' if a_major == 'K' else 'T'}, {'N' if b_major == 'N' else 'T'}"
    # cuBLAS on (b, a), column-major: the same letters, swapped.
    assert cublas == f"{'N' if b_major == 'N' else 'T'}, {'N' if a_major == 'K' else 'T'}"
    assert (".t()" in torch_expr.split("@")[0]) == (a_major == "M")
    assert (".t()" in torch_expr.split("@")[1]) == (b_major == "K")


def test_the_limits_are_listed():
    section = README.split("## What it does not do yet", 1)[1].split("\n## ", 1)[0]
    for item in ("FP8", "Batched", "Grouped / MoE", "Fused epilogues", "Autograd", "sm_100a on hardware"):
        assert item in section, item
