"""Latency of `heuristics.select` (sm_90a, 132 SMs) for problems never seen, on the CPU.

Two problem sets, each after the first problem of every kind has built that kind's tables:

- "random": the 250 random problems of tests/test_selection.py (random M, N, K, dtypes,
  majors, C), after one problem of each kind (dtypes, majors, C) of a first random set;
- "fixed weight": random token counts M (log-uniform in 1..16384) for a handful of fixed
  weights (N, K, dtypes, majors, C), as a server sees them, after one M of each weight;
- "small M": every token count of 1..128 for the same weights (decode and small batches).

Each pass starts afresh but for the per-kind tables: it clears select's memo of answers and
every memo of a problem's parts (`problem_memos`: what a problem's N, K or M grain make of a
kind's layouts, the raster walks, the finished configs), runs the first problem of each kind
(or weight) again, then times every problem once, in a shuffled order (the same in every
pass), each with the memos the problems before it left (as a server's would be). Prints the
median, p90 and max of each pass, in microseconds, and with --json the per-problem times of
every pass. A full (generation 2) pass of Python's garbage collector walks every object of the
process, the memos included; a generation 1 pass walks every object that survived the
generation 0 passes since the last one (those of ~7,000 allocations). Either lands inside whichever call allocates when it falls due:
each pass also prints how many of each did, their length, and the max of the calls no such
pass ran in. With more than one pass, it also prints the median and max of each problem's
fastest pass: the code's own cost, where a call slowed by the machine (other processes, a busy
host) in one pass is not slowed in every pass (each pass repeats the same calls with the same
memos). With --freeze, each pass calls `gc.freeze()` after its warm-up, as a server can
after its own (README, "Python's garbage collector"): collections then leave out every object
made before, the memos the warm-up filled included.

    PYTHONPATH=. python examples/select_latency.py --passes 5 [--freeze]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

from jitgemm import geometry, heuristics
from jitgemm.heuristics import DeviceSpec, sm90
from jitgemm.problem import LAYOUTS, Problem

H200 = DeviceSpec("sm_90a", 132)

WEIGHTS = (  # (N, K, dtype, out_dtype, a_major, b_major, has_c)
    (4096, 4096, "bf16", None, "K", "K", False),
    (14336, 4096, "bf16", None, "K", "K", False),
    (4096, 14336, "bf16", None, "K", "K", False),
    (2112, 7168, "bf16", None, "K", "N", False),
    (577, 4097, "fp16", "fp32", "M", "N", True),
    (24576, 1536, "bf16", None, "K", "K", True),
)


def random_problems(seed: int, count: int) -> list[Problem]:
    """Log-uniform M in [1, 16384], N and K in [64, 32768], half of N and K not multiples of 8,
    every layout, both dtypes, an fp32 output a third of the time, C 30% of the time (the
    random problems of tests/test_selection.py and examples/select_equality.py too)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        m, n, k = (int(round(2 ** rng.uniform(lo, 14 if lo == 0 else 15))) for lo in (0, 6, 6))
        n = -(-n // 8) * 8 if rng.random() < 0.5 else n
        k = -(-k // 8) * 8 if rng.random() < 0.5 else k
        a_major, b_major = LAYOUTS[rng.choice(sorted(LAYOUTS))]
        out.append(
            Problem(
                m,
                n,
                k,
                dtype=rng.choice(["bf16", "fp16"]),
                out_dtype=rng.choice([None, None, "fp32"]),
                a_major=a_major,
                b_major=b_major,
                has_c=rng.random() < 0.3,
            )
        )
    return out


def problem_memos() -> list:
    """The memos of a problem's parts (not of a kind's layouts), in whichever of them this tree has."""
    names = ("_skeleton", "_by_n", "_completed", "_swapped", "_narrowed", "_last_partial_rows")
    return [heuristics.select, geometry.choose_raster] + [getattr(sm90, n) for n in names if hasattr(sm90, n)]


def problem_sets(per_weight: int) -> dict[str, tuple[list[Problem], list[Problem]]]:
    """{name: (warm-up problems, fresh problems)}."""
    kinds: dict = {}
    for p in random_problems(7, 400):
        kinds.setdefault((p.dtype, p.out_dtype, p.a_major, p.b_major, p.has_c), p)
    warm = list(kinds.values())
    fresh = [p for p in random_problems(8, 250) if p not in warm]
    rng = random.Random(9)
    weights_warm = [Problem(1000, *w) for w in WEIGHTS]
    weights = []
    for w in WEIGHTS:
        ms = set()
        while len(ms) < per_weight:
            m = int(round(2 ** rng.uniform(0, 14)))
            if m != 1000:
                ms.add(m)
        weights += [Problem(m, *w) for m in sorted(ms)]
    small = [Problem(m, *w) for w in WEIGHTS for m in range(1, 129) if m != 1000]
    return {"random": (warm, fresh), "fixed weight": (weights_warm, weights), "small M": (weights_warm, small)}


class CollectorPasses:
    """The garbage collector's passes of generations 1 and 2 as they run: per generation, their
    count (`count[g]`) and milliseconds (`ms[g]`). Generation 0 passes are left out: they walk
    only the objects made since the last pass (at most ~700), a fraction of a select."""

    GENERATIONS = (1, 2)

    def __init__(self):
        self.ms: dict[int, list[float]] = {g: [] for g in self.GENERATIONS}
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        generation = info["generation"]
        if generation not in self.ms:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms[generation].append((time.perf_counter() - self._start) * 1e3)

    @property
    def count(self) -> dict[int, int]:
        return {g: len(ms) for g, ms in self.ms.items()}

    def total(self) -> int:
        return sum(map(len, self.ms.values()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--per-weight", type=int, default=50, help="token counts per fixed weight")
    ap.add_argument("--json", help="write the per-problem times (us) here")
    ap.add_argument("--freeze", action="store_true", help="gc.freeze() after each pass's warm-up")
    args = ap.parse_args()
    sets = problem_sets(args.per_weight)
    rng = random.Random(10)
    record = {}
    passes = CollectorPasses()
    gc.callbacks.append(passes)
    for name, (warm, fresh) in sets.items():
        for p in warm:
            heuristics.select(p, H200)
        rows = []
        order = list(fresh)
        rng.shuffle(order)
        for _ in range(args.passes):
            for memo in problem_memos():
                memo.cache_clear()
            for p in warm:
                heuristics.select(p, H200)
            if args.freeze:
                gc.freeze()
            times, clean = {}, []  # clean: the times of calls no generation 1 or 2 pass ran in
            before_pass = {g: len(passes.ms[g]) for g in passes.GENERATIONS}
            for p in order:
                before = passes.total()
                start = time.perf_counter()
                heuristics.select(p, H200)
                times[p] = (time.perf_counter() - start) * 1e6
                if passes.total() == before:
                    clean.append(times[p])
            t = sorted(times.values())
            rows.append([times[p] for p in fresh])
            ran = {g: passes.ms[g][before_pass[g] :] for g in passes.GENERATIONS}
            print(
                f"{name:>12}: {len(t)} problems, median {statistics.median(t):6.0f} us, "
                f"p90 {t[int(0.9 * len(t))]:6.0f} us, max {t[-1]:6.0f} us; "
                f"GC passes: gen 1 {len(ran[1])}{f' (max {max(ran[1]):.2f} ms)' if ran[1] else ''}, "
                f"full {len(ran[2])}{' (' + ', '.join(f'{ms:.1f}' for ms in ran[2]) + ' ms)' if ran[2] else ''}; "
                f"max without one {max(clean, default=float('nan')):6.0f} us"
            )
        if len(rows) > 1:  # (see the docstring)
            best = sorted(map(min, zip(*rows)))
            print(
                f"{name:>12}: each problem's fastest of {len(rows)} passes: median {statistics.median(best):6.0f} us, "
                f"max {best[-1]:6.0f} us"
            )
        record[name] = {"problems": [p.describe() for p in fresh], "times_us": rows}
    gc.callbacks.remove(passes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
