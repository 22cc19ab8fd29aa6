"""Score the sm_90a cost model's picks against measured candidates, offline (issue 19): how far a
change of a rate or of a model constant moves the model's choices among the candidates that
`examples/calibrate.py measure` timed on a GPU, before any GPU time is spent on it.

    python examples/model_regret.py [FILE ...] [--rates CALIBRATION] [--set NAME=VALUE ...] [--halves]

FILE: measurement files of `calibrate.py measure` (default: every examples/data/calibration-*.json).
--set NAME=VALUE: score with a rate of `heuristics.device.ArchRates` (l2_total_bytes_per_clk=3800)
or an upper-case constant of the sm_90a model (L2_ROUND_TRIP_CLK=600) replaced; repeatable.
--rates CALIBRATION: every rate of a calibration file (`calibrate.py fit --out DIR/<kind>.json`
writes one), --set's on top.
Each file is scored with the model as it is, then with the replacements: per file, the geomean
regret of the model's pick (the measured time of the candidate it ranks first over the best
measured candidate of the problem) and the share of measured pairs it orders right
(`calibrate.metrics`); then, per M class (decode M <= 64, small <= 512, medium <= 2048, large),
the regret and how many picks the replacements change for the better and the worse.
--halves also scores the even- and odd-indexed problems apart, so that a change chosen on one
half can be checked on the other.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import calibrate  # noqa: E402  (examples/calibrate.py: the measurement files and metrics)

from jitgemm import heuristics  # noqa: E402
from jitgemm.heuristics import DeviceSpec, sm90  # noqa: E402
from jitgemm.heuristics.device import (  # noqa: E402
    RATE_NAMES,
    CalibrationError,
    arch_rates,
    costing_with,
    load_calibration,
)

DEVICE = DeviceSpec("sm_90a", 132)
M_CLASSES = ((64, "decode"), (512, "small"), (2048, "medium"), (None, "large"))


def m_class(m: int) -> str:
    return next(name for bound, name in M_CLASSES if bound is None or m <= bound)


def parse_settings(items: list[str]) -> tuple[dict, dict]:
    """(rate replacements, model-constant replacements) of --set NAME=VALUE items. ValueError
    naming the item for a malformed one, an unknown name or a value that is not a number."""
    rates, constants = {}, {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected NAME=VALUE")
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--set {item!r}: {text!r} is not a number") from None
        if name in RATE_NAMES:
            rates[name] = value
        elif name.isupper() and isinstance(getattr(sm90, name, None), (int, float)):
            constants[name] = type(getattr(sm90, name))(value)
        else:
            raise ValueError(f"--set {item!r}: {name!r} is neither an ArchRates field nor a numeric sm90 constant")
    return rates, constants


def _clear_memos() -> None:
    """Every memo of the sm_90a model's costs, and select's of its answers."""
    for value in [*vars(sm90).values(), heuristics.select]:
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()


@contextlib.contextmanager
def replaced(rates: dict, constants: dict):
    """The sm_90a model with `rates` and `constants` replaced, its memos cleared on the way in
    and out (they hold costs made with the old values)."""
    saved = {name: getattr(sm90, name) for name in constants}
    try:
        for name, value in constants.items():
            setattr(sm90, name, value)
        _clear_memos()
        with costing_with(DEVICE, dataclasses.replace(arch_rates(DEVICE.arch), **rates)):
            yield
    finally:
        for name, value in saved.items():
            setattr(sm90, name, value)
        _clear_memos()


def modelled(samples: list, rates: dict, constants: dict) -> list[np.ndarray]:
    """The modelled cost of every candidate of every sample, with the replacements."""
    with replaced(rates, constants):
        return [calibrate.model_cycles(s.problem, DEVICE, s.configs) for s in samples]


def geomean(values) -> float:
    return float(np.exp(np.mean(np.log(values)))) if len(values) else 1.0


def score(samples: list, rates: dict, constants: dict) -> dict:
    """The figures of one set of problems: `calibrate.metrics` before and after, and per M class
    the regrets and the picks the replacements change."""
    costs_before, costs_after = modelled(samples, {}, {}), modelled(samples, rates, constants)
    multi = [i for i, s in enumerate(samples) if len(s.us) > 1]

    def picks(costs):  # (the model's pick, its regret) per problem with several candidates
        return [(p := int(np.argmin(costs[i])), float(samples[i].us[p] / samples[i].us.min())) for i in multi]

    old, new = picks(costs_before), picks(costs_after)
    classes = {}
    for _, name in M_CLASSES:
        idx = [j for j, i in enumerate(multi) if m_class(samples[i].problem.m) == name]
        changed = [i for i in idx if old[i][0] != new[i][0]]
        classes[name] = {
            "problems": len(idx),
            "regret_before": round(geomean([old[i][1] for i in idx]), 4),
            "regret_after": round(geomean([new[i][1] for i in idx]), 4),
            "changed": len(changed),
            "better": sum(new[i][1] < old[i][1] for i in changed),
            "worse": sum(new[i][1] > old[i][1] for i in changed),
        }
    return {
        "before": calibrate.metrics(samples, costs_before),
        "after": calibrate.metrics(samples, costs_after),
        "classes": classes,
    }


def report(name: str, figures: dict) -> str:
    b, a = figures["before"], figures["after"]
    lines = [
        f"{name}: {b['problems']} problems, regret {b['regret_geomean']:.4f} -> {a['regret_geomean']:.4f}, "
        f"pairs right {b['pairs_right']:.4f} -> {a['pairs_right']:.4f}"
    ]
    for cls, c in figures["classes"].items():
        lines.append(
            f"    {cls:6s} {c['problems']:4d} problems, regret {c['regret_before']:.4f} -> {c['regret_after']:.4f}, "
            f"{c['changed']} picks changed: {c['better']} better, {c['worse']} worse"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="measurement files [examples/data/calibration-*.json]")
    ap.add_argument("--rates", type=Path, metavar="CALIBRATION", help="a calibration file's rates")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--halves", action="store_true", help="score even- and odd-indexed problems apart too")
    args = ap.parse_args(argv)
    try:
        rates, constants = parse_settings(args.settings)
        if args.rates:
            rates = {**dataclasses.asdict(load_calibration(args.rates).rates), **rates}
    except (ValueError, CalibrationError) as exc:
        ap.error(str(exc))
    files = args.files or sorted((HERE / "data").glob("calibration-*.json"))
    if not files:
        ap.error("no measurement files given or found in examples/data")
    replacing = ([f"the rates of {args.rates}"] if args.rates else []) + args.settings
    print(f"replacing: {', '.join(replacing) or 'nothing'}")
    for path in files:
        try:
            _, samples = calibrate.read_measurements(path)
        except ValueError as exc:
            ap.error(str(exc))
        print(report(path.name, score(samples, rates, constants)))
        if args.halves:
            for half in (0, 1):
                part = [s for s in samples if s.index % 2 == half]
                print(report(f"  {'even' if half == 0 else 'odd'} half", score(part, rates, constants)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
