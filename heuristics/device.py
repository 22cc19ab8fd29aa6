"""What selection knows about a GPU: `DeviceSpec` (arch, SM count, shared memory per CTA) and the
rates the cost models compare candidates with (`ArchRates`), kept as data per device kind.

A device kind is an arch and an SM count (`device_kind`, e.g. "sm_90a-132", the H200). Its rates
are the file heuristics/calibration/<kind>.json (`Calibration`: the rates and where they came
from), written by examples/calibrate.py from measurements of that kind, or by hand; a kind
without a file takes its arch's default kind's (`DEFAULT_KINDS`; `DeviceSpec.rates_source` says
which, and `explain` reports it). A file is loaded once and checked (`parse_calibration`:
unknown or missing rates, values that are not positive numbers: `CalibrationError`).
How the rates are calibrated: heuristics/RATES.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

from jitgemm import registry


@dataclass(frozen=True)
class ArchRates:
    """Per-SM, per-clock rates of one device kind, used to *compare* candidates: clock cycles at
    `clock_ghz`, for 16-bit inputs. The values live in heuristics/calibration/<kind>.json."""

    # What each rate means, the H200 measurements that fixed it and how: heuristics/RATES.md.
    mma_flops_per_clk: float  # dense 16-bit tensor-core FLOPs per SM per clock, all SMs busy
    mma_peak_flops_per_clk: float  # ... with few SMs busy (the clock credit, see cost.mma_rate)
    smem_bytes_per_clk: float  # shared-memory bandwidth per SM
    l2_sm_bytes_per_clk: float  # L2 -> one SM ingress
    l2_total_bytes_per_clk: float  # L2 -> all SMs
    l2_delivery_bytes_per_clk: float  # bytes landing in all SMs' shared memory (multicast counts per CTA)
    l2_shared_wave_gain: float  # both L2 rates, in one wave of tiles sharing their operands
    hbm_bytes_per_clk: float  # DRAM copy bandwidth
    dram_read_bytes_per_clk: float  # DRAM read-only streaming
    dram_latency_clk: float  # loaded DRAM round trip the stages in flight must cover
    dram_run_overhead_bytes: float  # DRAM efficiency of a contiguous run: run / (run + this)
    load_latency_clk: float  # TMA load round trip under load the pipeline must cover
    launch_clk: float  # per launch: launch, ramp, first load, drain
    clock_ghz: float  # sustained SM clock the per-clock rates are quoted at


RATE_NAMES = tuple(f.name for f in fields(ArchRates))

CALIBRATION_DIR = Path(__file__).resolve().parent / "calibration"
CALIBRATION_SCHEMA = 1
CALIBRATION_KEYS = ("schema", "kind", "measured", "rates", "provenance")
# What a file says of where its rates came from (null where it does not apply).
PROVENANCE_KEYS = ("gpu", "date", "commit", "script", "measurements", "fit")
# The kind whose file serves the arch's other kinds: its backend's default SM count (a test checks).
DEFAULT_KINDS = {"sm_90a": "sm_90a-132", "sm_100a": "sm_100a-148"}


class CalibrationError(ValueError):
    """A calibration file that cannot be used: unreadable, or not the format `parse_calibration` checks."""


def device_kind(arch: str, num_sms: int) -> str:
    """The name of a device kind, e.g. "sm_90a-132": what a calibration file is named after."""
    return f"{arch}-{num_sms}"


@dataclass(frozen=True)
class Calibration:
    """The rates of one device kind and where they came from (one file of heuristics/calibration/)."""

    kind: str
    rates: ArchRates
    measured: bool  # False: placeholders, not fitted to measurements of this kind
    provenance: dict = field(compare=False, hash=False)
    path: Path = field(compare=False, hash=False)

    def describe(self) -> str:
        """The file and its provenance in a few words, e.g. 'sm_90a-132.json (measured: NVIDIA H200, 2026-11-30)'."""
        if not self.measured:
            return f"{self.path.name} (not measured: placeholders)"
        where = ", ".join(str(self.provenance[k]) for k in ("gpu", "date") if self.provenance.get(k))
        return f"{self.path.name} (measured{': ' + where if where else ''})"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _name_problems(found: dict, names, what: str, known: str = "") -> list[str]:
    """What `found` holds beyond `names` and lacks of them, worded for `what` ("keys", "rates";
    `known` follows the unknown ones)."""
    problems = []
    unknown = sorted(set(found) - set(names))
    missing = [k for k in names if k not in found]
    if unknown:
        problems.append(f"unknown {what} {unknown}{known}")
    if missing:
        problems.append(f"missing {what} {missing}")
    return problems


def parse_calibration(data, where: str, kind: str | None = None) -> Calibration:
    """The `Calibration` in `data` (a calibration file's JSON), read from `where`; `kind`: the
    kind its file name says. CalibrationError naming `where` and every problem found: keys other
    than CALIBRATION_KEYS, another schema, a kind that is not "<known arch>-<SM count>" or not
    the file's, rates not exactly ArchRates' fields, a rate that is not a finite number > 0, a
    provenance without PROVENANCE_KEYS."""
    if not isinstance(data, dict):
        raise CalibrationError(f"{where}: a calibration file holds a JSON object, not {type(data).__name__}")
    problems = _name_problems(data, CALIBRATION_KEYS, "keys")
    if "schema" in data and data["schema"] != CALIBRATION_SCHEMA:
        problems.append(f"schema {data['schema']!r}, this jitgemm reads schema {CALIBRATION_SCHEMA}")
    got_kind = data.get("kind")
    arch, _, sms = str(got_kind).rpartition("-")
    if "kind" in data and not (isinstance(got_kind, str) and arch in registry.ARCH_NAMES and sms.isdigit()):
        problems.append(f"kind {got_kind!r} is not '<arch>-<SM count>' of a known arch {list(registry.ARCH_NAMES)}")
    elif kind is not None and "kind" in data and got_kind != kind:
        problems.append(f"kind {got_kind!r} in a file named for {kind!r}")
    if "measured" in data and not isinstance(data["measured"], bool):
        problems.append(f"measured must be true or false, not {data['measured']!r}")
    rates = data.get("rates")
    if "rates" in data and not isinstance(rates, dict):
        problems.append(f"rates must be an object of {list(RATE_NAMES)}")
    elif isinstance(rates, dict):
        problems += _name_problems(rates, RATE_NAMES, "rates", f" (ArchRates has {list(RATE_NAMES)})")
        for name in RATE_NAMES:
            value = rates.get(name)
            if name in rates and not (_is_number(value) and math.isfinite(value) and value > 0):
                problems.append(f"rate {name} must be a finite number > 0, not {value!r}")
    provenance = data.get("provenance")
    if "provenance" in data and not isinstance(provenance, dict):
        problems.append("provenance must be an object")
    elif isinstance(provenance, dict):
        missing = [k for k in PROVENANCE_KEYS if k not in provenance]
        if missing:
            problems.append(f"provenance lacks {missing} (null where it does not apply)")
    if problems:
        raise CalibrationError(f"{where}: " + "; ".join(problems))
    return Calibration(
        data["kind"], ArchRates(**{k: rates[k] for k in RATE_NAMES}), data["measured"], provenance, Path(where)
    )


def load_calibration(path: Path | str) -> Calibration:
    """The calibration file at `path` (`parse_calibration`; its name gives its kind)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CalibrationError(f"{path}: cannot read a calibration file: {exc}") from None
    return parse_calibration(data, str(path), path.stem)


@functools.cache
def calibration_of(kind: str) -> Calibration | None:
    """The calibration file of device kind `kind` (loaded once), or None when there is none."""
    path = CALIBRATION_DIR / f"{kind}.json"
    return load_calibration(path) if path.is_file() else None


def default_calibration(arch: str) -> Calibration:
    """The calibration of `arch`'s default kind (`DEFAULT_KINDS`). ValueError for an arch without one."""
    kind = DEFAULT_KINDS.get(arch)
    found = calibration_of(kind) if kind else None
    if found is None:
        raise ValueError(f"no calibration for {arch}: {CALIBRATION_DIR} has no {kind or arch + '-<SMs>'}.json")
    return found


def calibration_for(arch: str, num_sms: int) -> tuple[Calibration, bool]:
    """(the calibration a device of `arch` with `num_sms` SMs is costed with, whether it is its
    own kind's): its kind's file, else its arch's default kind's (`default_calibration`)."""
    own = calibration_of(device_kind(arch, num_sms))
    return (own, True) if own is not None else (default_calibration(arch), False)


def arch_rates(arch: str) -> ArchRates:
    """The rates of `arch`'s default kind (each arch's rules hold them as `RATES`)."""
    return default_calibration(arch).rates


# Rates tried in place of a kind's own (`costing_with`): kind -> ArchRates.
_trial_rates: dict[str, ArchRates] = {}


@contextlib.contextmanager
def costing_with(device: DeviceSpec, rates: ArchRates) -> Iterator[None]:
    """Cost `device` at `rates` inside the block (the calibration fit tries rates with the cost
    models as they stand): `device.rates` answers them, and so does its arch rules' `RATES`
    (which the sm_90a model reads). Memoised selections (`heuristics.select`, an arch's tables of
    staged layouts) are not redone: inside, cost single configs (the arch's `cost_of`)."""
    rules = registry.get(device.arch).rules
    saved, saved_trial = rules.RATES, _trial_rates.get(device.kind)
    rules.RATES, _trial_rates[device.kind] = rates, rates
    try:
        yield
    finally:
        rules.RATES = saved
        if saved_trial is None:
            _trial_rates.pop(device.kind, None)
        else:
            _trial_rates[device.kind] = saved_trial


@dataclass(frozen=True)
class DeviceSpec:
    """What selection needs to know about a GPU; built from a live device or from CLI flags."""

    arch: str = "sm_90a"
    num_sms: int = 132

    def __post_init__(self):
        # The arch is checked by `select` (which names the supported ones), not here.
        if not isinstance(self.num_sms, int) or self.num_sms < 1:
            raise ValueError(f"DeviceSpec.num_sms must be a positive int, got {self.num_sms!r}")

    @property
    def smem_capacity(self) -> int:
        """Dynamic shared memory one CTA may request (bytes): what the arch's layouts are sized against."""
        return _smem_capacity(self.arch)

    @property
    def kind(self) -> str:
        """The device kind, e.g. "sm_90a-132" (`device_kind`): what calibration files are named after."""
        return device_kind(self.arch, self.num_sms)

    @property
    def rates(self) -> ArchRates:
        """The rates of this device kind: its calibration file's, else its arch's default kind's."""
        if _trial_rates:
            trial = _trial_rates.get(self.kind)
            if trial is not None:
                return trial
        return calibration_for(self.arch, self.num_sms)[0].rates

    @property
    def rates_source(self) -> str:
        """Where `rates` come from, in words (what `explain` reports as "rates")."""
        found, own = calibration_for(self.arch, self.num_sms)
        text = found.describe()
        return text if own else f"{text}, the {self.arch} default: no calibration file for {self.kind}"


@functools.cache
def _smem_capacity(arch: str) -> int:
    """`DeviceSpec.smem_capacity` (memoised: a first selection asks a few hundred times)."""
    return registry.get(arch).smem_capacity
