"""The cost model's calibration as data (issue 19, item 3): the files of heuristics/calibration/
(the loader's checks, the shipped files, which file a device kind gets, explain's report of it)
and examples/calibrate.py without a GPU (its problems and candidates, the fit on times the model
itself gave, the command line). The measuring run on a GPU: test_gpu_calibrate.py."""

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib
from child_process import child_pythonpath
from example_scripts import EXAMPLES, load_example

from jitgemm import cli, dispatch, heuristics, registry
from jitgemm.heuristics import DeviceSpec, check_config, device, sm90, sm100
from jitgemm.heuristics.device import (
    CALIBRATION_DIR,
    DEFAULT_KINDS,
    RATE_NAMES,
    ArchRates,
    CalibrationError,
    calibration_for,
    calibration_of,
    costing_with,
    device_kind,
    load_calibration,
    parse_calibration,
)
from jitgemm.problem import LAYOUTS, Problem

ROOT = Path(__file__).resolve().parent.parent
H200 = DeviceSpec("sm_90a", 132)
B200 = DeviceSpec("sm_100a", 148)
# The rates fixed by hand from H200 measurements (heuristics/RATES.md), moved into
# heuristics/calibration/sm_90a-132.json unchanged: every choice stays what it was
# (tests/data/recorded_choices.json and test_heuristics.py pin them).
H200_RATES = ArchRates(
    mma_flops_per_clk=3200,
    mma_peak_flops_per_clk=4096,
    smem_bytes_per_clk=128,
    l2_sm_bytes_per_clk=96,
    l2_total_bytes_per_clk=4500,
    l2_delivery_bytes_per_clk=5000,
    l2_shared_wave_gain=1.5,
    hbm_bytes_per_clk=2400,
    dram_read_bytes_per_clk=2550,
    dram_latency_clk=1000,
    dram_run_overhead_bytes=16,
    load_latency_clk=2000,
    launch_clk=2600,
    clock_ghz=1.75,
)
# sm_100a's placeholders (not measured), as sm100.py held them.
B200_RATES = dataclasses.replace(
    H200_RATES,
    mma_flops_per_clk=8192,
    mma_peak_flops_per_clk=8192,
    l2_sm_bytes_per_clk=64,
    l2_total_bytes_per_clk=8192,
    hbm_bytes_per_clk=4000,
    dram_read_bytes_per_clk=4000,
    dram_run_overhead_bytes=32,
    load_latency_clk=1000,
)


def shipped(kind="sm_90a-132") -> dict:
    return json.loads((CALIBRATION_DIR / f"{kind}.json").read_text())


@pytest.fixture
def calibration_dir(tmp_path, monkeypatch):
    """A calibration directory of the test's own (holding copies of the shipped files); the
    loaded files are forgotten before and after."""
    for path in CALIBRATION_DIR.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    monkeypatch.setattr(device, "CALIBRATION_DIR", tmp_path)
    calibration_of.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    calibration_of.cache_clear()


# ----------------------------------------------------------------------------- the files
def test_the_shipped_files_hold_the_rates_as_they_were():
    h200 = calibration_of("sm_90a-132")
    assert h200.rates == H200_RATES and h200.measured and h200.provenance["gpu"] == "NVIDIA H200"
    assert sm90.RATES == H200_RATES and H200.rates == H200_RATES
    # JSON keeps ints ints: the model computes with the very numbers it had
    assert all(type(getattr(H200.rates, n)) is type(getattr(H200_RATES, n)) for n in RATE_NAMES)
    b200 = calibration_of("sm_100a-148")
    assert b200.rates == B200_RATES == sm100.RATES == B200.rates and not b200.measured
    assert B200.rates_source == "sm_100a-148.json (not measured: placeholders)"
    assert H200.rates_source == "sm_90a-132.json (measured: NVIDIA H200, 2026-11-30)"


def test_every_file_loads_is_shipped_and_is_in_the_dispatch_fingerprint():
    files = sorted(CALIBRATION_DIR.glob("*.json"))
    assert {p.stem for p in files} >= set(DEFAULT_KINDS.values())
    for path in files:
        assert load_calibration(path).kind == path.stem
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["jitgemm.heuristics"]
    shipped = {p.relative_to(ROOT / "heuristics") for pattern in patterns for p in (ROOT / "heuristics").glob(pattern)}
    assert shipped == {p.relative_to(CALIBRATION_DIR.parent) for p in files}
    # new rates are other choices: a dispatch table written under the old ones is not trusted
    labels = {label for label, _ in dispatch._fingerprint_sources()}
    assert {f"heuristics/calibration/{p.name}" for p in files} <= labels


