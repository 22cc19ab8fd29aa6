"""Large shapes against autotuned cuBLASLt (issue 19's last target): jitgemm (heuristics only)
beside nvmath-python's cuBLASLt matmul, planned and autotuned for each shape, and beside
torch.matmul, in one run, on the same operands.

    python examples/cublaslt_anchor.py [--shapes M,N,K ...] [--dtype bf16 fp16] [--rounds 9]
                                       [--autotune 10] [--json FILE]

nvmath-python is a benchmark-only dependency (``pip install nvmath-python``; not one of
jitgemm's). Each library runs 20 back-to-back calls per round, timed with CUDA events (at
>= 100 GFLOP a call takes >= ~130 us, far above any library's host time, so the GPU never waits
for the host), rounds interleaved with the first library rotating, the median per call reported.
The operands are row-major (M, K) and (K, N); every result is checked elementwise against
float64 with examples/sweep.py's bound first. nvmath's `Matmul` is planned, then autotuned
(`autotune(iterations)`: it times cuBLASLt's candidate algorithms on these operands and keeps
the fastest), then executed; jitgemm writes into a given output, torch.matmul and nvmath
allocate theirs (the caching allocator's cost is host-side, hidden behind the GPU at these sizes).

The default shapes: the public set's problems of at least 100 GFLOP and held-out LLM shapes
(never used to tune jitgemm's heuristics).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CALLS = 20
PUBLIC = ["4096,4096,4096", "8192,8192,8192", "4096,2112,7168", "4096,24576,1536", "4096,32768,512"]
PUBLIC += ["4096,7168,16384", "4096,4096,7168", "4096,7168,2048"]
HELD_OUT = ["2048,28672,8192", "8192,10240,8192", "6144,16384,5120", "3072,14336,4096", "16384,4096,3584"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=PUBLIC + HELD_OUT, help="M,N,K each")
    ap.add_argument("--dtype", nargs="*", default=["bf16", "fp16"], choices=("bf16", "fp16"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--autotune", type=int, default=10, help="nvmath autotune iterations per algorithm")
    ap.add_argument("--json")
    return ap.parse_args(argv)


def timed(torch, fn) -> float:
    """Microseconds per call of CALLS back-to-back calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / CALLS


def measure(shape: str, dtype: str, args, s) -> dict:
    import nvmath

    torch, jitgemm = s.torch, s.jitgemm
    m, n, k = (int(x) for x in shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(m * 31 + n * 17 + k)
    a = s.operand(m, k, dtype, False, gen)
    b = s.operand(k, n, dtype, False, gen)
    out = torch.empty(m, n, device="cuda", dtype=s.tdt[dtype])
    lt = nvmath.linalg.advanced.Matmul(a, b)
    lt.plan()
    lt.autotune(iterations=args.autotune)
    calls = {
        "jitgemm": lambda: jitgemm.gemm(a, b, out=out),
        "cublaslt": lt.execute,
        "torch": lambda: torch.matmul(a, b),
    }
    row = {"shape": [m, n, k], "dtype": dtype, "gflop": 2 * m * n * k / 1e9}
    for name, fn in calls.items():
        got = fn()
        torch.cuda.synchronize()
        row[f"{name}_error"] = s.errors([(got, dtype)], a, b)[0]
    times: dict = {name: [] for name in calls}
    names = list(calls)
    for r in range(args.rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            times[name].append(timed(torch, calls[name]))
    for name in names:
        row[f"{name}_us"] = statistics.median(times[name])
    row["vs_cublaslt"] = row["cublaslt_us"] / row["jitgemm_us"]
    row["vs_torch"] = row["torch_us"] / row["jitgemm_us"]
    row["config"] = jitgemm.config_for(jitgemm.Problem(m, n, k, dtype, dtype, "K", "N")).name
    lt.free()
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    import sweep

    s = sweep.Sweep(args)
    rows, wrong = [], 0
    for dtype in args.dtype:
        for shape in args.shapes:
            row = measure(shape, dtype, args, s)
            rows.append(row)
            bad = [name for name in ("jitgemm", "cublaslt", "torch") if not row[f"{name}_error"] <= 1.0]
            wrong += bool(bad)
            tf = row["gflop"] / row["jitgemm_us"] * 1e3
            print(
                f"{shape:>16} {dtype}: jitgemm {row['jitgemm_us']:8.1f} us ({tf:5.0f} TF/s)  cuBLASLt autotuned"
                f" {row['cublaslt_us']:8.1f}  torch {row['torch_us']:8.1f}  vs cuBLASLt {row['vs_cublaslt']:.3f}"
                f"  vs torch {row['vs_torch']:.3f}  {row['config']}{'  WRONG: ' + ','.join(bad) if bad else ''}",
                flush=True,
            )
    for dtype in args.dtype:
        ratios = [r["vs_cublaslt"] for r in rows if r["dtype"] == dtype]
        print(f"{dtype}: geomean vs autotuned cuBLASLt {math.exp(statistics.mean(map(math.log, ratios))):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
