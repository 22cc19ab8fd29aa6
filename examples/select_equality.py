"""Do two commits select the same configs? `heuristics.select` (and `explain`, as JSON) of the
same problems, by this checkout and by a git ref, compared field for field.

Problems (sm_90a, 132 SMs, unless said): `--count` random ones as select_latency.random_problems draws
them (M log-uniform in 1..16384, N and K in 64..32768, half of N and K not multiples of 8,
every layout, both dtypes, fp32 outputs, C), every M of 1..`--dense` for a few fixed weights (in a shuffled order),
the 480 problems of tests/data/recorded_choices.json (both archs), and `explain` (top 5) of
every `--explain-every`-th random problem. Each tree runs in its own process, with its memos
warm as a server's would be (the dense sweeps after the random problems).

    PYTHONPATH=. python examples/select_equality.py --ref main --count 1500

Exit status 1 when any answer differs (the first few are printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DENSE_WEIGHTS = (  # (N, K, dtype, out_dtype, a_major, b_major, has_c)
    (4096, 4096, "bf16", None, "K", "K", False),
    (2112, 7168, "bf16", None, "K", "N", False),
    (577, 4097, "fp16", "fp32", "M", "N", True),
    (24576, 1536, "bf16", None, "M", "K", True),
)


def dump(count: int, dense: int, explain_every: int, seed: int) -> dict:
    """{key: answer} of the tree on sys.path."""
    # this tree's jitgemm: imported here, in the process of --dump
    from select_latency import random_problems

    from jitgemm import heuristics
    from jitgemm.heuristics import DeviceSpec
    from jitgemm.problem import Problem

    h200 = DeviceSpec("sm_90a", 132)
    out = {}

    def answer(p, device):
        try:
            return heuristics.select(p, device).to_dict()
        except ValueError as exc:
            return f"ValueError: {exc}"

    for i, p in enumerate(random_problems(seed, count)):
        out[f"random {p.describe()}"] = answer(p, h200)
        if explain_every and i % explain_every == 0:
            out[f"explain {p.describe()}"] = json.dumps(heuristics.explain(p, h200, top=5), sort_keys=True)
    dense_problems = [Problem(m, *w) for w in DENSE_WEIGHTS for m in range(1, dense + 1)]
    random.Random(seed).shuffle(dense_problems)  # (memos of M grains and spans met in any order)
    for p in dense_problems:
        out[f"dense {p.describe()}"] = answer(p, h200)
    recorded = json.loads((ROOT / "tests" / "data" / "recorded_choices.json").read_text())
    for arch, sms, *args, _name in recorded:
        p = Problem(*args)
        out[f"recorded {arch} {sms} {p.describe()}"] = answer(p, DeviceSpec(arch, sms))
    return out


@contextlib.contextmanager
def exported(ref: str):
    """A temporary directory holding `git archive ref` of this checkout (removed afterwards)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "ref"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        yield tree


def run_tree(tree: Path, args, path: Path) -> None:
    # the tree first; the rest of the path (e.g. where dependencies are installed) kept
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH"))))}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--dump", str(path)]
    cmd += ["--count", str(args.count), "--dense", str(args.dense), "--seed", str(args.seed)]
    cmd += ["--explain-every", str(args.explain_every)]
    subprocess.run(cmd, env=env, check=True, cwd=tree)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="main", help="the git ref to compare with")
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--dense", type=int, default=2048, help="every M of 1..this for each fixed weight")
    ap.add_argument("--explain-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--dump", help=argparse.SUPPRESS)  # internal: write this tree's answers here
    args = ap.parse_args()
    if args.dump:
        Path(args.dump).write_text(json.dumps(dump(args.count, args.dense, args.explain_every, args.seed)))
        return 0
    with exported(args.ref) as ref_tree, tempfile.TemporaryDirectory() as tmp:
        run_tree(ref_tree, args, Path(tmp) / "ref.json")
        run_tree(ROOT, args, Path(tmp) / "new.json")
        ref = json.loads((Path(tmp) / "ref.json").read_text())
        new = json.loads((Path(tmp) / "new.json").read_text())
    differ = sorted(k for k in ref.keys() | new.keys() if ref.get(k) != new.get(k))
    kinds: dict = {}
    for key in ref:
        kinds[key.split()[0]] = kinds.get(key.split()[0], 0) + 1
    print(f"{len(ref)} answers compared with {args.ref} ({kinds}): {len(differ)} differ")
    for key in differ[:5]:
        print(f"  {key}:\n    {args.ref}: {ref.get(key)}\n    here: {new.get(key)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