def test_each_arch_has_its_default_kind_at_its_default_sm_count():
    assert set(DEFAULT_KINDS) == set(registry.ARCH_NAMES)
    for arch in registry.ARCH_NAMES:
        assert DEFAULT_KINDS[arch] == device_kind(arch, registry.get(arch).default_num_sms)
        assert calibration_of(DEFAULT_KINDS[arch]) is not None


def test_sm90_has_no_calibration_but_its_default_kinds():
    # The sm_90a model costs with its rules' RATES, the default kind's (heuristics/sm90.py reads
    # the module's RATES, not device.rates): a file for another sm_90a kind would be reported by
    # explain but not used by select. Before adding one, make sm90's cost functions take
    # device.rates (see heuristics/RATES.md, "Recalibrating").
    assert sorted(p.stem for p in CALIBRATION_DIR.glob("sm_90a-*.json")) == ["sm_90a-132"]


def _bad(**changes):
    def edit(data):
        for where, value in changes.items():
            target, _, key = where.rpartition(".")
            holder = data[target] if target else data
            if value is KeyError:
                holder.pop(key)
            else:
                holder[key] = value

    return edit


@pytest.mark.parametrize(
    "edit, words",
    [
        (_bad(**{"rates.launch_clk": KeyError}), "missing rates ['launch_clk']"),
        (_bad(**{"rates.l2_magic_bytes_per_clk": 5}), "unknown rates ['l2_magic_bytes_per_clk']"),
        (_bad(**{"rates.launch_clk": 0}), "rate launch_clk must be a finite number > 0, not 0"),
        (_bad(**{"rates.dram_latency_clk": -1000}), "rate dram_latency_clk must be a finite number > 0, not -1000"),
        (_bad(**{"rates.clock_ghz": float("nan")}), "rate clock_ghz must be a finite number > 0, not nan"),
        (_bad(**{"rates.clock_ghz": float("inf")}), "rate clock_ghz must be a finite number > 0, not inf"),
        (_bad(**{"rates.launch_clk": True}), "rate launch_clk must be a finite number > 0, not True"),
        (_bad(**{"rates.launch_clk": "2600"}), "rate launch_clk must be a finite number > 0, not '2600'"),
        (_bad(**{"rates.launch_clk": None}), "rate launch_clk must be a finite number > 0, not None"),
        (_bad(rates=[3200]), "rates must be an object"),
        (_bad(extra=1), "unknown keys ['extra']"),
        (_bad(provenance=KeyError), "missing keys ['provenance']"),
        (_bad(**{"provenance.gpu": KeyError}), "provenance lacks ['gpu']"),
        (_bad(provenance="by hand"), "provenance must be an object"),
        (_bad(schema=2), "schema 2, this jitgemm reads schema 1"),
        (_bad(kind="sm_90a-114"), "kind 'sm_90a-114' in a file named for 'sm_90a-132'"),
        (_bad(kind="sm_80-108"), "kind 'sm_80-108' is not '<arch>-<SM count>' of a known arch"),
        (_bad(kind="sm_90a"), "kind 'sm_90a' is not '<arch>-<SM count>'"),
        (_bad(measured="yes"), "measured must be true or false, not 'yes'"),
    ],
)
def test_a_bad_file_is_refused_at_load(tmp_path, edit, words):
    data = shipped()
    edit(data)
    path = tmp_path / "sm_90a-132.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=re.escape(words)) as info:
        load_calibration(path)
    assert str(path) in str(info.value)


def test_every_problem_of_a_file_is_named_at_once():
    data = shipped()
    data["rates"].pop("launch_clk")
    data["rates"]["hbm_bytes_per_clk"] = 0
    data["rates"]["turbo"] = 2
    with pytest.raises(CalibrationError) as info:
        parse_calibration(data, "here.json", "sm_90a-132")
    assert all(w in str(info.value) for w in ("['launch_clk']", "['turbo']", "hbm_bytes_per_clk", "here.json"))


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_an_unreadable_file_is_refused(tmp_path, text):
    path = tmp_path / "sm_90a-132.json"
    path.write_text(text)
    with pytest.raises(CalibrationError, match="sm_90a-132.json"):
        load_calibration(path)
    with pytest.raises(CalibrationError, match="cannot read"):
        load_calibration(tmp_path / "missing.json")


