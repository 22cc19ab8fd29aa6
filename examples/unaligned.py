"""Unaligned problems against their nearest aligned neighbours and cuBLAS, in one run (issue 20).

    python examples/unaligned.py [--json results.json] [--markdown table.md] [--smoke]

An unaligned problem has an odd (or not-a-multiple-of-8) N, K or leading dimension, so that TMA
cannot address some operand's rows in place: odd vocabularies, padding-free batches. For each
pair (unaligned shape, the aligned shape next to it) the script times, on the same rotating
inputs and interleaved round by round as examples/benchmark.py does (CUDA graphs, medians):
jitgemm on the unaligned problem, jitgemm on the aligned one, and cuBLAS (torch.matmul) on the
unaligned one. Each jitgemm result is first checked elementwise against a float64 reference.
Then the host time of one unaligned call against one aligned call (the rotating input sets in
turn, so new addresses every call, as in a model; examples/host_overhead.py's interleaved
measurement). A call that copies an operand keeps no plan: it takes the general path every
time, which its host time shows.

Ratios: `vs aligned` = unaligned time / aligned time (target <= 1.15), `vs cuBLAS` = cuBLAS
time / jitgemm time (target >= 1; >= 3 where cuBLAS falls off its odd-leading-dimension
cliff), `host` = unaligned host time / aligned host time (target <= 1.2).
"""

import argparse
import datetime
import json
import math
import statistics
import sys
from pathlib import Path

import torch

import jitgemm
from jitgemm import api, decode
from jitgemm.problem import Problem

sys.path.insert(0, str(Path(__file__).parent))  # python -P leaves the script's folder out
from benchmark import L2_DEFEAT_BYTES, copy_bandwidth, gpu_state, graph_of, time_graph  # noqa: E402
from host_overhead import measure  # noqa: E402
from sweep import error_ratio  # noqa: E402

ROUNDS = 15
# (unaligned M N K, aligned M N K, b as W.t() of an (N, K) weight)
PAIRS = [
    ((8191, 8193, 8192), (8192, 8192, 8192), False),
    ((1001, 3001, 2049), (1000, 3000, 2048), False),
    ((4095, 4097, 4096), (4096, 4096, 4096), False),
    ((4095, 4097, 4096), (4096, 4096, 4096), True),
    ((2048, 32001, 4096), (2048, 32000, 4096), True),
    ((2048, 151655, 4096), (2048, 151656, 4096), True),
    ((16, 50257, 4096), (16, 50256, 4096), True),
    ((777, 1001, 513), (776, 1000, 512), False),
    ((4096, 4096, 4095), (4096, 4096, 4096), False),
    ((129, 4097, 8191), (128, 4096, 8192), True),
    # decode against a row-major weight of odd N: read in place by the decode kernel (decode.py)
    ((1, 50257, 4096), (1, 50256, 4096), False),
    ((2, 32001, 4096), (2, 32000, 4096), False),
    ((2, 16332, 960), (2, 16336, 960), False),
    # decode against W.t() of a K not a multiple of 8: read in place by the K-major decode kernel
    ((1, 4096, 4097), (1, 4096, 4096), True),
    ((2, 4144, 14084), (2, 4144, 14080), True),
    ((8, 14336, 4095), (8, 14336, 4096), True),
    ((16, 11008, 4100), (16, 11008, 4096), True),
]
SMOKE_PAIRS = [
    ((1001, 3001, 2049), (1000, 3000, 2048), False),
    ((33, 1023, 2049), (32, 1024, 2048), True),
    ((2, 1001, 2049), (2, 1000, 2048), False),
]


