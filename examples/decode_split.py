"""The K split of the decode kernels (jitgemm/decode.py; issues 19 and 20): time every group
count on a GPU, and fit `Decoder.block_overhead`, the fixed cost of a block in `split_for`'s
rule, to those times on the CPU.

    python examples/decode_split.py measure [--decoder cols|rows] [--sets named,tune,held]
                                            [--out FILE] [--rounds 9] [--max-seconds T]
    python examples/decode_split.py fit FILE [--fit-on tune] [--report-on held]

measure: for each shape, a of M rows (bf16) against a b the decoder reads in place: COLS
b = W.t() of a contiguous (N, K) W with K not a multiple of 8; ROWS a row-major (K, N) b with N
odd. `Decoder.split_for` is replaced in turn by each candidate count (every count up to 12, the
count the rule in force picks, the one wave fill picks, and those nearest 16, 24, 32, 48 and
64); beside them, in the same rounds, jitgemm on the aligned neighbour (K, or N, rounded up to
8: TMA reads it) and torch.matmul on the same operands. CUDA graphs of 20 calls over copies of
at least 512 MB of operands (examples/benchmark.py's helpers), rounds interleaved, medians;
every count's result checked elementwise against float64 (tests/gpu_helpers.py) before it is
timed. One JSON line a shape, after a first line describing the run (GPU, copy bandwidth, SMs).

Shape sets: "named" (COLS: LLM-like shapes), "tune" and "held" (seeds 1 and 2: M log-uniform in
1..max_m, N in 1024..160000 and K in 512..32768 log-uniform, W at most 700 MB).

fit: time ~ waves x (a block's bytes of b x c + d), least squares on relative error over every
count of the --fit-on set's shapes, waves = ceil(blocks / (SMs x BLOCKS_PER_SM)). The block
overhead is d / c, in bytes. Then, on the --report-on set: the rule with that overhead (its pick among the
measured counts) against the fastest count and against wave fill (geomean and worst ratios of
measured times); with the overhead in force too, where the decoder has one.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # benchmark.py's timing helpers (measure)
sys.path.insert(0, str(HERE.parent / "tests"))  # gpu_helpers' elementwise check (measure)

from jitgemm import decode  # noqa: E402

DECODERS = {"cols": decode.COLS, "rows": decode.ROWS}
SEEDS = {"tune": 1, "held": 2}
NAMED = ((1, 4096, 4097), (2, 4144, 14084), (8, 14336, 4095), (16, 11008, 4100), (4, 151655, 4097))
NAMED += ((1, 14336, 4095), (16, 4096, 4097), (3, 8192, 28673), (12, 2048, 1025))
TARGETS = (16, 24, 32, 48, 64)  # group counts sampled beyond the first 12
MAX_W_BYTES = 700e6


def random_shapes(seed: int, decoder: decode.Decoder, count: int) -> list:
    """`count` (M, N, K) the decoder runs with b unaligned (COLS: K, ROWS: N off the grid),
    deterministic per seed."""
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < count:
        m = round(math.exp(rng.uniform(0, math.log(decoder.max_m))))
        n = round(math.exp(rng.uniform(math.log(1024), math.log(160000))))
        k = round(math.exp(rng.uniform(math.log(512), math.log(32768))))
        if k % 8 == 0:  # (COLS's b unaligned; ROWS's K drawn the same way)
            k += rng.choice((-1, 1, 3))
        if decoder is decode.ROWS and n % 2 == 0:
            n += 1
        if n * k * decode.B_BYTES <= MAX_W_BYTES:
            shapes.append((max(1, min(decoder.max_m, m)), n, k))
    return shapes


def shapes_of(name: str, decoder: decode.Decoder) -> list:
    if name == "named":
        return list(NAMED) if decoder is decode.COLS else []
    return random_shapes(SEEDS[name], decoder, 16 if decoder is decode.COLS else 12)


def wave_fill_count(decoder: decode.Decoder, n: int, k: int, num_sms: int) -> int:
    return decoder._replace(block_overhead=None).split_for(n, k, num_sms).groups


def candidates(decoder: decode.Decoder, n: int, k: int, num_sms: int) -> list:
    counts = decoder.group_counts(k)
    pick = {g for g in counts if g <= 12}
    pick |= {decoder.split_for(n, k, num_sms).groups, wave_fill_count(decoder, n, k, num_sms)}
    pick |= {min(counts, key=lambda g: abs(g - t)) for t in TARGETS}
    return sorted(pick)


# ---------------------------------------------------------------- measure (GPU)
def measure_shape(decoder, m, n, k, num_sms, rounds):
    import torch
    from benchmark import L2_DEFEAT_BYTES, graph_of, time_graph
    from gpu_helpers import assert_close

    import jitgemm
    from jitgemm import api

    cols = decoder is decode.COLS
    per_set = (m * k + k * n + m * n) * 2
    copies = max(2, min(64, math.ceil(L2_DEFEAT_BYTES / per_set)))
    gen = torch.Generator(device="cuda").manual_seed(m * 1000003 + n * 31 + k)

    def operands(kk, nn):
        a = torch.randn(m, kk, device="cuda", generator=gen).bfloat16()
        if cols:
            b = torch.randn(nn, kk, device="cuda", generator=gen).bfloat16().t()
        else:
            b = torch.randn(kk, nn, device="cuda", generator=gen).bfloat16()
        return a, b, torch.empty(m, nn, device="cuda", dtype=torch.bfloat16)

    unaligned = [operands(k, n) for _ in range(copies)]
    aligned = [operands(-(-k // 8) * 8 if cols else k, n if cols else -(-n // 8) * 8) for _ in range(copies)]

    def gemm(a, b, o):
        jitgemm.gemm(a, b, out=o)

    graphs = {}
    counts = candidates(decoder, n, k, num_sms)
    split_for = decode.Decoder.split_for
    a, b, o = unaligned[0]
    try:
        for g in counts:
            strips, rows = -(-n // decoder.strip), decoder.split_rows(k, g)
            decode.Decoder.split_for = lambda self, *_, g=g, s=strips, r=rows: decode.Split(s, g, r, s * g)
            api._plans.clear()
            o.fill_(float("nan"))
            gemm(a, b, o)
            assert any(isinstance(plan.call, decode.DecodeLaunch) for plan in api._plans.values()), "no decode ran"
            assert_close(o, a, b, "bf16")
            graphs[f"g{g}"] = graph_of(gemm, unaligned)
    finally:
        decode.Decoder.split_for = split_for
        api._plans.clear()
    graphs["aligned"] = graph_of(gemm, aligned)
    graphs["torch"] = graph_of(lambda a, b, o: torch.matmul(a, b, out=o), unaligned)
    times = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            times[name].append(time_graph(graph))
    return {
        "m": m,
        "n": n,
        "k": k,
        "rule": decoder.split_for(n, k, num_sms).groups,
        "wave_fill": wave_fill_count(decoder, n, k, num_sms),
        "us": {name: statistics.median(t) for name, t in times.items()},
    }


def measure(args) -> None:
    import torch
    from benchmark import copy_bandwidth, gpu_state

    decoder = DECODERS[args.decoder]
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    deadline = time.time() + args.max_seconds if args.max_seconds else math.inf
    head = {"decoder": args.decoder, "sms": num_sms, "copy_bytes_per_s": copy_bandwidth(), "gpu": gpu_state()}
    head["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(args.out, "w") as f:
        f.write(json.dumps(head) + "\n")
        for name in args.sets:
            for m, n, k in shapes_of(name, decoder):
                if time.time() > deadline:
                    print(f"--max-seconds reached before {name} {m}x{n}x{k}")
                    return
                row = {"set": name, **measure_shape(decoder, m, n, k, num_sms, args.rounds)}
                f.write(json.dumps(row) + "\n")
                f.flush()
                counts = {int(c[1:]): t for c, t in row["us"].items() if c[0] == "g"}
                best = min(counts, key=counts.get)
                print(
                    f"{name} {m}x{n}x{k}: rule {row['rule']} {counts[row['rule']]:.1f} us, "
                    f"fastest {best} {counts[best]:.1f}, torch {row['us']['torch']:.1f}, aligned {row['us']['aligned']:.1f}",
                    flush=True,
                )
                torch.cuda.empty_cache()


# ---------------------------------------------------------------- fit (CPU)
def read_measurements(path) -> tuple[dict, list]:
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return lines[0], lines[1:]


def count_times(row) -> dict:
    return {int(name[1:]): t for name, t in row["us"].items() if name[0] == "g"}


def fit_overhead(decoder, rows, num_sms) -> tuple[float, float]:
    """(c, d) of time ~ waves x (bytes x c + d) + e, least squares on relative error: a block's
    bytes and the waves as `Decoder.split_cost` counts them (its cost with no overhead, and the
    increment of one byte of overhead)."""
    lhs = []
    for row in rows:
        n, k = row["n"], row["k"]
        for g, t in count_times(row).items():
            streamed_waves = decoder.split_cost(n, k, num_sms, g, 0)
            waves = decoder.split_cost(n, k, num_sms, g, 1) - streamed_waves
            lhs.append([streamed_waves / t, waves / t, 1 / t])
    (c, d, _), *_ = np.linalg.lstsq(np.array(lhs), np.ones(len(lhs)), rcond=None)
    return float(c), float(d)


def geomean(values) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def report(decoder, rows, num_sms, overhead) -> dict:
    """The rule with `overhead` on `rows`, each shape's pick the count of least `split_cost`
    among those measured: its measured time over the fastest count's, and wave fill's over its
    own (geomean, worst, best); and wave fill's time over the fastest count's."""
    regret, gain, fill_regret = [], [], []
    for row in rows:
        n, k, times = row["n"], row["k"], count_times(row)
        pick = min(times, key=lambda g: (decoder.split_cost(n, k, num_sms, g, overhead), g))
        regret.append(times[pick] / min(times.values()))
        gain.append(times[row["wave_fill"]] / times[pick])
        fill_regret.append(times[row["wave_fill"]] / min(times.values()))
    return {
        "shapes": len(rows),
        "regret_geomean": geomean(regret),
        "regret_max": max(regret),
        "wave_fill_regret_geomean": geomean(fill_regret),
        "speedup_over_wave_fill_geomean": geomean(gain),
        "speedup_over_wave_fill_min": min(gain),
        "speedup_over_wave_fill_max": max(gain),
    }


def fit(args) -> dict:
    head, rows = read_measurements(args.file)
    decoder, num_sms = DECODERS[head["decoder"]], head["sms"]
    c, d = fit_overhead(decoder, [r for r in rows if r["set"] == args.fit_on], num_sms)
    held = [r for r in rows if r["set"] == args.report_on]
    out = {
        "decoder": head["decoder"],
        "bytes_per_s_per_wave": num_sms * decode.BLOCKS_PER_SM / c * 1e6,
        "wave_us": d,
        "block_overhead": d / c,
        "report_on": args.report_on,
        "fitted": report(decoder, held, num_sms, round(d / c)),
    }
    if decoder.block_overhead is not None:
        out["in_force"] = report(decoder, held, num_sms, decoder.block_overhead)
    print(json.dumps(out, indent=1))
    return out


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time every group count (GPU)")
    m.add_argument("--decoder", choices=sorted(DECODERS), default="cols")
    m.add_argument("--sets", type=lambda s: s.split(","), default=["named", "tune", "held"])
    m.add_argument("--out", default="decode_split.jsonl")
    m.add_argument("--rounds", type=int, default=9)
    m.add_argument("--max-seconds", type=float, default=None)
    f = sub.add_parser("fit", help="fit the block overhead to a measure file (CPU)")
    f.add_argument("file")
    f.add_argument("--fit-on", default="tune")
    f.add_argument("--report-on", default="held")
    args = parser.parse_args(argv)
    if args.command == "measure":
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        if unknown := set(args.sets) - {"named", *SEEDS}:
            parser.error(f"--sets: unknown {sorted(unknown)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.command == "measure":
        measure(args)
    else:
        fit(args)


if __name__ == "__main__":
    main()
