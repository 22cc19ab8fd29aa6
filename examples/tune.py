"""Measure the heuristics' best candidates for a shape against each other (and the model).

    python examples/tune.py [--shapes M,N,K ...] [--top 6] [--dtype bf16] [--json FILE]

For each shape it times `jitgemm explain`'s best `--top` candidates, plus each of them without
split-K, on the same rotating inputs with CUDA-graph replays (as examples/benchmark.py does),
and prints the modelled and measured microseconds side by side, fastest first. Use it to see
where the cost model ranks wrongly, or to pick a config for JITGEMM_CONFIG.
"""

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from benchmark import CALLS_PER_GRAPH, L2_DEFEAT_BYTES, graph_of, time_graph  # noqa: E402

import jitgemm  # noqa: E402
from jitgemm import api, heuristics  # noqa: E402
from jitgemm.config import KernelConfig  # noqa: E402
from jitgemm.problem import Problem  # noqa: E402

DEFAULT_SHAPES = [
    "1,4096,7168",
    "1,7168,2048",
    "64,4096,7168",
    "128,2112,7168",
    "128,4096,7168",
    "128,576,7168",
    "4096,576,7168",
]


def candidates(problem, spec, top):
    report = heuristics.explain(problem, spec, top=top)
    found = {c["name"]: (KernelConfig.from_dict(c["config"]), c.get("model_us")) for c in report["candidates"]}
    for cfg, _ in list(found.values()):
        if cfg.split_k > 1:
            plain = dataclasses.replace(cfg, split_k=1)
            if not heuristics.check_config(plain, problem, spec):
                found.setdefault(plain.name, (plain, None))
    return report["chosen"], found


def measure(m, n, k, dtype, cfg):
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    copies_n = max(2, min(64, math.ceil(L2_DEFEAT_BYTES / ((m * k + k * n + m * n) * 2))))
    copies = [
        (
            torch.randn(m, k, device="cuda").to(tdt),
            torch.randn(k, n, device="cuda").to(tdt),
            torch.empty(m, n, device="cuda", dtype=tdt),
        )
        for _ in range(copies_n)
    ]
    a, b, out = copies[0]
    jitgemm.gemm(a, b, out=out, config=cfg)
    ref = a.double() @ b.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    graph = graph_of(lambda a, b, o: jitgemm.gemm(a, b, out=o, config=cfg), copies)
    return statistics.median(time_graph(graph) for _ in range(15)), err


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES)
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    spec = api.device_spec(0)
    results = []
    for shape in args.shapes:
        m, n, k = (int(x) for x in shape.split(","))
        problem = Problem(m, n, k, args.dtype, args.dtype, "K", "N")
        chosen, found = candidates(problem, spec, args.top)
        rows = []
        for name, (cfg, model_us) in found.items():
            us, err = measure(m, n, k, args.dtype, cfg)
            rows.append(
                {
                    "shape": [m, n, k],
                    "config": name,
                    "model_us": model_us,
                    "measured_us": us,
                    "rel_error": err,
                    "chosen": cfg.to_dict() == chosen,
                }
            )
        rows.sort(key=lambda r: r["measured_us"])
        print(f"\n{m}x{n}x{k} {args.dtype}  ({CALLS_PER_GRAPH} calls per graph, median of 15)")
        for r in rows:
            model = f"{r['model_us']:7.1f}" if r["model_us"] is not None else "      -"
            print(f"  {'*' if r['chosen'] else ' '} {r['measured_us']:8.1f} us  model {model} us  {r['config']}")
        results += rows
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