def operands(m, n, k, w_t, copies_n):
    sets = []
    for _ in range(copies_n):
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = (
            torch.randn(n, k, device="cuda").to(torch.bfloat16).t()
            if w_t
            else torch.randn(k, n, device="cuda").to(torch.bfloat16)
        )
        sets.append((a, b, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
    return sets


def check(a, b, out):
    """Every element within the GPU tests' bound (sweep.error_ratio)."""
    a64, b64 = a.double(), b.double()
    worst = error_ratio(out.double(), a64 @ b64, a64.abs() @ b64.abs(), a.shape[1], "bf16")
    if not worst <= 1.0:
        raise AssertionError(f"{tuple(out.shape)}: an element is off by {worst:.3g} times its bound")


def bench_pair(unaligned, aligned, w_t, rounds):
    m, n, k = unaligned
    per_set = (m * k + k * n + m * n) * 2
    copies_n = max(2, min(32, math.ceil(L2_DEFEAT_BYTES / per_set)))
    odd = operands(*unaligned, w_t, copies_n)
    even = operands(*aligned, w_t, copies_n)
    api._plans.clear()
    for a, b, out in (odd[0], even[0]):
        out.fill_(float("nan"))
        jitgemm.gemm(a, b, out=out)
        check(a, b, out)
    decoders = {plan.call.kernel.name for plan in api._plans.values() if isinstance(plan.call, decode.DecodeLaunch)}
    g_odd = graph_of(lambda a, b, o: jitgemm.gemm(a, b, out=o), odd)
    g_even = graph_of(lambda a, b, o: jitgemm.gemm(a, b, out=o), even)
    g_ref = graph_of(lambda a, b, o: torch.matmul(a, b, out=o), odd)
    times: dict = {"odd": [], "even": [], "cublas": []}
    order = [("odd", g_odd), ("even", g_even), ("cublas", g_ref)]
    for r in range(rounds):  # interleaved, each round in another order
        for name, graph in order[r % 3 :] + order[: r % 3]:
            times[name].append(time_graph(graph))
    # the timed graph computes: one more replay, into NaN-filled outputs, checked
    for _, _, out in odd:
        out.fill_(float("nan"))
    g_odd.replay()
    torch.cuda.synchronize()
    a, b, out = odd[0]
    check(a, b, out)
    us = {name: statistics.median(t) for name, t in times.items()}
    # host time: new arrays every call, interleaved call by call
    it_odd, it_even = iter(range(1 << 30)), iter(range(1 << 30))
    host_odd, host_even = measure(
        lambda: jitgemm.gemm(*odd[next(it_odd) % copies_n][:2]),
        lambda: jitgemm.gemm(*even[next(it_even) % copies_n][:2]),
        200,
        drain_every=10,
    )
    problem = Problem(m, n, k, "bf16", a_major="K", b_major="K" if w_t else "N")
    return {
        "unaligned": unaligned,
        "aligned": aligned,
        "b": "W.t()" if w_t else "row-major",
        "jitgemm_us": us["odd"],
        "aligned_us": us["even"],
        "cublas_us": us["cublas"],
        "tflops": 2 * m * n * k / us["odd"] * 1e-6,
        "vs_aligned": us["odd"] / us["even"],
        "vs_cublas": us["cublas"] / us["odd"],
        "host_us": host_odd,
        "aligned_host_us": host_even,
        "host_ratio": host_odd / host_even,
        "config": f"{', '.join(sorted(decoders))} (decode.py)" if decoders else api.config_for(problem).name,
    }


def markdown(rows) -> str:
    lines = [
        "| unaligned M×N×K | b | jitgemm µs | TF/s | aligned M×N×K | aligned µs | vs aligned | cuBLAS µs | vs cuBLAS "
        "| host µs (aligned) | host ratio |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            "| {} | {} | {:.1f} | {:.0f} | {} | {:.1f} | {:.3f} | {:.1f} | {:.2f}× | {:.1f} ({:.1f}) | {:.2f} |".format(
                "×".join(map(str, r["unaligned"])),
                r["b"],
                r["jitgemm_us"],
                r["tflops"],
                "×".join(map(str, r["aligned"])),
                r["aligned_us"],
                r["vs_aligned"],
                r["cublas_us"],
                r["vs_cublas"],
                r["host_us"],
                r["aligned_host_us"],
                r["host_ratio"],
            )
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write all numbers to this file")
    parser.add_argument("--markdown", help="write the table for BENCHMARKS.md to this file")
    parser.add_argument("--smoke", action="store_true", help="two small pairs, few rounds (the GPU test suite)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    before = gpu_state()
    copy_bps = copy_bandwidth()
    rows = []
    for unaligned, aligned, w_t in SMOKE_PAIRS if args.smoke else PAIRS:
        row = bench_pair(unaligned, aligned, w_t, 3 if args.smoke else ROUNDS)
        rows.append(row)
        print(
            f"{'x'.join(map(str, unaligned)):>18} b={row['b']:<9} jit {row['jitgemm_us']:9.1f} us"
            f"  aligned {row['aligned_us']:9.1f} us ({row['vs_aligned']:.3f})  cublas {row['cublas_us']:9.1f} us"
            f" ({row['vs_cublas']:.2f}x)  host {row['host_us']:.1f}/{row['aligned_host_us']:.1f} us"
            f" ({row['host_ratio']:.2f})  {row['config']}",
            flush=True,
        )
    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu_before": before,
        "gpu_after": gpu_state(),
        "copy_bandwidth_GBps": copy_bps * 1e-9,
        "jitgemm_version": jitgemm.__version__,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows))


if __name__ == "__main__":
    main()
