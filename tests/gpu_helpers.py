"""Shared pieces of the GPU tests: random inputs, poisoned guarded outputs, the reference check."""

TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}
GUARD_ROWS, GUARD_COLS = 2, 8


def torch_dtype(name):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def random_operand(rows, cols, dtype, major, gen):
    """A fresh random (rows, cols) tensor, row-major ("row") or a transposed view ("col")."""
    import torch
    shape = (rows, cols) if major == "row" else (cols, rows)
    t = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(torch_dtype(dtype))
    return t if major == "row" else t.T


def guarded_out(m, n, dtype):
    """A NaN-filled buffer and an (m, n) view inside it, with a guard band on every side."""
    import torch
    width = -(-(n + 2 * GUARD_COLS) // 8) * 8
    buf = torch.full((m + 2 * GUARD_ROWS, width), float("nan"), device="cuda", dtype=torch_dtype(dtype))
    return buf, buf[GUARD_ROWS:GUARD_ROWS + m, GUARD_COLS:GUARD_COLS + n]


def guard_untouched(buf, m, n) -> bool:
    import torch
    mask = torch.ones(buf.shape, dtype=torch.bool, device=buf.device)
    mask[GUARD_ROWS:GUARD_ROWS + m, GUARD_COLS:GUARD_COLS + n] = False
    return bool(torch.isnan(buf[mask].float()).all())


def rel_error(out, a, b, c=None, alpha=1.0, beta=1.0) -> float:
    """Normwise relative error of `out` against a float64 reference from the same inputs."""
    ref = alpha * (a.double() @ b.double())
    if c is not None:
        ref = ref + beta * c.double()
    diff = (out.double() - ref).norm().item()
    scale = ref.norm().item()
    return diff / scale if scale > 0 else diff


def assert_close(out, a, b, out_dtype, **kw):
    import torch
    assert not torch.isnan(out.float()).any(), "output has NaN: some elements were never written"
    err = rel_error(out, a, b, **kw)
    assert err <= TOLERANCE[out_dtype], f"relative error {err:.3g} > {TOLERANCE[out_dtype]}"
    return err


def latin_shapes(values):
    """Triples in which every value appears on every axis (a Latin-square cross)."""
    n = len(values)
    shapes = []
    for shift_n, shift_k in ((3, 5), (1, 2), (6, 1)):
        for i in range(n):
            shapes.append((values[i], values[(i + shift_n) % n], values[(i + shift_k) % n]))
    return sorted(set(shapes))


