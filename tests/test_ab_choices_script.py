"""examples/ab_choices.py without a GPU: which problems two commits choose differently for, and
the summary of timed pairs. The timing itself needs a GPU (run by hand: a heuristics change)."""

import math

import pytest
from example_scripts import load_example


@pytest.fixture(scope="module")
def ab():
    return load_example("ab_choices")


def test_differing_and_summary(ab):
    assert ab.differing([{"a": 1}, {"a": 2}, {"a": 3}], [{"a": 1}, {"a": 5}, {"a": 3}]) == [1]
    with pytest.raises(ValueError):
        ab.differing([{}], [{}, {}])
    # a field the reference tree lacks is its default there
    assert ab.differing([{"block_n": 128}, {}], [{"block_n": 128, "stream_k": False}, {"stream_k": True}]) == [1]
    rows = [{"ratio": 1.10}, {"ratio": 0.90}, {"ratio": 1.01}, {"ref_error": math.inf}]
    got = ab.summary(rows)
    assert got["timed"] == 3 and got["faster"] == 1 and got["slower"] == 1
    assert got["geomean"] == pytest.approx((1.10 * 0.90 * 1.01) ** (1 / 3)) and got["worst"] == 0.90
    assert ab.summary([]) == {"timed": 0}


def test_a_commit_against_itself_differs_nowhere(ab, capsys):
    assert ab.main(["--ref", "HEAD", "--list", "--count", "12", "--seed", "3"]) == 0
    assert "12 problems, 0 choose differently here than HEAD" in capsys.readouterr().out


def test_a_tree_on_disk_as_the_reference(ab, capsys, tmp_path):
    root = ab.ROOT
    assert ab.main(["--ref-tree", str(root), "--list", "--count", "8", "--seed", "4"]) == 0
    assert f"8 problems, 0 choose differently here than {root}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ab.parse_args(["--ref-tree", str(tmp_path)])
    assert "no jitgemm package there" in capsys.readouterr().err


def test_the_choices_are_those_of_select(ab):
    from jitgemm import heuristics
    from jitgemm.config import KernelConfig
    from jitgemm.heuristics.device import DeviceSpec

    sweep = load_example("sweep")
    got = ab.choices(ab.parse_args(["--seed", "5", "--count", "6"]))
    want = [heuristics.select(sweep.kernel_problem(p), DeviceSpec("sm_90a", 132)) for p in sweep.problems(5, 6)]
    assert [KernelConfig.from_dict(c) for c in got] == want


@pytest.mark.parametrize("bad", [["--count", "0"], ["--rounds", "0"], ["--calls-per-graph", "0"]])
def test_bad_arguments(ab, bad):
    with pytest.raises(SystemExit):
        ab.parse_args(bad)


def test_shapes_instead_of_a_seed(ab, capsys, tmp_path):
    from jitgemm import heuristics
    from jitgemm.heuristics.device import DeviceSpec
    from jitgemm.problem import Problem

    shapes = tmp_path / "shapes.json"
    shapes.write_text('[[512, 4096, 4096, "nn", "bf16", null, false], [3, 70, 19143, "tt", "fp16", "fp32", true]]')
    args = ab.parse_args(["--shapes", str(shapes)])
    assert ab.problem_list(args) == [
        Problem(512, 4096, 4096, "bf16", "bf16", "K", "K", False),
        Problem(3, 70, 19143, "fp16", "fp32", "M", "N", True),
    ]
    got = ab.choices(args)
    assert (
        got[0]
        == heuristics.select(Problem(512, 4096, 4096, "bf16", "bf16", "K", "K"), DeviceSpec("sm_90a", 132)).to_dict()
    )
    assert ab.main(["--ref", "HEAD", "--list", "--shapes", str(shapes)]) == 0
    assert f"shapes {shapes}: 2 problems, 0 choose differently" in capsys.readouterr().out
    shapes.write_text('[[512, 4096, 4096, "xx", "bf16", null, false]]')
    with pytest.raises(ValueError, match="--shapes"):
        ab.problem_list(args)
