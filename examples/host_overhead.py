"""Host time of a warm jitgemm.gemm call against torch.matmul (issue 6: the goal is <= 1.5x).

    python examples/host_overhead.py [M N K] [--iters 2000]

Both calls run on the same small problem with the kernel cached, interleaved call by call so
that clocks, caches and GPU queue depth affect both alike; the GPU is drained outside the timed
region every few calls so that a full launch queue never blocks a launch. Prints the median
host time of each (result allocated by the call, and written into a given `out`) and the ratio.
"""

import argparse
import statistics
import time

import torch

import jitgemm


def measure(fn_a, fn_b, iters: int, drain_every: int = 50):
    times_a, times_b = [], []
    clock = time.perf_counter_ns
    for i in range(iters):
        if i % drain_every == 0:
            torch.cuda.synchronize()
        t0 = clock()
        fn_a()
        t1 = clock()
        fn_b()
        t2 = clock()
        times_a.append(t1 - t0)
        times_b.append(t2 - t1)
    torch.cuda.synchronize()
    return statistics.median(times_a) / 1e3, statistics.median(times_b) / 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", nargs="*", type=int, default=[256, 256, 256])
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    m, n, k = args.shape
    a = torch.randn((m, k), device="cuda").to(torch.bfloat16)
    b = torch.randn((k, n), device="cuda").to(torch.bfloat16)
    out_j = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    out_t = torch.empty_like(out_j)
    ref = a.double() @ b.double()
    for _ in range(20):  # compile, load, build the call plans; warm cuBLAS
        jitgemm.gemm(a, b)
        jitgemm.gemm(a, b, out_j)
        torch.matmul(a, b)
        torch.matmul(a, b, out=out_t)
    torch.cuda.synchronize()
    err = ((out_j.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"jitgemm result is wrong (relative error {err:.3g})"

    print(f"host time of a warm call, {m}x{n}x{k} bfloat16, median of {args.iters} interleaved calls")
    rows = [
        ("allocating the result", lambda: jitgemm.gemm(a, b), lambda: torch.matmul(a, b)),
        ("into a given out", lambda: jitgemm.gemm(a, b, out_j), lambda: torch.matmul(a, b, out=out_t)),
    ]
    for label, fj, ft in rows:
        tj, tt = measure(fj, ft, args.iters)
        print(f"  {label:22s} jitgemm {tj:7.2f} us   torch.matmul {tt:7.2f} us   ratio {tj / tt:5.2f}x")


if __name__ == "__main__":
    main()
