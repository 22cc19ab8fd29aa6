"""jitgemm vs cuBLAS (torch.matmul), side by side on the same inputs, in one run.

    python examples/benchmark.py [--shapes examples/public_shapes.txt] [--dtypes bf16,fp16]
                                 [--json results.json] [--check] [--tune]

For each shape both libraries are timed on the same rotating set of input copies (enough of
them that the working set is several times the 60 MB L2), interleaved round by round. Each
round replays a CUDA graph of back-to-back calls and is timed with CUDA events, so host launch
overhead is excluded for both; the per-call median over rounds is reported. The run also
measures device-to-device copy bandwidth, to express memory-bound shapes as a fraction of it,
and records the GPU, its SM clock before and after, power draw and the date.

With --tune every shape is first tuned on this GPU (`jitgemm.tuning.tune`, as `jitgemm tune`
does) and the tuning file then picks jitgemm's configs; without it, configs come from the
tuning file when it has the shape (`JITGEMM_TUNED=0` ignores it), else from the heuristics.
The table marks tuned configs.
"""

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

import jitgemm
from jitgemm import api, heuristics, runtime, tuned, tuning
from jitgemm.problem import Problem

L2_DEFEAT_BYTES = 512 << 20  # rotate through at least this many bytes of inputs
CALLS_PER_GRAPH = 20
ROUNDS = 15


def read_shapes(path):
    shapes = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            shapes.append(tuple(int(x) for x in line.split()))
    return shapes


def gpu_state():
    fields = "name,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu"
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            .stdout.strip()
            .splitlines()[0]
        )
        return dict(zip(fields.split(","), (v.strip() for v in out.split(","))))
    except (OSError, IndexError, subprocess.SubprocessError):
        return {"name": torch.cuda.get_device_name()}


def graph_of(fn, copies, calls=CALLS_PER_GRAPH):
    """A CUDA graph of `calls` calls of fn, rotating through the input copies."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):  # warm-up: loads kernels, picks cuBLAS algos
            fn(*copies[i % len(copies)])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*copies[i % len(copies)])
    return graph


def time_graph(graph, calls=CALLS_PER_GRAPH):
    """Microseconds per call of one replay of `graph`, a graph of `calls` calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def copy_bandwidth():
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    return 2 * n / statistics.median(times)  # bytes read + written per second


