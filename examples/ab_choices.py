"""Time the configs two commits' heuristics choose, side by side on one GPU: a heuristics change
judged by measurement, not by its own model.

    python examples/ab_choices.py --ref main [--seed S] [--count 300] [--rounds 7] [--calls-per-graph 20]
                                  [--json FILE]
    python examples/ab_choices.py --ref main --list      # the problems whose choice differs; no GPU
    python examples/ab_choices.py --ref-tree DIR [...]   # the reference is a directory holding a tree
    python examples/ab_choices.py --shapes FILE [...]    # these problems instead of a sweep seed's

The problems are examples/sweep.py's for the seed (`sweep.draw`), or those of --shapes (a JSON
list of [m, n, k, layout, dtype, out_dtype, has_c], layout as sweep.py names them, out_dtype
null for the input's), as gemm sees them (`sweep.kernel_problem`). Each tree chooses in its own
process (`heuristics.select`, this checkout's script with the tree's jitgemm; --ref is exported
with `git archive` by examples/select_equality.py's `exported`; --ref-tree names a tree already
on disk, for a machine without the git history). Every problem whose two configs differ is
then run with each config forced (gemm's config=), on the same fresh random operands rotated
over enough copies to defeat L2, both results checked into NaN-poisoned outputs against float64
with the sweep's elementwise bound; its time is the median of --rounds replays of a CUDA graph
of 20 calls (--calls-per-graph; 1 times lone calls; examples/benchmark.py's helpers), the two
configs' rounds interleaved, the first alternating.

Prints each differing problem with both times and ratio = ref / this (above 1: this
checkout's choice is faster), then the geomean of the ratios, how many are faster or slower by
more than NOISE, and the worst. Exit status 1 when a result is wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOISE = 0.02  # ratios within 1 +- NOISE count as ties


def _sweep():
    """examples/sweep.py of this checkout (its draw and its GPU helpers), whichever jitgemm the
    process imports."""
    sys.path.insert(0, str(HERE))
    import sweep

    return sweep


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="main", help="the git ref whose choices are compared [main]")
    ap.add_argument("--ref-tree", help="a directory holding the reference tree (instead of --ref)")
    ap.add_argument("--shapes", help="a JSON file of problems to compare instead of the seed's")
    ap.add_argument("--seed", type=int, default=1, help="the sweep seed of the problems [1]")
    ap.add_argument("--count", type=int, default=300, help="problems drawn [300]")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds of each config [7]")
    calls = _sweep().DEFAULT_CALLS_PER_GRAPH
    ap.add_argument(
        "--calls-per-graph",
        type=int,
        default=calls,
        help=f"calls in each timed CUDA graph [{calls}]; 1 times lone calls (examples/sweep.py's docstring)",
    )
    ap.add_argument("--arch", default="sm_90a", help="the arch the heuristics choose for [sm_90a]")
    ap.add_argument("--num-sms", type=int, default=132, help="its SM count [132, the H200's]")
    ap.add_argument("--json", help="write every differing problem's row here")
    ap.add_argument("--list", action="store_true", help="list the problems whose choice differs; no GPU")
    ap.add_argument("--dump", help=argparse.SUPPRESS)  # internal: write this tree's choices here
    args = ap.parse_args(argv)
    if args.count < 1 or args.rounds < 1 or args.calls_per_graph < 1:
        ap.error("--count, --rounds and --calls-per-graph must be at least 1")
    if args.ref_tree is not None:
        if not (Path(args.ref_tree) / "jitgemm" / "__init__.py").is_file():
            ap.error(f"--ref-tree {args.ref_tree}: no jitgemm package there")
        args.ref = args.ref_tree
    return args


def problem_list(args) -> list:
    """The problems compared: those of --shapes, else the first --count of the sweep seed's.
    ValueError naming --shapes for a file that is not a list of such rows."""
    if not args.shapes:
        return _sweep().problems(args.seed, args.count)
    from jitgemm.problem import LAYOUTS, Problem

    try:
        rows = json.loads(Path(args.shapes).read_text())
        return [Problem(m, n, k, dt, odt or dt, *LAYOUTS[lay], bool(c)) for m, n, k, lay, dt, odt, c in rows]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"--shapes {args.shapes}: not a JSON list of [m, n, k, layout, dtype, out_dtype, has_c]: {exc}"
        ) from None


def choices(args) -> list:
    """The config each problem gets from this process's heuristics (as a dict)."""
    from jitgemm import heuristics
    from jitgemm.heuristics.device import DeviceSpec

    sweep = _sweep()
    spec = DeviceSpec(args.arch, args.num_sms)
    return [heuristics.select(sweep.kernel_problem(p), spec).to_dict() for p in problem_list(args)]


def _tree_choices(tree: Path, args, path: Path) -> list:
    # the tree first; the rest of the path (e.g. where dependencies are installed) kept
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH"))))}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--dump", str(path), "--seed", str(args.seed)]
    cmd += ["--count", str(args.count), "--arch", args.arch, "--num-sms", str(args.num_sms)]
    if args.shapes:
        cmd += ["--shapes", str(Path(args.shapes).resolve())]
    subprocess.run(cmd, env=env, check=True, cwd=tree)
    return json.loads(path.read_text())


def both_choices(args) -> tuple[list, list]:
    """(--ref's choices, this checkout's), each computed in its own process; --ref exported as
    examples/select_equality.py exports it, or --ref-tree as it is."""
    sys.path.insert(0, str(HERE))
    from select_equality import exported

    with contextlib.ExitStack() as stack:
        ref_tree = Path(args.ref_tree).resolve() if args.ref_tree else stack.enter_context(exported(args.ref))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        return _tree_choices(ref_tree, args, tmp / "ref.json"), _tree_choices(ROOT, args, tmp / "new.json")


