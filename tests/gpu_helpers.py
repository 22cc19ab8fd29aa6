"""Shared pieces of the GPU tests: random inputs, poisoned guarded outputs, the reference check."""

# Unit roundoff of each output dtype: the kernel rounds alpha * acc + beta * c once into it; and
# half its smallest subnormal, the absolute error of rounding a result that small.
ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
SUBNORMAL_ROUNDOFF = {"bf16": 2.0**-134, "fp16": 2.0**-25, "fp32": 2.0**-150}
FP32_ROUNDOFF = 2.0**-24
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
    return buf, buf[GUARD_ROWS : GUARD_ROWS + m, GUARD_COLS : GUARD_COLS + n]


def guard_untouched(buf, m, n) -> bool:
    import torch

    mask = torch.ones(buf.shape, dtype=torch.bool, device=buf.device)
    mask[GUARD_ROWS : GUARD_ROWS + m, GUARD_COLS : GUARD_COLS + n] = False
    return bool(torch.isnan(buf[mask].float()).all())


def _float64(x, device):
    import numpy as np
    import torch

    if isinstance(x, np.ndarray):
        return torch.as_tensor(x.astype(np.float64), device=device)
    return torch.as_tensor(x, device=device).double()


def worst_error(out, a, b, out_dtype, c=None, alpha=1.0, beta=1.0) -> float:
    """The largest elementwise ratio |out - ref| / bound over the result (NaN: inf), against a
    float64 reference from the same inputs. The bound of each element is the rounding of the
    result into `out_dtype` (relative, or absolute for a subnormal result) plus 2K fp32 roundoffs of the sum of magnitudes it adds up
    (|alpha| |a| @ |b| + |beta| |c|): four times the worst-case accumulation error of a K-term
    fp32 sum, yet far below a lost K block or a wrong row. Arrays may be torch, NumPy or anything
    torch.as_tensor takes."""
    device = "cuda"
    a64, b64 = _float64(a, device), _float64(b, device)
    got = _float64(out, device)
    ref = alpha * (a64 @ b64)
    magnitude = abs(alpha) * (a64.abs() @ b64.abs())
    if c is not None:
        c64 = _float64(c, device)
        ref = ref + beta * c64
        magnitude = magnitude + abs(beta) * c64.abs()
    k = a64.shape[1]
    bound = (
        ROUNDOFF[out_dtype] * ref.abs()
        + SUBNORMAL_ROUNDOFF[out_dtype]
        + 2 * max(k, 1) * FP32_ROUNDOFF * magnitude
        + 2.0**-40
    )
    ratio = ((got - ref).abs() / bound).nan_to_num(nan=float("inf"))
    return ratio.max().item() if ratio.numel() else 0.0


def assert_close(out, a, b, out_dtype, **kw):
    """Every element of `out` within its bound (see worst_error); returns the worst ratio."""
    worst = worst_error(out, a, b, out_dtype, **kw)
    assert worst != float("inf"), "output has NaN or inf: some elements were never written"
    assert worst <= 1.0, f"an element is off by {worst:.3g} times its error bound"
    return worst


def latin_shapes(values):
    """Triples in which every value appears on every axis (a Latin-square cross)."""
    n = len(values)
    shapes = []
    for shift_n, shift_k in ((3, 5), (1, 2), (6, 1)):
        for i in range(n):
            shapes.append((values[i], values[(i + shift_n) % n], values[(i + shift_k) % n]))
    return sorted(set(shapes))


def nan_full(shape, dtype):
    """A CUDA tensor of NaNs: an output that must be overwritten everywhere it is checked."""
    import torch

    return torch.full(shape, float("nan"), device="cuda", dtype=torch_dtype(dtype))


def padded_operand(rows, cols, major, gen, pad=5):
    """A (rows, cols) operand whose rows end mid-unit inside NaN-padded rows (the leading
    stride a whole number of 16-byte units, `pad` NaN elements or more past each row end):
    row-major ("row") or a transposed view ("col") of a slice of a wider array."""
    import torch

    inner, outer = (cols, rows) if major == "row" else (rows, cols)
    width = -(-(inner + pad) // 8) * 8
    frame = torch.full((outer, width), float("nan"), device="cuda", dtype=torch.bfloat16)
    frame[:, :inner] = random_operand(outer, inner, "bf16", "row", gen)
    view = frame[:, :inner]
    return view if major == "row" else view.T
