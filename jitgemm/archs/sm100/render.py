"""Render an sm_100a KernelConfig to self-contained CUDA C++ (templates/sm100/gemm.cu.j2).

The kernel keeps the sm_90a parameter convention: ``extern "C"`` kernel named
``jitgemm.render.kernel_name(cfg)`` taking (map_a, map_b, map_d[, map_c], M, N, K, alpha, beta), with M,
N, K, the maps and D always in the user's orientation (swap_ab is handled inside the kernel).
See `jitgemm.archs.sm100.layout` for how the config's fields read on sm_100a.
"""

from __future__ import annotations

from ...config import KernelConfig
from ...problem import DTYPE_BYTES
from ...render import environment, kernel_name
from .layout import KernelLayout, OperandLayout, layout_of, pair_along

TEMPLATE = "sm100/gemm.cu.j2"


def _operand_vars(op: OperandLayout, cfg: KernelConfig) -> dict:
    role_a = op.role == "mma_a"
    what = "MMA-A side (TMEM lanes)" if role_a else "MMA-B side (TMEM columns)"
    major = "K-major" if op.major_is_k else "MN-major"
    if op.major_is_k:
        boxes = f"one {op.box[0]}x{op.box[1]} box"
    else:
        boxes = f"{op.num_pieces} box(es) of {op.box[0]}x{op.box[1]}"
    half = ", this CTA's half of the pair's tile" if op.shared_by_pair else ""
    return {
        "desc": f"{what}: user {op.user}, {major}, {op.extent} x {cfg.block_k}{half}: {boxes}",
        "num_pieces": op.num_pieces,
        "piece_bytes": op.piece_bytes,
        "piece_extent": op.piece_extent,
        "tile_fn": "mma_a_tile" if role_a else "mma_b_tile",
        "origin": "row0" if role_a else "col0",
        "map": f"map_{op.user.lower()}",
        # TMA coordinates, innermost dimension first.
        "coords": "k0, mn" if op.major_is_k else "mn, k0",
        "major": "K" if op.major_is_k else "MN",
    }


def _store_boxes(lay: KernelLayout) -> list[dict]:
    """The TMA boxes (D store, C load) of one writeback step: smem offset in the slot, and the
    (x = user N, y = user M) coordinates as C expressions of the kernel-tile origin."""
    step = "(int)(j * CHUNK_COLS)"
    if not lay.config.swap_ab:
        return [{"offset": 0, "x": f"kcol0 + {step}", "y": "krow0"}]
    piece_bytes = lay.out_box[1] * lay.out_swizzle
    return [
        {"offset": p * piece_bytes, "x": f"krow0 + {p * lay.out_piece_cols}", "y": f"kcol0 + {step}"}
        for p in range(lay.boxes_per_chunk)
    ]


def template_variables(cfg: KernelConfig, lay: KernelLayout | None = None) -> dict:
    lay = lay or layout_of(cfg)
    mma_a, mma_b = _operand_vars(lay.mma_a, cfg), _operand_vars(lay.mma_b, cfg)
    return {
        "cfg": cfg,
        "lay": lay,
        "kernel_name": kernel_name(cfg),
        "pair_along": pair_along(cfg),  # templates/common/scheduler.cuh
        "elem": DTYPE_BYTES[cfg.dtype],
        "out_elem": DTYPE_BYTES[cfg.out_dtype],
        "pack": {"bf16": "pack_bf16x2", "fp16": "pack_f16x2", "fp32": ""}[cfg.out_dtype],
        "to_f32": {"bf16": "bf16_to_f32", "fp16": "f16_to_f32", "fp32": ""}[cfg.out_dtype],
        "mma_a": mma_a,
        "mma_b": mma_b,
        "operands": [mma_a, mma_b],
        "store_boxes": _store_boxes(lay),
    }


def render(cfg: KernelConfig) -> str:
    """The CUDA source of the sm_100a kernel for `cfg` (raises ValueError if it cannot be laid out)."""
    return environment().get_template(TEMPLATE).render(**template_variables(cfg))
