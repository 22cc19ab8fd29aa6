"""Compile and cache timings on the machine at hand (the numbers in BENCHMARKS.md).

    python examples/compile_benchmark.py [--repeats 7] [--warm-runs 15] [--jobs 1,2] [--json]

1. Cold: the NVRTC compile of single kernels (render excluded), repeated; the median is the number.
2. Warm: fresh processes reach a kernel's cubin from the disk cache, with JITGEMM_OFFLINE=1 so a
   miss would fail. Timed inside the child from the first line of the script (interpreter start
   excluded) to the cubin bytes being ready, with and without `import jitgemm`. Loading the module
   into a CUDA context is not measured (it needs a GPU). The children use bytecode caching in a
   private PYTHONPYCACHEPREFIX, as an installed package would, after one warm-up run.
3. Precompile: `examples/precompile_llm_shapes.py --jobs N` into an empty cache (cold), then again
   (everything cached); wall time of the whole command, process start included.

Other processes compete for the CPUs on a shared machine: the load average is printed with the
results, and the CPU time of the cold compiles is shown next to their wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jitgemm import compiler, kernels
from jitgemm.cache import KernelCache
from jitgemm.heuristics import DeviceSpec, select
from jitgemm.problem import Problem

HERE = Path(__file__).resolve().parent
DEVICE = DeviceSpec("sm_90a", 132)
COLD_SHAPES = [(4096, 4096, 4096), (128, 7168, 2048), (1, 4096, 4096)]
WARM_SHAPE = (4096, 4096, 4096)

WARM_CHILD = """
import time
t0 = time.perf_counter()
import json, sys
import jitgemm
from jitgemm import kernels
from jitgemm.heuristics import DeviceSpec, select
t1 = time.perf_counter()
problem = jitgemm.Problem(*map(int, sys.argv[1:4]))
built = kernels.build(select(problem, DeviceSpec("sm_90a", 132)), problem=problem)
t2 = time.perf_counter()
assert built.cache.hit and built.cubin[:4] == b"\\x7fELF"
print(json.dumps({"import_s": t1 - t0, "to_cubin_s": t2 - t1, "total_s": t2 - t0}))
"""


def cold(repeats: int) -> list[dict]:
    compiler.nvrtc_version()  # loads NVRTC once, outside the timings
    rows = []
    for m, n, k in COLD_SHAPES:
        src = kernels.prepare(select(Problem(m, n, k), DEVICE))
        walls, cpus = [], []
        for _ in range(repeats):
            c0 = time.process_time()
            walls.append(compiler.compile_cubin(src.source, src.config.arch).seconds)
            cpus.append(time.process_time() - c0)
        rows.append(
            {
                "shape": f"{m}x{n}x{k}",
                "kernel": src.name,
                "median_s": statistics.median(walls),
                "min_s": min(walls),
                "max_s": max(walls),
                "median_cpu_s": statistics.median(cpus),
            }
        )
    return rows


def warm(runs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cache"
        problem = Problem(*WARM_SHAPE)
        kernels.build(select(problem, DEVICE), KernelCache(root))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(JITGEMM_CACHE_DIR=str(root), JITGEMM_OFFLINE="1", PYTHONPYCACHEPREFIX=str(Path(tmp) / "pyc"))
        args = [sys.executable, "-c", WARM_CHILD, *map(str, WARM_SHAPE)]
        samples = []
        for i in range(runs + 1):  # the first run fills the bytecode cache
            out = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
            if i:
                samples.append(json.loads(out.stdout))
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]} | {"runs": runs}


def precompile(jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, JITGEMM_CACHE_DIR=str(Path(tmp) / "cache"))
        env.pop("JITGEMM_OFFLINE", None)
        args = [
            sys.executable,
            str(HERE / "precompile_llm_shapes.py"),
            "--jobs",
            str(jobs),
            "--arch",
            DEVICE.arch,
            "--num-sms",
            str(DEVICE.num_sms),
            "--json",
        ]
        result = {"jobs": jobs}
        for phase in ("cold", "cached"):
            start = time.perf_counter()
            out = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
            summary = json.loads(out.stdout)
            result[phase] = {
                "wall_s": time.perf_counter() - start,
                "shapes": summary["shapes"],
                "kernels": len(summary["kernels"]),
                "compiled": summary["compiled"],
                "hits": summary["hits"],
            }
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="compiles per kernel for the cold median")
    parser.add_argument("--warm-runs", type=int, default=15, help="fresh processes for the warm median")
    parser.add_argument("--jobs", default="1,2", help="comma-separated --jobs values for the precompile runs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    results = {
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg()[0],
        "nvrtc": compiler.nvrtc_version(),
        "cold": cold(args.repeats),
        "warm": warm(args.warm_runs),
        "precompile": [precompile(int(j)) for j in args.jobs.split(",")],
        "loadavg_after": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"NVRTC {results['nvrtc']}, {results['cpus']} CPUs, load average "
        f"{results['loadavg_before']:.2f} before / {results['loadavg_after']:.2f} after"
    )
    print(f"\nCold NVRTC compile ({args.repeats} runs each)\n")
    print("| shape | kernel | median | min | max | median CPU |\n|---|---|---|---|---|---|")
    for r in results["cold"]:
        print(
            f"| {r['shape']} | `{r['kernel']}` | {r['median_s']:.3f} s | {r['min_s']:.3f} s | "
            f"{r['max_s']:.3f} s | {r['median_cpu_s']:.3f} s |"
        )
    w = results["warm"]
    print(f"\nWarm start from the disk cache (median of {w['runs']} fresh processes)\n")
    print(f"- `import jitgemm`: {1e3 * w['import_s']:.1f} ms")
    print(f"- select + render + key + verified cubin read: {1e3 * w['to_cubin_s']:.1f} ms")
    print(f"- total from the script's first line to the cubin bytes: {1e3 * w['total_s']:.1f} ms")
    print("\nPrecompile examples/llm_shapes.txt (process start included)\n")
    print("| --jobs | shapes | kernels | cold | cached (second run) |\n|---|---|---|---|---|")
    for p in results["precompile"]:
        print(
            f"| {p['jobs']} | {p['cold']['shapes']} | {p['cold']['kernels']} | {p['cold']['wall_s']:.1f} s "
            f"({p['cold']['compiled']} compiled) | {p['cached']['wall_s']:.1f} s "
            f"({p['cached']['hits']} hits, {p['cached']['compiled']} compiled) |"
        )


if __name__ == "__main__":
    main()