def bench_shape(m, n, k, dtype, check):
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    per_set = (m * k + k * n + m * n) * 2
    copies_n = max(2, min(64, math.ceil(L2_DEFEAT_BYTES / per_set)))
    copies = []
    for _ in range(copies_n):
        a = torch.randn(m, k, device="cuda", dtype=torch.float32).to(tdt)
        b = torch.randn(k, n, device="cuda", dtype=torch.float32).to(tdt)
        copies.append((a, b, torch.empty(m, n, device="cuda", dtype=tdt), torch.empty(m, n, device="cuda", dtype=tdt)))
    if check:  # the chosen kernel is right on these inputs before it is timed
        a, b, out, _ = copies[0]
        out.fill_(float("nan"))
        jitgemm.gemm(a, b, out=out)
        ref = a.double() @ b.double()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        limit = 1e-2 if dtype == "bf16" else 2e-3
        if not err <= limit:
            raise AssertionError(f"{m}x{n}x{k} {dtype}: relative error {err:.3g} > {limit}")
    g_jit = graph_of(lambda a, b, o, _: jitgemm.gemm(a, b, out=o), copies)
    g_ref = graph_of(lambda a, b, _, o: torch.matmul(a, b, out=o), copies)
    t_jit, t_ref = [], []
    for _ in range(ROUNDS):  # interleaved: one round of each, alternately
        t_jit.append(time_graph(g_jit))
        t_ref.append(time_graph(g_ref))
    us_jit, us_ref = statistics.median(t_jit), statistics.median(t_ref)
    problem = Problem(m, n, k, dtype, dtype, "K", "N")
    cfg = api.config_for(problem)
    return {
        "m": m,
        "n": n,
        "k": k,
        "dtype": dtype,
        "jitgemm_us": us_jit,
        "cublas_us": us_ref,
        "jitgemm_tflops": 2 * m * n * k / us_jit * 1e-6,
        "cublas_tflops": 2 * m * n * k / us_ref * 1e-6,
        "jitgemm_gbps": per_set / us_jit * 1e-3,
        "cublas_gbps": per_set / us_ref * 1e-3,
        "ratio": us_ref / us_jit,
        "config": cfg.name,
        "tuned": cfg != heuristics.select(problem, api.device_spec(0))
        and cfg == tuned.tuned_config(problem, api.device_spec(0), runtime.device_info(0).name),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=str(Path(__file__).with_name("public_shapes.txt")))
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--json", help="write all numbers to this file")
    parser.add_argument("--markdown", help="write the table for BENCHMARKS.md to this file")
    parser.add_argument("--check", action="store_true", help="check each shape against a float64 reference first")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="first run `jitgemm tune` on every shape (the tuning file then picks the configs)",
    )
    args = parser.parse_args(argv)
    shapes = read_shapes(args.shapes)
    torch.manual_seed(0)
    if args.tune:
        for dtype in args.dtypes.split(","):
            for m, n, k in shapes:
                r = tuning.tune(Problem(m, n, k, dtype, dtype, "K", "N"))
                first = r.chosen_by_heuristics
                print(
                    f"tuned {dtype} {m}x{n}x{k}: {r.best.name} {r.times_us[r.best.name]:.2f} us, the heuristics' "
                    f"{first} {r.times_us[first]:.2f} us",
                    flush=True,
                )
    before = gpu_state()
    copy_bps = copy_bandwidth()
    rows = []
    for dtype in args.dtypes.split(","):
        for m, n, k in shapes:
            row = bench_shape(m, n, k, dtype, args.check)
            row["copy_fraction"] = row["jitgemm_gbps"] * 1e9 / copy_bps
            rows.append(row)
            print(
                f"{dtype} {m:>5} {n:>6} {k:>6}  jit {row['jitgemm_us']:9.1f} us {row['jitgemm_tflops']:6.1f} TF/s"
                f"  cublas {row['cublas_us']:9.1f} us {row['cublas_tflops']:6.1f} TF/s  ratio {row['ratio']:.3f}"
                f"  {row['jitgemm_gbps']:6.0f} GB/s ({row['copy_fraction']:.0%} of copy)  {row['config']}",
                flush=True,
            )
    after = gpu_state()
    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu_before": before,
        "gpu_after": after,
        "copy_bandwidth_GBps": copy_bps * 1e-9,
        "jitgemm_version": jitgemm.__version__,
        "rows": rows,
        "geomean": {},
        "programmatic_launch": os.environ.get(runtime.ENV_PDL, "1") != "0",
        "tuning": {"enabled": tuned.enabled(), "tuned_now": args.tune, "rows_tuned": sum(r["tuned"] for r in rows)},
    }
    print(
        f"\n{before.get('name')}  SM clock before {before.get('clocks.sm')} after {after.get('clocks.sm')}"
        f"  power before {before.get('power.draw')} after {after.get('power.draw')}"
        f"  copy bandwidth {copy_bps * 1e-9:.0f} GB/s  {summary['date']}"
    )
    print(f"{'dtype':5} {'geomean jit/cuBLAS':>20} {'slowest shape':>30}")
    for dtype in args.dtypes.split(","):
        sel = [r for r in rows if r["dtype"] == dtype]
        gm = math.exp(sum(math.log(r["ratio"]) for r in sel) / len(sel))
        worst = min(sel, key=lambda r: r["ratio"])
        summary["geomean"][dtype] = gm
        print(f"{dtype:5} {gm:20.3f} {worst['m']}x{worst['n']}x{worst['k']} ({worst['ratio']:.3f})".rjust(30))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(summary))
    return summary


def tuned_note(summary):
    tuning_state = summary.get("tuning", {})
    if not tuning_state.get("rows_tuned"):
        return "configs chosen by the heuristics"
    how = "tuned in this run (`--tune`)" if tuning_state.get("tuned_now") else "from the tuning file"
    return f"{tuning_state['rows_tuned']} configs {how}, marked (tuned); the rest the heuristics' choice"


def markdown(summary):
    """The run as Markdown: conditions, then one table per dtype with the geometric mean."""
    b, a = summary["gpu_before"], summary["gpu_after"]
    lines = [
        f"{b.get('name')}, {summary['date']}, jitgemm {summary['jitgemm_version']}; SM clock "
        f"{b.get('clocks.sm')} before / {a.get('clocks.sm')} after, power {b.get('power.draw')} before / "
        f"{a.get('power.draw')} after (limit {b.get('power.limit')}); device-to-device copy "
        f"{summary['copy_bandwidth_GBps']:.0f} GB/s (read + write); jitgemm programmatic dependent launch "
        f"{'on' if summary['programmatic_launch'] else 'off (JITGEMM_PDL=0)'}; "
        f"{tuned_note(summary)}.",
        "",
    ]
    for dtype, gm in summary["geomean"].items():
        lines += [
            f"**{dtype}**: geometric mean of cuBLAS time / jitgemm time = **{gm:.3f}**",
            "",
            "| M | N | K | jitgemm µs | cuBLAS µs | ratio | jitgemm TFLOP/s | GB/s (% of copy) | config |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in summary["rows"]:
            if r["dtype"] == dtype:
                lines.append(
                    f"| {r['m']} | {r['n']} | {r['k']} | {r['jitgemm_us']:.1f} | {r['cublas_us']:.1f} | "
                    f"{r['ratio']:.3f} | {r['jitgemm_tflops']:.0f} | {r['jitgemm_gbps']:.0f} "
                    f"({r['copy_fraction']:.0%}) | `{r['config'].removeprefix('sm_90a_')}`"
                    f"{' (tuned)' if r.get('tuned') else ''} |"
                )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