def differing(ref: list, new: list) -> list[int]:
    """Indices of the problems whose two configs differ; a field one tree's configs lack counts
    at this checkout's default (that tree ran without it: KernelConfig(stream_k) is newer than
    main's of session 21)."""
    if len(ref) != len(new):
        raise ValueError(f"{len(ref)} choices against {len(new)}: not the same problems")
    from jitgemm.config import KernelConfig

    defaults = {f.name: f.default for f in dataclasses.fields(KernelConfig)}
    return [i for i, (a, b) in enumerate(zip(ref, new)) if {**defaults, **a} != {**defaults, **b}]


def summary(rows: list[dict]) -> dict:
    """Geomean of ref / this over the rows timed, the counts beyond NOISE either way, the worst."""
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    if not ratios:
        return {"timed": 0}
    return {
        "timed": len(ratios),
        "geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)),
        "faster": sum(x > 1 + NOISE for x in ratios),
        "slower": sum(x < 1 - NOISE for x in ratios),
        "worst": min(ratios),
        "best": max(ratios),
    }


def measure(sweep_mod, s, index: int, p, cfg_ref, cfg_new, rounds: int, graph_calls: int) -> dict:
    """Both configs on problem `p` (the sweep's `index`-th): checked, then timed interleaved."""
    torch, bm = s.torch, s.bm
    beta = sweep_mod.BETA
    row = {**sweep_mod.problem_fields(index, p), "ref_config": cfg_ref.name, "config": cfg_new.name}
    gen = torch.Generator(device="cuda").manual_seed(index * 1_000_003 + 17)
    copies = []
    for _ in range(sweep_mod.rotating_copies(p, bm.L2_DEFEAT_BYTES)):
        a = s.operand(p.m, p.k, p.dtype, p.a_major == "M", gen)
        b = s.operand(p.k, p.n, p.dtype, p.b_major == "K", gen)
        c = s.operand(p.m, p.n, p.out_dtype, False, gen) if p.has_c else None
        copies.append((a, b, c, s.nan(p, p.out_dtype)))

    def call(cfg):
        if p.has_c:
            return lambda a, b, c, o: s.jitgemm.gemm(a, b, out=o, c=c, beta=beta, config=cfg)
        return lambda a, b, c, o: s.jitgemm.gemm(a, b, out=o, config=cfg)

    calls = {"ref": call(cfg_ref), "new": call(cfg_new)}
    a0, b0, c0, _ = copies[0]
    for side, fn in calls.items():
        out = s.nan(p, p.out_dtype)
        fn(a0, b0, c0, out)
        torch.cuda.synchronize()
        row[f"{side}_error"] = s.errors([(out, p.out_dtype)], a0, b0, c0)[0]
    if not (row["ref_error"] <= 1.0 and row["new_error"] <= 1.0):
        return row
    graphs = {side: bm.graph_of(fn, copies, graph_calls) for side, fn in calls.items()}
    times: dict = {"ref": [], "new": []}
    for r in range(rounds):
        for side in ("ref", "new") if r % 2 == 0 else ("new", "ref"):
            times[side].append(bm.time_graph(graphs[side], graph_calls))
    row["ref_us"], row["us"] = statistics.median(times["ref"]), statistics.median(times["new"])
    row["ratio"] = row["ref_us"] / row["us"]
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dump:
        Path(args.dump).write_text(json.dumps(choices(args)))
        return 0
    sweep_mod = _sweep()
    plist = problem_list(args)
    ref, new = both_choices(args)
    diff = differing(ref, new)
    source = f"shapes {args.shapes}" if args.shapes else f"seed {args.seed}"
    print(f"{source}: {len(plist)} problems, {len(diff)} choose differently here than {args.ref}")
    from jitgemm.config import KernelConfig

    pairs = [(i, KernelConfig.from_dict(ref[i]), KernelConfig.from_dict(new[i])) for i in diff]
    if args.list:
        for i, a, b in pairs:
            print(f"  #{i:<4d} {plist[i].describe()}\n        {args.ref}: {a.name}\n        here: {b.name}")
        return 0
    import warnings

    s = sweep_mod.Sweep(args)
    warnings.filterwarnings("ignore", category=s.jitgemm.FallbackCopyWarning)
    rows, wrong = [], 0
    for i, a, b in pairs:
        row = measure(sweep_mod, s, i, plist[i], a, b, args.rounds, args.calls_per_graph)
        rows.append(row)
        if "ratio" not in row:
            wrong += 1
            print(f"  #{i:<4d} WRONG RESULT ({row['ref_error']:.3g}, {row['new_error']:.3g}) {plist[i].describe()}")
            continue
        print(
            f"  #{i:<4d} {plist[i].describe()}: {args.ref} {row['ref_us']:8.1f} us  here {row['us']:8.1f} us"
            f"  ratio {row['ratio']:.3f}  ({a.name} -> {b.name})",
            flush=True,
        )
    result = {
        "ref": args.ref,
        "seed": args.seed,
        "shapes": args.shapes,
        "count": len(plist),
        "calls_per_graph": args.calls_per_graph,
        "summary": summary(rows),
        "rows": rows,
    }
    got = result["summary"]
    if got["timed"]:
        print(
            f"{got['timed']} timed: geomean {args.ref} / here {got['geomean']:.4f}, faster here {got['faster']}, "
            f"slower {got['slower']} (beyond {NOISE:.0%}), worst {got['worst']:.3f}, best {got['best']:.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