def test_a_bad_shipped_file_stops_selection_with_the_reason(calibration_dir):
    data = shipped("sm_100a-148")
    data["rates"]["launch_clk"] = -1
    (calibration_dir / "sm_100a-148.json").write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=r"sm_100a-148.json: rate launch_clk must be .* not -1"):
        heuristics.explain(Problem(256, 256, 256), DeviceSpec("sm_100a", 150))
    (calibration_dir / "sm_90a-132.json").unlink()
    with pytest.raises(ValueError, match="no calibration for sm_90a: .* has no sm_90a-132.json"):
        calibration_for("sm_90a", 114)


def test_a_kind_gets_its_own_file_else_its_arch_default(calibration_dir):
    for num_sms in (114, 78):
        other = DeviceSpec("sm_90a", num_sms)
        assert calibration_for("sm_90a", num_sms) == (calibration_of("sm_90a-132"), False)
        assert other.rates == H200_RATES
        assert other.rates_source == (
            f"sm_90a-132.json (measured: NVIDIA H200, 2026-11-30), the sm_90a default: no calibration file for "
            f"sm_90a-{num_sms}"
        )
    # a kind with a file of its own is costed with it (sm_100a's cost_of reads device.rates)
    data = shipped("sm_100a-148")
    data.update(kind="sm_100a-160", measured=True)
    data["rates"]["mma_flops_per_clk"] = data["rates"]["mma_peak_flops_per_clk"] = 4096
    data["provenance"].update(gpu="a test GPU", date="2026-12-02")
    (calibration_dir / "sm_100a-160.json").write_text(json.dumps(data))
    own = DeviceSpec("sm_100a", 160)
    assert (
        own.rates.mma_flops_per_clk == 4096
        and own.rates_source == "sm_100a-160.json (measured: a test GPU, 2026-12-02)"
    )
    problem = Problem(4096, 4096, 4096)
    cfg = heuristics.select(problem, own)
    with costing_with(own, B200_RATES):
        faster = sm100.cost_of(problem, own, cfg).cost
    assert sm100.cost_of(problem, own, cfg).cost > faster  # half the tensor-core rate
    assert heuristics.explain(problem, own)["rates"] == own.rates_source


def test_explain_reports_where_the_rates_came_from():
    report = heuristics.explain(Problem(4096, 2112, 7168), DeviceSpec("sm_90a", 114))
    assert report["rates"].startswith("sm_90a-132.json") and "no calibration file for sm_90a-114" in report["rates"]
    assert "rates:     sm_90a-132.json" in cli.format_explanation(report)
    assert heuristics.explain(Problem(64, 64, 64), B200)["rates"] == "sm_100a-148.json (not measured: placeholders)"


def test_costing_with_tries_rates_and_restores_them():
    problem = Problem(4096, 4096, 4096)
    cfg = heuristics.select(problem, H200)
    base = sm90.cost_of(problem, H200, cfg).cost
    slow = dataclasses.replace(H200_RATES, mma_flops_per_clk=1600, mma_peak_flops_per_clk=2048)
    with costing_with(H200, slow):
        assert sm90.RATES is slow and H200.rates is slow
        assert sm90.cost_of(problem, H200, cfg).cost > 1.5 * base
    assert sm90.RATES == H200.rates == H200_RATES and sm90.cost_of(problem, H200, cfg).cost == base
    b_cfg = heuristics.select(problem, B200)
    b_base = sm100.cost_of(problem, B200, b_cfg).cost
    with pytest.raises(RuntimeError), costing_with(B200, dataclasses.replace(B200_RATES, mma_flops_per_clk=1024)):
        assert sm100.cost_of(problem, B200, b_cfg).cost > 2 * b_base
        raise RuntimeError("restored all the same")
    assert sm100.RATES == B200.rates == B200_RATES and sm100.cost_of(problem, B200, b_cfg).cost == b_base


# ----------------------------------------------------------------------------- examples/calibrate.py
@pytest.fixture(scope="module")
def cal():
    return load_example("calibrate")


@pytest.mark.parametrize("seed", range(3))
def test_the_problems_of_a_seed(cal, seed):
    sweep = cal.sweep
    ps, redraws = cal.draw(seed, 200)
    assert len(ps) == 200 and redraws < 40
    assert all(1 <= p.m <= 16384 and 64 <= p.n <= 32768 and 64 <= p.k <= 32768 for p in ps)
    assert all(sweep.work(p) <= cal.MAX_WORK for p in ps)
    # nothing is copied: N and K multiples of 8, and M where A is M-major (M = 1 is read K-major)
    assert all(p.n % 8 == 0 and p.k % 8 == 0 and (p.a_major == "K" or p.m == 1 or p.m % 8 == 0) for p in ps)
    assert all(sweep.copied_operands(p) == () for p in ps)
    assert {layout: sum(p.layout == layout for p in ps) for layout in LAYOUTS} == dict.fromkeys(LAYOUTS, 50)
    assert sum(p.dtype == "bf16" for p in ps) == 100 and sum(p.has_c for p in ps) == 100
    assert sum(p.out_dtype == "fp32" for p in ps) == 40
    assert sum(p.m <= 64 for p in ps) > 40 and sum(p.m > 4096 for p in ps) > 10  # log-uniform M
    assert ps == cal.draw(seed, 200)[0] and ps != cal.draw(seed + 10, 200)[0]


