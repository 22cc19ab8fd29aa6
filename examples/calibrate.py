"""Calibrate the cost model of one device kind (issue 19, item 3): measure many problems with
several configs each on a GPU, then fit the rates of heuristics/calibration/<kind>.json to them.

    python examples/calibrate.py measure [--out FILE] [--seed S] [--count 300] [--top 4]
                                         [--random 3] [--rounds 5] [--budget-s 300]
                                         [--max-work 5e11] [--jobs N] [--smoke] [--list] [--simulate]
    python examples/calibrate.py fit MEASUREMENTS [MEASUREMENTS ...] [--out FILE] [--held-out 0.25]
                                     [--seed 0] [--rank-weight 1] [--fit NAMES] [--max-evals 600]
                                     [--dry-run]

A device kind is an arch and an SM count (`heuristics.device.device_kind`, e.g. sm_90a-132 for
the H200): a new GPU kind is a rerun of both phases on it, not a rewrite.

measure (on the GPU; --list and --simulate need none)
  The problems (`draw`, seeded): M log-uniform in [1, 16384], N and K log-uniform in [64, 32768]
  (examples/sweep.py's draws), rounded to multiples of 8 so that no operand is copied (and M
  too for an M-major A; M = 1 is read K-major); the four layouts, bf16 and fp16, C, and an fp32
  output each an exact share, as in the sweep; a problem above --max-work FLOP-equivalents is
  redrawn. For each problem, candidates (`candidates`): the model's best --top (its choice
  first) and --random others drawn from its next best, modelled within RANDOM_WITHIN of the best
  (every candidate legal: heuristics.check_config); each is forced with gemm's config=.
  Each distinct kernel is compiled once, on --jobs threads while earlier problems are measured.
  Every candidate's result is checked (into a NaN-poisoned output, then the timed graph once
  more) against a float64 reference with the sweep's bound; its time is the median of --rounds
  replays of a CUDA graph of 20 calls rotating through input copies that defeat L2
  (examples/benchmark.py's helpers), the candidates of a problem in interleaved rounds. The
  run starts no new problem after --budget-s seconds and writes what it measured (the JSON
  file: every problem and candidate, the rates the candidates were chosen with, the GPU and
  its clocks before and after, the date, the commit). --simulate "measures" with the cost model
  at the current rates and a little seeded noise, on the CPU: the format and the fit's plumbing,
  never a calibration (its file says so).

fit (on a CPU)
  Fits the rates (all of ArchRates but clock_ghz, which only converts cycles to microseconds, and
  smem_bytes_per_clk, a hardware constant; --fit names them) to the measured times: minimises the
  mean squared log error of the modelled times, plus --rank-weight times a pairwise ranking term
  (for two candidates of one problem measured more than NOISE apart, the square of how far the
  model falls short of half the measured gap in the right order: ranking is what selection
  needs), plus a weak pull toward the starting rates (rates the data does not constrain stay);
  by coordinate search in the logarithms of the rates (`coordinate_search`). The modelled times
  come from the arch's own cost functions (`model_cycles`). The problems are split seeded,
  --held-out of them left out of the fit; the report gives, for the starting and the fitted
  rates, on the training and the held-out problems: the rms log error, the share within 25%,
  the share of pairs ordered right, how often the model's pick among the measured candidates is
  the measured best, and its regret (the measured time of the pick over the measured best).
  Writes the calibration file (rates rounded to 3 significant digits) with its provenance: the
  GPU, the dates and commits of both phases, this script, the measurement file (name, sha256)
  and the error figures. Several measurement files of one kind fit together, as one set of
  problems (their provenance is then a list, one entry a file); `examples/model_regret.py
  --rates` scores the result on a file left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import math
import os
import random
import statistics
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

import jitgemm
from jitgemm import heuristics, kernels, registry
from jitgemm import plan as planner
from jitgemm.config import KernelConfig
from jitgemm.heuristics.device import (
    CALIBRATION_DIR,
    CALIBRATION_SCHEMA,
    DEFAULT_KINDS,
    RATE_NAMES,
    ArchRates,
    CalibrationError,
    DeviceSpec,
    calibration_for,
    costing_with,
    parse_calibration,
)
from jitgemm.problem import LAYOUTS, Problem

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep  # examples/sweep.py: the problems' draws, the operands, the check, git_commit

sys.path.pop(0)

MEASUREMENT_FORMAT = "jitgemm-calibration-measurements"
MEASUREMENT_SCHEMA = 1

# ------------------------------------------------------------------------------ measure: the plan
COUNT, TOP, RANDOM, ROUNDS, BUDGET_S = 300, 4, 3, 5, 300.0
MAX_WORK = 5e11  # FLOP-equivalents of one call (sweep.work): ~1 ms on an H200
SMOKE = {"count": 6, "top": 2, "random": 1, "rounds": 2, "max_work": 2e10, "budget_s": 120.0}
POOL = 48  # the random candidates come from the model's best POOL ...
RANDOM_WITHIN = 3.0  # ... that it models within this factor of its best
WRITE_EVERY = 10  # problems between writes of the measurement file (a run cut short keeps them)
# For the estimate printed before a run (H200 guesses, not measurements): per candidate the graph
# captures, a module load and the checks' host work; per kernel an NVRTC compile on one thread.
CANDIDATE_OVERHEAD_S = 0.05
COMPILE_S = 0.3
SIM_NOISE = 0.03  # --simulate: log-normal noise on the modelled times


def draw(seed: int, count: int, max_work: float = MAX_WORK) -> tuple[list[Problem], int]:
    """`count` problems for `seed` (see the module's doc), and how many draws exceeded `max_work`."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    rng = random.Random(seed)
    layouts = sweep._shuffled(rng, [sweep.LAYOUT_NAMES[i % len(sweep.LAYOUT_NAMES)] for i in range(count)])
    dtypes = sweep._shuffled(rng, [sweep.DTYPES[i % len(sweep.DTYPES)] for i in range(count)])
    with_c = sweep._shuffled(rng, [i % 2 == 1 for i in range(count)])
    n_fp32 = round(count * sweep.FP32_FRACTION)
    fp32 = sweep._shuffled(rng, [i < n_fp32 for i in range(count)])
    problems, redraws = [], 0
    for i in range(count):
        a_major, b_major = LAYOUTS[layouts[i]]
        for _attempt in range(sweep.MAX_REDRAWS + 1):
            m = sweep.log_uniform_int(rng, *sweep.M_RANGE)
            if a_major == "M" and m > 1:  # an M-major A is read in place with rows of whole 16-byte units
                m = -(-m // 8) * 8
            n = sweep.dimension(rng, *sweep.NK_RANGE, aligned=True)
            k = sweep.dimension(rng, *sweep.NK_RANGE, aligned=True)
            p = Problem(m, n, k, dtypes[i], "fp32" if fp32[i] else dtypes[i], a_major, b_major, with_c[i])
            if sweep.work(p) <= max_work:
                break
            redraws += 1
        else:
            raise ValueError(f"max_work {max_work:g}: no problem drawn in {sweep.MAX_REDRAWS} tries fits under it")
        problems.append(p)
    return problems, redraws


def candidates(problem: Problem, device: DeviceSpec, top: int, n_random: int, rng: random.Random) -> list[dict]:
    """The configs to measure for `problem` (as the kernels see it) on `device`: the model's
    best `top` (its choice first), then `n_random` of its next best POOL that it models within
    RANDOM_WITHIN of its best, in the model's order. Each {"config", "source" ("model" or
    "random"), "model_rank", "model_us"}; every config legal for the problem."""
    ranked = heuristics.explain(problem, device, top=max(top, POOL))["candidates"]
    best = ranked[0]["cost"]
    pool = [i for i in range(top, len(ranked)) if ranked[i]["cost"] <= RANDOM_WITHIN * best]
    picked = list(range(min(top, len(ranked)))) + sorted(rng.sample(pool, min(n_random, len(pool))))
    out, seen = [], set()
    us_per_cycle = 1 / (device.rates.clock_ghz * 1e3)
    for i in picked:
        cfg = KernelConfig.from_dict(ranked[i]["config"])
        if cfg in seen or heuristics.check_config(cfg, problem, device):
            continue  # (explain's candidates are legal and distinct: never taken)
        seen.add(cfg)
        out.append(
            {
                "config": cfg,
                "source": "model" if i < top else "random",
                "model_rank": i,
                "model_us": ranked[i]["cost"] * us_per_cycle,
            }
        )
    return out


class Planned(NamedTuple):
    """One problem of a run: as drawn (the operands' layout), as the kernels see it, its candidates."""

    index: int
    problem: Problem
    kernel_problem: Problem
    candidates: list


def make_plan(seed: int, count: int, top: int, n_random: int, max_work: float, device: DeviceSpec):
    """(the Planned problems of a run, the draws redrawn above `max_work`)."""
    problems, redraws = draw(seed, count, max_work)
    plan = []
    for index, p in enumerate(problems):
        kp = sweep.kernel_problem(p)
        rng = random.Random(seed * 1_000_003 + index)
        plan.append(Planned(index, p, kp, candidates(kp, device, top, n_random, rng)))
    return plan, redraws


def estimated_seconds(plan: list[Planned], rounds: int, calls_per_graph: int = 20) -> float:
    """A rough H200 estimate of a run's measuring time, compiles excluded (they overlap it): per
    candidate its modelled time for every call (warm-up, check, rounds, graph check) and
    CANDIDATE_OVERHEAD_S; per problem the float64 references and sweep's per-problem overhead."""
    calls = 3 + 1 + rounds * calls_per_graph + calls_per_graph
    total = 0.0
    for item in plan:
        total += sweep.EST_OVERHEAD_S + 4 * item.problem.flops / sweep.EST_FP64_FLOPS
        total += sum(calls * c["model_us"] * 1e-6 + CANDIDATE_OVERHEAD_S for c in item.candidates)
    return total


def distinct_kernels(plan: list[Planned]) -> list[KernelConfig]:
    """The kernels a plan runs, in the order its problems first need them (gemm's epilogue rule applied)."""
    found: dict = {}
    for item in plan:
        for c in item.candidates:
            found.setdefault(planner.with_epilogue(c["config"], item.kernel_problem), None)
    return list(found)


def listing(plan: list[Planned]) -> str:
    lines = []
    for item in plan:
        p = item.problem
        lines.append(
            f"#{item.index:<4} {p.dtype}->{p.out_dtype:4} {p.layout} {'C' if p.has_c else ' '} M={p.m:>5} "
            f"N={p.n:>5} K={p.k:>5}  {sweep.work(p) / 1e9:9.1f} GFLOP-eq"
        )
        for c in item.candidates:
            lines.append(f"        {c['source']:6} #{c['model_rank']:<3} {c['model_us']:9.2f} us  {c['config'].name}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ measure: the run
def candidate_row(c: dict) -> dict:
    return {
        "config": c["config"].to_dict(),
        "name": c["config"].name,
        "source": c["source"],
        "model_rank": c["model_rank"],
        "model_us": c["model_us"],
        "passed": False,
    }


def problem_row(item: Planned) -> dict:
    return {
        **sweep.problem_fields(item.index, item.problem),
        "kernel_problem": {f.name: getattr(item.kernel_problem, f.name) for f in dataclasses.fields(Problem)},
        "candidates": [candidate_row(c) for c in item.candidates],
    }


class Simulated:
    """--simulate: the times the cost model gives at the device's rates, with seeded noise."""

    def __init__(self, seed: int, device: DeviceSpec):
        self.seed, self.device = seed, device

    def gpu_state(self) -> dict:
        return {"name": "simulated (the cost model)"}

    def measure(self, item: Planned, failed: dict) -> dict:
        row = problem_row(item)
        rng = random.Random(self.seed * 1_000_003 + item.index)
        us = model_us_of(item.kernel_problem, self.device, [c["config"] for c in item.candidates], self.device.rates)
        for cand, t in zip(row["candidates"], us):
            t = float(t) * math.exp(rng.gauss(0.0, SIM_NOISE))
            cand.update(us=t, rounds_us=[t], error=0.0, graph_error=0.0, passed=True)
        return row


class Measurer:
    """The GPU run: torch, jitgemm, examples/sweep.py's operands and check, examples/benchmark.py's timing."""

    def __init__(self, seed: int, rounds: int, sw=None):
        # sweep.Sweep imports torch, jitgemm and benchmark (`sw`: a stand-in with the same parts, for tests)
        self.sw = sw or sweep.Sweep(argparse.Namespace(seed=seed, rounds=rounds))
        self.bm, self.torch, self.jitgemm = self.sw.bm, self.sw.torch, self.sw.jitgemm
        self.seed, self.rounds = seed, rounds

    def gpu_state(self) -> dict:
        return self.bm.gpu_state()

    def call(self, cfg: KernelConfig, p: Problem):
        """The timed call of a copy (a, b, output): in place on C where the problem has C."""
        gemm = self.jitgemm.gemm
        if p.has_c:
            return lambda a, b, c: gemm(a, b, out=c, c=c, beta=sweep.BETA, config=cfg)
        return lambda a, b, o: gemm(a, b, out=o, config=cfg)

    def measure(self, item: Planned, failed: dict) -> dict:
        """The row of one problem: each candidate checked, timed, and its timed graph checked.
        `failed`: kernel config -> why it did not compile (those are not run)."""
        torch, bm, sw = self.torch, self.bm, self.sw
        p, row = item.problem, problem_row(item)
        cands = row["candidates"]
        gen = torch.Generator(device="cuda").manual_seed(self.seed * 1_000_003 + item.index)
        n_copies = sweep.rotating_copies(p, bm.L2_DEFEAT_BYTES)
        row["rotating_copies"] = n_copies
        copies = []
        for _ in range(n_copies):
            a = sw.operand(p.m, p.k, p.dtype, p.a_major == "M", gen)
            b = sw.operand(p.k, p.n, p.dtype, p.b_major == "K", gen)
            o = sw.operand(p.m, p.n, p.out_dtype, False, gen) if p.has_c else sw.nan(p, p.out_dtype)
            copies.append((a, b, o))
        a0, b0, o0 = copies[0]
        c0 = o0.clone() if p.has_c else None

        # the check: every candidate into a NaN-poisoned output, against one float64 reference
        live, outs = [], []
        for i, c in enumerate(item.candidates):
            why = failed.get(planner.with_epilogue(c["config"], item.kernel_problem))
            if why:
                cands[i]["failure"] = why
                continue
            try:
                got = sw.nan(p, p.out_dtype)
                self.jitgemm.gemm(a0, b0, out=got, c=c0, beta=sweep.BETA if p.has_c else 1.0, config=c["config"])
                outs.append((got, p.out_dtype))
                live.append(i)
            except Exception as exc:  # a run goes on: the candidate fails loudly
                cands[i]["failure"] = f"{type(exc).__name__}: {exc}"
        torch.cuda.synchronize()
        passed = []
        for i, err in zip(live, sw.errors(outs, a0, b0, c0) if outs else []):
            cands[i]["error"] = err
            if err <= 1.0:
                passed.append(i)
            else:
                cands[i]["failure"] = f"the result is off: error ratio {err:.3g} > 1"
        del outs

        # the timing: interleaved rounds over the candidates, the first one rotating
        graphs, times = {}, {}
        for i in passed:
            try:
                graphs[i] = bm.graph_of(self.call(item.candidates[i]["config"], p), copies)
                times[i] = []
            except Exception as exc:
                cands[i]["failure"] = f"capture: {type(exc).__name__}: {exc}"
        order = list(graphs)
        for r in range(self.rounds if order else 0):
            first = r % len(order)
            for i in order[first:] + order[:first]:
                times[i].append(bm.time_graph(graphs[i]))

        # the graphs that were timed compute the GEMM: poison (or restore) the first copy, replay
        outs = []
        for i in order:
            if p.has_c:
                o0.copy_(c0)
            else:
                o0.fill_(float("nan"))
            graphs[i].replay()
            outs.append((o0.clone(), p.out_dtype))
        torch.cuda.synchronize()
        calls = sweep.calls_on_first_copy(bm.CALLS_PER_GRAPH, n_copies)
        for i, err in zip(order, sw.errors(outs, a0, b0, c0, calls) if outs else []):
            cands[i].update(graph_error=err, us=statistics.median(times[i]), rounds_us=times[i], passed=err <= 1.0)
            if err > 1.0:
                cands[i]["failure"] = f"the timed graph is off: error ratio {err:.3g} > 1"
        del graphs, copies, outs
        if n_copies == 2:
            torch.cuda.empty_cache()  # a big problem: give its memory back before the next
        return row


def _build(cfg: KernelConfig) -> None:
    kernels.build(cfg)


def _write(path: Path, result: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)


def run_measure(args) -> int:
    if args.simulate or args.list:
        device = DeviceSpec(args.arch, args.num_sms)
    else:
        from jitgemm import api  # (the local GPU's spec: only a run on the GPU asks)

        device = api.device_spec(0)
    plan, redraws = make_plan(args.seed, args.count, args.top, args.random, args.max_work, device)
    kernels_needed = distinct_kernels(plan)
    est = estimated_seconds(plan, args.rounds)
    print(
        f"seed {args.seed}{'' if args.seed_given else ' (drawn; pass --seed to repeat)'}: {len(plan)} problems "
        f"({redraws} draws redrawn above {args.max_work:.3g} FLOP-equivalents), "
        f"{sum(len(i.candidates) for i in plan)} candidates, {len(kernels_needed)} kernels for {device.kind}; "
        f"estimated {est:.0f} s of measuring on an H200 (budget {args.budget_s:g} s) and "
        f"{len(kernels_needed) * COMPILE_S / args.jobs:.0f} s of compiling on {args.jobs} threads, overlapped",
        flush=True,
    )
    if args.list:
        print(listing(plan))
        return 0
    meter = Simulated(args.seed, device) if args.simulate else Measurer(args.seed, args.rounds)
    out = Path(args.out or f"calibration-{device.kind}-{datetime.date.today():%Y%m%d}.json")
    commit, dirty = sweep.git_commit()
    result = {
        "format": MEASUREMENT_FORMAT,
        "schema": MEASUREMENT_SCHEMA,
        "kind": device.kind,
        "arch": device.arch,
        "num_sms": device.num_sms,
        "simulated": bool(args.simulate),
        "command": " ".join(["python", "examples/calibrate.py", *args.argv]),
        "seed": args.seed,
        "count": args.count,
        "top": args.top,
        "random": args.random,
        "rounds": args.rounds,
        "max_work": args.max_work,
        "budget_s": args.budget_s,
        "calls_per_graph": 20 if args.simulate else meter.bm.CALLS_PER_GRAPH,
        "l2_defeat_bytes": 512 << 20 if args.simulate else meter.bm.L2_DEFEAT_BYTES,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "jitgemm_version": jitgemm.__version__,
        "torch_version": None if args.simulate else meter.torch.__version__,
        "rates": dataclasses.asdict(device.rates),
        "rates_source": device.rates_source,
        "gpu_before": meter.gpu_state(),
        "complete": False,
        "problems": [],
    }
    started = time.monotonic()
    failed: dict = {}
    pool = None if args.simulate else ThreadPoolExecutor(max_workers=args.jobs)
    builds: dict[KernelConfig, Future] = {}
    if pool is not None:
        builds = {cfg: pool.submit(_build, cfg) for cfg in kernels_needed}
    try:
        for n, item in enumerate(plan):
            if time.monotonic() - started > args.budget_s:
                print(f"--budget-s {args.budget_s:g} reached: {n} of {len(plan)} problems measured", flush=True)
                break
            for c in item.candidates:
                cfg = planner.with_epilogue(c["config"], item.kernel_problem)
                future = builds.get(cfg)
                if future is not None and cfg not in failed and future.exception() is not None:
                    exc = future.exception()
                    failed[cfg] = f"compile: {type(exc).__name__}: {exc}"
            try:
                row = meter.measure(item, failed)
            except Exception as exc:  # a run goes on: the problem fails loudly and counts
                row = {**problem_row(item), "failure": f"{type(exc).__name__}: {exc}"}
            result["problems"].append(row)
            print(f"{n + 1:>4}/{len(plan)} {describe(row)}", flush=True)
            if (n + 1) % WRITE_EVERY == 0:
                result["wall_s"] = time.monotonic() - started
                _write(out, result)
        else:
            result["complete"] = True
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    result["gpu_after"] = meter.gpu_state()
    result["wall_s"] = time.monotonic() - started
    _write(out, result)
    times = sum(c["passed"] for r in result["problems"] for c in r["candidates"])
    failures = sum(not c["passed"] for r in result["problems"] for c in r["candidates"])
    print(
        f"wrote {out}: {len(result['problems'])} problems, {times} times, {failures} candidates failed "
        f"({result['wall_s']:.0f} s; {result['gpu_before'].get('name')}, SM clock "
        f"{result['gpu_before'].get('clocks.sm')} before / {result['gpu_after'].get('clocks.sm')} after)"
    )
    print(f"next, on any machine: python examples/calibrate.py fit {out}")
    return 1 if failures else 0


def describe(row: dict) -> str:
    c = "C" if row["has_c"] else " "
    head = f"{row['dtype']}->{row['out_dtype']:4} {row['layout']} {c} M={row['m']:>5} N={row['n']:>5} K={row['k']:>5}"
    if "failure" in row:
        return f"{head}  FAILED {row['failure']}"
    parts = []
    for cand in row["candidates"]:
        parts.append(f"{cand['us']:.1f}" if cand["passed"] else "FAILED")
    model = " ".join(f"{cand['model_us']:.1f}" for cand in row["candidates"])
    failures = [f"{cand['name']}: {cand.get('failure')}" for cand in row["candidates"] if not cand["passed"]]
    return f"{head}  us {' '.join(parts)} (model {model})" + (f"  {failures}" if failures else "")


# ------------------------------------------------------------------------------ fit
FIT_HELD = ("clock_ghz", "smem_bytes_per_clk")  # not fitted by default (see the module's doc)
HELD_OUT = 0.25
RANK_WEIGHT = 1.0
PRIOR_WEIGHT = 0.01  # times the mean squared log change of the fitted rates
NOISE = 0.02  # measured times closer than this are a tie: no pair, and a pick within it is a hit
MAX_EVALS = 600
BOUND = math.log(8.0)  # a fitted rate stays within 8x of where it started
START_STEP, MIN_STEP = math.log(1.5), math.log(1.005)
SIGNIFICANT = 3  # digits of a written rate


class Sample(NamedTuple):
    """One measured problem (as the kernels see it): its candidates and their median times."""

    index: int
    problem: Problem
    configs: list
    us: np.ndarray


def read_measurements(path: Path) -> tuple[dict, list[Sample]]:
    """(the measurement file's header, its problems with at least one time passed). ValueError
    for a file that is not a measurement file of this schema."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read a measurement file: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != MEASUREMENT_FORMAT:
        raise ValueError(f"{path}: not a measurement file of examples/calibrate.py measure")
    if data.get("schema") != MEASUREMENT_SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, this script reads {MEASUREMENT_SCHEMA}")
    samples = []
    for row in data["problems"]:
        good = [c for c in row.get("candidates", ()) if c.get("passed") and c.get("us")]
        if good:
            samples.append(
                Sample(
                    row["index"],
                    Problem(**row["kernel_problem"]),
                    [KernelConfig.from_dict(c["config"]) for c in good],
                    np.array([c["us"] for c in good], dtype=float),
                )
            )
    header = {k: v for k, v in data.items() if k != "problems"}
    return header, samples


def model_cycles(problem: Problem, device: DeviceSpec, configs: list) -> np.ndarray:
    """The modelled cost (clock cycles) of each config on `problem`, by the arch's own cost
    functions at the rates in effect: sm_90a's `costs_of`, all of them at once, as its select
    costs its candidates (the same numbers as its `cost_of`); other arches' `cost_of`, one
    config at a time."""
    rules = registry.get(device.arch).rules
    if hasattr(rules, "costs_of"):
        return np.asarray(rules.costs_of(problem, device, configs), dtype=float)
    return np.array([rules.cost_of(problem, device, cfg).cost for cfg in configs], dtype=float)


def model_us_of(problem: Problem, device: DeviceSpec, configs: list, rates: ArchRates) -> np.ndarray:
    """`model_cycles` at `rates`, in microseconds."""
    with costing_with(device, rates):
        return model_cycles(problem, device, configs) / (rates.clock_ghz * 1e3)


def predict(samples: list[Sample], device: DeviceSpec, rates: ArchRates) -> list[np.ndarray]:
    """The modelled times (us) of every sample's configs at `rates`."""
    with costing_with(device, rates):
        return [model_cycles(s.problem, device, s.configs) / (rates.clock_ghz * 1e3) for s in samples]


def _pairs(us: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(faster, slower, the log of their measured ratio) of every pair measured more than NOISE apart."""
    i, j = np.triu_indices(len(us), 1)
    gap = np.log(us[j] / us[i])
    keep = np.abs(gap) > math.log1p(NOISE)
    i, j, gap = i[keep], j[keep], gap[keep]
    fast, slow = np.where(gap > 0, i, j), np.where(gap > 0, j, i)
    return fast, slow, np.abs(gap)


def loss(samples: list[Sample], predicted: list[np.ndarray], rank_weight: float) -> float:
    """Mean squared log error of the times, plus `rank_weight` times the mean over the pairs of
    one problem measured more than NOISE apart of the square of how far the model falls short
    of half their measured log gap, in the right order."""
    errors = np.concatenate([np.log(m) - np.log(s.us) for s, m in zip(samples, predicted)])
    short = []
    for s, m in zip(samples, predicted):
        fast, slow, gap = _pairs(s.us)
        logm = np.log(m)
        short.append(np.maximum(0.0, logm[fast] - logm[slow] + gap / 2))
    shortfall = np.concatenate(short) if short else np.zeros(0)
    rank = float(np.mean(shortfall**2)) if len(shortfall) else 0.0
    return float(np.mean(errors**2)) + rank_weight * rank


def metrics(samples: list[Sample], predicted: list[np.ndarray]) -> dict:
    """Error and selection figures of modelled times against measured ones (see the module's doc).
    The model's pick among a problem's candidates: the cheapest modelled, the first listed on a
    tie (the model's order)."""
    if not samples:
        return {"problems": 0}
    errors = np.concatenate([np.log(m) - np.log(s.us) for s, m in zip(samples, predicted)])
    right = total = 0
    regrets, exact = [], 0
    for s, m in zip(samples, predicted):
        fast, slow, _ = _pairs(s.us)
        right += int(np.sum(m[fast] < m[slow]))
        total += len(fast)
        if len(s.us) > 1:
            pick = int(np.argmin(m))
            regrets.append(s.us[pick] / s.us.min())
            exact += int(s.us[pick] == s.us.min())
    regrets_a = np.array(regrets) if regrets else np.ones(1)
    return {
        "problems": len(samples),
        "times": int(len(errors)),
        "rms_log_error": round(float(np.sqrt(np.mean(errors**2))), 4),
        "median_abs_error": round(float(np.expm1(np.median(np.abs(errors)))), 4),
        "within_25pct": round(float(np.mean(np.abs(np.expm1(errors)) <= 0.25)), 4),
        "pairs": total,
        "pairs_right": round(right / total, 4) if total else None,
        "best_picked": round(exact / len(regrets), 4) if regrets else None,
        "within_noise_picked": round(float(np.mean(regrets_a <= 1 + NOISE)), 4) if regrets else None,
        "regret_geomean": round(float(np.exp(np.mean(np.log(regrets_a)))), 4),
        "regret_max": round(float(regrets_a.max()), 4),
    }


def coordinate_search(f, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray, max_evals: int = MAX_EVALS) -> tuple:
    """Minimise f over the box [lo, hi] from x0 by coordinate search: each coordinate in turn is
    stepped up, then down, and a step that lowers f is kept; after a pass that kept none the
    step halves, down to MIN_STEP. (x, f(x), evaluations)."""
    x = np.array(x0, dtype=float)
    fx, evals, step = f(x), 1, START_STEP
    while step >= MIN_STEP and evals < max_evals:
        improved = False
        for i in range(len(x)):
            for sign in (1.0, -1.0):
                y = x.copy()
                y[i] = min(hi[i], max(lo[i], x[i] + sign * step))
                if y[i] == x[i] or evals >= max_evals:
                    continue
                fy = f(y)
                evals += 1
                if fy < fx:
                    x, fx, improved = y, fy, True
                    break
        if not improved:
            step /= 2
    return x, fx, evals


def significant(value: float, digits: int = SIGNIFICANT):
    """`value` to `digits` significant digits: an int where that is whole (3187.4 -> 3190)."""
    rounded = float(f"{value:.{digits}g}")
    return int(rounded) if rounded == int(rounded) else rounded


def split(samples: list[Sample], held_out: float, seed: int) -> tuple[list[Sample], list[Sample]]:
    """(training, held-out) samples: a seeded share `held_out` of the problems left out (at least
    one problem trains)."""
    order = sorted(samples, key=lambda s: s.index)
    random.Random(seed).shuffle(order)
    n_held = min(len(order) - 1, round(len(order) * held_out))
    return order[n_held:], order[:n_held]


def fit(
    samples: list[Sample],
    device: DeviceSpec,
    start: ArchRates,
    names: tuple,
    rank_weight: float = RANK_WEIGHT,
    max_evals: int = MAX_EVALS,
    prior_weight: float = PRIOR_WEIGHT,
) -> tuple[ArchRates, int]:
    """(`start` with the rates `names` fitted to `samples` and rounded (see the module's doc), evaluations).
    `prior_weight`: the pull toward `start`, times the mean squared change of the rates' logarithms."""
    x0 = np.log([getattr(start, n) for n in names])

    def rates_at(x) -> ArchRates:
        return dataclasses.replace(start, **{n: float(np.exp(v)) for n, v in zip(names, x)})

    def objective(x) -> float:
        prior = prior_weight * float(np.mean((x - x0) ** 2)) if len(x) else 0.0
        return loss(samples, predict(samples, device, rates_at(x)), rank_weight) + prior

    x, _, evals = coordinate_search(objective, x0, x0 - BOUND, x0 + BOUND, max_evals)
    moved = {n: float(np.exp(v)) for n, v, v0 in zip(names, x, x0) if v != v0}  # (the others stay as they were)
    return dataclasses.replace(start, **{n: significant(v) for n, v in moved.items()}), evals


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _table(rows: list[tuple[str, dict]]) -> str:
    keys = ("rms_log_error", "within_25pct", "pairs_right", "best_picked", "within_noise_picked", "regret_geomean")
    keys += ("regret_max",)
    lines = [f"{'':22}" + "".join(f"{k:>20}" for k in keys)]
    for label, m in rows:
        lines.append(f"{label:22}" + "".join(f"{'-' if m.get(k) is None else m[k]:>20}" for k in keys))
    return "\n".join(lines)


# Sample indices of the k-th measurement file of a fit start at k * FILE_INDEX_STRIDE.
FILE_INDEX_STRIDE = 1_000_000


def read_all(paths: list[Path]) -> tuple[list[dict], list[list[Sample]]]:
    """(each file's header, each file's problems), for files of one device kind; the problems'
    indices are unique across the files."""
    headers, samples = [], []
    for k, path in enumerate(paths):
        try:
            header, part = read_measurements(path)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        if headers and header.get("kind") != headers[0].get("kind"):
            raise SystemExit(f"{path}: kind {header.get('kind')}, not {headers[0].get('kind')} as {paths[0]}")
        headers.append(header)
        samples.append([s._replace(index=k * FILE_INDEX_STRIDE + s.index) for s in part])
    return headers, samples


def _measurement_provenance(path: Path, header: dict, samples: list[Sample]) -> dict:
    return {
        "file": Path(path).name,
        "sha256": _sha256(path),
        "simulated": bool(header.get("simulated")),
        "command": header.get("command"),
        "git_dirty": header.get("git_dirty"),
        "problems": len(samples),
        "times": int(sum(len(s.us) for s in samples)),
        "clocks_sm": [
            header.get("gpu_before", {}).get("clocks.sm"),
            header.get("gpu_after", {}).get("clocks.sm"),
        ],
        "rates_source": header.get("rates_source"),
    }


def run_fit(args) -> int:
    headers, by_file = read_all(args.measurements)
    samples = [s for part in by_file for s in part]
    header = headers[0]
    named = ", ".join(map(str, args.measurements))
    arch, num_sms = header["arch"], header["num_sms"]
    device = DeviceSpec(arch, num_sms)
    start_cal, own = calibration_for(arch, num_sms)
    start = start_cal.rates
    names = tuple(args.fit.split(",")) if args.fit else tuple(n for n in RATE_NAMES if n not in FIT_HELD)
    unknown = [n for n in names if n not in RATE_NAMES]
    if unknown:
        raise SystemExit(f"--fit: unknown rates {unknown}; ArchRates has {list(RATE_NAMES)}")
    if len(samples) < 2:
        raise SystemExit(f"{named}: {len(samples)} problems with times; a fit needs at least 2")
    out = Path(args.out) if args.out else CALIBRATION_DIR / f"{header['kind']}.json"
    if out.name != f"{header['kind']}.json":  # jitgemm finds a kind's rates by the file's name
        raise SystemExit(
            f"--out {out}: the rates of kind {header['kind']} must go in a file named {header['kind']}.json"
        )
    train, held = split(samples, args.held_out, args.seed)
    print(
        f"{named}: {len(samples)} problems ({len(train)} to fit, {len(held)} held out), "
        f"{sum(len(s.us) for s in samples)} times, {header.get('kind')} "
        f"({header.get('gpu_before', {}).get('name')}); starting from {start_cal.describe()}; fitting "
        f"{len(names)} rates by coordinate search (rank weight {args.rank_weight:g}, at most {args.max_evals} evaluations)",
        flush=True,
    )
    t0 = time.monotonic()
    fitted, evals = fit(train, device, start, names, args.rank_weight, args.max_evals, args.prior_weight)
    figures = {
        "start": {
            "train": metrics(train, predict(train, device, start)),
            "held_out": metrics(held, predict(held, device, start)),
        },
        "train": metrics(train, predict(train, device, fitted)),
        "held_out": metrics(held, predict(held, device, fitted)),
    }
    print(f"{evals} evaluations in {time.monotonic() - t0:.0f} s")
    print(
        _table(
            [
                ("start, train", figures["start"]["train"]),
                ("start, held out", figures["start"]["held_out"]),
                ("fitted, train", figures["train"]),
                ("fitted, held out", figures["held_out"]),
            ]
        )
    )
    print(f"\n{'rate':28}{'start':>12}{'fitted':>12}")
    for n in RATE_NAMES:
        mark = "" if n in names else "  (held)"
        print(f"{n:28}{getattr(start, n):>12}{getattr(fitted, n):>12}{mark}")
    fit_commit, fit_dirty = sweep.git_commit()
    simulated = any(h.get("simulated") for h in headers)
    measured = [_measurement_provenance(*file) for file in zip(args.measurements, headers, by_file)]
    calibration = {
        "schema": CALIBRATION_SCHEMA,
        "kind": header["kind"],
        "measured": not simulated,
        "rates": dataclasses.asdict(fitted),
        "provenance": {
            "gpu": ", ".join(dict.fromkeys(n for h in headers if (n := h.get("gpu_before", {}).get("name")))) or None,
            "date": str(header.get("date", ""))[:10] or None,
            "commit": header.get("git_commit"),
            "script": "examples/calibrate.py",
            "measurements": measured[0] if len(measured) == 1 else measured,
            "fit": {
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "commit": fit_commit,
                "git_dirty": fit_dirty,
                "command": " ".join(["python", "examples/calibrate.py", *args.argv]),
                "started_from": start_cal.describe(),
                "fitted": list(names),
                "held_out_share": args.held_out,
                "seed": args.seed,
                "rank_weight": args.rank_weight,
                "prior_weight": args.prior_weight,
                "noise": NOISE,
                "evaluations": evals,
                **figures,
            },
        },
    }
    try:
        parse_calibration(calibration, str(out), out.stem)  # what jitgemm will load
    except CalibrationError as exc:
        raise SystemExit(f"--out: {exc}") from None
    if header["kind"] != DEFAULT_KINDS.get(arch):
        print(
            f"note: {header['kind']} is not {arch}'s default kind ({DEFAULT_KINDS.get(arch)}): see heuristics/RATES.md "
            f"on whether {arch}'s selection reads per-kind rates yet"
        )
    if args.dry_run:
        print(f"\n--dry-run: {out} not written")
        return 0
    out.write_text(json.dumps(calibration, indent=2) + "\n")
    print(f"\nwrote {out}" + (" (simulated measurements: marked not measured)" if simulated else ""))
    return 0


# ------------------------------------------------------------------------------ the command line
def parse_args(argv=None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="phase", required=True)
    m = sub.add_parser("measure", help="time a seeded problem set's candidates on the GPU; write a measurement file")
    m.add_argument("--out", help="the measurement file [calibration-<kind>-<date>.json]")
    m.add_argument("--seed", type=int, help="the problems' seed [a fresh one, printed]")
    m.add_argument("--count", type=int, help=f"problems [{COUNT}; --smoke: {SMOKE['count']}]")
    m.add_argument("--top", type=int, help=f"the model's best candidates per problem [{TOP}; --smoke: {SMOKE['top']}]")
    m.add_argument("--random", type=int, help=f"random candidates per problem [{RANDOM}; --smoke: {SMOKE['random']}]")
    m.add_argument("--rounds", type=int, help=f"timed rounds of each candidate [{ROUNDS}; --smoke: {SMOKE['rounds']}]")
    m.add_argument(
        "--budget-s", type=float, help=f"start no new problem after this many seconds [{BUDGET_S:g}; --smoke: 120]"
    )
    m.add_argument(
        "--max-work",
        type=float,
        help=f"redraw problems above this many FLOP-equivalents a call [{MAX_WORK:g}; --smoke: {SMOKE['max_work']:g}]",
    )
    m.add_argument("--jobs", type=int, default=None, help="compile threads [the CPUs but one]")
    m.add_argument("--smoke", action="store_true", help="a few small problems, few candidates and rounds")
    m.add_argument("--list", action="store_true", help="print the problems and candidates and the estimate; no GPU")
    m.add_argument("--simulate", action="store_true", help="times from the cost model, no GPU (tests the plumbing)")
    m.add_argument("--arch", default="sm_90a", help="with --list/--simulate: the target arch [sm_90a]")
    m.add_argument(
        "--num-sms", type=int, default=None, help="with --list/--simulate: its SM count [the arch's default]"
    )
    f = sub.add_parser("fit", help="fit the rates to a measurement file; write the calibration file")
    f.add_argument("measurements", type=Path, nargs="+", help="files written by `measure`, of one device kind")
    f.add_argument("--out", help="the calibration file [heuristics/calibration/<kind>.json of this checkout]")
    f.add_argument("--held-out", type=float, default=HELD_OUT, help=f"share of the problems left out [{HELD_OUT}]")
    f.add_argument("--seed", type=int, default=0, help="the held-out split's seed [0]")
    f.add_argument("--rank-weight", type=float, default=RANK_WEIGHT, help=f"the ranking term's weight [{RANK_WEIGHT}]")
    f.add_argument(
        "--prior-weight", type=float, default=PRIOR_WEIGHT, help=f"the pull toward the starting rates [{PRIOR_WEIGHT}]"
    )
    f.add_argument("--fit", help=f"comma-separated rates to fit [all but {', '.join(FIT_HELD)}]")
    f.add_argument("--max-evals", type=int, default=MAX_EVALS, help=f"objective evaluations at most [{MAX_EVALS}]")
    f.add_argument("--dry-run", action="store_true", help="report the fit; write nothing")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.phase == "measure":
        for name, default in (("count", COUNT), ("top", TOP), ("random", RANDOM), ("rounds", ROUNDS)):
            if getattr(args, name) is None:
                setattr(args, name, SMOKE[name] if args.smoke else default)
        if args.budget_s is None:
            args.budget_s = SMOKE["budget_s"] if args.smoke else BUDGET_S
        if args.max_work is None:
            args.max_work = SMOKE["max_work"] if args.smoke else MAX_WORK
        if args.count < 1 or args.top < 1 or args.random < 0 or args.rounds < 1 or args.budget_s <= 0:
            parser.error("--count, --top and --rounds must be at least 1, --random at least 0, --budget-s positive")
        if args.jobs is not None and args.jobs < 1:
            parser.error("--jobs must be at least 1")
        if args.max_work < 1e8:
            parser.error("--max-work must be at least 1e8 (the smallest problems need about 2e6)")
        if args.arch not in registry.ARCH_NAMES:
            parser.error(f"--arch: one of {list(registry.ARCH_NAMES)}")
        if args.num_sms is None:
            args.num_sms = registry.get(args.arch).default_num_sms
        args.jobs = args.jobs or max(1, (os.cpu_count() or 1) - 1)  # a core left for the measuring
        args.seed_given = args.seed is not None
        if args.seed is None:
            args.seed = random.SystemRandom().randrange(1 << 31)
    elif not 0 <= args.held_out < 1:
        parser.error("--held-out must be in [0, 1)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_measure(args) if args.phase == "measure" else run_fit(args)


if __name__ == "__main__":
    sys.exit(main())
