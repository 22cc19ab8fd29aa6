"""The main job on a GPU machine: one GEMM through jitgemm, checked against a reference.

python examples/basic_gemm.py [M N K]
"""

import sys

import cupy as cp

import jitgemm


def main():
    m, n, k = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (4096, 2112, 7168)
    a = cp.random.randn(m, k).astype(cp.float16)
    b = cp.random.randn(k, n).astype(cp.float16)
    out = jitgemm.gemm(a, b)
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    err = float(cp.linalg.norm(out.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    ok = bool(not cp.isnan(out).any()) and err <= 2e-3
    print(f"jitgemm.gemm {m}x{n}x{k} float16: relative error {err:.2e} -> {'OK' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