def test_the_candidates_are_legal_seeded_and_the_models_best_first(cal):
    plan, _ = cal.make_plan(4, 40, 4, 3, cal.MAX_WORK, H200)
    randoms = 0
    for item in plan:
        kp = item.kernel_problem
        assert kp == cal.sweep.kernel_problem(item.problem)
        configs = [c["config"] for c in item.candidates]
        assert len(set(configs)) == len(configs) >= 2
        assert all(check_config(cfg, kp, H200) == [] for cfg in configs), kp
        model = [c for c in item.candidates if c["source"] == "model"]
        assert [c["model_rank"] for c in model] == list(range(len(model))) and len(model) == min(4, len(configs))
        assert model[0]["config"] == heuristics.select(kp, H200)
        for c in item.candidates:
            assert c["model_us"] == pytest.approx(sm90.cost_of(kp, H200, c["config"]).terms["model_us"], abs=0.006)
            if c["source"] == "random":
                randoms += 1
                assert c["model_rank"] >= 4 and c["model_us"] <= cal.RANDOM_WITHIN * model[0]["model_us"]
    assert randoms > 80
    assert plan == cal.make_plan(4, 40, 4, 3, cal.MAX_WORK, H200)[0]
    assert plan != cal.make_plan(5, 40, 4, 3, cal.MAX_WORK, H200)[0]
    for item in cal.make_plan(4, 8, 2, 2, cal.MAX_WORK, B200)[0]:
        assert all(check_config(c["config"], item.kernel_problem, B200) == [] for c in item.candidates)


def test_the_modelled_times_are_the_arch_cost_functions(cal):
    for dev, rules in ((H200, sm90), (B200, sm100)):
        for item in cal.make_plan(9, 12, 3, 3, cal.MAX_WORK, dev)[0]:
            configs = [c["config"] for c in item.candidates]
            want = [rules.cost_of(item.kernel_problem, dev, cfg).cost for cfg in configs]
            assert cal.model_cycles(item.kernel_problem, dev, configs) == pytest.approx(want, rel=1e-9, abs=1e-5)


def _samples(cal, plan, rates, dev=H200):
    return [
        cal.Sample(
            i.index,
            i.kernel_problem,
            [c["config"] for c in i.candidates],
            cal.model_us_of(i.kernel_problem, dev, [c["config"] for c in i.candidates], rates),
        )
        for i in plan
    ]


def test_the_fit_recovers_what_the_model_measured(cal):
    # times the model gives at the shipped rates; the fit starts from rates 1.5-1.6x off
    plan, _ = cal.make_plan(11, 36, 3, 3, cal.MAX_WORK, H200)
    samples = _samples(cal, plan, H200_RATES)
    truth = cal.metrics(samples, cal.predict(samples, H200, H200_RATES))
    assert truth["rms_log_error"] == 0 and truth["best_picked"] == 1 and truth["regret_max"] == 1
    start = dataclasses.replace(
        H200_RATES,
        mma_flops_per_clk=5120,
        l2_total_bytes_per_clk=3000,
        dram_read_bytes_per_clk=1700,
        launch_clk=3900,
        load_latency_clk=1333,
    )
    train, held = cal.split(samples, 0.25, 0)
    names = tuple(n for n in RATE_NAMES if n not in cal.FIT_HELD)
    fitted, evals = cal.fit(train, H200, start, names, max_evals=300)
    assert 50 < evals <= 300 and fitted.clock_ghz == start.clock_ghz and fitted.smem_bytes_per_clk == 128
    for part in (train, held):
        before = cal.metrics(part, cal.predict(part, H200, start))
        after = cal.metrics(part, cal.predict(part, H200, fitted))
        assert before["rms_log_error"] > 0.2 and after["rms_log_error"] < 0.04, (before, after)
        assert before["best_picked"] < 0.8 and after["best_picked"] >= 0.9, (before, after)
        assert before["regret_max"] > 1.04 and after["regret_geomean"] < 1.005 and after["regret_max"] < 1.03
        assert after["pairs_right"] > max(0.97, before["pairs_right"])
        assert cal.loss(part, cal.predict(part, H200, fitted), 1.0) < cal.loss(
            part, cal.predict(part, H200, start), 1.0
        )
    # rates that no longer bind may wander (mma_flops_per_clk above the peak leaves the peak to
    # decide); those the times pin come back
    assert fitted.launch_clk == pytest.approx(2600, rel=0.05)
    assert fitted.dram_read_bytes_per_clk == pytest.approx(2550, rel=0.05)


