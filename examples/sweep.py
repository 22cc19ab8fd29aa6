"""A seeded random sweep of GEMM problems, jitgemm beside cuBLAS, every result checked (issue 19,
item 1: "a sweep that keeps everyone honest").

    python examples/sweep.py [--seed S] [--count 300] [--json FILE] [--markdown FILE]
                             [--rounds 15] [--max-work 2e12] [--max-seconds T] [--worst 15]
                             [--calls-per-graph 20] [--smoke] [--list]

The problems (`draw`, deterministic per seed; `--list` prints them without a GPU):

* M log-uniform in [1, 16384]; N and K log-uniform in [64, 32768] (integers: the discrete
  log-uniform, P(x) proportional to log((x + 1) / x)).
* Alignment, by a deliberate fraction: ceil(36%) of the problems have N or K not a multiple of 8
  (a third of those N only, a third K only, a third both; the value is nudged off the multiple
  of 8 when the draw lands on one); the rest have both rounded to a multiple of 8. M is left as
  drawn (so an M-major A is often not a multiple of 8 either).
* The four layouts of jitgemm.problem.LAYOUTS, a quarter each: A row-major (`a`, K-major) or a
  transposed view (`a = X.T` of a contiguous (K, M) X, M-major); B row-major (K, N) (N-major) or
  `b = W.t()` of a contiguous (N, K) weight (K-major).
* bf16 and fp16 inputs, half each; half the problems with C (`beta = 0.5`, C in the output
  dtype); a fifth with an fp32 output, the rest output in the input dtype.
  Each of these categorical attributes is an exact share of the problems (cycled, then shuffled
  on its own), so every run has all of them; the dimensions are drawn independently of them.
* The work cap: a problem whose work, max(FLOPs, 200 x bytes moved by one call), exceeds
  --max-work (2e12 by default, ~3 ms a call on an H200; 200 FLOP/byte is roughly the H200's
  ridge point) is redrawn: M, N and K are drawn again, its layout, dtypes, C and alignment class
  are kept. The dimensions are therefore log-uniform conditioned on the cap; the run reports how
  many draws were redrawn (about 1% at the default cap: those with M x N x K above 1e12).
  With the cap, 300 problems take about 2 minutes on an H200 by the estimate the run prints
  before it starts (`estimated_seconds`), after the kernels the heuristics choose for them are
  compiled up front on --jobs threads (`compile_kernels`; NVRTC releases the GIL: 262 kernels
  in 9 s on the H200 machine's 16 cores, where compiling each at its first call took minutes).

Each problem gets fresh random normal operands in its layout, rotated over enough copies to
make the working set at least 512 MB (at least 2 copies; examples/benchmark.py's rule and
helpers: graph_of, time_graph, gpu_state, copy_bandwidth). jitgemm and cuBLAS each replay a
CUDA graph of 20 back-to-back calls per round (launch overhead excluded), rounds interleaved
(the first library alternates), --rounds of each, the per-call median reported. Back to back, a
programmatic launch lets the next GEMM hide part of a two-wave kernel's tail; --calls-per-graph
1 times lone calls instead, as a server that synchronises after each call sees them (each round
then includes one graph launch, for both libraries alike). The ratio is
cuBLAS time / jitgemm time (above 1: jitgemm faster). The operands are what a user passes:
where TMA cannot read one in place (a row of N or K, or of M for a transposed A, that is not a
whole number of 16-byte units), jitgemm copies it on every call, inside the timed graph, and
the row names the copies (`copied_operands`). What cuBLAS runs:

* output in the input dtype, no C: ``torch.matmul(a, b, out=o)``, as benchmark.py.
* with C: both accumulate in place, one kernel each: ``jitgemm.gemm(a, b, out=c, c=c,
  beta=0.5)`` against ``c.addmm_(a, b, beta=0.5)`` (cuBLAS's own beta; torch's out-of-place
  addmm first copies C into out, a second kernel cuBLAS does not need).
* fp32 output: ``torch.mm(a, b, out_dtype=torch.float32, out=o)`` and, with C,
  ``torch.addmm(c, a, b, out_dtype=torch.float32, beta=0.5, out=c)`` (cuBLAS with an fp32 output
  from bf16/fp16 inputs), where this torch has them: each is probed once on a small problem
  (that it runs and is right). Where it has not, the row is timed against the nearest call
  (``mm(out_dtype=fp32)`` then one add of beta * C; or the same call in the input dtype), marked
  "unfair" and left out of every statistic (its ratio is shown apart); it is still checked.

Every result is checked before it is timed: jitgemm's output (pre-filled with NaN, and with C
also the in-place call) and cuBLAS's, elementwise against a float64 reference with the bound of
tests/gpu_helpers.py (the output's rounding plus 2K fp32 roundoffs of the sum of magnitudes).
After the timing rounds the first copy's output is poisoned (or its C restored) and jitgemm's
timed graph replayed once more and checked too: the graph that was timed computes the GEMM. A
failed jitgemm check (or an exception) is printed loudly, counted, leaves the row out of the
statistics and makes the exit status 1; a cuBLAS result outside the bound is only reported.

The report: for all problems, per layout, per M class (decode M <= 64, small 65..512, medium
513..4096, large > 4096), per input dtype and per epilogue (plain, C, fp32, fp32 + C), the
geometric mean of the ratio, its 5th and 10th percentiles, the counts below 0.9x and 0.85x and
the --worst (15) slowest problems relative to cuBLAS, each with the config jitgemm chose
(`jitgemm.config_for`, or the decode kernel that runs it: jitgemm/decode.py) and the operands
jitgemm copies because TMA cannot read them in place.
--json writes every row, the summary, the GPU's state before and after, the date, the jitgemm
version and git commit; --markdown the tables for BENCHMARKS.md.

The seed: without --seed a fresh one is drawn and printed (and written to the JSON), so that a
run nobody chose the seed of is never one anyone tuned on; pass --seed to reproduce a run.
Develop against your own seeds; closing figures come from a seed nobody tuned on. --smoke runs 8
small problems (--max-work 2e10) with 3 rounds, for the GPU test suite. --max-seconds stops
starting new problems after that many seconds (the report then says the run is incomplete).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from jitgemm import decode, registry
from jitgemm.problem import DTYPE_BYTES, LAYOUTS, Problem

HERE = Path(__file__).resolve().parent

try:  # the bound of the GPU tests (tests/gpu_helpers.py), when this runs from a checkout
    sys.path.insert(0, str(HERE.parent / "tests"))
    from gpu_helpers import FP32_ROUNDOFF, ROUNDOFF, SUBNORMAL_ROUNDOFF
except ImportError:  # the same rule
    ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
    SUBNORMAL_ROUNDOFF = {"bf16": 2.0**-134, "fp16": 2.0**-25, "fp32": 2.0**-150}
    FP32_ROUNDOFF = 2.0**-24
finally:
    sys.path.pop(0)

# ------------------------------------------------------------------------------ the problems
M_RANGE = (1, 16384)
NK_RANGE = (64, 32768)
LAYOUT_NAMES = tuple(LAYOUTS)  # nt, nn, tn, tt
DTYPES = ("bf16", "fp16")
UNALIGNED_FRACTION = 0.36  # of the problems: N or K not a multiple of 8
UNALIGNED_KINDS = ("N", "K", "NK")  # which of them, in turn
FP32_FRACTION = 0.2  # of the problems: an fp32 output
BETA = 0.5  # of the problems with C
MAX_WORK = 2e12  # FLOP-equivalents of one call (see work())
FLOPS_PER_BYTE = 200  # a byte moved counts as this many FLOPs (about the H200's ridge point)
MAX_REDRAWS = 10_000
SMOKE_COUNT, SMOKE_ROUNDS, SMOKE_MAX_WORK = 8, 3, 2e10
DEFAULT_CALLS_PER_GRAPH = 20  # examples/benchmark.py's CALLS_PER_GRAPH (that module needs torch to import)
M_CLASSES = (("decode", 64), ("small", 512), ("medium", 4096), ("large", M_RANGE[1]))
EPILOGUES = ("plain", "C", "fp32", "fp32 + C")


def log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], P(x) proportional to log((x + 1) / x)."""
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


