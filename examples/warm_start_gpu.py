"""Warm start on a GPU machine: a fresh process reaching a *loaded* kernel from the disk cache.

    python examples/warm_start_gpu.py [--runs 15] [M N K]

Fills the cache once, then starts fresh processes with JITGEMM_OFFLINE=1 (a miss would fail).
Each child times itself from its first line (interpreter start excluded): `import jitgemm`,
creating the CUDA context (reported, not counted), and select + cache read + cuModuleLoadData
(`kernels.get`). Prints the medians.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import time, json, sys
t0 = time.perf_counter()
import jitgemm
from jitgemm import api, context, heuristics, kernels, runtime
from jitgemm.problem import Problem
t1 = time.perf_counter()
context.make_current(0)
t2 = time.perf_counter()
m, n, k = map(int, sys.argv[1:4])
kernels.get(heuristics.select(Problem(m, n, k), api.device_spec(0)), 0)
t3 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "context_ms": (t2 - t1) * 1e3, "get_ms": (t3 - t2) * 1e3}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("shape", nargs="*", type=int, default=[4096, 4096, 4096])
    args = parser.parse_args()
    shape = [str(x) for x in args.shape]
    with tempfile.TemporaryDirectory() as cwd:  # away from a checkout that would shadow jitgemm
        subprocess.run([sys.executable, "-c", CHILD, *shape], check=True, cwd=cwd, capture_output=True)
        env = dict(os.environ, JITGEMM_OFFLINE="1")
        runs = [
            json.loads(
                subprocess.run(
                    [sys.executable, "-c", CHILD, *shape], check=True, cwd=cwd, env=env, capture_output=True, text=True
                ).stdout
            )
            for _ in range(args.runs)
        ]
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(
        f"warm start {'x'.join(shape)}, median of {args.runs} fresh processes: import jitgemm "
        f"{med['import_ms']:.1f} ms, CUDA context {med['context_ms']:.1f} ms (not counted), "
        f"select + cache + module load {med['get_ms']:.1f} ms; total without the context "
        f"{med['import_ms'] + med['get_ms']:.1f} ms"
    )


if __name__ == "__main__":
    main()