def test_the_fit_leaves_rates_it_does_not_move(cal):
    plan, _ = cal.make_plan(12, 6, 2, 1, cal.MAX_WORK, H200)
    samples = _samples(cal, plan, H200_RATES)
    fitted, evals = cal.fit(samples, H200, H200_RATES, ("launch_clk", "mma_peak_flops_per_clk"), max_evals=30)
    assert fitted == H200_RATES and type(fitted.launch_clk) is int  # already at the minimum: nothing moves
    start = dataclasses.replace(H200_RATES, launch_clk=2000)
    moved, _ = cal.fit(samples, H200, start, ("launch_clk",), max_evals=200, prior_weight=0)
    assert moved.launch_clk == pytest.approx(2600, rel=0.01) and moved.launch_clk == cal.significant(moved.launch_clk)
    # the pull toward the start holds back a rate the times hardly see (launch_clk: these are
    # mostly not small problems)
    held_back, _ = cal.fit(samples, H200, start, ("launch_clk",), max_evals=200, prior_weight=1)
    assert 2000 <= held_back.launch_clk < moved.launch_clk


def test_metrics_and_loss_of_one_problem_by_hand(cal):
    s = cal.Sample(0, Problem(64, 64, 64), [None] * 4, np.array([10.0, 20.0, 30.0, 10.1]))
    model = np.array([12.0, 11.0, 40.0, 11.0])
    m = cal.metrics([s], [model])
    errors = np.log(model / s.us)
    assert m["rms_log_error"] == round(float(np.sqrt(np.mean(errors**2))), 4)
    # pairs more than 2% apart: (0,1) wrong, (0,2) right, (1,2) right, (3,1) wrong (a model tie), (3,2) right
    assert m["pairs"] == 5 and m["pairs_right"] == 0.6
    # the pick: the cheapest modelled, the first of a tie (index 1, 20 us against the best 10)
    assert m["best_picked"] == 0 and m["regret_geomean"] == 2.0 == m["regret_max"] and m["within_noise_picked"] == 0
    logm = np.log(model)
    short = [logm[f] - logm[w] + math.log(s.us[w] / s.us[f]) / 2 for f, w in ((0, 1), (0, 2), (1, 2), (3, 1), (3, 2))]
    want = float(np.mean(errors**2)) + 0.5 * float(np.mean(np.maximum(0, short) ** 2))
    assert cal.loss([s], [model], 0.5) == pytest.approx(want, rel=1e-12)


def test_coordinate_search_and_rounding(cal):
    target = np.array([0.3, -1.2, 2.0])
    x, fx, evals = cal.coordinate_search(
        lambda x: float(np.sum((x - target) ** 2)), np.zeros(3), -np.ones(3), np.ones(3)
    )
    assert np.allclose(x, [0.3, -1.0, 1.0], atol=0.01) and evals < cal.MAX_EVALS  # the box holds
    assert cal.coordinate_search(lambda x: float(np.sum(x**2)), np.ones(2), -np.ones(2), np.ones(2), 7)[2] == 7
    assert [cal.significant(v) for v in (3187.4, 1.5234, 16.0, 0.012345, 99.96)] == [3190, 1.52, 16, 0.0123, 100]


def test_the_held_out_split_is_by_problem_and_seeded(cal):
    samples = [cal.Sample(i, None, [], np.ones(2)) for i in range(20)]
    train, held = cal.split(samples, 0.25, 3)
    assert len(held) == 5 and sorted(s.index for s in train + held) == list(range(20))
    assert [s.index for s in held] == [s.index for s in cal.split(samples[::-1], 0.25, 3)[1]]
    assert [s.index for s in held] != [s.index for s in cal.split(samples, 0.25, 4)[1]]
    assert len(cal.split(samples[:2], 0.9, 0)[0]) == 1  # one problem always trains


