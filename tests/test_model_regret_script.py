"""examples/model_regret.py: the cost model's picks scored against a calibration file, with a rate
or a model constant replaced, and every replacement undone afterwards."""

import json

import pytest
from example_scripts import EXAMPLES, load_example

from jitgemm.heuristics import sm90

H200_FILE = EXAMPLES / "data" / "calibration-sm_90a-132-2026-12-02.json"


@pytest.fixture(scope="module")
def mr():
    return load_example("model_regret")


@pytest.fixture(scope="module")
def samples(mr):
    return mr.calibrate.read_measurements(H200_FILE)[1][:60]


def test_settings_are_sorted_into_rates_and_constants(mr):
    rates, constants = mr.parse_settings(["l2_total_bytes_per_clk=3800", "L2_ROUND_TRIP_CLK=600"])
    assert rates == {"l2_total_bytes_per_clk": 3800.0}
    assert constants == {"L2_ROUND_TRIP_CLK": 600} and isinstance(constants["L2_ROUND_TRIP_CLK"], int)
    for bad, says in (("L2_ROUND_TRIP_CLK", "NAME=VALUE"), ("FOO=1", "'FOO'"), ("L2_ROUND_TRIP_CLK=x", "'x'")):
        with pytest.raises(ValueError, match=says):
            mr.parse_settings([bad])


def test_a_replacement_is_scored_and_undone(mr, samples):
    before = sm90.L2_ROUND_TRIP_CLK
    same = mr.score(samples, {}, {})
    assert same["before"] == same["after"]
    assert all(c["changed"] == 0 for c in same["classes"].values())
    moved = mr.score(samples, {}, {"L2_ROUND_TRIP_CLK": 100, "SPLITK_LAUNCH_CLK": 0})
    assert moved["before"] == same["before"]
    assert sum(c["changed"] for c in moved["classes"].values()) > 0
    assert moved["after"]["regret_geomean"] != moved["before"]["regret_geomean"]
    assert sm90.L2_ROUND_TRIP_CLK == before
    # The regret of the picks is calibrate's, computed with the replacement in force.
    with mr.replaced({}, {"L2_ROUND_TRIP_CLK": 100, "SPLITK_LAUNCH_CLK": 0}):
        direct = mr.calibrate.metrics(
            samples, [mr.calibrate.model_cycles(s.problem, mr.DEVICE, s.configs) for s in samples]
        )
    assert direct == moved["after"]
    assert mr.score(samples, {}, {}) == same  # no stale memo of the replaced model survives
    # select's memo of answers is emptied on the way in and out, so it answers with the model in force.
    problem = samples[0].problem
    chosen = mr.heuristics.select(problem, mr.DEVICE)
    with mr.replaced({"l2_total_bytes_per_clk": 1.0}, {}):
        assert mr.heuristics.select.cache_info().currsize == 0
        mr.heuristics.select(problem, mr.DEVICE)
    assert mr.heuristics.select.cache_info().currsize == 0
    assert mr.heuristics.select(problem, mr.DEVICE) == chosen


def test_the_command_line(mr, capsys):
    assert mr.main([str(H200_FILE), "--set", "l2_total_bytes_per_clk=3800"]) == 0
    out = capsys.readouterr().out
    assert (
        "replacing: l2_total_bytes_per_clk=3800" in out
        and "calibration-sm_90a-132-2026-12-02.json: 300 problems" in out
    )
    with pytest.raises(SystemExit) as exc:
        mr.main(["--set", "NOPE=2"])
    assert exc.value.code == 2
    assert "'NOPE'" in capsys.readouterr().err


def test_a_calibration_file_s_rates(mr, tmp_path, capsys):
    source = EXAMPLES.parent / "heuristics" / "calibration" / "sm_90a-132.json"
    data = json.loads(source.read_text())
    data["rates"]["l2_total_bytes_per_clk"] = 3800
    path = tmp_path / "sm_90a-132.json"
    path.write_text(json.dumps(data))
    assert mr.main([str(H200_FILE), "--rates", str(path)]) == 0
    by_file = capsys.readouterr().out
    assert mr.main([str(H200_FILE), "--set", "l2_total_bytes_per_clk=3800"]) == 0
    by_set = capsys.readouterr().out
    assert f"replacing: the rates of {path}" in by_file
    assert by_file.splitlines()[1:] == by_set.splitlines()[1:]  # the same figures
    path.write_text("{}")
    with pytest.raises(SystemExit):
        mr.main([str(H200_FILE), "--rates", str(path)])
    assert str(path) in capsys.readouterr().err