def dimension(rng: random.Random, lo: int, hi: int, aligned: bool) -> int:
    """A log-uniform N or K: rounded to a multiple of 8, or moved off one."""
    x = log_uniform_int(rng, lo, hi)
    if aligned:
        return min(hi // 8 * 8, max(-(-lo // 8) * 8, round(x / 8) * 8))
    if x % 8 == 0:
        step = rng.randint(1, 7)
        x = x + step if x + step <= hi else x - step
    return x


def call_bytes(p: Problem) -> int:
    """Bytes one call reads and writes: A, B, the output, and C (read) when there is one."""
    out = p.m * p.n * DTYPE_BYTES[p.out_dtype]
    return (p.m * p.k + p.k * p.n) * DTYPE_BYTES[p.dtype] + out * (2 if p.has_c else 1)


def work(p: Problem) -> float:
    """One call's work in FLOP-equivalents: its FLOPs, or its bytes at FLOPS_PER_BYTE, the larger."""
    return max(p.flops, FLOPS_PER_BYTE * call_bytes(p))


def _shuffled(rng: random.Random, values: list) -> list:
    rng.shuffle(values)
    return values


def draw(seed: int, count: int, max_work: float = MAX_WORK) -> tuple[list[Problem], int]:
    """`count` problems for `seed`, and how many draws were redrawn for exceeding `max_work`."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    rng = random.Random(seed)
    layouts = _shuffled(rng, [LAYOUT_NAMES[i % len(LAYOUT_NAMES)] for i in range(count)])
    dtypes = _shuffled(rng, [DTYPES[i % len(DTYPES)] for i in range(count)])
    with_c = _shuffled(rng, [i % 2 == 1 for i in range(count)])
    n_fp32 = round(count * FP32_FRACTION)
    fp32 = _shuffled(rng, [i < n_fp32 for i in range(count)])
    n_unaligned = math.ceil(count * UNALIGNED_FRACTION)
    unaligned = _shuffled(
        rng, [UNALIGNED_KINDS[i % len(UNALIGNED_KINDS)] if i < n_unaligned else "" for i in range(count)]
    )
    problems, redraws = [], 0
    for i in range(count):
        a_major, b_major = LAYOUTS[layouts[i]]
        for _attempt in range(MAX_REDRAWS + 1):
            m = log_uniform_int(rng, *M_RANGE)
            n = dimension(rng, *NK_RANGE, aligned="N" not in unaligned[i])
            k = dimension(rng, *NK_RANGE, aligned="K" not in unaligned[i])
            p = Problem(m, n, k, dtypes[i], "fp32" if fp32[i] else dtypes[i], a_major, b_major, with_c[i])
            if work(p) <= max_work:
                break
            redraws += 1
        else:
            raise ValueError(f"max_work {max_work:g}: no problem drawn in {MAX_REDRAWS} tries fits under it")
        problems.append(p)
    return problems, redraws


def problems(seed: int, count: int = 300, max_work: float = MAX_WORK) -> list[Problem]:
    """The sweep's problems for `seed` (see `draw`)."""
    return draw(seed, count, max_work)[0]


def kernel_problem(p: Problem) -> Problem:
    """The problem as jitgemm.gemm sees the sweep's operands: a transposed view with one row
    (M = 1) has a unit stride along K too and is read K-major (N, K >= 64 keep B's major)."""
    return Problem(p.m, p.n, p.k, p.dtype, p.out_dtype, "K" if p.m == 1 else p.a_major, p.b_major, p.has_c)


def problem_fields(index: int, p: Problem) -> dict:
    """What a row says of its problem."""
    return {
        "index": index,
        "m": p.m,
        "n": p.n,
        "k": p.k,
        "dtype": p.dtype,
        "out_dtype": p.out_dtype,
        "layout": p.layout,
        "has_c": p.has_c,
    }


def copied_operands(p: Problem, arch: str = "sm_90a") -> tuple[str, ...]:
    """The operands jitgemm copies (with a FallbackCopyWarning) because TMA cannot use them in
    place: rows (along the contiguous dimension) that are not whole 16-byte units; outputs only
    on an arch whose kernels cannot store them directly (out_direct). With C the timed call is
    in place (out = c), so C and the output are the same array. None where a decode kernel
    runs the call (jitgemm/decode.py: it reads and writes every array in place)."""
    kp = kernel_problem(p)
    if decode.decoder_of(kp) is not None:
        return ()
    inputs = DTYPE_BYTES[p.dtype]
    out_ragged = p.n * DTYPE_BYTES[p.out_dtype] % 16 != 0 and not registry.get(arch).direct_epilogue
    copied = []
    if (p.k if kp.a_major == "K" else p.m) * inputs % 16:
        copied.append("a")
    if (p.n if kp.b_major == "N" else p.k) * inputs % 16:
        copied.append("b")
    if out_ragged and p.has_c:
        copied.append("c")
    if out_ragged:
        copied.append("out")
    return tuple(copied)


def rotating_copies(p: Problem, l2_defeat_bytes: int, most: int = 64) -> int:
    """How many copies of the operands the timing rotates through (benchmark.py's rule: at least
    `l2_defeat_bytes` in all, at least 2, at most `most`)."""
    return max(2, min(most, math.ceil(l2_defeat_bytes / call_bytes(p))))


def calls_on_first_copy(calls_per_graph: int, copies: int) -> int:
    """How often one replay of a graph that rotates through `copies` calls the first copy."""
    return len(range(0, calls_per_graph, copies))


def m_class(m: int) -> str:
    return next(name for name, top in M_CLASSES if m <= top)


def epilogue(p_or_row) -> str:
    get = p_or_row.get if isinstance(p_or_row, dict) else lambda name: getattr(p_or_row, name)
    fp32 = get("out_dtype") == "fp32"
    return ("fp32 + C" if get("has_c") else "fp32") if fp32 else ("C" if get("has_c") else "plain")


# Assumed H200 rates for the run-time estimate (not measurements).
EST_FLOPS = 600e12  # bf16/fp16 dense, achieved
EST_BYTES_PER_S = 3.3e12
EST_LAUNCH_S = 4e-6  # a short GEMM's floor, in a graph
EST_FP64_FLOPS = 40e12  # the float64 reference
EST_OVERHEAD_S = 0.3  # per problem: operands, two graph captures, checks' host work


def estimated_seconds(plist: list[Problem], rounds: int, calls_per_graph: int = DEFAULT_CALLS_PER_GRAPH) -> float:
    """A rough H200 estimate of a run's time, kernel compiles excluded: per problem both
    libraries' warm-up, checks and timed rounds, jitgemm's graph check, two float64 references
    (product and magnitudes each), and a fixed overhead."""
    calls = 2 * (3 + rounds * calls_per_graph + 2) + calls_per_graph
    total = 0.0
    for p in plist:
        per_call = max(p.flops / EST_FLOPS, call_bytes(p) / EST_BYTES_PER_S) + EST_LAUNCH_S
        total += calls * per_call + 4 * p.flops / EST_FP64_FLOPS + EST_OVERHEAD_S
    return total


# ------------------------------------------------------------------------------ the check
def error_ratio(got, product, magnitude, k: int, out_dtype: str, c=None, beta: float = 1.0, calls: int = 1) -> float:
    """The largest elementwise |got - ref| / bound (NaN: inf), for float64 arrays (torch or NumPy)
    of the same shape: `product` = a @ b and `magnitude` = |a| @ |b| in float64. The bound is
    tests/gpu_helpers.py's: the rounding of the result into `out_dtype` (relative, or absolute
    for a subnormal result) plus 2K fp32 roundoffs of the sum of magnitudes it adds up.

    With C the result may be `calls` in-place accumulations c <- beta * c + a @ b (a timed graph
    calls its first copy that often): ref is the float64 recurrence and the bound the sum of
    each call's bound, the earlier ones damped by |beta| as their errors are. For calls = 1 it is
    gpu_helpers.worst_error's bound (alpha = 1)."""
    accumulation = 2 * max(k, 1) * FP32_ROUNDOFF
    floor = SUBNORMAL_ROUNDOFF[out_dtype] + 2.0**-40
    if c is None:
        ref = product
        bound = ROUNDOFF[out_dtype] * abs(ref) + floor + accumulation * magnitude
    else:
        prev, bound = c, 0.0
        for _ in range(max(calls, 1)):
            ref = beta * prev + product
            bound = (
                abs(beta) * bound
                + ROUNDOFF[out_dtype] * abs(ref)
                + floor
                + accumulation * (magnitude + abs(beta) * abs(prev))
            )
            prev = ref
    ratio = abs(got - ref) / bound
    if bool((ratio != ratio).any()):
        return math.inf
    return float(ratio.max())


# ------------------------------------------------------------------------------ statistics
def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linear between the closest ranks (NumPy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(ratios: list[float]) -> dict:
    if not ratios:
        return {"n": 0}
    return {
        "n": len(ratios),
        "geomean": geomean(ratios),
        "p5": percentile(ratios, 5),
        "p10": percentile(ratios, 10),
        "median": percentile(ratios, 50),
        "min": min(ratios),
        "below_0.9": sum(r < 0.9 for r in ratios),
        "below_0.85": sum(r < 0.85 for r in ratios),
    }


def in_statistics(row: dict) -> bool:
    """A row counts when its comparison is fair and its results were right."""
    return row.get("passed", False) and row.get("fair", False) and row.get("ratio") is not None


def worst(rows: list[dict], n: int) -> list[dict]:
    """The n rows of the lowest ratio (jitgemm slowest relative to cuBLAS), lowest first."""
    return sorted(rows, key=lambda r: (r["ratio"], r["index"]))[:n]


GROUPINGS = (
    ("all", lambda r: "all", ("all",)),
    ("layout", lambda r: r["layout"], LAYOUT_NAMES),
    ("M", lambda r: m_class(r["m"]), tuple(name for name, _ in M_CLASSES)),
    ("dtype", lambda r: r["dtype"], DTYPES),
    ("epilogue", epilogue, EPILOGUES),
)


def summarize(rows: list[dict], worst_n: int = 15) -> dict:
    """The statistics of the rows that count, per group, with the indices of the worst rows;
    and the rows apart: the failures and the unfair comparisons."""
    used = [r for r in rows if in_statistics(r)]
    groups = []
    for grouping, key, classes in GROUPINGS:
        for cls in classes:
            sel = [r for r in used if key(r) == cls]
            groups.append(
                {
                    "grouping": grouping,
                    "class": cls,
                    **stats([r["ratio"] for r in sel]),
                    "worst": [r["index"] for r in worst(sel, worst_n)],
                }
            )
    unfair = [r for r in rows if r.get("passed") and not r.get("fair") and r.get("ratio") is not None]
    return {
        "problems": len(rows),
        "in_statistics": len(used),
        "failed": [r["index"] for r in rows if not r.get("passed")],
        "unfair": {"indices": [r["index"] for r in unfair], **stats([r["ratio"] for r in unfair])},
        "cublas_outside_bound": [r["index"] for r in rows if r.get("cublas_error", 0.0) > 1.0],
        "groups": groups,
    }


def group_label(g: dict) -> str:
    return "all problems" if g["grouping"] == "all" else f"{g['grouping']} {g['class']}"


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def describe_row(r: dict) -> str:
    c = "C" if r["has_c"] else " "
    return (
        f"{r['dtype']}->{r['out_dtype']:4} {r['layout']} {c} M={r['m']:>5} N={r['n']:>5} K={r['k']:>5}"
        f"  jit {_fmt(r.get('jitgemm_us'), '9.1f')} us  cuBLAS {_fmt(r.get('cublas_us'), '9.1f')} us"
        f"  ratio {_fmt(r.get('ratio'))}  {r.get('config', '?')}"
        + (f"  [copies {','.join(r['copies'])}]" if r.get("copies") else "")
        + ("" if r.get("fair", True) else f"  (unfair: {r.get('baseline')})")
    )


def text_report(result: dict) -> str:
    summary, rows = result["summary"], result["rows"]
    by_index = {r["index"]: r for r in rows}
    lines = [
        f"seed {result['seed']}: {summary['problems']} problems ({'complete' if result['complete'] else 'INCOMPLETE'}"
        f"), {summary['in_statistics']} in the statistics; cap {result['max_work']:.3g} FLOP-equivalents "
        f"({result['redraws']} draws redrawn)",
        "ratio = cuBLAS time / jitgemm time (above 1: jitgemm faster)",
        "",
        f"{'grouping':9} {'class':9} {'n':>4} {'geomean':>8} {'p5':>6} {'p10':>6} {'median':>7} {'min':>6}"
        f" {'<0.9':>5} {'<0.85':>5}",
    ]
    for g in summary["groups"]:
        lines.append(
            f"{g['grouping']:9} {g['class']:9} {g['n']:>4} {_fmt(g.get('geomean')):>8} {_fmt(g.get('p5')):>6}"
            f" {_fmt(g.get('p10')):>6} {_fmt(g.get('median')):>7} {_fmt(g.get('min')):>6}"
            f" {g.get('below_0.9', '-'):>5} {g.get('below_0.85', '-'):>5}"
        )
    unfair = summary["unfair"]
    if unfair["n"]:
        lines += [
            "",
            f"not in the statistics: {unfair['n']} fp32-output rows without a like-for-like cuBLAS call "
            f"(geomean against the nearest call {_fmt(unfair['geomean'])})",
        ]
    for g in summary["groups"]:
        if g["worst"]:
            lines += ["", f"the {len(g['worst'])} worst, {group_label(g)}:"]
            lines += [f"  #{i:<4} {describe_row(by_index[i])}" for i in g["worst"]]
    if summary["cublas_outside_bound"]:
        lines += ["", f"cuBLAS results outside the bound (reported only): {summary['cublas_outside_bound']}"]
    if summary["failed"]:
        lines += ["", f"FAILED: {len(summary['failed'])} problems"]
        for i in summary["failed"]:
            r = by_index[i]
            lines.append(f"  #{i:<4} {describe_row(r)}  {r.get('error') or r.get('checks')}")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The run as Markdown for BENCHMARKS.md: conditions, the summary table, the worst problems."""
    summary, rows = result["summary"], result["rows"]
    by_index = {r["index"]: r for r in rows}
    b, a = result.get("gpu_before", {}), result.get("gpu_after", {})
    command = f"python examples/sweep.py --seed {result['seed']} --count {result['count']}"
    if result["rounds"] != 15:
        command += f" --rounds {result['rounds']}"
    if result["max_work"] != MAX_WORK:
        command += f" --max-work {result['max_work']:g}"
    commit = (result.get("git_commit") or "unknown")[:12] + (" with local changes" if result.get("git_dirty") else "")
    lines = [
        f"`{command}` "
        f"({summary['problems']} problems, {'complete' if result['complete'] else 'incomplete'}, "
        f"{summary['in_statistics']} in the statistics, {len(summary['failed'])} failed); "
        f"{b.get('name')}, {result.get('date')}, jitgemm {result.get('jitgemm_version')} "
        f"(commit {commit}), torch {result.get('torch_version')}; SM clock "
        f"{b.get('clocks.sm')} before / {a.get('clocks.sm')} after, power {b.get('power.draw')} before / "
        f"{a.get('power.draw')} after; work cap {result['max_work']:.3g} FLOP-equivalents "
        f"({result['redraws']} draws redrawn); {result['rounds']} rounds.",
        "",
        "Ratio = cuBLAS time / jitgemm time (above 1: jitgemm faster).",
        "",
        "| grouping | class | n | geomean | p5 | p10 | median | min | < 0.9 | < 0.85 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in summary["groups"]:
        lines.append(
            f"| {g['grouping']} | {g['class']} | {g['n']} | {_fmt(g.get('geomean'))} | {_fmt(g.get('p5'))} | "
            f"{_fmt(g.get('p10'))} | {_fmt(g.get('median'))} | {_fmt(g.get('min'))} | "
            f"{g.get('below_0.9', '-')} | {g.get('below_0.85', '-')} |"
        )
    if summary["unfair"]["n"]:
        lines += [
            "",
            f"Not in the statistics: {summary['unfair']['n']} fp32-output rows without a like-for-like cuBLAS "
            f"call in this torch (geomean against the nearest call {_fmt(summary['unfair']['geomean'])}).",
        ]
    for g in summary["groups"]:
        if not g["worst"]:
            continue
        lines += [
            "",
            f"**The {len(g['worst'])} worst, {group_label(g)}**",
            "",
            "| # | M | N | K | dtype | layout | C | jitgemm µs | cuBLAS µs | ratio | config | copied |",
            "|---:|---:|---:|---:|---|---|---|---:|---:|---:|---|---|",
        ]
        for i in g["worst"]:
            r = by_index[i]
            lines.append(
                f"| {i} | {r['m']} | {r['n']} | {r['k']} | {r['dtype']}→{r['out_dtype']} | {r['layout']} | "
                f"{'yes' if r['has_c'] else ''} | {r['jitgemm_us']:.1f} | {r['cublas_us']:.1f} | {r['ratio']:.3f} | "
                f"`{str(r.get('config', '?')).removeprefix('sm_90a_')}`{' (tuned)' if r.get('tuned') else ''} | "
                f"{','.join(r.get('copies', ()))} |"
            )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ the command line
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, help="the problems' seed [a fresh one, printed]")
    parser.add_argument("--count", type=int, help=f"problems [300; --smoke: {SMOKE_COUNT}]")
    parser.add_argument("--rounds", type=int, help=f"timed rounds of each library [15; --smoke: {SMOKE_ROUNDS}]")
    parser.add_argument(
        "--max-work",
        type=float,
        help=f"redraw problems above this many FLOP-equivalents a call [{MAX_WORK:g}; --smoke: {SMOKE_MAX_WORK:g}]",
    )
    parser.add_argument("--max-seconds", type=float, help="start no new problem after this many seconds")
    parser.add_argument(
        "--calls-per-graph",
        type=int,
        default=DEFAULT_CALLS_PER_GRAPH,
        help=f"calls in each timed CUDA graph [{DEFAULT_CALLS_PER_GRAPH}]; 1 times lone calls (see the docstring)",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="threads compiling the kernels up front [the CPUs]"
    )
    parser.add_argument("--worst", type=int, default=15, help="the worst problems listed per group [15]")
    parser.add_argument("--json", help="write every row, the summary and the conditions to this file")
    parser.add_argument("--markdown", help="write the tables for BENCHMARKS.md to this file")
    parser.add_argument("--smoke", action="store_true", help="a few small problems, few rounds (the GPU tests)")
    parser.add_argument("--list", action="store_true", help="print the problems and the estimate; no GPU")
    args = parser.parse_args(argv)
    args.count = args.count if args.count is not None else (SMOKE_COUNT if args.smoke else 300)
    args.rounds = args.rounds if args.rounds is not None else (SMOKE_ROUNDS if args.smoke else 15)
    args.max_work = args.max_work if args.max_work is not None else (SMOKE_MAX_WORK if args.smoke else MAX_WORK)
    if args.count < 1:
        parser.error("--count must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.max_work < 1e8:
        parser.error("--max-work must be at least 1e8 (the smallest problems need about 2e6)")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.calls_per_graph < 1:
        parser.error("--calls-per-graph must be at least 1")
    args.seed_given = args.seed is not None
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    return args


def listing(plist: list[Problem]) -> str:
    lines = []
    for i, p in enumerate(plist):
        copies = ",".join(copied_operands(p))
        lines.append(
            f"#{i:<4} {p.dtype}->{p.out_dtype:4} {p.layout} {'C' if p.has_c else ' '} M={p.m:>5} N={p.n:>5} "
            f"K={p.k:>5}  {work(p) / 1e9:9.1f} GFLOP-eq{'  [copies ' + copies + ']' if copies else ''}"
        )
    return "\n".join(lines)


def compile_kernels(plist: list[Problem], device, jobs: int) -> tuple[int, float]:
    """Compile (or find in the disk cache) the kernel the heuristics choose for each problem as
    gemm sees it, on `jobs` threads: (distinct kernels, seconds). A config from a tuning file or
    the dispatch table, where one differs, is compiled at its first call instead."""
    from concurrent.futures import ThreadPoolExecutor

    from jitgemm import heuristics, kernels

    start = time.perf_counter()
    configs = {cfg.name: cfg for cfg in (heuristics.select(kernel_problem(p), device) for p in plist)}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(kernels.build, configs.values()))
    return len(configs), time.perf_counter() - start


def git_commit() -> tuple[str | None, bool | None]:
    try:
        head = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return head, bool(dirty)
    except (OSError, subprocess.SubprocessError):
        return None, None


def main(argv=None) -> int:
    args = parse_args(argv)
    plist, redraws = draw(args.seed, args.count, args.max_work)
    est = estimated_seconds(plist, args.rounds, args.calls_per_graph)
    print(
        f"seed {args.seed}{'' if args.seed_given else ' (drawn; pass --seed to repeat)'}: {len(plist)} problems, "
        f"{redraws} draws redrawn above {args.max_work:.3g} FLOP-equivalents "
        f"({redraws / (redraws + len(plist)):.1%} of draws); {args.rounds} rounds; estimated "
        f"{est / 60:.1f} min on an H200 without kernel compiles",
        flush=True,
    )
    if args.list:
        print(listing(plist))
        return 0
    return Sweep(args).run(plist, redraws)


# ------------------------------------------------------------------------------ the GPU run
# Names of the cuBLAS calls a row is compared with; the fair ones do what jitgemm does.
MATMUL = "torch.matmul(a, b, out=o)"
ADDMM_INPLACE = "c.addmm_(a, b, beta)"
MM_FP32 = "torch.mm(a, b, out_dtype=fp32, out=o)"
ADDMM_FP32 = "torch.addmm(c, a, b, out_dtype=fp32, beta, out=c)"
MM_FP32_THEN_ADD = "torch.mm(a, b, out_dtype=fp32) then c = beta * c + it (two kernels)"
MATMUL_IN_DTYPE = "torch.matmul(a, b, out=o) in the input dtype"
ADDMM_IN_DTYPE = "c.addmm_(a, b, beta) in the input dtype"


def baseline(p: Problem, caps: dict) -> tuple[str, bool, str]:
    """(the cuBLAS call a problem is timed against, whether it is like for like, its output
    dtype), given which fp32-output calls this torch has (`caps`: mm_out_dtype,
    addmm_out_dtype)."""
    if p.out_dtype != "fp32":
        return (ADDMM_INPLACE if p.has_c else MATMUL), True, p.out_dtype
    if not p.has_c:
        return (MM_FP32, True, "fp32") if caps.get("mm_out_dtype") else (MATMUL_IN_DTYPE, False, p.dtype)
    if caps.get("addmm_out_dtype"):
        return ADDMM_FP32, True, "fp32"
    if caps.get("mm_out_dtype"):
        return MM_FP32_THEN_ADD, False, "fp32"
    return ADDMM_IN_DTYPE, False, p.dtype


class Sweep:
    """The GPU run: torch, jitgemm and examples/benchmark.py's timing helpers."""

    def __init__(self, args):
        self.args = args
        sys.path.insert(0, str(HERE))
        import benchmark  # examples/benchmark.py: graph timing on rotating copies (needs torch)
        import torch  # only the GPU run needs torch: the generator and the report do not

        import jitgemm

        self.bm, self.torch, self.jitgemm = benchmark, torch, jitgemm
        self.tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

    # -- what this torch offers for an fp32 output
    def probe(self) -> dict:
        torch = self.torch
        gen = torch.Generator(device="cuda").manual_seed(0)
        a, b, c = (torch.randn(64, 64, device="cuda", generator=gen) for _ in range(3))
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        product = a16.double() @ b16.double()

        def close(x, want):
            return bool(((x.double() - want).abs() <= 1e-4 * want.abs() + 1e-4).all())

        caps = {}
        try:
            o = torch.empty(64, 64, device="cuda", dtype=torch.float32)
            torch.mm(a16, b16, out_dtype=torch.float32, out=o)
            caps["mm_out_dtype"] = close(o, product)
        except Exception:  # an older torch: no such argument, or not for these dtypes
            caps["mm_out_dtype"] = False
        try:
            c2 = c.clone()
            torch.addmm(c2, a16, b16, out_dtype=torch.float32, beta=BETA, out=c2)
            caps["addmm_out_dtype"] = close(c2, BETA * c.double() + product)
        except Exception:  # an older torch: C must then be in the input dtype
            caps["addmm_out_dtype"] = False
        torch.cuda.synchronize()
        return caps

    # Both calls take a copy's (a, b, jitgemm's output, cuBLAS's output), as benchmark.graph_of
    # passes them; an output is C itself where the problem has C (accumulated in place).
    def cublas_call(self, name: str, p: Problem):
        torch = self.torch
        if name in (MATMUL, MATMUL_IN_DTYPE):
            return lambda a, b, _, o: torch.matmul(a, b, out=o)
        if name in (ADDMM_INPLACE, ADDMM_IN_DTYPE):
            return lambda a, b, _, c: c.addmm_(a, b, beta=BETA)
        if name == MM_FP32:
            return lambda a, b, _, o: torch.mm(a, b, out_dtype=torch.float32, out=o)
        if name == ADDMM_FP32:
            return lambda a, b, _, c: torch.addmm(c, a, b, out_dtype=torch.float32, beta=BETA, out=c)
        if name == MM_FP32_THEN_ADD:
            scratch = torch.empty(p.m, p.n, device="cuda", dtype=torch.float32)

            def mm_then_add(a, b, _, c):
                torch.mm(a, b, out_dtype=torch.float32, out=scratch)
                torch.add(scratch, c, alpha=BETA, out=c)

            return mm_then_add
        raise ValueError(name)

    def jitgemm_call(self, p: Problem):
        gemm = self.jitgemm.gemm
        if p.has_c:
            return lambda a, b, c, _: gemm(a, b, out=c, c=c, beta=BETA)
        return lambda a, b, o, _: gemm(a, b, out=o)

    # -- the float64 check, in row blocks so that the largest problems fit beside their copies
    def errors(self, outs: list, a, b, c=None, calls: int = 1) -> list[float]:
        """error_ratio of each (array, out_dtype) in `outs` against a @ b (+ C), in float64."""
        m, k = a.shape
        n = b.shape[1]
        rows = max(1, (1 << 26) // max(n, k))
        b64 = b.double()
        b_abs = b64.abs()
        worst_seen = [0.0] * len(outs)
        for r0 in range(0, m, rows):
            a64 = a[r0 : r0 + rows].double()
            product, magnitude = a64 @ b64, a64.abs() @ b_abs
            c64 = None if c is None else c[r0 : r0 + rows].double()
            for i, (got, odt) in enumerate(outs):
                ratio = error_ratio(got[r0 : r0 + rows].double(), product, magnitude, k, odt, c64, BETA, calls)
                worst_seen[i] = max(worst_seen[i], ratio)
        return worst_seen

    def operand(self, rows: int, cols: int, dtype: str, transposed: bool, gen):
        """Fresh random normal (rows, cols) data: row-major, or the .T of a contiguous (cols, rows)."""
        torch = self.torch
        shape = (cols, rows) if transposed else (rows, cols)
        t = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(self.tdt[dtype])
        return t.T if transposed else t

    def nan(self, p: Problem, dtype: str):
        return self.torch.full((p.m, p.n), float("nan"), device="cuda", dtype=self.tdt[dtype])

    def config(self, p: Problem) -> tuple[str, bool]:
        from jitgemm import api, heuristics, plan, runtime, tuned  # the benchmark's own test for "tuned"

        kp = kernel_problem(p)
        decoder = decode.decoder_of(kp)
        if decoder is not None:
            return decoder.kernel.name, False
        cfg = api.config_for(kp)
        spec = api.device_spec(0)
        # the file's and the heuristics' configs as gemm runs them (plan.with_epilogue)
        from_file = tuned.tuned_config(kp, spec, runtime.device_info(0).name)
        is_tuned = from_file is not None and cfg == plan.with_epilogue(from_file, kp)
        is_tuned = is_tuned and cfg != plan.with_epilogue(heuristics.select(kp, spec), kp)
        return cfg.name, bool(is_tuned)

    def measure(self, index: int, p: Problem, caps: dict) -> dict:
        torch, bm = self.torch, self.bm
        name, fair, ref_dtype = baseline(p, caps)
        row = {
            **problem_fields(index, p),
            "beta": BETA if p.has_c else None,
            "m_class": m_class(p.m),
            "epilogue": epilogue(p),
            "work": work(p),
            "copies": list(copied_operands(p)),
            "baseline": name,
            "fair": fair,
            "passed": False,
        }
        row["config"], row["tuned"] = self.config(p)
        gen = torch.Generator(device="cuda").manual_seed(self.args.seed * 1_000_003 + index)
        n_copies = rotating_copies(p, bm.L2_DEFEAT_BYTES)
        row["rotating_copies"] = n_copies
        copies = []
        for _ in range(n_copies):
            a = self.operand(p.m, p.k, p.dtype, p.a_major == "M", gen)
            b = self.operand(p.k, p.n, p.dtype, p.b_major == "K", gen)
            if p.has_c:
                c = self.operand(p.m, p.n, p.out_dtype, False, gen)
                copies.append((a, b, c, c.to(self.tdt[ref_dtype], copy=True)))
            else:
                copies.append((a, b, self.nan(p, p.out_dtype), self.nan(p, ref_dtype)))
        jit, ref = self.jitgemm_call(p), self.cublas_call(name, p)
        a0, b0, out0, ref0 = copies[0]
        c0 = out0.clone() if p.has_c else None

        # the checks: jitgemm into a NaN-poisoned output (and in place with C), and cuBLAS
        start = time.perf_counter()
        poisoned = self.nan(p, p.out_dtype)
        self.jitgemm.gemm(a0, b0, out=poisoned, c=c0, beta=BETA if p.has_c else 1.0)
        torch.cuda.synchronize()
        row["first_call_ms"] = (time.perf_counter() - start) * 1e3
        outs = [(poisoned, p.out_dtype)]
        if p.has_c:
            in_place = c0.clone()
            jit(a0, b0, in_place, None)
            outs.append((in_place, p.out_dtype))
        ref(a0, b0, None, ref0)
        outs.append((ref0, ref_dtype))
        torch.cuda.synchronize()
        errs = self.errors(outs, a0, b0, c0)
        row["checks"] = {"jitgemm": errs[0], **({"jitgemm_in_place": errs[1]} if p.has_c else {})}
        row["cublas_error"] = errs[-1]
        del outs, poisoned
        if p.has_c:
            del in_place
            ref0.copy_(c0)  # the cuBLAS copy starts from C again
        if not all(e <= 1.0 for e in errs[:-1]):
            return row

        # the timing: interleaved rounds, the first library alternating
        graph_calls = self.args.calls_per_graph
        g_jit, g_ref = bm.graph_of(jit, copies, graph_calls), bm.graph_of(ref, copies, graph_calls)
        t_jit, t_ref = [], []
        for r in range(self.args.rounds):
            pair = ((g_jit, t_jit), (g_ref, t_ref))
            for graph, times in pair if r % 2 == 0 else pair[::-1]:
                times.append(bm.time_graph(graph, graph_calls))

        # the graph that was timed computes the GEMM: poison (or restore) the first copy, replay
        if p.has_c:
            out0.copy_(c0)
        else:
            out0.fill_(float("nan"))
        g_jit.replay()
        torch.cuda.synchronize()
        calls = calls_on_first_copy(graph_calls, n_copies)
        row["checks"]["jitgemm_graph"] = self.errors([(out0, p.out_dtype)], a0, b0, c0, calls)[0]
        row["passed"] = row["checks"]["jitgemm_graph"] <= 1.0
        del g_jit, g_ref, copies

        us_jit, us_ref = statistics.median(t_jit), statistics.median(t_ref)
        row.update(
            jitgemm_us=us_jit,
            cublas_us=us_ref,
            ratio=us_ref / us_jit,
            jitgemm_tflops=p.flops / us_jit * 1e-6,
            cublas_tflops=p.flops / us_ref * 1e-6,
            jitgemm_gbps=call_bytes(p) / us_jit * 1e-3,
        )
        return row

    def run(self, plist: list[Problem], redraws: int) -> int:
        import warnings

        torch, bm, args = self.torch, self.bm, self.args
        # the copies jitgemm makes are listed per row (copied_operands), not warned about
        warnings.filterwarnings("ignore", category=self.jitgemm.FallbackCopyWarning)
        commit, dirty = git_commit()
        before = bm.gpu_state()
        copy_bps = bm.copy_bandwidth()
        caps = self.probe()
        print(f"cuBLAS with an fp32 output in this torch ({torch.__version__}): {caps}", flush=True)
        from jitgemm import api

        built, seconds = compile_kernels(plist, api.device_spec(0), args.jobs)
        print(f"{built} kernels compiled or found in the cache in {seconds:.1f} s ({args.jobs} threads)", flush=True)
        started = time.monotonic()
        rows = []
        complete = True
        for index, p in enumerate(plist):
            if args.max_seconds is not None and time.monotonic() - started > args.max_seconds:
                complete = False
                print(f"--max-seconds {args.max_seconds:g} reached: {index} of {len(plist)} problems run", flush=True)
                break
            try:
                row = self.measure(index, p, caps)
            except Exception as exc:  # a sweep goes on: the row fails loudly and counts
                row = {
                    **problem_fields(index, p),
                    "passed": False,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            if "jitgemm_gbps" in row:
                row["copy_fraction"] = row["jitgemm_gbps"] * 1e9 / copy_bps
            rows.append(row)
            status = "ok" if row["passed"] else f"FAILED {row.get('error') or row.get('checks')}"
            print(f"{index + 1:>4}/{len(plist)} {describe_row(row)}  {status}", flush=True)
            if row.get("rotating_copies") == 2:
                torch.cuda.empty_cache()  # a big problem: give its memory back before the next
        after = bm.gpu_state()
        result = {
            "seed": args.seed,
            "seed_given": args.seed_given,
            "count": args.count,
            "complete": complete,
            "max_work": args.max_work,
            "flops_per_byte": FLOPS_PER_BYTE,
            "redraws": redraws,
            "rounds": args.rounds,
            "calls_per_graph": self.args.calls_per_graph,
            "l2_defeat_bytes": bm.L2_DEFEAT_BYTES,
            "beta": BETA,
            "compiled_up_front": {"kernels": built, "seconds": seconds, "jobs": args.jobs},
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": time.monotonic() - started,
            "gpu_before": before,
            "gpu_after": after,
            "copy_bandwidth_GBps": copy_bps * 1e-9,
            "jitgemm_version": self.jitgemm.__version__,
            "git_commit": commit,
            "git_dirty": dirty,
            "torch_version": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "cublas_fp32_output": caps,
            "torch_reduced_precision_reduction": {
                dt: getattr(torch.backends.cuda.matmul, f"allow_{dt}_reduced_precision_reduction", None)
                for dt in DTYPES
            },
            "programmatic_launch": os.environ.get("JITGEMM_PDL", "1") != "0",
            "checked": sum("jitgemm_graph" in r.get("checks", {}) for r in rows),
            "failures": sum(not r["passed"] for r in rows),
            "rows": rows,
        }
        result["summary"] = summarize(rows, args.worst)
        print()
        print(text_report(result))
        print(
            f"\n{before.get('name')}  SM clock before {before.get('clocks.sm')} after {after.get('clocks.sm')}"
            f"  power before {before.get('power.draw')} after {after.get('power.draw')}  {result['date']}"
            f"  {result['wall_s']:.0f} s"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        if args.markdown:
            Path(args.markdown).write_text(markdown(result))
        if result["failures"]:
            print(f"\n{result['failures']} of {len(rows)} problems FAILED their checks or raised", flush=True)
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