# ---- the command line
def test_defaults_and_smoke(cal):
    args = cal.parse_args(["measure"])
    assert (args.count, args.top, args.random, args.rounds, args.budget_s, args.max_work) == (300, 4, 3, 5, 300, 5e11)
    assert not args.seed_given and isinstance(args.seed, int) and args.jobs >= 1
    smoke = cal.parse_args(["measure", "--smoke", "--seed", "2", "--top", "3"])
    assert (smoke.count, smoke.top, smoke.random, smoke.rounds, smoke.budget_s, smoke.max_work) == (
        6,
        3,
        1,
        2,
        120,
        2e10,
    )
    fit = cal.parse_args(["fit", "m.json"])
    assert (fit.held_out, fit.seed, fit.rank_weight, fit.max_evals, fit.fit) == (0.25, 0, 1.0, 600, None)


@pytest.mark.parametrize(
    "bad",
    [
        [],
        ["measure", "--count", "0"],
        ["measure", "--rounds", "0"],
        ["measure", "--random", "-1"],
        ["measure", "--budget-s", "0"],
        ["measure", "--max-work", "1e6"],
        ["measure", "--arch", "sm_80"],
        ["fit"],
        ["fit", "m.json", "--held-out", "1"],
    ],
)
def test_bad_arguments(cal, bad):
    with pytest.raises(SystemExit):
        cal.parse_args(bad)


def _script(*args, cwd=None):
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "calibrate.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=child_pythonpath()),
    )


def test_help():
    top = _script("--help")
    assert top.returncode == 0 and "measure" in top.stdout and "fit" in top.stdout
    measure = _script("measure", "--help")
    assert measure.returncode == 0 and all(f in measure.stdout for f in ("--budget-s", "--smoke", "--list"))
    fit = _script("fit", "--help")
    assert fit.returncode == 0 and all(f in fit.stdout for f in ("--held-out", "--rank-weight", "--dry-run"))


def test_list_needs_no_gpu(cal, capsys):
    assert cal.main(["measure", "--list", "--smoke", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("seed 3: 6 problems") and "for sm_90a-132; estimated" in out
    assert sum(line.startswith("#") for line in out.splitlines()) == 6
    assert sum(line.strip().startswith(("model", "random")) for line in out.splitlines()) == 18
    assert cal.main(["measure", "--list", "--smoke", "--seed", "3", "--arch", "sm_100a"]) == 0
    assert "for sm_100a-148" in capsys.readouterr().out


def test_simulated_measurements_then_the_fit(tmp_path):
    # the whole path on the CPU: --simulate writes the measurement file the GPU run would (times
    # from the cost model), fit writes a calibration file jitgemm loads, marked not measured
    measured = tmp_path / "m.json"
    run = _script("measure", "--simulate", "--smoke", "--seed", "5", "--count", "10", "--out", measured)
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(measured.read_text())
    assert data["format"] == "jitgemm-calibration-measurements" and data["simulated"] and data["complete"]
    assert data["kind"] == "sm_90a-132" and data["rates"] == dataclasses.asdict(H200_RATES)
    assert len(data["problems"]) == 10 and all(
        c["passed"] and c["us"] > 0 for r in data["problems"] for c in r["candidates"]
    )
    assert {"date", "git_commit", "gpu_before", "gpu_after", "seed", "command"} <= set(data)

    out = tmp_path / "calibration" / "sm_90a-132.json"
    out.parent.mkdir()
    dry = _script("fit", measured, "--out", out, "--max-evals", "40", "--dry-run")
    assert dry.returncode == 0 and "not written" in dry.stdout and not out.exists()
    done = _script("fit", measured, "--out", out, "--max-evals", "40", "--fit", "launch_clk,dram_latency_clk")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fitted, held out" in done.stdout and f"wrote {out}" in done.stdout
    cal_file = load_calibration(out)
    assert not cal_file.measured and cal_file.kind == "sm_90a-132"
    prov = cal_file.provenance
    assert prov["script"] == "examples/calibrate.py" and prov["gpu"] == "simulated (the cost model)"
    assert prov["measurements"]["sha256"] == hashlib.sha256(measured.read_bytes()).hexdigest()
    assert prov["measurements"]["simulated"] and prov["fit"]["fitted"] == ["launch_clk", "dram_latency_clk"]
    for part in ("train", "held_out"):
        assert prov["fit"][part]["problems"] > 0 and prov["fit"]["start"][part]["rms_log_error"] >= 0
    held = [n for n in RATE_NAMES if n not in ("launch_clk", "dram_latency_clk")]
    assert all(getattr(cal_file.rates, n) == getattr(H200_RATES, n) for n in held)


def test_fit_refuses_what_it_cannot_use(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    done = _script("fit", other)
    assert done.returncode != 0 and "not a measurement file" in done.stderr
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"format": "jitgemm-calibration-measurements", "schema": 1, "arch": "sm_90a",
                                 "num_sms": 132, "kind": "sm_90a-132", "problems": []}))  # fmt: skip
    done = _script("fit", empty, "--dry-run")
    assert done.returncode != 0 and "a fit needs at least 2" in done.stderr
    done = _script("fit", empty, "--fit", "warp_speed")
    assert done.returncode != 0 and "unknown rates ['warp_speed']" in done.stderr


def test_several_measurement_files_fit_together(tmp_path):
    first, second, other = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    for path, seed, arch in ((first, "7", "sm_90a"), (second, "8", "sm_90a"), (other, "9", "sm_100a")):
        made = _script(
            "measure", "--simulate", "--smoke", "--seed", seed, "--count", "5", "--arch", arch, "--out", path
        )
        assert made.returncode == 0, made.stderr
    out = tmp_path / "sm_90a-132.json"
    done = _script("fit", first, second, "--out", out, "--max-evals", "30", "--fit", "launch_clk")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "10 problems" in done.stdout
    prov = load_calibration(out).provenance
    assert [m["file"] for m in prov["measurements"]] == ["a.json", "b.json"]
    assert [m["problems"] for m in prov["measurements"]] == [5, 5]
    assert prov["measurements"][1]["sha256"] == hashlib.sha256(second.read_bytes()).hexdigest()
    mixed = _script("fit", first, other, "--dry-run")
    assert mixed.returncode != 0 and "Traceback" not in mixed.stderr
    assert str(other) in mixed.stderr and "sm_100a-148" in mixed.stderr


def test_fit_refuses_an_out_file_jitgemm_would_not_find_before_fitting(tmp_path):
    measured = tmp_path / "m.json"
    assert _script("measure", "--simulate", "--smoke", "--seed", "6", "--count", "4", "--out", measured).returncode == 0
    for flags in ((), ("--dry-run",)):
        done = _script("fit", measured, "--out", tmp_path / "h100fit.json", "--max-evals", "40", *flags)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert "--out" in done.stderr and "named sm_90a-132.json" in done.stderr
        assert "evaluations" not in done.stdout and not (tmp_path / "h100fit.json").exists()


def test_a_fitted_file_round_trips_through_the_loader(cal):
    data = copy.deepcopy(shipped())
    data["rates"] = dataclasses.asdict(dataclasses.replace(H200_RATES, launch_clk=cal.significant(2612.7)))
    assert parse_calibration(data, "x/sm_90a-132.json", "sm_90a-132").rates.launch_clk == 2610


# ---- the measuring run, its GPU parts stood in for by NumPy
class FakeTensor(np.ndarray):
    """A NumPy array with the few torch tensor methods the run calls."""

    def clone(self):
        return self.copy().view(FakeTensor)

    def copy_(self, other):
        self[...] = other
        return self

    def fill_(self, value):
        self[...] = value
        return self


class FakeGraph:
    def __init__(self, fn, copies, calls):
        self.fn, self.copies, self.calls = fn, copies, calls

    def replay(self):
        for i in range(self.calls):
            self.fn(*self.copies[i % len(self.copies)])


class FakeGPU:
    """Stands in for sweep.Sweep's parts (torch, jitgemm, benchmark): gemm in float32 NumPy,
    graphs replayed on the host, made-up times. A config in `wrong`
    computes garbage, one in `broken` raises."""

    L2_DEFEAT_BYTES, CALLS_PER_GRAPH = 1, 4
    __version__ = "fake"

    def __init__(self, sweep, wrong=(), broken=()):
        self.sweep, self.wrong, self.broken = sweep, set(wrong), set(broken)
        self.bm, self.jitgemm, self.torch = self, self, self
        self.cuda = self
        self.rng = np.random.default_rng(0)
        self.timed: list = []

    # torch
    def Generator(self, device):
        return self

    def manual_seed(self, seed):
        return self

    def synchronize(self):
        pass

    def empty_cache(self):
        pass

    # sweep.Sweep
    def operand(self, rows, cols, dtype, transposed, gen):
        return self.rng.standard_normal((rows, cols), dtype=np.float32).view(FakeTensor)

    def nan(self, p, dtype):
        return np.full((p.m, p.n), np.nan, dtype=np.float32).view(FakeTensor)

    def errors(self, outs, a, b, c=None, calls=1):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        c64 = None if c is None else c.astype(np.float64)
        return [
            self.sweep.error_ratio(
                np.asarray(got, np.float64), a64 @ b64, abs(a64) @ abs(b64), a.shape[1], odt, c64, 0.5, calls
            )
            for got, odt in outs
        ]

    # jitgemm
    def gemm(self, a, b, out, c=None, beta=1.0, config=None):
        if config.name in self.broken:
            raise RuntimeError(f"{config.name} cannot launch")
        result = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
        if c is not None:
            result = result + beta * np.asarray(c, np.float64)
        out[...] = result + (1.0 if config.name in self.wrong else 0.0)

    # benchmark
    def graph_of(self, fn, copies):
        for i in range(3):
            fn(*copies[i % len(copies)])
        return FakeGraph(fn, copies, self.CALLS_PER_GRAPH)

    def time_graph(self, graph):  # (the replay after the rounds is checked: not these)
        self.timed.append(graph)
        return 1.0 + len(self.timed) % 3

    def gpu_state(self):
        return {"name": "a fake GPU", "clocks.sm": "1980 MHz"}


def test_the_measuring_run_checks_times_and_writes_on_a_stand_in_gpu(cal, tmp_path, monkeypatch):
    plan, _ = cal.make_plan(21, 6, 2, 1, 2e8, H200)
    wrong, broken = plan[0].candidates[1]["config"].name, plan[1].candidates[0]["config"].name
    uncompiled = plan[2].candidates[0]["config"]
    fake = FakeGPU(cal.sweep, wrong=[wrong], broken=[broken])
    built = []

    def build(cfg):
        built.append(cfg)
        if cfg == uncompiled:
            raise RuntimeError("NVRTC says no")

    monkeypatch.setattr(cal.kernels, "build", build)
    real = cal.Measurer
    monkeypatch.setattr(cal, "Measurer", lambda seed, rounds: real(seed, rounds, sw=fake))
    from jitgemm import api

    monkeypatch.setattr(api, "device_spec", lambda ordinal: H200)
    out = tmp_path / "m.json"
    status = cal.main(["measure", "--seed", "21", "--count", "6", "--top", "2", "--random", "1", "--rounds", "3",
                       "--max-work", "2e8", "--jobs", "2", "--out", str(out)])  # fmt: skip
    assert status == 1  # some candidates failed, loudly
    data = json.loads(out.read_text())
    assert data["complete"] and not data["simulated"] and data["gpu_before"]["name"] == "a fake GPU"
    assert set(built) == set(cal.distinct_kernels(plan))
    rows = data["problems"]
    assert [r["index"] for r in rows] == list(range(6))
    for item, row in zip(plan, rows):
        assert [c["name"] for c in row["candidates"]] == [c["config"].name for c in item.candidates]
        for cand in row["candidates"]:
            if cand["name"] == wrong:
                assert not cand["passed"] and "error ratio" in cand["failure"] and cand["error"] > 1
            elif cand["name"] == broken:
                assert not cand["passed"] and "cannot launch" in cand["failure"]
            elif cand["name"] == uncompiled.name:
                assert not cand["passed"] and cand["failure"].startswith("compile: RuntimeError: NVRTC says no")
            else:
                assert cand["passed"] and cand["error"] <= 1 and cand["graph_error"] <= 1, cand
                assert len(cand["rounds_us"]) == 3 and cand["us"] == statistics.median(cand["rounds_us"])
    # the fit reads what passed
    header, samples = cal.read_measurements(out)
    assert header["kind"] == "sm_90a-132" and sum(len(s.us) for s in samples) == sum(
        c["passed"] for r in rows for c in r["candidates"]
    )


def test_the_measuring_run_keeps_to_its_budget(cal, tmp_path, monkeypatch):
    fake = FakeGPU(cal.sweep)
    monkeypatch.setattr(cal.kernels, "build", lambda cfg: None)
    real = cal.Measurer
    monkeypatch.setattr(cal, "Measurer", lambda seed, rounds: real(seed, rounds, sw=fake))
    from jitgemm import api

    monkeypatch.setattr(api, "device_spec", lambda ordinal: H200)
    # 10 s a timed graph: 3 candidates x 2 rounds, 60 s a problem; the third starts at 120 s
    monkeypatch.setattr(cal.time, "monotonic", lambda: 10.0 * len(fake.timed))
    out = tmp_path / "m.json"
    assert (
        cal.main(["measure", "--smoke", "--seed", "2", "--budget-s", "120", "--max-work", "2e8", "--out", str(out)])
        == 0
    )
    data = json.loads(out.read_text())
    assert not data["complete"] and len(data["problems"]) == 3 and data["budget_s"] == 120
